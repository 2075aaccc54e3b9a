//! Sending script calls and reading what their answers mean for a check: a check's own call, the
//! NOSCRIPT resend, the failure mode for a call that failed or never went out, and the backend's
//! health that every result feeds.
//!
//! Exact checks and settlements go out in flights from the worker's open batch ([`batch`]);
//! lease calls, in flights of their own.
//!
//! Invariant: a flight goes out only while fewer than `max_inflight` are out and the breaker lets
//! it; a call that does not go out gives its purpose back to its sender, or, when its flight
//! could not leave, ends it here (the failure mode for its checks, a released claim, a
//! settlement pending again): nothing waits on a call that is neither out nor in the open batch,
//! and the open batch leaves at the latest when a flight is answered, or, with none of its flights
//! out, at the end of the host's round of events (at once if the worker has no queue).
//!
//! [`batch`]: super::batch

use super::calls::{Call, Flight, Purpose};
use super::coalesce::LEAVE;
use super::decision::By;
use super::health::{Event, Gate, Health};
use super::host::Host;
use super::ids::{CheckId, ContextId, Token};
use super::rules::RuleRef;
use super::verdict::Outcome;
use super::{coalesce, Engine};
use crate::backend::{slot, BackendError, Reply, ScriptCall};
use crate::bucket::Penalized;
use crate::config::FailureMode;
use crate::metrics::{Counter, Metrics};
use crate::shared::deny::DenyCache;
use crate::shared::lease::LeasePool;
use crate::shared::{fallback, Store};

/// How the calls of a batch go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Apart {
    /// In one flight.
    Together,
    /// One flight per Redis Cluster slot.
    BySlot,
    /// Each in a flight of its own.
    Alone,
}

/// Redis Cluster errors about one node or slot: a flight of several keys that got one may have
/// failed for one key's node only, so its calls go again each alone.
const ONE_NODE: &[&str] = &["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"];

/// Whether `e` may concern only some keys of a flight (their node), not the backend.
pub(super) fn concerns_one_node(e: &BackendError) -> bool {
    match e {
        BackendError::Redis(msg) => {
            let word = msg.split(' ').next().unwrap_or_default();
            ONE_NODE.contains(&word) || e.class() == crate::backend::ErrorClass::Unreachable
        }
        _ => false,
    }
}

/// Whether the calls of `flight` all concern one Redis Cluster slot.
pub(super) fn one_slot(flight: &Flight) -> bool {
    let mut slots = flight.calls.iter().map(|(_, c)| slot(&c.call.key));
    let first = slots.next();
    slots.all(|s| Some(s) == first)
}

/// `calls` grouped by Redis Cluster slot, in the order each slot first comes.
fn by_slot(calls: Vec<Call>) -> Vec<Vec<Call>> {
    let mut by_slot: Vec<(u16, Vec<Call>)> = Vec::new();
    for c in calls {
        let s = slot(&c.call.key);
        match by_slot.iter_mut().find(|(at, _)| *at == s) {
            Some((_, group)) => group.push(c),
            None => by_slot.push((s, vec![c])),
        }
    }
    by_slot.into_iter().map(|(_, group)| group).collect()
}

/// `calls` as the flights `apart` sends them in.
fn flights_of(calls: Vec<Call>, apart: Apart) -> Vec<Vec<Call>> {
    match apart {
        Apart::Together => vec![calls],
        Apart::Alone => calls.into_iter().map(|c| vec![c]).collect(),
        Apart::BySlot => by_slot(calls),
    }
}

/// The retry time of a denial made because the fallback bucket's shared data kept failing.
const FALLBACK_FAILING_RETRY_MS: u64 = 1000;

impl Engine {
    /// Sends exact check `check`'s call, or queues it behind the call out for its key.
    pub(super) fn send_exact(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        check: CheckId,
        now: u64,
    ) {
        let Some(c) = self.requests.waiting(ctx, check) else {
            return;
        };
        let (rule, call) = (c.rule.clone(), c.call.clone());
        if coalesce::eligible(&call) && self.join_chain(host, (&rule, &call), ctx, check, now) {
            return;
        }
        self.send_check(host, ctx, check, now);
        if !self.requests.is_waiting(ctx, check) {
            // The call failed at once: the chain it started is over.
            self.chain_next(host, &call.key, now);
        }
    }

