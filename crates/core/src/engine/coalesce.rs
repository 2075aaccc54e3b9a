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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::{Call, Engine, Host, Outcome, Purpose};
use crate::backend::{BackendError, Reply, ScriptCall};
use crate::decimal;
use crate::metrics::{Counter, Metrics};
use crate::rule::hash::Seeded;
use crate::shared::deny::DenyCache;
use crate::shared::lead::Leaders;

/// A check waiting for a key's next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waiter {
    /// Check `idx` of request `ctx` on this worker.
    Local(u32, usize),
    /// A check another worker sent here: its answer goes to that worker's `queue` as `ask`.
    Remote { queue: u32, ask: u64 },
}

/// A key with a call out (or about to go out) on this worker.
#[derive(Debug, Default)]
struct Chain {
    /// Checks waiting for the key's next call, in arrival order.
    waiting: Vec<Waiter>,
    /// The call the latest remote check asked for (rule index, call): the template of a call
    /// with no local check to copy it from.
    remote_call: Option<(usize, ScriptCall)>,
    /// This worker holds the key in the proxy's leader table.
    leads: bool,
}

/// A check this worker sent to another worker's queue.
#[derive(Debug)]
struct Forwarded {
    ctx: u32,
    idx: usize,
    leader: u32,
    key: String,
}

/// The keys with a call out (or about to go out) on this worker, the checks queued behind it,
/// and the checks this worker sent to other workers.
#[derive(Debug, Default)]
pub(super) struct Chains {
    /// By bucket key (a digest no client chooses bits of: the fast seeded hash is safe here).
    by_key: HashMap<String, Chain, Seeded>,
    /// This worker's shared queue (None: the host gave none, chains stay per worker).
    lane: Option<u32>,
    forwarded: HashMap<u64, Forwarded, super::ById>,
    /// Leaders this worker sent checks to, by key (a copy of the table's records, so a hot key's
    /// checks skip the shared-data read; at most `KNOWN_LEADERS`).
    leaders: HashMap<String, u32, Seeded>,
    /// When each forwarded check stops waiting for its leader.
    deadlines: BinaryHeap<Reverse<(u64, u64)>>,
    next_ask: u64,
}

impl Chains {
    /// When the first forwarded check stops waiting for its leader.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        self.deadlines.peek().map(|Reverse((due, _))| *due)
    }

    pub(super) fn remove_waiter(&mut self, key: &str, ctx: u32) {
        if let Some(chain) = self.by_key.get_mut(key) {
            chain
                .waiting
                .retain(|w| !matches!(w, Waiter::Local(x, _) if *x == ctx));
        }
    }
}

/// Whether a check may share a call: one token, no reservation.
pub(super) fn eligible(call: &ScriptCall) -> bool {
    call.cost == 1 && call.max_wait_ms == 0
}

/// Messages between workers: one check sent to a leader ("a"), or answers to checks ("r" lines).
mod wire {
    use super::ScriptCall;
    use crate::decimal;

    /// `a <queue> <ask> <rule> <burst> <rate> <period_ms> <key>`: the key last, as it is (it is
    /// the bucket key, free of user text; a message holds one ask).
    pub fn ask(queue: u32, ask: u64, rule: usize, call: &ScriptCall) -> Vec<u8> {
        let mut m = Vec::with_capacity(48 + call.key.len());
        m.extend_from_slice(b"a");
        for n in [
            u64::from(queue),
            ask,
            rule as u64,
            call.burst,
            call.rate,
            call.period_ms,
        ] {
            m.push(b' ');
            decimal::push_bytes(&mut m, n);
        }
        m.push(b' ');
        m.extend_from_slice(call.key.as_bytes());
        m
    }

    /// An ask: the asking queue, its number, and the rule and one-token call it asks for.
    pub fn parse_ask(m: &[u8]) -> Option<(u32, u64, usize, ScriptCall)> {
        let mut parts = m.strip_prefix(b"a ")?.splitn(7, |b| *b == b' ');
        let mut num = || -> Option<u64> { std::str::from_utf8(parts.next()?).ok()?.parse().ok() };
        let queue = u32::try_from(num()?).ok()?;
        let ask = num()?;
        let rule = usize::try_from(num()?).ok()?;
        let (burst, rate, period_ms) = (num()?, num()?, num()?);
        let key = String::from_utf8(parts.next()?.to_vec()).ok()?;
        let limits = crate::bucket::Limits {
            burst,
            rate,
            period_ms,
        };
        Some((queue, ask, rule, ScriptCall::new(key, &limits, 1)))
    }
}

