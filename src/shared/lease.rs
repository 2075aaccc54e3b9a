//! The per-proxy lease pool: tokens a proxy took from the global bucket in one call, spent locally
//! by all of its workers.
//!
//! Invariant: a lease's `tokens` only grow by [`LeasePool::deposit`] of what the script granted,
//! and only shrink by [`LeasePool::take`] under compare-and-swap, so two workers never spend the
//! same token and the fleet never admits more than the global bucket granted. Unspent tokens are
//! dropped (never lent to another key) when the lease expires, two horizons after the grant.
//!
//! Memory is bounded: `SETS` shared-data values per plugin, each holding up to `WAYS` keys. A key
//! that holds unspent tokens or has a lease call out is never evicted; a newcomer takes an empty
//! way, else the least recently touched way that holds nothing (`Placed::evicted` counts it), else
//! gets no slot at all (its requests then go to Redis one by one, exactly).

use super::{hash, read_u64, update, write_u64s, Change, Store, StoreError};

/// Sets of the lease table (each one shared-data value).
pub const SETS: u64 = 2048;
/// Keys per set.
pub const WAYS: usize = 4;

/// One proxy's lease on one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lease {
    /// Unspent leased tokens. Every one was granted by the script, so spending it is exact.
    pub tokens: u64,
    /// After this the unspent tokens are dropped.
    pub expires_ms: u64,
    /// The global bucket's remaining tokens at the last answer (meaningful once `known`).
    pub global_remaining: u64,
    /// When the global bucket would be full, from the last answer.
    pub reset_at_ms: u64,
    /// Demand (tokens asked for here) in the current and previous horizon window.
    pub win_start_ms: u64,
    pub win_demand: u64,
    pub prev_demand: u64,
    /// A lease call for this key is out (from some worker) until then.
    pub flight_until_ms: u64,
    /// Whether an answer was ever recorded (so `global_remaining` means something).
    pub known: bool,
    /// When the last answer about the global bucket arrived.
    pub reply_ms: u64,
    /// Last time anything touched this entry (for eviction).
    pub touched_ms: u64,
}

const FIELDS: usize = 11;
const ENTRY_HEADER: usize = (FIELDS + 1) * 8;

impl Lease {
    fn fields(&self) -> [u64; FIELDS] {
        [
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
            self.touched_ms,
        ]
    }

    fn from_fields(bytes: &[u8], at: usize) -> Option<Lease> {
        let f = |i: usize| read_u64(bytes, at + i * 8);
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
            touched_ms: f(10)?,
        })
    }

    /// Tokens that can still be spent now.
    pub fn live_tokens(&self, now_ms: u64) -> u64 {
        if now_ms < self.expires_ms {
            self.tokens
        } else {
            0
        }
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

    /// Whether evicting this entry would lose something: tokens to spend or a call in flight.
    fn pinned(&self, now_ms: u64) -> bool {
        self.live_tokens(now_ms) > 0 || self.flight_until_ms > now_ms
    }
}

/// One set: up to `WAYS` (key, lease) entries.
#[derive(Debug, Default)]
struct Set {
    entries: Vec<(String, Lease)>,
}

