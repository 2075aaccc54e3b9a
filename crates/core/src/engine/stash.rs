//! Per-worker token stashes: leased tokens this worker moved out of the proxy's shared pool in a
//! batch, so most lease admissions touch no shared data at all.
//!
//! Invariant: a stash only holds tokens taken out of the pool (each moved, never copied), spends
//! each once, and drops them when the lease they came from expires; so the worker's admissions
//! from it are admissions the global bucket granted. At most `MAX_KEYS` keys are stashed; a
//! worker that cannot stash a key takes exactly the request's cost from the pool.
//!
//! A spend needs no clock reading of its own: it is checked against the worker's latest one,
//! and the worker ticks at [`Stashes::next_expiry`], where [`Stashes::expire`] drops what ran
//! out. So a token is spent after its lease expired only by a request handled in the same
//! event-loop turn as the tick that drops it.

use std::collections::HashMap;

use super::rules::RuleId;
use crate::shared::lease::{Back, Batch, Spent};

/// Most keys one worker stashes tokens for.
pub const MAX_KEYS: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Stash {
    /// The rule the key is of (its dropped tokens are counted there).
    rule: RuleId,
    tokens: u64,
    /// The batch these tokens came from (handed back to the pool with the next take, so the
    /// proxy counts each worker's batch as held until then).
    batch: u64,
    expires_ms: u64,
    global_remaining: u64,
    reset_at_ms: u64,
    /// The lease's epoch the batch was taken in ([`Batch::epoch`]).
    epoch: u64,
}

impl Stash {
    /// Its batch and the tokens left of it, as they go back to the pool.
    fn back(&self) -> Back {
        Back {
            batch: self.batch,
            unspent: self.tokens,
            epoch: self.epoch,
        }
    }
}

#[derive(Debug)]
pub struct Stashes {
    /// By bucket key, under a fast hash with a random seed ([`crate::rule::hash`]): every lease
    /// admission looks its key up here.
    by_key: HashMap<String, Stash, crate::rule::hash::Seeded>,
    /// No stash expires before this (u64::MAX: none is kept); exact after [`Stashes::expire`].
    earliest_ms: u64,
    /// A stash may have been emptied since [`Stashes::room_for`] last looked at every stash: a
    /// full table with none emptied and none expired has no room, and is not looked through.
    emptied: bool,
}

impl Default for Stashes {
    fn default() -> Stashes {
        Stashes {
            by_key: HashMap::default(),
            earliest_ms: u64::MAX,
            emptied: false,
        }
    }
}

impl Stashes {
    /// Spends `cost` from `key`'s stash if it holds enough live tokens. An expired stash spends
    /// nothing; its batch goes back to the pool with the next take or at the tick.
    pub fn spend(&mut self, key: &str, cost: u64, now_ms: u64) -> Option<Spent> {
        let s = self.by_key.get_mut(key)?;
        if now_ms >= s.expires_ms || s.tokens < cost {
            return None;
        }
        s.tokens -= cost;
        self.emptied |= s.tokens == 0;
        Some(Spent {
            remaining: s.tokens.saturating_add(s.global_remaining),
            reset_ms: s.reset_at_ms.saturating_sub(now_ms),
            delay_ms: 0,
        })
    }

    /// Whether a batch for `key` could be kept, making room by letting go of expired or empty
    /// stashes: their rules, keys and batches, to hand back to the pool.
    pub fn room_for(&mut self, key: &str, now_ms: u64) -> (bool, Vec<(RuleId, String, Back)>) {
        if self.by_key.len() < MAX_KEYS || self.by_key.contains_key(key) {
            return (true, Vec::new());
        }
        if !self.emptied && now_ms < self.earliest_ms {
            return (false, Vec::new());
        }
        let mut gone = Vec::new();
        let mut earliest = u64::MAX;
        self.by_key.retain(|k, s| {
            let live = now_ms < s.expires_ms && s.tokens > 0;
            if live {
                earliest = earliest.min(s.expires_ms);
            } else {
                gone.push((s.rule, k.clone(), s.back()));
            }
            live
        });
        self.earliest_ms = earliest;
        self.emptied = false;
        (self.by_key.len() < MAX_KEYS, gone)
    }

