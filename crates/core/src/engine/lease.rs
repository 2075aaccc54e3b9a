//! Lease waits: lease checks that found no leased token wait per key for the proxy's one lease
//! call on that key.
//!
//! A lease call asks for its whole lease as the script's cost, with a wait (`max_wait_ms`): when
//! the global bucket holds less, the script reserves the rest from its refill, and the proxy
//! spends those tokens as they refill (see `shared::lease`). While its reservation refills, the
//! proxy makes no other call for the key: requests it cannot serve yet get a 429 at once, unless
//! the rule holds requests (`max_wait_ms`) and the reservation brings their tokens within that
//! wait: then each takes the next token to refill and is let through when it has. So a saturated
//! key's proxies take turns in the order they asked, each call bringing a whole reservation, and
//! no refill waits in the bucket for a call to fetch it. On a key with so many holders that a
//! share is under `bucket::RACE_SHARE` tokens the script reserves nothing: a call takes what the
//! bucket holds, and one that emptied it, or was denied, holds the key here (deny cache) for
//! a horizon at least rather than calling for each token as it refills; a grant on a key short of
//! tokens says when the proxy's next turn is (its part of the rate by demand), and the key is
//! held here until then. Each call gives back the
//! tokens the proxy dropped unspent since its last one, and reports the proxy's demand for the
//! key since then, which weighs its share of the key's burst (`bucket::share`): a busy proxy
//! among many quiet ones holds a lease's worth, not burst ÷ holders. A proxy quiet on a key
//! (it holds none of it, and has had no other request of it within about a lease's life) makes
//! no lease call: its request is checked exactly, so it is not on record as a holder and the
//! key's shares are those of the proxies that spend leases; unless the key was short of tokens
//! lately, where holders are served in turns and an exact check would find it empty.
//!
//! Invariant: a key's waiters are served when something can change their answer — this worker's
//! call for the key is answered, or (polled each millisecond, read-only) another worker's call
//! for it ends or its tokens land in the shared pool — in arrival order, never by scanning every
//! waiter. A waiter's patience bounds its wait for a call that may never come or was lost: one
//! this worker sends for the key makes its waiters patient from the send (within twice their
//! patience from arrival), so such a call's answer or timeout ends their wait, not a deadline set
//! while they waited on another worker's call. Every claim taken for a lease call is ended
//! (deposit or release) on every path: answer, error, failed dispatch or resend, or the carrying
//! context going away.

mod waits;

pub(super) use waits::Waits;
use waits::{Head, State, Waiter};

use super::calls::{Call, Purpose};
use super::decision::By;
use super::host::Host;
use super::ids::{CheckId, ContextId};
use super::rules::{RuleId, RuleRef};
use super::verdict::Outcome;
use super::Engine;
use crate::backend::{BackendError, Reply, ScriptCall};
use crate::bucket::{Holder, Limits, MAX_HOLD_MS};
use crate::config::{Mode, Rule};
use crate::metrics::{Counter, Metrics};
use crate::shared::deny::DenyCache;
use crate::shared::lease::{Back, Claim, Flight, Grant, LeasePool, Sizing, Take};

/// A lease call keeps its claim this long past the call's own timeout, so a lost answer frees it.
const CLAIM_SLACK_MS: u64 = 50;
/// Slack on how long the script counts a grant as held by this proxy.
const HOLD_SLACK_MS: u64 = 1000;
/// The longest a racer's turn keeps its key denied here (the script's turn may be longer for a
/// proxy with a sliver of the key's demand).
const MAX_TURN_MS: u64 = 10_000;

/// Lease sizing for `rule` on a key with `limits` (the rule's, an override's or a tier's).
pub(super) fn sizing(rule: &Rule, limits: &Limits) -> Sizing {
    Sizing {
        burst: limits.burst,
        rate: limits.rate,
        period_ms: limits.period_ms,
        lease_max: rule.lease_max.min(limits.burst),
        horizon_ms: rule.lease_horizon_ms,
        // A shadow rule never holds a request.
        hold_ms: if rule.shadow { 0 } else { rule.max_wait_ms },
    }
}

