//! The bucket keys of recently seen key values, per worker (see [`KeyCache`] for its invariant).

use super::{bucket_key, hash};
use crate::config::KeySource;

/// The bucket keys of recently seen key values, per worker and rule: a hot key's requests skip
/// SHA-256 and its formatting, which in wasm cost more than the rest of the local path.
///
/// Invariant: a cached key is exactly what [`bucket_key`] gives for the rule's prefix, name and
/// sources and the same values. It is looked up by rule index and values only, so one cache
/// serves one configuration (the engine's, rebuilt with it). It is a set-associative array of
/// [`KeyCache::MAX`] entries of values at most [`KeyCache::MAX_VALUES_LEN`] bytes long: a flood of
/// new keys, however long their values, holds at most about 0.5 MiB per worker, and a lookup
/// compares at most [`KeyCache::WAYS`] entries whatever the values (crafted values that share a
/// set only evict each other: a miss, what a new key costs anyway). The set is picked by a fast
/// hash under a seed random per worker ([`hash`]).
#[derive(Debug)]
pub struct KeyCache {
    /// `MAX / WAYS` sets of `WAYS` entries, most recently used first (empty until first used).
    entries: Vec<Option<Cached>>,
    seed: u64,
    /// Key Strings given back ([`KeyCache::recycle`]): a hit is copied into one of these rather
    /// than into a new allocation.
    spare: Vec<String>,
}

#[derive(Debug)]
struct Cached {
    rule: usize,
    values: Vec<Vec<u8>>,
    key: String,
}

impl Default for KeyCache {
    fn default() -> KeyCache {
        KeyCache {
            entries: Vec::new(),
            seed: hash::random_seed(),
            spare: Vec::new(),
        }
    }
}

impl KeyCache {
    pub const MAX: usize = 1024;
    /// Entries per set.
    pub const WAYS: usize = 4;
    /// Values longer than this together are digested each time, never cached.
    pub const MAX_VALUES_LEN: usize = 256;
    /// Most key Strings kept for reuse.
    const MAX_SPARE: usize = 8;

    /// Takes back a key this cache gave out, once its request is done with it, to reuse its
    /// allocation for a later hit.
    pub fn recycle(&mut self, key: String) {
        if self.spare.len() < Self::MAX_SPARE {
            self.spare.push(key);
        }
    }

    /// [`bucket_key`] of rule `idx` (`prefix`, `rule` its name, `sources` its key), from the cache
    /// when the same values were seen lately.
    pub fn bucket_key<V: AsRef<[u8]>>(
        &mut self,
        idx: usize,
        (prefix, rule, sources): (&str, &str, &[KeySource]),
        values: &[V],
    ) -> String {
        if values.iter().map(|v| v.as_ref().len()).sum::<usize>() > Self::MAX_VALUES_LEN {
            return bucket_key(prefix, rule, sources, values);
        }
        if self.entries.is_empty() {
            self.entries.resize_with(Self::MAX, || None);
        }
        let set = self.set_of(idx, values);
        let Some(set) = self.entries.get_mut(set..set + Self::WAYS) else {
            return bucket_key(prefix, rule, sources, values);
        };
        let hit = set.iter().position(|e| {
            e.as_ref().is_some_and(|e| {
                e.rule == idx
                    && e.values
                        .iter()
                        .map(Vec::as_slice)
                        .eq(values.iter().map(AsRef::as_ref))
            })
        });
        // Hit or miss, the entry ends up first: a miss takes the least recently used one's place.
        let used = hit.unwrap_or(Self::WAYS - 1);
        if let Some(recent) = set.get_mut(..=used) {
            recent.rotate_right(1);
        }
        let Some(first) = set.first_mut() else {
            return bucket_key(prefix, rule, sources, values);
        };
        match first {
            Some(e) if hit.is_some() => {
                let mut key = self.spare.pop().unwrap_or_default();
                key.clear();
                key.push_str(&e.key);
                key
            }
            _ => Self::fill(first, idx, (prefix, rule, sources), values),
        }
    }

    /// A miss: `slot` caches rule `idx`'s key for `values` from now on, in place of what it held.
    /// Out of line, as [`bucket_key`].
    #[inline(never)]
    fn fill<V: AsRef<[u8]>>(
        slot: &mut Option<Cached>,
        idx: usize,
        (prefix, rule, sources): (&str, &str, &[KeySource]),
        values: &[V],
    ) -> String {
        let key = bucket_key(prefix, rule, sources, values);
        match slot {
            // The entry it replaces lends its buffers: a flood of new keys misses every time.
            Some(e) => {
                e.rule = idx;
                e.values.resize_with(values.len(), Vec::new);
                for (kept, v) in e.values.iter_mut().zip(values) {
                    kept.clear();
                    kept.extend_from_slice(v.as_ref());
                }
                e.key.clear();
                e.key.push_str(&key);
            }
            None => {
                *slot = Some(Cached {
                    rule: idx,
                    values: values.iter().map(|v| v.as_ref().to_vec()).collect(),
                    key: key.clone(),
                })
            }
        }
        key
    }

