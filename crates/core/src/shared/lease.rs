//! The per-proxy lease pool: tokens a proxy took from the global bucket in one call, spent locally
//! by all of its workers.
//!
//! Invariant: a lease's `tokens` only grow by [`LeasePool::deposit`] of what the script granted,
//! and only shrink by [`LeasePool::take`] under compare-and-swap, so two workers never spend the
//! same token and the fleet never admits more than the global bucket granted. A grant that is
//! partly a reservation (the script put the bucket into debt for it, to be paid back by its
//! refill until `vest_until_ms`) is spendable only as the refill pays it: never more than the
//! refill the script counted on, counted as if continuous, so the fleet never admits ahead of a
//! continuous refill either (at a refill step of a second or a minute that is up to one step's
//! refill before the step brings it: the promise with W rounded up to a step, as the script's;
//! `crates/core/tests/step_windows.rs` checks it). A request of a rule that holds requests may
//! take a token still refilling: it leaves the lease at once and the request is let through when
//! the token would have become spendable, never sooner. Unspent tokens are dropped (never lent to
//! another key) when the lease expires, two horizons after the grant has refilled (six on a key
//! saturated here); the next lease call for the key gives them back to the bucket
//! ([`Claim::back`]), each once, and no worker spends them after they were dropped.
//!
//! Memory is bounded: `SETS` shared-data values per plugin, each holding up to `WAYS` keys. A key
//! that holds unspent tokens or has a lease call out is never evicted; a newcomer takes an empty
//! way, else the least recently touched way that holds nothing (`Placed::evicted` counts it), else
//! gets no slot at all (its requests then go to Redis one by one, exactly).

use super::{hash, read_u64, update, write_u64s, Change, Store, StoreError};

/// How late after its lease expired a worker may still spend from its stash, at most: the
/// report does not claim the proxy held nothing in that time.
const EXPIRED_SLACK_MS: u64 = 100;

/// A lease lives this many horizons after its grant has refilled ...
pub const LIFE_HORIZONS: u64 = 2;
/// ... and this many on a key saturated here. Such a key's proxies get tokens only in turns, each
/// a reservation the bucket has already refilled by the time it is spendable; what a quiet proxy
/// has not spent when its lease expires is lost to the whole fleet. A longer life lets it spend a
/// turn's tokens at its own pace (the script counts them as held that much longer).
pub const SATURATED_LIFE_HORIZONS: u64 = 6;

/// An answer that left a key with fewer tokens than a request needed keeps the proxy leasing it
/// for this many horizons ([`LeasePool::check_quietly`]).
pub const SHORT_MEMORY_HORIZONS: u64 = 50;

/// Sets of the lease table (each one shared-data value).
pub const SETS: u64 = 2048;
/// Keys per set.
pub const WAYS: usize = 4;

/// `k` eighths of `peak`, rounded down (exact for any `peak`).
fn eighths(peak: u64, k: u64) -> u64 {
    u64::try_from(u128::from(peak) * u128::from(k) / 8).unwrap_or(u64::MAX)
}

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
    /// Some of `tokens` are a reservation the global bucket is still refilling: they become
    /// spendable one by one, at the bucket's rate, until this time (0: all are spendable).
    pub vest_until_ms: u64,
    /// Tokens moved out into workers' stashes and not handed back yet: each worker's latest batch
    /// (spent or not), until it takes the next one. With `tokens`, the most this proxy can hold.
    pub lent: u64,
    /// What it held right after the latest grant, and since when it has held at most 7/8, 6/8,
    /// ... 1/8 of that (0: not yet): the steps a lease call reports ([`Lease::report`]).
    pub peak: u64,
    pub eighths_ms: [u64; 7],
    /// The seq of the latest lease call claimed for the key (see [`Claim::seq`]).
    pub flight_seq: u64,
    /// Granted tokens dropped unspent (the lease expired) since the latest claim: the next lease
    /// call gives them back to the bucket ([`Claim::back`]).
    pub back: u64,
    /// Grows each time the lease expires with batches out in workers' stashes: from then on the
    /// proxy reports holding none of them (the next lease call says so), so a batch of an earlier
    /// epoch handed back later is off the script's record, and its tokens are neither put back
    /// into the lease nor given back ([`Back::epoch`]). It starts at the clock's ms when the
    /// entry is placed and grows to at least the clock's ms, so a batch of an earlier entry of
    /// the same key (evicted since: a lease lives milliseconds at least) has a lower one.
    pub epoch: u64,
    /// When the latest lease call for the key was claimed (0: none since the entry was placed),
    /// and the tokens spent since then: by requests served from the lease at once, and of
    /// workers' batches as they are handed back (a batch counts none when taken): the demand the
    /// next call reports ([`Claim::demand`]).
    pub claimed_ms: u64,
    pub asked: u64,
    /// The refill a reservation still refilling vests at (`vest_rate` tokens a `vest_period_ms`):
    /// the limits the script granted it under, which may not be those of the request that spends
    /// it (a tier each, or an override only some spellings get).
    pub vest_rate: u64,
    pub vest_period_ms: u64,
}

