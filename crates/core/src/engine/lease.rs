//! Lease waits: lease checks that found no leased token wait per key for the proxy's one lease
//! call on that key.
//!
//! A lease call asks for its whole lease as the script's cost, with a wait (`max_wait_ms`): when
//! the global bucket holds less, the script reserves the rest from its refill, and the proxy
//! spends those tokens as they refill (see `shared::lease`). While its reservation refills, the
//! proxy makes no other call for the key: requests it cannot serve yet get a 429 at once. So a
//! saturated key's proxies take turns in the order they asked, each call bringing a whole
//! reservation, and no refill waits in the bucket for a call to fetch it.
//!
//! Invariant: a key's waiters are served when something can change their answer — this worker's
//! call for the key is answered, or (polled each millisecond, read-only) another worker's call
//! for it ends or its tokens land in the shared pool — in arrival order, never by scanning every
//! waiter. Every claim taken for a lease call is ended (deposit or release) on every path: answer,
//! error, failed dispatch or resend, or the carrying context going away.

use std::collections::{HashMap, HashSet, VecDeque};

use super::{Call, Engine, Host, Outcome, Purpose};
use crate::backend::{BackendError, Reply, ScriptCall};
use crate::bucket::{Holder, Limits, MAX_HOLD_MS};
use crate::config::Rule;
use crate::metrics::{Counter, Metrics};
use crate::shared::deny::DenyCache;
use crate::shared::lease::{Claim, Flight, Grant, LeasePool, Sizing, Take};

/// One waiting check.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    ctx: u32,
    idx: usize,
    cost: u64,
}

/// Where the key's lease call stands, from this worker's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No call out: the next waiter starts one.
    Idle,
    /// This worker's call is out; its answer serves the queue.
    Own,
    /// Another worker's call is out; polled until it ends.
    Foreign,
    /// No call could be kept (its NOSCRIPT resend failed): the next tick starts one.
    Lost,
}

#[derive(Debug)]
struct Queue {
    rule: usize,
    /// The key's effective limits.
    limits: Limits,
    waiters: VecDeque<Waiter>,
    state: State,
}

/// The lease waits of one worker.
#[derive(Debug, Default)]
pub(super) struct Queues {
    /// By bucket key (a digest no client chooses bits of: the fast seeded hash is safe here).
    by_key: HashMap<String, Queue, crate::rule::hash::Seeded>,
    /// Keys in `Foreign` or `Lost` state (polled by the tick).
    polled: HashSet<String, crate::rule::hash::Seeded>,
    /// (deadline, ctx, check) in arrival order; deadlines are arrival + a constant patience, so
    /// the front is always the nearest.
    patience: VecDeque<(u64, u32, usize)>,
}

impl Queues {
    pub(super) fn waiters(&self) -> usize {
        self.by_key.values().map(|q| q.waiters.len()).sum()
    }

    pub(super) fn patience_front(&self) -> Option<(u32, usize)> {
        self.patience.front().map(|(_, ctx, idx)| (*ctx, *idx))
    }

    pub(super) fn pop_patience(&mut self) {
        self.patience.pop_front();
    }

