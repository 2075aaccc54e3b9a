//! Exact checks of any key, shared across the proxy's workers: a worker whose open batch would
//! leave while another worker (the collector) has a flight of its open batch out relays its checks
//! to that worker instead, so they ride the collector's next flight with its own, and the
//! collector answers each on the relaying worker's queue. A proxy then has one batched flight
//! out, not one per worker, and each carries the checks of every worker.
//!
//! Invariant: a relayed check waits at most for the collector's flight out and its own, as in
//! the worker's own open batch (the collector's open batch leaves when that flight is answered,
//! or at the end of the round of events that brought the relay when none is out). Only a check with
//! nothing to settle is relayed, so a relay that is lost loses no usage; a relayed check is
//! remembered until its answer comes or its patience runs out, and then gets its failure mode,
//! never a second call.

use super::super::calls::{Call, Purpose};
use super::super::host::Host;
use super::super::verdict::Outcome;
use super::super::Engine;
use super::chains::Forwarded;
use super::wire::{self, Told};
use crate::backend::{BackendError, Reply};
use crate::metrics::{Counter, Metrics};
use crate::shared::collect::Collector;

/// How many backend timeouts a relayed check waits for its answer: the collector's flight out
/// and then its own, each at most four (the flight, the NOSCRIPT resend, and a Redis Cluster's
/// resend by slot and then key by key). Past that its call is taken as lost.
const RELAY_PATIENCE_TIMEOUTS: u64 = 8;

/// Whether `c` may ride another worker's flight: a check's own call with nothing to settle (a
/// charge, or a refund: a relay carries neither) and no lease, whose key fits on one line of a
/// message.
fn relayable(c: &Call) -> bool {
    matches!(c.purpose, Purpose::Check { .. })
        && !c.call.settles()
        && c.call.lease_want == 0
        && c.call.holder.is_none()
        && !c.call.key.as_bytes().contains(&b'\n')
}

impl Engine {
    /// Relays what of `calls` may ride the collector's next flight, if another worker collects;
    /// gives back the calls this worker sends itself (all of them if none was relayed).
    pub(in crate::engine) fn relay(
        &mut self,
        host: &mut dyn Host,
        calls: Vec<Call>,
        now: u64,
    ) -> Vec<Call> {
        let Some(me) = self.chains.lane() else {
            return calls;
        };
        // `batch_max_keys: 1`: every call in a flight of its own, as before batching.
        if self.batch_max_keys() <= 1 || !calls.iter().any(relayable) {
            return calls;
        }
        let collector = Collector::new(host.store(), &self.plugin.ns).get();
        let Some(to) = collector.filter(|q| *q != me) else {
            return calls;
        };
        let mut message = wire::relay_head(me);
        // Numbered as `forwarded` numbers them below, in the same order.
        let asks = self.chains.next_ask()..;
        for (ask, c) in asks.zip(calls.iter().filter(|c| relayable(c))) {
            wire::push_relayed(&mut message, ask, c.rule.id(), &c.call);
        }
        if !host.enqueue(to, &message) {
            // The collector is gone: this worker sends, and may collect in its place.
            let _ = Collector::new(host.store(), &self.plugin.ns).release(to);
            return calls;
        }
        let due = now.saturating_add(
            self.plugin
                .config
                .backend
                .timeout_ms
                .saturating_mul(RELAY_PATIENCE_TIMEOUTS),
        );
        let mut kept = Vec::new();
        for c in calls {
            match c.purpose {
                Purpose::Check { ctx, check } if relayable(&c) => {
                    let rule_id = c.rule.id();
                    let relayed = Forwarded {
                        ctx,
                        check,
                        leader: to,
                        rule: c.rule,
                        call: c.call,
                        relayed: true,
                    };
                    self.chains.forwarded(relayed, due, false);
                    self.plugin.metrics.count(rule_id, Counter::Relayed, 1);
                }
                _ => kept.push(c),
            }
        }
        kept
    }