const FIELDS: usize = 28;
const ENTRY_HEADER: usize = (FIELDS + 1) * 8;

impl Lease {
    /// A new entry, placed at `now_ms`: its epoch is the clock's ms ([`Lease::epoch`]).
    fn placed(now_ms: u64) -> Lease {
        Lease {
            epoch: now_ms,
            ..Lease::default()
        }
    }

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
            self.vest_until_ms,
            self.lent,
            self.peak,
            self.eighths_ms[0],
            self.eighths_ms[1],
            self.eighths_ms[2],
            self.eighths_ms[3],
            self.eighths_ms[4],
            self.eighths_ms[5],
            self.eighths_ms[6],
            self.flight_seq,
            self.back,
            self.epoch,
            self.claimed_ms,
            self.asked,
            self.vest_rate,
            self.vest_period_ms,
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
            vest_until_ms: f(11)?,
            lent: f(12)?,
            peak: f(13)?,
            eighths_ms: [f(14)?, f(15)?, f(16)?, f(17)?, f(18)?, f(19)?, f(20)?],
            flight_seq: f(21)?,
            back: f(22)?,
            epoch: f(23)?,
            claimed_ms: f(24)?,
            asked: f(25)?,
            vest_rate: f(26)?,
            vest_period_ms: f(27)?,
        })
    }

    /// `sizing` at the refill the reservation vests at: as it was granted, or `sizing`'s own (the
    /// limits of the request asking) for a lease that recorded none.
    fn vesting(&self, sizing: &Sizing) -> Sizing {
        if self.vest_rate > 0 {
            Sizing {
                rate: self.vest_rate,
                period_ms: self.vest_period_ms,
                ..*sizing
            }
        } else {
            *sizing
        }
    }

    /// Tokens not expired yet (refilled or not).
    pub fn live_tokens(&self, now_ms: u64) -> u64 {
        if now_ms < self.expires_ms {
            self.tokens
        } else {
            0
        }
    }

    /// Tokens that can be spent now: not expired, and refilled already.
    pub fn spendable(&self, now_ms: u64, sizing: &Sizing) -> u64 {
        let refilling = self
            .vesting(sizing)
            .refill_in(self.vest_until_ms.saturating_sub(now_ms));
        self.live_tokens(now_ms).saturating_sub(refilling)
    }

    /// In how many ms (at least 1) the lease's reservation, still refilling, lets it spend `cost`;
    /// None when no reservation is refilling or the lease will never hold `cost` (a new call is
    /// needed then).
    fn covered_in(&self, cost: u64, now_ms: u64, sizing: &Sizing) -> Option<u64> {
        let live = self.live_tokens(now_ms);
        if self.vest_until_ms <= now_ms || live < cost {
            return None;
        }
        // Spendable from when at most `live - cost` tokens are still refilling.
        let vesting = self.vesting(sizing);
        let spare_ms = (live - cost)
            .saturating_mul(vesting.period_ms)
            .checked_div(vesting.rate)
            .unwrap_or(0);
        Some(
            self.vest_until_ms
                .saturating_sub(spare_ms)
                .saturating_sub(now_ms)
                .max(1),
        )
    }

    /// How long a request of `cost` is held for tokens the reservation refills (the next ones to
    /// refill: earlier held requests took theirs from `tokens`), if the rule holds requests
    /// (`Sizing::hold_ms`) that long; None: not held. A held request's tokens leave `tokens` at
    /// once and it is let through when they have refilled, as if it spent them then.
    fn held_for(&self, cost: u64, now_ms: u64, sizing: &Sizing) -> Option<u64> {
        if sizing.hold_ms == 0 {
            return None;
        }
        self.covered_in(cost, now_ms, sizing)
            .filter(|&ms| ms <= sizing.hold_ms)
    }

    /// Until when this proxy's reservation refills (ms from now), if it still does: no other lease
    /// call for the key until then, whether tokens are left to spend or held requests took them.
    fn refilling_ms(&self, now_ms: u64, sizing: &Sizing) -> Option<u64> {
        if self.vest_until_ms <= now_ms || now_ms >= self.expires_ms {
            return None;
        }
        // When its next token is spendable, if it holds one; else when the last has refilled.
        self.covered_in(1, now_ms, sizing)
            .or(Some(self.vest_until_ms - now_ms))
    }

    /// Spends tokens for as many of `costs`, in order, as the lease can spend now or, when the
    /// rule holds requests, within its hold (stopping at the first that does not fit); drops its
    /// tokens first if it expired.
    fn spend(&mut self, costs: &[u64], now_ms: u64, sizing: &Sizing) -> Take {
        let mut spendable = self.spendable(now_ms, sizing);
        self.roll(now_ms, sizing.horizon_ms);
        let mut take = Take {
            dropped: self.expire(now_ms),
            spent: Vec::new(),
        };
        for &cost in costs {
            let delay_ms = if spendable >= cost {
                spendable -= cost;
                0
            } else {
                match self.held_for(cost, now_ms, sizing) {
                    // It takes the tokens refilled already first: a later, smaller cost waits
                    // for tokens still to refill, after it.
                    Some(ms) => {
                        spendable = 0;
                        ms
                    }
                    None => break,
                }
            };
            let Some(left) = self.tokens.checked_sub(cost) else {
                break;
            };
            self.tokens = left;
            self.win_demand = self.win_demand.saturating_add(cost);
            self.asked = self.asked.saturating_add(cost);
            take.spent.push(Spent {
                remaining: spendable.saturating_add(self.global_remaining),
                reset_ms: self.reset_at_ms.saturating_sub(now_ms),
                delay_ms,
            });
        }
        self.touched_ms = now_ms;
        self.note_level(now_ms);
        take
    }

    /// The most this proxy can hold of the key now: its live tokens and its workers' batches
    /// (what a lease call reports, so the script counts them against the bucket's capacity).
    pub fn held(&self, now_ms: u64) -> u64 {
        if now_ms < self.expires_ms {
            self.tokens.saturating_add(self.lent)
        } else {
            0
        }
    }

    /// What this proxy has held since its latest grant, as steps a lease call reports: (held at
    /// most, for the last ms), oldest first. Each eighth of what it held after the grant (7/8 down
    /// to 1/8), from when it first held no more; and what it holds now, since the entry was last
    /// touched (what it holds changes only when it is) or since the lease expired. So the script
    /// counts what the proxy spent since the grant out of the bucket's capacity almost as it was
    /// spent, not only from the next call on.
    pub fn report(&self, now_ms: u64) -> Vec<(u64, u64)> {
        if now_ms >= self.expires_ms {
            // A worker may spend from its stash until the tick that drops it, a moment late.
            return vec![(
                0,
                (now_ms - self.expires_ms).saturating_sub(EXPIRED_SLACK_MS),
            )];
        }
        let mut steps = Vec::with_capacity(8);
        for (k, &since) in (1..=7u64).rev().zip(&self.eighths_ms) {
            if since > 0 {
                steps.push((eighths(self.peak, k), now_ms.saturating_sub(since)));
            }
        }
        steps.push((self.held(now_ms), now_ms.saturating_sub(self.touched_ms)));
        steps
    }

    /// Notes when what it holds first fell to each eighth of what it held after the latest grant
    /// (after anything that lowered it).
    fn note_level(&mut self, now_ms: u64) {
        let held = self.held(now_ms);
        for (k, since) in (1..=7u64).rev().zip(self.eighths_ms.iter_mut()) {
            if *since == 0 && held <= eighths(self.peak, k) {
                *since = now_ms.max(1);
            }
        }
    }

    /// Drops the tokens of an expired lease (its workers' batches expired with it; they come
    /// back through [`LeasePool::take_back`]); returns how many. No worker spends them any more,
    /// so the next lease call gives them back.
    fn expire(&mut self, now_ms: u64) -> u64 {
        if now_ms < self.expires_ms {
            return 0;
        }
        if self.lent > 0 {
            // The workers' batches are written off: none of them counts as held from here on.
            self.epoch = self.epoch.saturating_add(1).max(now_ms);
        }
        self.lent = 0;
        let dropped = std::mem::take(&mut self.tokens);
        self.back = self.back.saturating_add(dropped);
        dropped
    }

    /// A worker's previous batch is done: it hands back what it did not spend. Returns the
    /// unspent tokens dropped: all of them once the lease has expired (given back with the next
    /// lease call while the batch still counts as held: its epoch is the lease's), or when the
    /// batch is of an earlier epoch (written off already: the proxy reported holding none of
    /// it, and it may not join a lease granted since).
    fn hand_back(&mut self, back: Back, now_ms: u64) -> u64 {
        if back.is_empty() {
            return 0;
        }
        // What the worker spent of it is demand (the batch counted none when taken), whether or
        // not the lease it came from still stands.
        self.asked = self
            .asked
            .saturating_add(back.batch.saturating_sub(back.unspent));
        if back.epoch != self.epoch {
            return back.unspent;
        }
        self.lent = self.lent.saturating_sub(back.batch);
        let dropped = if now_ms < self.expires_ms {
            self.tokens = self.tokens.saturating_add(back.unspent);
            0
        } else {
            // No worker spends them any more: the next lease call gives them back.
            self.back = self.back.saturating_add(back.unspent);
            back.unspent
        };
        // What it holds changed: the report's last step starts here.
        self.touched_ms = now_ms;
        self.note_level(now_ms);
        dropped
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

    /// Whether the key is saturated here: its latest reservation's lease, at the saturated
    /// lifetime, would still live (a reservation is what a saturated key's calls bring).
    fn saturated(&self, now_ms: u64, sizing: &Sizing) -> bool {
        self.vest_until_ms > 0 && now_ms < self.vest_until_ms.saturating_add(sizing.life_ms(true))
    }

    /// How many tokens a lease call would ask for ([`Sizing::want`]), its demand windows rolled
    /// to `now_ms`. The unmet demand counts in the demand windows it fell in (the current one and
    /// the one before), so it is extrapolated like the rest, from its own rate.
    fn want(&self, waiting: u64, unmet: Unmet, now_ms: u64, sizing: &Sizing) -> u64 {
        let current = unmet.after(self.win_start_ms, now_ms);
        let before = unmet
            .after(self.win_start_ms.saturating_sub(sizing.horizon_ms), now_ms)
            .saturating_sub(current);
        let seen = Lease {
            prev_demand: self.prev_demand.saturating_add(before),
            ..*self
        };
        sizing.want(&seen, waiting, current, now_ms)
    }

    /// Whether a lease call asking for `want` tokens, with `waiting` tokens waiting for it, is
    /// better made as an exact check ([`LeasePool::check_quietly`]): the proxy holds none of the key (so it
    /// has nothing to report or keep), `want` is no more than what the waiting requests need
    /// (no demand beyond them in the current and previous horizon: fewer than about one request
    /// per lease life), and no answer within [`SHORT_MEMORY_HORIZONS`] said the key was short of
    /// them. A key short of tokens is served in turns to its holders (reservations, or racing:
    /// see `engine::lease`), and an exact check would find it empty each time: there the proxy
    /// leases, as a holder waiting its turn.
    fn quiet(&self, want: u64, waiting: u64, now_ms: u64, sizing: &Sizing) -> bool {
        let memory = sizing.horizon_ms.saturating_mul(SHORT_MEMORY_HORIZONS);
        let short = !self.known
            || (self.global_remaining < waiting && now_ms < self.reply_ms.saturating_add(memory));
        self.held(now_ms) == 0 && want <= waiting.min(sizing.burst).max(1) && !short
    }

    /// Whether evicting this entry would lose something: tokens to spend or lent, or a call in
    /// flight.
    fn pinned(&self, now_ms: u64) -> bool {
        self.held(now_ms) > 0 || self.flight_until_ms > now_ms
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
                self.entries.push((key.to_string(), Lease::placed(now_ms)));
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
                *slot = (key.to_string(), Lease::placed(now_ms));
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
    /// 0: spendable now. Else the token is still refilling: the request is held this long, until
    /// the lease's reservation has refilled it ([`Sizing::hold_ms`]).
    pub delay_ms: u64,
}

/// What [`LeasePool::take`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Take {
    /// One entry per cost served, in order (a prefix of the costs asked for).
    pub spent: Vec<Spent>,
    /// Tokens of an expired lease dropped on the way.
    pub dropped: u64,
}

