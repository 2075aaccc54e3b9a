//! Every bound and default of the configuration, once.
//!
//! Invariant: each limit a configuration value must meet is defined here, or (for what the Lua
//! script itself accepts) in `bucket`, and nowhere else: the document's types (`Int<MIN, MAX>`),
//! the compile step, `Quota` and the script model all read these constants, so a bound cannot be
//! checked against two different numbers.

/// Largest `rate`, `burst`, `cost` and `usage.unreadable`: the largest rate the script accepts.
pub const MAX_TOKENS: u64 = crate::bucket::MAX_RATE;
/// Largest `period_ms`: 366 days, so a calendar year (leap or not) fits. With a `burst` up to
/// [`MAX_TOKENS`] the script counts such a period in whole minutes (`bucket::STEPS_MS`).
pub const MAX_PERIOD_MS: u64 = 31_622_400_000;

/// Most rules a configuration may hold.
pub const MAX_RULES: usize = 64;
/// Most key sources a rule may have.
pub const MAX_KEY_SOURCES: usize = 8;
/// Longest rule name (and shortest is 1).
pub const MAX_RULE_NAME_LEN: usize = 64;
/// Longest `key_prefix`.
pub const MAX_KEY_PREFIX_LEN: usize = 64;
/// Most overrides a rule may have.
pub const MAX_OVERRIDES: usize = 10_000;
/// Most tiers a rule's `tiers.limits` may name, and the longest tier name (the shortest is 1).
pub const MAX_TIERS: usize = 256;
pub const MAX_TIER_NAME_LEN: usize = 64;
/// Most hosts a rule's match may list.
pub const MAX_HOSTS: usize = 256;
/// Most segments of a `property:` path or fields of a `metadata:` source.
pub const MAX_PATH_SEGMENTS: usize = 16;
/// Most segments of a `usage.body_field`, and most bytes of one segment.
pub const MAX_FIELD_SEGMENTS: usize = 8;
pub const MAX_FIELD_SEGMENT_LEN: usize = 64;

/// Largest `backend.timeout_ms`.
pub const MAX_TIMEOUT_MS: u64 = 60_000;
/// Longest `backend.cluster` / `backend.authority`.
pub const MAX_BACKEND_NAME_LEN: usize = 255;
/// Longest `backend.basic_auth`.
pub const MAX_BASIC_AUTH_LEN: usize = 512;
/// Largest `backend.database`.
pub const MAX_DATABASE: u64 = i32::MAX as u64;
/// Largest `backend.service_port`.
pub const MAX_PORT: u64 = 65_535;
/// Longest `backend.username` / `backend.password`.
pub const MAX_REDIS_SECRET_LEN: usize = 512;
pub const MAX_MAX_INFLIGHT: u64 = 100_000;
/// Largest `backend.batch_max_keys` (the script's batched form takes at most this many keys).
pub const MAX_BATCH_MAX_KEYS: u64 = 256;
pub const MAX_BREAKER_FAILURES: u64 = 1000;
pub const MIN_BREAKER_COOLOFF_MS: u64 = 10;
pub const MAX_BREAKER_COOLOFF_MS: u64 = 600_000;
pub const MIN_LEASE_HORIZON_MS: u64 = 10;
pub const MAX_LEASE_HORIZON_MS: u64 = 10_000;
pub const MAX_USAGE_FLUSH_MS: u64 = 10_000;

/// `deny.status`: a client error or a server error.
pub const MIN_DENY_STATUS: u64 = 400;
pub const MAX_DENY_STATUS: u64 = 599;
/// Longest `deny.body`.
pub const MAX_DENY_BODY_LEN: usize = 4096;

pub const DEFAULT_CLUSTER: &str = "tollgate_backend";
pub const DEFAULT_AUTHORITY: &str = "webdis";
pub const DEFAULT_TIMEOUT_MS: u64 = 50;
pub const DEFAULT_MAX_INFLIGHT: u64 = 256;
pub const DEFAULT_BATCH_MAX_KEYS: u64 = 32;
pub const DEFAULT_BREAKER_FAILURES: u64 = 5;
pub const DEFAULT_BREAKER_COOLOFF_MS: u64 = 1000;
/// `backend.service_port` of a Higress service, and of a `.static` one.
pub const DEFAULT_REDIS_PORT: u64 = 6379;
pub const DEFAULT_STATIC_PORT: u64 = 80;
pub const DEFAULT_KEY_PREFIX: &str = "tollgate";
pub const DEFAULT_DENY_STATUS: u64 = 429;
pub const DEFAULT_DENY_BODY: &str = "rate limited\n";
pub const DEFAULT_PERIOD_MS: u64 = 1000;
pub const DEFAULT_COST: u64 = 1;
pub const DEFAULT_LEASE_HORIZON_MS: u64 = 200;
pub const DEFAULT_USAGE_FLUSH_MS: u64 = 100;

/// `charge_on.status`: the HTTP status codes it may list, and how many entries at most.
pub const MIN_STATUS: u16 = 100;
pub const MAX_STATUS: u16 = 599;
pub const MAX_CHARGE_ON_STATUSES: usize = 32;