    /// The nearest time the tick must look at lease waits.
    pub(super) fn next_due(&self, now: u64) -> Option<u64> {
        let poll = (!self.polled.is_empty()).then_some(now.saturating_add(1));
        let patience = self.patience.front().map(|(due, _, _)| *due);
        match (poll, patience) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn set_state(&mut self, key: &str, state: State) {
        if let Some(q) = self.by_key.get_mut(key) {
            q.state = state;
        }
        if matches!(state, State::Foreign | State::Lost) {
            self.polled.insert(key.to_string());
        } else {
            self.polled.remove(key);
        }
    }

    /// The call for `key` will never be answered here.
    pub(super) fn flight_lost(&mut self, key: &str) {
        if self.by_key.contains_key(key) {
            self.set_state(key, State::Lost);
        }
    }

    /// Removes every waiter of `ctx` on `key`.
    pub(super) fn remove_waiter(&mut self, key: &str, ctx: u32) {
        if let Some(q) = self.by_key.get_mut(key) {
            q.waiters.retain(|w| w.ctx != ctx);
        }
        self.forget_if_idle(key);
    }

    fn forget_if_idle(&mut self, key: &str) {
        if self
            .by_key
            .get(key)
            .is_some_and(|q| q.waiters.is_empty() && q.state == State::Idle)
        {
            self.by_key.remove(key);
            self.polled.remove(key);
        }
    }

    /// What `key`'s waiters need, in order.
    fn costs(&self, key: &str) -> Vec<u64> {
        self.by_key
            .get(key)
            .map(|q| q.waiters.iter().map(|w| w.cost).collect())
            .unwrap_or_default()
    }

    fn drain(&mut self, key: &str) -> Vec<Waiter> {
        let out = self
            .by_key
            .get_mut(key)
            .map(|q| q.waiters.drain(..).collect())
            .unwrap_or_default();
        self.forget_if_idle(key);
        out
    }
}

/// Lease sizing for `rule` on a key with `limits` (the rule's, or an override's).
pub(super) fn sizing(rule: &Rule, limits: &Limits) -> Sizing {
    Sizing {
        burst: limits.burst,
        rate: limits.rate,
        period_ms: limits.period_ms,
        lease_max: rule.lease_max.min(limits.burst),
        horizon_ms: rule.lease_horizon_ms,
    }
}

impl Engine {
    /// Lease check `idx` of `ctx` found no leased token: it waits for its key's lease call,
    /// starting one if none is out.
    pub(super) fn wait_for_lease(&mut self, host: &mut dyn Host, ctx: u32, idx: usize, now: u64) {
        let Some((rule, call)) = self.check_call(ctx, idx) else {
            return;
        };
        let patience = self.plugin.config.backend.timeout_ms.saturating_mul(2);
        let queues = &mut self.queues;
        let q = queues.by_key.entry(call.key.clone()).or_insert(Queue {
            rule,
            limits: call.limits(),
            waiters: VecDeque::new(),
            state: State::Idle,
        });
        q.waiters.push_back(Waiter {
            ctx,
            idx,
            cost: call.cost,
        });
        let idle = q.state == State::Idle;
        queues
            .patience
            .push_back((now.saturating_add(patience), ctx, idx));
        if idle {
            self.kick(host, &call.key, now);
        }
    }

    /// Starts the lease call for `key`'s waiters, if this proxy has none out. Any callback can:
    /// the host owns every callout on the root context.
    fn kick(&mut self, host: &mut dyn Host, key: &str, now: u64) {
        let Some(q) = self.queues.by_key.get(key) else {
            return;
        };
        let Some(first) = q.waiters.front().map(|w| w.cost) else {
            self.queues.set_state(key, State::Idle);
            self.queues.forget_if_idle(key);
            return;
        };
        let rule_idx = q.rule;
        let unmet = self.unmet.remove(key).unwrap_or(0);
        let waiting = q
            .waiters
            .iter()
            .map(|w| w.cost)
            .fold(0, u64::saturating_add);
        let Some(rule) = self.plugin.rule(rule_idx) else {
            return;
        };
        let limits = q.limits;
        let sizing = sizing(rule, &limits);
        if !self.backend_allowed(host, now) {
            self.fail_waiters(host, key, &BackendError::CircuitOpen, now);
            return;
        }
        let until = self.claim_until(now);
        let pool = LeasePool::new(host.store(), &self.plugin.ns);
        // Without a holder id no lease could be counted as held: exact calls instead.
        let flight = pool.holder_id().and_then(|id| {
            let (flight, want) = pool.begin_flight(key, waiting, unmet, now, until, &sizing)?;
            Ok((flight, want, id))
        });
        match flight {
            Ok((Flight::Claimed(claim, placed), want, holder_id)) => {
                let m = &self.plugin.metrics;
                m.count(rule_idx, Counter::LeaseEvicted, placed.evicted);
                m.count(rule_idx, Counter::LeaseDropped, placed.dropped);
                // The call needs what the first waiter needs, and asks for the whole lease with a
                // wait: what the bucket lacks of it is reserved from its refill (and becomes
                // spendable as it refills). It names this proxy as the holder, with what it still
                // holds, so the script counts held tokens against the bucket's capacity.
                let steps: Vec<(u64, u64)> = claim
                    .report()
                    .iter()
                    .map(|&(held, quiet)| (held, quiet.min(MAX_HOLD_MS)))
                    .collect();
                let holder = Holder::new(holder_id, claim.seq(), self.hold_ms(&sizing), &steps);
                let call = ScriptCall {
                    lease_want: want.max(first),
                    max_wait_ms: sizing.max_wait_ms(),
                    holder: Some(Box::new(holder)),
                    ..ScriptCall::new(key.to_string(), &limits, first)
                };
                self.queues.set_state(key, State::Own);
                let purpose = Purpose::Lease(claim);
                if let Err((e, purpose)) = self.send(host, Call::new(rule_idx, call, purpose, now))
                {
                    self.end_claim(host, purpose, now);
                    self.queues.set_state(key, State::Idle);
                    self.fail_waiters(host, key, &e, now);
                }
            }
            Ok((Flight::Busy, ..)) => {
                self.unmet.insert(key.to_string(), unmet);
                self.queues.set_state(key, State::Foreign);
            }
            Ok((Flight::Refilling(retry_ms), ..)) => {
                self.unmet.insert(key.to_string(), unmet);
                self.queues.set_state(key, State::Idle);
                self.deny_waiters(host, key, retry_ms);
            }
            // No slot for this key (or shared data failing): its waiters go to Redis one by one.
            Ok((Flight::NoSlot, ..)) | Err(_) => {
                self.queues.set_state(key, State::Idle);
                for w in self.queues.drain(key) {
                    self.send_check(host, w.ctx, w.idx, now);
                }
            }
        }
    }