/// A worker's batch of `key` (of rule `rule`) goes back to the proxy's pool; what the pool drops
/// of it (its lease expired, or the store failed) is counted.
pub(super) fn give_back(
    pool: &LeasePool,
    metrics: &dyn Metrics,
    (rule, key, back): (RuleId, &str, Back),
    now: u64,
) {
    let dropped = pool.take_back(key, back, now).unwrap_or(back.unspent);
    metrics.count(rule, Counter::LeaseDropped, dropped);
}

impl Engine {
    /// Lease check `check` of `ctx` found no leased token: it waits for its key's lease call,
    /// starting one if none is out.
    pub(super) fn wait_for_lease(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        check: CheckId,
        now: u64,
    ) {
        let Some(c) = self.requests.waiting(ctx, check) else {
            return;
        };
        let waiter = Waiter {
            ctx,
            check,
            cost: c.call.cost,
        };
        let due = now.saturating_add(self.plugin.patience_ms());
        let key = c.call.key.clone();
        if self
            .waits
            .add(&key, (&c.rule, c.call.limits()), waiter, due)
        {
            self.kick(host, &key, now);
        }
    }

    /// Starts the lease call for `key`'s waiters, if this proxy has none out. Any callback can:
    /// the host owns every callout on the root context.
    fn kick(&mut self, host: &mut dyn Host, key: &str, now: u64) {
        let Some(Head {
            rule,
            limits,
            first,
            waiting,
        }) = self.waits.head(key)
        else {
            return;
        };
        let unmet = self.waits.take_unmet(key);
        let sizing = sizing(&rule, &limits);
        // The lease call claims the half-open probe when it goes out (`send`).
        if self.breaker_refuses(host, now) {
            self.fail_waiters(host, key, &BackendError::CircuitOpen, now);
            return;
        }
        let until = self.claim_until(now);
        let pool = LeasePool::new(host.store(), &self.plugin.ns);
        // A proxy quiet on the key checks its waiters exactly: one call each, as a lease call
        // would be, without a holder record diluting the shares of the proxies that spend leases.
        if pool.check_quietly(key, waiting, unmet, now, &sizing) == Ok(true) {
            self.waits.set_state(key, State::Idle);
            for w in self.waits.drain(key) {
                self.send_check(host, w.ctx, w.check, now);
            }
            return;
        }
        // Without a holder id no lease could be counted as held: exact calls instead.
        let flight = pool.holder_id().and_then(|id| {
            let (flight, want) = pool.begin_flight(key, waiting, unmet, now, until, &sizing)?;
            Ok((flight, want, id))
        });
        match flight {
            Ok((Flight::Claimed(claim, placed), want, holder_id)) => {
                let m = &self.plugin.metrics;
                m.count(rule.id(), Counter::LeaseEvicted, placed.evicted);
                m.count(rule.id(), Counter::LeaseDropped, placed.dropped);
                // The call needs what the first waiter needs, and asks for the whole lease with a
                // wait: what the bucket lacks of it is reserved from its refill (and becomes
                // spendable as it refills). It names this proxy as the holder, with what it still
                // holds, so the script counts held tokens against the bucket's capacity.
                let steps: Vec<(u64, u64)> = claim
                    .report()
                    .iter()
                    .map(|&(held, quiet)| (held, quiet.min(MAX_HOLD_MS)))
                    .collect();
                let holder = Holder::new(
                    holder_id,
                    claim.seq(),
                    self.hold_ms(claim.life_ms()),
                    &steps,
                )
                .giving_back(claim.back());
                // Its demand weighs its share of the key (unknown on its first call).
                let holder = match claim.demand() {
                    Some(d) => holder.demanding(d),
                    None => holder,
                };
                let call = ScriptCall {
                    lease_want: want.max(first),
                    max_wait_ms: sizing.max_wait_ms(),
                    holder: Some(Box::new(holder)),
                    ..ScriptCall::new(key.to_string(), &limits, first)
                };
                self.waits.set_state(key, State::Own);
                let purpose = Purpose::Lease(claim);
                match self.send(host, Call::new(rule, call, purpose, now)) {
                    Ok(()) => self.lease_sent(key, now),
                    Err((e, purpose)) => {
                        self.end_claim(host, purpose, now);
                        self.waits.set_state(key, State::Idle);
                        self.fail_waiters(host, key, &e, now);
                    }
                }
            }
            Ok((Flight::Busy, ..)) => {
                self.waits.keep_unmet(key, unmet);
                self.waits.set_state(key, State::Foreign);
            }
            Ok((Flight::Refilling(retry_ms), ..)) => {
                self.waits.keep_unmet(key, unmet);
                self.waits.set_state(key, State::Idle);
                self.deny_waiters(host, key, retry_ms);
            }
            // No slot for this key (or shared data failing): its waiters go to Redis one by one.
            Ok((Flight::NoSlot, ..)) | Err(_) => {
                self.waits.set_state(key, State::Idle);
                for w in self.waits.drain(key) {
                    self.send_check(host, w.ctx, w.check, now);
                }
            }
        }
    }

