//! The lease waits of one worker: per bucket key, the checks waiting for the proxy's lease call on
//! that key, in arrival order, and where that call stands.
//!
//! Invariant: a waiter waits in its key's queue once; it stops waiting when it is served, failed,
//! expired, or its request is decided or gone, and is never served after. One that leaves
//! without being served (its request decided or gone, its patience out) stays in the queue as a
//! gone entry, which every read of the queue skips exactly as if it had been taken out, until it
//! reaches the front or the queue is compacted (`compaction::worth_compacting`): a queue holds at
//! most twice its waiters plus a constant. A key's queue is forgotten once it is idle and no
//! waiter waits in it. A waiting check has exactly one live patience deadline, which belongs to
//! its wait (its key, ticket and due time) and ends with it: a check served, failed, sent on to a
//! call of its own, or gone is never expired by it. Patience bounds a wait for a call that may
//! never come or was lost, not a call this worker has out, whose answer or timeout ends the wait:
//! when this worker sends its key's lease call, a waiter whose first deadline has not passed is
//! patient from the send instead (its new deadline at the back, the old one no longer live), so a
//! wait lasts at most twice its patience however often a call goes out. Deadlines are the time
//! they were set (arrival or send) plus a constant, so the front one is always the nearest; those
//! no longer live are dropped at the front, and all at once when they may outnumber the others.

use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;

use super::super::compaction::worth_compacting;
use super::super::ids::{ById, CheckId, ContextId};
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

/// A waiter in its key's queue, with the ticket it joined it with.
#[derive(Debug, Clone, Copy)]
struct Entry {
    ticket: u64,
    waiter: Waiter,
}

/// One wait's patience: when the wait of check `check` of `ctx` in `key`'s queue under `ticket`
/// ends, unless it ended before or was given a later deadline (it is live while its `due` is the
/// wait's).
#[derive(Debug)]
struct Deadline {
    due: u64,
    key: Rc<str>,
    ctx: ContextId,
    check: CheckId,
    ticket: u64,
}

/// A check's wait in its key's queue.
#[derive(Debug, Clone, Copy)]
struct Wait {
    /// The ticket it joined the queue under.
    ticket: u64,
    /// Its live patience deadline.
    due: u64,
    /// Its first deadline (arrival + patience): a lease call sent after it moves `due` no more.
    first_due: u64,
}

/// One key's queue.
///
/// Invariant: each check in `waiting` has exactly one entry in `entries` under its ticket; an
/// entry whose check is not in `waiting` under its ticket is gone, and nothing reads it but to
/// drop it.
#[derive(Debug)]
struct Queue {
    /// Its key, for the patience deadlines of its waiters (one allocation per queue).
    key: Rc<str>,
    rule: RuleRef,
    /// The key's effective limits.
    limits: Limits,
    /// Waiters in arrival order, gone ones included.
    entries: VecDeque<Entry>,
    /// The wait of each check still waiting here: a waiter leaves in one step, not a look
    /// through the queue for it (n waiters leaving a queue of n would cost n² steps).
    waiting: HashMap<(ContextId, CheckId), Wait, ById>,
    state: State,
}

impl Queue {
    fn new(key: &str, rule: &RuleRef, limits: Limits) -> Queue {
        Queue {
            key: Rc::from(key),
            rule: rule.clone(),
            limits,
            entries: VecDeque::new(),
            waiting: HashMap::default(),
            state: State::Idle,
        }
    }

    /// Whether `e` still waits (it is not gone).
    fn waits(&self, e: &Entry) -> bool {
        joined_as(&self.waiting, e)
    }

    /// `waiter` joins the queue's back under `ticket`, patient until `due`, unless its check
    /// already waits here; its wait's deadline if it joined.
    fn join(&mut self, waiter: Waiter, ticket: u64, due: u64) -> Option<Deadline> {
        let id = (waiter.ctx, waiter.check);
        if self.waiting.contains_key(&id) {
            return None;
        }
        let wait = Wait {
            ticket,
            due,
            first_due: due,
        };
        self.waiting.insert(id, wait);
        let entry = Entry { ticket, waiter };
        self.entries.push_back(entry);
        Some(self.deadline(&entry, due))
    }

