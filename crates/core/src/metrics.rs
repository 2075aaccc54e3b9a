//! Per-rule metrics: names (the public contract `tollgate.<rule>.<metric>`) and what each request
//! outcome counts. The host side (`host::HostMetrics`) turns them into Envoy stats.
//!
//! Invariant: every check that gets an outcome counts exactly once in exactly one of `allowed`,
//! `denied` or `shadow_denied`; `local_*` and `failure_mode_allowed` say where that outcome came
//! from.
//!
//! Counts are batched ([`Batched`]): each one is added up in the VM and pushed to the host in one
//! increment per (rule, counter) at most [`METRICS_FLUSH_MS`] after the first, so a request
//! normally costs no host call for its metrics. Each count still arrives exactly once.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use crate::backend::ErrorClass;
use crate::engine::RuleId;

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
    /// Responses whose usage was not a non-negative integer, or whose body was neither JSON nor
    /// an event stream, or malformed: charged the worst case.
    UsageInvalid,
    /// Responses that ended without a usage (no header or trailer, no field in the JSON body or
    /// in any event of the stream): charged the worst case.
    UsageMissing,
    /// Responses with a `content-encoding` the filter does not read (the upstream ignored the
    /// request for identity): charged the worst case.
    UsageEncoded,
    /// Responses whose usage was not within the window the filter keeps (a JSON body's last
    /// 16 KiB, an event line of at most 16 KiB): charged the worst case.
    UsageTooLarge,
    /// Admissions whose request ended before their response did (the client left, or the stream
    /// was reset): charged the usage the stream had shown so far, or the worst case.
    UsageUnfinished,
    /// Admissions charged the worst case, whatever the reason (each also counts in one of the
    /// counters above).
    UsageWorstCase,
    /// Checks whose key source was ambiguous (its name appeared more than once): keyed into the
    /// rule's one bucket for ambiguous requests. Also checks whose tier source could not be read
    /// as one value (named twice, a list or a struct): under the rule's own limits.
    Ambiguous,
    /// Responses not read because their worker was already reading its most bodies at once
    /// (1024, 16 KiB each): charged the worst case.
    UsageReadersFull,
    /// Denials answered because the key was in its penalty box (by Redis, or from this proxy's
    /// deny cache); not the offence that put it there.
    Penalized,
    /// Denials by the bucket that put a key in its penalty box (offences).
    PenaltyOffences,
    /// Tokens given back because the request never went upstream: another rule refused it, or
    /// its client left before it was let through (exact mode; admissions by Redis only).
    Refunded,
    /// Exact checks this worker relayed to the worker collecting the proxy's next flight, to
    /// ride it instead of a flight of their own.
    Relayed,
    /// Tokens of refunds this proxy dropped instead of sending: their take's reply carried no
    /// spill epoch, a newer take's refund of the key replaced them, or the call carrying them
    /// failed after it may have run (sent again, they could be given back twice), or before, with
    /// no room for their key in the settle table.
    RefundDropped,
    /// Usage tokens this proxy dropped instead of charging: the call carrying them failed, the
    /// settle table had no room for their key, and the worker already held the most keys'
    /// charges it keeps for that (4096).
    ChargeDropped,
}

impl Counter {
    pub const ALL: [Counter; 37] = [
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
        Counter::UsageMissing,
        Counter::UsageEncoded,
        Counter::UsageTooLarge,
        Counter::UsageUnfinished,
        Counter::UsageWorstCase,
        Counter::Ambiguous,
        Counter::UsageReadersFull,
        Counter::Penalized,
        Counter::PenaltyOffences,
        Counter::Refunded,
        Counter::Relayed,
        Counter::RefundDropped,
        Counter::ChargeDropped,
    ];

    /// The number of counters of a rule.
    pub const COUNT: usize = Counter::ALL.len();

