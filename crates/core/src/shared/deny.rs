//! The per-proxy deny cache: "Redis said this bucket cannot serve this cost before then".
//!
//! Invariant: the cache only ever denies, and only for a key, a cost at least as large and a time
//! before the one Redis gave (a penalty box's entry: every cost, until the box ends). Slots are direct-mapped (`SLOTS` per plugin; shared data can never be
//! deleted, so memory stays bounded); a slot remembers its key, so a clash costs a Redis call and
//! never denies another key. A box's entry stays until the box ends: no other key's entry
//! replaces it (nor a plain denial of its own key), so a flood of other keys' denials cannot make
//! a proxy forget a box, which is all that refuses a boxed key while Redis cannot answer.

use super::{hash, read_u64, update, write_u64s, Change, Store, StoreError};

/// Slots in the deny cache.
pub const SLOTS: u64 = 8192;

pub struct DenyCache<'a> {
    store: &'a dyn Store,
    ns: &'a str,
}

impl<'a> DenyCache<'a> {
    pub fn new(store: &'a dyn Store, ns: &'a str) -> Self {
        DenyCache { store, ns }
    }

    fn slot_key(&self, bucket_key: &str) -> String {
        super::slot_key(self.ns, "deny", hash(bucket_key) % SLOTS)
    }

    /// Milliseconds the request of a rule without a penalty must still wait if Redis already said
    /// `bucket_key` cannot serve `cost` (or less) before then; None if unknown or past. A penalty
    /// box's entry refuses it nothing: Redis ignores a box for a call that carries no penalty
    /// (the rule's was removed), so a box cached before does too.
    pub fn denied(&self, bucket_key: &str, cost: u64, now_ms: u64) -> Option<u64> {
        self.denial(bucket_key, cost, now_ms, false)
            .map(|(ms, _)| ms)
    }

    /// As [`DenyCache::denied`] for a rule with a penalty or not (`penalty`), and whether the
    /// entry is a penalty box's (which answers only a rule with a penalty).
    pub fn denial(
        &self,
        bucket_key: &str,
        cost: u64,
        now_ms: u64,
        penalty: bool,
    ) -> Option<(u64, bool)> {
        let (value, _) = self.store.get(&self.slot_key(bucket_key)).ok()?;
        let value = value?;
        let until = read_u64(&value, 0)?;
        let denied_cost = read_u64(&value, 8)?;
        let boxed = read_u64(&value, 16)? == 1;
        let key = value.get(24..)?;
        (key == bucket_key.as_bytes()
            && cost >= denied_cost
            && until > now_ms
            && (penalty || !boxed))
            .then(|| (until - now_ms, boxed))
    }

    /// Remembers that `bucket_key` cannot serve `cost` before `until_ms` (`now_ms`: the proxy's
    /// clock, to tell whether a box in the slot still holds). Last writer wins, except over a box
    /// that has not ended: every entry written here is one Redis gave, so a lost race or a slot
    /// kept by a box only costs a Redis call.
    pub fn remember(
        &self,
        bucket_key: &str,
        cost: u64,
        until_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.write(bucket_key, (cost, until_ms, false), now_ms)
    }

    /// Remembers that `bucket_key` is in its penalty box until `until_ms`: no cost is served
    /// before then (a cost of 0 never asks the cache). Another key's box that has not ended keeps
    /// the slot.
    pub fn remember_box(
        &self,
        bucket_key: &str,
        until_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.write(bucket_key, (1, until_ms, true), now_ms)
    }

