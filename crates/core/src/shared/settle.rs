//! Pending settlements of this proxy, per bucket key, until a script call carries them to Redis:
//! charges (what responses said they used beyond their up-front cost) and refunds (tokens to give
//! back: usage below the up-front cost, a `charge_on` answer outside its statuses, a request that
//! never went upstream), kept apart.
//!
//! Invariant: a settlement is added once and taken once (under compare-and-swap), so each
//! difference reaches the global bucket at most once; what a failed call carried is added back
//! (its refund only if the call certainly never ran), and what a call may not carry (more than
//! its limits let the script take) stays pending. A charge is never netted against a refund: the
//! script bounds a refund by its spill epoch, which a charge carrying it would hide. A key's
//! pending refund has one epoch, the exact epoch of every take it gives back for, and the
//! smallest mark of them (the earliest take: the bound it gives holds for them all): refunds of
//! two epochs never merge (the older is dropped, reported to the caller: a bucket that answered
//! the newer take with a newer epoch has started a stretch since the older one, so the older
//! gives back nothing). Memory is bounded: `SETS` values of at most `WAYS` keys; a key with no room is
//! reported, and the caller settles it at once instead.

use super::{hash, read_u64, update, write_u64s, Change, Store, StoreError};

pub const SETS: u64 = 2048;
pub const WAYS: usize = 4;

/// Tokens to give back to a bucket, and the spill epoch and mark its takes were answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Refund {
    pub tokens: u64,
    pub epoch: u64,
    pub mark: u64,
}

/// One key's pending settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Entry {
    charge: u64,
    refund: Refund,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.charge == 0 && self.refund.tokens == 0
    }
}

/// What a call takes of a key's pending settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Taken {
    /// Tokens to charge.
    pub charge: u64,
    /// Tokens to give back, with their epoch (`tokens` 0: none).
    pub refund: Refund,
    /// Whether some is left pending (more than the call may carry).
    pub left: bool,
}

impl Taken {
    /// Whether nothing was taken.
    pub fn is_empty(&self) -> bool {
        self.charge == 0 && self.refund.tokens == 0
    }
}

fn set_key(ns: &str, key: &str) -> String {
    super::slot_key(ns, "settle", hash(key) % SETS)
}

/// The words of one entry before its key: key length, charge, refund, epoch, mark.
const WORDS: usize = 5;

fn decode(bytes: Option<&[u8]>) -> Vec<(String, Entry)> {
    let mut out = Vec::new();
    let Some(b) = bytes else {
        return out;
    };
    let mut at = 0;
    while out.len() < WAYS {
        let word = |i: usize| read_u64(b, at + 8 * i);
        let (Some(len), Some(charge), Some(tokens), Some(epoch), Some(mark)) =
            (word(0), word(1), word(2), word(3), word(4))
        else {
            break;
        };
        let start = at + 8 * WORDS;
        let Some(key) = usize::try_from(len)
            .ok()
            .and_then(|l| b.get(start..start.checked_add(l)?))
            .and_then(|k| std::str::from_utf8(k).ok())
        else {
            break;
        };
        let refund = Refund {
            tokens,
            epoch,
            mark,
        };
        out.push((key.to_string(), Entry { charge, refund }));
        at = start + key.len();
    }
    out
}

fn encode(entries: &[(String, Entry)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, e) in entries {
        let r = e.refund;
        write_u64s(
            &mut out,
            &[k.len() as u64, e.charge, r.tokens, r.epoch, r.mark],
        );
        out.extend_from_slice(k.as_bytes());
    }
    // Never empty: the host reads an empty value back as no value.
    if out.is_empty() {
        out.push(0);
    }
    out
}