    /// The answer to an exact check of a lease rule's key: one that left the key with fewer
    /// tokens than the check needed, or under half its burst, says the key is short of them, and
    /// the proxy leases it rather than check it exactly for a while
    /// (`LeasePool::check_quietly`). Only then is shared data touched (a flood of new keys never
    /// is).
    pub(super) fn exact_answered(
        &self,
        host: &dyn Host,
        (rule, call): (&RuleRef, &ScriptCall),
        r: &Reply,
        now: u64,
    ) {
        if rule.mode != Mode::Lease {
            return;
        }
        // Less than half the burst left: the key is short, and with many holders they race
        // in turns (paced, see `lease_answer`): an exact check would take each token as it
        // refills, one call each, outside the turns.
        let low = r.remaining.saturating_mul(2) < call.limits().burst;
        if r.remaining < call.cost || low {
            let pool = LeasePool::new(host.store(), &self.plugin.ns);
            let _ = pool.note_short(&call.key, if low { 0 } else { r.remaining }, now);
        }
    }

    /// This worker's lease call for `key` went out at `now`: its answer or its timeout ends the
    /// waits on it, so they are patient from now, not from their arrival, which may be a wait on
    /// another worker's call ago ([`Waits::sent`]). The patience, two timeouts, covers the call
    /// and its NOSCRIPT resend, which goes out within the first timeout.
    pub(super) fn lease_sent(&mut self, key: &str, now: u64) {
        let due = now.saturating_add(self.plugin.patience_ms());
        self.waits.sent(key, now, due);
    }

    /// Until when a lease call sent now keeps its claim: a little past the call's own timeout, so
    /// a lost answer frees it.
    pub(super) fn claim_until(&self, now: u64) -> u64 {
        now.saturating_add(self.plugin.config.backend.timeout_ms)
            .saturating_add(CLAIM_SLACK_MS)
    }

    /// How long, after a grant's reservation has refilled, the script must count it as held by
    /// this proxy: the lease's life (`life_ms`, the claim's), measured here from the answer, which
    /// comes at most a call timeout after the script ran; and a second of slack.
    fn hold_ms(&self, life_ms: u64) -> u64 {
        life_ms
            .saturating_add(self.plugin.config.backend.timeout_ms)
            .saturating_add(HOLD_SLACK_MS)
            .min(MAX_HOLD_MS)
    }

    /// Every waiter on `key` gets a 429: this proxy's reservation covers them only later.
    fn deny_waiters(&mut self, host: &mut dyn Host, key: &str, retry_ms: u64) {
        for w in self.waits.drain(key) {
            self.settle(
                host,
                w.ctx,
                w.check,
                (Outcome::Denied { retry_ms }, By::Lease),
            );
        }
    }

