//! Exact mode at a hot key: while one call for a key is out, this worker's other exact checks of
//! that key queue, and go to Redis together as one script call asking for one token each
//! (`cost` 1, `lease_want` = how many).
//!
//! Invariant: every request is still decided by the global bucket, and no token is ever held
//! locally: only checks of cost 1 (no reservation) are coalesced, so a grant of `g` tokens
//! admits exactly the first `g` of them and the rest are denied as Redis would have denied them
//! then. A queued check waits for at most the call already out plus its own (and, when the call
//! out was carried by a request rather than the root context, one tick: a call shared by several
//! requests must be carried by a context that outlives them all).

use std::collections::{HashMap, HashSet};

use super::{Call, Engine, Host, Outcome, Purpose};
use crate::backend::{BackendError, Reply, ScriptCall};
use crate::shared::deny::DenyCache;

/// The keys with a call out (or about to go out) on this worker, and the checks queued behind it.
#[derive(Debug, Default)]
pub(super) struct Chains {
    /// Checks waiting for the key's next call, in arrival order.
    by_key: HashMap<String, Vec<(u32, usize)>>,
    /// Keys whose next call must be sent from the root context (at the next tick).
    pending: HashSet<String>,
}

impl Chains {
    /// Whether any chain waits for the tick.
    pub(super) fn pending(&self) -> bool {
        !self.pending.is_empty()
    }

    pub(super) fn remove_waiter(&mut self, key: &str, ctx: u32) {
        if let Some(q) = self.by_key.get_mut(key) {
            q.retain(|(x, _)| *x != ctx);
        }
    }

    /// The call for `key` will never be answered here: its queue moves on at the next tick.
    pub(super) fn lost(&mut self, key: &str) {
        if self.by_key.contains_key(key) {
            self.pending.insert(key.to_string());
        }
    }
}

/// Whether a check may share a call: one token, no reservation.
pub(super) fn eligible(call: &ScriptCall) -> bool {
    call.cost == 1 && call.max_wait_ms == 0
}

impl Engine {
    /// Queues exact check `idx` of `ctx` behind the call out for its key, if there is one; false
    /// if there is none (the check sends its own call, which starts the chain).
    pub(super) fn join_chain(&mut self, key: &str, ctx: u32, idx: usize) -> bool {
        match self.chains.by_key.get_mut(key) {
            Some(queued) => {
                queued.push((ctx, idx));
                true
            }
            None => {
                self.chains.by_key.insert(key.to_string(), Vec::new());
                false
            }
        }
    }

    /// A call of `key`'s chain was answered (or failed) through `carrier`: send the queued checks
    /// as one call, from here if the root context carries it, else at the next tick.
    pub(super) fn chain_next(&mut self, host: &mut dyn Host, key: &str, carrier: u32, now: u64) {
        self.chains.pending.remove(key);
        let queued = match self.chains.by_key.get_mut(key) {
            Some(queued) => std::mem::take(queued),
            None => return,
        };
        // Requests that went away or were decided meanwhile would only waste a token.
        let checks: Vec<(u32, usize)> = queued
            .into_iter()
            .filter(|(ctx, idx)| self.is_waiting(*ctx, *idx))
            .collect();
        let first = checks
            .first()
            .and_then(|(ctx, idx)| self.check_call(*ctx, *idx));
        let (Some((rule, mut call)), Some(queued)) = (first, self.chains.by_key.get_mut(key))
        else {
            self.chains.by_key.remove(key);
            return;
        };
        if carrier != self.root {
            *queued = checks;
            self.chains.pending.insert(key.to_string());
            return;
        }
        call.cost = 1;
        call.lease_want = checks.len() as u64;
        let root = self.root;
        if let Err((e, purpose)) = self.send(
            host,
            Call::new(rule, call, Purpose::Batch(checks), root, now),
        ) {
            if let Purpose::Batch(checks) = purpose {
                for (ctx, idx) in checks {
                    self.fail_check(host, ctx, idx, &e, now);
                }
            }
            self.chain_next(host, key, root, now);
        }
    }

    /// Sends the chains that wait for the root context (from the tick).
    pub(super) fn send_pending_chains(&mut self, host: &mut dyn Host, now: u64) {
        let pending: Vec<String> = self.chains.pending.iter().cloned().collect();
        let root = self.root;
        for key in pending {
            self.chain_next(host, &key, root, now);
        }
    }

    /// The answer to a coalesced call: the first `granted` checks are admitted, the others
    /// denied until the next token refills.
    pub(super) fn batch_answer(
        &mut self,
        host: &mut dyn Host,
        asked: &ScriptCall,
        checks: Vec<(u32, usize)>,
        reply: Result<Reply, BackendError>,
        sent_ms: u64,
        now: u64,
    ) {
        let r = match reply {
            Ok(r) => r,
            Err(e) => {
                for (ctx, idx) in checks {
                    self.fail_check(host, ctx, idx, &e, now);
                }
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
        for (i, (ctx, idx)) in checks.into_iter().enumerate() {
            let outcome = if (i as u64) < granted {
                remaining = remaining.saturating_sub(1);
                Outcome::Allowed {
                    remaining,
                    reset_ms: r.reset_after_ms,
                }
            } else {
                Outcome::Denied { retry_ms }
            };
            self.settle(host, ctx, idx, outcome);
        }
    }
}
