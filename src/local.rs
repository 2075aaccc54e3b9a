//! Local pre-admission: what a proxy may answer on its own, kept in proxy-wasm shared data so all
//! of the proxy's workers see it.
//!
//! Invariant: the local stage never admits a token the global bucket did not grant. In exact mode it
//! only *denies*, and only while Redis itself said the bucket cannot serve that cost (the "denied
//! until" of the last reply). The fallback bucket admits only while the backend is failing and the
//! rule's `failure_mode` is `local`.
//!
//! Memory is bounded: entries live in fixed tables of `SLOTS` slots per kind, because shared data
//! can never be deleted. A deny-cache slot remembers the one bucket key it is for (a clash only
//! costs a Redis call). Fallback buckets are per slot: keys that clash share one bucket, which can
//! only under-admit.

use crate::bucket::{self, Limits, State};

/// Slots per table (deny cache, fallback buckets).
pub const SLOTS: u64 = 8192;
/// Bounded compare-and-swap retries before giving up on an update.
pub const CAS_TRIES: usize = 8;

/// Why a shared-data operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// Someone else wrote the key since we read it.
    CasMismatch,
    /// The host refused (with its status).
    Host(String),
}

/// Proxy-wide key/value store with compare-and-swap, as proxy-wasm shared data provides it.
///
/// `get` returns the value (None if the key was never written) and its CAS token (0 if absent).
/// `set` with a non-zero `cas` fails with `CasMismatch` if the key changed since; writing a key that
/// does not exist always succeeds whatever `cas` says (there is no atomic insert-if-absent).
pub trait SharedStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), StoreError>;
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError>;
}

/// The table slot of a bucket key (FNV-1a, stable across workers and restarts).
pub fn slot(bucket_key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bucket_key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h % SLOTS
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let chunk: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(chunk))
}

/// The per-proxy "denied until" cache of one plugin (`ns` keeps plugins apart in shared data).
pub struct DenyCache<'a> {
    store: &'a dyn SharedStore,
    ns: &'a str,
}

impl<'a> DenyCache<'a> {
    pub fn new(store: &'a dyn SharedStore, ns: &'a str) -> Self {
        DenyCache { store, ns }
    }

    fn slot_key(&self, bucket_key: &str) -> String {
        format!("{}|deny|{}", self.ns, slot(bucket_key))
    }

    /// Milliseconds the request must still wait if Redis already said `bucket_key` cannot serve
    /// `cost` (or less) before then; None if unknown or past.
    pub fn denied(&self, bucket_key: &str, cost: u64, now_ms: u64) -> Option<u64> {
        let (value, _) = self.store.get(&self.slot_key(bucket_key)).ok()?;
        let value = value?;
        let until = read_u64(&value, 0)?;
        let denied_cost = read_u64(&value, 8)?;
        let key = value.get(16..)?;
        (key == bucket_key.as_bytes() && cost >= denied_cost && until > now_ms)
            .then(|| until - now_ms)
    }

    /// Remembers that `bucket_key` cannot serve `cost` before `until_ms`. Last writer wins: any
    /// entry written here is one Redis gave, so a lost race only costs a Redis call.
    pub fn remember(&self, bucket_key: &str, cost: u64, until_ms: u64) -> Result<(), StoreError> {
        let mut value = Vec::with_capacity(16 + bucket_key.len());
        value.extend_from_slice(&until_ms.to_le_bytes());
        value.extend_from_slice(&cost.to_le_bytes());
        value.extend_from_slice(bucket_key.as_bytes());
        self.store.set(&self.slot_key(bucket_key), &value, 0)
    }
}

