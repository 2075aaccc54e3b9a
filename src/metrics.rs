//! Per-rule metrics: names (the public contract `tollgate.<rule>.<metric>`) and what each request
//! outcome counts. The host side (`host::HostMetrics`) turns them into Envoy stats.
//!
//! Invariant: every check that gets an outcome counts exactly once in exactly one of `allowed`,
//! `denied` or `shadow_denied`; `local_*` and `failure_mode_allowed` say where that outcome came
//! from.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use crate::backend::ErrorClass;

/// A per-rule counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Requests this rule admitted (from Redis, a lease, or the failure mode).
    Allowed,
    /// Requests this rule denied (enforced rules only; includes `failure_mode: closed`).
    Denied,
    /// Requests a shadow rule would have denied (and let through).
    ShadowDenied,
    /// Admissions spent from this proxy's leased tokens, with no Redis call.
    LocalAllowed,
    /// Denials answered from this proxy's deny cache, with no Redis call.
    LocalDenied,
    /// Script calls sent (EVALSHA, the EVAL after NOSCRIPT, lease calls).
    BackendCalls,
    /// Script calls that failed (timeout, reset, HTTP error, Redis error, bad reply); not the
    /// NOSCRIPT that is answered by sending EVAL.
    BackendErrors,
    /// Admissions made by the failure mode (`open`, or the `local` fallback bucket).
    FailureModeAllowed,
    /// Tokens leases took from the global bucket for this proxy.
    LeaseGranted,
    /// Leased tokens dropped unspent because their lease expired.
    LeaseDropped,
    /// Admissions held for a reservation (`max_wait_ms`) before going on.
    Delayed,
    /// Total milliseconds requests were held for reservations.
    DelayMs,
    /// Lease-table entries of other keys given to this rule's keys (they held no live tokens).
    LeaseEvicted,
    /// Checks that got the failure mode at once because the worker had `max_inflight` calls out.
    InflightRejected,
    /// Exact checks this worker sent to the worker leading their key, to share its call.
    Forwarded,
    /// Failed calls by class (see `ErrorClass`); each also counts in `BackendErrors`.
    BackendError(ErrorClass),
    /// Usage rules: tokens charged after responses said they used more than was paid up front.
    UsageCharged,
    /// Usage rules: tokens given back after responses said they used less.
    UsageRefunded,
    /// Usage values above four bursts, counted as four bursts.
    UsageClamped,
    /// Responses whose usage was not a non-negative integer or could not be read (body too large,
    /// not JSON or an event stream): nothing is settled for them.
    UsageInvalid,
}

impl Counter {
    pub const ALL: [Counter; 24] = [
        Counter::Allowed,
        Counter::Denied,
        Counter::ShadowDenied,
        Counter::LocalAllowed,
        Counter::LocalDenied,
        Counter::BackendCalls,
        Counter::BackendErrors,
        Counter::FailureModeAllowed,
        Counter::LeaseGranted,
        Counter::LeaseDropped,
        Counter::Delayed,
        Counter::DelayMs,
        Counter::LeaseEvicted,
        Counter::InflightRejected,
        Counter::Forwarded,
        Counter::BackendError(ErrorClass::Unreachable),
        Counter::BackendError(ErrorClass::Overloaded),
        Counter::BackendError(ErrorClass::Auth),
        Counter::BackendError(ErrorClass::Script),
        Counter::BackendError(ErrorClass::Malformed),
        Counter::UsageCharged,
        Counter::UsageRefunded,
        Counter::UsageClamped,
        Counter::UsageInvalid,
    ];

    /// The metric name after `tollgate.<rule>.`.
    pub fn suffix(self) -> String {
        match self {
            Counter::BackendError(class) => format!("backend_error.{}", class.name()),
            other => other.simple_suffix().to_string(),
        }
    }

    fn simple_suffix(self) -> &'static str {
        match self {
            Counter::Allowed => "allowed",
            Counter::Denied => "denied",
            Counter::ShadowDenied => "shadow_denied",
            Counter::LocalAllowed => "local_allowed",
            Counter::LocalDenied => "local_denied",
            Counter::BackendCalls => "backend_calls",
            Counter::BackendErrors => "backend_errors",
            Counter::FailureModeAllowed => "failure_mode_allowed",
            Counter::LeaseGranted => "lease_granted",
            Counter::LeaseDropped => "lease_dropped",
            Counter::Delayed => "delayed",
            Counter::DelayMs => "delay_ms_total",
            Counter::LeaseEvicted => "lease_evicted",
            Counter::InflightRejected => "inflight_rejected",
            Counter::Forwarded => "forwarded",
            Counter::BackendError(_) => "backend_error",
            Counter::UsageCharged => "usage_charged",
            Counter::UsageRefunded => "usage_refunded",
            Counter::UsageClamped => "usage_clamped",
            Counter::UsageInvalid => "usage_invalid",
        }
    }
}

/// The histogram of backend call latency, in milliseconds.
pub const LATENCY_SUFFIX: &str = "backend_latency_ms";

/// The proxy-wide gauge: 1 while the circuit breaker is open.
pub const BREAKER_GAUGE: &str = "tollgate.breaker_open";

/// `tollgate.<rule>.<suffix>`.
pub fn name(rule: &str, suffix: &str) -> String {
    format!("tollgate.{rule}.{suffix}")
}

/// Where metrics go. Rules are named by their index in the configuration.
pub trait Metrics {
    fn count(&self, rule: usize, counter: Counter, n: u64);
    fn latency(&self, rule: usize, ms: u64);
    fn breaker_open(&self, open: bool);
}

/// Discards everything.
pub struct NoMetrics;

impl Metrics for NoMetrics {
    fn count(&self, _: usize, _: Counter, _: u64) {}
    fn latency(&self, _: usize, _: u64) {}
    fn breaker_open(&self, _: bool) {}
}

/// Keeps every count in memory (tests, and anything that wants to read them back).
#[derive(Default)]
pub struct Recorder {
    counts: RefCell<HashMap<(usize, Counter), u64>>,
    latencies: RefCell<Vec<(usize, u64)>>,
    pub breaker: Cell<bool>,
}

impl Recorder {
    pub fn get(&self, rule: usize, counter: Counter) -> u64 {
        self.counts
            .borrow()
            .get(&(rule, counter))
            .copied()
            .unwrap_or(0)
    }

    pub fn latencies(&self) -> Vec<(usize, u64)> {
        self.latencies.borrow().clone()
    }
}

impl Metrics for Recorder {
    fn count(&self, rule: usize, counter: Counter, n: u64) {
        if n > 0 {
            *self.counts.borrow_mut().entry((rule, counter)).or_insert(0) += n;
        }
    }

    fn latency(&self, rule: usize, ms: u64) {
        self.latencies.borrow_mut().push((rule, ms));
    }

    fn breaker_open(&self, open: bool) {
        self.breaker.set(open);
    }
}