    /// Ends a lease claim that brought no tokens.
    fn end_claim(&self, host: &mut dyn Host, purpose: Purpose, now: u64) {
        if let Purpose::Lease(claim) = purpose {
            let _ = LeasePool::new(host.store(), &self.plugin.ns).release(claim, None, now);
        }
    }

    /// The answer to this worker's lease call on `claim`'s key (a call of `rule`).
    pub(super) fn lease_answer(
        &mut self,
        host: &mut dyn Host,
        rule: &RuleRef,
        claim: Claim,
        asked: &ScriptCall,
        (reply, sent_ms): (Result<Reply, BackendError>, u64),
        now: u64,
    ) {
        let key = claim.key().to_string();
        let sizing = sizing(rule, &asked.limits());
        let store = host.store();
        let pool = LeasePool::new(store, &self.plugin.ns);
        let m = &self.plugin.metrics;
        let mut taken = None;
        // Until when Redis' denial holds the key: its waiters get it from here, not only from the
        // deny cache, whose slot another key's box may keep (or another worker's entry replace).
        let mut denied_until = None;
        match reply {
            Ok(r) if r.allowed => {
                // Never more than asked for: a garbled reply must not mint tokens.
                let granted = r.granted.min(asked.lease_want.max(asked.cost));
                m.count(rule.id(), Counter::LeaseGranted, granted);
                // A wait means a reservation: the bucket is refilling part of the grant until
                // then (the key is saturated); those tokens are spent as they refill.
                let grant = Grant {
                    tokens: granted,
                    // A racer's turn: what the bucket holds is the next racers', and this
                    // proxy, short of tokens, leases (is paced) rather than check exactly.
                    global_remaining: if r.retry_after_ms < 0 { 0 } else { r.remaining },
                    reset_after_ms: r.reset_after_ms,
                    refill_ms: u64::try_from(r.retry_after_ms).unwrap_or(0),
                };
                if r.retry_after_ms < 0 {
                    // A racer's grant on a key short of tokens (see `bucket::RACE_SHARE`): the
                    // script says when its next turn comes; until then the key is denied here
                    // once these tokens are spent, rather than called for each token as it
                    // refills.
                    let turn = r.retry_after_ms.unsigned_abs().min(MAX_TURN_MS);
                    let until = sent_ms.saturating_add(turn.max(sizing.horizon_ms));
                    let _ = DenyCache::new(store, &self.plugin.ns).remember(&key, 1, until, now);
                } else if grant.refill_ms == 0 && r.remaining == 0 && granted < asked.lease_want {
                    // The bucket held less than this proxy asked for and reserved nothing (the
                    // key has many holders: see `bucket::RACE_SHARE`): once these tokens are
                    // spent, the key is denied here for one horizon, as after a denial, rather
                    // than called again for the next token to refill.
                    let until = sent_ms.saturating_add(sizing.horizon_ms);
                    let _ = DenyCache::new(store, &self.plugin.ns).remember(&key, 1, until, now);
                }
                let costs = self.waits.costs(&key);
                if let Ok((d, take)) = pool.deposit(claim, &grant, &costs, now, &sizing) {
                    m.count(rule.id(), Counter::LeaseDropped, d.dropped);
                    m.count(rule.id(), Counter::LeaseEvicted, d.evicted);
                    taken = Some(take);
                }
            }
            Ok(r) => {
                // Not even a reservation within the wait: the key is denied here until one could
                // be made, and for one horizon at least. A proxy denied because it holds its share
                // is told when one share has refilled, which with many holders is a millisecond
                // or two, but its count drops only when its next report does (a worker's last
                // batch counts whole until that worker takes another) or its grant expires: asked
                // sooner, the script denies it again, and a fleet of such proxies keeps Redis busy
                // with calls that admit nothing.
                let retry = u64::try_from(r.retry_after_ms).unwrap_or(r.reset_after_ms);
                let until = sent_ms.saturating_add(retry.max(sizing.horizon_ms).max(1));
                let _ = DenyCache::new(store, &self.plugin.ns).remember(&key, 1, until, now);
                let _ = pool.release(claim, Some(r.remaining), now);
                denied_until = Some(until);
            }
            Err(e) => {
                let _ = pool.release(claim, None, now);
                self.waits.set_state(&key, State::Idle);
                self.fail_waiters(host, &key, &e, now);
                return;
            }
        }
        self.waits.set_state(&key, State::Idle);
        self.serve(host, &key, (taken, denied_until), now);
    }

