//! The lease waits of one worker: per bucket key, the checks waiting for the proxy's lease call on
//! that key, in arrival order, and where that call stands.
//!
//! Invariant: a waiter is in at most one queue, once; it leaves it when it is served, failed,
//! expired, or its request is decided or gone; a key's queue is forgotten once it is idle and
//! empty. Patience deadlines are arrival plus a constant, so the front one is always the nearest.

use std::collections::{HashMap, HashSet, VecDeque};

use super::super::ids::{CheckId, ContextId};
use super::super::rules::RuleRef;
use super::super::stash;
use super::super::verdict::Outcome;
use crate::bucket::Limits;
use crate::rule::hash::Seeded;
use crate::shared::lease::{Spent, Unmet};

/// How often a key waiting on another worker's call (or a lost one) is polled, in ms.
const POLL_MS: u64 = 1;

/// One waiting check.
#[derive(Debug, Clone, Copy)]
pub struct Waiter {
    pub ctx: ContextId,
    pub check: CheckId,
    pub cost: u64,
}

/// Where the key's lease call stands, from this worker's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
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
    rule: RuleRef,
    /// The key's effective limits.
    limits: Limits,
    waiters: VecDeque<Waiter>,
    state: State,
}

/// What the next lease call of a key is for: its rule and limits, what its first waiter needs,
/// and what all of them need together.
#[derive(Debug)]
pub struct Head {
    pub rule: RuleRef,
    pub limits: Limits,
    pub first: u64,
    pub waiting: u64,
}

/// A polled key's queue, as the tick looks at it.
#[derive(Debug)]
pub struct Polled {
    pub state: State,
    pub rule: RuleRef,
    pub limits: Limits,
    /// What the first waiter needs (1 if none waits).
    pub first: u64,
}

/// The lease waits of one worker.
#[derive(Debug, Default)]
pub struct Waits {
    /// By bucket key (a digest no client chooses bits of: the fast seeded hash is safe here).
    by_key: HashMap<String, Queue, Seeded>,
    /// Keys in `Foreign` or `Lost` state (polled by the tick).
    polled: HashSet<String, Seeded>,
    /// (deadline, ctx, check) in arrival order; deadlines are arrival + a constant patience, so
    /// the front is always the nearest.
    patience: VecDeque<(u64, ContextId, CheckId)>,
    /// Tokens this worker's requests asked for and were denied locally (the deny cache, or a
    /// reservation still refilling) since the key's last lease call; the next call counts them as
    /// demand, so a saturated key asks for what its clients want.
    unmet: HashMap<String, Unmet, Seeded>,
}

impl Waits {
    pub fn waiters(&self) -> usize {
        self.by_key.values().map(|q| q.waiters.len()).sum()
    }

    /// `waiter` of rule `rule` waits for `key`'s lease call until `due`; whether no call is out
    /// for the key (the caller starts one).
    pub fn add(
        &mut self,
        key: &str,
        (rule, limits): (&RuleRef, Limits),
        waiter: Waiter,
        due: u64,
    ) -> bool {
        let q = self.by_key.entry(key.to_string()).or_insert(Queue {
            rule: rule.clone(),
            limits,
            waiters: VecDeque::new(),
            state: State::Idle,
        });
        q.waiters.push_back(waiter);
        let idle = q.state == State::Idle;
        self.patience.push_back((due, waiter.ctx, waiter.check));
        idle
    }

    /// What `key`'s next lease call is for; None if no queue waits for one (an empty queue goes
    /// idle and is forgotten).
    pub fn head(&mut self, key: &str) -> Option<Head> {
        let q = self.by_key.get(key)?;
        let Some(first) = q.waiters.front().map(|w| w.cost) else {
            self.set_state(key, State::Idle);
            self.forget_if_idle(key);
            return None;
        };
        Some(Head {
            rule: q.rule.clone(),
            limits: q.limits,
            first,
            waiting: q
                .waiters
                .iter()
                .map(|w| w.cost)
                .fold(0, u64::saturating_add),
        })
    }

    /// `key`'s rule and effective limits, while a queue waits on it.
    pub fn rule_of(&self, key: &str) -> Option<(RuleRef, Limits)> {
        self.by_key.get(key).map(|q| (q.rule.clone(), q.limits))
    }