/// What [`LeasePool::take_batch`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Tokens moved out of the pool.
    Batch(Batch),
    /// Too few spendable tokens now; the lease's reservation covers the cost in this many ms.
    Refilling(u64),
    /// The cost is taken from tokens the reservation still refills: the request is held
    /// `delay_ms` (its rule holds requests that long).
    Held(Spent),
    /// Too few tokens, now and later.
    Miss,
    /// The pool has no lease for the key at all.
    Unknown,
}

/// A worker's previous batch of a key, handed back when it takes the next: the batch's size and
/// what of it the worker did not spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Back {
    pub batch: u64,
    pub unspent: u64,
    /// The lease's epoch when the batch was taken ([`Batch::epoch`]).
    pub epoch: u64,
}

impl Back {
    /// Nothing handed back: no batch was out (its epoch says nothing then).
    fn is_empty(&self) -> bool {
        self.batch == 0 && self.unspent == 0
    }
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
    /// The lease's epoch ([`Lease::epoch`]): the batch counts as held until it is handed back
    /// or the lease expires, whichever comes first.
    pub epoch: u64,
}

/// The single lease call for one key on this proxy. It is not `Clone`: whoever holds it must end
/// it with [`LeasePool::deposit`] or [`LeasePool::release`], on every path.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a lease claim must be ended with deposit or release"]
pub struct Claim {
    key: String,
    report: Vec<(u64, u64)>,
    seq: u64,
    life_ms: u64,
    back: u64,
    demand: Option<u64>,
}

