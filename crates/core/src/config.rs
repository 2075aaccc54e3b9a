//! Plugin configuration: JSON bytes -> validated, typed `Config`.
//!
//! Invariant: a `Config` that exists is valid — every rule has positive limits that fit the Lua
//! script's exact integer range, names are unique and safe to put in a Redis key, a header name or a
//! metric name. Any other input is a `ConfigError` naming the field and the reason, in one line.

use std::collections::BTreeMap;

use crate::bucket::Limits;

/// The validated plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub backend: Backend,
    pub key_prefix: String,
    pub failure_mode: FailureMode,
    pub response_headers: HeaderStyle,
    pub deny: Deny,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    Open,
    Closed,
    Local,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStyle {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Exact,
    Lease,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    pub matcher: Match,
    pub key: Vec<KeySource>,
    pub limits: Limits,
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
    pub fallback: Option<Limits>,
    /// Where the real cost comes from once the response arrives (exact mode only).
    pub usage: Option<Usage>,
    /// Other limits for some key value tuples (in the form `rule::key_values` gives them).
    pub overrides: BTreeMap<Vec<Vec<u8>>, Override>,
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
    Limits(Limits),
    /// Admitted without a backend call (still counted).
    Unlimited,
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
    /// The rule's `usage.unreadable` (1 ..= [`MAX_TOKENS`]).
    Fixed(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageSource {
    /// A response header (or trailer), lower-cased.
    Header(String),
    /// A dotted field of a JSON body, or of the last server-sent event that carries it.
    BodyField(Vec<String>),
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

/// A regular expression that must match a whole header value, run by `regex-lite`: matching
/// takes time linear in the value's length (no backtracking blow-up).
#[derive(Debug, Clone)]
pub struct Pattern {
    /// As configured (without the anchors added to it).
    pub source: String,
    regex: regex_lite::Regex,
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Pattern {}

/// Longest `regex` pattern.
pub const MAX_PATTERN_LEN: usize = 1024;

impl Pattern {
    pub fn new(source: &str) -> Result<Pattern, String> {
        if source.len() > MAX_PATTERN_LEN {
            return Err(format!("must be at most {MAX_PATTERN_LEN} bytes"));
        }
        let regex = regex_lite::RegexBuilder::new(&format!("^(?:{source})$"))
            .nest_limit(32)
            .size_limit(256 * 1024)
            .build()
            .map_err(|e| {
                let text = e.to_string();
                let line = text.lines().last().unwrap_or_default().trim().to_owned();
                format!("is not a valid regular expression: {line}")
            })?;
        Ok(Pattern {
            source: source.to_owned(),
            regex,
        })
    }

    /// Whether the whole of `value` matches (bytes that are not UTF-8 read as U+FFFD).
    pub fn is_match(&self, value: &[u8]) -> bool {
        self.regex.is_match(&String::from_utf8_lossy(value))
    }
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

/// A configuration error: `field` is a path such as `rules[1].rate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// Most rules a configuration may hold.
pub const MAX_RULES: usize = 64;
/// Most key sources a rule may have.
pub const MAX_KEY_SOURCES: usize = 8;
/// Longest rule name (and shortest is 1).
pub const MAX_RULE_NAME_LEN: usize = 64;
/// Longest `key_prefix`.
pub const MAX_KEY_PREFIX_LEN: usize = 64;
/// Largest `rate` and `burst`.
pub const MAX_TOKENS: u64 = 1_000_000_000;
/// Largest `period_ms` (one day).
pub const MAX_PERIOD_MS: u64 = 86_400_000;
/// Largest `burst × period_ms`: the Lua script keeps state in units of token·ms and Lua numbers are
/// exact integers only up to 2^53; 2^50 leaves room for the additions it makes.
pub const MAX_BURST_PERIOD: u64 = 1 << 50;
/// Largest `backend.timeout_ms`.
pub const MAX_TIMEOUT_MS: u64 = 60_000;
/// Longest `backend.cluster` / `backend.authority`.
pub const MAX_BACKEND_NAME_LEN: usize = 255;
/// Longest `backend.basic_auth`.
pub const MAX_BASIC_AUTH_LEN: usize = 512;
/// Longest `deny.body`.
pub const MAX_DENY_BODY_LEN: usize = 4096;

const DEFAULT_CLUSTER: &str = "tollgate_backend";
const DEFAULT_AUTHORITY: &str = "webdis";
const DEFAULT_TIMEOUT_MS: u64 = 50;
const DEFAULT_KEY_PREFIX: &str = "tollgate";
const DEFAULT_DENY_STATUS: u32 = 429;
const DEFAULT_DENY_BODY: &str = "rate limited\n";
const DEFAULT_PERIOD_MS: u64 = 1000;
const DEFAULT_COST: u64 = 1;

const KEY_SOURCE_HELP: &str = "expected header:NAME, query:NAME, cookie:NAME, client_ip, \
     client_ip:v4=/N,v6=/M, path, method, authority, literal:TEXT, property:PATH or \
     metadata:NAMESPACE:FIELD";

/// The whole-document field name.
const DOCUMENT: &str = "configuration";

const TOP_FIELDS: &[&str] = &[
    "backend",
    "key_prefix",
    "failure_mode",
    "response_headers",
    "deny",
    "rules",
];
const BACKEND_FIELDS: &[&str] = &[
    "cluster",
    "authority",
    "timeout_ms",
    "basic_auth",
    "breaker_failures",
    "breaker_cooloff_ms",
    "max_inflight",
    "service_name",
    "service_port",
    "username",
    "password",
    "database",
];
/// `backend` fields of one transport only: the other build refuses them.
const WEBDIS_ONLY_FIELDS: &[&str] = &["authority", "basic_auth"];
const REDIS_ONLY_FIELDS: &[&str] = &[
    "service_name",
    "service_port",
    "username",
    "password",
    "database",
];
/// Which artifact the configuration is for: it decides how script calls travel, and the other
/// artifact's `backend` fields are refused with a message that names the artifact to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Artifact {
    /// tollgate.wasm, for stock Envoy and Istio: HTTP callouts to Webdis.
    #[default]
    Envoy,
    /// tollgate-higress.wasm: Higress' Redis callouts, straight to Redis.
    Higress,
}

/// How script calls travel to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP callouts to a Webdis front (`backend.authority`, `backend.basic_auth`).
    Webdis,
    /// RESP through Higress' Redis callouts (`backend.username`, `password`, `database`).
    Resp,
}
/// Largest `backend.database`.
pub const MAX_DATABASE: u64 = i32::MAX as u64;
/// Longest `backend.username` / `backend.password`.
pub const MAX_REDIS_SECRET_LEN: usize = 512;
pub const DEFAULT_MAX_INFLIGHT: u64 = 256;
pub const MAX_MAX_INFLIGHT: u64 = 100_000;
pub const DEFAULT_BREAKER_FAILURES: u64 = 5;
pub const MAX_BREAKER_FAILURES: u64 = 1000;
pub const DEFAULT_BREAKER_COOLOFF_MS: u64 = 1000;
pub const MIN_BREAKER_COOLOFF_MS: u64 = 10;
pub const MAX_BREAKER_COOLOFF_MS: u64 = 600_000;
const DENY_FIELDS: &[&str] = &["status", "body", "grpc_resource_exhausted"];
pub const DEFAULT_LEASE_HORIZON_MS: u64 = 200;
pub const MIN_LEASE_HORIZON_MS: u64 = 10;
pub const MAX_LEASE_HORIZON_MS: u64 = 10_000;

const RULE_FIELDS: &[&str] = &[
    "name",
    "max_wait_ms",
    "lease_max",
    "lease_horizon_ms",
    "match",
    "key",
    "rate",
    "period_ms",
    "burst",
    "cost",
    "cost_header",
    "mode",
    "shadow",
    "fallback",
    "usage",
    "overrides",
];
const USAGE_FIELDS: &[&str] = &["header", "body_field", "flush_ms", "unreadable"];
pub const DEFAULT_USAGE_FLUSH_MS: u64 = 100;
pub const MAX_USAGE_FLUSH_MS: u64 = 10_000;
/// Most segments of a `usage.body_field`, and most bytes of one segment.
pub const MAX_FIELD_SEGMENTS: usize = 8;
pub const MAX_FIELD_SEGMENT_LEN: usize = 64;
const MATCH_FIELDS: &[&str] = &[
    "path_prefix",
    "path_ignore_case",
    "methods",
    "headers",
    "hosts",
];
const HEADER_MATCH_FIELDS: &[&str] = &["name", "exact", "present", "prefix", "absent", "regex"];
const OVERRIDE_FIELDS: &[&str] = &["key", "rate", "period_ms", "burst", "unlimited"];
/// Most overrides a rule may have.
pub const MAX_OVERRIDES: usize = 10_000;
/// Most hosts a rule's match may list.
pub const MAX_HOSTS: usize = 256;
/// Most segments of a `property:` path or fields of a `metadata:` source.
pub const MAX_PATH_SEGMENTS: usize = 16;
/// The attributes Envoy documents, by first path segment (`response.*` is not known yet when a
/// request is checked, so it is not here).
const PROPERTY_ROOTS: &[&str] = &[
    "request",
    "connection",
    "source",
    "destination",
    "upstream",
    "metadata",
    "filter_state",
    "upstream_filter_state",
    "xds",
    "node",
    "plugin_name",
    "plugin_root_id",
    "plugin_vm_id",
];
/// `property:` spellings that name another attribute: Envoy has no `source.principal` (Istio's
/// name for the peer's identity); the peer certificate's URI SAN (a SPIFFE ID in a mesh) is it.
const PROPERTY_ALIASES: &[(&str, &str)] =
    &[("source.principal", "connection.uri_san_peer_certificate")];
const LIMITS_FIELDS: &[&str] = &["rate", "period_ms", "burst"];

impl TryFrom<&[u8]> for Config {
    type Error = ConfigError;

    /// The configuration for tollgate.wasm (stock Envoy and Istio).
    fn try_from(bytes: &[u8]) -> Result<Self, Self::Error> {
        Config::parse(bytes, Artifact::Envoy)
    }
}

impl Config {
    /// The configuration `bytes` for `artifact`, validated.
    pub fn parse(bytes: &[u8], artifact: Artifact) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            err(
                DOCUMENT,
                format!("not valid UTF-8 (at byte {})", e.valid_up_to()),
            )
        })?;
        if text.trim().is_empty() {
            return Err(err(DOCUMENT, "empty"));
        }
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| err(DOCUMENT, format!("invalid JSON: {e}")))?;
        if !value.is_object() {
            return Err(err(DOCUMENT, "must be a JSON object"));
        }
        parse_config(&value, artifact)
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

fn limits_summary(l: &Limits) -> String {
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
    s
}

// ---------------------------------------------------------------------------------------------
// Parsing helpers: every one takes the field path so errors name it.

fn err(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// `parent.name`, or `name` at the top level.
fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

/// `parent[i]`.
fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

/// A user-supplied string for an error message: quoted, escaped (the log stays one line), and cut
/// to 64 characters.
fn quoted(s: &str) -> String {
    const MAX_CHARS: usize = 64;
    let mut chars = s.chars();
    let head: String = chars.by_ref().take(MAX_CHARS).collect();
    if chars.next().is_some() {
        format!("{head:?}…")
    } else {
        format!("{head:?}")
    }
}

/// A field name the user wrote, safe to put in a field path (escaped, cut to 64 characters).
fn field_name(s: &str) -> String {
    const MAX_CHARS: usize = 64;
    let mut chars = s.chars();
    let head: String = chars.by_ref().take(MAX_CHARS).collect();
    let escaped: String = head.escape_debug().collect();
    if chars.next().is_some() {
        format!("{escaped}…")
    } else {
        escaped
    }
}

/// RFC 9110 `tchar`: the characters of header names and methods.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

fn describe(ty: &str) -> String {
    format!("must be {ty}")
}

/// A JSON object at `path` whose keys are all in `allowed`.
struct Obj<'a> {
    map: &'a serde_json::Map<String, serde_json::Value>,
    path: String,
}

impl<'a> Obj<'a> {
    fn new(
        value: &'a serde_json::Value,
        path: &str,
        allowed: &[&str],
    ) -> Result<Self, ConfigError> {
        let map = value
            .as_object()
            .ok_or_else(|| err(path, describe("an object")))?;
        if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(err(join(path, &field_name(unknown)), "unknown field"));
        }
        Ok(Self {
            map,
            path: path.to_owned(),
        })
    }

    fn path(&self, name: &str) -> String {
        join(&self.path, name)
    }

    fn get(&self, name: &str) -> Option<&'a serde_json::Value> {
        self.map.get(name)
    }

    fn required(&self, name: &str) -> Result<&'a serde_json::Value, ConfigError> {
        self.get(name)
            .ok_or_else(|| err(self.path(name), "required"))
    }

    fn opt_str(&self, name: &str) -> Result<Option<&'a str>, ConfigError> {
        self.get(name)
            .map(|v| as_str(v, &self.path(name)))
            .transpose()
    }

    fn opt_bool(&self, name: &str) -> Result<Option<bool>, ConfigError> {
        self.get(name)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| err(self.path(name), describe("a boolean")))
            })
            .transpose()
    }

    fn opt_int(&self, name: &str, min: u64, max: u64) -> Result<Option<u64>, ConfigError> {
        self.get(name)
            .map(|v| as_int(v, &self.path(name), min, max))
            .transpose()
    }

    fn opt_array(&self, name: &str) -> Result<Option<&'a Vec<serde_json::Value>>, ConfigError> {
        self.get(name)
            .map(|v| {
                v.as_array()
                    .ok_or_else(|| err(self.path(name), describe("an array")))
            })
            .transpose()
    }

    fn opt_obj(&self, name: &str, allowed: &[&str]) -> Result<Option<Obj<'a>>, ConfigError> {
        self.get(name)
            .map(|v| Obj::new(v, &self.path(name), allowed))
            .transpose()
    }
}