/// Changes `key`'s pending settlement with `change` (which returns what the caller learns).
/// None if the key has no room (its set holds other keys' settlements).
fn add<T: Default>(
    store: &dyn Store,
    ns: &str,
    key: &str,
    change: impl Fn(&mut Entry) -> T,
) -> Result<Option<T>, StoreError> {
    update(store, &set_key(ns, key), |bytes| {
        let mut entries = decode(bytes);
        let told = if let Some((_, e)) = entries.iter_mut().find(|(k, _)| k == key) {
            change(e)
        } else if entries.len() < WAYS {
            let mut e = Entry::default();
            let told = change(&mut e);
            entries.push((key.to_string(), e));
            told
        } else {
            return Change::Keep(None);
        };
        entries.retain(|(_, e)| !e.is_empty());
        Change::Write(encode(&entries), Some(told))
    })
}

/// Adds a charge of `tokens` to `key`'s pending settlement, the charge kept within `limit`.
/// False if the key has no room.
pub fn add_charge(
    store: &dyn Store,
    ns: &str,
    key: &str,
    tokens: u64,
    limit: u64,
) -> Result<bool, StoreError> {
    let added = add(store, ns, key, |e| {
        e.charge = e.charge.saturating_add(tokens).min(limit);
    })?;
    Ok(added.is_some())
}

/// Adds `refund` to `key`'s pending refund, kept within `limit` tokens: summed with one of the
/// same epoch; of two epochs, the newer stays and the older is dropped. Returns the tokens
/// dropped (the older refund, or what passed `limit`), or None if the key has no room.
pub fn add_refund(
    store: &dyn Store,
    ns: &str,
    key: &str,
    refund: Refund,
    limit: u64,
) -> Result<Option<u64>, StoreError> {
    add(store, ns, key, |e| {
        let (kept, dropped) = merged(e.refund, refund);
        let within = kept.tokens.min(limit);
        e.refund = Refund {
            tokens: within,
            ..kept
        };
        dropped.saturating_add(kept.tokens - within)
    })
}

/// Two refunds of one key as one: summed when their epochs agree (with the smaller mark), else
/// the newer epoch's (the other's tokens dropped). Returns it and the tokens dropped.
fn merged(a: Refund, b: Refund) -> (Refund, u64) {
    if a.tokens == 0 {
        return (b, 0);
    }
    if b.tokens == 0 {
        return (a, 0);
    }
    if a.epoch == b.epoch {
        let tokens = a.tokens.saturating_add(b.tokens);
        let mark = a.mark.min(b.mark);
        return (Refund { tokens, mark, ..a }, 0);
    }
    let (newer, older) = if a.epoch > b.epoch { (a, b) } else { (b, a) };
    (newer, older.tokens)
}