    fn write(
        &self,
        key: &str,
        (cost, until_ms, boxed): (u64, u64, bool),
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut value = Vec::with_capacity(24 + key.len());
        write_u64s(&mut value, &[until_ms, cost, u64::from(boxed)]);
        value.extend_from_slice(key.as_bytes());
        update(self.store, &self.slot_key(key), |held| {
            // A box that has not ended yields only to a box of its own key (Redis' newer word).
            let kept = held.is_some_and(|held| {
                let live_box = read_u64(held, 16) == Some(1)
                    && read_u64(held, 0).is_some_and(|until| until > now_ms);
                live_box && !(boxed && held.get(24..) == Some(key.as_bytes()))
            });
            if kept {
                Change::Keep(())
            } else {
                Change::Write(value.clone(), ())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::mem::MemStore;

    #[test]
    fn answers_until_expiry_for_equal_or_larger_cost() {
        let s = MemStore::default();
        let c = DenyCache::new(&s, "tollgate|t");
        assert_eq!(c.denied("k1", 1, 1000), None);
        c.remember("k1", 2, 1500, 1000).unwrap();
        assert_eq!(c.denied("k1", 2, 1000), Some(500));
        assert_eq!(c.denied("k1", 5, 1499), Some(1));
        assert_eq!(c.denied("k1", 1, 1000), None, "a smaller cost may fit");
        assert_eq!(c.denied("k1", 2, 1500), None, "expired");
        assert_eq!(c.denied("k2", 2, 1000), None, "other key");
    }

    #[test]
    fn a_slot_clash_never_denies_another_key_and_memory_is_bounded() {
        let s = MemStore::default();
        let c = DenyCache::new(&s, "ns");
        for i in 0..(SLOTS * 3) {
            c.remember(&format!("key{i}"), 1, 10_000, 0).unwrap();
        }
        assert!(s.keys() as u64 <= SLOTS);
        let mut clash = None;
        for i in 0..(SLOTS * 3) {
            let k = format!("key{i}");
            if c.denied(&k, 1, 0).is_none() {
                clash = Some(k);
                break;
            }
        }
        assert!(clash.is_some(), "some key lost its slot to another");
    }

    #[test]
    fn a_box_denies_every_cost_until_it_ends_and_says_so() {
        let s = MemStore::default();
        let c = DenyCache::new(&s, "ns");
        c.remember("k", 3, 1200, 1000).unwrap();
        assert_eq!(c.denial("k", 3, 1000, true), Some((200, false)));
        c.remember_box("k", 121_000, 1000).unwrap();
        assert_eq!(c.denial("k", 1, 1000, true), Some((120_000, true)));
        assert_eq!(c.denial("k", 7, 120_999, true), Some((1, true)));
        assert_eq!(c.denial("k", 1, 121_000, true), None, "the box ended");
        assert_eq!(
            c.denied("k", 7, 1000),
            None,
            "a rule without a penalty is refused nothing by a box"
        );
    }

    #[test]
    fn a_box_keeps_its_slot_until_it_ends() {
        let s = MemStore::default();
        let c = DenyCache::new(&s, "ns");
        c.remember_box("boxed", 121_000, 1000).unwrap();
        for i in 0..(SLOTS * 3) {
            let k = format!("key{i}");
            c.remember(&k, 1, 10_000, 1000).unwrap();
            c.remember_box(&k, 10_000, 1000).unwrap();
        }
        c.remember("boxed", 5, 2000, 1000).unwrap();
        assert_eq!(c.denial("boxed", 1, 100_000, true), Some((21_000, true)));
        // Redis' newer word on the box itself is taken; once it ended, the slot is anyone's.
        c.remember_box("boxed", 130_000, 100_000).unwrap();
        assert_eq!(c.denial("boxed", 1, 100_000, true), Some((30_000, true)));
        let slot = hash("boxed") % SLOTS;
        let clash = (0..SLOTS * 8)
            .map(|i| format!("key{i}"))
            .find(|k| hash(k) % SLOTS == slot)
            .unwrap();
        c.remember(&clash, 1, 200_000, 129_999).unwrap();
        assert_eq!(c.denied(&clash, 1, 129_999), None, "the box still holds");
        c.remember(&clash, 1, 200_000, 130_000).unwrap();
        assert_eq!(c.denied(&clash, 1, 130_000), Some(70_000), "the box ended");
    }

    #[test]
    fn garbage_is_ignored() {
        let s = MemStore::default();
        let c = DenyCache::new(&s, "ns");
        s.set(&c.slot_key("k"), b"short", 0).unwrap();
        assert_eq!(c.denied("k", 1, 0), None);
    }
}