fn as_str<'a>(value: &'a serde_json::Value, path: &str) -> Result<&'a str, ConfigError> {
    value
        .as_str()
        .ok_or_else(|| err(path, describe("a string")))
}

/// A JSON integer in `min..=max`. Floats (even `1.0`), strings and negatives are rejected.
fn as_int(value: &serde_json::Value, path: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
    let too_small = || err(path, format!("must be an integer >= {min}"));
    let too_big = || err(path, format!("must be an integer <= {max}"));
    match value.as_u64() {
        Some(n) if n < min => Err(too_small()),
        Some(n) if n > max => Err(too_big()),
        Some(n) => Ok(n),
        // An integer too large for u64 arrives as a float: say what is wrong with it.
        None => match value.as_f64() {
            Some(f) if f > max as f64 => Err(too_big()),
            _ => Err(too_small()),
        },
    }
}

/// A non-empty string of at most `max` bytes with no control characters.
fn check_text(path: &str, s: &str, max: usize) -> Result<(), ConfigError> {
    if s.is_empty() {
        return Err(err(path, "must not be empty"));
    }
    if s.len() > max {
        return Err(err(path, format!("must be at most {max} bytes")));
    }
    if has_control(s) {
        return Err(err(path, "must not contain control characters"));
    }
    Ok(())
}

/// A header name: non-empty token characters, returned lower-cased.
fn header_name(path: &str, s: &str) -> Result<String, ConfigError> {
    if s.is_empty() {
        return Err(err(path, "must not be empty"));
    }
    if !is_token(s) {
        return Err(err(
            path,
            format!(
                "must be a header name of token characters (got {})",
                quoted(s)
            ),
        ));
    }
    Ok(s.to_ascii_lowercase())
}

/// One of `choices`, as `"a", "b", "c"` in the error.
fn one_of<T: Copy>(path: &str, s: &str, choices: &[(&str, T)]) -> Result<T, ConfigError> {
    choices
        .iter()
        .find(|(name, _)| *name == s)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<String> = choices.iter().map(|(n, _)| format!("{n:?}")).collect();
            err(
                path,
                format!("must be one of {} (got {})", names.join(", "), quoted(s)),
            )
        })
}

// ---------------------------------------------------------------------------------------------
// The document.

fn parse_config(value: &serde_json::Value, artifact: Artifact) -> Result<Config, ConfigError> {
    if value.get("_rules_").is_some() {
        // Higress turns a WasmPlugin's matchRules into this field (pkg/ingress/config).
        return Err(err(
            "_rules_",
            "per-route matchRules are not supported: give the plugin config as defaultConfig and \
             select requests with each rule's match",
        ));
    }
    let top = Obj::new(value, "", TOP_FIELDS)?;

    let backend = parse_backend(top.opt_obj("backend", BACKEND_FIELDS)?, artifact)?;

    let key_prefix = match top.opt_str("key_prefix")? {
        None => DEFAULT_KEY_PREFIX.to_owned(),
        Some(p) => {
            let ok = !p.is_empty()
                && p.len() <= MAX_KEY_PREFIX_LEN
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b));
            if !ok {
                return Err(err(
                    "key_prefix",
                    format!(
                        "must be 1 to {MAX_KEY_PREFIX_LEN} characters of [A-Za-z0-9_.:-] (got {})",
                        quoted(p)
                    ),
                ));
            }
            p.to_owned()
        }
    };

    let failure_mode = match top.opt_str("failure_mode")? {
        None => FailureMode::Local,
        Some(s) => one_of(
            "failure_mode",
            s,
            &[
                ("open", FailureMode::Open),
                ("closed", FailureMode::Closed),
                ("local", FailureMode::Local),
            ],
        )?,
    };

    let response_headers = match top.opt_str("response_headers")? {
        None => HeaderStyle::Ietf,
        Some(s) => one_of(
            "response_headers",
            s,
            &[
                ("ietf", HeaderStyle::Ietf),
                ("legacy", HeaderStyle::Legacy),
                ("both", HeaderStyle::Both),
                ("none", HeaderStyle::None),
            ],
        )?,
    };

    let deny = parse_deny(top.opt_obj("deny", DENY_FIELDS)?)?;

    let rules_value = top.required("rules")?;
    let items = rules_value
        .as_array()
        .ok_or_else(|| err("rules", describe("an array")))?;
    if items.is_empty() {
        return Err(err("rules", "must not be empty"));
    }
    if items.len() > MAX_RULES {
        return Err(err(
            "rules",
            format!("must have at most {MAX_RULES} rules (got {})", items.len()),
        ));
    }
    let mut rules: Vec<Rule> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = index("rules", i);
        let rule = parse_rule(item, &path)?;
        if rules.iter().any(|r| r.name == rule.name) {
            return Err(err(
                join(&path, "name"),
                format!("duplicate rule name {}", quoted(&rule.name)),
            ));
        }
        rules.push(rule);
    }

    Ok(Config {
        backend,
        key_prefix,
        failure_mode,
        response_headers,
        deny,
        rules,
    })
}

fn parse_backend(obj: Option<Obj<'_>>, artifact: Artifact) -> Result<Backend, ConfigError> {
    let mut backend = Backend {
        cluster: DEFAULT_CLUSTER.to_owned(),
        authority: DEFAULT_AUTHORITY.to_owned(),
        timeout_ms: DEFAULT_TIMEOUT_MS,
        basic_auth: None,
        username: None,
        password: None,
        database: 0,
        protocol: match artifact {
            Artifact::Envoy => Protocol::Webdis,
            Artifact::Higress => Protocol::Resp,
        },
        breaker_failures: DEFAULT_BREAKER_FAILURES,
        breaker_cooloff_ms: DEFAULT_BREAKER_COOLOFF_MS,
        max_inflight: DEFAULT_MAX_INFLIGHT,
    };
    let Some(obj) = obj else {
        return Ok(backend);
    };
    let (other, reason) = if artifact == Artifact::Higress {
        (
            WEBDIS_ONLY_FIELDS,
            "only in tollgate.wasm (the HTTP build, Webdis); this Higress build calls Redis directly",
        )
    } else {
        (
            REDIS_ONLY_FIELDS,
            "only in the Higress build (tollgate-higress.wasm, Redis callouts); this build reaches Redis through Webdis",
        )
    };
    if let Some(name) = other.iter().find(|n| obj.get(n).is_some()) {
        return Err(err(obj.path(name), reason));
    }
    parse_redis_fields(&obj, &mut backend)?;
    if let Some(s) = obj.opt_str("cluster")? {
        check_text(&obj.path("cluster"), s, MAX_BACKEND_NAME_LEN)?;
        s.clone_into(&mut backend.cluster);
    }
    if let Some(s) = obj.opt_str("authority")? {
        check_text(&obj.path("authority"), s, MAX_BACKEND_NAME_LEN)?;
        s.clone_into(&mut backend.authority);
    }
    if let Some(n) = obj.opt_int("timeout_ms", 1, MAX_TIMEOUT_MS)? {
        backend.timeout_ms = n;
    }
    if let Some(n) = obj.opt_int("breaker_failures", 1, MAX_BREAKER_FAILURES)? {
        backend.breaker_failures = n;
    }
    if let Some(n) = obj.opt_int(
        "breaker_cooloff_ms",
        MIN_BREAKER_COOLOFF_MS,
        MAX_BREAKER_COOLOFF_MS,
    )? {
        backend.breaker_cooloff_ms = n;
    }
    if let Some(n) = obj.opt_int("max_inflight", 1, MAX_MAX_INFLIGHT)? {
        backend.max_inflight = n;
    }
    if let Some(s) = obj.opt_str("basic_auth")? {
        // Never echo the value: it is a secret.
        let path = obj.path("basic_auth");
        if s.len() > MAX_BASIC_AUTH_LEN {
            return Err(err(
                path,
                format!("must be at most {MAX_BASIC_AUTH_LEN} bytes"),
            ));
        }
        if has_control(s) {
            return Err(err(path, "must not contain control characters"));
        }
        if !s.contains(':') {
            return Err(err(path, "must have the form user:pass"));
        }
        backend.basic_auth = Some(s.to_owned());
    }
    Ok(backend)
}

/// The Higress build's Redis fields: `service_name` and `service_port` name the cluster the way
/// Higress does (`outbound|<port>||<service>`; port 6379, or 80 for a `.static` service), as its own
/// Redis plugins take them; `username`, `password` (never echoed) and `database`.
fn parse_redis_fields(obj: &Obj<'_>, backend: &mut Backend) -> Result<(), ConfigError> {
    let service = obj.opt_str("service_name")?;
    let port = obj.opt_int("service_port", 1, 65_535)?;
    match (service, obj.get("cluster")) {
        (Some(_), Some(_)) => {
            return Err(err(
                obj.path("service_name"),
                "give either cluster or service_name, not both",
            ))
        }
        (None, None) if port.is_some() => {
            return Err(err(obj.path("service_port"), "needs service_name"))
        }
        (Some(name), None) => {
            check_text(&obj.path("service_name"), name, MAX_BACKEND_NAME_LEN - 16)?;
            let default_port = if name.ends_with(".static") { 80 } else { 6379 };
            backend.cluster = format!("outbound|{}||{name}", port.unwrap_or(default_port));
        }
        _ => {}
    }
    for (name, slot) in [
        ("username", &mut backend.username),
        ("password", &mut backend.password),
    ] {
        if let Some(s) = obj.opt_str(name)? {
            // Never echo the value: it is a secret.
            let path = obj.path(name);
            if s.is_empty() {
                return Err(err(path, "must not be empty"));
            }
            if s.len() > MAX_REDIS_SECRET_LEN {
                return Err(err(
                    path,
                    format!("must be at most {MAX_REDIS_SECRET_LEN} bytes"),
                ));
            }
            if has_control(s) {
                return Err(err(path, "must not contain control characters"));
            }
            *slot = Some(s.to_owned());
        }
    }
    if backend.username.is_some() && backend.password.is_none() {
        return Err(err(obj.path("username"), "needs password"));
    }
    if let Some(n) = obj.opt_int("database", 0, MAX_DATABASE)? {
        backend.database = n;
    }
    Ok(())
}

fn parse_deny(obj: Option<Obj<'_>>) -> Result<Deny, ConfigError> {
    let mut deny = Deny {
        status: DEFAULT_DENY_STATUS,
        body: DEFAULT_DENY_BODY.to_owned(),
        grpc_resource_exhausted: true,
    };
    let Some(obj) = obj else {
        return Ok(deny);
    };
    if let Some(b) = obj.opt_bool("grpc_resource_exhausted")? {
        deny.grpc_resource_exhausted = b;
    }
    if let Some(n) = obj.opt_int("status", 400, 599)? {
        deny.status =
            u32::try_from(n).map_err(|_| err(obj.path("status"), "must be an integer <= 599"))?;
    }
    if let Some(s) = obj.opt_str("body")? {
        if s.len() > MAX_DENY_BODY_LEN {
            return Err(err(
                obj.path("body"),
                format!(
                    "must be at most {MAX_DENY_BODY_LEN} bytes (got {})",
                    s.len()
                ),
            ));
        }
        s.clone_into(&mut deny.body);
    }
    Ok(deny)
}

