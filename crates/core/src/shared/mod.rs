//! What lives in proxy-wasm shared data, visible to every worker of one proxy: the deny cache, the
//! lease pool, the fallback buckets, the backend's health, pending usage settlements, the
//! largest usage read lately per usage rule, and which worker leads a hot key or collects the
//! next flight.
//!
//! Invariant: every read-modify-write of a shared value goes through [`update`], the one
//! compare-and-swap loop: a value is only ever replaced by a function of what was read, and a
//! lost race is retried a bounded number of times, never blindly overwritten.

pub mod collect;
pub mod deny;
pub mod fallback;
pub mod lead;
pub mod lease;
pub mod peak;
pub mod settle;

/// An in-memory store for tests and the lease simulator (tools/src/bin/lease-sim; no host needed).
pub mod mem;

/// Bounded compare-and-swap retries before giving up on an update.
pub const CAS_TRIES: usize = 8;

/// The CAS token used to create a value that must not exist yet. The host only checks a non-zero
/// token against a value that exists; it hands out tokens from a counter, so this one matches an
/// existing value only if that value was written exactly 2^32-1 writes after the counter wrapped.
const CREATE_CAS: u32 = u32::MAX;

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
/// `get` returns the value (None if the key was never written, or was written empty: the host
/// reads an empty value back as no value) and its CAS token (0 if absent). `set` with a non-zero
/// `cas` fails with `CasMismatch` if the key exists with another token; a key that does not exist is
/// written whatever `cas` says; `cas` 0 writes unconditionally.
pub trait Store {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), StoreError>;
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError>;
}

/// What an [`update`] function decides after reading the current value.
pub enum Change<T> {
    /// Leave the value as it is and return this.
    Keep(T),
    /// Write this value (if nobody wrote since the read) and return this.
    Write(Vec<u8>, T),
}

/// `<prefix>|<table>|<slot>`, the shared-data key of a table's slot, written without `core::fmt`
/// (every exact check reads a deny slot: formatting was a thousand wasm instructions of it).
pub fn slot_key(prefix: &str, table: &str, slot: u64) -> String {
    let mut key = String::with_capacity(prefix.len() + table.len() + 22);
    key.push_str(prefix);
    key.push('|');
    key.push_str(table);
    key.push('|');
    crate::decimal::push(&mut key, slot);
    key
}

/// Reads `key`, lets `f` decide from the current value (None if absent), and writes what it
/// returns by compare-and-swap, retrying on a lost race up to [`CAS_TRIES`] times. A value that does
/// not exist yet is created with a token no live value has, so two workers creating the same key
/// cannot overwrite each other's update.
pub fn update<T>(
    store: &dyn Store,
    key: &str,
    mut f: impl FnMut(Option<&[u8]>) -> Change<T>,
) -> Result<T, StoreError> {
    let mut last = StoreError::CasMismatch;
    for _ in 0..CAS_TRIES {
        let (value, cas) = store.get(key)?;
        match f(value.as_deref()) {
            Change::Keep(out) => return Ok(out),
            Change::Write(bytes, out) => {
                let cas = if value.is_none() && cas == 0 {
                    CREATE_CAS
                } else {
                    cas
                };
                match store.set(key, &bytes, cas) {
                    Ok(()) => return Ok(out),
                    Err(e) => last = e,
                }
            }
        }
    }
    Err(last)
}

/// FNV-1a of `text`: stable across workers, restarts and builds.
pub fn hash(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Little-endian u64 at byte `at` of `bytes`, if there are 8 bytes there.
pub fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let chunk: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(chunk))
}

/// Appends little-endian u64s.
pub fn write_u64s(out: &mut Vec<u8>, values: &[u64]) {
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::mem::MemStore;
    use super::*;

    #[test]
    fn slot_keys_read_as_the_tables_always_named_them() {
        assert_eq!(
            slot_key("tollgate|v3|p", "deny", 8191),
            "tollgate|v3|p|deny|8191"
        );
        assert_eq!(slot_key("t|r", "fb", 0), "t|r|fb|0");
    }

    #[test]
    fn update_retries_a_lost_race_and_gives_up_boundedly() {
        let s = MemStore::default();
        s.set("k", b"1", 0).unwrap();
        s.inject_conflicts.set(2);
        let mut calls = 0;
        let out = update(&s, "k", |v| {
            calls += 1;
            Change::Write(b"2".to_vec(), v.map(<[u8]>::to_vec))
        })
        .unwrap();
        assert_eq!(out.as_deref(), Some(&b"1"[..]));
        assert_eq!(calls, 3, "two conflicts, then the write");
        s.inject_conflicts.set(100);
        assert_eq!(
            update(&s, "k", |_| Change::Write(b"3".to_vec(), ())),
            Err(StoreError::CasMismatch)
        );
    }

    #[test]
    fn keep_writes_nothing() {
        let s = MemStore::default();
        s.set("k", b"1", 0).unwrap();
        let writes = s.writes();
        update(&s, "k", |_| Change::Keep(())).unwrap();
        assert_eq!(s.writes(), writes);
    }

    #[test]
    fn creating_a_value_never_overwrites_one_created_meanwhile() {
        let s = MemStore::default();
        // Another worker creates the key between our read and our write.
        s.before_next_set
            .replace(Some(("k".to_string(), b"theirs".to_vec())));
        let out = update(&s, "k", |v| match v {
            None => Change::Write(b"ours".to_vec(), "created"),
            Some(_) => Change::Keep("saw theirs"),
        });
        assert_eq!(out, Ok("saw theirs"));
        assert_eq!(s.get("k").unwrap().0.as_deref(), Some(&b"theirs"[..]));
    }
}
