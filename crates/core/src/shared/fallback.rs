//! Per-proxy fallback buckets, used only while the backend fails and `failure_mode` is `local`.
//!
//! Invariant: same math as the global bucket (`bucket::take`), one bucket per slot of each rule's
//! own table; keys of one rule that share a slot share a bucket, which can only under-admit. Keys
//! of a rule may have different limits (an override, a tier): a slot remembers the key that wrote
//! it last and the largest burst and fastest refill its bucket has had since it was last empty, and
//! another key shares it only if its own limits are at least those (so the bucket never held more,
//! nor refilled faster, than that key's own would have); any other key starts it over, empty.

use super::{hash, read_u64, update, write_u64s, Change, Store, StoreError};
use crate::bucket::{self, Limits, State};

/// Slots per rule.
pub const SLOTS: u64 = 8192;

/// A slot's bucket, the key that wrote it last (its hash), and the largest burst and fastest
/// refill it has had since it was last empty.
struct Slot {
    state: State,
    owner: u64,
    most: Limits,
}

/// Takes `cost` from the fallback bucket of `bucket_key` in the table `table` (which names the
/// plugin and the rule).
pub fn take(
    store: &dyn Store,
    table: &str,
    bucket_key: &str,
    limits: &Limits,
    cost: u64,
    now_ms: u64,
) -> Result<bucket::Reply, StoreError> {
    let owner = hash(bucket_key);
    let key = super::slot_key(table, "fb", owner % SLOTS);
    let now_us = now_ms.saturating_mul(1000);
    update(store, &key, |bytes| {
        let (state, most) = shared(bytes, owner, limits, now_us);
        let (next, reply) = bucket::take(state, limits, cost, 0, 0, 0, now_us);
        Change::Write(encode(next, owner, &most, limits, now_us), reply)
    })
}

/// The bucket `owner` takes from in a slot holding `bytes` (None: a full one), and the largest
/// limits it will have had once `limits` refilled it.
fn shared(
    bytes: Option<&[u8]>,
    owner: u64,
    limits: &Limits,
    now_us: u64,
) -> (Option<State>, Limits) {
    // Never written (or a full bucket written before slots remembered their keys): a bucket no
    // key has taken from, full for any.
    if bytes.is_none_or(|b| b.len() <= 1) {
        return (None, *limits);
    }
    match bytes.and_then(decode) {
        Some(s) if s.owner == owner || covers(limits, &s.most) => {
            (Some(s.state), largest(&s.most, limits))
        }
        // Another key's bucket that held more, or refilled faster, than this key's own would
        // have (or one of unknown history): this key starts it over, empty.
        _ => {
            let empty = limits.units_per_token().map(|per_token| State {
                units: 0,
                ts_us: now_us,
                per_token,
                spill: None,
            });
            (empty, *limits)
        }
    }
}

/// Whether `own` limits are at least `most`: a burst as large, a refill as fast.
fn covers(own: &Limits, most: &Limits) -> bool {
    own.burst >= most.burst && !faster(most, own)
}

/// Whether `a` refills faster than `b`.
fn faster(a: &Limits, b: &Limits) -> bool {
    u128::from(a.rate) * u128::from(b.period_ms) > u128::from(b.rate) * u128::from(a.period_ms)
}

/// The largest burst and the fastest refill of `a` and `b`.
fn largest(a: &Limits, b: &Limits) -> Limits {
    let (rate, period_ms) = if faster(a, b) {
        (a.rate, a.period_ms)
    } else {
        (b.rate, b.period_ms)
    };
    Limits {
        burst: a.burst.max(b.burst),
        rate,
        period_ms,
    }
}

/// A slot's value: the bucket (a full one written as such: shared data cannot be deleted), its
/// key and its largest limits.
fn encode(
    state: Option<State>,
    owner: u64,
    most: &Limits,
    limits: &Limits,
    now_us: u64,
) -> Vec<u8> {
    let full = || {
        let per_token = limits.units_per_token()?;
        let units = i64::try_from(limits.burst.checked_mul(per_token)?).ok()?;
        Some(State {
            units,
            ts_us: now_us,
            per_token,
            spill: None,
        })
    };
    let Some(s) = state.or_else(full) else {
        return vec![0];
    };
    let mut out = Vec::with_capacity(7 * 8);
    write_u64s(
        &mut out,
        &[
            u64::from_le_bytes(s.units.to_le_bytes()),
            s.ts_us,
            s.per_token,
            owner,
            most.burst,
            most.rate,
            most.period_ms,
        ],
    );
    out
}

