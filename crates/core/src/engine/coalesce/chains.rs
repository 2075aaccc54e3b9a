//! The keys with an exact call out (or about to go out) on this worker, the checks queued behind
//! each, the checks this worker sent to other workers, and the leaders it sent them to.
//!
//! Invariant: a chain exists for a key exactly while a call of it is out or about to go (so a
//! check that joins one is carried by the next call); a forwarded check is remembered until its
//! answer comes or its patience runs out, whichever is first; at most `KNOWN_LEADERS` leaders are
//! remembered.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::super::compaction::worth_compacting;
use super::super::ids::{ById, CheckId, ContextId};
use super::super::rules::RuleRef;
use crate::backend::ScriptCall;
use crate::rule::hash::Seeded;
use crate::shared::lead::Leaders;

/// Leaders remembered per worker before the copy starts over.
const KNOWN_LEADERS: usize = 1024;

/// A check waiting for a key's next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiter {
    /// Check `check` of request `ctx` on this worker.
    Local(ContextId, CheckId),
    /// A check another worker sent here: its answer goes to that worker's `queue` as `ask`.
    Remote { queue: u32, ask: u64 },
}

/// A key with a call out (or about to go out) on this worker.
#[derive(Debug, Default)]
struct Chain {
    /// Checks waiting for the key's next call, in arrival order.
    waiting: Vec<Waiter>,
    /// The call the latest remote check asked for (its rule, the call): the template of a call
    /// with no local check to copy it from.
    remote_call: Option<(RuleRef, ScriptCall)>,
    /// This worker holds the key in the proxy's leader table.
    leads: bool,
    /// Requests gone or decided since `waiting` was last looked through (their checks may still
    /// be in it).
    gone: usize,
}

/// A check this worker sent to another worker's queue.
#[derive(Debug)]
pub struct Forwarded {
    pub ctx: ContextId,
    pub check: CheckId,
    pub leader: u32,
    /// The check's rule and call (the key's, for the refund of a token its request did not use).
    pub rule: RuleRef,
    pub call: ScriptCall,
    /// Relayed to the worker collecting the proxy's next flight (its own call there), not
    /// queued behind the leader's call for its key.
    pub relayed: bool,
}

/// The keys with a call out (or about to go out) on this worker, the checks queued behind it,
/// and the checks this worker sent to other workers.
#[derive(Debug, Default)]
pub struct Chains {
    /// By bucket key (a digest no client chooses bits of: the fast seeded hash is safe here).
    by_key: HashMap<String, Chain, Seeded>,
    /// This worker's shared queue (None: the host gave none, chains stay per worker).
    lane: Option<u32>,
    forwarded: HashMap<u64, Forwarded, ById>,
    /// Leaders this worker sent checks to, by key (a copy of the table's records, so a hot key's
    /// checks skip the shared-data read; at most `KNOWN_LEADERS`).
    leaders: HashMap<String, u32, Seeded>,
    /// When each forwarded check stops waiting for its leader.
    deadlines: BinaryHeap<Reverse<(u64, u64)>>,
    next_ask: u64,
}

impl Chains {
    /// This worker's shared queue, if the host gave it one.
    pub fn lane(&self) -> Option<u32> {
        self.lane
    }

    pub fn set_lane(&mut self, queue: u32) {
        self.lane = Some(queue);
    }

