//! Exact mode at a hot key: while one call for a key is out, the proxy's other exact checks of
//! that key queue, and go to Redis together as one script call asking for one token each
//! (`cost` 1, `lease_want` = how many).
//!
//! Across workers: a worker whose chain for a key goes on past its first call claims the key in
//! the proxy's leader table ([`Leaders`]); the other workers then send their checks of that key to
//! the leader's shared queue instead of calling Redis themselves, and get each answer back on
//! their own queue. A worker whose own chain goes on while another leads ends it with the call its
//! queued checks were promised, so the proxy converges on one call out per hot key.
//!
//! Invariant: every request is still decided by the global bucket, and no token is ever held
//! locally: only checks of cost 1 (no reservation) are coalesced, so a grant of `g` tokens
//! admits exactly the first `g` of them and the rest are denied as Redis would have denied them
//! then. A queued check waits for at most the call already out plus its own (the host owns every
//! call on the root context, so the next one goes out with the answer). A check sent to a leader that
//! does not answer within its patience is sent again by its own worker, and the leader forgotten.

mod chains;
mod relay;
mod wire;

use chains::Forwarded;
pub(super) use chains::{Chains, Waiter};
pub(super) use wire::{Answers, Told, LEAVE};

use super::calls::{Call, Purpose};
use super::decision::By;
use super::host::Host;
use super::ids::{CheckId, ContextId};
use super::requests::Requests;
use super::rules::RuleRef;
use super::verdict::Outcome;
use super::Engine;
use crate::backend::{BackendError, Reply, ScriptCall};
use crate::metrics::{Counter, Metrics};
use crate::shared::deny::DenyCache;
use crate::shared::lead::Leaders;

/// Whether a check may share a call: one token, no reservation.
pub(super) fn eligible(call: &ScriptCall) -> bool {
    // A penalty rule's denial must reach the script as one (it boxes the key); a shared call
    // that grants fewer than it asked for is an admission there.
    call.cost == 1 && call.max_wait_ms == 0 && call.penalty.is_none()
}

impl Engine {
    /// This worker's shared queue: hot exact keys are shared with the proxy's other workers.
    pub fn set_queue(&mut self, queue: u32) {
        self.chains.set_lane(queue);
    }

    /// Queues exact check `check` of `ctx` behind the call out for its key, or sends it to the
    /// worker leading the key; false if neither (the check sends its own call, which starts a
    /// chain).
    pub(super) fn join_chain(
        &mut self,
        host: &mut dyn Host,
        (rule, call): (&RuleRef, &ScriptCall),
        ctx: ContextId,
        check: CheckId,
        now: u64,
    ) -> bool {
        if self.chains.join(&call.key, Waiter::Local(ctx, check)) {
            return true;
        }
        if self.forward(host, (rule, call), ctx, check, now) {
            return true;
        }
        self.chains.start(&call.key);
        false
    }

    /// Sends check `check` of `ctx` (of `rule`, call `call`) to the worker leading its key, if
    /// another one does.
    fn forward(
        &mut self,
        host: &mut dyn Host,
        (rule, call): (&RuleRef, &ScriptCall),
        ctx: ContextId,
        check: CheckId,
        now: u64,
    ) -> bool {
        let Some(me) = self.chains.lane() else {
            return false;
        };
        let known = self.chains.known_leader(&call.key);
        let leader =
            known.or_else(|| Leaders::new(host.store(), &self.plugin.ns).leader(&call.key));
        let Some(leader) = leader.filter(|q| *q != me) else {
            return false;
        };
        let ask = self.chains.next_ask();
        if !host.enqueue(leader, &wire::ask(me, ask, rule.id(), call)) {
            let leaders = Leaders::new(host.store(), &self.plugin.ns);
            self.chains.forget_leader(&call.key, leader, &leaders);
            return false;
        }
        let forwarded = Forwarded {
            ctx,
            check,
            leader,
            rule: rule.clone(),
            call: call.clone(),
            relayed: false,
        };
        let due = now.saturating_add(self.plugin.patience_ms());
        self.chains.forwarded(forwarded, due, known.is_none());
        self.plugin.metrics.count(rule.id(), Counter::Forwarded, 1);
        true
    }

    fn waits(&self, w: &Waiter) -> bool {
        waited_for(&self.requests, w)
    }

    /// A check's own call (`call`) is over: answered, failed, or given up on. If it was an exact
    /// check that may share calls, it led its key's chain, whose queued checks go now.
    pub(super) fn own_call_over(&mut self, host: &mut dyn Host, call: &ScriptCall, now: u64) {
        if eligible(call) {
            self.chain_next(host, &call.key, now);
        }
    }

