//! The figures of one simulated load: what was admitted against the ideal, where the ideal's tokens
//! went, the calls by kind, and the fullest window against the bound burst + rate × W.

/// Figures of one load.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub admitted: u64,
    pub limited: u64,
    pub other: u64,
    pub ideal: f64,
    pub calls: u64,
    /// Lease calls: all granted, part granted, denied; exact calls (no slot); calls carried by the
    /// root context (a tick: another worker's call ended, or a lost call retried).
    pub lease_full: u64,
    pub lease_partial: u64,
    /// Lease calls granted a reservation (part of the grant refills later).
    pub lease_reserved: u64,
    pub lease_denied: u64,
    pub exact: u64,
    pub from_root: u64,
    /// Calls that found the global bucket full (its refill was overflowing until then).
    pub at_full: u64,
    pub granted: u64,
    pub overflow: f64,
    /// Tokens in the global bucket at the end; negative: reserved ahead of its refill.
    pub in_bucket_end: f64,
    pub dropped: u64,
    pub held_end: u64,
    /// Of `held_end`, those the bucket had refilled by the end.
    pub held_end_refilled: f64,
    /// Admitted by the engine after the load's last counted completion.
    pub spent_after: u64,
    /// 429s answered while the global bucket held at least one token.
    pub limited_with_tokens: u64,
    /// Mean tokens in the global bucket, and held live in pools and stashes (refilled or not),
    /// over the load.
    pub mean_bucket: f64,
    pub mean_held: f64,
    /// Admitted per proxy.
    pub per_proxy: Vec<u64>,
    pub calls_per_proxy: Vec<u64>,
    /// 429s answered from the deny cache.
    pub local_denied: u64,
    /// How long after the load's last completion the last tick fired (idle CPU: ticks stop).
    pub ticks_after_ms: f64,
    /// The window that came closest to the bound burst + rate × W (or passed it most).
    pub worst: Window,
    /// What one perfect token bucket would have admitted of the same requests as they arrived
    /// (the most any limiter can admit and keep the bound in every window).
    pub perfect: u64,
}

/// Admissions in one window of the run, against the token bucket's bound for its length.
#[derive(Debug, Clone, Copy, Default)]
pub struct Window {
    pub start_ms: f64,
    pub len_ms: u64,
    pub admitted: u64,
    pub bound: f64,
}

impl Window {
    pub fn excess(&self) -> f64 {
        self.admitted as f64 - self.bound
    }
}

/// Window lengths checked, in ms: every window of each length that starts at an admission (the
/// most admissions any window of that length holds is found among those).
pub const WINDOWS_MS: [u64; 12] = [1, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000];

impl Run {
    pub fn ratio(&self) -> f64 {
        self.admitted as f64 / self.ideal
    }
    pub fn per_1k(&self) -> f64 {
        self.calls as f64 * 1000.0 / self.admitted.max(1) as f64
    }
}
