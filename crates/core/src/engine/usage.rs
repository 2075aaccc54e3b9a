//! What a response's usage means for the bucket (the reading itself is in [`read`]): the
//! difference from the up-front cost, settled through this proxy's pending settlements.
//!
//! Invariant: every admission of a usage rule by the global bucket that may have reached the
//! upstream (not one still held for its reservation) settles exactly once: the usage its
//! response reported, clamped to `[0, cap]`, or, when that never becomes readable (none in the
//! answer, an invalid value, an encoding or a size the reader does not take, a worker already
//! reading its most bodies, a request that ended before its response did), a worst case that is
//! never below what the admission paid up front. So nothing a client or upstream does to the
//! answer lowers a charge below the up-front cost, and only a readable usage below it refunds.

use std::cmp::Reverse;

use super::{Admitted, Call, Engine, Host, Purpose, Request};
use crate::backend::ScriptCall;
use crate::bucket::{Limits, MAX_SETTLE_BURSTS};
use crate::config::{UsageSource, WorstCase, DEFAULT_USAGE_FLUSH_MS};
use crate::metrics::{Counter, Metrics};
use crate::rule::RequestView;
use crate::shared::{peak, settle};

mod read;
mod readers;
pub use read::{encoded, from_headers, parse_header, BodyReader, Unreadable, WINDOW};
pub use readers::{Readers, MAX_READERS};

/// The settlement for one admission: usage clamped to `[0, cap]`, minus what was charged up front.
/// Returns (delta, whether the usage was clamped).
pub fn settlement(usage: u64, upfront: u64, cap: u64) -> (i64, bool) {
    let clamped = usage.min(cap);
    let delta = i128::from(clamped) - i128::from(upfront);
    (
        i64::try_from(delta).unwrap_or(if delta > 0 { i64::MAX } else { i64::MIN }),
        usage > cap,
    )
}

// ----- the engine's side: from responses to settlements -----

/// What one admission of a usage rule used, once known: its rule, key, limits, up-front cost and
/// the usage read (or why there is none).
type Known = (usize, String, Limits, u64, Result<u64, Unreadable>);

fn known(a: &Admitted, result: Result<u64, Unreadable>) -> Known {
    (a.rule, a.key.clone(), a.limits, a.upfront, result)
}

impl Engine {
    /// The usage rules that admitted `r` through the global bucket (they charged its up-front
    /// cost, so the difference is theirs to settle). Failure-mode admissions settle nothing.
    pub(super) fn usage_admissions(&self, r: &Request) -> Vec<Admitted> {
        r.checks
            .iter()
            .filter(|c| c.backend)
            .filter(|c| {
                matches!(
                    c.outcome,
                    Some(super::Outcome::Allowed { .. } | super::Outcome::Reserved { .. })
                )
            })
            .filter(|c| {
                self.plugin
                    .rule(c.rule)
                    .is_some_and(|rule| rule.usage.is_some())
            })
            .map(|c| Admitted {
                rule: c.rule,
                key: c.call.key.clone(),
                limits: c.call.limits(),
                upfront: c.call.cost,
                answered: false,
                reader: None,
            })
            .collect()
    }

    /// Usage from response headers (or, with `trailers`, trailers); starts body readers, and
    /// finishes them at the trailers (the body has ended). True if a body reader wants the body.
    pub(super) fn usage_from_headers(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        view: &dyn RequestView,
        trailers: bool,
    ) -> bool {
        let rules = &self.plugin.config.rules;
        let readers = &self.readers;
        let Some(r) = self.requests.get_mut(&ctx).filter(|r| !r.usage.is_empty()) else {
            return false;
        };
        let (content_type, encoded) = if trailers {
            (None, false)
        } else {
            (view.header("content-type"), encoded(view))
        };
        let mut found = Vec::new();
        let mut watch = false;
        r.usage.retain_mut(|a| {
            let Some(source) = rules.get(a.rule).and_then(|rule| rule.usage.as_ref()) else {
                return false;
            };
            a.answered = true;
            match &source.source {
                UsageSource::Header(name) => match from_headers(view, name) {
                    Some(result) => {
                        found.push(known(a, result));
                        false
                    }
                    None if trailers => {
                        found.push(known(a, Err(Unreadable::Missing)));
                        false
                    }
                    // Not in the headers: maybe in the trailers, else missing at the end.
                    None => true,
                },
                UsageSource::BodyField(_) if trailers => {
                    let result = a
                        .reader
                        .take()
                        .map_or(Err(Unreadable::Missing), BodyReader::finish);
                    found.push(known(a, result));
                    false
                }
                UsageSource::BodyField(_) if encoded => {
                    found.push(known(a, Err(Unreadable::Encoded)));
                    false
                }
                UsageSource::BodyField(path) => {
                    match BodyReader::new(content_type.as_deref(), path, readers) {
                        Ok(reader) => a.reader = Some(reader),
                        // Not JSON or an event stream, or too many readers alive in this
                        // worker: charged the worst case now.
                        Err(why) => {
                            found.push(known(a, Err(why)));
                            return false;
                        }
                    }
                    watch = true;
                    true
                }
            }
        });
        self.settle_known(host, ctx, found);
        watch
    }