    /// Sends check `check`'s own call (exact mode, or a lease check whose key has no lease slot).
    pub(super) fn send_check(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        check: CheckId,
        now: u64,
    ) {
        let Some(c) = self.requests.waiting(ctx, check) else {
            return;
        };
        let (rule, mut call) = (c.rule.clone(), c.call.clone());
        call.lease_want = 0;
        let purpose = Purpose::Check { ctx, check };
        if let Err((e, _)) = self.enqueue(host, Call::new(rule, call, purpose, now)) {
            self.fail_check(host, ctx, check, &e, now);
        }
    }

    /// Puts a call in the worker's open batch, which goes out as one flight when the flight out
    /// before it is answered, at the end of the host's round of events if none is out, or now if
    /// it is full. Gives the purpose back if `max_inflight` flights are out (the failure mode at
    /// once, not a wait behind a struggling backend).
    pub(super) fn enqueue(
        &mut self,
        host: &mut dyn Host,
        mut out: Call,
    ) -> Result<(), (BackendError, Purpose)> {
        let max_keys = self.batch_max_keys();
        let max_inflight = self.plugin.config.backend.max_inflight;
        if self.calls.full(max_inflight) {
            return Err(self.overflow(host, out));
        }
        // Sized with what it carries: the room it needs is the room it takes. A call that then
        // overflows puts what it carried back (`overflow`).
        self.carry(host, &mut out);
        let bytes = self.plugin.transport.group_bytes(&out.call);
        if self.open.no_room_for(bytes, max_keys) {
            self.dispatch_open(host);
            // A half-open breaker's probe on a Redis Cluster takes one slot and leaves the
            // others waiting in the open batch: there may still be no room.
            if self.calls.full(max_inflight) || self.open.no_room_for(bytes, max_keys) {
                return Err(self.overflow(host, out));
            }
        }
        self.open.push(out, bytes, self.calls.batched_out());
        if self.open.is_full(max_keys) && !self.calls.full(max_inflight) {
            self.dispatch_open(host);
        }
        Ok(())
    }

    /// Sends one call now, in a flight of its own (a lease call: its claim is timed from now);
    /// gives the purpose back if it did not go out.
    pub(super) fn send(
        &mut self,
        host: &mut dyn Host,
        mut out: Call,
    ) -> Result<(), (BackendError, Purpose)> {
        if self.calls.full(self.plugin.config.backend.max_inflight) {
            return Err(self.overflow(host, out));
        }
        if !self.backend_allowed(host, out.sent_ms) {
            return Err((BackendError::CircuitOpen, out.purpose));
        }
        self.carry(host, &mut out);
        let now = out.sent_ms;
        self.dispatch(host, vec![out], (false, false), now)
            .map_err(|(e, mut calls)| match calls.pop() {
                Some(c) => (e, c.purpose),
                None => (e, Purpose::Settle),
            })
    }

    /// The worker's open batch goes out, if it holds anything, unless a flight that left from it
    /// is still out or `max_inflight` flights are (an answer sends it then). Called at the end of
    /// every event.
    ///
    /// It leaves at the end of the host's current round of events, not of this one: a
    /// [`LEAVE`] note on the worker's own queue, which Envoy delivers after the events already
    /// at hand (a post to the worker's dispatcher). So the checks of the requests that came in the
    /// same round go with it, in one flight instead of one each; and its bytes leave no later
    /// than a flight sent now would have, because Envoy writes a callout to its connection in
    /// that same round too. Only a worker whose last flight had company waits for the round (a
    /// note costs Envoy a post and a call into the VM, which a lone request's flight would pay
    /// for nothing); a worker without a queue, or whose note the host refused, sends now.
    pub(super) fn flush_open(&mut self, host: &mut dyn Host) {
        if self.leaving || !self.open_may_leave() {
            return;
        }
        if let Some(lane) = self.chains.lane().filter(|_| self.company) {
            if host.enqueue(lane, LEAVE) {
                self.leaving = true;
                return;
            }
        }
        self.dispatch_open(host);
    }

