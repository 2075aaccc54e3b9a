//! The validated configuration: what the filter runs on.
//!
//! Invariant: a value of these types comes out of the compile step (`compile.rs`) or a test:
//! names are safe for a Redis key, a header and a metric name, limits are `Quota`s the script
//! accepts, header names are lower-cased, methods upper-cased, hosts and path prefixes in the
//! normal form requests are compared in, and a key source's spelling (`Display`) is canonical.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::artifact::Protocol;
use super::quota::Quota;
use crate::rule::pattern::Pattern;

/// The validated plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub backend: Backend,
    pub key_prefix: String,
    pub failure_mode: FailureMode,
    pub response_headers: HeaderStyle,
    pub deny: Deny,
    /// Each request a rule checked leaves its decision record with the host, for the access log
    /// (`engine::decision`).
    pub record_decisions: bool,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// Envoy cluster name of the Webdis front (HTTP build) or of Redis (Higress build; from
    /// `service_name` and `service_port` as Higress names it: `outbound|<port>||<service>`).
    pub cluster: String,
    /// `:authority` of the callout (HTTP build).
    pub authority: String,
    pub timeout_ms: u64,
    /// `user:pass` for Webdis' HTTP basic-auth ACL (HTTP build).
    pub basic_auth: Option<String>,
    /// Redis ACL user and password, sent by Higress as `AUTH` on each connection (Higress build).
    pub username: Option<String>,
    pub password: Option<String>,
    /// Redis database (`SELECT`), 0 by default (Higress build).
    pub database: u64,
    /// How script calls travel (from the artifact the configuration is for).
    pub protocol: Protocol,
    /// Consecutive failed calls (proxy-wide) that open the circuit breaker.
    pub breaker_failures: u64,
    /// How long an open breaker answers with the failure mode before letting one probe through.
    pub breaker_cooloff_ms: u64,
    /// Most backend calls one worker keeps out at once; beyond it a check gets the failure mode.
    pub max_inflight: u64,
    /// Most script calls (checks of different keys) one backend request carries.
    pub batch_max_keys: u64,
}

/// What a check does when the backend cannot answer (`failure_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureMode {
    Open,
    Closed,
    /// The rule's fallback bucket, per proxy (a rule without one falls back to its own limits).
    #[default]
    Local,
}

/// Which rate-limit headers answers carry (`response_headers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeaderStyle {
    #[default]
    Ietf,
    Legacy,
    Both,
    None,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deny {
    pub status: u32,
    pub body: String,
    /// A denied gRPC request gets `grpc-status: 8` (RESOURCE_EXHAUSTED) instead of the status
    /// Envoy derives from the HTTP one (429 -> 14 UNAVAILABLE, which clients retry at once).
    pub grpc_resource_exhausted: bool,
}

/// How a rule spends its global bucket (`mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Exact,
    Lease,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    pub matcher: Match,
    pub key: Vec<KeySource>,
    pub limits: Quota,
    pub cost: u64,
    /// Lower-cased header name whose value, when present, is the request's cost.
    pub cost_header: Option<String>,
    pub mode: Mode,
    /// Exact mode: hold a request up to this long for tokens about to refill (0 = reject).
    pub max_wait_ms: u64,
    /// Lease mode: most tokens one proxy takes in one call (<= burst).
    pub lease_max: u64,
    /// Lease mode: a lease covers about this much of the proxy's demand, and expires after twice it.
    pub lease_horizon_ms: u64,
    pub shadow: bool,
    pub fallback: Option<Quota>,
    /// Where the real cost comes from once the response arrives: `usage`, or `charge_on`'s
    /// statuses (exact mode only).
    pub usage: Option<Usage>,
    /// Other limits for some key value tuples (in the form `rule::key_values` gives them).
    pub overrides: BTreeMap<Vec<Vec<u8>>, Override>,
    /// Limits picked by the value of an attribute Envoy verified (an override still wins).
    pub tiers: Option<Tiers>,
    /// The penalty box: after a denial by its bucket, a key is refused for a while (exact mode).
    pub penalty: Option<crate::bucket::Penalty>,
}