impl Claim {
    pub fn key(&self) -> &str {
        &self.key
    }

    /// What this proxy had held of the key when the call was claimed ([`Lease::report`]).
    pub fn report(&self) -> &[(u64, u64)] {
        &self.report
    }

    /// Grows with each claim for the key on this proxy (the clock's ms, or one more than the last
    /// claim's), so the script can tell a late call from a later one; only the latest claim may
    /// deposit, end or renew the flight.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// How long the grant lives after it has refilled ([`Sizing::life_ms`]): the call's holder
    /// record must count it at least that long.
    pub fn life_ms(&self) -> u64 {
        self.life_ms
    }

    /// Granted tokens this proxy dropped unspent since its previous claim for the key, which
    /// no worker will spend: the call gives them back (the script puts back as many as its
    /// record of this proxy still counts as held). A call that brings no answer loses them.
    pub fn back(&self) -> u64 {
        self.back
    }

    /// This proxy's demand for the key since its previous claim, in thousandths of a token per
    /// second (at most [`MAX_DEMAND`]): the tokens it spent (of a worker's batch, what the
    /// worker had spent when it handed the batch back) and those its requests were denied here,
    /// over the time since
    /// that claim. None on the key's first claim since its entry was placed, or when the clock
    /// went back since the previous one: unknown. The
    /// script weighs the proxy's share of the key by it ([`crate::bucket::share`]).
    pub fn demand(&self) -> Option<u64> {
        self.demand
    }
}