    /// A call of `key`'s chain was answered (or failed): send the queued checks as one call, now.
    /// A chain that goes on claims its key for this worker, or, if another worker leads it, ends
    /// with this call.
    pub(super) fn chain_next(&mut self, host: &mut dyn Host, key: &str, now: u64) {
        let Some(queued) = self.chains.take_waiting(key) else {
            return;
        };
        // Requests that went away or were decided meanwhile would only waste a token.
        let checks: Vec<Waiter> = queued.into_iter().filter(|w| self.waits(w)).collect();
        let local_call = checks.iter().find_map(|w| match *w {
            Waiter::Local(ctx, check) => self
                .requests
                .waiting(ctx, check)
                .map(|c| (c.rule.clone(), c.call.clone())),
            Waiter::Remote { .. } => None,
        });
        let template = local_call.or_else(|| self.chains.remote_call(key));
        let leaders = Leaders::new(host.store(), &self.plugin.ns);
        let Some((rule, mut call)) = template.filter(|_| !checks.is_empty()) else {
            self.chains.end(key, &leaders);
            return;
        };
        self.chains.goes_on(key, &leaders);
        call.cost = 1;
        call.lease_want = checks.len() as u64;
        if let Err((e, purpose)) =
            self.enqueue(host, Call::new(rule, call, Purpose::Batch(checks), now))
        {
            if let Purpose::Batch(checks) = purpose {
                self.fail_chained(host, &checks, &e, now);
            }
            self.chain_next(host, key, now);
        }
    }

    /// The answer to a coalesced call (`asked` of `rule`): the first `granted` checks still
    /// waited for are admitted, the others denied until the next token refills; shares no check
    /// took go back.
    pub(super) fn batch_answer(
        &mut self,
        host: &mut dyn Host,
        (rule, asked): (&RuleRef, &ScriptCall),
        checks: Vec<Waiter>,
        reply: Result<Reply, BackendError>,
        sent_ms: u64,
        now: u64,
    ) {
        let r = match reply {
            Ok(r) => r,
            Err(e) => {
                self.fail_chained(host, &checks, &e, now);
                return;
            }
        };
        // No more than was asked for: a garbled reply must not mint shares to give back.
        let granted = if r.allowed {
            r.granted.min(asked.lease_want)
        } else {
            0
        };
        // Until one more token refills (what Redis would answer a lone request now).
        let next_token_ms = asked.period_ms.div_ceil(asked.rate.max(1)).max(1);
        let retry_ms = if r.allowed {
            next_token_ms
        } else {
            u64::try_from(r.retry_after_ms).unwrap_or(r.reset_after_ms)
        };
        if granted < checks.len() as u64 {
            let until = sent_ms.saturating_add(retry_ms);
            let _ =
                DenyCache::new(host.store(), &self.plugin.ns).remember(&asked.key, 1, until, now);
        }
        let mut remaining = r.remaining.saturating_add(granted);
        // Shares not handed out yet.
        let mut left = granted;
        let mut answers = Answers::default();
        for w in checks {
            if let Waiter::Local(ctx, check) = w {
                if !self.requests.is_waiting(ctx, check) {
                    // Another rule refused its request, or it is gone, since the call went
                    // out: its share goes to the next check, as Redis would have given it.
                    continue;
                }
            }
            let outcome = if left > 0 {
                left -= 1;
                remaining = remaining.saturating_sub(1);
                Outcome::Allowed {
                    remaining,
                    reset_ms: r.reset_after_ms,
                    epoch: r.epoch,
                }
            } else {
                Outcome::Denied { retry_ms }
            };
            match w {
                Waiter::Local(ctx, check) => self.settle(host, ctx, check, (outcome, By::Redis)),
                Waiter::Remote { queue, ask } => answers.add(queue, ask, Some(outcome)),
            }
        }
        answers.send(host);
        // Shares no request went upstream with.
        let outcome = (
            Outcome::Allowed {
                remaining,
                reset_ms: r.reset_after_ms,
                epoch: r.epoch,
            },
            By::Redis,
        );
        self.refund_late(host, (rule, asked), outcome, left);
    }

    /// A call for `checks` failed (or could not be sent): each gets its worker's failure mode.
    pub(super) fn fail_chained(
        &mut self,
        host: &mut dyn Host,
        checks: &[Waiter],
        e: &BackendError,
        now: u64,
    ) {
        let mut answers = Answers::default();
        for w in checks {
            match *w {
                Waiter::Local(ctx, check) => self.fail_check(host, ctx, check, e, now),
                Waiter::Remote { queue, ask } => answers.add(queue, ask, None),
            }
        }
        answers.send(host);
    }

