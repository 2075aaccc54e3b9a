//! Local pre-admission: what a proxy may answer on its own, kept in proxy-wasm shared data so all
//! of the proxy's workers see it.
//!
//! Invariant: the local stage never admits a token the global bucket did not grant. In exact mode it
//! only *denies*, and only while Redis itself said the bucket cannot serve that cost (the "denied
//! until" of the last reply). In lease mode it admits only by spending leased tokens: the script
//! took them from the global bucket before they were deposited here, each is spent once (under
//! compare-and-swap), so the fleet's admissions never exceed what the global bucket granted. The
//! fallback bucket admits only while the backend is failing and the rule's `failure_mode` is
//! `local`.
//!
//! Memory is bounded: entries live in fixed tables of `SLOTS` slots, because shared data can never
//! be deleted. A deny-cache slot remembers the one bucket key it is for (a clash only costs a Redis
//! call). A lease slot does too: a clash drops the other key's unspent tokens (fewer admissions,
//! never more). Unspent leased tokens also drop when the lease expires (two horizons after the
//! grant); they are not given back, so under-admission is bounded by one lease per key per proxy per
//! expiry, and leases are sized to about one horizon of the proxy's own demand. Fallback buckets
//! are per slot of each rule's own table: keys of one rule that clash share one bucket, which can
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

/// FNV-1a of `text`: stable across workers and restarts.
fn slot_hash(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The table slot of a bucket key.
pub fn slot(bucket_key: &str) -> u64 {
    slot_hash(bucket_key) % SLOTS
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

/// One proxy's lease on one bucket: tokens already taken from the global bucket, to spend locally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lease {
    /// Unspent leased tokens. Every one was granted by the script, so spending it is exact.
    pub tokens: u64,
    /// After this the unspent tokens are dropped (bounded stranding; see the module doc).
    pub expires_ms: u64,
    /// The global bucket's remaining tokens at the last grant (None-like 0 until known).
    pub global_remaining: u64,
    /// When the global bucket would be full, from the last grant.
    pub reset_at_ms: u64,
    /// Demand (tokens asked for here) in the current and previous horizon window.
    pub win_start_ms: u64,
    pub win_demand: u64,
    pub prev_demand: u64,
    /// A lease call for this key is out (from any worker) until then: others wait for it.
    pub flight_until_ms: u64,
    /// Whether a grant was ever recorded (so `global_remaining` means something).
    pub known: bool,
    /// When the last answer about the global bucket arrived (local clock).
    pub reply_ms: u64,
}

const LEASE_FIELDS: usize = 10;

impl Lease {
    fn encode(&self, key: &str) -> Vec<u8> {
        let fields = [
            self.tokens,
            self.expires_ms,
            self.global_remaining,
            self.reset_at_ms,
            self.win_start_ms,
            self.win_demand,
            self.prev_demand,
            self.flight_until_ms,
            u64::from(self.known),
            self.reply_ms,
        ];
        let mut out = Vec::with_capacity(LEASE_FIELDS * 8 + key.len());
        for f in fields {
            out.extend_from_slice(&f.to_le_bytes());
        }
        out.extend_from_slice(key.as_bytes());
        out
    }

    /// The lease stored for `key`, or None if the slot is empty, garbled or another key's.
    fn decode(bytes: &[u8], key: &str) -> Option<Lease> {
        if bytes.get(LEASE_FIELDS * 8..)? != key.as_bytes() {
            return None;
        }
        let f = |i: usize| read_u64(bytes, i * 8);
        Some(Lease {
            tokens: f(0)?,
            expires_ms: f(1)?,
            global_remaining: f(2)?,
            reset_at_ms: f(3)?,
            win_start_ms: f(4)?,
            win_demand: f(5)?,
            prev_demand: f(6)?,
            flight_until_ms: f(7)?,
            known: f(8)? != 0,
            reply_ms: f(9)?,
        })
    }

    /// Drops the tokens of an expired lease; returns how many.
    fn expire(&mut self, now_ms: u64) -> u64 {
        if now_ms < self.expires_ms {
            return 0;
        }
        std::mem::take(&mut self.tokens)
    }

    /// Rolls the demand window forward to `now_ms`.
    fn roll(&mut self, now_ms: u64, horizon_ms: u64) {
        let age = now_ms.saturating_sub(self.win_start_ms);
        if age >= horizon_ms.saturating_mul(2) {
            self.prev_demand = 0;
            self.win_demand = 0;
            self.win_start_ms = now_ms;
        } else if age >= horizon_ms {
            self.prev_demand = self.win_demand;
            self.win_demand = 0;
            self.win_start_ms = now_ms;
        }
    }
}

/// How big a lease to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSizing {
    pub burst: u64,
    pub rate: u64,
    pub period_ms: u64,
    pub lease_max: u64,
    pub horizon_ms: u64,
}