    /// A chunk of a response body: fed to the readers; at the end, their usage is settled.
    pub(super) fn usage_from_body(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        chunk: &[u8],
        end: bool,
    ) {
        let Some(r) = self.requests.get_mut(&ctx) else {
            return;
        };
        let mut found = Vec::new();
        r.usage.retain_mut(|a| {
            let Some(reader) = a.reader.as_mut() else {
                return true;
            };
            reader.feed(chunk);
            if !end {
                return true;
            }
            if let Some(reader) = a.reader.take() {
                found.push(known(a, reader.finish()));
            }
            false
        });
        self.settle_known(host, ctx, found);
    }

    /// The request of these admissions ended (its context is gone) before their usage was
    /// settled: a body still being read settles what its stream showed so far, or the worst
    /// case; a usage header that came in neither the headers nor trailers is missing; a
    /// response that never came is unfinished.
    pub(super) fn usage_at_end(&mut self, host: &mut dyn Host, ctx: u32, usage: Vec<Admitted>) {
        let m = &self.plugin.metrics;
        let found = usage
            .iter()
            .map(|a| {
                let result = match a.reader.as_ref().and_then(BodyReader::seen) {
                    Some(seen) => {
                        // Counted here: the usage seen settles like any other.
                        m.count(a.rule, Counter::UsageUnfinished, 1);
                        seen
                    }
                    None if a.answered && a.reader.is_none() => Err(Unreadable::Missing),
                    None => Err(Unreadable::Unfinished),
                };
                known(a, result)
            })
            .collect();
        self.settle_known(host, ctx, found);
    }

    /// Settles the usages just learnt of `ctx`'s admissions, and forgets `ctx` if none is left
    /// to learn.
    fn settle_known(&mut self, host: &mut dyn Host, ctx: u32, found: Vec<Known>) {
        if self.requests.get(&ctx).is_some_and(|r| r.usage.is_empty()) {
            self.requests.remove(&ctx);
        }
        if found.is_empty() {
            return;
        }
        let now = self.now(host);
        for (rule, key, limits, upfront, result) in found {
            self.settle_usage(host, rule, &key, limits, upfront, result, now);
        }
        // The flush of a settlement kept pending, and the counts, need the tick.
        self.schedule(host, now, false);
    }

    /// What an admission of rule `rule_idx` whose usage cannot be read is charged: the rule's
    /// `usage.unreadable`, or the largest usage this proxy read for the rule lately; never less
    /// than the `upfront` cost it paid.
    fn worst_case(&self, host: &dyn Host, rule_idx: usize, upfront: u64, now: u64) -> u64 {
        let Some(rule) = self.plugin.rule(rule_idx) else {
            return upfront;
        };
        let worst = match rule.usage.as_ref().map(|u| u.unreadable) {
            Some(WorstCase::Fixed(n)) => n,
            Some(WorstCase::Recent) | None => {
                // A failed read of shared data knows nothing more than the up-front cost.
                peak::recent(host.store(), &self.plugin.ns, &rule.name, now)
                    .ok()
                    .flatten()
                    .unwrap_or(0)
            }
        };
        worst.max(upfront)
    }

