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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::engine::rules::Rules;

    fn flush(rule: &RuleRef, due: u64, key: &str) -> Flush {
        Flush {
            due,
            rule: rule.clone(),
            key: key.to_string(),
            limits: rule.limits.limits(),
        }
    }

    fn rules() -> Rules {
        let json = br#"{"rules":[{"name":"llm","key":["header:x-user"],"rate":1,
            "usage":{"header":"x-used"}}]}"#;
        Rules::new(&Config::try_from(&json[..]).unwrap().rules)
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