    /// The worker's [`LEAVE`] note came: its open batch goes out now, if it still may.
    pub(super) fn leave_now(&mut self, host: &mut dyn Host) {
        self.leaving = false;
        if self.open_may_leave() {
            self.dispatch_open(host);
        }
    }

    /// Whether the open batch holds something, no flight of it is out, and fewer than
    /// `max_inflight` flights are.
    fn open_may_leave(&self) -> bool {
        !self.open.is_empty()
            && !self.calls.batched_out()
            && !self.calls.full(self.plugin.config.backend.max_inflight)
    }

    /// The open batch leaves now unless `max_inflight` flights are out.
    pub(super) fn dispatch_open_now(&mut self, host: &mut dyn Host) {
        if !self.calls.full(self.plugin.config.backend.max_inflight) {
            self.dispatch_open(host);
        }
    }

    /// Sends what the open batch holds as one flight (the breaker permitting); before a Redis
    /// Cluster, one flight per slot.
    fn dispatch_open(&mut self, host: &mut dyn Host) {
        // Checks that gathered behind a flight: this worker has concurrent load, and collects
        // the proxy's while its flights are out (a lone check on an idle worker writes nothing).
        let gathered = self.open.gathered();
        let calls = self.open.take();
        if calls.is_empty() {
            return;
        }
        self.company = gathered || calls.len() > 1;
        let now = self.timer.read(host);
        // Another worker's flight carries them, if one is out.
        let calls = self.relay(host, calls, now);
        if calls.is_empty() {
            return;
        }
        // After the cool-off, the one call the breaker lets through is a probe.
        let gate = self.health(host.store()).gate(now);
        let probe = gate == Gate::Probe;
        if gate == Gate::Shut {
            self.refused_by_breaker(host, calls, now);
            return;
        }
        let cluster = calls.len() > 1 && self.knows_cluster(host);
        if cluster && probe {
            // One flight probes; the other slots' calls wait in the open batch for its answer
            // (they came from it, so they fit).
            let mut slots = by_slot(calls).into_iter();
            let first = slots.next().unwrap_or_default();
            for c in slots.flatten() {
                let bytes = self.plugin.transport.group_bytes(&c.call);
                self.open.push(c, bytes, true);
            }
            self.dispatch_apart(host, first, Apart::Together, now);
            return;
        }
        let apart = if cluster {
            Apart::BySlot
        } else {
            Apart::Together
        };
        self.dispatch_apart(host, calls, apart, now);
        if gathered && self.calls.batched_out() {
            self.collect(host);
        }
    }

    /// Sends `calls` as flights that left from the open batch: all in one, one per Cluster slot,
    /// or each alone. A flight that cannot go out (`max_inflight`, or the host refused it) fails
    /// its calls.
    fn dispatch_apart(&mut self, host: &mut dyn Host, calls: Vec<Call>, apart: Apart, now: u64) {
        for calls in flights_of(calls, apart) {
            let failed = if self.calls.full(self.plugin.config.backend.max_inflight) {
                for c in &calls {
                    let m = &self.plugin.metrics;
                    m.count(c.rule.id(), Counter::InflightRejected, 1);
                    self.settlement_failed(host, &c.rule, &c.call, false, now);
                }
                Some((BackendError::Overflow, calls))
            } else {
                self.dispatch(host, calls, (false, true), now).err()
            };
            if let Some((e, calls)) = failed {
                for c in calls {
                    self.call_failed(host, c, &e, now);
                }
            }
        }
    }

    /// Whether the backend is known to be a Redis Cluster (a call of several keys was refused
    /// for their slots, here or by another worker of the proxy).
    fn knows_cluster(&mut self, host: &mut dyn Host) -> bool {
        if !self.cluster_known {
            let key = [self.plugin.ns.as_str(), "|redis_cluster"].concat();
            self.cluster_known = matches!(host.store().get(&key), Ok((Some(_), _)));
        }
        self.cluster_known
    }