    /// This counter's position in [`Counter::ALL`] (a match, not a search: it runs on every
    /// count).
    pub const fn index(self) -> usize {
        match self {
            Counter::Allowed => 0,
            Counter::Denied => 1,
            Counter::ShadowDenied => 2,
            Counter::LocalAllowed => 3,
            Counter::LocalDenied => 4,
            Counter::BackendCalls => 5,
            Counter::BackendErrors => 6,
            Counter::FailureModeAllowed => 7,
            Counter::LeaseGranted => 8,
            Counter::LeaseDropped => 9,
            Counter::Delayed => 10,
            Counter::DelayMs => 11,
            Counter::LeaseEvicted => 12,
            Counter::InflightRejected => 13,
            Counter::Forwarded => 14,
            Counter::BackendError(ErrorClass::Unreachable) => 15,
            Counter::BackendError(ErrorClass::Overloaded) => 16,
            Counter::BackendError(ErrorClass::Auth) => 17,
            Counter::BackendError(ErrorClass::Script) => 18,
            Counter::BackendError(ErrorClass::Malformed) => 19,
            Counter::UsageCharged => 20,
            Counter::UsageRefunded => 21,
            Counter::UsageClamped => 22,
            Counter::UsageInvalid => 23,
            Counter::UsageMissing => 24,
            Counter::UsageEncoded => 25,
            Counter::UsageTooLarge => 26,
            Counter::UsageUnfinished => 27,
            Counter::UsageWorstCase => 28,
            Counter::Ambiguous => 29,
            Counter::UsageReadersFull => 30,
            Counter::Penalized => 31,
            Counter::PenaltyOffences => 32,
            Counter::Refunded => 33,
            Counter::Relayed => 34,
            Counter::RefundDropped => 35,
            Counter::ChargeDropped => 36,
        }
    }

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
            Counter::UsageMissing => "usage_missing",
            Counter::UsageEncoded => "usage_encoded",
            Counter::UsageTooLarge => "usage_too_large",
            Counter::UsageUnfinished => "usage_unfinished",
            Counter::UsageWorstCase => "usage_worst_case",
            Counter::Ambiguous => "ambiguous",
            Counter::UsageReadersFull => "usage_readers_full",
            Counter::Penalized => "penalized",
            Counter::PenaltyOffences => "penalty_offences",
            Counter::Refunded => "refunded_tokens",
            Counter::Relayed => "relayed",
            Counter::RefundDropped => "refund_dropped",
            Counter::ChargeDropped => "charge_dropped",
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

/// Where metrics go. Rules are named by their id: their place in the configuration.
pub trait Metrics {
    fn count(&self, rule: RuleId, counter: Counter, n: u64);
    fn latency(&self, rule: RuleId, ms: u64);
    fn breaker_open(&self, open: bool);
}

/// A shared handle to metrics (the caller keeps one to read them back).
impl<M: Metrics + ?Sized> Metrics for std::rc::Rc<M> {
    fn count(&self, rule: RuleId, counter: Counter, n: u64) {
        self.as_ref().count(rule, counter, n)
    }

    fn latency(&self, rule: RuleId, ms: u64) {
        self.as_ref().latency(rule, ms)
    }

