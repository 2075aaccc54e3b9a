//! From responses to settlements: the engine's side of usage. What a response said (or why it
//! said nothing readable) becomes the difference from the up-front cost, kept pending for the key
//! in shared data until a call carries it or its flush sends it.
//!
//! Invariant: each admission settles once: the usage its response reported, clamped to
//! `[0, cap]`, or a worst case never below what it paid up front; a settlement is pending in
//! shared data (or, a charge, stranded in the worker), in flight on a call, or applied by the
//! script, and never sent twice. A charge is never lost on a failed call (it is put back:
//! applied twice, it only lowers the bucket): in the settle table, or, when the table has no
//! room for its key, among the worker's stranded charges ([`stranded`]), which the key's next
//! call or flush carries with what the table holds (dropped and counted, `charge_dropped`, only
//! past their bound). A refund is put back only when its call certainly never ran and the table
//! has room for it; one whose call may have run, or with no room, is dropped and counted
//! (`refund_dropped`), as is one whose take's reply carried no spill epoch: a refund given back
//! twice, or without its epoch, could pass the window bound, and one dropped only overcharges.
//!
//! [`stranded`]: super::stranded

use super::{settlement, Admitted, Chunk, Flush, Known, Look, Usage};
use crate::backend::ScriptCall;
use crate::bucket::{Limits, Tracked, MAX_SETTLE_BURSTS};
use crate::config::{WorstCase, DEFAULT_USAGE_FLUSH_MS};
use crate::engine::calls::{Call, Purpose};
use crate::engine::host::Host;
use crate::engine::ids::ContextId;
use crate::engine::requests::Request;
use crate::engine::rules::RuleRef;
use crate::engine::Engine;
use crate::metrics::{Counter, Metrics};
use crate::rule::RequestView;
use crate::shared::{peak, settle};

impl Engine {
    /// Usage from response headers (or, with `trailers`, trailers); starts body readers, and
    /// finishes them at the trailers (the body has ended). How much of each body chunk the
    /// readers look at (None: no reader wants the body).
    pub(in crate::engine) fn usage_from_headers(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        view: &dyn RequestView,
        trailers: bool,
    ) -> Option<Look> {
        if self.requests.still_held(ctx) {
            // Not the upstream's answer: `done` gives back what the request paid.
            return None;
        }
        let usage = self
            .requests
            .get_mut(ctx)
            .and_then(Request::usage_mut)
            .filter(|u| !u.is_empty())?;
        let (found, look) = self.usage.read_headers(usage, view, trailers);
        self.settle_known(host, ctx, found);
        look
    }

    /// A chunk of a response body (None: one the host could not give): fed to the readers; at
    /// the end, their usage is settled.
    pub(in crate::engine) fn usage_from_body(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        chunk: Option<Chunk<'_>>,
        end: bool,
    ) {
        if self.requests.still_held(ctx) {
            return;
        }
        let Some(r) = self.requests.get_mut(ctx) else {
            return;
        };
        let found = r
            .usage_mut()
            .map(|usage| Usage::read_body(usage, chunk, end))
            .unwrap_or_default();
        self.settle_known(host, ctx, found);
    }

    /// The request of these admissions ended (its context is gone) before their usage was
    /// settled (see [`Usage::at_end`]).
    pub(in crate::engine) fn usage_at_end(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        usage: Vec<Admitted>,
    ) {
        let found = Usage::at_end(&usage, &self.plugin.metrics);
        self.settle_known(host, ctx, found);
    }

    /// Settles the usages just learnt of `ctx`'s admissions, and forgets `ctx` if none is left
    /// to learn.
    fn settle_known(&mut self, host: &mut dyn Host, ctx: ContextId, found: Vec<Known>) {
        if self.requests.get(ctx).is_some_and(|r| r.usage().is_empty()) {
            self.requests.remove(ctx);
        }
        if found.is_empty() {
            return;
        }
        let now = self.timer.read(host);
        for k in found {
            self.settle_usage(host, k, now);
        }
        // The flush of a settlement kept pending, and the counts, need the tick.
        self.schedule(host, now, false);
    }