/// Takes `cost` from the per-proxy fallback bucket of `bucket_key` (used only while the backend
/// fails and `failure_mode` is `local`), with the same math as the global bucket.
pub fn fallback_take(
    store: &dyn SharedStore,
    ns: &str,
    bucket_key: &str,
    limits: &Limits,
    cost: u64,
    now_us: u64,
) -> Result<bucket::Reply, StoreError> {
    let key = format!("{ns}|fb|{}", slot(bucket_key));
    let mut last = StoreError::CasMismatch;
    for _ in 0..CAS_TRIES {
        let (value, cas) = store.get(&key)?;
        let Some(value) = value else {
            // No insert-if-absent exists: create the slot (empty = full bucket) unconditionally,
            // then update it only by compare-and-swap, so two workers can't both take from a
            // bucket that one of them then overwrites.
            store.set(&key, &[], 0)?;
            continue;
        };
        let state = decode_state(&value);
        let (next, reply) = bucket::take(state, limits, cost, 0, now_us);
        match store.set(&key, &encode_state(next), cas) {
            Ok(()) => return Ok(reply),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// An empty value means a full bucket (shared data cannot be deleted).
fn encode_state(state: Option<State>) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    if let Some(s) = state {
        out.extend_from_slice(&s.units.to_le_bytes());
        out.extend_from_slice(&s.ts_us.to_le_bytes());
        out.extend_from_slice(&s.period_ms.to_le_bytes());
    }
    out
}

fn decode_state(bytes: &[u8]) -> Option<State> {
    Some(State {
        units: read_u64(bytes, 0)?,
        ts_us: read_u64(bytes, 8)?,
        period_ms: read_u64(bytes, 16)?,
    })
}

/// An in-memory `SharedStore` with the host's CAS semantics, for tests.
#[cfg(test)]
#[derive(Default)]
pub struct MemStore {
    map: std::cell::RefCell<std::collections::HashMap<String, (Vec<u8>, u32)>>,
    next_cas: std::cell::Cell<u32>,
    /// The next this-many `set`s with a non-zero cas fail with `CasMismatch` (injected conflicts).
    pub inject_conflicts: std::cell::Cell<u32>,
}

#[cfg(test)]
impl MemStore {
    pub fn len(&self) -> usize {
        self.map.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
impl SharedStore for MemStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        Ok(match self.map.borrow().get(key) {
            Some((v, cas)) => (Some(v.clone()), *cas),
            None => (None, 0),
        })
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        let mut map = self.map.borrow_mut();
        if let Some((_, current)) = map.get(key) {
            let injected = self.inject_conflicts.get();
            if cas != 0 && injected > 0 {
                self.inject_conflicts.set(injected - 1);
                return Err(StoreError::CasMismatch);
            }
            if cas != 0 && cas != *current {
                return Err(StoreError::CasMismatch);
            }
        }
        let next = self.next_cas.get().wrapping_add(1).max(1);
        self.next_cas.set(next);
        map.insert(key.to_string(), (value.to_vec(), next));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        burst: 3,
        rate: 1,
        period_ms: 1000,
    };

    #[test]
    fn mem_store_has_host_cas_semantics() {
        let s = MemStore::default();
        assert_eq!(s.get("k").unwrap(), (None, 0));
        s.set("k", b"a", 12345).unwrap(); // absent key: any cas succeeds
        let (v, cas) = s.get("k").unwrap();
        assert_eq!(v.as_deref(), Some(&b"a"[..]));
        s.set("k", b"b", cas).unwrap();
        assert_eq!(s.set("k", b"c", cas), Err(StoreError::CasMismatch));
        s.set("k", b"d", 0).unwrap(); // cas 0: unconditional
        assert_eq!(s.get("k").unwrap().0.as_deref(), Some(&b"d"[..]));
    }

    #[test]
    fn deny_cache_answers_until_expiry_for_equal_or_larger_cost() {
        let s = MemStore::default();
        let c = DenyCache::new(&s, "tollgate|t");
        assert_eq!(c.denied("k1", 1, 1000), None);
        c.remember("k1", 2, 1500).unwrap();
        assert_eq!(c.denied("k1", 2, 1000), Some(500));
        assert_eq!(c.denied("k1", 5, 1499), Some(1));
        assert_eq!(c.denied("k1", 1, 1000), None, "a smaller cost may fit");
        assert_eq!(c.denied("k1", 2, 1500), None, "expired");
        assert_eq!(c.denied("k2", 2, 1000), None, "other key");
    }

    #[test]
    fn deny_cache_slot_clash_never_denies_another_key() {
        let s = MemStore::default();
        let c = DenyCache::new(&s, "ns");
        // Find two keys in the same slot.
        let a = "a0".to_string();
        let b = (1..100_000)
            .map(|i| format!("a{i}"))
            .find(|k| slot(k) == slot(&a))
            .unwrap();
        c.remember(&a, 1, 10_000).unwrap();
        assert_eq!(c.denied(&b, 1, 0), None);
        c.remember(&b, 1, 10_000).unwrap();
        assert_eq!(
            c.denied(&a, 1, 0),
            None,
            "evicted: costs a Redis call, never a wrong deny"
        );
        assert_eq!(c.denied(&b, 1, 0), Some(10_000));
    }

    #[test]
    fn deny_cache_memory_is_bounded() {
        let s = MemStore::default();
        let c = DenyCache::new(&s, "ns");
        for i in 0..50_000 {
            c.remember(&format!("key-{i}"), 1, 10).unwrap();
        }
        assert!(s.len() as u64 <= SLOTS);
    }

    #[test]
    fn garbage_entries_are_ignored() {
        let s = MemStore::default();
        let c = DenyCache::new(&s, "ns");
        s.set(&format!("ns|deny|{}", slot("k")), b"short", 0)
            .unwrap();
        assert_eq!(c.denied("k", 1, 0), None);
        s.set(&format!("ns|fb|{}", slot("k")), b"short", 0).unwrap();
        // Unreadable fallback state counts as a full bucket.
        let r = fallback_take(&s, "ns", "k", &LIMITS, 1, 0).unwrap();
        assert!(r.allowed);
        assert_eq!(r.remaining, 2);
    }

    #[test]
    fn fallback_bucket_limits_and_refills() {
        let s = MemStore::default();
        let now = 1_000_000_000;
        for i in 0..3 {
            let r = fallback_take(&s, "ns", "k", &LIMITS, 1, now).unwrap();
            assert!(r.allowed, "request {i}");
        }
        let r = fallback_take(&s, "ns", "k", &LIMITS, 1, now).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.retry_after_ms, 1000);
        let r = fallback_take(&s, "ns", "k", &LIMITS, 1, now + 1_000_000).unwrap();
        assert!(r.allowed);
    }

    #[test]
    fn fallback_survives_injected_cas_conflicts_and_gives_up_boundedly() {
        let s = MemStore::default();
        fallback_take(&s, "ns", "k", &LIMITS, 1, 0).unwrap();
        s.inject_conflicts.set(CAS_TRIES as u32 - 1);
        let r = fallback_take(&s, "ns", "k", &LIMITS, 1, 0).unwrap();
        assert!(r.allowed);
        assert_eq!(r.remaining, 1, "exactly one take despite retries");
        s.inject_conflicts.set(CAS_TRIES as u32);
        assert_eq!(
            fallback_take(&s, "ns", "k", &LIMITS, 1, 0),
            Err(StoreError::CasMismatch)
        );
    }
}