    /// Until when a lease call sent now keeps its claim: a little past the call's own timeout, so
    /// a lost answer frees it.
    pub(super) fn claim_until(&self, now: u64) -> u64 {
        now.saturating_add(self.plugin.config.backend.timeout_ms)
            .saturating_add(50)
    }

    /// How long, after a grant's reservation has refilled, the script must count it as held by
    /// this proxy: the lease's two horizons, measured here from the answer, which comes at most a
    /// call timeout after the script ran; and a second of slack.
    fn hold_ms(&self, sizing: &Sizing) -> u64 {
        sizing
            .horizon_ms
            .saturating_mul(2)
            .saturating_add(self.plugin.config.backend.timeout_ms)
            .saturating_add(1000)
            .min(MAX_HOLD_MS)
    }

    /// Every waiter on `key` gets a 429: this proxy's reservation covers them only later.
    fn deny_waiters(&mut self, host: &mut dyn Host, key: &str, retry_ms: u64) {
        for w in self.queues.drain(key) {
            self.settle(host, w.ctx, w.idx, Outcome::Denied { retry_ms });
        }
    }

    /// Ends a lease claim that brought no tokens.
    fn end_claim(&self, host: &mut dyn Host, purpose: Purpose, now: u64) {
        if let Purpose::Lease(claim) = purpose {
            let _ = LeasePool::new(host.store(), &self.plugin.ns).release(claim, None, now);
        }
    }

    /// The answer to this worker's lease call on `claim`'s key.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn lease_answer(
        &mut self,
        host: &mut dyn Host,
        rule_idx: usize,
        claim: Claim,
        asked: &ScriptCall,
        (reply, sent_ms): (Result<Reply, BackendError>, u64),
        now: u64,
    ) {
        let key = claim.key().to_string();
        let Some(rule) = self.plugin.rule(rule_idx) else {
            self.end_claim(host, Purpose::Lease(claim), now);
            return;
        };
        let sizing = sizing(rule, &asked.limits());
        let store = host.store();
        let pool = LeasePool::new(store, &self.plugin.ns);
        let m = &self.plugin.metrics;
        let mut taken = None;
        match reply {
            Ok(r) if r.allowed => {
                // Never more than asked for: a garbled reply must not mint tokens.
                let granted = r.granted.min(asked.lease_want.max(asked.cost));
                m.count(rule_idx, Counter::LeaseGranted, granted);
                // A wait means a reservation: the bucket is refilling part of the grant until
                // then (the key is saturated); those tokens are spent as they refill.
                let grant = Grant {
                    tokens: granted,
                    global_remaining: r.remaining,
                    reset_after_ms: r.reset_after_ms,
                    refill_ms: u64::try_from(r.retry_after_ms).unwrap_or(0),
                };
                let costs = self.queues.costs(&key);
                if let Ok((d, take)) = pool.deposit(claim, &grant, &costs, now, &sizing) {
                    m.count(rule_idx, Counter::LeaseDropped, d.dropped);
                    m.count(rule_idx, Counter::LeaseEvicted, d.evicted);
                    taken = Some(take);
                }
            }
            Ok(r) => {
                // Not even a reservation within the wait: the key is denied here until one could
                // be made.
                let retry = u64::try_from(r.retry_after_ms).unwrap_or(r.reset_after_ms);
                let until = sent_ms.saturating_add(retry.max(1));
                let _ = DenyCache::new(store, &self.plugin.ns).remember(&key, 1, until);
                let _ = pool.release(claim, Some(r.remaining), now);
            }
            Err(e) => {
                let _ = pool.release(claim, None, now);
                self.queues.set_state(&key, State::Idle);
                self.fail_waiters(host, &key, &e, now);
                return;
            }
        }
        self.queues.set_state(&key, State::Idle);
        self.serve(host, &key, taken, now);
    }

