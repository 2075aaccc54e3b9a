//! When each key's pending usage settlement is flushed if no call carries it first.
//!
//! Invariant: a key with a settlement kept pending has one flush scheduled (at most `flush_ms`
//! after it was kept, later only while the breaker keeps every call in); a flush takes whatever
//! the key has pending by then. So the flushes are at most the keys with settlements pending,
//! however many settlements a key keeps.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::super::rules::RuleRef;
use crate::bucket::Limits;

/// A key's flush: when, for which rule, and under the key's effective limits (a settlement must
/// not change them).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Flush {
    pub due: u64,
    pub rule: RuleRef,
    pub key: String,
    pub limits: Limits,
}

/// The flushes a worker has scheduled, by due time: one per key, its earliest (a flush takes
/// whatever the key has pending by then, so a later one would send nothing of its own).
#[derive(Debug, Default)]
pub struct Flushes {
    heap: BinaryHeap<Reverse<Flush>>,
    /// Each key's scheduled flush: when it is due. A heap entry of the key due at another time
    /// was replaced by an earlier one, and is dropped when it comes up.
    due: HashMap<String, u64>,
}

impl Flushes {
    pub fn push(&mut self, flush: Flush) {
        if self
            .due
            .get(&flush.key)
            .is_some_and(|&due| due <= flush.due)
        {
            return;
        }
        self.due.insert(flush.key.clone(), flush.due);
        self.heap.push(Reverse(flush));
    }

    /// When the first flush is due.
    pub fn next_due(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse(f)| f.due)
    }

    /// The next flush due at `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<Flush> {
        if self.next_due()? > now {
            return None;
        }
        let Reverse(f) = self.heap.pop()?;
        self.due.remove(&f.key);
        self.drop_replaced();
        Some(f)
    }

    /// Moves every flush due before `until` to `until`.
    pub fn defer_until(&mut self, until: u64) {
        let mut deferred = Vec::new();
        while self.next_due().is_some_and(|due| due < until) {
            if let Some(Reverse(f)) = self.heap.pop() {
                deferred.push(f);
            }
            self.drop_replaced();
        }
        for f in deferred {
            self.due.insert(f.key.clone(), until);
            self.heap.push(Reverse(Flush { due: until, ..f }));
        }
    }

    /// Takes every flush, one per key, in key order.
    pub fn take_earliest_per_key(&mut self) -> Vec<Flush> {
        let mut due = std::mem::take(&mut self.due);
        let mut taken: Vec<Flush> = std::mem::take(&mut self.heap)
            .into_iter()
            .map(|Reverse(f)| f)
            // A replaced entry due when its key's flush is (pushed again after a pop) goes once.
            .filter(|f| due.get(&f.key) == Some(&f.due) && due.remove(&f.key).is_some())
            .collect();
        taken.sort_by(|a, b| a.key.cmp(&b.key));
        taken
    }

    /// Drops the replaced entries at the top of the heap, so that its top is a scheduled flush
    /// (a push keeps that true: it goes on top only if it is due first, and it is scheduled).
    fn drop_replaced(&mut self) {
        while let Some(Reverse(f)) = self.heap.peek() {
            if self.due.get(&f.key) == Some(&f.due) {
                return;
            }
            self.heap.pop();
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::usage_rules as rules;
    use super::*;

    fn flush(rule: &RuleRef, due: u64, key: &str) -> Flush {
        Flush {
            due,
            rule: rule.clone(),
            key: key.to_string(),
            limits: rule.limits.limits(),
        }
    }

    #[test]
    fn flushes_come_due_in_order_and_a_deferral_keeps_one_per_key() {
        let rules = rules();
        let r = rules.iter().next().unwrap();
        let mut f = Flushes::default();
        for (due, key) in [(30, "b"), (10, "a"), (20, "a"), (90, "c")] {
            f.push(flush(r, due, key));
        }
        assert_eq!(f.next_due(), Some(10));
        assert_eq!(f.pop_due(9), None, "nothing due yet");
        f.defer_until(50);
        let mut due = Vec::new();
        while let Some(x) = f.pop_due(50) {
            due.push((x.due, x.key));
        }
        assert_eq!(
            due,
            [(50, "a".to_string()), (50, "b".to_string())],
            "one flush per key, moved to the deferral"
        );
        assert_eq!(f.next_due(), Some(90), "a flush due after it stays put");
    }

    #[test]
    fn a_key_keeps_one_flush_however_many_settlements_it_keeps() {
        let rules = rules();
        let r = rules.iter().next().unwrap();
        let mut f = Flushes::default();
        for now in 0..50_000 {
            f.push(flush(r, now + 1000, "a"));
        }
        assert_eq!(f.len(), 1, "the first one takes whatever a keeps by then");
        f.push(flush(r, 500, "a"));
        assert_eq!(f.len(), 2, "an earlier one replaces it");
        assert_eq!(f.pop_due(2000).map(|x| x.due), Some(500));
        assert_eq!(f.pop_due(2000), None, "the one it replaced is dropped");
        assert_eq!(f.len(), 0);
    }

    #[test]
    fn a_hand_over_takes_one_flush_per_key_even_with_a_replaced_entry_due_alike() {
        let rules = rules();
        let r = rules.iter().next().unwrap();
        let mut f = Flushes::default();
        for (due, key) in [(100, "k"), (60, "j"), (50, "k")] {
            f.push(flush(r, due, key));
        }
        assert_eq!(f.pop_due(50).map(|x| x.key), Some("k".to_string()));
        f.push(flush(r, 100, "k"));
        let keys: Vec<String> = f
            .take_earliest_per_key()
            .into_iter()
            .map(|x| x.key)
            .collect();
        assert_eq!(keys, ["j", "k"]);
    }

    #[test]
    fn a_hand_over_takes_the_earliest_flush_of_each_key() {
        let rules = rules();
        let r = rules.iter().next().unwrap();
        let mut f = Flushes::default();
        for (due, key) in [(30, "b"), (20, "a"), (10, "a"), (40, "b")] {
            f.push(flush(r, due, key));
        }
        let taken: Vec<(u64, String)> = f
            .take_earliest_per_key()
            .into_iter()
            .map(|x| (x.due, x.key))
            .collect();
        assert_eq!(taken, [(10, "a".to_string()), (30, "b".to_string())]);
        assert_eq!(f.next_due(), None, "all taken");
    }
}