fn parse_rule(value: &serde_json::Value, path: &str) -> Result<Rule, ConfigError> {
    let obj = Obj::new(value, path, RULE_FIELDS)?;

    let name_path = obj.path("name");
    let name = as_str(obj.required("name")?, &name_path)?;
    let name_ok = !name.is_empty()
        && name.len() <= MAX_RULE_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !name_ok {
        return Err(err(
            name_path,
            format!(
                "must be 1 to {MAX_RULE_NAME_LEN} characters of [A-Za-z0-9_-] (got {})",
                quoted(name)
            ),
        ));
    }

    let matcher = match obj.opt_obj("match", MATCH_FIELDS)? {
        None => Match::default(),
        Some(m) => parse_match(&m)?,
    };

    let key = match obj.opt_array("key")? {
        None => Vec::new(),
        Some(items) => {
            if items.len() > MAX_KEY_SOURCES {
                return Err(err(
                    obj.path("key"),
                    format!(
                        "must have at most {MAX_KEY_SOURCES} key sources (got {})",
                        items.len()
                    ),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let p = index(&obj.path("key"), i);
                    parse_key_source(as_str(v, &p)?, &p)
                })
                .collect::<Result<Vec<_>, _>>()?
        }
    };

    let limits = parse_limits(&obj)?;

    let cost = obj.opt_int("cost", 1, MAX_TOKENS)?.unwrap_or(DEFAULT_COST);
    if cost > limits.burst {
        return Err(err(
            obj.path("cost"),
            format!("must be an integer <= {} (the rule's burst)", limits.burst),
        ));
    }

    let cost_header = obj
        .opt_str("cost_header")?
        .map(|s| header_name(&obj.path("cost_header"), s))
        .transpose()?;

    let mode = match obj.opt_str("mode")? {
        None => Mode::Exact,
        Some(s) => one_of(
            &obj.path("mode"),
            s,
            &[("exact", Mode::Exact), ("lease", Mode::Lease)],
        )?,
    };

    let lease_max = obj
        .opt_int("lease_max", 1, limits.burst)?
        .unwrap_or(limits.burst);
    let lease_horizon_ms = obj
        .opt_int(
            "lease_horizon_ms",
            MIN_LEASE_HORIZON_MS,
            MAX_LEASE_HORIZON_MS,
        )?
        .unwrap_or(DEFAULT_LEASE_HORIZON_MS);

    let max_wait_ms = obj
        .opt_int("max_wait_ms", 0, crate::bucket::MAX_WAIT_MS)?
        .unwrap_or(0);
    if max_wait_ms > 0 && mode == Mode::Lease {
        return Err(err(
            obj.path("max_wait_ms"),
            "needs \"mode\": \"exact\" (a lease-mode request is served from leased tokens, not reserved)",
        ));
    }

    let shadow = obj.opt_bool("shadow")?.unwrap_or(false);

    let fallback = obj
        .opt_obj("fallback", LIMITS_FIELDS)?
        .map(|f| parse_fallback(&f, &limits, cost))
        .transpose()?;

    let usage = obj
        .opt_obj("usage", USAGE_FIELDS)?
        .map(|u| parse_usage(&u))
        .transpose()?;
    if usage.is_some() && mode == Mode::Lease {
        return Err(err(
            obj.path("usage"),
            "needs \"mode\": \"exact\" (leased tokens are spent without a call, so a charge \
             could not be counted before the next admission)",
        ));
    }
    let overrides = match obj.opt_array("overrides")? {
        None => BTreeMap::new(),
        Some(items) => parse_overrides(items, &obj.path("overrides"), &key, &limits, cost)?,
    };

    Ok(Rule {
        name: name.to_owned(),
        matcher,
        key,
        limits,
        cost,
        cost_header,
        mode,
        max_wait_ms,
        lease_max,
        lease_horizon_ms,
        shadow,
        fallback,
        usage,
        overrides,
    })
}

fn parse_usage(obj: &Obj<'_>) -> Result<Usage, ConfigError> {
    let header = obj.opt_str("header")?;
    let field = obj.opt_str("body_field")?;
    let source = match (header, field) {
        (Some(h), None) => UsageSource::Header(header_name(&obj.path("header"), h)?),
        (None, Some(f)) => {
            let path = obj.path("body_field");
            let segments: Vec<String> = f.split('.').map(str::to_owned).collect();
            let ok_segment = |seg: &String| {
                !seg.is_empty()
                    && seg.len() <= MAX_FIELD_SEGMENT_LEN
                    && seg
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
            };
            if segments.len() > MAX_FIELD_SEGMENTS || !segments.iter().all(ok_segment) {
                return Err(err(
                    path,
                    format!(
                        "must be 1 to {MAX_FIELD_SEGMENTS} dot-separated names of [A-Za-z0-9_-] \
                         (got {})",
                        quoted(f)
                    ),
                ));
            }
            UsageSource::BodyField(segments)
        }
        _ => {
            return Err(err(
                obj.path.clone(),
                "needs exactly one of \"header\" or \"body_field\"",
            ))
        }
    };
    let flush_ms = obj
        .opt_int("flush_ms", 1, MAX_USAGE_FLUSH_MS)?
        .unwrap_or(DEFAULT_USAGE_FLUSH_MS);
    let unreadable = obj
        .opt_int("unreadable", 1, MAX_TOKENS)?
        .map_or(WorstCase::Recent, WorstCase::Fixed);
    Ok(Usage {
        source,
        flush_ms,
        unreadable,
    })
}

/// A rule's `fallback`: its `period_ms` defaults to the rule's (a fallback of `"rate": 2` on a
/// rule of 60 per minute is 2 per minute, not 2 per second), and its burst must hold the rule's
/// cost (a smaller one would deny every request while the backend is down).
fn parse_fallback(obj: &Obj<'_>, rule: &Limits, cost: u64) -> Result<Limits, ConfigError> {
    let limits = parse_limits_with_period(obj, rule.period_ms)?;
    if limits.burst < cost {
        let defaulted = if obj.get("burst").is_none() {
            ": burst defaults to the fallback's rate"
        } else {
            ""
        };
        return Err(err(
            obj.path("burst"),
            format!(
                "must be at least the rule's cost ({cost}), or the fallback denies every request \
                 (got {}{defaulted})",
                limits.burst
            ),
        ));
    }
    Ok(limits)
}

/// `rate` (required), `period_ms` and `burst` of `obj`, as a rule.
fn parse_limits(obj: &Obj<'_>) -> Result<Limits, ConfigError> {
    parse_limits_with_period(obj, DEFAULT_PERIOD_MS)
}

/// Like [`parse_limits`], with `period_ms` defaulting to `default_period_ms`.
fn parse_limits_with_period(obj: &Obj<'_>, default_period_ms: u64) -> Result<Limits, ConfigError> {
    let rate = as_int(obj.required("rate")?, &obj.path("rate"), 1, MAX_TOKENS)?;
    let period_ms = obj
        .opt_int("period_ms", 1, MAX_PERIOD_MS)?
        .unwrap_or(default_period_ms);
    let burst = obj.opt_int("burst", 1, MAX_TOKENS)?.unwrap_or(rate);
    let product = burst.checked_mul(period_ms);
    if product.is_none_or(|p| p > MAX_BURST_PERIOD) {
        let got = product.map_or_else(|| "overflow".to_owned(), |p| p.to_string());
        return Err(err(
            obj.path("burst"),
            format!(
                "burst × period_ms must be at most 2^50 = {MAX_BURST_PERIOD} (got {burst} × {period_ms} = {got})"
            ),
        ));
    }
    Ok(Limits {
        burst,
        rate,
        period_ms,
    })
}

fn parse_match(obj: &Obj<'_>) -> Result<Match, ConfigError> {
    let path_prefix = match obj.opt_str("path_prefix")? {
        None => None,
        Some(p) => {
            let path = obj.path("path_prefix");
            if !p.starts_with('/') {
                return Err(err(
                    path,
                    format!("must start with '/' (got {})", quoted(p)),
                ));
            }
            if p.contains(['?', '#']) {
                return Err(err(
                    path,
                    format!(
                        "must not contain '?' or '#': it is matched against the path without the query (got {})",
                        quoted(p)
                    ),
                ));
            }
            if has_control(p) {
                return Err(err(path, "must not contain control characters"));
            }
            let normal =
                crate::rule::path::normalize(p.as_bytes(), crate::rule::path::Reading::STRICT);
            if normal.irregular || normal.path != p.as_bytes() {
                return Err(err(
                    path,
                    format!(
                        "must be in normal form, as requests are compared in it (got {}, which reads as {})",
                        quoted(p),
                        quoted(&String::from_utf8_lossy(&normal.path))
                    ),
                ));
            }
            Some(p.to_owned())
        }
    };
    let path_ignore_case = obj.opt_bool("path_ignore_case")?.unwrap_or(false);

    let methods = match obj.opt_array("methods")? {
        None => Vec::new(),
        Some(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let p = index(&obj.path("methods"), i);
                let m = as_str(v, &p)?;
                if m.is_empty() {
                    return Err(err(p, "must not be empty"));
                }
                if !is_token(m) {
                    return Err(err(
                        p,
                        format!(
                            "must be an HTTP method of token characters (got {})",
                            quoted(m)
                        ),
                    ));
                }
                Ok(m.to_ascii_uppercase())
            })
            .collect::<Result<Vec<_>, _>>()?,
    };

    let headers = match obj.opt_array("headers")? {
        None => Vec::new(),
        Some(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| parse_header_match(v, &index(&obj.path("headers"), i)))
            .collect::<Result<Vec<_>, _>>()?,
    };

    let hosts = match obj.opt_array("hosts")? {
        None => Vec::new(),
        Some(items) => {
            if items.len() > MAX_HOSTS {
                return Err(err(
                    obj.path("hosts"),
                    format!("must have at most {MAX_HOSTS} hosts (got {})", items.len()),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let p = index(&obj.path("hosts"), i);
                    parse_host(as_str(v, &p)?, &p)
                })
                .collect::<Result<Vec<_>, _>>()?
        }
    };

    Ok(Match {
        path_prefix,
        path_ignore_case,
        methods,
        headers,
        hosts,
    })
}

/// A `match.hosts` entry: a host name (or IP literal) without port, optionally starting with `*.`;
/// returned lower-cased, without a trailing dot.
fn parse_host(s: &str, path: &str) -> Result<String, ConfigError> {
    let bad = |why: &str| err(path, format!("{why} (got {})", quoted(s)));
    let host = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
    if host.starts_with('[') {
        let inner = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        if inner.is_some_and(|h| h.contains('%')) {
            return Err(bad(
                "must not have a zone id (it names the client's interface; requests are \
                 compared without it)",
            ));
        }
        let ok = inner.is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok());
        return if ok {
            // Compared in canonical form, as requests' hosts are.
            String::from_utf8(crate::rule::host::canonical(host.into_bytes()))
                .map_err(|_| bad("must be a host name, an IPv4 address or [IPv6], without port"))
        } else {
            Err(bad(
                "must be a host name, an IPv4 address or [IPv6], without port",
            ))
        };
    }
    let name = host.strip_prefix("*.").unwrap_or(&host);
    if name.contains(':') {
        return Err(bad("must not have a port (hosts are compared without it)"));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(bad(
            "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\"",
        ));
    }
    Ok(host)
}

fn parse_header_match(value: &serde_json::Value, path: &str) -> Result<HeaderMatch, ConfigError> {
    const KINDS: &str = "\"exact\", \"prefix\", \"regex\", \"present\" or \"absent\"";
    let obj = Obj::new(value, path, HEADER_MATCH_FIELDS)?;
    let name_path = obj.path("name");
    let name = header_name(&name_path, as_str(obj.required("name")?, &name_path)?)?;
    let given: Vec<&str> = ["exact", "prefix", "regex", "present", "absent"]
        .into_iter()
        .filter(|k| obj.get(k).is_some())
        .collect();
    let kind = match given.as_slice() {
        [one] => *one,
        [] => return Err(err(path, format!("must have exactly one of {KINDS}"))),
        _ => {
            return Err(err(
                path,
                format!(
                    "must have exactly one of {KINDS}, not {}",
                    given.join(" and ")
                ),
            ))
        }
    };
    let flag = |k: &str| -> Result<(), ConfigError> {
        match obj.opt_bool(k)? {
            Some(true) => Ok(()),
            _ => Err(err(obj.path(k), "must be true")),
        }
    };
    let text = |k: &str| -> Result<String, ConfigError> {
        Ok(obj.opt_str(k)?.unwrap_or_default().to_owned())
    };
    let value = match kind {
        "exact" => HeaderValueMatch::Exact(text("exact")?),
        "prefix" => HeaderValueMatch::Prefix(text("prefix")?),
        "regex" => {
            let source = text("regex")?;
            HeaderValueMatch::Regex(Pattern::new(&source).map_err(|e| err(obj.path("regex"), e))?)
        }
        "present" => {
            flag("present")?;
            HeaderValueMatch::Present
        }
        _ => {
            flag("absent")?;
            HeaderValueMatch::Absent
        }
    };
    Ok(HeaderMatch { name, value })
}