/// What one call's reported demand may be at most (the script refuses more).
pub use crate::bucket::MAX_DEMAND;

/// Thousandths of a token per second for `tokens` over `ms` (at least 1 ms), at most
/// [`MAX_DEMAND`].
pub fn demand_rate(tokens: u64, ms: u64) -> u64 {
    let rate = u128::from(tokens) * 1_000_000 / u128::from(ms.max(1));
    u64::try_from(rate).unwrap_or(MAX_DEMAND).min(MAX_DEMAND)
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
    /// This proxy's reservation for the key is still refilling: no call until it has (one
    /// reservation at a time); the waiters' tokens are there in this many ms at the earliest.
    Refilling(u64),
}

/// A lease call's grant, as the script answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grant {
    pub tokens: u64,
    /// The global bucket's remaining tokens after it.
    pub global_remaining: u64,
    /// When the global bucket will be full again.
    pub reset_after_ms: u64,
    /// How long the bucket refills the part of `tokens` it reserved (0: none reserved).
    pub refill_ms: u64,
}

/// What a grant did to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deposit {
    /// Expired tokens dropped (including those of an evicted entry).
    pub dropped: u64,
    pub evicted: u64,
}

/// Tokens a worker's requests were denied locally since its key's last lease call, and since when.
/// They count as demand, spread evenly over that time: a worker denied for a long while (its
/// proxy waiting its turn under saturation) asks for its clients' rate, not for everything they
/// asked since (which a proxy whose turn comes seldom could never spend before its lease expires).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unmet {
    pub tokens: u64,
    /// The first denial's time.
    pub since_ms: u64,
}

impl Unmet {
    /// The part of the unmet tokens that falls after `from_ms`, up to `now_ms`.
    pub fn after(&self, from_ms: u64, now_ms: u64) -> u64 {
        if self.since_ms >= from_ms {
            return self.tokens;
        }
        let span = now_ms.saturating_sub(self.since_ms).max(1);
        let part = now_ms.saturating_sub(from_ms).min(span);
        let share = u128::from(self.tokens) * u128::from(part) / u128::from(span);
        u64::try_from(share).unwrap_or(self.tokens)
    }
}

/// How big a lease to ask for, and how fast a reservation refills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    pub burst: u64,
    pub rate: u64,
    pub period_ms: u64,
    pub lease_max: u64,
    pub horizon_ms: u64,
    /// The rule's `max_wait_ms` (0 for a shadow rule): a request the proxy's reservation covers
    /// within this long is held until it does, instead of refused (0: never held).
    pub hold_ms: u64,
}

impl Sizing {
    /// How long a lease lives after its grant has refilled: [`LIFE_HORIZONS`] horizons, or
    /// [`SATURATED_LIFE_HORIZONS`] on a key saturated here.
    pub fn life_ms(&self, saturated: bool) -> u64 {
        let horizons = if saturated {
            SATURATED_LIFE_HORIZONS
        } else {
            LIFE_HORIZONS
        };
        self.horizon_ms.saturating_mul(horizons)
    }

    /// What the bucket refills over two horizons (at least one token, at most `lease_max`): the
    /// most a proxy reserves when the bucket holds less than it wants. The proxies of a saturated
    /// key so take turns of at most two horizons each, in the order they asked, and the key costs
    /// the fleet one call per reservation.
    pub fn reservation(&self) -> u64 {
        self.refill_in(self.horizon_ms.saturating_mul(2))
            .min(self.lease_max)
            .min(self.burst)
            .max(1)
    }

    /// Tokens the bucket refills in `ms` (rounded up: what a reservation due in `ms` still waits
    /// for).
    pub fn refill_in(&self, ms: u64) -> u64 {
        ms.saturating_mul(self.rate).div_ceil(self.period_ms.max(1))
    }

    /// How long a lease call may wait for its reservation: ten horizons. A proxy whose ask cannot
    /// be refilled within that (a slow key, or many proxies queued on one) is denied instead, and
    /// asks again when it could.
    pub fn max_wait_ms(&self) -> u64 {
        self.horizon_ms.saturating_mul(10)
    }