    /// When the first forwarded check stops waiting for its leader.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.peek().map(|Reverse((due, _))| *due)
    }

    /// Queues `waiter` behind the call out for `key`; false if there is none.
    pub fn join(&mut self, key: &str, waiter: Waiter) -> bool {
        match self.by_key.get_mut(key) {
            Some(chain) => {
                chain.waiting.push(waiter);
                true
            }
            None => false,
        }
    }

    /// A call for `key` is about to go out: later checks of the key queue behind it.
    pub fn start(&mut self, key: &str) {
        self.by_key.insert(key.to_string(), Chain::default());
    }

    /// A check another worker sent (`waiter`, asking for `call` of `rule`) joins `key`'s chain;
    /// true if it starts one (the caller sends its call now).
    pub fn join_remote(&mut self, key: &str, waiter: Waiter, asked: (RuleRef, ScriptCall)) -> bool {
        match self.by_key.get_mut(key) {
            // A chain here always has a call out, or one about to go.
            Some(chain) => {
                chain.remote_call = Some(asked);
                chain.waiting.push(waiter);
                false
            }
            None => {
                let chain = Chain {
                    waiting: vec![waiter],
                    remote_call: Some(asked),
                    ..Chain::default()
                };
                self.by_key.insert(key.to_string(), chain);
                true
            }
        }
    }

    /// Takes the checks queued for `key`'s next call (None: no chain).
    pub fn take_waiting(&mut self, key: &str) -> Option<Vec<Waiter>> {
        self.by_key.get_mut(key).map(|chain| {
            chain.gone = 0;
            std::mem::take(&mut chain.waiting)
        })
    }

    /// A request that may have a check queued for `key`'s next call is gone, or was decided by
    /// its other checks. Its check stays until the next call goes (which drops the checks no
    /// longer waited for), unless the gone ones may outnumber the others ([`worth_compacting`]):
    /// then `waits` says which to keep. Taking each off as its request goes would cost n waiters
    /// that all leave n² steps; keeping them all, a chain that grows with every stream a client
    /// opens and resets (or gets refused by another rule) while the call is out.
    pub fn left(&mut self, key: &str, waits: impl Fn(&Waiter) -> bool) {
        let Some(chain) = self.by_key.get_mut(key) else {
            return;
        };
        chain.gone = chain.gone.saturating_add(1);
        // From below: a gone request's check may not be in the chain (it carried the call out).
        let live = chain.waiting.len().saturating_sub(chain.gone);
        if worth_compacting(chain.waiting.len(), live) {
            chain.waiting.retain(waits);
            chain.gone = 0;
        }
    }

    /// How many checks wait in chains, gone requests' included.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.by_key.values().map(|c| c.waiting.len()).sum()
    }

    /// The call the latest remote check of `key` asked for.
    pub fn remote_call(&self, key: &str) -> Option<(RuleRef, ScriptCall)> {
        self.by_key.get(key)?.remote_call.clone()
    }

    /// `key`'s chain goes on past its first call: it claims the key for this worker in the
    /// proxy's leader table (once). If another worker leads the key, the call about to go out,
    /// which the queued checks were promised, is the chain's last: later checks go to the leader.
    pub fn goes_on(&mut self, key: &str, leaders: &Leaders) {
        let (Some(chain), Some(me)) = (self.by_key.get_mut(key), self.lane) else {
            return;
        };
        if chain.leads {
            return;
        }
        let leader = leaders.claim(key, me).ok().flatten();
        chain.leads = leader == Some(me);
        if leader.is_some_and(|q| q != me) {
            self.by_key.remove(key);
        }
    }

    /// `key`'s chain is over: nothing queued for a next call. Its place in the leader table goes.
    pub fn end(&mut self, key: &str, leaders: &Leaders) {
        if let Some(chain) = self.by_key.remove(key) {
            if let (true, Some(me)) = (chain.leads, self.lane) {
                let _ = leaders.release(key, me);
            }
        }
    }

    /// This worker's engine goes: its places in the leader table go (no engine reads its queue
    /// any more; the workers that would send it checks call for them themselves), and the checks
    /// other workers sent that wait for a next call here are taken off: (queue, ask) each, for
    /// their workers to send.
    pub fn leave(&mut self, leaders: &Leaders) -> Vec<(u32, u64)> {
        let mut theirs = Vec::new();
        for (key, chain) in &mut self.by_key {
            if let (true, Some(me)) = (chain.leads, self.lane) {
                let _ = leaders.release(key, me);
            }
            chain.waiting.retain(|w| match *w {
                Waiter::Remote { queue, ask } => {
                    theirs.push((queue, ask));
                    false
                }
                Waiter::Local(..) => true,
            });
        }
        theirs
    }

    // ----- checks sent to other workers -----

    /// The leader this worker last sent a check of `key` to.
    pub fn known_leader(&self, key: &str) -> Option<u32> {
        self.leaders.get(key).copied()
    }

    /// `leader` no longer takes `key`'s checks: dropped here and from the table.
    pub fn forget_leader(&mut self, key: &str, leader: u32, leaders: &Leaders) {
        self.leaders.remove(key);
        let _ = leaders.release(key, leader);
    }

    /// The number the next forwarded check goes by.
    pub fn next_ask(&self) -> u64 {
        self.next_ask
    }

    /// Check `f` went to its leader as ask [`Chains::next_ask`]; it waits for the answer until
    /// `due`. `learnt`: the leader was read from the table, and is remembered here.
    pub fn forwarded(&mut self, f: Forwarded, due: u64, learnt: bool) {
        if learnt {
            if self.leaders.len() >= KNOWN_LEADERS {
                self.leaders.clear();
            }
            self.leaders.insert(f.call.key.clone(), f.leader);
        }
        let ask = self.next_ask;
        self.next_ask += 1;
        self.deadlines.push(Reverse((due, ask)));
        self.forwarded.insert(ask, f);
    }

    /// The check that went as `ask`, answered now (None: answered before, or given up on).
    pub fn answered(&mut self, ask: u64) -> Option<Forwarded> {
        let f = self.forwarded.remove(&ask)?;
        if worth_compacting(self.deadlines.len(), self.forwarded.len()) {
            // The deadlines of answered checks: with a long `timeout_ms` they would otherwise
            // pile up for eight of them.
            let waiting = &self.forwarded;
            self.deadlines
                .retain(|Reverse((_, ask))| waiting.contains_key(ask));
        }
        Some(f)
    }

    /// How many forwarded checks wait, and how many deadlines are kept.
    #[cfg(test)]
    pub fn sizes(&self) -> (usize, usize) {
        (self.forwarded.len(), self.deadlines.len())
    }

    /// The next forwarded check whose leader did not answer by `now`.
    pub fn pop_expired(&mut self, now: u64) -> Option<Forwarded> {
        while let Some(Reverse((due, ask))) = self.deadlines.peek().copied() {
            if due > now {
                return None;
            }
            self.deadlines.pop();
            if let Some(f) = self.forwarded.remove(&ask) {
                return Some(f);
            }
        }
        None
    }
}