fn parse_key_source(s: &str, path: &str) -> Result<KeySource, ConfigError> {
    match s {
        "client_ip" => return Ok(KeySource::CLIENT_IP),
        "path" => return Ok(KeySource::Path),
        "method" => return Ok(KeySource::Method),
        "authority" => return Ok(KeySource::Authority),
        _ => {}
    }
    if let Some(spec) = s.strip_prefix("client_ip:") {
        return parse_client_ip(spec, s, path);
    }
    if let Some(name) = s.strip_prefix("header:") {
        if !is_token(name) {
            return Err(err(
                path,
                format!(
                    "header:NAME needs a non-empty header name of token characters (got {})",
                    quoted(s)
                ),
            ));
        }
        return Ok(KeySource::Header(name.to_ascii_lowercase()));
    }
    if let Some(name) = s.strip_prefix("query:") {
        if name.is_empty() {
            return Err(err(
                path,
                format!("query:NAME needs a non-empty name (got {})", quoted(s)),
            ));
        }
        return Ok(KeySource::Query(name.to_owned()));
    }
    if let Some(name) = s.strip_prefix("cookie:") {
        if !is_token(name) {
            return Err(err(
                path,
                format!(
                    "cookie:NAME needs a non-empty cookie name of token characters (got {})",
                    quoted(s)
                ),
            ));
        }
        return Ok(KeySource::Cookie(name.to_owned()));
    }
    if let Some(spelled) = s.strip_prefix("property:") {
        return parse_property(spelled, s, path);
    }
    if let Some(spec) = s.strip_prefix("metadata:") {
        return parse_metadata(spec, s, path);
    }
    if let Some(text) = s.strip_prefix("literal:") {
        if text.is_empty() {
            return Err(err(
                path,
                format!("literal:TEXT needs a non-empty text (got {})", quoted(s)),
            ));
        }
        return Ok(KeySource::Literal(text.to_owned()));
    }
    Err(err(
        path,
        format!("unknown key source {} ({KEY_SOURCE_HELP})", quoted(s)),
    ))
}

/// Dot-separated segments, each non-empty and without control characters, at most
/// `MAX_PATH_SEGMENTS`.
fn segments(text: &str) -> Option<Vec<String>> {
    let parts: Vec<String> = text.split('.').map(str::to_owned).collect();
    let ok = !text.is_empty()
        && parts.len() <= MAX_PATH_SEGMENTS
        && parts.iter().all(|p| !p.is_empty() && !has_control(p));
    ok.then_some(parts)
}

/// `property:` + an attribute path.
fn parse_property(spelled: &str, whole: &str, path: &str) -> Result<KeySource, ConfigError> {
    let resolved = PROPERTY_ALIASES
        .iter()
        .find(|(alias, _)| *alias == spelled)
        .map_or(spelled, |(_, to)| to);
    let Some(segs) = segments(resolved) else {
        return Err(err(
            path,
            format!(
                "property:PATH needs 1 to {MAX_PATH_SEGMENTS} non-empty dot-separated segments (got {})",
                quoted(whole)
            ),
        ));
    };
    let root = segs.first().map(String::as_str).unwrap_or_default();
    if !PROPERTY_ROOTS.contains(&root) {
        let why = if root == "response" {
            "response attributes are not known yet when a request is checked".to_owned()
        } else {
            format!(
                "unknown attribute {} (Envoy's attributes start with {})",
                quoted(root),
                PROPERTY_ROOTS.join(", ")
            )
        };
        return Err(err(path, format!("{why} (got {})", quoted(whole))));
    }
    Ok(KeySource::Property {
        spelled: spelled.to_owned(),
        path: segs,
    })
}

/// `metadata:` + `<namespace>:<field>[.<field>…]`.
fn parse_metadata(spec: &str, whole: &str, path: &str) -> Result<KeySource, ConfigError> {
    let parsed = spec.split_once(':').and_then(|(ns, fields)| {
        let ns_ok = !ns.is_empty() && !has_control(ns);
        ns_ok.then_some(())?;
        Some((ns.to_owned(), segments(fields)?))
    });
    let Some((namespace, fields)) = parsed else {
        return Err(err(
            path,
            format!(
                "metadata:NAMESPACE:FIELD[.FIELD…] needs a namespace and 1 to {MAX_PATH_SEGMENTS} \
                 non-empty fields (got {})",
                quoted(whole)
            ),
        ));
    };
    Ok(KeySource::Metadata { namespace, fields })
}

/// The value an override names for `source`, in the form a request's value would take.
fn override_value(source: &KeySource, text: &str, path: &str) -> Result<Vec<u8>, ConfigError> {
    match source {
        KeySource::ClientIp {
            v4_prefix,
            v6_prefix,
        } => crate::rule::ip::canonical(text, *v4_prefix, *v6_prefix).ok_or_else(|| {
            err(
                path,
                format!(
                    "must be an address or network as {source} gives it: IPv4 /{v4_prefix}, \
                     IPv6 /{v6_prefix}, host bits zero (got {})",
                    quoted(text)
                ),
            )
        }),
        KeySource::Authority => Ok(text.to_ascii_lowercase().into_bytes()),
        KeySource::Path => Ok(crate::rule::path::key_value(text.as_bytes())),
        KeySource::Cookie(_) => {
            crate::rule::reading::cookie_value(text.as_bytes()).ok_or_else(|| {
                err(
                    path,
                    format!(
                        "a quoted cookie value with a backslash is read differently by different \
                     servers, so it is never a key (got {})",
                        quoted(text)
                    ),
                )
            })
        }
        _ => Ok(text.as_bytes().to_vec()),
    }
}