    /// The first entry of the set for rule `idx`'s `values`.
    fn set_of<V: AsRef<[u8]>>(&self, idx: usize, values: &[V]) -> usize {
        use std::hash::Hasher;
        let mut h = hash::FastHasher::new(self.seed);
        h.write_usize(idx);
        for v in values {
            let v = v.as_ref();
            h.write_usize(v.len());
            h.write(v);
        }
        let sets = Self::MAX / Self::WAYS;
        (h.finish() % sets as u64) as usize * Self::WAYS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(name: &str) -> KeySource {
        KeySource::Header(name.into())
    }

    #[test]
    fn the_key_cache_gives_exactly_the_bucket_key() {
        let mut cache = KeyCache::default();
        let sources = [hdr("x-user-id"), KeySource::Query("k".into())];
        let other = [hdr("x-tenant")];
        let v = |a: &str, b: &str| vec![a.as_bytes().to_vec(), b.as_bytes().to_vec()];
        for (idx, rule, sources, values) in [
            (0, "r", &sources[..], v("alice", "1")),
            (0, "r", &sources[..], v("alice", "1")),
            (1, "r2", &sources[..], v("alice", "1")),
            (0, "r", &sources[..], v("alic", "e1")),
            (2, "t", &other[..], vec![b"alice1".to_vec()]),
            (0, "r", &sources[..], v("alice", "1")),
        ] {
            assert_eq!(
                cache.bucket_key(idx, ("tg", rule, sources), &values),
                bucket_key("tg", rule, sources, &values)
            );
        }
    }

    /// Values crafted into one set only evict each other; the set keeps its most recently used.
    #[test]
    fn a_key_cache_set_keeps_its_recently_used_entries() {
        let mut cache = KeyCache::default();
        let sources = [hdr("x-user-id")];
        let value = |i: usize| vec![i.to_string().into_bytes()];
        let hot = value(0);
        let set = cache.set_of(0, &hot);
        let same_set: Vec<_> = (1..)
            .map(value)
            .filter(|v| cache.set_of(0, v) == set)
            .take(3 * KeyCache::WAYS)
            .collect();
        let cached = |c: &KeyCache, v: &[Vec<u8>]| {
            c.entries[set..set + KeyCache::WAYS]
                .iter()
                .flatten()
                .any(|e| e.values == v)
        };
        for v in &same_set {
            for values in [&hot, v] {
                assert_eq!(
                    cache.bucket_key(0, ("tg", "r", &sources), values),
                    bucket_key("tg", "r", &sources, values)
                );
            }
            assert!(cached(&cache, &hot) && cached(&cache, v));
        }
        assert!(
            !cached(&cache, &same_set[0]),
            "the least recently used went"
        );
        assert_eq!(cache.entries.iter().flatten().count(), KeyCache::WAYS);
    }

    #[test]
    fn a_recycled_key_string_carries_the_next_hit() {
        let mut cache = KeyCache::default();
        let sources = [hdr("x-user-id")];
        let (a, b) = ([b"alice".to_vec()], [b"bob".to_vec()]);
        let key_a = cache.bucket_key(0, ("tg", "r", &sources), &a);
        cache.bucket_key(0, ("tg", "r", &sources), &b);
        cache.recycle(key_a);
        let key_b = cache.bucket_key(0, ("tg", "r", &sources), &b);
        assert_eq!(key_b, bucket_key("tg", "r", &sources, &b));
        assert!(cache.spare.is_empty(), "the hit took the recycled String");
        for _ in 0..2 * KeyCache::MAX_SPARE {
            cache.recycle(String::new());
        }
        assert_eq!(cache.spare.len(), KeyCache::MAX_SPARE);
    }

    #[test]
    fn the_key_cache_is_bounded() {
        let mut cache = KeyCache::default();
        let sources = [hdr("x-user-id")];
        for i in 0..KeyCache::MAX * 3 + 1 {
            let values = [i.to_string().into_bytes()];
            let long = [vec![b'x'; KeyCache::MAX_VALUES_LEN + 1 + i % 7]];
            assert_eq!(
                cache.bucket_key(0, ("tg", "r", &sources), &long),
                bucket_key("tg", "r", &sources, &long)
            );
            assert_eq!(
                cache.bucket_key(0, ("tg", "r", &sources), &values),
                bucket_key("tg", "r", &sources, &values)
            );
            assert_eq!(cache.entries.len(), KeyCache::MAX);
            assert!(cache.entries.iter().flatten().all(|e| e
                .values
                .iter()
                .map(Vec::len)
                .sum::<usize>()
                <= KeyCache::MAX_VALUES_LEN));
        }
    }
}