/// One answer line: `r <ask> a <remaining> <reset_ms>` (admitted), `r <ask> d <retry_ms>`
/// (denied) or `r <ask> f` (the call failed: the asking worker applies its failure mode).
fn push_answer(out: &mut Vec<u8>, ask: u64, outcome: Option<Outcome>) {
    out.extend_from_slice(b"r ");
    decimal::push_bytes(out, ask);
    match outcome {
        Some(Outcome::Allowed {
            remaining,
            reset_ms,
        }) => {
            out.extend_from_slice(b" a ");
            decimal::push_bytes(out, remaining);
            out.push(b' ');
            decimal::push_bytes(out, reset_ms);
        }
        Some(Outcome::Denied { retry_ms }) => {
            out.extend_from_slice(b" d ");
            decimal::push_bytes(out, retry_ms);
        }
        _ => out.extend_from_slice(b" f"),
    }
    out.push(b'\n');
}

/// An answer line: the ask and its outcome (None: the call failed).
fn parse_answer(line: &[u8]) -> Option<(u64, Option<Outcome>)> {
    let mut parts = std::str::from_utf8(line.strip_prefix(b"r ")?)
        .ok()?
        .split(' ');
    let ask = parts.next()?.parse().ok()?;
    let kind = parts.next()?;
    let nums: Vec<u64> = parts.map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let outcome = match (kind, nums.as_slice()) {
        ("a", &[remaining, reset_ms]) => Some(Outcome::Allowed {
            remaining,
            reset_ms,
        }),
        ("d", &[retry_ms]) => Some(Outcome::Denied { retry_ms }),
        ("f", []) => None,
        _ => return None,
    };
    Some((ask, outcome))
}

/// Leaders remembered per worker before the copy starts over.
const KNOWN_LEADERS: usize = 1024;

impl Engine {
    /// This worker's shared queue: hot exact keys are shared with the proxy's other workers.
    pub fn set_queue(&mut self, queue: u32) {
        self.chains.lane = Some(queue);
    }

    /// Queues exact check `idx` of `ctx` behind the call out for its key, or sends it to the
    /// worker leading the key; false if neither (the check sends its own call, which starts a
    /// chain).
    pub(super) fn join_chain(
        &mut self,
        host: &mut dyn Host,
        (rule, call): (usize, &ScriptCall),
        ctx: u32,
        idx: usize,
        now: u64,
    ) -> bool {
        if let Some(chain) = self.chains.by_key.get_mut(&call.key) {
            chain.waiting.push(Waiter::Local(ctx, idx));
            return true;
        }
        if self.forward(host, (rule, call), ctx, idx, now) {
            return true;
        }
        self.chains
            .by_key
            .insert(call.key.clone(), Chain::default());
        false
    }

    /// Sends check `idx` of `ctx` (rule `rule`, call `call`) to the worker leading its key, if
    /// another one does.
    fn forward(
        &mut self,
        host: &mut dyn Host,
        (rule, call): (usize, &ScriptCall),
        ctx: u32,
        idx: usize,
        now: u64,
    ) -> bool {
        let Some(me) = self.chains.lane else {
            return false;
        };
        let known = self.chains.leaders.get(&call.key).copied();
        let leader =
            known.or_else(|| Leaders::new(host.store(), &self.plugin.ns).leader(&call.key));
        let Some(leader) = leader.filter(|q| *q != me) else {
            return false;
        };
        let ask = self.chains.next_ask;
        if !host.enqueue(leader, &wire::ask(me, ask, rule, call)) {
            self.forget_leader(host, &call.key, leader);
            return false;
        }
        if known.is_none() {
            if self.chains.leaders.len() >= KNOWN_LEADERS {
                self.chains.leaders.clear();
            }
            self.chains.leaders.insert(call.key.clone(), leader);
        }
        self.chains.next_ask += 1;
        let patience = self.plugin.config.backend.timeout_ms.saturating_mul(2);
        self.chains
            .deadlines
            .push(Reverse((now.saturating_add(patience), ask)));
        self.chains.forwarded.insert(
            ask,
            Forwarded {
                ctx,
                idx,
                leader,
                key: call.key.clone(),
            },
        );
        self.plugin.metrics.count(rule, Counter::Forwarded, 1);
        true
    }

    fn waits(&self, w: &Waiter) -> bool {
        match *w {
            Waiter::Local(ctx, idx) => self.is_waiting(ctx, idx),
            Waiter::Remote { .. } => true,
        }
    }

