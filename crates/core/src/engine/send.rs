//! Sending script calls and reading what their answers mean for a check: a check's own call, the
//! NOSCRIPT resend, the failure mode for a call that failed or never went out, and the backend's
//! health that every result feeds.
//!
//! Invariant: a call goes out only while fewer than `max_inflight` are out and the breaker lets
//! it; a call that does not go out gives its purpose back to its sender, which ends it (the
//! failure mode for its checks, a released claim, a settlement pending again): nothing waits on
//! a call that is not out.

use super::calls::{Call, Purpose};
use super::decision::By;
use super::health::{Event, Health};
use super::host::Host;
use super::ids::{CheckId, ContextId, Token};
use super::rules::RuleRef;
use super::verdict::Outcome;
use super::{coalesce, Engine};
use crate::backend::{BackendError, Reply, ScriptCall};
use crate::bucket::Penalized;
use crate::config::FailureMode;
use crate::metrics::{Counter, Metrics};
use crate::shared::deny::DenyCache;
use crate::shared::lease::LeasePool;
use crate::shared::{fallback, Store};

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
        if let Err((e, _)) = self.send(host, Call::new(rule, call, purpose, now)) {
            self.fail_check(host, ctx, check, &e, now);
        }
    }

    /// Sends one script call; gives the purpose back if it did not go out.
    pub(super) fn send(
        &mut self,
        host: &mut dyn Host,
        out: Call,
    ) -> Result<(), (BackendError, Purpose)> {
        let Call {
            rule,
            mut call,
            purpose,
            sent_ms,
            with_source,
        } = out;
        if self.calls.full(self.plugin.config.backend.max_inflight) {
            self.plugin
                .metrics
                .count(rule.id(), Counter::InflightRejected, 1);
            return Err((BackendError::Overflow, purpose));
        }
        if call.settle == 0 && rule.usage.is_some() {
            // This proxy's pending usage for the key rides on the call: Redis settles it first,
            // so this very check sees every charge this proxy knows of (as much of it as the
            // call's limits let the script take; the rest waits for the next call or flush).
            call.settle = self.carry_pending(host, &rule, &call.key, call.limits(), sent_ms);
        }
        let req = self.plugin.transport.request(&call, with_source);
        let backend = &self.plugin.config.backend;
        match host.dispatch(&backend.cluster, &req, backend.timeout_ms) {
            Ok(token) => {
                self.plugin
                    .metrics
                    .count(rule.id(), Counter::BackendCalls, 1);
                let sent = Call {
                    rule,
                    call,
                    purpose,
                    sent_ms,
                    with_source,
                };
                self.calls.sent(Token::from(token), sent);
                Ok(())
            }
            Err(e) => {
                let now = self.timer.read(host);
                self.record(host, &rule, Err(&e), now);
                self.settlement_failed(host, &rule, &call, now);
                Err((e, purpose))
            }
        }
    }

    /// NOSCRIPT: the same call again with the script's source (EVAL), once.
    pub(super) fn resend_with_source(&mut self, host: &mut dyn Host, call: Call, now: u64) {
        let key = call.call.key.clone();
        if let Purpose::Lease(claim) = &call.purpose {
            // A second timeout for the same claim: no other lease call for the key meanwhile.
            let until = self.claim_until(now);
            let _ = LeasePool::new(host.store(), &self.plugin.ns).renew(claim, until);
        }
        let again = Call {
            with_source: true,
            ..call
        };
        match self.send(host, again) {
            Ok(()) => {}
            Err((e, Purpose::Check { ctx, check })) => self.fail_check(host, ctx, check, &e, now),
            Err((e, Purpose::Batch(checks))) => {
                self.fail_chained(host, &checks, &e, now);
                self.chain_next(host, &key, now);
            }
            Err((_, Purpose::Settle)) => {}
            Err((e, Purpose::Lease(claim))) => {
                let _ = LeasePool::new(host.store(), &self.plugin.ns).release(claim, None, now);
                self.waits.flight_lost(&key);
                self.fail_waiters(host, &key, &e, now);
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
                Penalized::No => cache.remember(&call.key, call.cost, until),
                Penalized::Offence | Penalized::Boxed => cache.remember_box(&call.key, until),
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

    pub(super) fn backend_allowed(&self, host: &mut dyn Host, now: u64) -> bool {
        self.health(host.store()).allow(now)
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

    /// Feeds one call's result to the proxy's health, counts a failure, and logs a change of state.
    pub(super) fn record(
        &self,
        host: &mut dyn Host,
        rule: &RuleRef,
        result: Result<(), &BackendError>,
        now: u64,
    ) {
        if let Err(e) = result {
            let m = &self.plugin.metrics;
            m.count(rule.id(), Counter::BackendErrors, 1);
            m.count(rule.id(), Counter::BackendError(e.class()), 1);
        }
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