    /// The deadline `due` of `e`'s wait.
    fn deadline(&self, e: &Entry, due: u64) -> Deadline {
        Deadline {
            due,
            key: self.key.clone(),
            ctx: e.waiter.ctx,
            check: e.waiter.check,
            ticket: e.ticket,
        }
    }

    /// The first waiter still waiting (the gone ones before it are dropped).
    fn first(&mut self) -> Option<Waiter> {
        while let Some(e) = self.entries.front().copied() {
            if self.waits(&e) {
                return Some(e.waiter);
            }
            self.entries.pop_front();
        }
        None
    }

    /// Takes the first waiter still waiting off the queue.
    fn pop_first(&mut self) -> Option<Waiter> {
        let first = self.first()?;
        self.entries.pop_front();
        self.waiting.remove(&(first.ctx, first.check));
        Some(first)
    }

    /// The waiters still waiting, in order.
    fn live(&self) -> impl Iterator<Item = &Waiter> {
        self.entries
            .iter()
            .filter(|e| self.waits(e))
            .map(|e| &e.waiter)
    }

    /// Drops every gone entry.
    fn compact(&mut self) {
        let waiting = &self.waiting;
        self.entries.retain(|e| joined_as(waiting, e));
    }
}

/// Whether `e`'s check still waits in its queue (`waiting`) under `e`'s ticket.
fn joined_as(waiting: &HashMap<(ContextId, CheckId), Wait, ById>, e: &Entry) -> bool {
    waiting
        .get(&(e.waiter.ctx, e.waiter.check))
        .is_some_and(|w| w.ticket == e.ticket)
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
    /// The patience deadlines, in the order they were set; each is the time it was set (a wait's
    /// arrival, or a lease call sent) + a constant patience, so the front is always the nearest.
    patience: VecDeque<Deadline>,
    /// Deadlines no longer live since `patience` was last looked through (waits that ended:
    /// served, sent on, left; or given a later deadline): they may still be in it.
    left_since: usize,
    /// The ticket the next wait gets: one count for every queue, so a ticket names one wait even
    /// across a queue forgotten and made again.
    next_ticket: u64,
    /// Queue entries looked through because waiters left (tests bound the work of leaving).
    #[cfg(test)]
    scanned: usize,
    /// Tokens this worker's requests asked for and were denied locally (the deny cache, or a
    /// reservation still refilling) since the key's last lease call; the next call counts them as
    /// demand, so a saturated key asks for what its clients want.
    unmet: HashMap<String, Unmet, Seeded>,
}

impl Waits {
    /// How many checks wait (gone ones are not counted).
    pub fn waiters(&self) -> usize {
        self.by_key.values().map(|q| q.waiting.len()).sum()
    }

    /// `waiter` of rule `rule` waits for `key`'s lease call until `due` (arrival + patience)
    /// at the latest, unless this worker sends that call meanwhile ([`Waits::sent`]); once: a
    /// check already waiting keeps its place, and its deadline. Whether no call is out for the
    /// key (the caller starts one).
    pub fn add(
        &mut self,
        key: &str,
        (rule, limits): (&RuleRef, Limits),
        waiter: Waiter,
        due: u64,
    ) -> bool {
        let q = self
            .by_key
            .entry(key.to_string())
            .or_insert_with(|| Queue::new(key, rule, limits));
        let ticket = self.next_ticket;
        if let Some(deadline) = q.join(waiter, ticket, due) {
            self.next_ticket = ticket.wrapping_add(1);
            self.patience.push_back(deadline);
        }
        q.state == State::Idle
    }