    /// A call of `key`'s chain was answered (or failed): send the queued checks as one call, now.
    /// A chain that goes on claims its key for this worker, or, if another worker leads it, ends
    /// with this call.
    pub(super) fn chain_next(&mut self, host: &mut dyn Host, key: &str, now: u64) {
        let queued = match self.chains.by_key.get_mut(key) {
            Some(chain) => std::mem::take(&mut chain.waiting),
            None => return,
        };
        // Requests that went away or were decided meanwhile would only waste a token.
        let checks: Vec<Waiter> = queued.into_iter().filter(|w| self.waits(w)).collect();
        let local_call = checks.iter().find_map(|w| match *w {
            Waiter::Local(ctx, idx) => self.check_call(ctx, idx),
            Waiter::Remote { .. } => None,
        });
        let Some(chain) = self.chains.by_key.get_mut(key) else {
            return;
        };
        let template = local_call.or_else(|| chain.remote_call.clone());
        let Some((rule, mut call)) = template.filter(|_| !checks.is_empty()) else {
            self.end_chain(host, key);
            return;
        };
        if !chain.leads {
            if let Some(me) = self.chains.lane {
                let leader = Leaders::new(host.store(), &self.plugin.ns).claim(key, me);
                let leader = leader.ok().flatten();
                chain.leads = leader == Some(me);
                if leader.is_some_and(|q| q != me) {
                    // Another worker leads the key: this call, which these checks were promised,
                    // is the chain's last; later checks go to the leader.
                    self.chains.by_key.remove(key);
                }
            }
        }
        call.cost = 1;
        call.lease_want = checks.len() as u64;
        if let Err((e, purpose)) =
            self.send(host, Call::new(rule, call, Purpose::Batch(checks), now))
        {
            if let Purpose::Batch(checks) = purpose {
                self.fail_chained(host, &checks, &e, now);
            }
            self.chain_next(host, key, now);
        }
    }

    fn end_chain(&mut self, host: &mut dyn Host, key: &str) {
        if let Some(chain) = self.chains.by_key.remove(key) {
            if let (true, Some(me)) = (chain.leads, self.chains.lane) {
                let _ = Leaders::new(host.store(), &self.plugin.ns).release(key, me);
            }
        }
    }

    /// `leader` no longer takes `key`'s checks: dropped here and from the table.
    fn forget_leader(&mut self, host: &mut dyn Host, key: &str, leader: u32) {
        self.chains.leaders.remove(key);
        let _ = Leaders::new(host.store(), &self.plugin.ns).release(key, leader);
    }