    /// How many tokens to ask for: about one horizon of this proxy's demand. That is the tokens
    /// asked for here in the previous horizon, or in the current one so far (`waiting`: what the
    /// waiting requests need; `unmet`: what requests denied here since the last call asked for),
    /// extrapolated to a whole horizon once the window is a tenth of a horizon old (by at most
    /// four times, and at most one [`Sizing::reservation`] more: a hot key's first calls take
    /// what the next horizon needs instead of each following the last burst of requests, while a
    /// burst that came at once, say a light key's, is taken as it is). Capped by `lease_max` and
    /// `burst`, and by this proxy's fair share: half of what the global bucket should hold now
    /// (as of the last answer, plus the refill since, less any debt), or one reservation when
    /// that is more (what the bucket lacks is then reserved from its refill). Never below what
    /// the waiters need.
    pub fn want(&self, lease: &Lease, waiting: u64, unmet: u64, now_ms: u64) -> u64 {
        let floor = waiting.min(self.burst).max(1);
        let seen = lease
            .win_demand
            .saturating_add(waiting)
            .saturating_add(unmet);
        let age = now_ms.saturating_sub(lease.win_start_ms);
        let ahead = if age >= self.horizon_ms / 10 {
            seen.saturating_mul(self.horizon_ms)
                .checked_div(age.max(self.horizon_ms / 4))
                .unwrap_or(seen)
                .min(seen.saturating_add(self.reservation()))
        } else {
            seen
        };
        let want = ahead
            .max(lease.prev_demand.saturating_add(waiting))
            .min(self.lease_max)
            .min(self.burst);
        let holds = if lease.known {
            // The bucket is full at reset_at_ms; until then it lacks the refill of the time left.
            let missing = self.refill_in(lease.reset_at_ms.saturating_sub(now_ms));
            self.burst.saturating_sub(missing)
        } else {
            self.burst
        };
        want.min((holds / 2).max(self.reservation())).max(floor)
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
        super::slot_key(self.ns, "lease", hash(key) % SETS)
    }

    /// This proxy's holder id in the script (1 to 2^53 - 1): drawn at random by the first worker
    /// that asks, then the same for every worker of the proxy.
    pub fn holder_id(&self) -> Result<u64, StoreError> {
        let key = super::slot_key(self.ns, "holder", 0);
        update(self.store, &key, |bytes| {
            if let Some(id) = bytes.and_then(|b| read_u64(b, 0)).filter(|&id| id >= 1) {
                return Change::Keep(id);
            }
            let id = (crate::rule::hash::random_seed() >> 11).max(1);
            let mut out = Vec::with_capacity(8);
            write_u64s(&mut out, &[id]);
            Change::Write(out, id)
        })
    }

    /// If this proxy's reservation for `key` is still refilling: when its next token is.
    pub fn refilling(&self, key: &str, now_ms: u64, sizing: &Sizing) -> Option<u64> {
        self.peek(key)?.refilling_ms(now_ms, sizing)
    }

    /// The lease of `key` as stored now, if it has a slot.
    pub fn peek(&self, key: &str) -> Option<Lease> {
        let (value, _) = self.store.get(&self.set_key(key)).ok()?;
        Set::decode(value.as_deref()).find(key).copied()
    }

    /// Spends leased tokens for as many of `costs`, in order, as the lease can spend now
    /// (stopping at the first that does not fit). Writes only when something was spent or
    /// dropped.
    pub fn take(
        &self,
        key: &str,
        costs: &[u64],
        now_ms: u64,
        sizing: &Sizing,
    ) -> Result<Take, StoreError> {
        update(self.store, &self.set_key(key), |bytes| {
            let mut set = Set::decode(bytes);
            let Some(lease) = set.find(key) else {
                return Change::Keep(Take::default());
            };
            let first = costs.first().copied().unwrap_or(u64::MAX);
            if lease.spendable(now_ms, sizing) < first
                && lease.live_tokens(now_ms) > 0
                && lease.held_for(first, now_ms, sizing).is_none()
            {
                return Change::Keep(Take::default());
            }
            let take = lease.spend(costs, now_ms, sizing);
            if take.spent.is_empty() && take.dropped == 0 {
                return Change::Keep(take);
            }
            Change::Write(set.encode(), take)
        })
    }

    /// Moves a batch of at least `cost` spendable tokens out of `key`'s lease: a quarter of what
    /// it can spend (so the proxy's other workers find tokens too), all of it if that is less
    /// than `cost`, or exactly `cost` when `exact` (the worker cannot stash the rest). First takes
    /// `back` the worker's previous batch. Writes only that when it cannot; it then says whether
    /// the lease's reservation covers `cost` later.
    pub fn take_batch(
        &self,
        key: &str,
        cost: u64,
        now_ms: u64,
        sizing: &Sizing,
        (exact, back): (bool, Back),
    ) -> Result<Taken, StoreError> {
        update(self.store, &self.set_key(key), |bytes| {
            let mut set = Set::decode(bytes);
            let Some(lease) = set.find(key) else {
                return Change::Keep(Taken::Unknown);
            };
            let _ = lease.hand_back(back, now_ms);
            let spendable = lease.spendable(now_ms, sizing);
            if spendable < cost && cost > 0 && lease.held_for(cost, now_ms, sizing).is_some() {
                // Held for the reservation's next tokens: exactly the cost, into no stash.
                let take = lease.spend(&[cost], now_ms, sizing);
                if let Some(&spent) = take.spent.first() {
                    return Change::Write(set.encode(), Taken::Held(spent));
                }
            }
            if spendable < cost || cost == 0 {
                let later = lease.covered_in(cost, now_ms, sizing);
                let taken = later.map_or(Taken::Miss, Taken::Refilling);
                if back.is_empty() {
                    return Change::Keep(taken);
                }
                return Change::Write(set.encode(), taken);
            }
            lease.roll(now_ms, sizing.horizon_ms);
            let tokens = if exact {
                cost
            } else {
                (spendable / 4).max(cost)
            };
            lease.tokens -= tokens;
            if exact {
                // Spent at once. A batch for a stash counts as demand only as far as it is
                // spent, when its worker hands it back: counted whole when taken, a quarter of
                // the lease moved at once would be reported as demand (a bigger share, a bigger
                // lease, bigger batches), and what comes back after the next call, or after the
                // lease expired, could no longer be taken off.
                lease.asked = lease.asked.saturating_add(tokens);
            } else {
                lease.lent = lease.lent.saturating_add(tokens);
            }
            lease.win_demand = lease.win_demand.saturating_add(tokens);
            lease.touched_ms = now_ms;
            lease.note_level(now_ms);
            let batch = Batch {
                tokens,
                expires_ms: lease.expires_ms,
                global_remaining: lease.global_remaining,
                reset_at_ms: lease.reset_at_ms,
                dropped: 0,
                epoch: lease.epoch,
            };
            Change::Write(set.encode(), Taken::Batch(batch))
        })
    }