impl Set {
    fn decode(bytes: Option<&[u8]>) -> Set {
        let mut entries = Vec::new();
        let Some(bytes) = bytes else {
            return Set { entries };
        };
        let mut at = 0;
        while entries.len() < WAYS {
            let Some(len) = read_u64(bytes, at).and_then(|l| usize::try_from(l).ok()) else {
                break;
            };
            let Some(lease) = Lease::from_fields(bytes, at + 8) else {
                break;
            };
            let start = at + ENTRY_HEADER;
            let Some(key) = start
                .checked_add(len)
                .and_then(|end| bytes.get(start..end))
                .and_then(|k| std::str::from_utf8(k).ok())
            else {
                break;
            };
            entries.push((key.to_string(), lease));
            at = start + len;
        }
        Set { entries }
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * (ENTRY_HEADER + 48));
        for (key, lease) in &self.entries {
            write_u64s(&mut out, &[key.len() as u64]);
            write_u64s(&mut out, &lease.fields());
            out.extend_from_slice(key.as_bytes());
        }
        out
    }

    fn find(&mut self, key: &str) -> Option<&mut Lease> {
        self.entries
            .iter_mut()
            .find(|(k, _)| k == key)
            .map(|(_, l)| l)
    }

    /// The entry for `key`, placing it if needed; None if every way is pinned.
    fn place(&mut self, key: &str, now_ms: u64) -> Option<(&mut Lease, Placed)> {
        let mut placed = Placed::default();
        let pos = match self.entries.iter().position(|(k, _)| k == key) {
            Some(pos) => pos,
            None if self.entries.len() < WAYS => {
                self.entries.push((key.to_string(), Lease::default()));
                self.entries.len() - 1
            }
            None => {
                let victim = self
                    .entries
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, l))| !l.pinned(now_ms))
                    .min_by_key(|(_, (_, l))| l.touched_ms)
                    .map(|(i, _)| i)?;
                let slot = self.entries.get_mut(victim)?;
                placed.evicted = 1;
                placed.dropped = slot.1.tokens;
                *slot = (key.to_string(), Lease::default());
                victim
            }
        };
        let lease = &mut self.entries.get_mut(pos)?.1;
        lease.touched_ms = now_ms;
        Some((lease, placed))
    }
}

/// What placing a key cost another key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placed {
    /// Entries evicted (0 or 1); they held no live tokens and no call.
    pub evicted: u64,
    /// Expired tokens the evicted entry still carried.
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

/// What [`LeasePool::take`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Take {
    /// One entry per cost served, in order (a prefix of the costs asked for).
    pub spent: Vec<Spent>,
    /// Tokens of an expired lease dropped on the way.
    pub dropped: u64,
}

/// Leased tokens moved out of the pool into one worker's stash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub tokens: u64,
    pub expires_ms: u64,
    pub global_remaining: u64,
    pub reset_at_ms: u64,
    /// Tokens of an expired lease dropped on the way.
    pub dropped: u64,
}

/// The single lease call for one key on this proxy. It is not `Clone`: whoever holds it must end
/// it with [`LeasePool::deposit`] or [`LeasePool::release`], on every path.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a lease claim must be ended with deposit or release"]
pub struct Claim {
    key: String,
}

impl Claim {
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// The outcome of [`LeasePool::begin_flight`].
#[derive(Debug, PartialEq, Eq)]
pub enum Flight {
    /// This caller makes the call.
    Claimed(Claim, Placed),
    /// Another worker's call for this key is out; its grant will land in the pool.
    Busy,
    /// The key has no slot (every way pinned by other keys): call Redis exactly instead.
    NoSlot,
}

/// What a grant did to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deposit {
    /// Expired tokens dropped (including those of an evicted entry).
    pub dropped: u64,
    pub evicted: u64,
}

/// How big a lease to ask for and how long to back off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    pub burst: u64,
    pub rate: u64,
    pub period_ms: u64,
    pub lease_max: u64,
    pub horizon_ms: u64,
}

impl Sizing {
    /// How long a proxy that found the global bucket short (it held `remaining` after the answer)
    /// waits before asking again: until the refill has brought the bucket back to about half its
    /// burst. Never longer, so the bucket cannot fill up and overflow meanwhile (a token refilled
    /// past a full bucket is lost to everyone); coming back sooner would only cost calls that each
    /// take a sliver of refill.
    pub fn backoff_ms(&self, remaining: u64) -> u64 {
        let missing = (self.burst / 2).saturating_sub(remaining);
        missing
            .saturating_mul(self.period_ms)
            .div_ceil(self.rate.max(1))
            .max(1)
    }

