//! When each key's pending usage settlement is flushed if no call carries it first.
//!
//! Invariant: a key with a settlement kept pending has a flush scheduled (at most `flush_ms`
//! after it was kept, later only while the breaker keeps every call in); a flush takes whatever
//! the key has pending by then, so several flushes of one key never send more than one
//! settlement each.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

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

/// The flushes a worker has scheduled, by due time.
#[derive(Debug, Default)]
pub struct Flushes(BinaryHeap<Reverse<Flush>>);

impl Flushes {
    pub fn push(&mut self, flush: Flush) {
        self.0.push(Reverse(flush));
    }

    /// When the first flush is due.
    pub fn next_due(&self) -> Option<u64> {
        self.0.peek().map(|Reverse(f)| f.due)
    }

    /// The next flush due at `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<Flush> {
        if self.next_due()? > now {
            return None;
        }
        self.0.pop().map(|Reverse(f)| f)
    }

    /// Moves every flush due before `until` to `until`, one per key (it takes whatever the key
    /// has pending by then).
    pub fn defer_until(&mut self, until: u64) {
        let mut deferred = BTreeMap::<String, (RuleRef, Limits)>::new();
        while let Some(Reverse(f)) = self.0.peek() {
            if f.due >= until {
                break;
            }
            if let Some(Reverse(f)) = self.0.pop() {
                deferred.insert(f.key, (f.rule, f.limits));
            }
        }
        self.0
            .extend(deferred.into_iter().map(|(key, (rule, limits))| {
                Reverse(Flush {
                    due: until,
                    rule,
                    key,
                    limits,
                })
            }));
    }

    /// Takes every flush, the earliest of each key only (it takes whatever the key has pending
    /// then), in key order.
    pub fn take_earliest_per_key(&mut self) -> Vec<Flush> {
        let mut by_key = BTreeMap::<String, Flush>::new();
        for Reverse(f) in std::mem::take(&mut self.0) {
            match by_key.get_mut(&f.key) {
                Some(first) if f.due < first.due => *first = f,
                Some(_) => {}
                None => {
                    by_key.insert(f.key.clone(), f);
                }
            }
        }
        by_key.into_values().collect()
    }
}