    /// What `key`'s next lease call is for; None if no queue waits for one (an empty queue goes
    /// idle and is forgotten).
    pub fn head(&mut self, key: &str) -> Option<Head> {
        let q = self.by_key.get_mut(key)?;
        let Some(first) = q.first().map(|w| w.cost) else {
            self.set_state(key, State::Idle);
            self.forget_if_idle(key);
            return None;
        };
        Some(Head {
            rule: q.rule.clone(),
            limits: q.limits,
            first,
            waiting: q.live().map(|w| w.cost).fold(0, u64::saturating_add),
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

    /// This worker sent `key`'s lease call at `now`: its answer or its timeout ends the waits
    /// on it, so a waiter whose first deadline has not passed by `now` is patient until `due`
    /// (`now` + the patience) instead, if that is later. Its new deadline goes
    /// at the back, where it belongs, and the old one is no longer live. A call sent after a
    /// wait's first deadline moves nothing: a wait lasts at most twice its patience, however
    /// often its key's call goes out.
    pub fn sent(&mut self, key: &str, now: u64, due: u64) {
        let Some(q) = self.by_key.get_mut(key) else {
            return;
        };
        let mut moved = 0usize;
        for e in &q.entries {
            let Some(w) = q.waiting.get_mut(&(e.waiter.ctx, e.waiter.check)) else {
                continue;
            };
            if w.ticket != e.ticket || now > w.first_due || due <= w.due {
                continue;
            }
            w.due = due;
            self.patience.push_back(q.deadline(e, due));
            moved = moved.saturating_add(1);
        }
        self.left_since = self.left_since.saturating_add(moved);
    }

    /// The call for `key` will never be answered here.
    pub fn flight_lost(&mut self, key: &str) {
        if self.by_key.contains_key(key) {
            self.set_state(key, State::Lost);
        }
    }

    /// Check `check` of `ctx` no longer waits on `key` (its request was decided or is gone, or
    /// its patience ran out). Its entry stays in the queue, gone, until it reaches the front or
    /// the gone may outnumber the waiting: then the queue is compacted.
    pub fn left(&mut self, key: &str, ctx: ContextId, check: CheckId) {
        let Some(q) = self.by_key.get_mut(key) else {
            return;
        };
        if q.waiting.remove(&(ctx, check)).is_some() {
            self.left_since = self.left_since.saturating_add(1);
            if worth_compacting(q.entries.len(), q.waiting.len()) {
                #[cfg(test)]
                {
                    self.scanned += q.entries.len();
                }
                q.compact();
            }
        }
        self.forget_if_idle(key);
    }

    /// Queue entries looked through so far because waiters left, and entries kept in queues
    /// (gone ones included).
    #[cfg(test)]
    pub fn work(&self) -> (usize, usize) {
        let kept = self.by_key.values().map(|q| q.entries.len()).sum();
        (self.scanned, kept)
    }

    /// Patience deadlines kept (those of checks no longer waiting included).
    #[cfg(test)]
    pub fn deadlines(&self) -> usize {
        self.patience.len()
    }

    pub fn forget_if_idle(&mut self, key: &str) {
        if self
            .by_key
            .get(key)
            .is_some_and(|q| q.waiting.is_empty() && q.state == State::Idle)
        {
            self.by_key.remove(key);
            self.polled.remove(key);
        }
    }

    /// Whether `key` has waiters and no call out.
    pub fn idle_with_waiters(&self, key: &str) -> bool {
        self.by_key
            .get(key)
            .is_some_and(|q| !q.waiting.is_empty() && q.state == State::Idle)
    }

    /// What `key`'s waiters need, in order.
    pub fn costs(&self, key: &str) -> Vec<u64> {
        self.by_key
            .get(key)
            .map(|q| q.live().map(|w| w.cost).collect())
            .unwrap_or_default()
    }

    /// Takes every waiter of `key`, in order: their waits (and patience) end here.
    pub fn drain(&mut self, key: &str) -> Vec<Waiter> {
        let out: Vec<Waiter> = self
            .by_key
            .get_mut(key)
            .map(|q| {
                let out = q.live().copied().collect();
                q.entries.clear();
                q.waiting.clear();
                out
            })
            .unwrap_or_default();
        self.left_since = self.left_since.saturating_add(out.len());
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
            let Some(w) = q.pop_first() else {
                break;
            };
            served.push((w, Outcome::leased(*s)));
        }
        // The gone go too: the look through the queue is made anyway.
        let waiting = &mut q.waiting;
        q.entries.retain(|e| {
            if !joined_as(waiting, e) {
                return false;
            }
            let id = (e.waiter.ctx, e.waiter.check);
            match denied(e.waiter.cost) {
                Some(retry_ms) => {
                    waiting.remove(&id);
                    served.push((e.waiter, Outcome::Denied { retry_ms }));
                    false
                }
                None => true,
            }
        });
        self.left_since = self.left_since.saturating_add(served.len());
        served
    }

    // ----- what the tick looks at -----

    /// Drops the patience deadlines at the front that are no longer live (their waits ended, or
    /// were given later ones); and all of those, once they may outnumber the live ones (a
    /// deadline behind a live one would otherwise be kept until that one ends, with every stream
    /// a client opens and resets, and every call sent, meanwhile).
    pub fn drop_ended_patience(&mut self) {
        let by_key = &self.by_key;
        while let Some(d) = self.patience.front() {
            if still_waits(by_key, d) {
                break;
            }
            self.patience.pop_front();
        }
        let kept = self.patience.len();
        if worth_compacting(kept, kept.saturating_sub(self.left_since)) {
            self.patience.retain(|d| still_waits(by_key, d));
            self.left_since = 0;
        }
    }

    /// The next check whose wait is still on at its patience deadline, due at `now`: it leaves
    /// its queue (its call was lost somewhere, or never came). Deadlines no longer live are
    /// dropped.
    pub fn expire(&mut self, now: u64) -> Option<(ContextId, CheckId)> {
        while let Some(d) = self.patience.pop_front() {
            if d.due > now {
                self.patience.push_front(d);
                return None;
            }
            if still_waits(&self.by_key, &d) {
                self.left(&d.key, d.ctx, d.check);
                return Some((d.ctx, d.check));
            }
        }
        None
    }

    /// The nearest time the tick must look at lease waits.
    pub fn next_due(&self, now: u64) -> Option<u64> {
        let poll = (!self.polled.is_empty()).then_some(now.saturating_add(POLL_MS));
        let patience = self.patience.front().map(|d| d.due);
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
        let Some(q) = self.by_key.get_mut(key) else {
            self.polled.remove(key);
            return None;
        };
        Some(Polled {
            state: q.state,
            rule: q.rule.clone(),
            limits: q.limits,
            first: q.first().map_or(1, |w| w.cost),
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

/// Whether `d` is live: its check waits in its key's queue under its ticket, with `d` as its
/// deadline.
fn still_waits(by_key: &HashMap<String, Queue, Seeded>, d: &Deadline) -> bool {
    by_key.get(&*d.key).is_some_and(|q| {
        q.waiting
            .get(&(d.ctx, d.check))
            .is_some_and(|w| w.ticket == d.ticket && w.due == d.due)
    })
}

#[cfg(test)]
mod tests {
    use super::super::super::rules::{RuleId, Rules};
    use super::*;
    use crate::config::Config;

    fn rule() -> (RuleRef, Limits) {
        let config = Config::try_from(
            &br#"{"rules":[{"name":"hot","key":["header:x-user"],"mode":"lease","rate":100,
                "burst":50}]}"#[..],
        )
        .unwrap();
        let rules = Rules::new(&config.rules);
        let limits = Limits {
            burst: 50,
            rate: 100,
            period_ms: 1000,
        };
        (rules.get(RuleId::new(0)).unwrap().clone(), limits)
    }

    fn waiter(ctx: u32, cost: u64) -> Waiter {
        Waiter {
            ctx: ctx.into(),
            check: CheckId::at(0),
            cost,
        }
    }

    /// Queue `k` with a call out (`Own`) and waiters of costs 1, 2, 4, 8 as requests 1 to 4.
    fn four_waiting() -> Waits {
        let mut w = Waits::default();
        let rule = rule();
        assert!(
            w.add("k", (&rule.0, rule.1), waiter(1, 1), 100),
            "no call out"
        );
        w.set_state("k", State::Own);
        for (ctx, cost) in [(2, 2), (3, 4), (4, 8)] {
            assert!(!w.add("k", (&rule.0, rule.1), waiter(ctx, cost), 100));
        }
        w
    }

    const SPENT: Spent = Spent {
        remaining: 9,
        reset_ms: 100,
        delay_ms: 0,
    };

    fn ctxs(served: &[(Waiter, Outcome)]) -> Vec<u32> {
        served.iter().map(|(w, _)| w.ctx.get()).collect()
    }

    #[test]
    fn a_waiter_that_left_is_never_served_nor_counted_in_demand() {
        let mut w = four_waiting();
        // The first, and one in the middle.
        w.left("k", 1.into(), CheckId::at(0));
        w.left("k", 3.into(), CheckId::at(0));
        assert_eq!(w.waiters(), 2);
        assert_eq!(w.costs("k"), [2, 8]);
        assert_eq!(w.polled("k").map(|p| p.first), Some(2));
        w.set_state("k", State::Idle);
        assert!(w.idle_with_waiters("k"));
        let head = w.head("k").unwrap();
        assert_eq!((head.first, head.waiting), (2, 10), "what 2 and 4 need");
        let served = w.serve("k", &[SPENT], |_| None);
        assert_eq!(ctxs(&served), [2]);
        // The rest ask the deny cache: a gone one never does.
        let mut asked = Vec::new();
        let served = w.serve("k", &[], |cost| {
            asked.push(cost);
            Some(50)
        });
        assert_eq!((asked, ctxs(&served)), (vec![8], vec![4]));
        assert_eq!(w.waiters(), 0);
        assert!(!w.idle_with_waiters("k"));
        w.forget_if_idle("k");
        assert!(w.rule_of("k").is_none(), "forgotten");
    }

    #[test]
    fn tokens_spent_for_the_waiting_go_to_them_in_order_past_the_gone() {
        let mut w = four_waiting();
        w.left("k", 2.into(), CheckId::at(0));
        let served = w.serve("k", &[SPENT, SPENT], |_| None);
        assert_eq!(ctxs(&served), [1, 3]);
        assert_eq!(w.costs("k"), [8]);
        let mut w = four_waiting();
        w.left("k", 3.into(), CheckId::at(0));
        let drained: Vec<u32> = w.drain("k").iter().map(|w| w.ctx.get()).collect();
        assert_eq!(drained, [1, 2, 4]);
        assert_eq!(w.waiters(), 0);
    }

    #[test]
    fn a_queue_whose_waiters_all_left_is_empty() {
        let mut w = four_waiting();
        for ctx in 1..=4 {
            w.left("k", ctx.into(), CheckId::at(0));
        }
        assert_eq!(w.waiters(), 0);
        assert!(w.costs("k").is_empty());
        assert_eq!(w.polled("k").map(|p| p.first), Some(1), "none waits");
        assert!(w.rule_of("k").is_some(), "its call is still out");
        assert!(w.head("k").is_none(), "nothing to call for");
        assert!(w.rule_of("k").is_none(), "idle and forgotten");
        // With no call out, the last waiter to leave takes the queue with it.
        let rule = rule();
        assert!(w.add("k", (&rule.0, rule.1), waiter(5, 1), 100));
        w.left("k", 5.into(), CheckId::at(0));
        assert!(w.rule_of("k").is_none());
        // Leaving twice, or a queue it never joined, changes nothing.
        w.left("k", 5.into(), CheckId::at(0));
        w.left("other", 5.into(), CheckId::at(0));
        assert_eq!(w.waiters(), 0);
    }

    #[test]
    fn a_check_waits_once_and_one_that_comes_back_waits_anew() {
        let mut w = four_waiting();
        let rule = rule();
        assert!(!w.add("k", (&rule.0, rule.1), waiter(2, 2), 100));
        assert_eq!(w.costs("k"), [1, 2, 4, 8], "once");
        // Left, then back (its gone entry stays ahead of it): it counts once, where it is now.
        w.left("k", 2.into(), CheckId::at(0));
        assert!(!w.add("k", (&rule.0, rule.1), waiter(2, 16), 100));
        assert_eq!(w.costs("k"), [1, 4, 8, 16]);
        let served = w.serve("k", &[SPENT; 4], |_| None);
        assert_eq!(ctxs(&served), [1, 3, 4, 2]);
        assert_eq!(served.last().map(|(w, _)| w.cost), Some(16));
    }

    #[test]
    fn deadlines_of_waiters_that_left_go_and_the_waiting_keep_theirs() {
        let mut w = Waits::default();
        let rule = rule();
        for ctx in 1..=200u32 {
            w.add("k", (&rule.0, rule.1), waiter(ctx, 1), u64::from(ctx));
        }
        w.set_state("k", State::Own);
        for ctx in (1..=200u32).filter(|&c| c != 100) {
            w.left("k", ctx.into(), CheckId::at(0));
        }
        w.drop_ended_patience();
        assert_eq!(w.deadlines(), 1, "those behind the one waiting too");
        assert_eq!(w.next_due(0), Some(100));
        assert_eq!(w.expire(99), None);
        assert_eq!(w.expire(100), Some((100.into(), CheckId::at(0))));
        assert_eq!(w.waiters(), 0, "it left its queue");
    }

    #[test]
    fn a_deadline_ends_with_its_wait() {
        let rule = rule();
        // Sent on to calls of their own (drained), or served: their deadlines go, unexpired.
        let mut w = four_waiting();
        assert_eq!(w.drain("k").len(), 4);
        assert_eq!(w.expire(100), None, "drained waiters are not expired");
        let mut w = four_waiting();
        assert_eq!(ctxs(&w.serve("k", &[SPENT], |_| None)), [1]);
        w.drop_ended_patience();
        assert_eq!(w.next_due(0), Some(100), "2 to 4 still wait");
        assert_eq!(w.expire(100).map(|(ctx, _)| ctx.get()), Some(2));
        // A check that left and waits again is bounded by its new wait's deadline only.
        let mut w = Waits::default();
        w.add("k", (&rule.0, rule.1), waiter(1, 1), 100);
        w.left("k", 1.into(), CheckId::at(0));
        w.add("k", (&rule.0, rule.1), waiter(1, 1), 300);
        assert_eq!(
            w.expire(299),
            None,
            "the first wait's deadline ended with it"
        );
        assert_eq!(w.expire(300), Some((1.into(), CheckId::at(0))));
        assert_eq!(w.waiters(), 0);
        w.drop_ended_patience();
        assert_eq!((w.deadlines(), w.next_due(0)), (0, None));
    }

    /// Expires every wait due by `now`: their contexts, in order.
    fn expire_all(w: &mut Waits, now: u64) -> Vec<u32> {
        std::iter::from_fn(|| w.expire(now))
            .map(|(ctx, _)| ctx.get())
            .collect()
    }

    #[test]
    fn a_call_sent_makes_its_waiters_patient_from_the_send_once_each() {
        let mut w = Waits::default();
        let rule = rule();
        // Patience 200: 1 and 2 came at 0, 3 at 50; the call goes out at 100.
        w.add("k", (&rule.0, rule.1), waiter(1, 1), 200);
        w.add("k", (&rule.0, rule.1), waiter(2, 1), 200);
        w.add("k", (&rule.0, rule.1), waiter(3, 1), 250);
        w.set_state("k", State::Own);
        w.sent("k", 100, 300);
        assert_eq!(w.deadlines(), 6, "the new ones at the back");
        assert_eq!(
            expire_all(&mut w, 299),
            Vec::<u32>::new(),
            "the old ones ended"
        );
        w.drop_ended_patience();
        assert_eq!((w.deadlines(), w.next_due(0)), (3, Some(300)), "one each");
        // A waiter that came with the send is patient from it already: nothing moves.
        w.add("k", (&rule.0, rule.1), waiter(4, 1), 300);
        w.sent("k", 100, 300);
        assert_eq!(w.deadlines(), 4);
        assert_eq!(expire_all(&mut w, 300), [1, 2, 3, 4], "in order, once each");
        assert_eq!((w.waiters(), w.next_due(0)), (0, None));
    }

    #[test]
    fn a_call_sent_after_a_waits_first_deadline_moves_it_no_more() {
        let mut w = Waits::default();
        let rule = rule();
        // 1 came at 0 (patience 200), 2 at 150.
        w.add("k", (&rule.0, rule.1), waiter(1, 1), 200);
        w.set_state("k", State::Own);
        w.add("k", (&rule.0, rule.1), waiter(2, 1), 350);
        // Calls at 150, 200 (both within 1's first patience) and 250 (past it).
        w.sent("k", 150, 350);
        w.sent("k", 200, 400);
        w.sent("k", 250, 450);
        assert_eq!(expire_all(&mut w, 399), Vec::<u32>::new());
        assert_eq!(expire_all(&mut w, 400), [1], "twice its patience at most");
        assert_eq!(expire_all(&mut w, 449), Vec::<u32>::new());
        assert_eq!(expire_all(&mut w, 450), [2]);
        // A check that left and waits again has a first deadline of its new wait.
        w.add("k", (&rule.0, rule.1), waiter(1, 1), 700);
        w.sent("k", 600, 800);
        assert_eq!(expire_all(&mut w, 799), Vec::<u32>::new());
        assert_eq!(expire_all(&mut w, 800), [1]);
    }

    #[test]
    fn calls_sent_again_and_again_keep_the_deadlines_within_twice_the_waiting() {
        let mut w = Waits::default();
        let rule = rule();
        // One wait on "j" keeps the oldest deadline at the front; 100 on "k" ride call after call.
        w.add("j", (&rule.0, rule.1), waiter(0, 1), 5);
        w.set_state("j", State::Own);
        let patience = 1_000_000;
        for ctx in 1..=100u32 {
            w.add("k", (&rule.0, rule.1), waiter(ctx, 1), patience);
        }
        w.set_state("k", State::Own);
        for at in 1..=10_000 {
            w.sent("k", at, at + patience);
            w.drop_ended_patience();
            assert!(w.deadlines() <= 2 * 101 + 64, "{} kept", w.deadlines());
        }
        assert_eq!(expire_all(&mut w, 5), [0]);
        let due = 10_000 + patience;
        assert_eq!(expire_all(&mut w, due - 1), Vec::<u32>::new());
        assert_eq!(expire_all(&mut w, due), (1..=100).collect::<Vec<u32>>());
        w.drop_ended_patience();
        assert_eq!(w.deadlines(), 0);
    }

    #[test]
    fn waiters_leaving_in_any_order_keep_the_queue_within_twice_the_waiting() {
        let mut w = Waits::default();
        let rule = rule();
        let n = 100_000u32;
        for ctx in 0..n {
            w.add("k", (&rule.0, rule.1), waiter(ctx, 1), 100);
        }
        w.set_state("k", State::Own);
        // Every other one from the back, then the rest from the front.
        let order = (0..n).rev().step_by(2).chain((0..n).step_by(2));
        let order: Vec<u32> = order.collect();
        for (gone, &ctx) in order.iter().enumerate() {
            w.left("k", ctx.into(), CheckId::at(0));
            let waiting = w.waiters();
            assert_eq!(waiting, n as usize - gone - 1);
            let (_, kept) = w.work();
            assert!(kept <= 2 * waiting + 64, "{kept} kept for {waiting}");
        }
        let (scanned, _) = w.work();
        assert!(scanned < 2 * n as usize, "{scanned} looked through");
    }
}