    /// A message on queue `queue`, one this worker's root registered: a check another worker sent
    /// here, answers to checks sent from here, or this worker's note that its open batch leaves.
    /// The host calls this once per message put on the queue, so one is taken. `queue` is the
    /// host's word, not `lane`: after a reconfiguration in the same VM (a new engine, a new
    /// queue) messages sent to the old queue still come here: a note sends the open batch,
    /// checks are served, answers are dropped (they are the old engine's, whose asks were
    /// numbered like this engine's).
    pub fn queue_ready(&mut self, host: &mut dyn Host, queue: u32) {
        let Some(message) = host.dequeue(queue) else {
            return;
        };
        let now = self.timer.read(host);
        if message == LEAVE {
            self.leave_now(host);
        } else if let Some(ask) = wire::parse_ask(&message) {
            self.take_ask(host, ask, now);
        } else if message.starts_with(b"c ") {
            match wire::parse_relay(&message) {
                Some((queue, checks)) => self.take_relay(host, queue, checks, now),
                None => log::warn!("tollgate: unreadable message between workers"),
            }
        } else if self.chains.lane().is_none_or(|lane| lane == queue) {
            for line in message.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                match wire::parse_answer(line) {
                    Some((ask, told)) => self.answered(host, ask, told, now),
                    None => log::warn!("tollgate: unreadable message between workers"),
                }
            }
        }
        self.schedule(host, now, false);
    }

    /// A check another worker sent: it joins the key's chain here, or starts one with a call now
    /// (this runs in the root context, which carries it). Its rule is the one its key names
    /// ([`super::rules::Rules::of_key`]): one this configuration lacks gets a failed answer.
    fn take_ask(&mut self, host: &mut dyn Host, ask: wire::Ask, now: u64) {
        let waiter = Waiter::Remote {
            queue: ask.queue,
            ask: ask.ask,
        };
        let Some(rule) = self.plugin.rule_of_key(ask.rule, &ask.call.key) else {
            let mut answers = Answers::default();
            answers.add(ask.queue, ask.ask, None);
            answers.send(host);
            return;
        };
        let key = ask.call.key.clone();
        if self.chains.join_remote(&key, waiter, (rule, ask.call)) {
            self.chain_next(host, &key, now);
        }
    }

    /// The leader's answer to check `ask` (None: its call failed).
    fn answered(&mut self, host: &mut dyn Host, ask: u64, told: Told, now: u64) {
        let Some(f) = self.chains.answered(ask) else {
            return;
        };
        match told {
            // The leader's call answered it, after another rule refused its request or the
            // request left: the token it took goes back.
            Told::Decided(o) if !self.requests.is_waiting(f.ctx, f.check) => {
                self.refund_late(host, (&f.rule, &f.call), (o, By::Redis), f.call.cost);
            }
            // The leader's call answered it.
            Told::Decided(o) => self.settle(host, f.ctx, f.check, (o, By::Redis)),
            // Nothing ran for it: its own call goes now (and carries on its key's chain).
            Told::NotTaken if f.relayed => return self.send_own(host, f, now),
            // Nothing ran for it: its leader went away. It goes again from here.
            Told::NotTaken => return self.send_again(host, f, now),
            Told::Failed => {
                self.fail_check(host, f.ctx, f.check, &BackendError::Reset, now);
            }
        }
        if f.relayed {
            self.own_call_over(host, &f.call, now);
        }
    }

    /// Forwarded checks whose leader did not answer in time: the leader is forgotten and each
    /// check goes again from this worker. A relayed check gets its failure mode instead (its
    /// call may have run: a second one would charge it twice).
    pub(super) fn expire_forwarded(&mut self, host: &mut dyn Host, now: u64) {
        while let Some(f) = self.chains.pop_expired(now) {
            if f.relayed {
                self.relay_lost(host, f, now);
            } else {
                self.send_again(host, f, now);
            }
        }
    }

    /// Check `f`, which this worker sent to the key's leader, goes again from this worker, and
    /// that leader is forgotten.
    fn send_again(&mut self, host: &mut dyn Host, f: Forwarded, now: u64) {
        let leaders = Leaders::new(host.store(), &self.plugin.ns);
        self.chains.forget_leader(&f.call.key, f.leader, &leaders);
        if self.requests.is_waiting(f.ctx, f.check) {
            self.send_exact(host, f.ctx, f.check, now);
        }
    }
}

/// Whether `w` is still waited for: a remote check always (its worker decides), a local one while
/// its request waits for it.
pub(super) fn waited_for(requests: &Requests, w: &Waiter) -> bool {
    match *w {
        Waiter::Local(ctx, check) => requests.is_waiting(ctx, check),
        Waiter::Remote { .. } => true,
    }
}