    /// How many tokens to ask for: about one horizon of demand plus what is waiting, capped by
    /// `lease_max` and `burst`, and by half of what the global bucket should hold now (its
    /// remaining at the last answer plus the refill since), but never below what the waiters need.
    pub fn want(&self, lease: &Lease, waiting: u64, now_ms: u64) -> u64 {
        let floor = waiting.min(self.burst).max(1);
        let mut want = lease
            .win_demand
            .max(lease.prev_demand)
            .saturating_add(waiting)
            .min(self.lease_max)
            .min(self.burst)
            .max(floor);
        if lease.known {
            let refill = now_ms
                .saturating_sub(lease.reply_ms)
                .saturating_mul(self.rate)
                .checked_div(self.period_ms)
                .unwrap_or(0);
            let projected = lease
                .global_remaining
                .saturating_add(refill)
                .min(self.burst);
            want = want.min(projected / 2).max(floor);
        }
        want
    }
}

/// The lease pool of one plugin on this proxy.
pub struct LeasePool<'a> {
    store: &'a dyn Store,
    ns: &'a str,
}

impl<'a> LeasePool<'a> {
    pub fn new(store: &'a dyn Store, ns: &'a str) -> Self {
        LeasePool { store, ns }
    }

    fn set_key(&self, key: &str) -> String {
        format!("{}|lease|{}", self.ns, hash(key) % SETS)
    }

    /// The lease of `key` as stored now, if it has a slot.
    pub fn peek(&self, key: &str) -> Option<Lease> {
        let (value, _) = self.store.get(&self.set_key(key)).ok()?;
        Set::decode(value.as_deref()).find(key).copied()
    }

    /// Spends leased tokens for as many of `costs`, in order, as the lease covers (stopping at the
    /// first that does not fit). Writes only when something was spent or dropped.
    pub fn take(
        &self,
        key: &str,
        costs: &[u64],
        now_ms: u64,
        horizon_ms: u64,
    ) -> Result<Take, StoreError> {
        update(self.store, &self.set_key(key), |bytes| {
            let mut set = Set::decode(bytes);
            let Some(lease) = set.find(key) else {
                return Change::Keep(Take::default());
            };
            if lease.live_tokens(now_ms) < costs.first().copied().unwrap_or(u64::MAX) {
                return Change::Keep(Take::default());
            }
            lease.roll(now_ms, horizon_ms);
            let mut take = Take {
                dropped: lease.expire(now_ms),
                spent: Vec::new(),
            };
            for &cost in costs {
                if lease.tokens < cost {
                    break;
                }
                lease.tokens -= cost;
                lease.win_demand = lease.win_demand.saturating_add(cost);
                take.spent.push(Spent {
                    remaining: lease.tokens.saturating_add(lease.global_remaining),
                    reset_ms: lease.reset_at_ms.saturating_sub(now_ms),
                });
            }
            lease.touched_ms = now_ms;
            Change::Write(set.encode(), take)
        })
    }

    /// Moves a batch of at least `cost` live tokens out of `key`'s lease: a quarter of what it holds
    /// (so the proxy's other workers find tokens too), all of it if that is less than `cost`, or
    /// exactly `cost` when `exact` (the worker cannot stash the rest). None if the lease holds less
    /// than `cost`; writes nothing then.
    pub fn take_batch(
        &self,
        key: &str,
        cost: u64,
        now_ms: u64,
        horizon_ms: u64,
        exact: bool,
    ) -> Result<Option<Batch>, StoreError> {
        update(self.store, &self.set_key(key), |bytes| {
            let mut set = Set::decode(bytes);
            let Some(lease) = set.find(key) else {
                return Change::Keep(None);
            };
            let live = lease.live_tokens(now_ms);
            if live < cost || cost == 0 {
                return Change::Keep(None);
            }
            lease.roll(now_ms, horizon_ms);
            let tokens = if exact { cost } else { (live / 4).max(cost) };
            lease.tokens -= tokens;
            lease.win_demand = lease.win_demand.saturating_add(tokens);
            lease.touched_ms = now_ms;
            let batch = Batch {
                tokens,
                expires_ms: lease.expires_ms,
                global_remaining: lease.global_remaining,
                reset_at_ms: lease.reset_at_ms,
                dropped: 0,
            };
            Change::Write(set.encode(), Some(batch))
        })
    }