    /// The answer to a coalesced call: the first `granted` checks are admitted, the others
    /// denied until the next token refills.
    pub(super) fn batch_answer(
        &mut self,
        host: &mut dyn Host,
        asked: &ScriptCall,
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
        let granted = if r.allowed { r.granted } else { 0 };
        // Until one more token refills (what Redis would answer a lone request now).
        let next_token_ms = asked.period_ms.div_ceil(asked.rate.max(1)).max(1);
        let retry_ms = if r.allowed {
            next_token_ms
        } else {
            u64::try_from(r.retry_after_ms).unwrap_or(r.reset_after_ms)
        };
        if granted < checks.len() as u64 {
            let until = sent_ms.saturating_add(retry_ms);
            let _ = DenyCache::new(host.store(), &self.plugin.ns).remember(&asked.key, 1, until);
        }
        let mut remaining = r.remaining.saturating_add(granted);
        let mut answers = Answers::default();
        for (i, w) in checks.into_iter().enumerate() {
            let outcome = if (i as u64) < granted {
                remaining = remaining.saturating_sub(1);
                Outcome::Allowed {
                    remaining,
                    reset_ms: r.reset_after_ms,
                }
            } else {
                Outcome::Denied { retry_ms }
            };
            match w {
                Waiter::Local(ctx, idx) => self.settle(host, ctx, idx, outcome),
                Waiter::Remote { queue, ask } => answers.add(queue, ask, Some(outcome)),
            }
        }
        answers.send(host);
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
                Waiter::Local(ctx, idx) => self.fail_check(host, ctx, idx, e, now),
                Waiter::Remote { queue, ask } => answers.add(queue, ask, None),
            }
        }
        answers.send(host);
    }

    /// A message on queue `queue`, one this worker's root registered: a check another worker sent
    /// here, or answers to checks sent from here. The host calls this once per message put on the
    /// queue, so one is taken. `queue` is the host's word, not `lane`: after a reconfiguration
    /// in the same VM (a new engine, a new queue) messages sent to the old queue still come here,
    /// and are served (an answer meant for the old engine finds no check and is dropped).
    pub fn queue_ready(&mut self, host: &mut dyn Host, queue: u32) {
        let Some(message) = host.dequeue(queue) else {
            return;
        };
        let now = self.now(host);
        if let Some((queue, ask, rule, call)) = wire::parse_ask(&message) {
            self.take_ask(host, (queue, ask), rule, call, now);
        } else {
            for line in message.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                match parse_answer(line) {
                    Some((ask, outcome)) => self.answered(host, ask, outcome, now),
                    None => log::warn!("tollgate: unreadable message between workers"),
                }
            }
        }
        self.schedule(host, now, false);
    }

    /// A check another worker sent: it joins the key's chain here, or starts one with a call now
    /// (this runs in the root context, which carries it).
    fn take_ask(
        &mut self,
        host: &mut dyn Host,
        (queue, ask): (u32, u64),
        rule: usize,
        call: ScriptCall,
        now: u64,
    ) {
        let waiter = Waiter::Remote { queue, ask };
        if self.plugin.rule(rule).is_none() {
            let mut answers = Answers::default();
            answers.add(queue, ask, None);
            answers.send(host);
            return;
        }
        let key = call.key.clone();
        match self.chains.by_key.get_mut(&key) {
            // A chain here always has a call out, or one about to go.
            Some(chain) => {
                chain.remote_call = Some((rule, call));
                chain.waiting.push(waiter);
            }
            None => {
                let chain = Chain {
                    waiting: vec![waiter],
                    remote_call: Some((rule, call)),
                    leads: false,
                };
                self.chains.by_key.insert(key.clone(), chain);
                self.chain_next(host, &key, now);
            }
        }
    }

    /// The leader's answer to check `ask` (None: its call failed).
    fn answered(&mut self, host: &mut dyn Host, ask: u64, outcome: Option<Outcome>, now: u64) {
        let Some(f) = self.chains.forwarded.remove(&ask) else {
            return;
        };
        match outcome {
            Some(o) => self.settle(host, f.ctx, f.idx, o),
            None => self.fail_check(host, f.ctx, f.idx, &BackendError::Reset, now),
        }
    }

    /// Forwarded checks whose leader did not answer in time: the leader is forgotten and each
    /// check goes again from this worker.
    pub(super) fn expire_forwarded(&mut self, host: &mut dyn Host, now: u64) {
        while let Some(Reverse((due, ask))) = self.chains.deadlines.peek().copied() {
            if due > now {
                break;
            }
            self.chains.deadlines.pop();
            let Some(f) = self.chains.forwarded.remove(&ask) else {
                continue;
            };
            self.forget_leader(host, &f.key, f.leader);
            if self.is_waiting(f.ctx, f.idx) {
                self.send_exact(host, f.ctx, f.idx, now);
            }
        }
    }
}

/// Answers to other workers' checks, one message per worker.
#[derive(Default)]
struct Answers(Vec<(u32, Vec<u8>)>);

impl Answers {
    fn add(&mut self, queue: u32, ask: u64, outcome: Option<Outcome>) {
        let at = match self.0.iter().position(|(q, _)| *q == queue) {
            Some(at) => at,
            None => {
                self.0.push((queue, Vec::new()));
                self.0.len() - 1
            }
        };
        if let Some((_, message)) = self.0.get_mut(at) {
            push_answer(message, ask, outcome);
        }
    }

    fn send(self, host: &mut dyn Host) {
        for (queue, message) in self.0 {
            // A worker that is gone has no check waiting for this.
            host.enqueue(queue, &message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_and_answers_read_back_as_written() {
        let limits = crate::bucket::Limits {
            burst: 20,
            rate: 10,
            period_ms: 1000,
        };
        let call = ScriptCall::new("tg:{r 1:abc}".into(), &limits, 1);
        let m = wire::ask(7, 42, 3, &call);
        assert_eq!(wire::parse_ask(&m), Some((7, 42, 3, call)));
        assert_eq!(wire::parse_ask(b"a 7 42 3 20 10"), None, "no key");
        assert_eq!(wire::parse_ask(b"a 7 x 3 20 10 1000 k"), None);

        let mut out = Vec::new();
        let allowed = Outcome::Allowed {
            remaining: 5,
            reset_ms: 900,
        };
        push_answer(&mut out, 1, Some(allowed));
        push_answer(&mut out, 2, Some(Outcome::Denied { retry_ms: 100 }));
        push_answer(&mut out, 3, None);
        let lines: Vec<_> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(parse_answer)
            .collect();
        assert_eq!(
            lines,
            [
                Some((1, Some(allowed))),
                Some((2, Some(Outcome::Denied { retry_ms: 100 }))),
                Some((3, None)),
            ]
        );
        assert_eq!(parse_answer(b"r 1 a 5"), None);
        assert_eq!(parse_answer(b"r 1 x"), None);
    }
}
