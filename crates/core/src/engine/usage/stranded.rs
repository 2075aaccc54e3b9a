//! Charges a failed call could not put back in the settle table (the key's set of slots full of
//! other keys' pending settlements, or shared data failing), kept by the worker until the key's
//! next call or its flush carries them.
//!
//! Invariant: a stranded charge is held here for its key (summed, within the most one settlement
//! of the key may be, as the table keeps it) until a call of the key takes it, once, with what
//! the table holds for the key; a failure of that call puts it back (in the table if it has room
//! by then, else here). So no charge is lost on a failed call, whatever the table holds. At most
//! [`MAX_KEYS`] keys are held: a charge of another key beyond them is dropped and counted
//! (`charge_dropped`): sending it at once could only fail back here while the breaker holds every
//! call, and that many keys stranded means the proxy's whole settle table is full.

use std::collections::HashMap;

use crate::bucket::Limits;
use crate::engine::rules::RuleRef;

/// The most keys one worker holds stranded charges for (each a key string and a few words).
pub const MAX_KEYS: usize = 4096;

/// One key's stranded charge, with the rule and limits its flush goes under.
#[derive(Debug, Clone)]
pub struct Charge {
    pub rule: RuleRef,
    pub limits: Limits,
    pub tokens: u64,
}

/// The worker's stranded charges, by bucket key (a key names its rule, so it is one rule's).
#[derive(Debug, Default)]
pub struct Stranded {
    by_key: HashMap<String, Charge>,
}

impl Stranded {
    /// Keeps `tokens` more for `key`, its sum kept within `limit`. False if the worker holds
    /// [`MAX_KEYS`] other keys already.
    pub fn keep(
        &mut self,
        rule: &RuleRef,
        key: &str,
        limits: Limits,
        tokens: u64,
        limit: u64,
    ) -> bool {
        if let Some(c) = self.by_key.get_mut(key) {
            c.tokens = c.tokens.saturating_add(tokens).min(limit);
            return true;
        }
        if self.by_key.len() >= MAX_KEYS {
            return false;
        }
        let charge = Charge {
            rule: rule.clone(),
            limits,
            tokens: tokens.min(limit),
        };
        self.by_key.insert(key.to_string(), charge);
        true
    }

    /// Takes at most `most` tokens of `key`'s stranded charge: (what it took, whether some is
    /// left).
    pub fn take(&mut self, key: &str, most: u64) -> (u64, bool) {
        let Some(c) = self.by_key.get_mut(key) else {
            return (0, false);
        };
        let taken = c.tokens.min(most);
        c.tokens -= taken;
        if c.tokens == 0 {
            self.by_key.remove(key);
            return (taken, false);
        }
        (taken, true)
    }

    /// Takes every stranded charge, in key order (for the engine that takes over).
    pub fn take_all(&mut self) -> Vec<(String, Charge)> {
        let mut all: Vec<_> = std::mem::take(&mut self.by_key).into_iter().collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// How many keys hold a stranded charge.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::usage_rules as rules;
    use super::*;

    #[test]
    fn a_charge_is_summed_bounded_and_taken_once() {
        let rules = rules();
        let r = rules.iter().next().unwrap();
        let limits = r.limits.limits();
        let mut s = Stranded::default();
        assert!(s.keep(r, "k", limits, 30, 100));
        assert!(s.keep(r, "k", limits, 9, 100));
        assert_eq!(s.take("k", 25), (25, true), "what a call may carry");
        assert_eq!(s.take("k", 25), (14, false), "the rest");
        assert_eq!(s.take("k", 25), (0, false), "taken once");
        assert!(s.keep(r, "k", limits, 1000, 100));
        assert_eq!(s.take("k", 1000), (100, false), "within the limit");
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn at_most_max_keys_are_held() {
        let rules = rules();
        let r = rules.iter().next().unwrap();
        let limits = r.limits.limits();
        let mut s = Stranded::default();
        for i in 0..MAX_KEYS {
            assert!(s.keep(r, &format!("k{i}"), limits, 1, 100));
        }
        assert!(
            !s.keep(r, "one more", limits, 1, 100),
            "a new key has no room"
        );
        assert!(s.keep(r, "k0", limits, 1, 100), "a key held adds up");
        assert_eq!(s.take("k0", 100), (2, false));
        assert!(s.keep(r, "one more", limits, 1, 100), "room again");
        assert_eq!(s.take_all().len(), MAX_KEYS);
        assert_eq!(s.len(), 0);
    }
}