impl LeaseSizing {
    /// How long a proxy that found the global bucket short waits before asking again: one
    /// horizon, but never so long that half the burst could refill meanwhile (tokens that refill
    /// past a full bucket would be lost to everyone).
    pub fn backoff_ms(&self) -> u64 {
        let half_burst_ms = self
            .burst
            .saturating_mul(self.period_ms)
            .checked_div(self.rate.saturating_mul(2))
            .unwrap_or(0);
        self.horizon_ms.min(half_burst_ms).max(1)
    }
}

/// The per-proxy lease pool of one plugin, shared by the proxy's workers through shared data.
///
/// Invariant: `tokens` only grows by `deposit` of what the script granted, and only shrinks by
/// `take`; a take happens under compare-and-swap, so two workers never spend the same token.
pub struct LeasePool<'a> {
    store: &'a dyn SharedStore,
    ns: &'a str,
}

/// What `LeasePool::take` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Take {
    /// Set when the cost was spent from the lease.
    pub spent: Option<Spent>,
    /// Tokens of an expired lease dropped on the way.
    pub dropped: u64,
}

/// What a successful local take saw, for the response headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spent {
    /// An estimate of the tokens left fleet-wide: this proxy's lease plus the global remaining
    /// at the last grant.
    pub remaining: u64,
    pub reset_ms: u64,
}

impl<'a> LeasePool<'a> {
    pub fn new(store: &'a dyn SharedStore, ns: &'a str) -> Self {
        LeasePool { store, ns }
    }

    fn slot_key(&self, key: &str) -> String {
        format!("{}|lease|{}", self.ns, slot(key))
    }

