//! Per-proxy fallback buckets, used only while the backend fails and `failure_mode` is `local`.
//!
//! Invariant: same math as the global bucket (`bucket::take`), one bucket per slot of each rule's
//! own table; keys of one rule that share a slot share a bucket, which can only under-admit.

use super::{hash, read_u64, update, write_u64s, Change, Store, StoreError};
use crate::bucket::{self, Limits, State};

/// Slots per rule.
pub const SLOTS: u64 = 8192;

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
    let key = super::slot_key(table, "fb", hash(bucket_key) % SLOTS);
    let now_us = now_ms.saturating_mul(1000);
    update(store, &key, |bytes| {
        let state = bytes.and_then(decode_state);
        let (next, reply) = bucket::take(state, limits, cost, 0, 0, 0, now_us);
        Change::Write(encode_state(next), reply)
    })
}

/// One byte means a full bucket (shared data cannot be deleted, and the host reads an empty value
/// back as no value at all).
fn encode_state(state: Option<State>) -> Vec<u8> {
    let Some(s) = state else {
        return vec![0];
    };
    let mut out = Vec::with_capacity(24);
    write_u64s(
        &mut out,
        &[
            u64::from_le_bytes(s.units.to_le_bytes()),
            s.ts_us,
            s.per_token,
        ],
    );
    out
}

fn decode_state(bytes: &[u8]) -> Option<State> {
    Some(State {
        units: i64::from_le_bytes(read_u64(bytes, 0)?.to_le_bytes()),
        ts_us: read_u64(bytes, 8)?,
        per_token: read_u64(bytes, 16)?,
        // A proxy's own fallback bucket is never refunded.
        spill: None,
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