    /// What an admission of `rule` whose usage cannot be read is charged: the rule's
    /// `usage.unreadable`, or the largest usage this proxy read for the rule lately; never less
    /// than the `upfront` cost it paid.
    fn worst_case(&self, host: &dyn Host, rule: &RuleRef, upfront: u64, now: u64) -> u64 {
        let worst = match rule.usage.as_ref().map(|u| u.unreadable) {
            Some(WorstCase::Fixed(n)) => n,
            Some(WorstCase::Upfront) => upfront,
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
    fn settle_usage(&mut self, host: &mut dyn Host, k: Known, now: u64) {
        let Known {
            rule,
            key,
            limits,
            upfront,
            result,
            ..
        } = k;
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
                let worst = self.worst_case(host, &rule, upfront, now);
                m.count(rule.id(), why.counter(), 1);
                m.count(rule.id(), Counter::UsageWorstCase, 1);
                // A `charge_on` answer that never came (a client that hung up) is no fault of
                // the configuration or the upstream: counted, not logged.
                let expected =
                    rule.usage.as_ref().map(|u| u.unreadable) == Some(WorstCase::Upfront);
                if !expected && self.usage.first_unreadable() {
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
            m.count(rule.id(), Counter::UsageClamped, 1);
        }
        let s = match delta {
            0 => return,
            d if d > 0 => {
                m.count(rule.id(), Counter::UsageCharged, d.unsigned_abs());
                Settlement::Charge(d.unsigned_abs())
            }
            d => {
                m.count(rule.id(), Counter::UsageRefunded, d.unsigned_abs());
                let Some(stamp) = k.epoch else {
                    // Its take's reply said nothing of when the tokens were taken.
                    m.count(rule.id(), Counter::RefundDropped, d.unsigned_abs());
                    return;
                };
                Settlement::Refund(settle::Refund {
                    tokens: d.unsigned_abs(),
                    epoch: stamp.epoch,
                    mark: stamp.mark,
                })
            }
        };
        self.settle_pending(host, rule, &key, limits, s, now);
    }

    /// Settles `s` for `key` of `rule`: pending for the key (carried by its next call or its
    /// flush), or, when the shared table has no room for it, by a call now. The one path of
    /// every settlement: usage, and the refunds of requests that never went upstream.
    pub(in crate::engine) fn settle_pending(
        &mut self,
        host: &mut dyn Host,
        rule: RuleRef,
        key: &str,
        limits: Limits,
        s: Settlement,
        now: u64,
    ) {
        if !self.keep_pending(host, &rule, key, limits, s, now) {
            // No room in the shared table: settle this one now.
            let taken = match s {
                Settlement::Charge(charge) => settle::Taken {
                    charge,
                    ..settle::Taken::default()
                },
                Settlement::Refund(refund) => settle::Taken {
                    refund,
                    ..settle::Taken::default()
                },
            };
            self.send_settlement(host, rule, key, limits, taken, now);
        }
    }

    /// Adds `s` to `key`'s pending settlement and schedules its flush; false if the shared
    /// table has no room for the key.
    fn keep_pending(
        &mut self,
        host: &mut dyn Host,
        rule: &RuleRef,
        key: &str,
        limits: Limits,
        s: Settlement,
        now: u64,
    ) -> bool {
        let limit = settle_limit(widest_burst(rule, limits));
        let (store, ns) = (host.store(), &self.plugin.ns);
        let kept = match s {
            Settlement::Charge(tokens) => settle::add_charge(store, ns, key, tokens, limit),
            Settlement::Refund(refund) => {
                let added = settle::add_refund(store, ns, key, refund, limit);
                if let Ok(Some(dropped @ 1..)) = added {
                    let m = &self.plugin.metrics;
                    m.count(rule.id(), Counter::RefundDropped, dropped);
                }
                added.map(|a| a.is_some())
            }
        } == Ok(true);
        if kept {
            self.schedule_flush(rule.clone(), key.to_string(), limits, now);
        }
        kept
    }

    /// Flushes `key`'s pending settlement after the rule's `usage.flush_ms`, unless a call
    /// carries it first.
    fn schedule_flush(&mut self, rule: RuleRef, key: String, limits: Limits, now: u64) {
        let flush_ms = rule
            .usage
            .as_ref()
            .map_or(DEFAULT_USAGE_FLUSH_MS, |u| u.flush_ms);
        self.usage.flushes.push(Flush {
            due: now.saturating_add(flush_ms),
            rule,
            key,
            limits,
        });
    }

    fn send_settlement(
        &mut self,
        host: &mut dyn Host,
        rule: RuleRef,
        key: &str,
        limits: Limits,
        taken: settle::Taken,
        now: u64,
    ) {
        let mut call = ScriptCall {
            // Every call of a penalty rule carries it: a refund must not end a box.
            penalty: rule.penalty,
            ..ScriptCall::new(key.to_string(), &limits, 0)
        };
        carry_taken(&mut call, &taken);
        // A failure to send puts it back (`settlement_failed`).
        let _ = self.enqueue(host, Call::new(rule, call, Purpose::Settle, now));
    }

    /// Takes the part of `key`'s pending settlement (in the table, and a charge stranded in the
    /// worker) that a call under `limits` may carry (the script refuses more than
    /// [`MAX_SETTLE_BURSTS`] of its bursts, of a charge and of a refund); the rest stays pending,
    /// with a flush scheduled for it.
    pub(in crate::engine) fn carry_pending(
        &mut self,
        host: &mut dyn Host,
        rule: &RuleRef,
        key: &str,
        limits: Limits,
        now: u64,
    ) -> settle::Taken {
        let bound = settle_limit(limits.burst);
        let mut taken =
            settle::take_within(host.store(), &self.plugin.ns, key, bound).unwrap_or_default();
        // A charge stranded by a failed call goes with the table's, within the same bound.
        let room = bound.saturating_sub(taken.charge);
        let (stranded, left) = self.usage.stranded.take(key, room);
        taken.charge = taken.charge.saturating_add(stranded);
        taken.left |= left;
        if taken.left {
            self.schedule_flush(rule.clone(), key.to_string(), limits, now);
        }
        taken
    }

    /// `call` goes again after a failure that may have run its script: a refund it carries
    /// may have been given back already, so it goes without it, counted as dropped (a refund is
    /// given back only when its call certainly never ran).
    pub(in crate::engine) fn refund_may_have_run(&self, rule: &RuleRef, call: &mut ScriptCall) {
        if let Some(t) = call.track.as_mut().filter(|t| t.refund > 0) {
            let m = &self.plugin.metrics;
            m.count(rule.id(), Counter::RefundDropped, t.refund);
            t.refund = 0;
        }
    }

    /// A call of `rule` that carried a settlement failed. Its charge is pending again: in the
    /// settle table, or stranded in the worker when the table has no room for the key (never
    /// sent from here: with the breaker shut, that send would fail straight back here). Its
    /// refund is pending again only if the call certainly never ran (`may_have_run` false: it
    /// never left, or the backend refused it before the script ran) and the table has room for
    /// it; otherwise it is dropped and counted, since the script may have given it back already
    /// (a refund dropped only overcharges).
    pub(in crate::engine) fn settlement_failed(
        &mut self,
        host: &mut dyn Host,
        rule: &RuleRef,
        call: &ScriptCall,
        may_have_run: bool,
        now: u64,
    ) {
        let limits = call.limits();
        if let Ok(charge @ 1..) = u64::try_from(call.settle) {
            let kept = Settlement::Charge(charge);
            if !self.keep_pending(host, rule, &call.key, limits, kept, now) {
                self.strand(rule, &call.key, limits, charge, now);
            }
        }
        let Some(t) = call.track.filter(|t| t.refund > 0) else {
            return;
        };
        let refund = settle::Refund {
            tokens: t.refund,
            epoch: t.epoch,
            mark: t.mark,
        };
        let kept = Settlement::Refund(refund);
        if may_have_run || !self.keep_pending(host, rule, &call.key, limits, kept, now) {
            let m = &self.plugin.metrics;
            m.count(rule.id(), Counter::RefundDropped, t.refund);
        }
    }

    /// Keeps a failed call's `charge` for `key` in the worker (the settle table had no room for
    /// it), or one the previous engine held so, with the key's flush scheduled; past the
    /// worker's bound, drops it and counts it.
    pub(in crate::engine) fn strand(
        &mut self,
        rule: &RuleRef,
        key: &str,
        limits: Limits,
        charge: u64,
        now: u64,
    ) {
        let limit = settle_limit(widest_burst(rule, limits));
        if self.usage.stranded.keep(rule, key, limits, charge, limit) {
            self.schedule_flush(rule.clone(), key.to_string(), limits, now);
            return;
        }
        let m = &self.plugin.metrics;
        m.count(rule.id(), Counter::ChargeDropped, charge);
        if self.usage.first_dropped_charge() {
            log::warn!(
                "tollgate: rule {}: a failed call's usage charge of {charge} was dropped: the \
                 settle table and this worker's {} stranded charges are full (counted in \
                 charge_dropped; logged once per worker)",
                rule.name,
                super::stranded::MAX_KEYS
            );
        }
    }

    /// Flushes the settlements whose time is up and that no call has carried meanwhile (from the
    /// root context; while the breaker is open they wait another round).
    pub(in crate::engine) fn flush_settlements(&mut self, host: &mut dyn Host, now: u64) {
        while let Some(f) = self.usage.flushes.pop_due(now) {
            if self.breaker_refuses(host, now) {
                self.schedule_flush(f.rule, f.key, f.limits, now);
                break;
            }
            let pending = self.carry_pending(host, &f.rule, &f.key, f.limits, now);
            if !pending.is_empty() {
                self.send_settlement(host, f.rule, &f.key, f.limits, pending, now);
            }
        }
    }

    /// While the breaker is open no settlement can go out: every flush due before it would let a
    /// call through waits until then, so the tick fires once at that time instead of every
    /// millisecond (a flush the breaker refused would otherwise stay due, or come back after
    /// `flush_ms`). The settlements stay pending meanwhile (in shared data, or stranded in the
    /// worker); a call for the key still carries its own.
    pub(in crate::engine) fn defer_flushes_while_open(&mut self, host: &mut dyn Host, now: u64) {
        if self.usage.flushes.next_due().is_none_or(|due| due > now) {
            return;
        }
        let Some(until) = self.health(host.store()).open_until().filter(|t| *t > now) else {
            return;
        };
        // One flush per key is enough: it takes whatever the key has pending by then.
        self.usage.flushes.defer_until(until);
    }
}

/// The burst a key's pending sum is bounded by: calls of one key may carry different tiers'
/// limits, so the widest of them (a `free` admission's settlement never cuts a `pro` one's
/// charge).
fn widest_burst(rule: &RuleRef, limits: Limits) -> u64 {
    rule.tiers
        .as_ref()
        .map_or(limits.burst, |t| t.widest_burst().max(limits.burst))
}

/// The most one settlement may be, for a bucket of `burst`: what one script call may carry.
fn settle_limit(burst: u64) -> u64 {
    burst.saturating_mul(MAX_SETTLE_BURSTS)
}

/// One settlement for a key: a charge, or a refund with the spill epoch and mark of its take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) enum Settlement {
    Charge(u64),
    Refund(settle::Refund),
}

/// `call` carries `taken`: its charge as the settle argument, its refund (with its epoch and
/// mark) in the tracked form.
pub(in crate::engine) fn carry_taken(call: &mut ScriptCall, taken: &settle::Taken) {
    call.settle = i64::try_from(taken.charge).unwrap_or(i64::MAX);
    if taken.refund.tokens > 0 {
        call.track = Some(Tracked {
            refund: taken.refund.tokens,
            epoch: taken.refund.epoch,
            mark: taken.refund.mark,
        });
    }
}