    /// Reads the lease for `key` (a fresh one if the slot is empty or another key's), changes it
    /// with `f`, and writes it back by compare-and-swap, retrying a bounded number of times.
    fn update<T>(&self, key: &str, mut f: impl FnMut(&mut Lease) -> T) -> Result<T, StoreError> {
        let skey = self.slot_key(key);
        let mut last = StoreError::CasMismatch;
        for _ in 0..CAS_TRIES {
            let (value, cas) = self.store.get(&skey)?;
            let Some(value) = value else {
                // No insert-if-absent: create the slot unconditionally, then CAS from there.
                self.store.set(&skey, &Lease::default().encode(key), 0)?;
                continue;
            };
            let mut lease = Lease::decode(&value, key).unwrap_or_default();
            let out = f(&mut lease);
            match self.store.set(&skey, &lease.encode(key), cas) {
                Ok(()) => return Ok(out),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Spends `cost` leased tokens if this proxy holds them. `count_demand` adds `cost` to the
    /// demand estimate (once per request, not on retries).
    pub fn take(
        &self,
        key: &str,
        cost: u64,
        now_ms: u64,
        horizon_ms: u64,
        count_demand: bool,
    ) -> Result<Take, StoreError> {
        self.update(key, |l| {
            l.roll(now_ms, horizon_ms);
            if count_demand {
                l.win_demand = l.win_demand.saturating_add(cost);
            }
            let dropped = l.expire(now_ms);
            if l.tokens < cost {
                return Take {
                    spent: None,
                    dropped,
                };
            }
            l.tokens -= cost;
            Take {
                spent: Some(Spent {
                    remaining: l.tokens.saturating_add(l.global_remaining),
                    reset_ms: l.reset_at_ms.saturating_sub(now_ms),
                }),
                dropped,
            }
        })
    }

    /// How many tokens to ask for: about one horizon of this proxy's demand plus what is waiting,
    /// at most `lease_max` and `burst`, and at most half of what the global bucket had left at the
    /// last grant, so the last tokens are spread across proxies instead of stranded in one.
    pub fn want(&self, key: &str, waiting: u64, now_ms: u64, sizing: &LeaseSizing) -> u64 {
        let lease = self
            .store
            .get(&self.slot_key(key))
            .ok()
            .and_then(|(v, _)| v)
            .and_then(|v| Lease::decode(&v, key))
            .map(|mut l| {
                l.roll(now_ms, sizing.horizon_ms);
                l
            })
            .unwrap_or_default();
        lease_want(&lease, waiting, now_ms, sizing)
    }

    /// Claims the single lease call for `key` on this proxy until `until_ms`; false if another
    /// worker's call is still out.
    pub fn begin_flight(&self, key: &str, now_ms: u64, until_ms: u64) -> Result<bool, StoreError> {
        self.update(key, |l| {
            if l.flight_until_ms > now_ms {
                return false;
            }
            l.flight_until_ms = until_ms;
            true
        })
    }

    /// Records a grant: `granted` tokens join the pool (tokens of an expired lease are dropped),
    /// the lease lasts two horizons from now, and the flight is over.
    pub fn deposit(
        &self,
        key: &str,
        granted: u64,
        global_remaining: u64,
        reset_after_ms: u64,
        now_ms: u64,
        horizon_ms: u64,
    ) -> Result<u64, StoreError> {
        self.update(key, |l| {
            let dropped = l.expire(now_ms);
            l.tokens = l.tokens.saturating_add(granted);
            l.expires_ms = now_ms.saturating_add(horizon_ms.saturating_mul(2));
            l.global_remaining = global_remaining;
            l.reset_at_ms = now_ms.saturating_add(reset_after_ms);
            l.flight_until_ms = 0;
            l.known = true;
            l.reply_ms = now_ms;
            dropped
        })
    }

    /// Ends a flight that brought no tokens (a denial or an error).
    pub fn end_flight(
        &self,
        key: &str,
        global_remaining: Option<u64>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.update(key, |l| {
            l.flight_until_ms = 0;
            if let Some(r) = global_remaining {
                l.global_remaining = r;
                l.known = true;
                l.reply_ms = now_ms;
            }
        })
    }
}

/// The pure sizing rule behind `LeasePool::want`: about one horizon of demand plus the waiters,
/// capped by `lease_max` and `burst`, and by half of what the global bucket should hold now (its
/// remaining at the last answer plus the refill since), but never below what the waiters need.
pub fn lease_want(lease: &Lease, waiting: u64, now_ms: u64, sizing: &LeaseSizing) -> u64 {
    let floor = waiting.min(sizing.burst).max(1);
    let mut want = lease
        .win_demand
        .max(lease.prev_demand)
        .saturating_add(waiting)
        .min(sizing.lease_max)
        .min(sizing.burst)
        .max(floor);
    if lease.known {
        let refill = now_ms
            .saturating_sub(lease.reply_ms)
            .saturating_mul(sizing.rate)
            .checked_div(sizing.period_ms)
            .unwrap_or(0);
        let projected = lease
            .global_remaining
            .saturating_add(refill)
            .min(sizing.burst);
        want = want.min(projected / 2).max(floor);
    }
    want
}

/// A change of the circuit breaker's state, for the one log line it deserves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Opened,
    Closed,
}

/// The proxy-wide circuit breaker in front of the backend (shared by all workers).
///
/// Closed: calls go out. After `threshold` consecutive failed calls it opens: no call goes out
/// and the failure mode answers at once, so requests never queue behind a dead backend. After
/// `cooloff_ms` one caller gets to probe (the others keep failing fast for another cool-off); a
/// success closes it, a failure keeps it open.
pub struct Breaker<'a> {
    store: &'a dyn SharedStore,
    key: String,
}

impl<'a> Breaker<'a> {
    pub fn new(store: &'a dyn SharedStore, ns: &str) -> Self {
        Breaker {
            store,
            key: format!("{ns}|breaker"),
        }
    }