    /// Claims the single lease call for `key` on this proxy until `until_ms`; says how big a lease
    /// to ask for, given the `demand` waiting for it (counted in the demand window once spent).
    pub fn begin_flight(
        &self,
        key: &str,
        demand: u64,
        now_ms: u64,
        until_ms: u64,
        sizing: &Sizing,
    ) -> Result<(Flight, u64), StoreError> {
        update(self.store, &self.set_key(key), |bytes| {
            let mut set = Set::decode(bytes);
            if set.find(key).is_some_and(|l| l.flight_until_ms > now_ms) {
                return Change::Keep((Flight::Busy, 0));
            }
            let Some((lease, placed)) = set.place(key, now_ms) else {
                return Change::Keep((Flight::NoSlot, 0));
            };
            lease.roll(now_ms, sizing.horizon_ms);
            let want = sizing.want(lease, demand, now_ms);
            lease.flight_until_ms = until_ms;
            let claim = Claim {
                key: key.to_string(),
            };
            Change::Write(set.encode(), (Flight::Claimed(claim, placed), want))
        })
    }

    /// Ends a flight with a grant: `granted` tokens join the lease, which lasts two horizons.
    #[allow(clippy::too_many_arguments)]
    pub fn deposit(
        &self,
        claim: Claim,
        granted: u64,
        global_remaining: u64,
        reset_after_ms: u64,
        now_ms: u64,
        horizon_ms: u64,
    ) -> Result<Deposit, StoreError> {
        let key = claim.key;
        update(self.store, &self.set_key(&key), |bytes| {
            let mut set = Set::decode(bytes);
            let Some((lease, placed)) = set.place(&key, now_ms) else {
                // Every way got pinned by others while the call was out: the grant has nowhere
                // to go and is dropped (fewer admissions, never more).
                return Change::Keep(Deposit {
                    dropped: granted,
                    evicted: 0,
                });
            };
            let dropped = placed.dropped.saturating_add(lease.expire(now_ms));
            lease.tokens = lease.tokens.saturating_add(granted);
            lease.expires_ms = now_ms.saturating_add(horizon_ms.saturating_mul(2));
            lease.global_remaining = global_remaining;
            lease.reset_at_ms = now_ms.saturating_add(reset_after_ms);
            lease.flight_until_ms = 0;
            lease.known = true;
            lease.reply_ms = now_ms;
            let out = Deposit {
                dropped,
                evicted: placed.evicted,
            };
            Change::Write(set.encode(), out)
        })
    }