    pub fn set_state(&mut self, key: &str, state: State) {
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
    pub fn flight_lost(&mut self, key: &str) {
        if self.by_key.contains_key(key) {
            self.set_state(key, State::Lost);
        }
    }

    /// Removes every waiter of `ctx` on `key`.
    pub fn remove_waiter(&mut self, key: &str, ctx: ContextId) {
        if let Some(q) = self.by_key.get_mut(key) {
            q.waiters.retain(|w| w.ctx != ctx);
        }
        self.forget_if_idle(key);
    }

    pub fn forget_if_idle(&mut self, key: &str) {
        if self
            .by_key
            .get(key)
            .is_some_and(|q| q.waiters.is_empty() && q.state == State::Idle)
        {
            self.by_key.remove(key);
            self.polled.remove(key);
        }
    }

    /// Whether `key` has waiters and no call out.
    pub fn idle_with_waiters(&self, key: &str) -> bool {
        self.by_key
            .get(key)
            .is_some_and(|q| !q.waiters.is_empty() && q.state == State::Idle)
    }

    /// What `key`'s waiters need, in order.
    pub fn costs(&self, key: &str) -> Vec<u64> {
        self.by_key
            .get(key)
            .map(|q| q.waiters.iter().map(|w| w.cost).collect())
            .unwrap_or_default()
    }

    /// Takes every waiter of `key`, in order.
    pub fn drain(&mut self, key: &str) -> Vec<Waiter> {
        let out = self
            .by_key
            .get_mut(key)
            .map(|q| q.waiters.drain(..).collect())
            .unwrap_or_default();
        self.forget_if_idle(key);
        out
    }

    /// Serves `key`'s waiters: the first ones admitted on the tokens `spent` for them, in order;
    /// then any whose cost `denied` says the deny cache refuses (with its retry time). Returns
    /// them with their outcomes; the rest keep waiting.
    pub fn serve(
        &mut self,
        key: &str,
        spent: &[Spent],
        mut denied: impl FnMut(u64) -> Option<u64>,
    ) -> Vec<(Waiter, Outcome)> {
        let mut served = Vec::new();
        let Some(q) = self.by_key.get_mut(key) else {
            return served;
        };
        for s in spent {
            let Some(w) = q.waiters.pop_front() else {
                break;
            };
            served.push((w, Outcome::leased(*s)));
        }
        q.waiters.retain(|w| match denied(w.cost) {
            Some(retry_ms) => {
                served.push((*w, Outcome::Denied { retry_ms }));
                false
            }
            None => true,
        });
        served
    }

    // ----- what the tick looks at -----

    /// Drops the patience deadlines at the front whose checks no longer wait.
    pub fn drop_served_patience(&mut self, waiting: impl Fn(ContextId, CheckId) -> bool) {
        while let Some(&(_, ctx, check)) = self.patience.front() {
            if waiting(ctx, check) {
                break;
            }
            self.patience.pop_front();
        }
    }

    /// The next patience deadline due at `now`: its check (which may have been served since).
    pub fn pop_expired(&mut self, now: u64) -> Option<(ContextId, CheckId)> {
        match self.patience.front() {
            Some(&(due, ctx, check)) if due <= now => {
                self.patience.pop_front();
                Some((ctx, check))
            }
            _ => None,
        }
    }

    /// The nearest time the tick must look at lease waits.
    pub fn next_due(&self, now: u64) -> Option<u64> {
        let poll = (!self.polled.is_empty()).then_some(now.saturating_add(POLL_MS));
        let patience = self.patience.front().map(|(due, _, _)| *due);
        match (poll, patience) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The keys waiting on another worker's call, or on a lost one.
    pub fn polled_keys(&self) -> Vec<String> {
        self.polled.iter().cloned().collect()
    }

    /// A polled key's queue (None: it has none any more, and is no longer polled).
    pub fn polled(&mut self, key: &str) -> Option<Polled> {
        let Some(q) = self.by_key.get(key) else {
            self.polled.remove(key);
            return None;
        };
        Some(Polled {
            state: q.state,
            rule: q.rule.clone(),
            limits: q.limits,
            first: q.waiters.front().map_or(1, |w| w.cost),
        })
    }

    // ----- demand denied locally -----

    /// A check of `key` asking for `cost` was denied locally.
    pub fn unmet(&mut self, key: &str, cost: u64, now: u64) {
        if self.unmet.len() >= stash::MAX_KEYS && !self.unmet.contains_key(key) {
            self.unmet.clear();
        }
        let unmet = self.unmet.entry(key.to_string()).or_insert(Unmet {
            tokens: 0,
            since_ms: now,
        });
        unmet.tokens = unmet.tokens.saturating_add(cost);
    }

    /// Takes `key`'s unmet demand, for its lease call.
    pub fn take_unmet(&mut self, key: &str) -> Unmet {
        self.unmet.remove(key).unwrap_or_default()
    }

    /// Puts back `key`'s unmet demand: no call carried it.
    pub fn keep_unmet(&mut self, key: &str, unmet: Unmet) {
        self.unmet.insert(key.to_string(), unmet);
    }
}