    /// Checks another worker relayed here: each joins this worker's open batch, its answer going
    /// to `queue`. One whose rule this configuration lacks (another configuration's worker), or
    /// that finds this worker at `max_inflight`, is not taken: nothing ran for it, so its own
    /// worker sends it.
    pub(in crate::engine) fn take_relay(
        &mut self,
        host: &mut dyn Host,
        queue: u32,
        checks: Vec<wire::Relayed>,
        now: u64,
    ) {
        for r in checks {
            let Some(rule) = self.plugin.rule_of_key(r.rule, &r.call.key) else {
                self.answers.tell(queue, r.ask, Told::NotTaken);
                continue;
            };
            let purpose = Purpose::Relayed { queue, ask: r.ask };
            if self
                .enqueue(host, Call::new(rule, r.call, purpose, now))
                .is_err()
            {
                self.answers.tell(queue, r.ask, Told::NotTaken);
            }
        }
    }

    /// The answer to a check relayed here (its reply, or the failure of its call): the outcome
    /// goes back to the worker that relayed it, at the end of this event.
    pub(in crate::engine) fn relayed_answer(
        &mut self,
        host: &mut dyn Host,
        c: &Call,
        (queue, ask): (u32, u64),
        reply: Option<&Reply>,
    ) {
        let outcome: Option<Outcome> =
            reply.map(|r| self.reply_outcome(host, &c.rule, &c.call, r, c.sent_ms));
        self.answers.add(queue, ask, outcome);
    }

    /// A check the collector did not take: it goes in a flight of this worker's own, now.
    pub(super) fn send_own(&mut self, host: &mut dyn Host, f: Forwarded, now: u64) {
        let (ctx, check) = (f.ctx, f.check);
        if self.requests.is_waiting(ctx, check) {
            let own = Call::new(f.rule, f.call.clone(), Purpose::Check { ctx, check }, now);
            match self.send(host, own) {
                Ok(()) => return,
                Err((e, _)) => self.fail_check(host, ctx, check, &e, now),
            }
        }
        self.own_call_over(host, &f.call, now);
    }

    /// A relayed check the collector did not answer in time: its failure mode, and the
    /// collector is forgotten (this worker sends its next batch itself).
    pub(super) fn relay_lost(&mut self, host: &mut dyn Host, f: Forwarded, now: u64) {
        let _ = Collector::new(host.store(), &self.plugin.ns).release(f.leader);
        self.fail_check(host, f.ctx, f.check, &BackendError::Reset, now);
        self.own_call_over(host, &f.call, now);
    }

    /// A flight of checks that gathered behind this worker's flight went out: this worker
    /// collects the proxy's checks, if no other worker does.
    pub(in crate::engine) fn collect(&mut self, host: &mut dyn Host) {
        if self.collecting {
            return;
        }
        if let Some(me) = self.chains.lane() {
            let claimed = Collector::new(host.store(), &self.plugin.ns).claim(me);
            self.collecting = claimed.unwrap_or(false);
        }
    }

    /// No flight of the open batch is out any more: the other workers send their own.
    pub(in crate::engine) fn stop_collecting(&mut self, host: &mut dyn Host) {
        if !self.collecting || self.calls.batched_out() {
            return;
        }
        self.collecting = false;
        if let Some(me) = self.chains.lane() {
            let _ = Collector::new(host.store(), &self.plugin.ns).release(me);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ScriptCall;
    use crate::bucket::{Limits, Tracked};
    use crate::config::Config;
    use crate::engine::ids::{CheckId, ContextId};
    use crate::engine::rules::Rules;

    #[test]
    fn a_check_that_carries_a_settlement_is_never_relayed() {
        let config =
            Config::try_from(&br#"{"rules":[{"name":"r","key":["header:x-user"],"rate":10}]}"#[..])
                .unwrap();
        let rules = Rules::new(&config.rules);
        let limits = Limits {
            burst: 10,
            rate: 10,
            period_ms: 1000,
        };
        let check = |call: ScriptCall| {
            let purpose = Purpose::Check {
                ctx: ContextId::from(1),
                check: CheckId::at(0),
            };
            Call::new(rules.iter().next().unwrap().clone(), call, purpose, 0)
        };
        let plain = ScriptCall::new("k".into(), &limits, 1);
        assert!(relayable(&check(plain.clone())));
        let mut refund = plain.clone();
        refund.track = Some(Tracked {
            refund: 3,
            epoch: 1,
            mark: 1,
        });
        assert!(
            !relayable(&check(refund)),
            "the relay would lose the refund"
        );
        let mut charge = plain;
        charge.settle = 5;
        assert!(!relayable(&check(charge)));
    }
}