/// A slot written with its key and largest limits (None: garbage, or a bucket written before slots
/// remembered them).
fn decode(bytes: &[u8]) -> Option<Slot> {
    let f = |i: usize| read_u64(bytes, i * 8);
    Some(Slot {
        state: State {
            units: i64::from_le_bytes(f(0)?.to_le_bytes()),
            ts_us: f(1)?,
            per_token: f(2)?,
            // A proxy's own fallback bucket is never refunded.
            spill: None,
        },
        owner: f(3)?,
        most: Limits {
            burst: f(4)?,
            rate: f(5)?,
            period_ms: f(6)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::mem::MemStore;

    const LIMITS: Limits = Limits {
        burst: 3,
        rate: 1,
        period_ms: 1000,
    };

    #[test]
    fn limits_and_refills() {
        let s = MemStore::default();
        let admitted: Vec<bool> = (0..5)
            .map(|_| take(&s, "t", "k", &LIMITS, 1, 1000).unwrap().allowed)
            .collect();
        assert_eq!(admitted, [true, true, true, false, false]);
        assert!(take(&s, "t", "k", &LIMITS, 1, 2000).unwrap().allowed);
        assert!(take(&s, "t", "other", &LIMITS, 1, 2000).unwrap().allowed);
    }

    /// Two keys of `rule` sharing one slot: `vip`'s and the first other found.
    fn sharing_a_slot() -> (&'static str, String) {
        let slot = |k: &str| hash(k) % SLOTS;
        let other = (0..)
            .map(|i| format!("user{i}"))
            .find(|k| slot(k) == slot("vip"))
            .unwrap();
        ("vip", other)
    }

    /// Keys that share a slot share its bucket, which may only under-admit: a key with smaller
    /// limits (an override's, a tier's) than the other key of its slot is never refilled at the
    /// other's rate, nor handed its burst.
    #[test]
    fn a_key_sharing_a_slot_with_a_faster_one_gets_no_more_than_its_own_limits() {
        let s = MemStore::default();
        let (vip, other) = sharing_a_slot();
        let fast = Limits {
            burst: 100,
            rate: 100,
            period_ms: 1000,
        };
        let mut admitted = 0;
        for step in 0..10 {
            let now = 1000 + step * 100;
            // The fast key, far under its limits: a request every 100 ms.
            take(&s, "t", vip, &fast, 1, now).unwrap();
            admitted += (0..5)
                .filter(|_| take(&s, "t", &other, &LIMITS, 1, now).unwrap().allowed)
                .count() as u64;
        }
        // In 900 ms a bucket of its own admits its burst and 0.9 s of its refill (rounded up).
        let bound = LIMITS.burst + (900 * LIMITS.rate).div_ceil(LIMITS.period_ms);
        assert!(
            admitted <= bound,
            "{admitted} admitted in 900 ms; a bucket with its own limits admits {bound}"
        );
    }

    /// Keys of the same limits still share one bucket, and a key with larger limits takes from
    /// the bucket of a smaller one: both only under-admit.
    #[test]
    fn keys_whose_limits_cover_the_bucket_s_share_it() {
        let s = MemStore::default();
        let (vip, other) = sharing_a_slot();
        let taken = |key: &str, limits: &Limits, now| {
            (0..10)
                .filter(|_| take(&s, "t", key, limits, 1, now).unwrap().allowed)
                .count()
        };
        assert_eq!(taken(vip, &LIMITS, 1000), 3);
        assert_eq!(taken(&other, &LIMITS, 1000), 0, "one bucket");
        let larger = Limits {
            burst: 10,
            ..LIMITS
        };
        assert_eq!(taken(vip, &larger, 2000), 1, "the refill of 1 s, at 1/s");
        assert_eq!(
            taken(&other, &LIMITS, 2000),
            0,
            "nothing refilled at its own limits"
        );
    }

    #[test]
    fn survives_injected_conflicts_and_gives_up_boundedly() {
        let s = MemStore::default();
        take(&s, "t", "k", &LIMITS, 1, 0).unwrap();
        s.inject_conflicts.set(3);
        assert!(take(&s, "t", "k", &LIMITS, 1, 0).unwrap().allowed);
        s.inject_conflicts.set(1000);
        assert_eq!(
            take(&s, "t", "k", &LIMITS, 1, 0),
            Err(StoreError::CasMismatch)
        );
    }
}