/// A rule's `overrides`: key tuples (as requests give them) to their limits.
fn parse_overrides(
    items: &[serde_json::Value],
    path: &str,
    key: &[KeySource],
    rule_limits: &Limits,
    cost: u64,
) -> Result<BTreeMap<Vec<Vec<u8>>, Override>, ConfigError> {
    if items.len() > MAX_OVERRIDES {
        return Err(err(
            path,
            format!(
                "must have at most {MAX_OVERRIDES} overrides (got {})",
                items.len()
            ),
        ));
    }
    if key.is_empty() && !items.is_empty() {
        return Err(err(
            path,
            "needs key sources: a rule without a key has one bucket, give it these limits instead",
        ));
    }
    let mut out = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let p = index(path, i);
        let obj = Obj::new(item, &p, OVERRIDE_FIELDS)?;
        let key_path = obj.path("key");
        let values = obj
            .required("key")?
            .as_array()
            .ok_or_else(|| err(&key_path, describe("an array")))?;
        if values.len() != key.len() {
            return Err(err(
                &key_path,
                format!(
                    "must have one value per key source ({}, got {})",
                    key.len(),
                    values.len()
                ),
            ));
        }
        let tuple = values
            .iter()
            .zip(key)
            .enumerate()
            .map(|(j, (v, source))| {
                let vp = index(&key_path, j);
                override_value(source, as_str(v, &vp)?, &vp)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let unlimited = obj.opt_bool("unlimited")?;
        let has_limits = ["rate", "period_ms", "burst"]
            .iter()
            .any(|f| obj.get(f).is_some());
        let value = match (unlimited, has_limits) {
            (Some(true), false) => Override::Unlimited,
            (Some(true), true) => return Err(err(
                &p,
                "must have either \"unlimited\": true or limits (rate, period_ms, burst), not both",
            )),
            (Some(false), _) => return Err(err(obj.path("unlimited"), "must be true")),
            (None, _) => {
                let limits = parse_limits_with_period(&obj, rule_limits.period_ms)?;
                if cost > limits.burst {
                    return Err(err(
                        obj.path("burst"),
                        format!("must be at least the rule's cost ({cost})"),
                    ));
                }
                Override::Limits(limits)
            }
        };
        if out.insert(tuple, value).is_some() {
            return Err(err(&key_path, "names the same key as an earlier override"));
        }
    }
    Ok(out)
}

/// `v4=/N`, `v6=/M` or both, comma-separated, after `client_ip:`.
fn parse_client_ip(spec: &str, whole: &str, path: &str) -> Result<KeySource, ConfigError> {
    let bad = || {
        err(
            path,
            format!(
                "client_ip takes v4=/N (8-32) and/or v6=/M (8-128), comma-separated (got {})",
                quoted(whole)
            ),
        )
    };
    let (mut v4, mut v6) = (None, None);
    for part in spec.split(',') {
        let (family, bits) = part.split_once("=/").ok_or_else(bad)?;
        let bits: u8 = bits
            .parse()
            .ok()
            .filter(|b| bits.bytes().all(|c| c.is_ascii_digit()) && *b >= 8)
            .ok_or_else(bad)?;
        let slot = match family {
            "v4" if bits <= 32 => &mut v4,
            "v6" if bits <= 128 => &mut v6,
            _ => return Err(bad()),
        };
        if slot.replace(bits).is_some() {
            return Err(bad());
        }
    }
    Ok(KeySource::ClientIp {
        v4_prefix: v4.unwrap_or(crate::rule::ip::DEFAULT_V4_PREFIX),
        v6_prefix: v6.unwrap_or(crate::rule::ip::DEFAULT_V6_PREFIX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plugin configuration example of the design reference (shared/DESIGN.md, outside this
    /// repository), kept here verbatim.
    const DESIGN_EXAMPLE: &str = r#"{
  "backend":  { "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 25,
                "basic_auth": "user:pass" },
  "key_prefix": "tollgate",
  "failure_mode": "local",
  "response_headers": "ietf",
  "deny": { "status": 429, "body": "rate limited\n" },
  "rules": [
    { "name": "per-user",
      "match": { "path_prefix": "/api/", "methods": ["GET", "POST"],
                 "headers": [ { "name": "x-tier", "exact": "free" } ] },
      "key": ["header:x-user-id"],
      "rate": 100, "period_ms": 1000, "burst": 200,
      "cost": 1, "cost_header": "x-cost",
      "mode": "lease",
      "shadow": false,
      "fallback": { "rate": 25, "period_ms": 1000, "burst": 50 } }
  ]
}"#;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::try_from(s.as_bytes())
    }

    fn parse_higress(s: &str) -> Result<Config, ConfigError> {
        Config::parse(s.as_bytes(), Artifact::Higress)
    }

    fn higress_error(s: &str) -> String {
        match parse_higress(s) {
            Ok(c) => panic!("expected an error, parsed {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// The Display of the error for `s`.
    fn error(s: &str) -> String {
        match parse(s) {
            Ok(c) => panic!("expected an error, parsed {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// The error for a document with one rule whose body is `rule` (without braces).
    fn rule_error(rule: &str) -> String {
        error(&format!(r#"{{"rules":[{{"name":"r",{rule}}}]}}"#))
    }

    fn one_rule(rule: &str) -> Rule {
        let c = parse(&format!(r#"{{"rules":[{{"name":"r",{rule}}}]}}"#)).unwrap();
        c.rules.into_iter().next().unwrap()
    }

    #[test]
    fn usage_sources_and_their_errors() {
        let r = one_rule(r#""rate":1,"usage":{"header":"X-Usage-Tokens"}"#);
        let want = Usage {
            source: UsageSource::Header("x-usage-tokens".into()),
            flush_ms: DEFAULT_USAGE_FLUSH_MS,
            unreadable: WorstCase::Recent,
        };
        assert_eq!(r.usage, Some(want));
        let r = one_rule(
            r#""rate":1,"usage":{"body_field":"usage.total_tokens","flush_ms":50,"unreadable":4000}"#,
        );
        let want = Usage {
            source: UsageSource::BodyField(vec!["usage".into(), "total_tokens".into()]),
            flush_ms: 50,
            unreadable: WorstCase::Fixed(4000),
        };
        assert_eq!(r.usage, Some(want));
        for (rule, message) in [
            (
                r#""rate":1,"usage":{}"#,
                r#"rules[0].usage: needs exactly one of "header" or "body_field""#,
            ),
            (
                r#""rate":1,"usage":{"header":"a","body_field":"b"}"#,
                r#"rules[0].usage: needs exactly one of "header" or "body_field""#,
            ),
            (
                r#""rate":1,"usage":{"body_field":"usage..total"}"#,
                r#"rules[0].usage.body_field: must be 1 to 8 dot-separated names of [A-Za-z0-9_-] (got "usage..total")"#,
            ),
            (
                r#""rate":1,"usage":{"body_field":"a.b.c.d.e.f.g.h.i"}"#,
                r#"rules[0].usage.body_field: must be 1 to 8 dot-separated names of [A-Za-z0-9_-] (got "a.b.c.d.e.f.g.h.i")"#,
            ),
            (
                r#""rate":1,"usage":{"header":"a b"}"#,
                r#"rules[0].usage.header: must be a header name of token characters (got "a b")"#,
            ),
            (
                r#""rate":1,"usage":{"header":"x","flush_ms":0}"#,
                "rules[0].usage.flush_ms: must be an integer >= 1",
            ),
            (
                r#""rate":1,"usage":{"header":"x","unreadable":0}"#,
                "rules[0].usage.unreadable: must be an integer >= 1",
            ),
            (
                r#""rate":1,"usage":{"header":"x","unreadable":1000000001}"#,
                "rules[0].usage.unreadable: must be an integer <= 1000000000",
            ),
            (
                r#""rate":1,"usage":{"header":"x","unreadable":"max"}"#,
                "rules[0].usage.unreadable: must be an integer >= 1",
            ),
            (
                r#""rate":1,"usage":{"header":"x","tokens":1}"#,
                "rules[0].usage.tokens: unknown field",
            ),
            (
                r#""rate":1,"mode":"lease","usage":{"header":"x"}"#,
                r#"rules[0].usage: needs "mode": "exact" (leased tokens are spent without a call, so a charge could not be counted before the next admission)"#,
            ),
        ] {
            let got = rule_error(rule);
            assert!(
                got.starts_with(message.split(" (got").next().unwrap()),
                "{rule}: {got}"
            );
            assert_eq!(got, message, "{rule}");
        }
    }

    #[test]
    fn design_example_parses() {
        let c = parse(DESIGN_EXAMPLE).unwrap();
        let want = Config {
            backend: Backend {
                cluster: "tollgate_backend".into(),
                authority: "webdis".into(),
                timeout_ms: 25,
                basic_auth: Some("user:pass".into()),
                username: None,
                password: None,
                database: 0,
                protocol: Protocol::Webdis,
                breaker_failures: 5,
                breaker_cooloff_ms: 1000,
                max_inflight: 256,
            },
            key_prefix: "tollgate".into(),
            failure_mode: FailureMode::Local,
            response_headers: HeaderStyle::Ietf,
            deny: Deny {
                status: 429,
                body: "rate limited\n".into(),
                grpc_resource_exhausted: true,
            },
            rules: vec![Rule {
                name: "per-user".into(),
                matcher: Match {
                    path_prefix: Some("/api/".into()),
                    path_ignore_case: false,
                    hosts: vec![],
                    methods: vec!["GET".into(), "POST".into()],
                    headers: vec![HeaderMatch {
                        name: "x-tier".into(),
                        value: HeaderValueMatch::Exact("free".into()),
                    }],
                },
                key: vec![KeySource::Header("x-user-id".into())],
                limits: Limits {
                    burst: 200,
                    rate: 100,
                    period_ms: 1000,
                },
                cost: 1,
                cost_header: Some("x-cost".into()),
                mode: Mode::Lease,
                max_wait_ms: 0,
                lease_max: 200,
                lease_horizon_ms: 200,
                shadow: false,
                fallback: Some(Limits {
                    burst: 50,
                    rate: 25,
                    period_ms: 1000,
                }),
                usage: None,
                overrides: BTreeMap::new(),
            }],
        };
        assert_eq!(c, want);
        assert_eq!(
            c.summary(),
            "1 rule: per-user 100/1000ms burst 200 lease (fallback 25/1000ms burst 50)"
        );
    }

    #[test]
    fn max_wait_needs_exact_mode_and_a_bound() {
        let r = one_rule(r#""rate":5,"max_wait_ms":250"#);
        assert_eq!(r.max_wait_ms, 250);
        assert_eq!(
            error(r#"{"rules":[{"name":"a","rate":5,"mode":"lease","max_wait_ms":250}]}"#),
            "rules[0].max_wait_ms: needs \"mode\": \"exact\" (a lease-mode request is served from leased tokens, not reserved)"
        );
        assert_eq!(
            error(r#"{"rules":[{"name":"a","rate":5,"max_wait_ms":3600001}]}"#),
            "rules[0].max_wait_ms: must be an integer <= 3600000"
        );
    }

    #[test]
    fn defaults() {
        let c = parse(r#"{"rules":[{"name":"all","rate":10}]}"#).unwrap();
        let want = Config {
            backend: Backend {
                cluster: "tollgate_backend".into(),
                authority: "webdis".into(),
                timeout_ms: 50,
                basic_auth: None,
                username: None,
                password: None,
                database: 0,
                protocol: Protocol::Webdis,
                breaker_failures: 5,
                breaker_cooloff_ms: 1000,
                max_inflight: 256,
            },
            key_prefix: "tollgate".into(),
            failure_mode: FailureMode::Local,
            response_headers: HeaderStyle::Ietf,
            deny: Deny {
                status: 429,
                body: "rate limited\n".into(),
                grpc_resource_exhausted: true,
            },
            rules: vec![Rule {
                name: "all".into(),
                matcher: Match::default(),
                key: vec![],
                limits: Limits {
                    burst: 10,
                    rate: 10,
                    period_ms: 1000,
                },
                cost: 1,
                cost_header: None,
                mode: Mode::Exact,
                max_wait_ms: 0,
                lease_max: 10,
                lease_horizon_ms: 200,
                shadow: false,
                fallback: None,
                usage: None,
                overrides: BTreeMap::new(),
            }],
        };
        assert_eq!(c, want);
        // Empty sub-objects give the same defaults.
        let c2 = parse(r#"{"backend":{},"deny":{},"rules":[{"name":"all","rate":10,"match":{}}]}"#)
            .unwrap();
        assert_eq!(c2, want);
    }

    #[test]
    fn fallback_defaults_burst_and_period() {
        let r = one_rule(r#""rate":5,"fallback":{"rate":3}"#);
        assert_eq!(
            r.fallback,
            Some(Limits {
                burst: 3,
                rate: 3,
                period_ms: 1000
            })
        );
    }

    #[test]
    fn a_fallback_period_defaults_to_the_rule_s() {
        // 60 per minute with a fallback of 2: 2 per minute, not 2 per second.
        let r = one_rule(r#""rate":60,"period_ms":60000,"fallback":{"rate":2}"#);
        assert_eq!(
            r.fallback,
            Some(Limits {
                burst: 2,
                rate: 2,
                period_ms: 60000
            })
        );
        // A period of its own is kept.
        let r = one_rule(r#""rate":60,"period_ms":60000,"fallback":{"rate":2,"period_ms":1000}"#);
        assert_eq!(r.fallback.map(|f| f.period_ms), Some(1000));
    }

    #[test]
    fn a_fallback_burst_below_the_cost_is_an_error() {
        assert_eq!(
            rule_error(r#""rate":10,"cost":3,"fallback":{"rate":1,"burst":2}"#),
            "rules[0].fallback.burst: must be at least the rule's cost (3), or the fallback \
             denies every request (got 2)"
        );
        assert_eq!(
            rule_error(r#""rate":10,"cost":3,"fallback":{"rate":2}"#),
            "rules[0].fallback.burst: must be at least the rule's cost (3), or the fallback \
             denies every request (got 2: burst defaults to the fallback's rate)"
        );
        let r = one_rule(r#""rate":10,"cost":3,"fallback":{"rate":1,"burst":3}"#);
        assert_eq!(r.fallback.map(|f| f.burst), Some(3));
    }

    #[test]
    fn all_key_sources_and_lowercasing() {
        let r = one_rule(
            r#""rate":1,"key":["header:X-User","query:User Id","client_ip","path","method","authority","literal:Fixed"],
               "cost_header":"X-Cost","match":{"methods":["get","Post"],"headers":[{"name":"X-A","present":true}]}"#,
        );
        assert_eq!(
            r.key,
            vec![
                KeySource::Header("x-user".into()),
                KeySource::Query("User Id".into()),
                KeySource::CLIENT_IP,
                KeySource::Path,
                KeySource::Method,
                KeySource::Authority,
                KeySource::Literal("Fixed".into()),
            ]
        );
        assert_eq!(r.cost_header.as_deref(), Some("x-cost"));
        assert_eq!(r.matcher.methods, vec!["GET", "POST"]);
        assert_eq!(
            r.matcher.headers,
            vec![HeaderMatch {
                name: "x-a".into(),
                value: HeaderValueMatch::Present
            }]
        );
    }

    #[test]
    fn enums_and_summary() {
        let c = parse(
            r#"{"failure_mode":"closed","response_headers":"both","rules":[
                {"name":"a","rate":100,"burst":200,"mode":"lease"},
                {"name":"b","rate":5,"period_ms":60000,"shadow":true}]}"#,
        )
        .unwrap();
        assert_eq!(c.failure_mode, FailureMode::Closed);
        assert_eq!(c.response_headers, HeaderStyle::Both);
        assert_eq!(
            c.summary(),
            "2 rules: a 100/1000ms burst 200 lease, b 5/60000ms burst 5 exact shadow"
        );
        for (s, want) in [
            ("ietf", HeaderStyle::Ietf),
            ("legacy", HeaderStyle::Legacy),
            ("none", HeaderStyle::None),
        ] {
            let c = parse(&format!(
                r#"{{"response_headers":"{s}","rules":[{{"name":"a","rate":1}}]}}"#
            ))
            .unwrap();
            assert_eq!(c.response_headers, want);
        }
    }

    #[test]
    fn limits_at_their_bounds() {
        // burst × period_ms exactly 2^50 (2^26 × 2^24) is accepted...
        let r = one_rule(r#""rate":1,"burst":67108864,"period_ms":16777216"#);
        assert_eq!(r.limits.burst * r.limits.period_ms, MAX_BURST_PERIOD);
        // ...one token more is not.
        assert_eq!(
            rule_error(r#""rate":1,"burst":67108865,"period_ms":16777216"#),
            "rules[0].burst: burst × period_ms must be at most 2^50 = 1125899906842624 \
             (got 67108865 × 16777216 = 1125899923619840)"
        );
        let r = one_rule(r#""rate":1000000000,"period_ms":1000"#);
        assert_eq!(r.limits.burst, 1_000_000_000);
        let r = one_rule(r#""rate":1,"period_ms":86400000"#);
        assert_eq!(r.limits.period_ms, 86_400_000);
        let r = one_rule(r#""rate":10,"cost":10"#);
        assert_eq!(r.cost, 10);
    }

    // ---- whole-document errors ----

    #[test]
    fn non_utf8() {
        let e = Config::try_from(&b"{\"rules\":\xff}"[..]).unwrap_err();
        assert_eq!(e.to_string(), "configuration: not valid UTF-8 (at byte 9)");
    }

    #[test]
    fn empty() {
        assert_eq!(error(""), "configuration: empty");
        assert_eq!(error(" \n\t "), "configuration: empty");
    }

    #[test]
    fn invalid_json() {
        assert_eq!(
            error(r#"{"rules": [}"#),
            "configuration: invalid JSON: expected value at line 1 column 12"
        );
    }

    #[test]
    fn not_an_object() {
        assert_eq!(error("[1]"), "configuration: must be a JSON object");
        assert_eq!(error("null"), "configuration: must be a JSON object");
    }

    #[test]
    fn missing_rules() {
        assert_eq!(error("{}"), "rules: required");
    }

    #[test]
    fn empty_rules() {
        assert_eq!(error(r#"{"rules":[]}"#), "rules: must not be empty");
    }

    #[test]
    fn rules_not_an_array() {
        assert_eq!(error(r#"{"rules":{}}"#), "rules: must be an array");
    }

    #[test]
    fn too_many_rules() {
        let rules: Vec<String> = (0..65)
            .map(|i| format!(r#"{{"name":"r{i}","rate":1}}"#))
            .collect();
        assert_eq!(
            error(&format!(r#"{{"rules":[{}]}}"#, rules.join(","))),
            "rules: must have at most 64 rules (got 65)"
        );
    }

    #[test]
    fn rule_not_an_object() {
        assert_eq!(error(r#"{"rules":["x"]}"#), "rules[0]: must be an object");
    }

    // ---- unknown fields ----

    #[test]
    fn unknown_field_top_level() {
        assert_eq!(
            error(r#"{"rules":[{"name":"a","rate":1}],"rulez":1}"#),
            "rulez: unknown field"
        );
    }

    #[test]
    fn unknown_field_backend() {
        assert_eq!(
            error(r#"{"backend":{"timeout":5},"rules":[{"name":"a","rate":1}]}"#),
            "backend.timeout: unknown field"
        );
    }

    #[test]
    fn unknown_field_rule() {
        assert_eq!(
            error(r#"{"rules":[{"name":"a","rate":1},{"name":"b","rate":1,"limit":3}]}"#),
            "rules[1].limit: unknown field"
        );
    }

    #[test]
    fn unknown_field_match() {
        assert_eq!(
            rule_error(r#""rate":1,"match":{"prefix":"/"}"#),
            "rules[0].match.prefix: unknown field"
        );
    }

    #[test]
    fn unknown_field_header_match() {
        assert_eq!(
            rule_error(
                r#""rate":1,"match":{"headers":[{"name":"a","present":true},{"name":"b","suffix":"x"}]}"#
            ),
            "rules[0].match.headers[1].suffix: unknown field"
        );
    }

    #[test]
    fn unknown_field_fallback() {
        assert_eq!(
            rule_error(r#""rate":1,"fallback":{"rate":1,"cost":1}"#),
            "rules[0].fallback.cost: unknown field"
        );
    }

    #[test]
    fn unknown_field_name_is_escaped() {
        assert_eq!(error("{\"a\\nb\":1,\"rules\":[]}"), "a\\nb: unknown field");
    }

    // ---- wrong types ----

    #[test]
    fn wrong_types() {
        assert_eq!(
            error(r#"{"backend":"x","rules":[{"name":"a","rate":1}]}"#),
            "backend: must be an object"
        );
        assert_eq!(
            error(r#"{"key_prefix":5,"rules":[{"name":"a","rate":1}]}"#),
            "key_prefix: must be a string"
        );
        assert_eq!(
            rule_error(r#""rate":1,"shadow":"yes""#),
            "rules[0].shadow: must be a boolean"
        );
        assert_eq!(
            rule_error(r#""rate":1,"key":"client_ip""#),
            "rules[0].key: must be an array"
        );
        assert_eq!(
            rule_error(r#""rate":1,"key":[1]"#),
            "rules[0].key[0]: must be a string"
        );
        assert_eq!(
            rule_error(r#""rate":1,"match":[]"#),
            "rules[0].match: must be an object"
        );
        assert_eq!(
            rule_error(r#""rate":1,"match":{"methods":[null]}"#),
            "rules[0].match.methods[0]: must be a string"
        );
        assert_eq!(
            error(r#"{"rules":[{"name":7,"rate":1}]}"#),
            "rules[0].name: must be a string"
        );
    }

    // ---- integers ----

    #[test]
    fn zero_rate() {
        assert_eq!(
            rule_error(r#""rate":0"#),
            "rules[0].rate: must be an integer >= 1"
        );
    }

    #[test]
    fn negative_rate() {
        assert_eq!(
            rule_error(r#""rate":-1"#),
            "rules[0].rate: must be an integer >= 1"
        );
    }

    #[test]
    fn float_rate() {
        assert_eq!(
            rule_error(r#""rate":1.5"#),
            "rules[0].rate: must be an integer >= 1"
        );
        assert_eq!(
            rule_error(r#""rate":2.0"#),
            "rules[0].rate: must be an integer >= 1"
        );
    }

    #[test]
    fn string_rate() {
        assert_eq!(
            rule_error(r#""rate":"3""#),
            "rules[0].rate: must be an integer >= 1"
        );
    }

    #[test]
    fn missing_rate() {
        assert_eq!(rule_error(r#""burst":3"#), "rules[0].rate: required");
    }

    #[test]
    fn rate_too_big() {
        assert_eq!(
            rule_error(r#""rate":1000000001"#),
            "rules[0].rate: must be an integer <= 1000000000"
        );
        assert_eq!(
            rule_error(r#""rate":100000000000000000000"#),
            "rules[0].rate: must be an integer <= 1000000000"
        );
    }

    #[test]
    fn burst_zero() {
        assert_eq!(
            rule_error(r#""rate":1,"burst":0"#),
            "rules[0].burst: must be an integer >= 1"
        );
    }

    #[test]
    fn period_ms_zero() {
        assert_eq!(
            rule_error(r#""rate":1,"period_ms":0"#),
            "rules[0].period_ms: must be an integer >= 1"
        );
    }

    #[test]
    fn period_ms_too_big() {
        assert_eq!(
            rule_error(r#""rate":1,"period_ms":86400001"#),
            "rules[0].period_ms: must be an integer <= 86400000"
        );
    }

    #[test]
    fn burst_times_period_too_big() {
        assert_eq!(
            rule_error(r#""rate":1,"burst":1000000000,"period_ms":86400000"#),
            "rules[0].burst: burst × period_ms must be at most 2^50 = 1125899906842624 \
             (got 1000000000 × 86400000 = 86400000000000000)"
        );
        // The default burst (= rate) is checked too.
        assert_eq!(
            rule_error(r#""rate":13100000,"period_ms":86400000"#),
            "rules[0].burst: burst × period_ms must be at most 2^50 = 1125899906842624 \
             (got 13100000 × 86400000 = 1131840000000000)"
        );
    }

    #[test]
    fn fallback_burst_times_period_too_big() {
        assert_eq!(
            rule_error(r#""rate":1,"fallback":{"rate":1,"burst":1000000000,"period_ms":86400000}"#),
            "rules[0].fallback.burst: burst × period_ms must be at most 2^50 = 1125899906842624 \
             (got 1000000000 × 86400000 = 86400000000000000)"
        );
    }

    #[test]
    fn fallback_zero_rate() {
        assert_eq!(
            rule_error(r#""rate":1,"fallback":{"rate":0}"#),
            "rules[0].fallback.rate: must be an integer >= 1"
        );
    }

    #[test]
    fn cost_greater_than_burst() {
        assert_eq!(
            rule_error(r#""rate":10,"burst":20,"cost":21"#),
            "rules[0].cost: must be an integer <= 20 (the rule's burst)"
        );
    }

    #[test]
    fn cost_zero() {
        assert_eq!(
            rule_error(r#""rate":10,"cost":0"#),
            "rules[0].cost: must be an integer >= 1"
        );
    }

    #[test]
    fn backend_timeout_bounds() {
        assert_eq!(
            error(r#"{"backend":{"timeout_ms":0},"rules":[{"name":"a","rate":1}]}"#),
            "backend.timeout_ms: must be an integer >= 1"
        );
        assert_eq!(
            error(r#"{"backend":{"timeout_ms":60001},"rules":[{"name":"a","rate":1}]}"#),
            "backend.timeout_ms: must be an integer <= 60000"
        );
    }

    #[test]
    fn deny_status_bounds() {
        assert_eq!(
            error(r#"{"deny":{"status":200},"rules":[{"name":"a","rate":1}]}"#),
            "deny.status: must be an integer >= 400"
        );
        assert_eq!(
            error(r#"{"deny":{"status":600},"rules":[{"name":"a","rate":1}]}"#),
            "deny.status: must be an integer <= 599"
        );
    }

    #[test]
    fn deny_body_too_long() {
        let body = "x".repeat(4097);
        assert_eq!(
            error(&format!(
                r#"{{"deny":{{"body":"{body}"}},"rules":[{{"name":"a","rate":1}}]}}"#
            )),
            "deny.body: must be at most 4096 bytes (got 4097)"
        );
    }

    // ---- strings ----

    #[test]
    fn backend_strings() {
        assert_eq!(
            error(r#"{"backend":{"cluster":""},"rules":[{"name":"a","rate":1}]}"#),
            "backend.cluster: must not be empty"
        );
        assert_eq!(
            error(r#"{"backend":{"authority":"a\u0000b"},"rules":[{"name":"a","rate":1}]}"#),
            "backend.authority: must not contain control characters"
        );
        let long = "c".repeat(256);
        assert_eq!(
            error(&format!(
                r#"{{"backend":{{"cluster":"{long}"}},"rules":[{{"name":"a","rate":1}}]}}"#
            )),
            "backend.cluster: must be at most 255 bytes"
        );
    }

    #[test]
    fn basic_auth_without_colon() {
        assert_eq!(
            error(r#"{"backend":{"basic_auth":"secret"},"rules":[{"name":"a","rate":1}]}"#),
            "backend.basic_auth: must have the form user:pass"
        );
    }

    // ---- transport fields: each build refuses the other's ----

    #[test]
    fn higress_match_rules_are_refused_plainly() {
        assert_eq!(
            error(r#"{"rules":[{"name":"a","rate":1}],"_rules_":[{"_match_route_":["r"]}]}"#),
            "_rules_: per-route matchRules are not supported: give the plugin config as \
             defaultConfig and select requests with each rule's match"
        );
    }

    #[test]
    fn http_build_refuses_redis_fields() {
        for field in [
            r#""service_name":"redis.default.svc.cluster.local""#,
            r#""service_port":6379"#,
            r#""username":"u""#,
            r#""password":"p""#,
            r#""database":1"#,
        ] {
            let name = field.split('"').nth(1).unwrap();
            assert_eq!(
                error(&format!(
                    r#"{{"backend":{{{field}}},"rules":[{{"name":"a","rate":1}}]}}"#
                )),
                format!(
                    "backend.{name}: only in the Higress build (tollgate-higress.wasm, Redis callouts); \
                     this build reaches Redis through Webdis"
                )
            );
        }
    }

    #[test]
    fn higress_build_refuses_webdis_fields() {
        for field in [r#""authority":"webdis""#, r#""basic_auth":"u:p""#] {
            let name = field.split('"').nth(1).unwrap();
            assert_eq!(
                higress_error(&format!(
                    r#"{{"backend":{{{field}}},"rules":[{{"name":"a","rate":1}}]}}"#
                )),
                format!(
                    "backend.{name}: only in tollgate.wasm (the HTTP build, Webdis); this Higress build calls Redis directly"
                )
            );
        }
    }

    #[test]
    fn higress_build_redis_fields() {
        let backend = |json: &str| {
            parse_higress(&format!(
                r#"{{"backend":{json},"rules":[{{"name":"a","rate":1}}]}}"#
            ))
            .map(|c| c.backend)
        };
        let b = backend(
            r#"{"service_name":"redis.default.svc.cluster.local","username":"tg","password":"s3cret",
                "database":2,"timeout_ms":30}"#,
        )
        .unwrap();
        assert_eq!(b.cluster, "outbound|6379||redis.default.svc.cluster.local");
        assert_eq!(b.username.as_deref(), Some("tg"));
        assert_eq!(b.password.as_deref(), Some("s3cret"));
        assert_eq!((b.database, b.timeout_ms), (2, 30));
        // Higress' static services listen on logical port 80.
        let b = backend(r#"{"service_name":"redis.static"}"#).unwrap();
        assert_eq!(b.cluster, "outbound|80||redis.static");
        let b = backend(r#"{"service_name":"redis.dns","service_port":6380}"#).unwrap();
        assert_eq!(b.cluster, "outbound|6380||redis.dns");
        // A cluster named as it is (plain Envoy with Higress' patches, or the test host).
        let b = backend(r#"{"cluster":"redis_cluster","password":"p"}"#).unwrap();
        assert_eq!(
            (b.cluster.as_str(), b.username.as_deref()),
            ("redis_cluster", None)
        );
        let e = |json: &str| backend(json).unwrap_err().to_string();
        assert_eq!(
            e(r#"{"cluster":"c","service_name":"s"}"#),
            "backend.service_name: give either cluster or service_name, not both"
        );
        assert_eq!(
            e(r#"{"service_port":6379}"#),
            "backend.service_port: needs service_name"
        );
        assert_eq!(e(r#"{"username":"u"}"#), "backend.username: needs password");
        assert_eq!(
            e(r#"{"password":""}"#),
            "backend.password: must not be empty"
        );
        assert_eq!(
            e(r#"{"password":"a\u000ab"}"#),
            "backend.password: must not contain control characters"
        );
        assert!(
            !e(r#"{"password":"a\u000ab"}"#).contains("a\nb"),
            "secrets are never echoed"
        );
        assert_eq!(
            e(r#"{"service_name":"r","service_port":0}"#),
            "backend.service_port: must be an integer >= 1"
        );
        assert_eq!(
            e(r#"{"database":-1}"#),
            "backend.database: must be an integer >= 0"
        );
    }

    #[test]
    fn bad_key_prefix() {
        assert_eq!(
            error(r#"{"key_prefix":"tg{x}","rules":[{"name":"a","rate":1}]}"#),
            r#"key_prefix: must be 1 to 64 characters of [A-Za-z0-9_.:-] (got "tg{x}")"#
        );
        assert_eq!(
            error(r#"{"key_prefix":"","rules":[{"name":"a","rate":1}]}"#),
            r#"key_prefix: must be 1 to 64 characters of [A-Za-z0-9_.:-] (got "")"#
        );
    }

    #[test]
    fn bad_failure_mode() {
        assert_eq!(
            error(r#"{"failure_mode":"x","rules":[{"name":"a","rate":1}]}"#),
            r#"failure_mode: must be one of "open", "closed", "local" (got "x")"#
        );
    }

    #[test]
    fn bad_response_headers() {
        assert_eq!(
            error(r#"{"response_headers":"IETF","rules":[{"name":"a","rate":1}]}"#),
            r#"response_headers: must be one of "ietf", "legacy", "both", "none" (got "IETF")"#
        );
    }

    #[test]
    fn bad_mode() {
        assert_eq!(
            rule_error(r#""rate":1,"mode":"batch""#),
            r#"rules[0].mode: must be one of "exact", "lease" (got "batch")"#
        );
    }

    #[test]
    fn missing_rule_name() {
        assert_eq!(
            error(r#"{"rules":[{"rate":1}]}"#),
            "rules[0].name: required"
        );
    }

    #[test]
    fn bad_rule_name() {
        assert_eq!(
            error(r#"{"rules":[{"name":"a.b","rate":1}]}"#),
            r#"rules[0].name: must be 1 to 64 characters of [A-Za-z0-9_-] (got "a.b")"#
        );
        assert_eq!(
            error(r#"{"rules":[{"name":"","rate":1}]}"#),
            r#"rules[0].name: must be 1 to 64 characters of [A-Za-z0-9_-] (got "")"#
        );
    }

    #[test]
    fn duplicate_rule_names() {
        assert_eq!(
            error(
                r#"{"rules":[{"name":"x","rate":1},{"name":"y","rate":1},{"name":"x","rate":2}]}"#
            ),
            r#"rules[2].name: duplicate rule name "x""#
        );
    }

    #[test]
    fn unknown_key_source() {
        assert_eq!(
            rule_error(r#""rate":1,"key":["client_ip","foo"]"#),
            "rules[0].key[1]: unknown key source \"foo\" (expected header:NAME, query:NAME, \
             cookie:NAME, client_ip, client_ip:v4=/N,v6=/M, path, method, authority, literal:TEXT, \
             property:PATH or metadata:NAMESPACE:FIELD)"
        );
    }

    #[test]
    fn empty_key_source_names() {
        assert_eq!(
            rule_error(r#""rate":1,"key":["header:"]"#),
            r#"rules[0].key[0]: header:NAME needs a non-empty header name of token characters (got "header:")"#
        );
        assert_eq!(
            rule_error(r#""rate":1,"key":["header:x y"]"#),
            r#"rules[0].key[0]: header:NAME needs a non-empty header name of token characters (got "header:x y")"#
        );
        assert_eq!(
            rule_error(r#""rate":1,"key":["query:"]"#),
            r#"rules[0].key[0]: query:NAME needs a non-empty name (got "query:")"#
        );
        assert_eq!(
            rule_error(r#""rate":1,"key":["literal:"]"#),
            r#"rules[0].key[0]: literal:TEXT needs a non-empty text (got "literal:")"#
        );
    }

    #[test]
    fn too_many_key_sources() {
        assert_eq!(
            rule_error(
                r#""rate":1,"key":["path","path","path","path","path","path","path","path","path"]"#
            ),
            "rules[0].key: must have at most 8 key sources (got 9)"
        );
    }

    #[test]
    fn header_match_with_both_exact_and_present() {
        assert_eq!(
            rule_error(r#""rate":1,"match":{"headers":[{"name":"a","exact":"b","present":true}]}"#),
            r#"rules[0].match.headers[0]: must have exactly one of "exact", "prefix", "regex", "present" or "absent", not exact and present"#
        );
    }

    #[test]
    fn header_match_with_neither() {
        assert_eq!(
            rule_error(r#""rate":1,"match":{"headers":[{"name":"a"}]}"#),
            r#"rules[0].match.headers[0]: must have exactly one of "exact", "prefix", "regex", "present" or "absent""#
        );
    }

    #[test]
    fn header_match_kinds() {
        let m = |h: &str| {
            one_rule(&format!(r#""rate":1,"match":{{"headers":[{h}]}}"#))
                .matcher
                .headers
                .remove(0)
                .value
        };
        assert_eq!(
            m(r#"{"name":"a","prefix":"Bearer "}"#),
            HeaderValueMatch::Prefix("Bearer ".into())
        );
        assert_eq!(m(r#"{"name":"a","absent":true}"#), HeaderValueMatch::Absent);
        assert_eq!(
            m(r#"{"name":"a","exact":""}"#),
            HeaderValueMatch::Exact(String::new())
        );
        match m(r#"{"name":"a","regex":"v[0-9]+"}"#) {
            HeaderValueMatch::Regex(p) => {
                assert_eq!(p.source, "v[0-9]+");
                // Anchored: the whole value must match.
                assert!(p.is_match(b"v12"));
                assert!(!p.is_match(b"xv12"));
                assert!(!p.is_match(b"v12x"));
                // Bytes that are not UTF-8 read as U+FFFD: one character, not a digit.
                assert!(!p.is_match(&[b'v', 0xff]));
                assert!(Pattern::new("v.").unwrap().is_match(&[b'v', 0xff]));
            }
            other => panic!("{other:?}"),
        }
        // An alternation is anchored as a whole.
        match m(r#"{"name":"a","regex":"a|b"}"#) {
            HeaderValueMatch::Regex(p) => {
                assert!(p.is_match(b"a") && p.is_match(b"b"));
                assert!(!p.is_match(b"ab") && !p.is_match(b"xb"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            rule_error(r#""rate":1,"match":{"headers":[{"name":"a","absent":false}]}"#),
            "rules[0].match.headers[0].absent: must be true"
        );
        assert_eq!(
            rule_error(r#""rate":1,"match":{"headers":[{"name":"a","prefix":"x","absent":true}]}"#),
            r#"rules[0].match.headers[0]: must have exactly one of "exact", "prefix", "regex", "present" or "absent", not prefix and absent"#
        );
        assert_eq!(
            rule_error(r#""rate":1,"match":{"headers":[{"name":"a","prefix":1}]}"#),
            "rules[0].match.headers[0].prefix: must be a string"
        );
        let e = rule_error(r#""rate":1,"match":{"headers":[{"name":"a","regex":"(x"}]}"#);
        assert!(
            e.starts_with("rules[0].match.headers[0].regex: is not a valid regular expression: "),
            "{e}"
        );
        // Backreferences and look-around (what makes backtracking engines blow up) do not exist.
        for pat in [r"(a)\\1", "(?=a)a", "(?<=a)b"] {
            let e = rule_error(&format!(
                r#""rate":1,"match":{{"headers":[{{"name":"a","regex":"{pat}"}}]}}"#
            ));
            assert!(
                e.contains("is not a valid regular expression"),
                "{pat}: {e}"
            );
        }
        let long = "a".repeat(1025);
        assert_eq!(
            rule_error(&format!(
                r#""rate":1,"match":{{"headers":[{{"name":"a","regex":"{long}"}}]}}"#
            )),
            "rules[0].match.headers[0].regex: must be at most 1024 bytes"
        );
        // Too many repetitions compile to more than the size limit.
        let e = rule_error(
            r#""rate":1,"match":{"headers":[{"name":"a","regex":"((a{100}){100}){100}"}]}"#,
        );
        assert!(e.contains("is not a valid regular expression"), "{e}");
    }

    #[test]
    fn regex_matching_is_linear_on_a_classic_blow_up() {
        // (a+)+$ against "aaa…b" takes exponential time in a backtracking engine.
        let p = Pattern::new("(a+)+").unwrap();
        let value = format!("{}b", "a".repeat(50_000));
        let start = std::time::Instant::now();
        assert!(!p.is_match(value.as_bytes()));
        assert!(p.is_match("a".repeat(50_000).as_bytes()));
        // Not a timing assertion on a busy machine: this only fails if matching is exponential.
        assert!(start.elapsed() < std::time::Duration::from_secs(30));
    }

    #[test]
    fn hosts() {
        let hosts = |h: &str| {
            one_rule(&format!(r#""rate":1,"match":{{"hosts":{h}}}"#))
                .matcher
                .hosts
        };
        assert_eq!(
            hosts(
                r#"["API.Example.com", "*.Tenant.example.com.", "10.0.0.1", "[::1]", "a_b.local",
                    "[0:0::0001]", "[2001:DB8:0:0::AB]", "[::ffff:10.0.0.2]"]"#
            ),
            [
                "api.example.com",
                "*.tenant.example.com",
                "10.0.0.1",
                "[::1]",
                "a_b.local",
                "[::1]",
                "[2001:db8::ab]",
                "10.0.0.2"
            ]
        );
        for (bad, why) in [
            ("api.example.com:443", "must not have a port (hosts are compared without it)"),
            ("10.0.0.1:80", "must not have a port (hosts are compared without it)"),
            ("[::1]:80", "must be a host name, an IPv4 address or [IPv6], without port"),
            ("[nope]", "must be a host name, an IPv4 address or [IPv6], without port"),
            ("[fe80::1%25eth0]", "must not have a zone id (it names the client's interface; requests are compared without it)"),
            ("", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
            ("a..b", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
            ("*", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
            ("a.*.com", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
            ("*example.com", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
            ("ex ample.com", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
        ] {
            assert_eq!(
                rule_error(&format!(r#""rate":1,"match":{{"hosts":["ok.com","{bad}"]}}"#)),
                format!("rules[0].match.hosts[1]: {why} (got {bad:?})")
            );
        }
        assert_eq!(
            rule_error(r#""rate":1,"match":{"hosts":"a.com"}"#),
            "rules[0].match.hosts: must be an array"
        );
    }

    #[test]
    fn identity_key_sources() {
        let key = |k: &str| {
            one_rule(&format!(r#""rate":1,"key":["{k}"]"#))
                .key
                .remove(0)
        };
        assert_eq!(
            key("cookie:session_id"),
            KeySource::Cookie("session_id".into())
        );
        assert_eq!(
            key("property:connection.requested_server_name"),
            KeySource::Property {
                spelled: "connection.requested_server_name".into(),
                path: vec!["connection".into(), "requested_server_name".into()],
            }
        );
        // Envoy has no source.principal: it is the peer certificate's URI SAN.
        let principal = key("property:source.principal");
        assert_eq!(
            principal,
            KeySource::Property {
                spelled: "source.principal".into(),
                path: vec!["connection".into(), "uri_san_peer_certificate".into()],
            }
        );
        assert_eq!(principal.to_string(), "property:source.principal");
        let jwt = key("metadata:envoy.filters.http.jwt_authn:jwt_payload.sub");
        assert_eq!(
            jwt,
            KeySource::Metadata {
                namespace: "envoy.filters.http.jwt_authn".into(),
                fields: vec!["jwt_payload".into(), "sub".into()],
            }
        );
        assert_eq!(
            jwt.to_string(),
            "metadata:envoy.filters.http.jwt_authn:jwt_payload.sub"
        );
        assert_eq!(
            key("metadata:lua:tenant"),
            KeySource::Metadata {
                namespace: "lua".into(),
                fields: vec!["tenant".into()],
            }
        );
        for (bad, want) in [
            (
                "cookie:",
                r#"cookie:NAME needs a non-empty cookie name of token characters (got "cookie:")"#,
            ),
            (
                "cookie:a b",
                r#"cookie:NAME needs a non-empty cookie name of token characters (got "cookie:a b")"#,
            ),
            (
                "property:",
                r#"property:PATH needs 1 to 16 non-empty dot-separated segments (got "property:")"#,
            ),
            (
                "property:source..address",
                r#"property:PATH needs 1 to 16 non-empty dot-separated segments (got "property:source..address")"#,
            ),
            (
                "property:response.code",
                r#"response attributes are not known yet when a request is checked (got "property:response.code")"#,
            ),
            (
                "property:sauce.address",
                r#"unknown attribute "sauce" (Envoy's attributes start with request, connection, source, destination, upstream, metadata, filter_state, upstream_filter_state, xds, node, plugin_name, plugin_root_id, plugin_vm_id) (got "property:sauce.address")"#,
            ),
            (
                "metadata:ns",
                r#"metadata:NAMESPACE:FIELD[.FIELD…] needs a namespace and 1 to 16 non-empty fields (got "metadata:ns")"#,
            ),
            (
                "metadata::a",
                r#"metadata:NAMESPACE:FIELD[.FIELD…] needs a namespace and 1 to 16 non-empty fields (got "metadata::a")"#,
            ),
            (
                "metadata:ns:",
                r#"metadata:NAMESPACE:FIELD[.FIELD…] needs a namespace and 1 to 16 non-empty fields (got "metadata:ns:")"#,
            ),
            (
                "metadata:ns:a.",
                r#"metadata:NAMESPACE:FIELD[.FIELD…] needs a namespace and 1 to 16 non-empty fields (got "metadata:ns:a.")"#,
            ),
        ] {
            assert_eq!(
                rule_error(&format!(r#""rate":1,"key":["{bad}"]"#)),
                format!("rules[0].key[0]: {want}"),
            );
        }
        let deep = vec!["a"; 17].join(".");
        assert!(
            rule_error(&format!(r#""rate":1,"key":["metadata:ns:{deep}"]"#))
                .contains("1 to 16 non-empty fields")
        );
    }

    #[test]
    fn overrides() {
        let r = one_rule(
            r#""rate":10,"period_ms":60000,"key":["header:x-tenant","client_ip:v6=/56","authority"],
               "overrides":[
                 {"key":["acme","2001:db8:0:100::/56","API.example.com"],"rate":1000,"burst":2000},
                 {"key":["internal","10.0.0.1","a"],"unlimited":true},
                 {"key":["slow","::ffff:10.0.0.2","a"],"rate":1,"period_ms":1000}]"#,
        );
        let o = |t: &[&str]| {
            let k: Vec<Vec<u8>> = t.iter().map(|v| v.as_bytes().to_vec()).collect();
            r.overrides.get(&k).copied()
        };
        assert_eq!(r.overrides.len(), 3);
        // period_ms defaults to the rule's; burst to the override's rate.
        assert_eq!(
            o(&["acme", "2001:db8:0:100::/56", "api.example.com"]),
            Some(Override::Limits(Limits {
                rate: 1000,
                burst: 2000,
                period_ms: 60000
            }))
        );
        assert_eq!(o(&["internal", "10.0.0.1", "a"]), Some(Override::Unlimited));
        assert_eq!(
            o(&["slow", "10.0.0.2", "a"]),
            Some(Override::Limits(Limits {
                rate: 1,
                burst: 1,
                period_ms: 1000
            }))
        );
        let c = parse(r#"{"rules":[{"name":"t","rate":5,"key":["header:x"],"overrides":[{"key":["a"],"unlimited":true}]}]}"#).unwrap();
        assert_eq!(c.summary(), "1 rule: t 5/1000ms burst 5 exact (1 override)");

        // A path override is normalised as requests are.
        let r = one_rule(r#""rate":1,"key":["path"],"overrides":[{"key":["//api/./x"],"rate":9}]"#);
        assert!(r.overrides.contains_key(&vec![b"/api/x".to_vec()]));
        // A cookie value as requests give it: unquoted and percent-decoded.
        let r = one_rule(
            r#""rate":1,"key":["cookie:sid"],"overrides":[{"key":["\"s%3Aab\""],"rate":9}]"#,
        );
        assert!(r.overrides.contains_key(&vec![b"s:ab".to_vec()]));

        for (body, want) in [
            (r#""overrides":[{"key":["a"],"rate":1}]"#, "rules[0].overrides: needs key sources: a rule without a key has one bucket, give it these limits instead"),
            (r#""key":["header:x"],"overrides":{}"#, "rules[0].overrides: must be an array"),
            (r#""key":["header:x"],"overrides":[{"rate":1}]"#, "rules[0].overrides[0].key: required"),
            (r#""key":["header:x"],"overrides":[{"key":"a","rate":1}]"#, "rules[0].overrides[0].key: must be an array"),
            (r#""key":["header:x"],"overrides":[{"key":["a","b"],"rate":1}]"#, "rules[0].overrides[0].key: must have one value per key source (1, got 2)"),
            (r#""key":["header:x"],"overrides":[{"key":[1],"rate":1}]"#, "rules[0].overrides[0].key[0]: must be a string"),
            (r#""key":["header:x"],"overrides":[{"key":["a"]}]"#, "rules[0].overrides[0].rate: required"),
            (r#""key":["header:x"],"overrides":[{"key":["a"],"rate":0}]"#, "rules[0].overrides[0].rate: must be an integer >= 1"),
            (r#""key":["header:x"],"overrides":[{"key":["a"],"unlimited":true,"burst":3}]"#, r#"rules[0].overrides[0]: must have either "unlimited": true or limits (rate, period_ms, burst), not both"#),
            (r#""key":["header:x"],"overrides":[{"key":["a"],"unlimited":false}]"#, "rules[0].overrides[0].unlimited: must be true"),
            (r#""key":["cookie:sid"],"overrides":[{"key":["\"a\\b\""],"rate":1}]"#, r#"rules[0].overrides[0].key[0]: a quoted cookie value with a backslash is read differently by different servers, so it is never a key (got "\"a\\b\"")"#),
            (r#""key":["header:x"],"overrides":[{"key":["a"],"rate":1,"cost":2}]"#, "rules[0].overrides[0].cost: unknown field"),
            (r#""key":["header:x"],"overrides":[{"key":["a"],"rate":1},{"key":["b"],"rate":1},{"key":["a"],"unlimited":true}]"#, "rules[0].overrides[2].key: names the same key as an earlier override"),
            (r#""key":["authority"],"overrides":[{"key":["A.com"],"rate":1},{"key":["a.com"],"rate":2}]"#, "rules[0].overrides[1].key: names the same key as an earlier override"),
            (r#""key":["client_ip"],"overrides":[{"key":["2001:db8::1"],"rate":1}]"#, r#"rules[0].overrides[0].key[0]: must be an address or network as client_ip gives it: IPv4 /32, IPv6 /64, host bits zero (got "2001:db8::1")"#),
            (r#""key":["client_ip:v4=/24"],"overrides":[{"key":["10.0.0.7/24"],"rate":1}]"#, r#"rules[0].overrides[0].key[0]: must be an address or network as client_ip:v4=/24 gives it: IPv4 /24, IPv6 /64, host bits zero (got "10.0.0.7/24")"#),
            (r#""key":["header:x"],"cost":3,"burst":5,"overrides":[{"key":["a"],"rate":2}]"#, "rules[0].overrides[0].burst: must be at least the rule's cost (3)"),
            (r#""key":["header:x"],"overrides":[{"key":["a"],"rate":1,"burst":1000000000,"period_ms":86400000}]"#, "rules[0].overrides[0].burst: burst × period_ms must be at most 2^50 = 1125899906842624 (got 1000000000 × 86400000 = 86400000000000000)"),
        ] {
            assert_eq!(rule_error(&format!(r#""rate":5,{body}"#)), want, "{body}");
        }
    }

    #[test]
    fn header_match_present_false() {
        assert_eq!(
            rule_error(r#""rate":1,"match":{"headers":[{"name":"a","present":false}]}"#),
            "rules[0].match.headers[0].present: must be true"
        );
    }

    #[test]
    fn header_match_bad_name() {
        assert_eq!(
            rule_error(r#""rate":1,"match":{"headers":[{"name":"","present":true}]}"#),
            "rules[0].match.headers[0].name: must not be empty"
        );
        assert_eq!(
            rule_error(r#""rate":1,"match":{"headers":[{"name":"a:b","present":true}]}"#),
            r#"rules[0].match.headers[0].name: must be a header name of token characters (got "a:b")"#
        );
        assert_eq!(
            rule_error(r#""rate":1,"match":{"headers":[{"exact":"x"}]}"#),
            "rules[0].match.headers[0].name: required"
        );
    }

    #[test]
    fn client_ip_prefixes() {
        let key = |k: &str| one_rule(&format!(r#""rate":1,"key":["{k}"]"#)).key;
        let ip = |v4_prefix, v6_prefix| {
            vec![KeySource::ClientIp {
                v4_prefix,
                v6_prefix,
            }]
        };
        assert_eq!(key("client_ip"), ip(32, 64));
        assert_eq!(key("client_ip:v6=/56"), ip(32, 56));
        assert_eq!(key("client_ip:v4=/24"), ip(24, 64));
        assert_eq!(key("client_ip:v4=/24,v6=/48"), ip(24, 48));
        assert_eq!(key("client_ip:v6=/48,v4=/8"), ip(8, 48));
        assert_eq!(key("client_ip:v6=/128"), ip(32, 128));
        assert_eq!(
            key("client_ip:v6=/64").first().unwrap().to_string(),
            "client_ip"
        );
        assert_eq!(
            key("client_ip:v6=/56").first().unwrap().to_string(),
            "client_ip:v6=/56"
        );
        for bad in [
            "client_ip:",
            "client_ip:v6=56",
            "client_ip:v6=/7",
            "client_ip:v6=/129",
            "client_ip:v4=/33",
            "client_ip:v4=/+24",
            "client_ip:v5=/24",
            "client_ip:v6=/56,v6=/48",
            "client_ip:v6=/56,",
        ] {
            assert_eq!(
                rule_error(&format!(r#""rate":1,"key":["{bad}"]"#)),
                format!(
                    "rules[0].key[0]: client_ip takes v4=/N (8-32) and/or v6=/M (8-128), \
                     comma-separated (got {bad:?})"
                )
            );
        }
    }

    #[test]
    fn path_prefix_must_be_normal() {
        for (bad, reads) in [
            ("//api/", "/api/"),
            ("/./api/", "/api/"),
            ("/%61pi/", "/api/"),
            ("/x/../api/", "/api/"),
            ("/api%2f", "/api%2F"),
        ] {
            assert_eq!(
                rule_error(&format!(r#""rate":1,"match":{{"path_prefix":"{bad}"}}"#)),
                format!(
                    "rules[0].match.path_prefix: must be in normal form, as requests are compared \
                     in it (got {bad:?}, which reads as {reads:?})"
                )
            );
        }
        // Irregular prefixes can never be normal.
        assert_eq!(
            rule_error(r#""rate":1,"match":{"path_prefix":"/../a"}"#),
            "rules[0].match.path_prefix: must be in normal form, as requests are compared in it \
             (got \"/../a\", which reads as \"/a\")"
        );
        assert!(rule_error(r#""rate":1,"match":{"path_prefix":"/a%zz"}"#).contains("normal form"));
        for good in ["/", "/api", "/api/", "/a;b/", "/a%2Fb", "/~u/", "/a%20b"] {
            let r = one_rule(&format!(r#""rate":1,"match":{{"path_prefix":"{good}"}}"#));
            assert_eq!(r.matcher.path_prefix.as_deref(), Some(good));
            assert!(!r.matcher.path_ignore_case);
        }
        let r = one_rule(r#""rate":1,"match":{"path_prefix":"/api/","path_ignore_case":true}"#);
        assert!(r.matcher.path_ignore_case);
        assert_eq!(
            rule_error(r#""rate":1,"match":{"path_ignore_case":1}"#),
            "rules[0].match.path_ignore_case: must be a boolean"
        );
    }

    #[test]
    fn path_prefix_without_slash() {
        assert_eq!(
            rule_error(r#""rate":1,"match":{"path_prefix":"api/"}"#),
            r#"rules[0].match.path_prefix: must start with '/' (got "api/")"#
        );
    }

    #[test]
    fn path_prefix_with_query() {
        assert_eq!(
            rule_error(r#""rate":1,"match":{"path_prefix":"/a?b"}"#),
            "rules[0].match.path_prefix: must not contain '?' or '#': it is matched against the \
             path without the query (got \"/a?b\")"
        );
    }

    #[test]
    fn bad_methods() {
        assert_eq!(
            rule_error(r#""rate":1,"match":{"methods":["GET",""]}"#),
            "rules[0].match.methods[1]: must not be empty"
        );
        assert_eq!(
            rule_error(r#""rate":1,"match":{"methods":["G T"]}"#),
            r#"rules[0].match.methods[0]: must be an HTTP method of token characters (got "G T")"#
        );
    }

    #[test]
    fn bad_cost_header() {
        assert_eq!(
            rule_error(r#""rate":1,"cost_header":"x cost""#),
            r#"rules[0].cost_header: must be a header name of token characters (got "x cost")"#
        );
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let long = "z".repeat(100);
        let msg = error(&format!(
            r#"{{"failure_mode":"{long}","rules":[{{"name":"a","rate":1}}]}}"#
        ));
        assert_eq!(
            msg,
            format!(
                r#"failure_mode: must be one of "open", "closed", "local" (got "{}"…)"#,
                "z".repeat(64)
            )
        );
    }
}
