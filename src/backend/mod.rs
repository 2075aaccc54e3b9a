//! The shared bucket's backend: the script call, its reply, and how a call travels (a transport).
//!
//! Invariant: every backend outcome is either a well-formed five-integer `ScriptReply` or a
//! `BackendError`; nothing in between reaches the decision logic.

pub mod resp;
pub mod script;
pub mod webdis;

/// One call of `lua/token_bucket.lua` on one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCall {
    /// The bucket key (`<prefix>:{<rule>:<digest>}`), already free of user text.
    pub key: String,
    pub burst: u64,
    pub rate: u64,
    pub period_ms: u64,
    pub cost: u64,
    /// Tokens the proxy would like to take at once (0 in exact mode).
    pub lease_want: u64,
    /// How long the proxy will hold the request for a reservation (0 = none).
    pub max_wait_ms: u64,
}

/// The script's flat reply `{allowed, remaining, retry_after_ms, reset_after_ms, granted}`.
/// Allowed with `retry_after_ms > 0` is a reservation: hold the request that long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptReply {
    pub allowed: bool,
    pub remaining: u64,
    /// 0 when allowed; -1 when the cost can never be admitted (cost > burst).
    pub retry_after_ms: i64,
    pub reset_after_ms: u64,
    pub granted: u64,
}

/// An HTTP request to the backend cluster, ready to dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// Header pairs, pseudo-headers (`:method`, `:path`, `:authority`) first.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Why a backend call did not produce a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// The callout could not be dispatched (e.g. unknown cluster).
    Dispatch(String),
    /// The stream was reset or timed out before an answer (Envoy reports both as zero headers).
    Reset,
    /// The backend answered with an HTTP status other than 200.
    Status(u32),
    /// Redis does not have the script cached: send it with EVAL.
    NoScript,
    /// Redis (through Webdis) answered with an error, e.g. `WRONGPASS`, `NOAUTH`, `ERR ...`.
    Redis(String),
    /// The reply is not the five-integer array.
    Malformed(String),
    /// The circuit breaker is open: no call was made.
    CircuitOpen,
}

impl BackendError {
    /// Whether this failure says the backend is unreachable or unhealthy as a whole (it counts
    /// toward opening the circuit breaker). A Redis error reply does not: the backend answered,
    /// and on Redis Cluster such an error can concern only the keys of one failed node.
    pub fn trips_breaker(&self) -> bool {
        matches!(
            self,
            BackendError::Dispatch(_) | BackendError::Reset | BackendError::Status(_)
        )
    }

    /// Whether retrying the same call later may succeed without an operator changing anything.
    pub fn is_transient(&self) -> bool {
        match self {
            BackendError::Reset | BackendError::NoScript | BackendError::CircuitOpen => true,
            BackendError::Status(s) => *s == 429 || *s >= 500,
            BackendError::Dispatch(_) | BackendError::Redis(_) | BackendError::Malformed(_) => {
                false
            }
        }
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Dispatch(why) => write!(f, "callout not dispatched: {why}"),
            BackendError::Reset => write!(f, "backend stream reset or timed out"),
            BackendError::Status(s) => write!(f, "backend answered HTTP {s}"),
            BackendError::NoScript => write!(f, "script not cached in Redis (NOSCRIPT)"),
            BackendError::Redis(msg) => write!(f, "Redis error: {msg}"),
            BackendError::Malformed(why) => write!(f, "malformed backend reply: {why}"),
            BackendError::CircuitOpen => write!(f, "circuit breaker open: no call made"),
        }
    }
}
