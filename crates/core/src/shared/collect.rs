//! Which worker of the proxy collects its exact checks: the one with a flight of its open batch
//! out, whose next flight the proxy's other workers hand their checks to instead of sending
//! flights of their own.
//!
//! Invariant: the record is only a hint. A worker names itself only when no worker is named and
//! unnames only itself (or a collector that never answered); whoever receives a relayed check
//! serves it (sends its open batch when no flight of its own is out) or says it did not take it,
//! so a stale record costs a detour. Only a collector whose VM is gone costs checks: those relayed
//! to it before its silence is noticed get their failure mode.

use super::{read_u64, update, write_u64s, Change, Store, StoreError};

pub struct Collector<'a> {
    store: &'a dyn Store,
    key: String,
}

impl<'a> Collector<'a> {
    pub fn new(store: &'a dyn Store, ns: &str) -> Self {
        Collector {
            store,
            key: [ns, "|collector"].concat(),
        }
    }

    /// The queue of the worker collecting now, if one is.
    pub fn get(&self) -> Option<u32> {
        let (value, _) = self.store.get(&self.key).ok()?;
        u32::try_from(read_u64(value.as_deref()?, 0)?).ok()
    }

    /// Names `queue` the collector if no worker is; says whether it is then.
    pub fn claim(&self, queue: u32) -> Result<bool, StoreError> {
        update(self.store, &self.key, |value| {
            match value.and_then(|v| read_u64(v, 0)) {
                None => {
                    let mut bytes = Vec::with_capacity(8);
                    write_u64s(&mut bytes, &[u64::from(queue)]);
                    Change::Write(bytes, true)
                }
                Some(q) => Change::Keep(q == u64::from(queue)),
            }
        })
    }

    /// Unnames `queue`, if it is the collector.
    pub fn release(&self, queue: u32) -> Result<(), StoreError> {
        update(self.store, &self.key, |value| {
            if value.and_then(|v| read_u64(v, 0)) == Some(u64::from(queue)) {
                Change::Write(Vec::new(), ())
            } else {
                Change::Keep(())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::mem::MemStore;
    use super::*;

    #[test]
    fn one_worker_collects_until_it_lets_go() {
        let store = MemStore::default();
        let c = Collector::new(&store, "ns");
        assert_eq!(c.get(), None);
        assert_eq!(c.claim(3), Ok(true));
        assert_eq!(c.claim(4), Ok(false), "3 collects");
        assert_eq!(c.claim(3), Ok(true), "still 3");
        assert_eq!(c.release(4), Ok(()));
        assert_eq!(c.get(), Some(3), "only 3 unnames itself");
        assert_eq!(c.release(3), Ok(()));
        assert_eq!(c.get(), None);
        assert_eq!(c.claim(4), Ok(true));
        assert_eq!(Collector::new(&store, "other").get(), None, "per plugin");
    }
}
