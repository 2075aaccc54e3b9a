//! Which lease keys this worker has seen lately, and whether new keys tend to come back: when
//! most keys new to this worker lately were seen only once (a scan, a flood of new client ids),
//! the first request of a key new to the worker and to the proxy's pool is checked on its own (one
//! call for its cost, like exact mode), and the key gets a lease only when it comes back.
//!
//! A lease for a key that never comes back buys nothing: its flight and deposit write the proxy's
//! shared pool twice, its call runs the script's lease path, and its way in the pool is taken from
//! a key that may be leasing. In `make bench`'s flood that cost a fifth of what the call itself
//! costs. A key that comes back pays up to one call more for having been checked on its own
//! (when its next request comes while that call is out). So going alone pays only while few new
//! keys come back: the worker does when fewer than a quarter of its new keys lately did.
//!
//! Remembering is a direct-mapped table of key fingerprints under a random seed: a key whose slot
//! another key took since is new again, and a false match treats a new key as one seen before.
//! Either way the check is decided by the global bucket: the table decides what a check costs,
//! never whether it is admitted.

use std::hash::BuildHasher;

use crate::rule::hash::Seeded;

/// Slots of the table (8 bytes each).
pub const SLOTS: usize = 4096;
/// The counts of new and returned keys are halved after this many new keys (so they say what
/// happened lately).
const HALF_LIFE: u32 = 64;
/// Fewer new keys than this lately say nothing about whether new keys come back.
const JUDGED_FROM: u32 = 16;
/// New keys go alone while fewer than one in this many lately came back.
const RETURN_SHARE: u32 = 4;
/// A slot's low bit: its key was seen a second time.
const RETURNED: u64 = 1;

#[derive(Debug)]
pub struct Sightings {
    /// A key's fingerprint (its hash without the low bit), with [`RETURNED`].
    slots: Box<[u64]>,
    hasher: Seeded,
    /// Keys seen for the first time lately, and those of them seen a second time.
    new: u32,
    returned: u32,
}

impl Default for Sightings {
    fn default() -> Sightings {
        Sightings {
            slots: vec![0; SLOTS].into_boxed_slice(),
            hasher: Seeded::default(),
            new: 0,
            returned: 0,
        }
    }
}

/// The slot of a fingerprint: from bits above the low one (which is always clear in it).
fn slot_of(fingerprint: u64) -> usize {
    (fingerprint >> 1) as usize % SLOTS
}

impl Sightings {
    /// Records a sighting of `key`; whether it is the first lately (not seen since its slot was
    /// last taken by another key).
    fn first_sighting(&mut self, key: &str) -> bool {
        let fingerprint = self.hasher.hash_one(key) & !RETURNED;
        let Some(slot) = self.slots.get_mut(slot_of(fingerprint)) else {
            return true;
        };
        if *slot & !RETURNED == fingerprint {
            if *slot & RETURNED == 0 {
                *slot |= RETURNED;
                self.returned = self.returned.saturating_add(1);
            }
            return false;
        }
        *slot = fingerprint;
        self.new += 1;
        if self.new >= HALF_LIFE {
            self.new /= 2;
            self.returned /= 2;
        }
        true
    }

    /// Whether fewer than a quarter of the keys new to this worker lately were seen again.
    fn mostly_once(&self) -> bool {
        self.new >= JUDGED_FROM && self.returned.saturating_mul(RETURN_SHARE) < self.new
    }

    /// Records a sighting of `key` (every check that found no leased token is one, so that keys
    /// that come back are counted); whether a check of it goes on its own rather than wait for a
    /// lease (if the pool has none): a key new lately, while most new keys were seen only once.
    pub fn goes_alone(&mut self, key: &str) -> bool {
        self.first_sighting(key) && self.mostly_once()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(s: &Sightings, key: &str) -> usize {
        slot_of(s.hasher.hash_one(key) & !RETURNED)
    }

    #[test]
    fn keys_spread_over_every_slot() {
        let s = Sightings::default();
        let used: std::collections::HashSet<usize> =
            (0..100_000).map(|i| slot(&s, &format!("k{i}"))).collect();
        assert_eq!(used.len(), SLOTS);
    }

    /// `n` distinct keys with slots of their own, none of them `key`'s.
    fn distinct_keys(s: &Sightings, n: usize, key: &str) -> Vec<String> {
        let mut taken = std::collections::HashSet::from([slot(s, key)]);
        (0..)
            .map(|i| format!("k{i}"))
            .filter(|k| taken.insert(slot(s, k)))
            .take(n)
            .collect()
    }

    #[test]
    fn new_keys_lease_at_once_until_most_of_them_are_seen_only_once() {
        let mut s = Sightings::default();
        let keys = distinct_keys(&s, 100, "hot");
        assert!(!s.goes_alone("hot"));
        assert!(!s.goes_alone("hot"));
        let alone: Vec<bool> = keys.iter().map(|k| s.goes_alone(k)).collect();
        assert!(alone[..14].iter().all(|a| !a), "too few new keys to judge");
        assert!(alone[20..].iter().all(|a| *a), "most were seen only once");
        assert!(!s.goes_alone("hot"), "a key seen before waits for a lease");
    }

    #[test]
    fn new_keys_that_come_back_keep_leasing_at_once() {
        let mut s = Sightings::default();
        for k in distinct_keys(&s, 200, "") {
            assert!(!s.goes_alone(&k), "{k}");
            assert!(!s.goes_alone(&k));
        }
    }

    #[test]
    fn a_key_whose_slot_another_took_is_new_again() {
        let mut s = Sightings::default();
        let flood = distinct_keys(&s, 40, "a");
        flood.iter().for_each(|k| {
            s.goes_alone(k);
        });
        let rival = (0..)
            .map(|i| format!("r{i}"))
            .find(|k| slot(&s, k) == slot(&s, "a"))
            .unwrap();
        assert!(s.goes_alone("a"));
        assert!(!s.goes_alone("a"));
        assert!(s.goes_alone(&rival));
        assert!(s.goes_alone("a"), "the rival took a's slot");
    }
}