    /// Takes back a worker's batch of `key` whose stash expired; returns the unspent tokens it
    /// dropped (all of them when the key's lease expired too).
    pub fn take_back(&self, key: &str, back: Back, now_ms: u64) -> Result<u64, StoreError> {
        update(self.store, &self.set_key(key), |bytes| {
            let mut set = Set::decode(bytes);
            let Some(lease) = set.find(key) else {
                return Change::Keep(back.unspent);
            };
            let dropped = lease.hand_back(back, now_ms);
            Change::Write(set.encode(), dropped)
        })
    }

    /// Whether the requests waiting for a lease of `key` (`waiting` tokens; `unmet`: tokens
    /// denied here since the last call) are better checked exactly, one call each for its cost
    /// and no holder record in the script: this proxy is quiet on the key ([`Lease::quiet`]; a
    /// key it has never had an answer for is not, so its first request leases). If so, their
    /// tokens count as demand (a second request within a lease's life leases). Writes only then.
    pub fn check_quietly(
        &self,
        key: &str,
        waiting: u64,
        unmet: Unmet,
        now_ms: u64,
        sizing: &Sizing,
    ) -> Result<bool, StoreError> {
        update(self.store, &self.set_key(key), |bytes| {
            let mut set = Set::decode(bytes);
            let Some(lease) = set.find(key) else {
                return Change::Keep(false);
            };
            if lease.flight_until_ms > now_ms || lease.refilling_ms(now_ms, sizing).is_some() {
                return Change::Keep(false);
            }
            lease.roll(now_ms, sizing.horizon_ms);
            let want = lease.want(waiting, unmet, now_ms, sizing);
            if !lease.quiet(want, waiting, now_ms, sizing) {
                return Change::Keep(false);
            }
            lease.win_demand = lease.win_demand.saturating_add(waiting);
            lease.touched_ms = now_ms;
            Change::Write(set.encode(), true)
        })
    }

    /// Claims the single lease call for `key` on this proxy until `until_ms`; says how big a lease
    /// to ask for ([`Sizing::want`]), given the tokens `waiting` for it and those `unmet` here
    /// since the last call.
    #[allow(clippy::too_many_arguments)]
    pub fn begin_flight(
        &self,
        key: &str,
        waiting: u64,
        unmet: Unmet,
        now_ms: u64,
        until_ms: u64,
        sizing: &Sizing,
    ) -> Result<(Flight, u64), StoreError> {
        update(self.store, &self.set_key(key), |bytes| {
            let mut set = Set::decode(bytes);
            // What this proxy has held, and since when.
            // A key with no entry holds nothing now; how long is unknown (the entry may have
            // been let go a moment after its last token was spent).
            let mut report = vec![(0, 0)];
            if let Some(lease) = set.find(key) {
                report = lease.report(now_ms);
                if lease.flight_until_ms > now_ms {
                    return Change::Keep((Flight::Busy, 0));
                }
                if let Some(ms) = lease.refilling_ms(now_ms, sizing) {
                    return Change::Keep((Flight::Refilling(ms), 0));
                }
            }
            let Some((lease, mut placed)) = set.place(key, now_ms) else {
                return Change::Keep((Flight::NoSlot, 0));
            };
            // An expired lease's tokens are dropped now, so this call gives them back.
            placed.dropped = placed.dropped.saturating_add(lease.expire(now_ms));
            lease.roll(now_ms, sizing.horizon_ms);
            let want = lease.want(waiting, unmet, now_ms, sizing);
            // The demand since the previous claim: what was taken, and denied, since then (the
            // waiting requests are this call's, and count in the next one's once spent). None
            // when the clock went back since: no time to measure it over.
            let measured = lease.claimed_ms > 0 && now_ms >= lease.claimed_ms;
            let demand = measured.then(|| {
                let since = unmet.after(lease.claimed_ms, now_ms);
                let tokens = lease.asked.saturating_add(since);
                demand_rate(tokens, now_ms.saturating_sub(lease.claimed_ms))
            });
            lease.claimed_ms = now_ms.max(1);
            lease.asked = 0;
            lease.flight_until_ms = until_ms;
            lease.flight_seq = lease.flight_seq.saturating_add(1).max(now_ms);
            let claim = Claim {
                key: key.to_string(),
                report,
                seq: lease.flight_seq,
                life_ms: sizing.life_ms(lease.saturated(now_ms, sizing)),
                back: std::mem::take(&mut lease.back),
                demand,
            };
            Change::Write(set.encode(), (Flight::Claimed(claim, placed), want))
        })
    }