    /// Serves `key`'s waiters from the pool and the deny cache, in order; starts another lease
    /// call for those still waiting. `taken`: what the waiters already spent, in order (when
    /// the answer's deposit did it); None takes from the pool here. `denied_until`: until when
    /// the answer just read denies the key (a waiter the pool cannot serve is denied until then
    /// whatever the deny cache kept: a denial must never send its waiters to another call, and
    /// at their patience's end to the failure mode).
    fn serve(
        &mut self,
        host: &mut dyn Host,
        key: &str,
        (taken, denied_until): (Option<Take>, Option<u64>),
        now: u64,
    ) {
        let Some((rule, limits)) = self.waits.rule_of(key) else {
            return;
        };
        let sizing = sizing(&rule, &limits);
        let store = host.store();
        let take = taken.unwrap_or_else(|| {
            let costs = self.waits.costs(key);
            LeasePool::new(store, &self.plugin.ns)
                .take(key, &costs, now, &sizing)
                .unwrap_or_default()
        });
        self.plugin
            .metrics
            .count(rule.id(), Counter::LeaseDropped, take.dropped);
        let deny = DenyCache::new(store, &self.plugin.ns);
        let answered = denied_until
            .filter(|&until| until > now)
            .map(|until| until - now);
        let served = self.waits.serve(key, &take.spent, |cost| {
            deny.denied(key, cost, now).or(answered)
        });
        for (w, outcome) in served {
            // Leased tokens, or a denial the deny cache holds.
            let by = match outcome {
                Outcome::Denied { .. } => By::DenyCache,
                _ => By::Lease,
            };
            self.settle(host, w.ctx, w.check, (outcome, by));
        }
        if !self.waits.idle_with_waiters(key) {
            self.waits.forget_if_idle(key);
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
        for w in self.waits.drain(key) {
            self.fail_check(host, w.ctx, w.check, err, now);
        }
    }

    /// Waiters whose patience ran out while still waiting for their key's lease call get the
    /// failure mode (that call was lost somewhere). A check no longer waiting for it (served, or
    /// sent on to a call of its own, bounded by that call's timeout) is not theirs to fail.
    pub(super) fn expire_waiters(&mut self, host: &mut dyn Host, now: u64) {
        while let Some((ctx, check)) = self.waits.expire(now) {
            self.fail_check(host, ctx, check, &BackendError::Reset, now);
        }
    }

    /// Keys waiting on another worker's call, or on a lost one: serve them once that call has
    /// ended or its tokens are in the pool (reads only, unless there is something to take).
    pub(super) fn poll_leases(&mut self, host: &mut dyn Host, now: u64) {
        for key in self.waits.polled_keys() {
            let Some(q) = self.waits.polled(&key) else {
                continue;
            };
            let ready = match q.state {
                State::Lost => true,
                State::Foreign => {
                    let sizing = sizing(&q.rule, &q.limits);
                    LeasePool::new(host.store(), &self.plugin.ns)
                        .peek(&key)
                        .is_none_or(|l| {
                            l.flight_until_ms <= now || l.spendable(now, &sizing) >= q.first
                        })
                }
                State::Idle | State::Own => false,
            };
            if ready {
                self.waits.set_state(&key, State::Idle);
                self.serve(host, &key, (None, None), now);
            }
        }
    }
}