    /// Ends a flight that brought no tokens (a denial with what the bucket held, or an error).
    pub fn release(
        &self,
        claim: Claim,
        global_remaining: Option<u64>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let key = claim.key;
        update(self.store, &self.set_key(&key), |bytes| {
            let mut set = Set::decode(bytes);
            let Some(lease) = set.find(&key) else {
                return Change::Keep(());
            };
            lease.flight_until_ms = 0;
            if let Some(r) = global_remaining {
                lease.global_remaining = r;
                lease.known = true;
                lease.reply_ms = now_ms;
            }
            Change::Write(set.encode(), ())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::mem::MemStore;

    const SIZING: Sizing = Sizing {
        burst: 100,
        rate: 100,
        period_ms: 1000,
        lease_max: 50,
        horizon_ms: 200,
    };

    fn claim(pool: &LeasePool, key: &str, now: u64) -> Claim {
        match pool.begin_flight(key, 1, now, now + 100, &SIZING).unwrap() {
            (Flight::Claimed(c, _), _) => c,
            other => panic!("{other:?}"),
        }
    }

    fn spent(t: &Take) -> usize {
        t.spent.len()
    }

    #[test]
    fn tokens_are_spent_once_then_missed() {
        let s = MemStore::default();
        let pool = LeasePool::new(&s, "ns");
        assert_eq!(spent(&pool.take("k", &[1], 0, 200).unwrap()), 0);
        let c = claim(&pool, "k", 0);
        assert_eq!(
            pool.begin_flight("k", 1, 1, 50, &SIZING).unwrap().0,
            Flight::Busy,
            "one call per key"
        );
        pool.deposit(c, 3, 10, 500, 1, 200).unwrap();
        let t = pool.take("k", &[1, 1, 5], 2, 200).unwrap();
        assert_eq!(spent(&t), 2, "stops at the first cost that does not fit");
        assert_eq!(t.spent[1].remaining, 1 + 10);
        assert_eq!(spent(&pool.take("k", &[1], 3, 200).unwrap()), 1);
        let writes = s.writes();
        assert_eq!(spent(&pool.take("k", &[1], 4, 200).unwrap()), 0);
        assert_eq!(s.writes(), writes, "a miss writes nothing");
    }

    #[test]
    fn batches_move_a_quarter_and_never_more_than_is_there() {
        let s = MemStore::default();
        let pool = LeasePool::new(&s, "ns");
        assert_eq!(pool.take_batch("k", 1, 0, 200, false).unwrap(), None);
        let c = claim(&pool, "k", 0);
        pool.deposit(c, 10, 7, 500, 0, 200).unwrap();
        let b = pool.take_batch("k", 1, 1, 200, false).unwrap().unwrap();
        assert_eq!((b.tokens, b.expires_ms, b.global_remaining), (2, 400, 7));
        assert_eq!(
            pool.take_batch("k", 3, 1, 200, true)
                .unwrap()
                .unwrap()
                .tokens,
            3
        );
        assert_eq!(
            pool.take_batch("k", 6, 1, 200, false).unwrap(),
            None,
            "5 left"
        );
        assert_eq!(
            pool.take_batch("k", 5, 1, 200, false)
                .unwrap()
                .unwrap()
                .tokens,
            5
        );
        assert_eq!(pool.peek("k").unwrap().tokens, 0);
    }

    #[test]
    fn leases_expire_after_two_horizons() {
        let s = MemStore::default();
        let pool = LeasePool::new(&s, "ns");
        let c = claim(&pool, "k", 0);
        pool.deposit(c, 5, 10, 500, 0, 200).unwrap();
        assert_eq!(spent(&pool.take("k", &[1], 399, 200).unwrap()), 1);
        assert_eq!(spent(&pool.take("k", &[1], 400, 200).unwrap()), 0);
        let c = claim(&pool, "k", 401);
        let d = pool.deposit(c, 1, 10, 500, 402, 200).unwrap();
        assert_eq!(d.dropped, 4, "the expired tokens are counted when dropped");
    }

    #[test]
    fn released_claims_free_the_key_and_record_what_redis_said() {
        let s = MemStore::default();
        let pool = LeasePool::new(&s, "ns");
        let c = claim(&pool, "k", 0);
        pool.release(c, Some(7), 5).unwrap();
        let l = pool.peek("k").unwrap();
        assert_eq!(
            (l.flight_until_ms, l.global_remaining, l.known),
            (0, 7, true)
        );
        let c = claim(&pool, "k", 6);
        pool.release(c, None, 7).unwrap();
        assert_eq!(pool.peek("k").unwrap().flight_until_ms, 0);
    }

    /// Keys that land in one set.
    fn same_set_keys(pool: &LeasePool, n: usize) -> Vec<String> {
        let target = pool.set_key("k0");
        (0..)
            .map(|i| format!("k{i}"))
            .filter(|k| pool.set_key(k) == target)
            .take(n)
            .collect()
    }

    #[test]
    fn a_newcomer_never_evicts_paid_tokens() {
        let s = MemStore::default();
        let pool = LeasePool::new(&s, "ns");
        let keys = same_set_keys(&pool, WAYS + 2);
        for k in keys.iter().take(WAYS) {
            let c = claim(&pool, k, 0);
            pool.deposit(c, 5, 10, 500, 1, 200).unwrap();
        }
        let newcomer = &keys[WAYS];
        assert_eq!(
            pool.begin_flight(newcomer, 1, 2, 100, &SIZING).unwrap().0,
            Flight::NoSlot
        );
        for k in keys.iter().take(WAYS) {
            assert_eq!(
                spent(&pool.take(k, &[5], 3, 200).unwrap()),
                1,
                "{k} kept its lease"
            );
        }
        // Spent out, the ways are free again: the least recently touched one goes.
        match pool.begin_flight(newcomer, 1, 4, 100, &SIZING).unwrap().0 {
            Flight::Claimed(c, placed) => {
                assert_eq!(
                    placed,
                    Placed {
                        evicted: 1,
                        dropped: 0
                    }
                );
                pool.release(c, None, 5).unwrap();
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_expired_lease_may_be_evicted_and_its_tokens_are_counted() {
        let s = MemStore::default();
        let pool = LeasePool::new(&s, "ns");
        let keys = same_set_keys(&pool, WAYS + 1);
        for k in keys.iter().take(WAYS) {
            let c = claim(&pool, k, 0);
            pool.deposit(c, 2, 10, 500, 0, 200).unwrap();
        }
        match pool
            .begin_flight(&keys[WAYS], 1, 500, 600, &SIZING)
            .unwrap()
            .0
        {
            Flight::Claimed(c, placed) => {
                assert_eq!(
                    placed,
                    Placed {
                        evicted: 1,
                        dropped: 2
                    }
                );
                let d = pool.deposit(c, 3, 10, 500, 501, 200).unwrap();
                assert_eq!(d.dropped, 0);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn concurrent_workers_never_spend_more_than_deposited() {
        let s = MemStore::default();
        let pool = LeasePool::new(&s, "ns");
        let c = claim(&pool, "k", 0);
        pool.deposit(c, 10, 0, 500, 0, 200).unwrap();
        let mut admitted = 0;
        for i in 0..40 {
            s.inject_conflicts.set(i % 3);
            admitted += spent(&pool.take("k", &[1], 1, 200).unwrap_or_default());
        }
        assert_eq!(admitted, 10);
    }

    #[test]
    fn lease_size_follows_demand_and_shrinks_near_empty() {
        let mut l = Lease::default();
        assert_eq!(SIZING.want(&l, 1, 0), 1, "no history: what waits");
        l.win_demand = 30;
        assert_eq!(SIZING.want(&l, 2, 0), 32);
        l.prev_demand = 500;
        assert_eq!(SIZING.want(&l, 2, 0), 50, "lease_max caps");
        l.known = true;
        l.global_remaining = 20;
        assert_eq!(SIZING.want(&l, 2, 0), 10, "half of what the bucket holds");
        assert_eq!(SIZING.want(&l, 2, 100), 15, "plus the refill since");
        l.global_remaining = 0;
        assert_eq!(SIZING.want(&l, 3, 0), 3, "never below what waits");
    }

    #[test]
    fn backoff_comes_back_when_the_bucket_is_about_half_full() {
        assert_eq!(SIZING.backoff_ms(0), 500, "half of 100 at 100/s");
        assert_eq!(SIZING.backoff_ms(30), 200);
        assert_eq!(SIZING.backoff_ms(80), 1, "already half full: at once");
        let fast = Sizing {
            burst: 10,
            rate: 1000,
            ..SIZING
        };
        assert_eq!(fast.backoff_ms(0), 5);
        let tiny = Sizing {
            burst: 1,
            rate: 1_000_000,
            ..SIZING
        };
        assert_eq!(tiny.backoff_ms(0), 1);
    }

    #[test]
    fn demand_window_rolls() {
        let mut l = Lease {
            win_demand: 7,
            ..Lease::default()
        };
        l.roll(200, 200);
        assert_eq!((l.prev_demand, l.win_demand), (7, 0));
        l.win_demand = 3;
        l.roll(800, 200);
        assert_eq!((l.prev_demand, l.win_demand), (0, 0));
    }

    #[test]
    fn garbage_sets_decode_as_empty() {
        for bytes in [&b""[..], b"\xff\xff\xff\xff\xff\xff\xff\xff", &[0u8; 200]] {
            let _ = Set::decode(Some(bytes));
        }
        let mut big = Vec::new();
        write_u64s(&mut big, &[u64::MAX]);
        big.extend_from_slice(&[0; 96]);
        assert!(Set::decode(Some(&big)).entries.is_empty());
    }
}