    fn breaker_open(&self, open: bool) {
        self.as_ref().breaker_open(open)
    }
}

/// Discards everything.
pub struct NoMetrics;

impl Metrics for NoMetrics {
    fn count(&self, _: RuleId, _: Counter, _: u64) {}
    fn latency(&self, _: RuleId, _: u64) {}
    fn breaker_open(&self, _: bool) {}
}

/// How long after its first pending count a batch of counts reaches the host, at most.
pub const METRICS_FLUSH_MS: u64 = 1000;

/// Batches the counts for `inner`: [`Metrics::count`] only adds to a table in memory (one slot
/// per rule and counter, sized at configure time), and [`Batched::flush`] pushes each non-zero
/// slot to `inner` in one count. Latencies and the breaker gauge go to `inner` at once: they are
/// rare, and a gauge must not lag.
///
/// When to flush is the caller's (the engine's clock): [`Batched::due`] says when the pending
/// counts must go, [`METRICS_FLUSH_MS`] after the first call that saw them.
pub struct Batched {
    inner: Box<dyn Metrics>,
    /// Rule-major: rule `r`'s counter `c` is at `r * Counter::COUNT + c.index()`.
    pending: Box<[Cell<u64>]>,
    /// Whether any slot is non-zero.
    dirty: Cell<bool>,
    /// When the pending counts must be flushed (set by the first `due` that sees them).
    deadline: Cell<Option<u64>>,
}

impl Batched {
    /// Batches counts of rules `0..rules` (a count of any other rule goes to `inner` at once).
    pub fn new(inner: Box<dyn Metrics>, rules: usize) -> Batched {
        let slots = rules.saturating_mul(Counter::COUNT);
        Batched {
            inner,
            pending: (0..slots).map(|_| Cell::new(0)).collect(),
            dirty: Cell::new(false),
            deadline: Cell::new(None),
        }
    }

    /// Whether counts are waiting for a flush.
    pub fn pending(&self) -> bool {
        self.dirty.get()
    }

    /// When the pending counts must be flushed, `now` being the time of this call: the deadline
    /// starts at the first call that sees counts pending. None when nothing is pending.
    pub fn due(&self, now: u64) -> Option<u64> {
        if !self.dirty.get() {
            return None;
        }
        let due = self
            .deadline
            .get()
            .unwrap_or(now.saturating_add(METRICS_FLUSH_MS));
        self.deadline.set(Some(due));
        Some(due)
    }

    /// Flushes if the pending counts are due at `now`; otherwise says when they will be (None:
    /// nothing pending).
    pub fn flush_if_due(&self, now: u64) -> Option<u64> {
        match self.due(now) {
            Some(due) if due <= now => {
                self.flush();
                None
            }
            other => other,
        }
    }

    /// Pushes every pending count to the inner metrics, one count per non-zero slot, and clears
    /// them.
    pub fn flush(&self) {
        if !self.dirty.replace(false) {
            return;
        }
        self.deadline.set(None);
        for (slot, cell) in self.pending.iter().enumerate() {
            let n = cell.replace(0);
            if n == 0 {
                continue;
            }
            let rule = RuleId::new(slot / Counter::COUNT);
            if let Some(counter) = Counter::ALL.get(slot % Counter::COUNT) {
                self.inner.count(rule, *counter, n);
            }
        }
    }
}

impl Metrics for Batched {
    fn count(&self, rule: RuleId, counter: Counter, n: u64) {
        if n == 0 {
            return;
        }
        let slot = rule
            .index()
            .checked_mul(Counter::COUNT)
            .and_then(|base| self.pending.get(base.checked_add(counter.index())?));
        match slot {
            Some(cell) => {
                cell.set(cell.get().saturating_add(n));
                self.dirty.set(true);
            }
            None => self.inner.count(rule, counter, n),
        }
    }

    fn latency(&self, rule: RuleId, ms: u64) {
        self.inner.latency(rule, ms);
    }

    fn breaker_open(&self, open: bool) {
        self.inner.breaker_open(open);
    }
}

/// Keeps every count in memory (tests, and anything that wants to read them back), by rule index.
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
    fn count(&self, rule: RuleId, counter: Counter, n: u64) {
        if n > 0 {
            let mut counts = self.counts.borrow_mut();
            *counts.entry((rule.index(), counter)).or_insert(0) += n;
        }
    }

    fn latency(&self, rule: RuleId, ms: u64) {
        self.latencies.borrow_mut().push((rule.index(), ms));
    }