    /// Serves `key`'s waiters from the pool and the deny cache, in order; starts another lease
    /// call for those still waiting. `taken`: what the waiters already spent, in order (when
    /// the answer's deposit did it); None takes from the pool here.
    fn serve(&mut self, host: &mut dyn Host, key: &str, taken: Option<Take>, now: u64) {
        let Some(q) = self.queues.by_key.get(key) else {
            return;
        };
        let rule_idx = q.rule;
        let Some(sizing) = self.plugin.rule(rule_idx).map(|r| sizing(r, &q.limits)) else {
            return;
        };
        let store = host.store();
        let take = taken.unwrap_or_else(|| {
            let costs = self.queues.costs(key);
            LeasePool::new(store, &self.plugin.ns)
                .take(key, &costs, now, &sizing)
                .unwrap_or_default()
        });
        self.plugin
            .metrics
            .count(rule_idx, Counter::LeaseDropped, take.dropped);
        let deny = DenyCache::new(store, &self.plugin.ns);
        let mut settled = Vec::new();
        if let Some(q) = self.queues.by_key.get_mut(key) {
            for s in &take.spent {
                let Some(w) = q.waiters.pop_front() else {
                    break;
                };
                let outcome = Outcome::Allowed {
                    remaining: s.remaining,
                    reset_ms: s.reset_ms,
                };
                settled.push((w, outcome));
            }
            q.waiters.retain(|w| match deny.denied(key, w.cost, now) {
                Some(retry_ms) => {
                    settled.push((*w, Outcome::Denied { retry_ms }));
                    false
                }
                None => true,
            });
        }
        for (w, outcome) in settled {
            self.settle(host, w.ctx, w.idx, outcome);
        }
        let still_waiting = self
            .queues
            .by_key
            .get(key)
            .is_some_and(|q| !q.waiters.is_empty() && q.state == State::Idle);
        if !still_waiting {
            self.queues.forget_if_idle(key);
            return;
        }
        let pool = LeasePool::new(host.store(), &self.plugin.ns);
        if let Some(retry_ms) = pool.refilling(key, now, &sizing) {
            // This proxy's reservation covers them only later: no second call meanwhile.
            self.deny_waiters(host, key, retry_ms);
        } else {
            self.kick(host, key, now);
        }
    }
    /// Every waiter on `key` gets the failure mode for `err`.
    pub(super) fn fail_waiters(
        &mut self,
        host: &mut dyn Host,
        key: &str,
        err: &BackendError,
        now: u64,
    ) {
        for w in self.queues.drain(key) {
            self.fail_check(host, w.ctx, w.idx, err, now);
        }
    }

    /// Waiters whose patience ran out get the failure mode (their call was lost somewhere).
    pub(super) fn expire_waiters(&mut self, host: &mut dyn Host, now: u64) {
        while let Some(&(due, ctx, idx)) = self.queues.patience.front() {
            if due > now {
                break;
            }
            self.queues.patience.pop_front();
            if !self.is_waiting(ctx, idx) {
                continue;
            }
            if let Some((_, call)) = self.check_call(ctx, idx) {
                self.queues.remove_waiter(&call.key, ctx);
            }
            self.fail_check(host, ctx, idx, &BackendError::Reset, now);
        }
    }

    /// Keys waiting on another worker's call, or on a lost one: serve them once that call has
    /// ended or its tokens are in the pool (reads only, unless there is something to take).
    pub(super) fn poll_leases(&mut self, host: &mut dyn Host, now: u64) {
        let keys: Vec<String> = self.queues.polled.iter().cloned().collect();
        for key in keys {
            let Some(q) = self.queues.by_key.get(&key) else {
                self.queues.polled.remove(&key);
                continue;
            };
            let ready = match q.state {
                State::Lost => true,
                State::Foreign => {
                    let first = q.waiters.front().map_or(1, |w| w.cost);
                    let sizing = self.plugin.rule(q.rule).map(|r| sizing(r, &q.limits));
                    LeasePool::new(host.store(), &self.plugin.ns)
                        .peek(&key)
                        .is_none_or(|l| {
                            l.flight_until_ms <= now
                                || sizing.is_some_and(|s| l.spendable(now, &s) >= first)
                        })
                }
                State::Idle | State::Own => false,
            };
            if ready {
                self.queues.set_state(&key, State::Idle);
                self.serve(host, &key, None, now);
            }
        }
    }
}
