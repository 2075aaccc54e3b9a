//! Pending usage settlements of this proxy: the difference between what responses said they used
//! and what their requests were charged up front, per bucket key, until a script call carries it
//! to Redis.
//!
//! Invariant: a settlement is added once and taken once (under compare-and-swap), so each
//! difference reaches the global bucket at most once; what a failed call carried is added back,
//! and what a call may not carry (more than its limits let the script take) stays pending.
//! Memory is bounded: `SETS` values of at most `WAYS` keys; a key with no room is reported, and
//! the caller settles it at once instead.

use super::{hash, read_u64, update, write_u64s, Change, Store, StoreError};

pub const SETS: u64 = 2048;
pub const WAYS: usize = 4;

fn set_key(ns: &str, key: &str) -> String {
    super::slot_key(ns, "settle", hash(key) % SETS)
}

fn decode(bytes: Option<&[u8]>) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    let Some(b) = bytes else {
        return out;
    };
    let mut at = 0;
    while out.len() < WAYS {
        let (Some(len), Some(delta)) = (read_u64(b, at), read_u64(b, at + 8)) else {
            break;
        };
        let start = at + 16;
        let Some(key) = usize::try_from(len)
            .ok()
            .and_then(|l| b.get(start..start.checked_add(l)?))
            .and_then(|k| std::str::from_utf8(k).ok())
        else {
            break;
        };
        out.push((key.to_string(), i64::from_le_bytes(delta.to_le_bytes())));
        at = start + key.len();
    }
    out
}

fn encode(entries: &[(String, i64)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, d) in entries {
        write_u64s(
            &mut out,
            &[k.len() as u64, u64::from_le_bytes(d.to_le_bytes())],
        );
        out.extend_from_slice(k.as_bytes());
    }
    // Never empty: the host reads an empty value back as no value.
    if out.is_empty() {
        out.push(0);
    }
    out
}

/// Adds `delta` to `key`'s pending settlement, keeping the sum within `±limit`. False if the key
/// has no room (its set holds other keys' settlements).
pub fn add(
    store: &dyn Store,
    ns: &str,
    key: &str,
    delta: i64,
    limit: i64,
) -> Result<bool, StoreError> {
    update(store, &set_key(ns, key), |bytes| {
        let mut entries = decode(bytes);
        if let Some((_, d)) = entries.iter_mut().find(|(k, _)| k == key) {
            *d = d.saturating_add(delta).clamp(-limit, limit);
        } else if entries.len() < WAYS {
            entries.push((key.to_string(), delta.clamp(-limit, limit)));
        } else {
            return Change::Keep(false);
        }
        entries.retain(|(_, d)| *d != 0);
        Change::Write(encode(&entries), true)
    })
}

/// Takes `key`'s whole pending settlement (0 if none): the caller now carries it to Redis.
pub fn take(store: &dyn Store, ns: &str, key: &str) -> Result<i64, StoreError> {
    take_within(store, ns, key, i64::MAX).map(|(delta, _)| delta)
}

/// Takes at most `±limit` of `key`'s pending settlement (0 if none), what one script call may
/// carry; the rest stays pending. Returns what was taken and whether some is left.
pub fn take_within(
    store: &dyn Store,
    ns: &str,
    key: &str,
    limit: i64,
) -> Result<(i64, bool), StoreError> {
    let limit = limit.max(0);
    update(store, &set_key(ns, key), |bytes| {
        let mut entries = decode(bytes);
        let Some(pos) = entries.iter().position(|(k, _)| k == key) else {
            return Change::Keep((0, false));
        };
        let (_, delta) = entries.remove(pos);
        let taken = delta.clamp(-limit, limit);
        let rest = delta.saturating_sub(taken);
        if rest != 0 {
            entries.insert(pos, (key.to_string(), rest));
        }
        Change::Write(encode(&entries), (taken, rest != 0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::mem::MemStore;

    #[test]
    fn added_once_taken_once_and_bounded() {
        let s = MemStore::default();
        assert_eq!(take(&s, "ns", "k"), Ok(0));
        assert_eq!(add(&s, "ns", "k", 39, 400), Ok(true));
        assert_eq!(add(&s, "ns", "k", 39, 400), Ok(true));
        assert_eq!(add(&s, "ns", "k", 1000, 400), Ok(true));
        assert_eq!(take(&s, "ns", "k"), Ok(400), "clamped to the limit");
        assert_eq!(take(&s, "ns", "k"), Ok(0), "taken once");
        assert_eq!(add(&s, "ns", "k", -5, 400), Ok(true));
        assert_eq!(add(&s, "ns", "k", 5, 400), Ok(true));
        assert_eq!(take(&s, "ns", "k"), Ok(0), "they cancel out");
    }

    #[test]
    fn a_call_takes_what_it_may_carry_and_leaves_the_rest() {
        let s = MemStore::default();
        assert_eq!(take_within(&s, "ns", "k", 12), Ok((0, false)));
        assert_eq!(add(&s, "ns", "k", 30, 800), Ok(true));
        assert_eq!(take_within(&s, "ns", "k", 12), Ok((12, true)));
        assert_eq!(take_within(&s, "ns", "k", 12), Ok((12, true)));
        assert_eq!(take_within(&s, "ns", "k", 12), Ok((6, false)));
        assert_eq!(take(&s, "ns", "k"), Ok(0), "all of it carried, once");
        assert_eq!(add(&s, "ns", "k", -30, 800), Ok(true));
        assert_eq!(take_within(&s, "ns", "k", 20), Ok((-20, true)));
        assert_eq!(take(&s, "ns", "k"), Ok(-10));
    }

    #[test]
    fn a_full_set_says_so() {
        let s = MemStore::default();
        let target = set_key("ns", "k0");
        let keys: Vec<String> = (0..)
            .map(|i| format!("k{i}"))
            .filter(|k| set_key("ns", k) == target)
            .take(WAYS + 1)
            .collect();
        for k in keys.iter().take(WAYS) {
            assert_eq!(add(&s, "ns", k, 1, 10), Ok(true));
        }
        assert_eq!(add(&s, "ns", &keys[WAYS], 1, 10), Ok(false));
        assert_eq!(take(&s, "ns", &keys[0]), Ok(1));
        assert_eq!(add(&s, "ns", &keys[WAYS], 1, 10), Ok(true));
    }
}
