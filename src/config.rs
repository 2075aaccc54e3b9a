//! Plugin configuration: JSON bytes -> validated, typed `Config`.
//!
//! Invariant: a `Config` that exists is valid — every rule has positive limits that fit the Lua
//! script's exact integer range, names are unique and safe to put in a Redis key, a header name or a
//! metric name. Any other input is a `ConfigError` naming the field and the reason, in one line.

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
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Match {
    pub path_prefix: Option<String>,
    /// Upper-cased; empty means any method.
    pub methods: Vec<String>,
    pub headers: Vec<HeaderMatch>,
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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// Lower-cased header name.
    Header(String),
    Query(String),
    ClientIp,
    Path,
    Method,
    Authority,
    Literal(String),
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

const KEY_SOURCE_HELP: &str =
    "expected header:NAME, query:NAME, client_ip, path, method, authority or literal:TEXT";

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
/// Whether this build calls Redis through Higress' Redis callouts (else Webdis over HTTP).
pub const REDIS_CALLOUT: bool = cfg!(feature = "redis-callout");
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
];
const MATCH_FIELDS: &[&str] = &["path_prefix", "methods", "headers"];
const HEADER_MATCH_FIELDS: &[&str] = &["name", "exact", "present"];
const LIMITS_FIELDS: &[&str] = &["rate", "period_ms", "burst"];

impl TryFrom<&[u8]> for Config {
    type Error = ConfigError;

    fn try_from(bytes: &[u8]) -> Result<Self, Self::Error> {
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
        parse_config(&value)
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

fn parse_config(value: &serde_json::Value) -> Result<Config, ConfigError> {
    if value.get("_rules_").is_some() {
        // Higress turns a WasmPlugin's matchRules into this field (pkg/ingress/config).
        return Err(err(
            "_rules_",
            "per-route matchRules are not supported: give the plugin config as defaultConfig and \
             select requests with each rule's match",
        ));
    }
    let top = Obj::new(value, "", TOP_FIELDS)?;

    let backend = parse_backend(top.opt_obj("backend", BACKEND_FIELDS)?)?;

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

fn parse_backend(obj: Option<Obj<'_>>) -> Result<Backend, ConfigError> {
    let mut backend = Backend {
        cluster: DEFAULT_CLUSTER.to_owned(),
        authority: DEFAULT_AUTHORITY.to_owned(),
        timeout_ms: DEFAULT_TIMEOUT_MS,
        basic_auth: None,
        username: None,
        password: None,
        database: 0,
        breaker_failures: DEFAULT_BREAKER_FAILURES,
        breaker_cooloff_ms: DEFAULT_BREAKER_COOLOFF_MS,
        max_inflight: DEFAULT_MAX_INFLIGHT,
    };
    let Some(obj) = obj else {
        return Ok(backend);
    };
    let (other, reason) = if REDIS_CALLOUT {
        (
            WEBDIS_ONLY_FIELDS,
            "only in the HTTP build (Webdis); this Higress build calls Redis directly",
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
        .map(|f| parse_limits(&f))
        .transpose()?;

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
    })
}

/// `rate` (required), `period_ms` and `burst` of `obj`, as a rule or its `fallback`.
fn parse_limits(obj: &Obj<'_>) -> Result<Limits, ConfigError> {
    let rate = as_int(obj.required("rate")?, &obj.path("rate"), 1, MAX_TOKENS)?;
    let period_ms = obj
        .opt_int("period_ms", 1, MAX_PERIOD_MS)?
        .unwrap_or(DEFAULT_PERIOD_MS);
    let burst = obj.opt_int("burst", 1, MAX_TOKENS)?.unwrap_or(rate);
    let product = burst.checked_mul(period_ms);
    if product.map_or(true, |p| p > MAX_BURST_PERIOD) {
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
            Some(p.to_owned())
        }
    };

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

    Ok(Match {
        path_prefix,
        methods,
        headers,
    })
}

fn parse_header_match(value: &serde_json::Value, path: &str) -> Result<HeaderMatch, ConfigError> {
    let obj = Obj::new(value, path, HEADER_MATCH_FIELDS)?;
    let name_path = obj.path("name");
    let name = header_name(&name_path, as_str(obj.required("name")?, &name_path)?)?;
    let exact = obj.opt_str("exact")?;
    let present = obj.opt_bool("present")?;
    let value = match (exact, present) {
        (Some(_), Some(_)) => {
            return Err(err(
                path,
                "must have exactly one of \"exact\" or \"present\", not both",
            ))
        }
        (None, None) => {
            return Err(err(
                path,
                "must have exactly one of \"exact\" or \"present\"",
            ))
        }
        (Some(s), None) => HeaderValueMatch::Exact(s.to_owned()),
        (None, Some(true)) => HeaderValueMatch::Present,
        (None, Some(false)) => return Err(err(obj.path("present"), "must be true")),
    };
    Ok(HeaderMatch { name, value })
}

fn parse_key_source(s: &str, path: &str) -> Result<KeySource, ConfigError> {
    match s {
        "client_ip" => return Ok(KeySource::ClientIp),
        "path" => return Ok(KeySource::Path),
        "method" => return Ok(KeySource::Method),
        "authority" => return Ok(KeySource::Authority),
        _ => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The plugin configuration example of the design reference (shared/DESIGN.md, outside this
    /// repository), kept here verbatim.
    #[cfg(not(feature = "redis-callout"))]
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
    #[cfg(not(feature = "redis-callout"))]
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
                KeySource::ClientIp,
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
                r#""rate":1,"match":{"headers":[{"name":"a","present":true},{"name":"b","regex":"x"}]}"#
            ),
            "rules[0].match.headers[1].regex: unknown field"
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
    #[cfg(not(feature = "redis-callout"))]
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
    #[cfg(not(feature = "redis-callout"))]
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
    #[cfg(not(feature = "redis-callout"))]
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
    #[cfg(feature = "redis-callout")]
    fn higress_build_refuses_webdis_fields() {
        for field in [r#""authority":"webdis""#, r#""basic_auth":"u:p""#] {
            let name = field.split('"').nth(1).unwrap();
            assert_eq!(
                error(&format!(
                    r#"{{"backend":{{{field}}},"rules":[{{"name":"a","rate":1}}]}}"#
                )),
                format!(
                    "backend.{name}: only in the HTTP build (Webdis); this Higress build calls Redis directly"
                )
            );
        }
    }

    #[test]
    #[cfg(feature = "redis-callout")]
    fn higress_build_redis_fields() {
        let backend = |json: &str| {
            parse(&format!(
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
             client_ip, path, method, authority or literal:TEXT)"
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
            r#"rules[0].match.headers[0]: must have exactly one of "exact" or "present", not both"#
        );
    }

    #[test]
    fn header_match_with_neither() {
        assert_eq!(
            rule_error(r#""rate":1,"match":{"headers":[{"name":"a"}]}"#),
            r#"rules[0].match.headers[0]: must have exactly one of "exact" or "present""#
        );
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
