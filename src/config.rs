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
    /// Envoy cluster name of the Webdis front.
    pub cluster: String,
    /// `:authority` of the callout.
    pub authority: String,
    pub timeout_ms: u64,
    /// `user:pass` for Webdis' HTTP basic-auth ACL.
    pub basic_auth: Option<String>,
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
