//! A fast seeded hash for the per-worker tables the local path touches on every request (the
//! bucket-key cache, the token stashes). SipHash, the standard library's, costs more in wasm than
//! the rest of a stash lookup; this is a multiply-rotate hash (FxHash's round) over 8-byte words,
//! with a seed drawn once per table from the standard library's random keys (WASI `random_get`).
//!
//! It is not a keyed PRF: request text could be crafted to collide whatever the seed. So it only
//! serves tables where a collision costs nothing more than a miss: the key cache is a set-
//! associative array (a lookup compares at most [`crate::rule::KeyCache::WAYS`] entries), and the
//! stashes are keyed by bucket keys, whose variable part is a SHA-256 digest no client chooses bits
//! of, hashed under a seed no client knows; the stashes hold at most 1024 keys besides.

use std::hash::{BuildHasher, Hasher};

/// The multiplier of rustc-hash 2 (odd, with well-spread bits).
const K: u64 = 0xf135_7aea_2e62_a9c5;

/// A random seed: one SipHash output under the standard library's per-thread random keys.
pub fn random_seed() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(0x7011_6a7e_u64)
}

/// Builds [`FastHasher`]s from one seed (random per table, see [`random_seed`]).
#[derive(Debug, Clone, Copy)]
pub struct Seeded(u64);

impl Default for Seeded {
    fn default() -> Seeded {
        Seeded(random_seed())
    }
}

impl BuildHasher for Seeded {
    type Hasher = FastHasher;

    fn build_hasher(&self) -> FastHasher {
        FastHasher::new(self.0)
    }
}

#[derive(Debug, Clone)]
pub struct FastHasher(u64);

impl FastHasher {
    pub fn new(seed: u64) -> FastHasher {
        FastHasher(seed)
    }

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    /// Mixes the high bits down: hashbrown takes the bucket from the low bits, which a product
    /// leaves poorly mixed.
    fn finish(&self) -> u64 {
        let h = (self.0 ^ (self.0 >> 32)).wrapping_mul(K);
        h ^ (h >> 29)
    }

    /// Whole 8-byte words, then the tail zero-padded. (Callers hash lengths or a terminator too,
    /// as `str` and slices do, so padding cannot make two inputs equal.)
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(
                <[u8; 8]>::try_from(w).unwrap_or_default(),
            ));
        }
        let tail = words.remainder();
        if !tail.is_empty() {
            let mut last = [0u8; 8];
            for (d, s) in last.iter_mut().zip(tail) {
                *d = *s;
            }
            self.add(u64::from_le_bytes(last));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn hash(seed: u64, bytes: &[u8]) -> u64 {
        let mut h = FastHasher::new(seed);
        h.write_usize(bytes.len());
        h.write(bytes);
        h.finish()
    }

    #[test]
    fn the_seed_and_every_byte_count() {
        assert_ne!(hash(1, b"alice"), hash(2, b"alice"));
        assert_ne!(hash(1, b"alice"), hash(1, b"alicf"));
        assert_ne!(hash(1, b"a\0"), hash(1, b"a"));
        let long = b"tollgate:{per-user:1ff5268a9b87e2b51262db40cbb6e203}";
        for i in 0..long.len() {
            let mut other = *long;
            other[i] ^= 1;
            assert_ne!(hash(7, long), hash(7, &other), "byte {i}");
        }
        assert_ne!(random_seed(), random_seed());
    }

    /// Bucket keys (hex digests) spread over the low bits, which pick a hashbrown bucket.
    #[test]
    fn digests_spread_over_the_low_bits() {
        let seed = random_seed();
        let buckets: HashSet<u64> = (0..4096u32)
            .map(|i| {
                let key = crate::rule::bucket_key(
                    "tg",
                    "r",
                    &[crate::config::KeySource::Method],
                    &[i.to_be_bytes().to_vec()],
                );
                Seeded(seed).hash_one(key) & 1023
            })
            .collect();
        assert!(buckets.len() > 950, "{} of 1024 buckets", buckets.len());
    }
}