    fn breaker_open(&self, open: bool) {
        self.breaker.set(open);
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;

    /// Every call the inner metrics get, in order.
    #[derive(Default)]
    struct Log(RefCell<Vec<(usize, Counter, u64)>>);

    impl Metrics for Log {
        fn count(&self, rule: RuleId, counter: Counter, n: u64) {
            self.0.borrow_mut().push((rule.index(), counter, n));
        }
        fn latency(&self, _: RuleId, _: u64) {}
        fn breaker_open(&self, _: bool) {}
    }

    fn batched(rules: usize) -> (Batched, Rc<Log>) {
        let log = Rc::new(Log::default());
        (Batched::new(Box::new(log.clone()), rules), log)
    }

    #[test]
    fn each_counter_has_its_position_in_all() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(c.index(), i, "{c:?}");
        }
    }

    #[test]
    fn counts_are_summed_in_memory_and_pushed_once_per_counter() {
        let (b, log) = batched(2);
        b.count(RuleId::new(0), Counter::Allowed, 1);
        b.count(RuleId::new(1), Counter::BackendError(ErrorClass::Auth), 2);
        b.count(RuleId::new(0), Counter::Allowed, 1);
        b.count(RuleId::new(1), Counter::UsageInvalid, 5);
        b.count(RuleId::new(0), Counter::Denied, 0);
        assert!(log.0.borrow().is_empty(), "nothing before the flush");
        assert!(b.pending());
        b.flush();
        assert_eq!(
            *log.0.borrow(),
            [
                (0, Counter::Allowed, 2),
                (1, Counter::BackendError(ErrorClass::Auth), 2),
                (1, Counter::UsageInvalid, 5),
            ]
        );
        assert!(!b.pending());
        b.flush();
        assert_eq!(log.0.borrow().len(), 3, "each count pushed once");
    }

    #[test]
    fn a_count_of_zero_is_nothing_to_flush() {
        let (b, _) = batched(1);
        b.count(RuleId::new(0), Counter::Allowed, 0);
        assert!(!b.pending());
        assert_eq!(b.due(0), None);
    }

    #[test]
    fn a_rule_outside_the_table_is_counted_at_once() {
        let (b, log) = batched(1);
        b.count(RuleId::new(1), Counter::Allowed, 3);
        b.count(RuleId::new(usize::MAX), Counter::UsageInvalid, 1);
        assert_eq!(
            *log.0.borrow(),
            [
                (1, Counter::Allowed, 3),
                (usize::MAX, Counter::UsageInvalid, 1)
            ]
        );
        assert!(!b.pending());
    }

    #[test]
    fn the_deadline_starts_at_the_first_call_that_sees_counts() {
        let (b, log) = batched(1);
        assert_eq!(b.flush_if_due(100), None, "nothing pending");
        b.count(RuleId::new(0), Counter::Allowed, 1);
        assert_eq!(b.flush_if_due(100), Some(100 + METRICS_FLUSH_MS));
        b.count(RuleId::new(0), Counter::Allowed, 1);
        assert_eq!(
            b.flush_if_due(600),
            Some(100 + METRICS_FLUSH_MS),
            "not pushed back"
        );
        assert!(log.0.borrow().is_empty());
        assert_eq!(b.flush_if_due(100 + METRICS_FLUSH_MS), None);
        assert_eq!(*log.0.borrow(), [(0, Counter::Allowed, 2)]);
        // A new batch gets a new deadline.
        b.count(RuleId::new(0), Counter::Allowed, 1);
        assert_eq!(b.due(5000), Some(5000 + METRICS_FLUSH_MS));
    }

    #[test]
    fn latencies_and_the_gauge_are_not_batched() {
        let rec = Rc::new(Recorder::default());
        let b = Batched::new(Box::new(rec.clone()), 1);
        b.latency(RuleId::new(0), 7);
        b.breaker_open(true);
        assert_eq!(rec.latencies(), [(0, 7)]);
        assert!(rec.breaker.get());
        assert!(!b.pending());
    }
}