/// Takes `key`'s pending settlement for a call that may carry at most `limit` tokens of each
/// part (the charge, the refund); what it may not carry stays pending (a refund with its epoch).
pub fn take_within(
    store: &dyn Store,
    ns: &str,
    key: &str,
    limit: u64,
) -> Result<Taken, StoreError> {
    update(store, &set_key(ns, key), |bytes| {
        let mut entries = decode(bytes);
        let Some(pos) = entries.iter().position(|(k, _)| k == key) else {
            return Change::Keep(Taken::default());
        };
        let (_, e) = entries.remove(pos);
        let charge = e.charge.min(limit);
        let tokens = e.refund.tokens.min(limit);
        let rest = Entry {
            charge: e.charge - charge,
            refund: Refund {
                tokens: e.refund.tokens - tokens,
                ..e.refund
            },
        };
        if !rest.is_empty() {
            entries.insert(pos, (key.to_string(), rest));
        }
        let taken = Taken {
            charge,
            refund: Refund { tokens, ..e.refund },
            left: !rest.is_empty(),
        };
        Change::Write(encode(&entries), taken)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::mem::MemStore;

    fn refund(tokens: u64, epoch: u64) -> Refund {
        Refund {
            tokens,
            epoch,
            mark: 7,
        }
    }

    fn take(s: &MemStore, limit: u64) -> Taken {
        take_within(s, "ns", "k", limit).unwrap()
    }

    #[test]
    fn added_once_taken_once_and_bounded() {
        let s = MemStore::default();
        assert!(take(&s, 400).is_empty());
        assert_eq!(add_charge(&s, "ns", "k", 39, 400), Ok(true));
        assert_eq!(add_charge(&s, "ns", "k", 39, 400), Ok(true));
        assert_eq!(add_charge(&s, "ns", "k", 1000, 400), Ok(true));
        assert_eq!(take(&s, 1000).charge, 400, "clamped to the limit");
        assert!(take(&s, 1000).is_empty(), "taken once");
    }

    #[test]
    fn a_charge_never_nets_a_refund() {
        let s = MemStore::default();
        assert_eq!(add_refund(&s, "ns", "k", refund(5, 77), 400), Ok(Some(0)));
        assert_eq!(add_charge(&s, "ns", "k", 5, 400), Ok(true));
        let t = take(&s, 400);
        assert_eq!((t.charge, t.refund, t.left), (5, refund(5, 77), false));
        assert!(take(&s, 400).is_empty());
    }

    #[test]
    fn a_call_takes_what_it_may_carry_and_leaves_the_rest() {
        let s = MemStore::default();
        assert_eq!(add_charge(&s, "ns", "k", 30, 800), Ok(true));
        assert_eq!(add_refund(&s, "ns", "k", refund(25, 9), 800), Ok(Some(0)));
        let t = take(&s, 12);
        assert_eq!((t.charge, t.refund, t.left), (12, refund(12, 9), true));
        let t = take(&s, 12);
        assert_eq!((t.charge, t.refund, t.left), (12, refund(12, 9), true));
        let t = take(&s, 12);
        assert_eq!((t.charge, t.refund, t.left), (6, refund(1, 9), false));
        assert!(take(&s, 12).is_empty(), "all of it carried, once");
    }

    #[test]
    fn refunds_of_one_epoch_add_up_and_an_older_epochs_are_dropped() {
        let s = MemStore::default();
        assert_eq!(add_refund(&s, "ns", "k", refund(2, 500), 400), Ok(Some(0)));
        assert_eq!(add_refund(&s, "ns", "k", refund(3, 500), 400), Ok(Some(0)));
        // An older epoch: the bucket has spilled since its take.
        assert_eq!(add_refund(&s, "ns", "k", refund(4, 300), 400), Ok(Some(4)));
        // A newer one: the five pending are dropped for it.
        assert_eq!(add_refund(&s, "ns", "k", refund(1, 700), 400), Ok(Some(5)));
        assert_eq!(take(&s, 400).refund, refund(1, 700));
        // Refunds of one epoch keep the smaller mark: the earlier take's bound holds for both.
        let early = Refund {
            mark: 3,
            ..refund(2, 800)
        };
        assert_eq!(add_refund(&s, "ns", "k", refund(1, 800), 400), Ok(Some(0)));
        assert_eq!(add_refund(&s, "ns", "k", early, 400), Ok(Some(0)));
        assert_eq!(
            take(&s, 400).refund,
            Refund {
                mark: 3,
                ..refund(3, 800)
            }
        );
        assert_eq!(
            add_refund(&s, "ns", "k", refund(9, 1), 4),
            Ok(Some(5)),
            "the limit"
        );
        assert_eq!(take(&s, 400).refund, refund(4, 1));
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
            assert_eq!(add_charge(&s, "ns", k, 1, 10), Ok(true));
        }
        assert_eq!(add_charge(&s, "ns", &keys[WAYS], 1, 10), Ok(false));
        assert_eq!(
            add_refund(&s, "ns", &keys[WAYS], refund(1, 1), 10),
            Ok(None)
        );
        assert_eq!(take_within(&s, "ns", &keys[0], 10).unwrap().charge, 1);
        assert_eq!(add_charge(&s, "ns", &keys[WAYS], 1, 10), Ok(true));
    }
}
