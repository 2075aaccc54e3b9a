//! The configuration document as a user writes it: one serde-derived struct per JSON object.
//!
//! Invariant: a `Document` is what the JSON says, field for field: no field is unknown
//! (`deny_unknown_fields`, at every level), every fixed default is filled in, and every integer is
//! an [`Int`] within its own bounds. What depends on more than one field (a burst that defaults to
//! the rate, a cost within the burst, which artifact a backend field belongs to) and every grammar
//! (key sources, paths, hosts, names) is the compile step's (`compile.rs`). A field whose default
//! depends on another, or whose presence matters, is an `Option`.
//!
//! Fields are declared in the order their errors are reported (`de.rs` reads them in this order).

use serde::Deserialize;

use super::bounds::*;
use super::de::fields_of;
use super::int::Int;
use super::model::{FailureMode, HeaderStyle, Mode};
use super::outcome::StatusEntry;
use super::quota::{PeriodMs, Tokens};

/// The whole configuration.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    #[serde(default)]
    pub backend: Backend,
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    #[serde(default)]
    pub failure_mode: FailureMode,
    #[serde(default)]
    pub response_headers: HeaderStyle,
    #[serde(default)]
    pub deny: Deny,
    /// Leave each checked request's decision record for the access log (off by default: it
    /// costs the lease path a host call per request).
    #[serde(default)]
    pub record_decisions: bool,
    pub rules: Vec<Rule>,
}

fn default_key_prefix() -> String {
    DEFAULT_KEY_PREFIX.to_owned()
}

/// `backend`. The Higress artifact's fields come first, then both artifacts', then
/// tollgate.wasm's (Webdis): each artifact refuses the other's, so whether those are given
/// matters and they have no default here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Backend {
    /// Higress: names the cluster as Higress does; not together with `cluster`.
    pub service_name: Option<String>,
    /// Higress: default 6379 (80 for a `.static` service); needs `service_name`.
    pub service_port: Option<Int<1, MAX_PORT>>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Higress: default 0.
    pub database: Option<Int<0, MAX_DATABASE>>,
    /// Default `tollgate_backend`, or the one `service_name` names.
    pub cluster: Option<String>,
    /// Webdis: default `webdis`.
    pub authority: Option<String>,
    pub timeout_ms: Int<1, MAX_TIMEOUT_MS>,
    pub breaker_failures: Int<1, MAX_BREAKER_FAILURES>,
    pub breaker_cooloff_ms: Int<MIN_BREAKER_COOLOFF_MS, MAX_BREAKER_COOLOFF_MS>,
    pub max_inflight: Int<1, MAX_MAX_INFLIGHT>,
    pub batch_max_keys: Int<1, MAX_BATCH_MAX_KEYS>,
    /// Webdis: `user:pass`.
    pub basic_auth: Option<String>,
}

impl Default for Backend {
    fn default() -> Self {
        Backend {
            service_name: None,
            service_port: None,
            username: None,
            password: None,
            database: None,
            cluster: None,
            authority: None,
            timeout_ms: Int::of::<DEFAULT_TIMEOUT_MS>(),
            breaker_failures: Int::of::<DEFAULT_BREAKER_FAILURES>(),
            breaker_cooloff_ms: Int::of::<DEFAULT_BREAKER_COOLOFF_MS>(),
            max_inflight: Int::of::<DEFAULT_MAX_INFLIGHT>(),
            batch_max_keys: Int::of::<DEFAULT_BATCH_MAX_KEYS>(),
            basic_auth: None,
        }
    }
}

/// `deny`: how a denial is answered.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Deny {
    pub grpc_resource_exhausted: bool,
    pub status: Int<MIN_DENY_STATUS, MAX_DENY_STATUS>,
    pub body: String,
}

impl Default for Deny {
    fn default() -> Self {
        Deny {
            grpc_resource_exhausted: true,
            status: Int::of::<DEFAULT_DENY_STATUS>(),
            body: DEFAULT_DENY_BODY.to_owned(),
        }
    }
}

/// One of `rules`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub name: String,
    #[serde(rename = "match", default)]
    pub matcher: Match,
    #[serde(default)]
    pub key: Vec<String>,
    pub rate: Tokens,
    #[serde(default = "Int::of::<DEFAULT_PERIOD_MS>")]
    pub period_ms: PeriodMs,
    /// Default: `rate`.
    pub burst: Option<Tokens>,
    #[serde(default = "Int::of::<DEFAULT_COST>")]
    pub cost: Tokens,
    pub cost_header: Option<String>,
    #[serde(default)]
    pub mode: Mode,
    /// Default: `burst` (and at most it).
    pub lease_max: Option<Tokens>,
    #[serde(default = "Int::of::<DEFAULT_LEASE_HORIZON_MS>")]
    pub lease_horizon_ms: Int<MIN_LEASE_HORIZON_MS, MAX_LEASE_HORIZON_MS>,
    #[serde(default = "Int::of::<0>")]
    pub max_wait_ms: Int<0, { crate::bucket::MAX_WAIT_MS }>,
    #[serde(default)]
    pub shadow: bool,
    pub fallback: Option<Limits>,
    pub usage: Option<Usage>,
    pub charge_on: Option<ChargeOn>,
    #[serde(default)]
    pub overrides: Vec<Override>,
    pub tiers: Option<Tiers>,
    pub penalty: Option<Penalty>,
}