impl Rule {
    /// Whether the rule reads response bodies (a usage rule's `body_field`).
    pub fn reads_body(&self) -> bool {
        matches!(
            self.usage,
            Some(Usage {
                source: UsageSource::BodyField(_),
                ..
            })
        )
    }
}

/// What an override gives its key instead of the rule's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Override {
    Limits(Quota),
    /// Admitted without a backend call (still counted).
    Unlimited,
}

/// A rule's `tiers`: the value of one key source picks the limits of a key's bucket, never the
/// bucket. A source the client controls is here only if the configuration said it is trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiers {
    pub from: KeySource,
    /// Tier name, in the form the source's value takes (as an override's key value) -> what it
    /// gives instead of the rule's limits. A value no tier names gets the rule's limits.
    pub limits: BTreeMap<Vec<u8>, Override>,
}

impl Tiers {
    /// The largest burst a tier gives (0 if every tier is unlimited): the calls of one key may
    /// carry any tier's limits, so what the key has pending to settle is bounded by this one.
    pub fn widest_burst(&self) -> u64 {
        self.limits
            .values()
            .filter_map(|o| match o {
                Override::Limits(q) => Some(q.burst),
                Override::Unlimited => None,
            })
            .max()
            .unwrap_or(0)
    }
}

/// A rule's usage source: the response says what the request really cost, and the difference from
/// what it was charged up front is settled against the same global bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    pub source: UsageSource,
    /// A key with a pending settlement and no next call is flushed after this long.
    pub flush_ms: u64,
    /// What an admission whose usage never becomes readable is charged (never less than its
    /// up-front cost).
    pub unreadable: WorstCase,
}

/// What a usage rule charges an admission whose response's usage cannot be read (none in the
/// answer, an encoding or size the filter does not read, an invalid value, a request that ended
/// before its response did).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorstCase {
    /// The largest usage this proxy read for the rule lately (`shared::peak`).
    Recent,
    /// The rule's `usage.unreadable` (1 ..= [`super::MAX_TOKENS`]).
    Fixed(u64),
    /// What the admission paid up front: a `charge_on` rule's answer that never came.
    Upfront,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageSource {
    /// A response header (or trailer), lower-cased.
    Header(String),
    /// A dotted field of a JSON body, or of the last server-sent event that carries it.
    BodyField(Vec<String>),
    /// `charge_on`: the response's status. In the set, the admission used its up-front cost;
    /// otherwise nothing (a refund of the whole cost).
    Status(super::StatusSet),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Match {
    /// In normal form (see `rule::path`); matched against every reading of the request's path.
    pub path_prefix: Option<String>,
    /// Compare `path_prefix` ASCII case-insensitively.
    pub path_ignore_case: bool,
    /// Upper-cased; empty means any method.
    pub methods: Vec<String>,
    pub headers: Vec<HeaderMatch>,
    /// Lower-cased host names without port; `*.example.com` matches any name ending in
    /// `.example.com`. Empty means any host.
    pub hosts: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderMatch {
    /// Lower-cased header name.
    pub name: String,
    pub value: HeaderValueMatch,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderValueMatch {
    Exact(String),
    Present,
    Prefix(String),
    Absent,
    Regex(Pattern),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// Lower-cased header name.
    Header(String),
    Query(String),
    /// The client's address: IPv4 by its first `v4_prefix` bits, IPv6 by its first `v6_prefix`.
    ClientIp {
        v4_prefix: u8,
        v6_prefix: u8,
    },
    Path,
    Method,
    Authority,
    Literal(String),
    /// An Envoy attribute by path (`property:connection.uri_san_peer_certificate`); `spelled` is
    /// what the configuration wrote, `path` what is asked of the host (an alias resolved).
    Property {
        spelled: String,
        path: Vec<String>,
    },
    /// A field of dynamic metadata: `metadata:<namespace>:<field>[.<field>…]`.
    Metadata {
        namespace: String,
        fields: Vec<String>,
    },
    /// A cookie by name.
    Cookie(String),
}

impl KeySource {
    /// The plain `client_ip` source: whole IPv4 addresses, IPv6 /64 networks.
    pub const CLIENT_IP: KeySource = KeySource::ClientIp {
        v4_prefix: crate::rule::ip::DEFAULT_V4_PREFIX,
        v6_prefix: crate::rule::ip::DEFAULT_V6_PREFIX,
    };

    /// Appends its canonical spelling (its `Display`, byte for byte) to `out`. Every new key's
    /// digest takes it: the usual sources are written here directly, without the formatting
    /// machinery, which costs more in wasm than the rest of the digest's input.
    pub fn push_name(&self, out: &mut Vec<u8>) {
        let (kind, name): (&str, &str) = match self {
            KeySource::Header(name) => ("header:", name),
            KeySource::Query(name) => ("query:", name),
            KeySource::Cookie(name) => ("cookie:", name),
            KeySource::Literal(text) => ("literal:", text),
            KeySource::Property { spelled, .. } => ("property:", spelled),
            KeySource::Path => ("path", ""),
            KeySource::Method => ("method", ""),
            KeySource::Authority => ("authority", ""),
            KeySource::ClientIp { .. } | KeySource::Metadata { .. } => {
                out.extend_from_slice(self.to_string().as_bytes());
                return;
            }
        };
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(name.as_bytes());
    }
}

/// The canonical spelling of a key source (what the configuration would say, defaults left out,
/// names lower-cased). It goes into the bucket digest, so changing a rule's sources starts fresh
/// buckets.
impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::Header(name) => write!(f, "header:{name}"),
            KeySource::Query(name) => write!(f, "query:{name}"),
            KeySource::ClientIp {
                v4_prefix,
                v6_prefix,
            } => {
                let mut parts = Vec::new();
                if *v4_prefix != crate::rule::ip::DEFAULT_V4_PREFIX {
                    parts.push(format!("v4=/{v4_prefix}"));
                }
                if *v6_prefix != crate::rule::ip::DEFAULT_V6_PREFIX {
                    parts.push(format!("v6=/{v6_prefix}"));
                }
                if parts.is_empty() {
                    f.write_str("client_ip")
                } else {
                    write!(f, "client_ip:{}", parts.join(","))
                }
            }
            KeySource::Path => f.write_str("path"),
            KeySource::Method => f.write_str("method"),
            KeySource::Authority => f.write_str("authority"),
            KeySource::Literal(text) => write!(f, "literal:{text}"),
            KeySource::Property { spelled, .. } => write!(f, "property:{spelled}"),
            KeySource::Metadata { namespace, fields } => {
                write!(f, "metadata:{namespace}:{}", fields.join("."))
            }
            KeySource::Cookie(name) => write!(f, "cookie:{name}"),
        }
    }
}