    /// Empties `key`'s stash to take a new batch: its batch and the tokens it did not spend go
    /// back to the pool (which drops them if the key's lease expired).
    pub fn hand_back(&mut self, key: &str) -> Back {
        let Some(s) = self.by_key.get_mut(key) else {
            return Back::default();
        };
        let back = s.back();
        s.tokens = 0;
        s.batch = 0;
        self.emptied = true;
        back
    }

    /// Keeps a batch of rule `rule`'s key `key` taken from the pool, after spending `cost` of it;
    /// what was spent.
    pub fn keep(
        &mut self,
        (rule, key): (RuleId, &str),
        batch: &Batch,
        cost: u64,
        now_ms: u64,
    ) -> Spent {
        self.earliest_ms = self.earliest_ms.min(batch.expires_ms);
        let s = self.by_key.entry(key.to_string()).or_insert(Stash {
            rule,
            tokens: 0,
            batch: 0,
            expires_ms: batch.expires_ms,
            global_remaining: batch.global_remaining,
            reset_at_ms: batch.reset_at_ms,
            epoch: batch.epoch,
        });
        s.tokens = s.tokens.saturating_add(batch.tokens.saturating_sub(cost));
        self.emptied |= s.tokens == 0;
        s.batch = s.batch.saturating_add(batch.tokens);
        s.expires_ms = batch.expires_ms;
        s.global_remaining = batch.global_remaining;
        s.reset_at_ms = batch.reset_at_ms;
        s.epoch = batch.epoch;
        Spent {
            remaining: s.tokens.saturating_add(s.global_remaining),
            reset_ms: s.reset_at_ms.saturating_sub(now_ms),
            delay_ms: 0,
        }
    }

    /// When the next stash expires, if any is kept (it may have been spent meanwhile).
    pub fn next_expiry(&self) -> Option<u64> {
        (self.earliest_ms != u64::MAX).then_some(self.earliest_ms)
    }

    /// Drops the stashes expired at `now_ms`, handing each one's rule, key and batch to `back`
    /// (its tokens unspent and the batch they came from go back to the proxy's pool). It looks at
    /// every stash (at most [`MAX_KEYS`]), on a tick at most once per millisecond and only once one
    /// has expired.
    pub fn expire(&mut self, now_ms: u64, mut back: impl FnMut(RuleId, &str, Back)) {
        if now_ms < self.earliest_ms {
            return;
        }
        let mut earliest = u64::MAX;
        self.by_key.retain(|key, s| {
            if now_ms < s.expires_ms {
                earliest = earliest.min(s.expires_ms);
                return true;
            }
            if s.tokens > 0 || s.batch > 0 {
                back(s.rule, key, s.back());
            }
            false
        });
        self.earliest_ms = earliest;
    }