    /// Records what one admission used (or the worst case, if that cannot be read): the
    /// difference from its up-front cost becomes pending for its key (flushed after the rule's
    /// `flush_ms` unless a call carries it first).
    #[allow(clippy::too_many_arguments)]
    fn settle_usage(
        &mut self,
        host: &mut dyn Host,
        rule_idx: usize,
        key: &str,
        limits: Limits,
        upfront: u64,
        result: Result<u64, Unreadable>,
        now: u64,
    ) {
        let Some(rule) = self.plugin.rule(rule_idx) else {
            return;
        };
        let cap = limits.burst.saturating_mul(MAX_SETTLE_BURSTS);
        let m = &self.plugin.metrics;
        let used = match result {
            Ok(used) => {
                if let Some(WorstCase::Recent) = rule.usage.as_ref().map(|u| u.unreadable) {
                    // Best effort: a lost update leaves the estimate where it was.
                    let _ = peak::record(
                        host.store(),
                        &self.plugin.ns,
                        &rule.name,
                        used.min(cap),
                        now,
                    );
                }
                used
            }
            Err(why) => {
                let worst = self.worst_case(host, rule_idx, upfront, now);
                m.count(rule_idx, why.counter(), 1);
                m.count(rule_idx, Counter::UsageWorstCase, 1);
                if !std::mem::replace(&mut self.usage_logged, true) {
                    log::warn!(
                        "tollgate: rule {}: a response's usage could not be read ({why:?}); \
                         such an admission is charged the worst case, here {worst} \
                         (counted in usage_worst_case; logged once per worker)",
                        rule.name
                    );
                }
                worst
            }
        };
        let (delta, clamped) = settlement(used, upfront, cap);
        if clamped && result.is_ok() {
            m.count(rule_idx, Counter::UsageClamped, 1);
        }
        match delta {
            0 => return,
            d if d > 0 => m.count(rule_idx, Counter::UsageCharged, d.unsigned_abs()),
            d => m.count(rule_idx, Counter::UsageRefunded, d.unsigned_abs()),
        }
        if !self.keep_pending(host, rule_idx, key, limits, delta, now) {
            // No room in the shared table: settle this one now.
            self.send_settlement(host, rule_idx, key, limits, delta, now);
        }
    }

    /// Adds `delta` to `key`'s pending settlement and schedules its flush; false if the shared
    /// table has no room for the key.
    fn keep_pending(
        &mut self,
        host: &mut dyn Host,
        rule_idx: usize,
        key: &str,
        limits: Limits,
        delta: i64,
        now: u64,
    ) -> bool {
        let limit = limits.burst.saturating_mul(MAX_SETTLE_BURSTS);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let kept = settle::add(host.store(), &self.plugin.ns, key, delta, limit) == Ok(true);
        if kept {
            self.schedule_flush(rule_idx, key.to_string(), limits, now);
        }
        kept
    }

    /// Flushes `key`'s pending settlement after the rule's `usage.flush_ms`, unless a call
    /// carries it first.
    fn schedule_flush(&mut self, rule_idx: usize, key: String, limits: Limits, now: u64) {
        let flush_ms = self
            .plugin
            .rule(rule_idx)
            .and_then(|r| r.usage.as_ref())
            .map_or(DEFAULT_USAGE_FLUSH_MS, |u| u.flush_ms);
        self.flushes.push(Reverse((
            now.saturating_add(flush_ms),
            rule_idx,
            key,
            limits,
        )));
    }

    #[allow(clippy::too_many_arguments)]
    fn send_settlement(
        &mut self,
        host: &mut dyn Host,
        rule_idx: usize,
        key: &str,
        limits: Limits,
        delta: i64,
        now: u64,
    ) {
        let call = ScriptCall {
            settle: delta,
            ..ScriptCall::new(key.to_string(), &limits, 0)
        };
        // A failure to send puts it back (`settlement_failed`, called by `send`).
        let _ = self.send(host, Call::new(rule_idx, call, Purpose::Settle, now));
    }

    /// A call that carried a settlement failed: the settlement is pending again.
    pub(super) fn settlement_failed(
        &mut self,
        host: &mut dyn Host,
        rule_idx: usize,
        call: &ScriptCall,
        now: u64,
    ) {
        if call.settle != 0 {
            self.keep_pending(host, rule_idx, &call.key, call.limits(), call.settle, now);
        }
    }

    /// Flushes the settlements whose time is up and that no call has carried meanwhile (from the
    /// root context; while the breaker is open they wait another round).
    pub(super) fn flush_settlements(&mut self, host: &mut dyn Host, now: u64) {
        while let Some(Reverse((due, rule_idx, key, limits))) = self.flushes.peek().cloned() {
            if due > now {
                break;
            }
            self.flushes.pop();
            if !self.backend_allowed(host, now) {
                self.schedule_flush(rule_idx, key, limits, now);
                break;
            }
            let pending = settle::take(host.store(), &self.plugin.ns, &key).unwrap_or(0);
            if pending != 0 {
                self.send_settlement(host, rule_idx, &key, limits, pending, now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settlements_charge_refund_and_clamp() {
        assert_eq!(settlement(40, 1, 400), (39, false));
        assert_eq!(settlement(0, 10, 400), (-10, false));
        assert_eq!(settlement(u64::MAX, 1, 400), (399, true));
    }
}