impl Config {
    /// One line describing the rules, for the configure-time log line, e.g.
    /// `2 rules: per-user 100/1000ms burst 200 lease (fallback 25/1000ms burst 50), all 10/1000ms burst 10 exact shadow`.
    pub fn summary(&self) -> String {
        let rules: Vec<String> = self.rules.iter().map(rule_summary).collect();
        let noun = if self.rules.len() == 1 {
            "rule"
        } else {
            "rules"
        };
        format!("{} {}: {}", self.rules.len(), noun, rules.join(", "))
    }
}

fn limits_summary(l: &Quota) -> String {
    format!("{}/{}ms burst {}", l.rate, l.period_ms, l.burst)
}

fn rule_summary(r: &Rule) -> String {
    let mode = match r.mode {
        Mode::Exact => "exact",
        Mode::Lease => "lease",
    };
    let mut s = format!("{} {} {}", r.name, limits_summary(&r.limits), mode);
    if r.shadow {
        s.push_str(" shadow");
    }
    if let Some(f) = &r.fallback {
        s.push_str(&format!(" (fallback {})", limits_summary(f)));
    }
    match r.overrides.len() {
        0 => {}
        1 => s.push_str(" (1 override)"),
        n => s.push_str(&format!(" ({n} overrides)")),
    }
    if let Some(t) = &r.tiers {
        s.push_str(&tiers_summary(t));
    }
    s
}

fn tiers_summary(t: &Tiers) -> String {
    let noun = if t.limits.len() == 1 { "tier" } else { "tiers" };
    format!(" ({} {noun} by {})", t.limits.len(), t.from)
}