    /// The tokens stashed for `key` and when they expire (None when there are none).
    pub fn held(&self, key: &str) -> Option<(u64, u64)> {
        self.by_key
            .get(key)
            .filter(|s| s.tokens > 0)
            .map(|s| (s.tokens, s.expires_ms))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(tokens: u64, expires_ms: u64) -> Batch {
        Batch {
            tokens,
            expires_ms,
            global_remaining: 10,
            reset_at_ms: 500,
            dropped: 0,
            epoch: 0,
        }
    }

    #[test]
    fn spends_each_token_once_until_the_lease_expires() {
        let mut s = Stashes::default();
        assert_eq!(s.spend("k", 1, 0), None);
        assert_eq!(
            s.keep((RuleId::new(0), "k"), &batch(4, 100), 1, 0)
                .remaining,
            3 + 10
        );
        assert!(s.spend("k", 2, 1).is_some());
        assert!(s.spend("k", 2, 1).is_none(), "one left");
        assert!(s.spend("k", 1, 100).is_none(), "expired: not spent");
        assert_eq!(
            s.hand_back("k"),
            Back {
                batch: 4,
                unspent: 1,
                ..Back::default()
            },
            "the batch and what is left of it go back to the pool"
        );
        assert_eq!(s.hand_back("k"), Back::default(), "once");
    }

    #[test]
    fn memory_is_bounded_and_expired_stashes_make_room() {
        let mut s = Stashes::default();
        for i in 0..MAX_KEYS {
            s.keep((RuleId::new(0), &format!("k{i}")), &batch(2, 100), 1, 0);
        }
        assert_eq!(s.room_for("new", 50), (false, Vec::new()));
        assert_eq!(
            s.room_for("k1", 50),
            (true, Vec::new()),
            "a stashed key always has room"
        );
        let (room, gone) = s.room_for("new", 100);
        assert!(room);
        assert_eq!(gone.len(), MAX_KEYS, "every expired stash goes back");
        assert!(gone.iter().all(|(_, _, b)| *b
            == Back {
                batch: 2,
                unspent: 1,
                ..Back::default()
            }));
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_full_table_makes_room_when_a_stash_is_emptied_or_expires() {
        let mut s = Stashes::default();
        for i in 0..MAX_KEYS {
            let expires = if i == 7 { 60 } else { 100 };
            s.keep((RuleId::new(0), &format!("k{i}")), &batch(3, expires), 1, 0);
        }
        assert_eq!(s.room_for("new", 10), (false, Vec::new()));
        // Spent to nothing: its slot is free.
        assert!(s.spend("k3", 2, 10).is_some());
        let (room, gone) = s.room_for("new", 10);
        assert!(room);
        assert_eq!(
            gone.iter().map(|(_, k, _)| k.as_str()).collect::<Vec<_>>(),
            ["k3"]
        );
        s.keep((RuleId::new(0), "new"), &batch(3, 100), 1, 10);
        assert_eq!(s.room_for("new2", 20), (false, Vec::new()));
        // Handed back: free too.
        s.hand_back("k4");
        assert!(s.room_for("new2", 20).0);
        s.keep((RuleId::new(0), "new2"), &batch(3, 100), 1, 20);
        // Expired: free at its expiry, not before.
        assert_eq!(s.room_for("new3", 59), (false, Vec::new()));
        let (room, gone) = s.room_for("new3", 60);
        assert!(room);
        assert_eq!(gone.len(), 1, "k7 expired");
    }

    #[test]
    fn the_tick_at_the_next_expiry_hands_back_what_ran_out_by_rule() {
        let mut s = Stashes::default();
        assert_eq!(s.next_expiry(), None);
        s.keep((RuleId::new(0), "a"), &batch(5, 100), 1, 0);
        s.keep((RuleId::new(1), "b"), &batch(3, 300), 1, 0);
        s.keep((RuleId::new(1), "c"), &batch(1, 200), 1, 0);
        assert_eq!(s.next_expiry(), Some(100));
        let mut back = Vec::new();
        let mut expire = |s: &mut Stashes, now| {
            s.expire(now, |rule, key: &str, b| {
                back.push((rule.index(), key.to_string(), b.batch, b.unspent))
            })
        };
        expire(&mut s, 99);
        expire(&mut s, 100);
        // c was spent whole; its entry stays until it expires, so its batch goes back too.
        assert_eq!(s.next_expiry(), Some(200), "c is next");
        expire(&mut s, 200);
        assert_eq!(s.next_expiry(), Some(300), "b is next");
        assert!(s.spend("a", 1, 150).is_none(), "a is gone");
        assert!(s.spend("b", 1, 150).is_some());
        expire(&mut s, 300);
        assert_eq!(
            back,
            [
                (0, "a".to_string(), 5, 4),
                (1, "c".to_string(), 1, 0),
                (1, "b".to_string(), 3, 1)
            ],
            "nothing before its expiry; each batch with its unspent tokens, on its rule"
        );
        assert_eq!(s.next_expiry(), None, "no tick needed for stashes");
    }
}