    /// Ends a flight with a grant: `granted` tokens join the lease, and the requests waiting for
    /// it spend theirs from it at once (`costs`, in order, as far as it can spend now: one shared
    /// write for both). Of the grant, what the global bucket reserved (`refill_ms` > 0: it is
    /// refilling it until `now_ms + refill_ms`) becomes spendable as it refills. The lease lasts
    /// two horizons beyond that.
    pub fn deposit(
        &self,
        claim: Claim,
        grant: &Grant,
        costs: &[u64],
        now_ms: u64,
        sizing: &Sizing,
    ) -> Result<(Deposit, Take), StoreError> {
        let (key, life_ms) = (claim.key, claim.life_ms);
        update(self.store, &self.set_key(&key), |bytes| {
            let mut set = Set::decode(bytes);
            let lost = Deposit {
                dropped: grant.tokens,
                evicted: 0,
            };
            // A later claim was made while this call was out (this one lapsed), or the entry was
            // let go meanwhile: the later call's report does not count this grant, so it is
            // dropped (fewer admissions, never more).
            if set.find(&key).is_none_or(|l| l.flight_seq != claim.seq) {
                return Change::Keep((lost, Take::default()));
            }
            let Some((lease, placed)) = set.place(&key, now_ms) else {
                return Change::Keep((lost, Take::default()));
            };
            let dropped = placed.dropped.saturating_add(lease.expire(now_ms));
            lease.tokens = lease.tokens.saturating_add(grant.tokens);
            // Never earlier than a reservation still refilling (one at a time, but a later end
            // only holds tokens back longer: never spent ahead of the refill). A grant with no
            // reservation in it moves nothing: by this worker's clock its tokens vest now, and a
            // worker whose reading is behind must not count them as refilling.
            if grant.refill_ms > 0 {
                // At the limits it was granted under (`sizing`: the lease call's); with an earlier
                // reservation still refilling, at the faster of the two.
                let granted = (sizing.rate, sizing.period_ms);
                let earlier = (lease.vest_rate, lease.vest_period_ms);
                let faster = u128::from(earlier.0) * u128::from(granted.1)
                    > u128::from(granted.0) * u128::from(earlier.1);
                let (rate, period_ms) = if lease.vest_until_ms > now_ms && faster {
                    earlier
                } else {
                    granted
                };
                (lease.vest_rate, lease.vest_period_ms) = (rate, period_ms);
                lease.vest_until_ms = lease
                    .vest_until_ms
                    .max(now_ms.saturating_add(grant.refill_ms));
            }
            // Never earlier than it was: workers spend the batches they took from it until the
            // expiry they took them with (the script's record of this proxy lasts as long).
            lease.expires_ms = lease
                .expires_ms
                .max(lease.vest_until_ms.max(now_ms).saturating_add(life_ms));
            lease.global_remaining = grant.global_remaining;
            lease.reset_at_ms = now_ms.saturating_add(grant.reset_after_ms);
            lease.flight_until_ms = 0;
            lease.known = true;
            lease.reply_ms = now_ms;
            lease.peak = lease.held(now_ms);
            lease.eighths_ms = [0; 7];
            let take = lease.spend(costs, now_ms, sizing);
            let out = Deposit {
                dropped,
                evicted: placed.evicted,
            };
            Change::Write(set.encode(), (out, take))
        })
    }

    /// Keeps `claim`'s flight until `until_ms` (its call was sent again), if it is still the
    /// latest.
    pub fn renew(&self, claim: &Claim, until_ms: u64) -> Result<(), StoreError> {
        update(self.store, &self.set_key(&claim.key), |bytes| {
            let mut set = Set::decode(bytes);
            let Some(lease) = set.find(&claim.key).filter(|l| l.flight_seq == claim.seq) else {
                return Change::Keep(());
            };
            lease.flight_until_ms = lease.flight_until_ms.max(until_ms);
            Change::Write(set.encode(), ())
        })
    }

    /// Notes that an exact check's answer found `key` short of tokens (`remaining`: what it left,
    /// or 0 for a key under half its burst): this proxy leases it for a while rather than check
    /// it exactly ([`LeasePool::check_quietly`]). Writes only to a key with an entry.
    pub fn note_short(&self, key: &str, remaining: u64, now_ms: u64) -> Result<(), StoreError> {
        update(self.store, &self.set_key(key), |bytes| {
            let mut set = Set::decode(bytes);
            let Some(lease) = set.find(key) else {
                return Change::Keep(());
            };
            lease.global_remaining = remaining;
            lease.known = true;
            lease.reply_ms = now_ms;
            Change::Write(set.encode(), ())
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
            let Some(lease) = set.find(&key).filter(|l| l.flight_seq == claim.seq) else {
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
mod tests;
