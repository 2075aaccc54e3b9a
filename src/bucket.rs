//! Pure token-bucket math: the Rust model of `lua/token_bucket.lua`.
//!
//! Invariant: for the same sequence of (now, cost, lease_want) calls and the same limits, `take` returns
//! exactly what the Lua script returns (tests/model.rs checks this against real Redis).
//! All arithmetic is on integers (u64), so there is no drift over millions of calls.

/// A bucket's configured limits: `rate` tokens are added every `period_ms`, up to `burst` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub burst: u64,
    pub rate: u64,
    pub period_ms: u64,
}