    /// A flight of several keys was refused for their slots (CROSSSLOT, before the script ran):
    /// the backend is a Redis Cluster. Every worker of the proxy sends one slot per flight from
    /// now on.
    pub(super) fn learn_cluster(&mut self, host: &mut dyn Host) {
        if !self.knows_cluster(host) {
            log::info!(
                "tollgate: the backend is a Redis Cluster: a backend request carries the checks \
                 of one slot"
            );
            let key = [self.plugin.ns.as_str(), "|redis_cluster"].concat();
            let _ = host.store().set(&key, b"1", 0);
            self.cluster_known = true;
        }
    }

    /// The calls of a flight refused for their slots, or failed by one node's error, go again
    /// `apart`, as the breaker lets calls out now (it may have opened while their flight was
    /// out, or that flight was its probe): all of them while it is closed; one flight after a
    /// cool-off (the probe); none while it is open. A call that does not go ends as one the
    /// breaker refused: its failure mode, its settlement pending again (a refund its flight
    /// may have given back is gone from it already).
    pub(super) fn send_apart_again(
        &mut self,
        host: &mut dyn Host,
        calls: Vec<Call>,
        apart: Apart,
        now: u64,
    ) {
        let (go, refused) = match self.health(host.store()).gate(now) {
            Gate::Closed => (calls, Vec::new()),
            Gate::Shut => (Vec::new(), calls),
            Gate::Probe => {
                let mut flights = flights_of(calls, apart).into_iter();
                let first = flights.next().unwrap_or_default();
                (first, flights.flatten().collect())
            }
        };
        if !go.is_empty() {
            self.dispatch_apart(host, go, apart, now);
        }
        self.refused_by_breaker(host, refused, now);
    }

    /// `calls`, which the breaker keeps home: each settlement pending again, each call failed
    /// as the open breaker fails it.
    fn refused_by_breaker(&mut self, host: &mut dyn Host, calls: Vec<Call>, now: u64) {
        for c in &calls {
            self.settlement_failed(host, &c.rule, &c.call, false, now);
        }
        for c in calls {
            self.call_failed(host, c, &BackendError::CircuitOpen, now);
        }
    }

    /// One flight: `calls` as one backend request (the script's single form for one call, its
    /// batched form for more). `(with_source, batched)`: the EVAL resend; whether the calls left
    /// from the open batch. Gives the calls back if it did not go out, their settlements pending
    /// again.
    fn dispatch(
        &mut self,
        host: &mut dyn Host,
        calls: Vec<Call>,
        (with_source, batched): (bool, bool),
        now: u64,
    ) -> Result<(), (BackendError, Vec<Call>)> {
        let transport = &self.plugin.transport;
        let req = match calls.as_slice() {
            [one] => transport.request(&one.call, with_source),
            many => {
                let each: Vec<&ScriptCall> = many.iter().map(|c| &c.call).collect();
                transport.request_batch(&each, with_source)
            }
        };
        let backend = &self.plugin.config.backend;
        match host.dispatch(&backend.cluster, &req, backend.timeout_ms) {
            Ok(token) => {
                for c in &calls {
                    let m = &self.plugin.metrics;
                    m.count(c.rule.id(), Counter::BackendCalls, 1);
                }
                let flight = Flight {
                    size: calls.len(),
                    asks: Flight::asks(calls.iter().map(|c| &c.call)),
                    calls: calls.into_iter().enumerate().collect(),
                    with_source,
                    batched,
                };
                self.calls.sent(Token::from(token), flight);
                Ok(())
            }
            Err(e) => {
                let now = self.timer.read(host).max(now);
                self.feed_health(host, Err(&e), now);
                for c in &calls {
                    self.count_failure(&c.rule, &e);
                    self.settlement_failed(host, &c.rule, &c.call, false, now);
                }
                Err((e, calls))
            }
        }
    }

    /// A call that will not be sent: the worker is at `max_inflight`. Its settlement is pending
    /// again; its purpose goes back to its sender.
    fn overflow(&mut self, host: &mut dyn Host, out: Call) -> (BackendError, Purpose) {
        self.plugin
            .metrics
            .count(out.rule.id(), Counter::InflightRejected, 1);
        self.settlement_failed(host, &out.rule, &out.call, false, out.sent_ms);
        (BackendError::Overflow, out.purpose)
    }