    /// (consecutive failures, open until ms; 0 = closed)
    fn update<T>(&self, mut f: impl FnMut(&mut u64, &mut u64) -> T) -> Result<T, StoreError> {
        let mut last = StoreError::CasMismatch;
        for _ in 0..CAS_TRIES {
            let (value, cas) = self.store.get(&self.key)?;
            let Some(value) = value else {
                self.store.set(&self.key, &[0; 16], 0)?;
                continue;
            };
            let mut failures = read_u64(&value, 0).unwrap_or(0);
            let mut open_until = read_u64(&value, 8).unwrap_or(0);
            let out = f(&mut failures, &mut open_until);
            let mut bytes = failures.to_le_bytes().to_vec();
            bytes.extend_from_slice(&open_until.to_le_bytes());
            match self.store.set(&self.key, &bytes, cas) {
                Ok(()) => return Ok(out),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Whether a call may go out now (true for the one probe after a cool-off).
    pub fn allow(&self, now_ms: u64, cooloff_ms: u64) -> bool {
        let (value, _) = self.store.get(&self.key).unwrap_or((None, 0));
        let open_until = value.as_deref().and_then(|v| read_u64(v, 8)).unwrap_or(0);
        if open_until == 0 {
            return true; // closed: the common case costs one read
        }
        if now_ms < open_until {
            return false;
        }
        // Half-open: whoever moves the deadline first is the probe.
        self.update(|_, until| {
            if *until != 0 && now_ms >= *until {
                *until = now_ms.saturating_add(cooloff_ms);
                true
            } else {
                *until == 0
            }
        })
        .unwrap_or(false)
    }

    /// Records a call's outcome; says when this opened or closed the breaker.
    pub fn record(
        &self,
        ok: bool,
        now_ms: u64,
        threshold: u64,
        cooloff_ms: u64,
    ) -> Option<Transition> {
        if ok {
            // Closed and clean: nothing to write.
            let (value, _) = self.store.get(&self.key).unwrap_or((None, 0));
            if !value.as_deref().is_some_and(|v| v.iter().any(|b| *b != 0)) {
                return None;
            }
        }
        self.update(|failures, until| {
            if ok {
                let was_open = *until != 0;
                *failures = 0;
                *until = 0;
                return was_open.then_some(Transition::Closed);
            }
            *failures = failures.saturating_add(1);
            if *failures >= threshold {
                let was_closed = *until == 0;
                *until = now_ms.saturating_add(cooloff_ms);
                return was_closed.then_some(Transition::Opened);
            }
            None
        })
        .ok()
        .flatten()
    }
}

/// A proxy-wide gate for log lines: the same message passes at most once per interval, whichever
/// worker sees it, so a backend error that hits every request is one line, not thousands.
pub struct LogGate<'a> {
    store: &'a dyn SharedStore,
    key: String,
}

impl<'a> LogGate<'a> {
    pub fn new(store: &'a dyn SharedStore, ns: &str) -> Self {
        LogGate {
            store,
            key: format!("{ns}|log"),
        }
    }

    /// Whether `message` may be logged now (and records that it was).
    pub fn admit(&self, message: &str, now_ms: u64, every_ms: u64) -> bool {
        let hash = slot_hash(message);
        for _ in 0..CAS_TRIES {
            let Ok((value, cas)) = self.store.get(&self.key) else {
                return true;
            };
            if let Some(v) = &value {
                let same = read_u64(v, 0) == Some(hash);
                let recent = read_u64(v, 8).is_some_and(|at| now_ms < at.saturating_add(every_ms));
                if same && recent {
                    return false;
                }
            }
            let mut bytes = hash.to_le_bytes().to_vec();
            bytes.extend_from_slice(&now_ms.to_le_bytes());
            match self.store.set(&self.key, &bytes, cas) {
                Ok(()) => return true,
                Err(StoreError::CasMismatch) => continue,
                Err(StoreError::Host(_)) => return true,
            }
        }
        false
    }
}

/// Takes `cost` from the per-proxy fallback bucket of `bucket_key` (used only while the backend
/// fails and `failure_mode` is `local`), with the same math as the global bucket. `ns` must name
/// the rule too: keys that share a slot share a bucket, which only under-admits when they share
/// the same limits.
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
            // No insert-if-absent exists: create the slot (a full bucket) unconditionally,
            // then update it only by compare-and-swap, so two workers can't both take from a
            // bucket that one of them then overwrites.
            store.set(&key, &encode_state(None), 0)?;
            continue;
        };
        let state = decode_state(&value);
        let (next, reply) = bucket::take(state, limits, cost, 0, 0, now_us);
        match store.set(&key, &encode_state(next), cas) {
            Ok(()) => return Ok(reply),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// A one-byte value means a full bucket (shared data cannot be deleted, and the host reads an
/// empty value back as no value at all).
fn encode_state(state: Option<State>) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    let Some(s) = state else {
        return vec![0];
    };
    {
        out.extend_from_slice(&s.units.to_le_bytes());
        out.extend_from_slice(&s.ts_us.to_le_bytes());
        out.extend_from_slice(&s.period_ms.to_le_bytes());
    }
    out
}

fn decode_state(bytes: &[u8]) -> Option<State> {
    Some(State {
        units: i64::from_le_bytes(read_u64(bytes, 0)?.to_le_bytes()),
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
        // Like Envoy: an empty value reads back as no data (the CAS token is still there).
        Ok(match self.map.borrow().get(key) {
            Some((v, cas)) if v.is_empty() => (None, *cas),
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

    const SIZING: LeaseSizing = LeaseSizing {
        burst: 100,
        rate: 100,
        period_ms: 1000,
        lease_max: 40,
        horizon_ms: 200,
    };

    #[test]
    fn lease_tokens_are_spent_once_then_missed() {
        let s = MemStore::default();
        let p = LeasePool::new(&s, "ns");
        assert_eq!(
            p.take("k", 1, 0, 200, true).unwrap().spent,
            None,
            "nothing leased yet"
        );
        assert!(p.begin_flight("k", 0, 50).unwrap());
        assert!(
            !p.begin_flight("k", 10, 60).unwrap(),
            "one flight per proxy"
        );
        p.deposit("k", 3, 90, 700, 20, 200).unwrap();
        assert!(
            p.begin_flight("k", 21, 70).unwrap(),
            "deposit ended the flight"
        );
        p.end_flight("k", None, 21).unwrap();
        let spent = p.take("k", 2, 30, 200, true).unwrap().spent.unwrap();
        assert_eq!(spent.remaining, 1 + 90);
        assert_eq!(spent.reset_ms, 720 - 30);
        assert_eq!(
            p.take("k", 2, 31, 200, true).unwrap().spent,
            None,
            "only 1 left"
        );
        assert!(p.take("k", 1, 32, 200, true).unwrap().spent.is_some());
        assert_eq!(p.take("k", 1, 33, 200, true).unwrap().spent, None);
        assert_eq!(p.take("other", 1, 33, 200, true).unwrap().spent, None);
    }

    #[test]
    fn leases_expire_after_two_horizons() {
        let s = MemStore::default();
        let p = LeasePool::new(&s, "ns");
        p.deposit("k", 5, 0, 0, 1000, 200).unwrap();
        assert!(p.take("k", 1, 1399, 200, false).unwrap().spent.is_some());
        let t = p.take("k", 1, 1400, 200, false).unwrap();
        assert_eq!(
            t,
            Take {
                spent: None,
                dropped: 4
            },
            "4 unspent tokens expired"
        );
        // A new deposit does not revive expired tokens.
        p.deposit("k", 1, 0, 0, 1500, 200).unwrap();
        assert!(p.take("k", 1, 1500, 200, false).unwrap().spent.is_some());
        assert_eq!(p.take("k", 1, 1500, 200, false).unwrap().spent, None);
    }

    #[test]
    fn concurrent_workers_never_spend_more_than_deposited() {
        // Two "workers" interleave takes with injected CAS conflicts; the total spent equals what
        // was deposited, never more.
        let s = MemStore::default();
        let p = LeasePool::new(&s, "ns");
        p.deposit("k", 50, 0, 0, 0, 10_000).unwrap();
        let mut spent = 0;
        for i in 0..200u64 {
            if i % 3 == 0 {
                s.inject_conflicts.set(2);
            }
            if let Ok(Take { spent: Some(_), .. }) = p.take("k", 1, i, 10_000, true) {
                spent += 1;
            }
        }
        assert_eq!(spent, 50);
    }

    #[test]
    fn lease_slot_clash_drops_tokens_never_lends_them_to_another_key() {
        let s = MemStore::default();
        let p = LeasePool::new(&s, "ns");
        let a = "a0".to_string();
        let b = (1..100_000)
            .map(|i| format!("a{i}"))
            .find(|k| slot(k) == slot(&a))
            .unwrap();
        p.deposit(&a, 10, 0, 0, 0, 200).unwrap();
        assert_eq!(p.take(&b, 1, 1, 200, true).unwrap().spent, None);
        assert_eq!(
            p.take(&a, 1, 2, 200, true).unwrap().spent,
            None,
            "a's lease was replaced"
        );
    }

    #[test]
    fn lease_size_follows_demand_and_shrinks_near_empty() {
        let want = |l: &Lease, waiting: u64, now: u64| lease_want(l, waiting, now, &SIZING);
        let fresh = Lease::default();
        assert_eq!(want(&fresh, 1, 0), 1, "cold key: just the request");
        let busy = Lease {
            win_demand: 25,
            prev_demand: 30,
            ..Lease::default()
        };
        assert_eq!(want(&busy, 2, 0), 32);
        let hot = Lease {
            win_demand: 500,
            ..Lease::default()
        };
        assert_eq!(want(&hot, 1, 0), 40, "capped by lease_max");
        let low = Lease {
            win_demand: 500,
            known: true,
            global_remaining: 10,
            reply_ms: 1000,
            ..Lease::default()
        };
        assert_eq!(want(&low, 1, 1000), 5, "half of what is left");
        assert_eq!(
            want(&low, 1, 1100),
            10,
            "plus half the refill since (10 tokens)"
        );
        assert_eq!(want(&low, 1, 9000), 40, "refilled: back to demand");
        let empty = Lease {
            global_remaining: 0,
            ..low
        };
        assert_eq!(want(&empty, 3, 1000), 3, "still enough for the waiters");
    }

    #[test]
    fn backoff_never_lets_half_the_burst_refill() {
        assert_eq!(SIZING.backoff_ms(), 200);
        let small = LeaseSizing {
            burst: 20,
            ..SIZING
        };
        assert_eq!(small.backoff_ms(), 100);
        let tiny = LeaseSizing {
            burst: 1,
            rate: 1000,
            ..SIZING
        };
        assert_eq!(tiny.backoff_ms(), 1);
    }

    #[test]
    fn demand_window_rolls() {
        let s = MemStore::default();
        let p = LeasePool::new(&s, "ns");
        for t in 0..10 {
            let _ = p.take("k", 1, t, 200, true).unwrap().spent;
        }
        assert_eq!(p.want("k", 0, 10, &SIZING), 10);
        assert_eq!(p.want("k", 0, 250, &SIZING), 10, "previous window counts");
        assert_eq!(p.want("k", 0, 450, &SIZING), 1, "old demand forgotten");
    }

    #[test]
    fn breaker_opens_after_consecutive_failures_then_probes_once() {
        let s = MemStore::default();
        let b = Breaker::new(&s, "ns");
        assert!(b.allow(0, 1000));
        assert_eq!(b.record(false, 0, 3, 1000), None);
        assert_eq!(
            b.record(true, 1, 3, 1000),
            None,
            "a success resets the count"
        );
        assert_eq!(b.record(false, 2, 3, 1000), None);
        assert_eq!(b.record(false, 3, 3, 1000), None);
        assert_eq!(b.record(false, 4, 3, 1000), Some(Transition::Opened));
        assert!(!b.allow(5, 1000), "open: fail fast");
        assert!(!b.allow(1003, 1000));
        assert!(b.allow(1004, 1000), "cool-off over: one probe");
        assert!(!b.allow(1004, 1000), "only one");
        assert_eq!(
            b.record(false, 1010, 3, 1000),
            None,
            "still open, no new log line"
        );
        assert!(!b.allow(1500, 1000));
        assert!(b.allow(2010, 1000));
        assert_eq!(b.record(true, 2011, 3, 1000), Some(Transition::Closed));
        assert!(b.allow(2012, 1000));
        assert_eq!(b.record(true, 2013, 3, 1000), None);
    }

    #[test]
    fn log_gate_passes_a_message_once_per_interval() {
        let s = MemStore::default();
        let g = LogGate::new(&s, "ns");
        assert!(g.admit("WRONGPASS", 0, 60_000));
        assert!(!g.admit("WRONGPASS", 10, 60_000));
        assert!(g.admit("NOAUTH", 20, 60_000), "a different message passes");
        assert!(
            g.admit("WRONGPASS", 30, 60_000),
            "and the old one again after it"
        );
        assert!(!g.admit("WRONGPASS", 59_000, 60_000));
        assert!(g.admit("WRONGPASS", 60_030, 60_000));
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