/// A rule's `penalty`: durations for the 1st, 2nd, ... offence within `window_ms` of the previous
/// one (the compile step checks their order and count, and defaults the window).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Penalty {
    pub ms: Vec<Int<1, { crate::bucket::MAX_PENALTY_MS }>>,
    /// Default: twice the longest duration, and at least an hour.
    pub window_ms: Option<Int<1, { crate::bucket::MAX_PENALTY_WINDOW_MS }>>,
}

/// A rule's `match`: every condition given must hold.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Match {
    pub path_prefix: Option<String>,
    pub path_ignore_case: bool,
    pub methods: Vec<String>,
    pub headers: Vec<HeaderMatch>,
    pub hosts: Vec<String>,
}

/// One of `match.headers`: a name and exactly one condition (the compile step counts them).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    pub name: String,
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub regex: Option<String>,
    pub present: Option<bool>,
    pub absent: Option<bool>,
}

/// A rule's `usage`: exactly one of `header` and `body_field` (the compile step checks).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    pub header: Option<String>,
    pub body_field: Option<String>,
    #[serde(default = "Int::of::<DEFAULT_USAGE_FLUSH_MS>")]
    pub flush_ms: Int<1, MAX_USAGE_FLUSH_MS>,
    /// Default: the largest usage this proxy read for the rule lately.
    pub unreadable: Option<Tokens>,
}

/// A rule's `charge_on`: the answers whose admission keeps its tokens (`outcome.rs` checks the
/// list).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeOn {
    pub status: Vec<StatusEntry>,
    #[serde(default = "Int::of::<DEFAULT_USAGE_FLUSH_MS>")]
    pub flush_ms: Int<1, MAX_USAGE_FLUSH_MS>,
}

/// A rule's `fallback`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub rate: Tokens,
    /// Default: the rule's `period_ms`.
    pub period_ms: Option<PeriodMs>,
    /// Default: `rate`.
    pub burst: Option<Tokens>,
}

/// One of a rule's `overrides`: a key tuple and either `unlimited` or limits.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    pub key: Vec<String>,
    pub unlimited: Option<bool>,
    /// Required, unless `unlimited`.
    pub rate: Option<Tokens>,
    /// Default: the rule's `period_ms`.
    pub period_ms: Option<PeriodMs>,
    /// Default: `rate`.
    pub burst: Option<Tokens>,
}

/// A rule's `tiers`: limits picked by the value of one key source (`tiers.rs` compiles it).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tiers {
    pub from: String,
    /// Must be said for a source the client controls.
    #[serde(default)]
    pub trusted: bool,
    /// Tier name -> its limits (an object whose keys the user names).
    pub limits: std::collections::BTreeMap<String, Tier>,
}

/// One of `tiers.limits`: either `unlimited` or limits, as an override.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    pub unlimited: Option<bool>,
    /// Required, unless `unlimited`.
    pub rate: Option<Tokens>,
    /// Default: the rule's `period_ms`.
    pub period_ms: Option<PeriodMs>,
    /// Default: `rate`.
    pub burst: Option<Tokens>,
}

/// Every object of the document and its fields, as the derives declare them: what the
/// reference (docs/reference/configuration.md) must document, and all it may (tests/docs.rs checks both ways).
pub fn schema() -> Vec<(&'static str, &'static [&'static str])> {
    vec![
        ("top level", fields_of::<Document>()),
        ("backend", fields_of::<Backend>()),
        ("deny", fields_of::<Deny>()),
        ("rules[]", fields_of::<Rule>()),
        ("match", fields_of::<Match>()),
        ("match.headers[]", fields_of::<HeaderMatch>()),
        ("usage", fields_of::<Usage>()),
        ("charge_on", fields_of::<ChargeOn>()),
        ("fallback", fields_of::<Limits>()),
        ("overrides[]", fields_of::<Override>()),
        ("tiers", fields_of::<Tiers>()),
        ("tiers.limits.*", fields_of::<Tier>()),
        ("penalty", fields_of::<Penalty>()),
    ]
}
