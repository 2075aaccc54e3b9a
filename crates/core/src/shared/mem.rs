//! An in-memory [`Store`] with the host's semantics, for tests and the lease simulator: CAS tokens from a counter that
//! skips 0, a non-zero token checked only against an existing value, an empty value read back as
//! no value, plus hooks to inject conflicts and another worker's write.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::{Store, StoreError};

#[derive(Default)]
pub struct MemStore {
    map: RefCell<HashMap<String, (Vec<u8>, u32)>>,
    next_cas: Cell<u32>,
    writes: Cell<u64>,
    /// The next this-many `set`s with a non-zero cas on an existing key fail with `CasMismatch`.
    pub inject_conflicts: Cell<u32>,
    /// Written (unconditionally, as another worker would) just before the next `set`.
    pub before_next_set: RefCell<Option<(String, Vec<u8>)>>,
}

impl MemStore {
    /// Keys stored.
    pub fn keys(&self) -> usize {
        self.map.borrow().len()
    }

    /// Successful writes so far.
    pub fn writes(&self) -> u64 {
        self.writes.get()
    }

    fn write(&self, key: &str, value: &[u8]) {
        let next = self.next_cas.get().wrapping_add(1).max(1);
        self.next_cas.set(next);
        self.writes.set(self.writes.get() + 1);
        self.map
            .borrow_mut()
            .insert(key.to_string(), (value.to_vec(), next));
    }
}

impl Store for MemStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        Ok(match self.map.borrow().get(key) {
            Some((v, cas)) if v.is_empty() => (None, *cas),
            Some((v, cas)) => (Some(v.clone()), *cas),
            None => (None, 0),
        })
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        if let Some((k, v)) = self.before_next_set.borrow_mut().take() {
            self.write(&k, &v);
        }
        let current = self.map.borrow().get(key).map(|(_, c)| *c);
        if let Some(current) = current {
            let injected = self.inject_conflicts.get();
            if cas != 0 && injected > 0 {
                self.inject_conflicts.set(injected - 1);
                return Err(StoreError::CasMismatch);
            }
            if cas != 0 && cas != current {
                return Err(StoreError::CasMismatch);
            }
        }
        self.write(key, value);
        Ok(())
    }
}

#[cfg(test)]
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
    s.set("e", b"", 0).unwrap();
    assert_eq!(s.get("e").unwrap().0, None, "empty reads as absent");
}