    /// This proxy's pending usage for the call's key rides on it: Redis settles it first, so this
    /// very check sees every charge this proxy knows of (as much of it as the call's limits let
    /// the script take; the rest waits for the next call or flush). A take that may be refunded
    /// asks for its spill epoch ([`Engine::may_refund`]).
    fn carry(&mut self, host: &mut dyn Host, out: &mut Call) {
        if out.call.cost > 0 && out.call.track.is_none() && self.may_refund(&out.rule) {
            out.call.track = Some(crate::bucket::Tracked::default());
        }
        if !out.call.settles() && out.rule.usage.is_some() {
            let (rule, call) = (&out.rule, &out.call);
            let taken = self.carry_pending(host, rule, &call.key, call.limits(), out.sent_ms);
            super::usage::carry_taken(&mut out.call, &taken);
        }
    }

    pub(super) fn batch_max_keys(&self) -> usize {
        usize::try_from(self.plugin.config.backend.batch_max_keys).unwrap_or(1)
    }

    /// NOSCRIPT: the same flight again with the script's source (EVAL), once.
    pub(super) fn resend_with_source(&mut self, host: &mut dyn Host, flight: Flight, now: u64) {
        let calls: Vec<Call> = flight.calls.into_iter().map(|(_, c)| c).collect();
        for c in &calls {
            if let Purpose::Lease(claim) = &c.purpose {
                // A second timeout for the same claim: no other lease call for the key meanwhile.
                let until = self.claim_until(now);
                let _ = LeasePool::new(host.store(), &self.plugin.ns).renew(claim, until);
            }
        }
        if let Err((e, calls)) = self.dispatch(host, calls, (true, flight.batched), now) {
            for c in calls {
                self.call_failed(host, c, &e, now);
            }
        }
    }

    /// A call that failed (not sent, or its flight failed): its purpose ends. Its settlement is
    /// pending again already.
    pub(super) fn call_failed(&mut self, host: &mut dyn Host, c: Call, e: &BackendError, now: u64) {
        match c.purpose {
            Purpose::Check { ctx, check } => {
                self.fail_check(host, ctx, check, e, now);
                self.own_call_over(host, &c.call, now);
            }
            Purpose::Batch(checks) => {
                self.fail_chained(host, &checks, e, now);
                self.chain_next(host, &c.call.key, now);
            }
            Purpose::Adopted(checks) => self.fail_chained(host, &checks, e, now),
            Purpose::Settle => {}
            Purpose::Relayed { queue, ask } => self.answers.add(queue, ask, None),
            Purpose::Lease(claim) => {
                let _ = LeasePool::new(host.store(), &self.plugin.ns).release(claim, None, now);
                self.waits.flight_lost(&c.call.key);
                self.fail_waiters(host, &c.call.key, e, now);
            }
        }
    }

    /// What a script reply means for a check; a denial is remembered in the deny cache.
    pub(super) fn reply_outcome(
        &self,
        host: &mut dyn Host,
        rule: &RuleRef,
        call: &ScriptCall,
        r: &Reply,
        sent_ms: u64,
    ) -> Outcome {
        let outcome = Outcome::of_reply(r);
        if let Outcome::Denied { retry_ms } = outcome {
            let until = sent_ms.saturating_add(retry_ms);
            let cache = DenyCache::new(host.store(), &self.plugin.ns);
            // A penalty box refuses every cost until it ends; a bucket, this cost or more.
            let _ = match r.penalized {
                Penalized::No => cache.remember(&call.key, call.cost, until, sent_ms),
                Penalized::Offence | Penalized::Boxed => {
                    cache.remember_box(&call.key, until, sent_ms)
                }
            };
            let counter = match r.penalized {
                Penalized::No => None,
                Penalized::Offence => Some(Counter::PenaltyOffences),
                Penalized::Boxed => Some(Counter::Penalized),
            };
            if let Some(counter) = counter {
                self.plugin.metrics.count(rule.id(), counter, 1);
            }
        }
        outcome
    }

