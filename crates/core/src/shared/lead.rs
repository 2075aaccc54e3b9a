//! Which worker leads a hot exact-mode key: the one whose queue the proxy's other workers send
//! their checks of that key to, so the proxy has one call out for it instead of one per worker.
//!
//! Invariant: a record is only a hint. Whoever receives a check serves it (sends a call if it has
//! none out), so a stale or lost record costs a call or a detour, never a check. Slots are
//! direct-mapped (`SLOTS` per plugin: shared data can never be deleted, so memory stays bounded);
//! a slot remembers its key, and a clash means the second key is simply not shared across workers.

use super::{hash, read_u64, update, write_u64s, Change, Store, StoreError};

/// Slots in the leader table.
pub const SLOTS: u64 = 1024;

pub struct Leaders<'a> {
    store: &'a dyn Store,
    ns: &'a str,
}

/// A slot's value: the leader's queue token, then the bucket key (empty: no leader).
fn record(queue: u32, bucket_key: &str) -> Vec<u8> {
    let mut value = Vec::with_capacity(8 + bucket_key.len());
    write_u64s(&mut value, &[u64::from(queue)]);
    value.extend_from_slice(bucket_key.as_bytes());
    value
}

/// The queue a slot's value names for `bucket_key`, if it names that key.
fn leader_in(value: Option<&[u8]>, bucket_key: &str) -> Option<u32> {
    let value = value?;
    let queue = u32::try_from(read_u64(value, 0)?).ok()?;
    (value.get(8..)? == bucket_key.as_bytes()).then_some(queue)
}

impl<'a> Leaders<'a> {
    pub fn new(store: &'a dyn Store, ns: &'a str) -> Self {
        Leaders { store, ns }
    }

    fn slot_key(&self, bucket_key: &str) -> String {
        super::slot_key(self.ns, "lead", hash(bucket_key) % SLOTS)
    }

    /// The queue of the worker leading `bucket_key`, if one does.
    pub fn leader(&self, bucket_key: &str) -> Option<u32> {
        let (value, _) = self.store.get(&self.slot_key(bucket_key)).ok()?;
        leader_in(value.as_deref(), bucket_key)
    }

    /// Makes `queue` the leader of `bucket_key` if its slot is free; says who leads the key
    /// then (`queue`, or the worker that already did; None if the slot holds another key).
    pub fn claim(&self, bucket_key: &str, queue: u32) -> Result<Option<u32>, StoreError> {
        update(
            self.store,
            &self.slot_key(bucket_key),
            |value| match value.filter(|v| !v.is_empty()) {
                None => Change::Write(record(queue, bucket_key), Some(queue)),
                Some(v) => Change::Keep(leader_in(Some(v), bucket_key)),
            },
        )
    }

    /// Frees `bucket_key`'s slot if it still names `queue` as its leader.
    pub fn release(&self, bucket_key: &str, queue: u32) -> Result<(), StoreError> {
        update(self.store, &self.slot_key(bucket_key), |value| {
            if leader_in(value, bucket_key) == Some(queue) {
                Change::Write(Vec::new(), ())
            } else {
                Change::Keep(())
            }
        })
    }
}

/// A number no other worker of this plugin got from the same store (names this worker's queue).
pub fn worker_number(store: &dyn Store, ns: &str) -> Result<u64, StoreError> {
    update(store, &format!("{ns}|workers"), |value| {
        let next = value
            .and_then(|v| read_u64(v, 0))
            .unwrap_or(0)
            .saturating_add(1);
        let mut bytes = Vec::with_capacity(8);
        write_u64s(&mut bytes, &[next]);
        Change::Write(bytes, next)
    })
}

/// The name of a new worker's shared queue: its own, from [`worker_number`] (a name registered
/// twice would move the queue to the later worker).
pub fn queue_name(store: &dyn Store, ns: &str) -> Result<String, StoreError> {
    Ok(format!("{ns}|queue|{}", worker_number(store, ns)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::mem::MemStore;

    #[test]
    fn one_leader_per_key_until_it_lets_go() {
        let s = MemStore::default();
        let l = Leaders::new(&s, "tollgate|t");
        assert_eq!(l.leader("k"), None);
        assert_eq!(l.claim("k", 7).unwrap(), Some(7));
        assert_eq!(l.claim("k", 7).unwrap(), Some(7), "claiming again keeps it");
        assert_eq!(l.claim("k", 8).unwrap(), Some(7), "taken");
        assert_eq!(l.leader("k"), Some(7));
        l.release("k", 8).unwrap();
        assert_eq!(l.leader("k"), Some(7), "only the leader lets go");
        l.release("k", 7).unwrap();
        assert_eq!(l.leader("k"), None);
        assert_eq!(l.claim("k", 8).unwrap(), Some(8));
        assert_eq!(l.leader("k"), Some(8));
    }

    #[test]
    fn a_slot_taken_by_another_key_is_no_leader_and_not_taken_over() {
        let s = MemStore::default();
        let l = Leaders::new(&s, "tollgate|t");
        let a = "key-a".to_string();
        let b = (0..)
            .map(|i| format!("key-{i}"))
            .find(|k| *k != a && hash(k) % SLOTS == hash(&a) % SLOTS)
            .unwrap();
        assert_eq!(l.claim(&a, 1).unwrap(), Some(1));
        assert_eq!(l.leader(&b), None);
        assert_eq!(l.claim(&b, 2).unwrap(), None, "the slot holds another key");
        l.release(&b, 1).unwrap();
        assert_eq!(l.leader(&a), Some(1));
    }

    #[test]
    fn worker_numbers_are_never_handed_out_twice() {
        let s = MemStore::default();
        let got: Vec<u64> = (0..3)
            .map(|_| worker_number(&s, "tollgate|t").unwrap())
            .collect();
        assert_eq!(got, [1, 2, 3]);
        assert_eq!(worker_number(&s, "tollgate|u").unwrap(), 1, "per plugin");
    }

    #[test]
    fn each_worker_names_its_own_queue() {
        let s = MemStore::default();
        assert_eq!(queue_name(&s, "tollgate|t").unwrap(), "tollgate|t|queue|1");
        assert_eq!(queue_name(&s, "tollgate|t").unwrap(), "tollgate|t|queue|2");
    }
}