    /// The failure mode's outcome for a check of `rule` whose call failed (or was never sent),
    /// and which failure mode gave it.
    pub(super) fn failure_outcome(
        &self,
        host: &mut dyn Host,
        rule: &RuleRef,
        call: &ScriptCall,
        _err: &BackendError,
        now: u64,
    ) -> (Outcome, By) {
        match self.plugin.config.failure_mode {
            FailureMode::Open => (Outcome::FailOpen, By::FailureOpen),
            FailureMode::Closed => (Outcome::FailClosed, By::FailureClosed),
            FailureMode::Local => {
                let limits = rule.fallback.map_or(call.limits(), |f| f.limits());
                let table = format!("{}|{}", self.plugin.ns, rule.name);
                let outcome = match fallback::take(
                    host.store(),
                    &table,
                    &call.key,
                    &limits,
                    call.cost,
                    now,
                ) {
                    Ok(r) => match Outcome::of_reply(&r) {
                        Outcome::Reserved { .. } => Outcome::FailClosed,
                        o => o,
                    },
                    // Shared data kept failing: deny rather than admit unaccounted.
                    Err(_) => Outcome::Denied {
                        retry_ms: FALLBACK_FAILING_RETRY_MS,
                    },
                };
                (outcome, By::Fallback)
            }
        }
    }

    /// Check `check` of `ctx` gets the failure mode for `e`.
    pub(super) fn fail_check(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        check: CheckId,
        e: &BackendError,
        now: u64,
    ) {
        let Some(c) = self.requests.waiting(ctx, check) else {
            return;
        };
        let (rule, call) = (c.rule.clone(), c.call.clone());
        let outcome = self.failure_outcome(host, &rule, &call, e, now);
        self.settle(host, ctx, check, outcome);
    }

    // ----- backend health -----

    /// Whether a call may go out now (claims the breaker's one probe after a cool-off).
    pub(super) fn backend_allowed(&self, host: &mut dyn Host, now: u64) -> bool {
        self.health(host.store()).allow(now)
    }

    /// Whether the breaker refuses every call now (claims nothing).
    pub(super) fn breaker_refuses(&self, host: &mut dyn Host, now: u64) -> bool {
        self.health(host.store()).refuses(now)
    }

    pub(super) fn health<'a>(&self, store: &'a dyn Store) -> Health<'a> {
        let b = &self.plugin.config.backend;
        Health::new(
            store,
            &self.plugin.ns,
            b.breaker_failures,
            b.breaker_cooloff_ms,
        )
    }

    /// Counts a failed call of `rule`.
    pub(super) fn count_failure(&self, rule: &RuleRef, e: &BackendError) {
        let m = &self.plugin.metrics;
        m.count(rule.id(), Counter::BackendErrors, 1);
        m.count(rule.id(), Counter::BackendError(e.class()), 1);
    }

    /// Feeds one flight's result to the proxy's health (once per backend request, however many
    /// calls it carried), and logs a change of state.
    pub(super) fn feed_health(
        &self,
        host: &mut dyn Host,
        result: Result<(), &BackendError>,
        now: u64,
    ) {
        let mode = self.plugin.config.failure_mode;
        let b = &self.plugin.config.backend;
        for event in self.health(host.store()).record(result, now) {
            match event {
                Event::Opened => {
                    self.plugin.metrics.breaker_open(true);
                    log::warn!(
                        "tollgate: backend failing: circuit open after {} consecutive failures; \
                         failure_mode {mode:?} answers, one probe every {} ms",
                        b.breaker_failures,
                        b.breaker_cooloff_ms
                    );
                }
                Event::Closed => {
                    self.plugin.metrics.breaker_open(false);
                    log::info!("tollgate: backend answering again: circuit closed");
                }
                Event::Failing(class, msg) => log::warn!(
                    "tollgate: backend error ({}): {msg}; failure_mode {mode:?} applies to the \
                     requests it concerns (logged again only after it recovers)",
                    class.name()
                ),
                Event::Recovered(classes) => {
                    let names: Vec<&str> = classes.iter().map(|c| c.name()).collect();
                    log::info!("tollgate: backend recovered from: {}", names.join(", "));
                }
            }
        }
    }
}
