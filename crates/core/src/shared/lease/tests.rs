//! The lease pool against an in-memory store with the host's semantics: every token is deposited
//! once and spent once, reservations vest only as the bucket refills, and the table stays bounded.

use super::*;
use crate::bucket::{take_held, Ask, Holder, Holders, Limits, State};
use crate::shared::mem::MemStore;

const SIZING: Sizing = Sizing {
    burst: 100,
    rate: 100,
    period_ms: 1000,
    lease_max: 50,
    horizon_ms: 200,
    hold_ms: 0,
};

/// A deposit of `tokens` with no waiter spending from it.
fn deposit(
    pool: &LeasePool,
    c: Claim,
    (tokens, global_remaining, reset_after_ms, refill_ms): (u64, u64, u64, u64),
    now: u64,
) -> Deposit {
    let grant = Grant {
        tokens,
        global_remaining,
        reset_after_ms,
        refill_ms,
    };
    pool.deposit(c, &grant, &[], now, &SIZING).unwrap().0
}

/// A grant of `tokens` the bucket did not hold: all refilling over `refill_ms`.
fn reserved(tokens: u64, reset_after_ms: u64, refill_ms: u64) -> Grant {
    Grant {
        tokens,
        global_remaining: 0,
        reset_after_ms,
        refill_ms,
    }
}

fn claim(pool: &LeasePool, key: &str, now: u64) -> Claim {
    match pool
        .begin_flight(key, 1, Unmet::default(), now, now + 100, &SIZING)
        .unwrap()
    {
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
    assert_eq!(spent(&pool.take("k", &[1], 0, &SIZING).unwrap()), 0);
    let c = claim(&pool, "k", 0);
    assert_eq!(
        pool.begin_flight("k", 1, Unmet::default(), 1, 50, &SIZING)
            .unwrap()
            .0,
        Flight::Busy,
        "one call per key"
    );
    deposit(&pool, c, (3, 10, 500, 0), 1);
    let t = pool.take("k", &[1, 1, 5], 2, &SIZING).unwrap();
    assert_eq!(spent(&t), 2, "stops at the first cost that does not fit");
    assert_eq!(t.spent[1].remaining, 1 + 10);
    assert_eq!(spent(&pool.take("k", &[1], 3, &SIZING).unwrap()), 1);
    let writes = s.writes();
    assert_eq!(spent(&pool.take("k", &[1], 4, &SIZING).unwrap()), 0);
    assert_eq!(s.writes(), writes, "a miss writes nothing");
}

/// Workers read the clock apart: a worker whose reading is a millisecond behind the one that
/// deposited a grant with no reservation in it must see every token as spendable (at a high
/// rate a millisecond of refill is many tokens, and it used to answer 429s far below the limit).
#[test]
fn a_grant_without_a_reservation_is_spendable_by_a_clock_behind_it() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 1000);
    deposit(&pool, c, (3, 90, 100, 0), 1001);
    assert_eq!(batch(&pool, 1, 1000, true).map(|b| b.tokens), Some(1));
    let t = pool.take("k", &[1, 1], 1000, &SIZING).unwrap();
    assert_eq!(
        spent(&t),
        2,
        "both remaining tokens, by the clock behind too"
    );
    assert!(
        pool.peek("k").is_some_and(|l| l.expires_ms > 1001),
        "the grant still lives two horizons"
    );
}

#[test]
fn a_deposit_serves_the_waiters_in_the_same_write() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 0);
    let writes = s.writes();
    let grant = Grant {
        tokens: 5,
        global_remaining: 10,
        reset_after_ms: 500,
        refill_ms: 0,
    };
    let (_, t) = pool.deposit(c, &grant, &[2, 2, 2], 1, &SIZING).unwrap();
    assert_eq!(
        s.writes(),
        writes + 1,
        "one write for the grant and the waiters"
    );
    assert_eq!(spent(&t), 2, "stops at the first cost that does not fit");
    assert_eq!(t.spent[1].remaining, 1 + 10);
    assert_eq!(
        spent(&pool.take("k", &[1, 1], 2, &SIZING).unwrap()),
        1,
        "one left"
    );
    // A reservation's tokens are not there for the waiters before they refill.
    let c = claim(&pool, "k", 3);
    let (_, t) = pool
        .deposit(c, &reserved(20, 1200, 200), &[1], 3, &SIZING)
        .unwrap();
    assert_eq!(spent(&t), 0, "20 tokens still refilling at 100/s");
}

/// A batch moved out of `k`'s lease at `now`, if any.
fn batch(pool: &LeasePool, cost: u64, now: u64, exact: bool) -> Option<Batch> {
    match pool
        .take_batch("k", cost, now, &SIZING, (exact, Back::default()))
        .unwrap()
    {
        Taken::Batch(b) => Some(b),
        Taken::Refilling(_) | Taken::Miss | Taken::Unknown | Taken::Held(_) => None,
    }
}

#[test]
fn batches_move_a_quarter_and_never_more_than_is_there() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    assert_eq!(batch(&pool, 1, 0, false), None);
    let c = claim(&pool, "k", 0);
    deposit(&pool, c, (10, 7, 500, 0), 0);
    let b = batch(&pool, 1, 1, false).unwrap();
    assert_eq!((b.tokens, b.expires_ms, b.global_remaining), (2, 400, 7));
    assert_eq!(batch(&pool, 3, 1, true).unwrap().tokens, 3);
    assert_eq!(batch(&pool, 6, 1, false), None, "5 left");
    assert_eq!(batch(&pool, 5, 1, false).unwrap().tokens, 5);
    assert_eq!(pool.peek("k").unwrap().tokens, 0);
}

#[test]
fn leases_expire_after_two_horizons() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 0);
    deposit(&pool, c, (5, 10, 500, 0), 0);
    assert_eq!(spent(&pool.take("k", &[1], 399, &SIZING).unwrap()), 1);
    let t = pool.take("k", &[1], 400, &SIZING).unwrap();
    assert_eq!(
        (spent(&t), t.dropped),
        (0, 4),
        "the expired tokens are counted when dropped"
    );
    let c = claim(&pool, "k", 401);
    deposit(&pool, c, (5, 10, 500, 0), 402);
    assert_eq!(pool.peek("k").unwrap().expires_ms, 802);
    let (flight, _) = pool
        .begin_flight("k", 1, Unmet::default(), 900, 1000, &SIZING)
        .unwrap();
    let Flight::Claimed(c, placed) = flight else {
        panic!("{flight:?}");
    };
    assert_eq!(placed.dropped, 5, "or when the next call is claimed");
    let d = deposit(&pool, c, (1, 10, 500, 0), 901);
    assert_eq!(d.dropped, 0, "once");
}

/// Tokens a proxy dropped unspent go back to the bucket with its next lease call, each once:
/// those of an expired lease, and a worker's batch handed back after it.
#[test]
fn the_next_call_gives_back_what_expired_unspent() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 0);
    assert_eq!(c.back(), 0, "nothing dropped yet");
    deposit(&pool, c, (8, 10, 500, 0), 0);
    let b = batch(&pool, 1, 1, false).unwrap();
    assert_eq!(b.tokens, 2, "a quarter goes to a worker, 6 stay");
    // The lease expires at 400: the worker hands its batch back unspent after that.
    let back = Back {
        batch: 2,
        unspent: 2,
        ..Back::default()
    };
    assert_eq!(pool.take_back("k", back, 450).unwrap(), 2);
    let c = claim(&pool, "k", 500);
    assert_eq!(c.back(), 6 + 2, "the pool's 6 and the worker's 2");
    deposit(&pool, c, (3, 10, 500, 0), 501);
    let c = claim(&pool, "k", 502);
    assert_eq!(c.back(), 0, "given back once");
    // A call that brings no answer loses what it carried (fewer tokens, never more).
    pool.release(c, None, 503).unwrap();
    let c = claim(&pool, "k", 2000);
    assert_eq!(c.back(), 3, "the second grant, expired unspent");
    deposit(&pool, c, (0, 10, 500, 0), 2001);
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
        deposit(&pool, c, (5, 10, 500, 0), 1);
    }
    let newcomer = &keys[WAYS];
    assert_eq!(
        pool.begin_flight(newcomer, 1, Unmet::default(), 2, 100, &SIZING)
            .unwrap()
            .0,
        Flight::NoSlot
    );
    for k in keys.iter().take(WAYS) {
        assert_eq!(
            spent(&pool.take(k, &[5], 3, &SIZING).unwrap()),
            1,
            "{k} kept its lease"
        );
    }
    // Spent out, the ways are free again: the least recently touched one goes.
    match pool
        .begin_flight(newcomer, 1, Unmet::default(), 4, 100, &SIZING)
        .unwrap()
        .0
    {
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
        deposit(&pool, c, (2, 10, 500, 0), 0);
    }
    match pool
        .begin_flight(&keys[WAYS], 1, Unmet::default(), 500, 600, &SIZING)
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
            let d = deposit(&pool, c, (3, 10, 500, 0), 501);
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
    deposit(&pool, c, (10, 0, 500, 0), 0);
    let mut admitted = 0;
    for i in 0..40 {
        s.inject_conflicts.set(i % 3);
        admitted += spent(&pool.take("k", &[1], 1, &SIZING).unwrap_or_default());
    }
    assert_eq!(admitted, 10);
}

#[test]
fn lease_size_follows_demand_and_is_capped_by_a_fair_share() {
    assert_eq!(SIZING.reservation(), 40, "two horizons of refill at 100/s");
    let mut l = Lease::default();
    assert_eq!(SIZING.want(&l, 1, 0, 0), 1, "no history: what waits");
    l.win_demand = 30;
    assert_eq!(SIZING.want(&l, 2, 0, 0), 32);
    assert_eq!(SIZING.want(&l, 2, 9, 0), 41, "requests denied here count");
    l.prev_demand = 500;
    assert_eq!(SIZING.want(&l, 2, 0, 0), 50, "lease_max caps");
    l.known = true;
    l.reset_at_ms = 800; // the bucket lacks 80 of its 100 at 0
    assert_eq!(
        SIZING.want(&l, 2, 0, 0),
        40,
        "a low bucket: one reservation (the bucket's 20 and 20 of its refill)"
    );
    l.reset_at_ms = 1500;
    assert_eq!(SIZING.want(&l, 2, 0, 0), 40, "in debt: one reservation");
    assert_eq!(SIZING.want(&l, 60, 0, 0), 60, "never below what waits");
    l.reset_at_ms = 0;
    l.win_demand = 4;
    l.prev_demand = 0;
    assert_eq!(
        SIZING.want(&l, 1, 0, 0),
        5,
        "a light key takes what it needs"
    );
    let big = Sizing {
        lease_max: 100,
        ..SIZING
    };
    l.prev_demand = 500;
    assert_eq!(big.want(&l, 1, 0, 0), 50, "a full bucket: half of it");
}

#[test]
fn a_young_window_is_extrapolated_once_it_has_seen_a_tenth_of_a_horizon() {
    let l = Lease {
        win_demand: 10,
        ..Lease::default()
    };
    assert_eq!(SIZING.want(&l, 0, 0, 19), 10, "a burst at once: as it is");
    assert_eq!(SIZING.want(&l, 0, 0, 20), 40, "four times at most");
    assert_eq!(SIZING.want(&l, 0, 0, 100), 20, "10 in 100 ms: 20 in 200");
    assert_eq!(SIZING.want(&l, 0, 0, 200), 10);
    let more = Lease {
        win_demand: 40,
        ..Lease::default()
    };
    assert_eq!(
        SIZING.want(&more, 0, 0, 50),
        50,
        "by one reservation at most, then lease_max"
    );
}

/// A lease call reports how what the proxy holds fell since its grant: each eighth of it
/// from when it first held no more, then what it holds now since the entry was last touched;
/// after the lease expired, nothing since then.
/// Only the latest claim of a key deposits, ends or renews its flight: a call whose claim
/// lapsed (and a later one was made) has its grant dropped, since the later call's report
/// does not count it.
#[test]
fn only_the_latest_claim_deposits() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let first = claim(&pool, "k", 0);
    pool.renew(&first, 500).unwrap();
    assert_eq!(
        pool.begin_flight("k", 1, Unmet::default(), 200, 300, &SIZING)
            .unwrap()
            .0,
        Flight::Busy,
        "renewed: still out at 200"
    );
    let second = claim(&pool, "k", 600);
    assert!(second.seq() > first.seq());
    assert_eq!(deposit(&pool, first, (5, 0, 50, 0), 601).dropped, 5);
    assert_eq!(pool.peek("k").unwrap().tokens, 0);
    assert!(
        pool.peek("k").unwrap().flight_until_ms > 601,
        "the later flight stays"
    );
    assert_eq!(deposit(&pool, second, (5, 0, 50, 0), 602).dropped, 0);
    assert_eq!(pool.peek("k").unwrap().tokens, 5);
}

#[test]
fn the_report_steps_down_as_the_lease_is_spent() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 0);
    assert_eq!(
        c.report(),
        [(0, 0)],
        "a key with no entry: nothing now, nothing more"
    );
    deposit(&pool, c, (80, 0, 800, 0), 0);
    pool.take("k", &[40], 50, &SIZING).unwrap();
    pool.take("k", &[30], 150, &SIZING).unwrap();
    let lease = pool.peek("k").unwrap();
    assert_eq!(
        lease.report(200),
        [
            (70, 150),
            (60, 150),
            (50, 150),
            (40, 150),
            (30, 50),
            (20, 50),
            (10, 50),
            (10, 50)
        ]
    );
    assert_eq!(
        lease.report(lease.expires_ms + 5),
        [(0, 0)],
        "a stash may spend late"
    );
    assert_eq!(lease.report(lease.expires_ms + 1500), [(0, 1400)]);
}

#[test]
fn a_reservation_is_spent_only_as_the_bucket_refills_it() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 0);
    // 30 granted: the 10 the bucket held, and 20 it refills over the next 200 ms.
    deposit(&pool, c, (30, 0, 1200, 200), 0);
    let l = pool.peek("k").unwrap();
    assert_eq!((l.vest_until_ms, l.expires_ms), (200, 600));
    assert_eq!(l.spendable(0, &SIZING), 10);
    assert_eq!(l.spendable(100, &SIZING), 20);
    assert_eq!(l.spendable(200, &SIZING), 30);
    let mut taken = 0;
    for now in 0..=200 {
        taken += spent(&pool.take("k", &[1, 1, 1, 1, 1, 1], now, &SIZING).unwrap());
        assert!(
            taken as u64 <= 10 + now / 10,
            "{taken} spent by {now} ms: more than held + refilled"
        );
        if now == 0 {
            assert_eq!(taken, 6);
            assert_eq!(batch(&pool, 5, 0, false), None, "4 left now");
            assert_eq!(
                pool.take_batch("k", 5, 0, &SIZING, (false, Back::default()))
                    .unwrap(),
                Taken::Refilling(10),
                "the fifth in 10 ms"
            );
            assert_eq!(
                pool.begin_flight("k", 1, Unmet::default(), 0, 100, &SIZING)
                    .unwrap()
                    .0,
                Flight::Refilling(1),
                "no second call while it refills"
            );
        }
    }
    assert_eq!(taken, 30, "all of it by the time it has refilled");
    let c = claim(&pool, "k", 201);
    pool.release(c, None, 202).unwrap();
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

/// Requests denied here count at their own rate: 100 tokens denied over the last second are 20
/// in its last 200 ms, not 100 (a proxy waiting its turn on a saturated key asked for all of
/// them in one lease, more than it could spend before the lease expired).
#[test]
fn unmet_demand_counts_in_the_windows_it_fell_in() {
    let u = Unmet {
        tokens: 100,
        since_ms: 0,
    };
    assert_eq!(u.after(0, 1000), 100, "all of it since it began");
    assert_eq!(u.after(800, 1000), 20, "a fifth of its time: a fifth of it");
    assert_eq!(u.after(1000, 1000), 0);
    let recent = Unmet {
        tokens: 7,
        since_ms: 900,
    };
    assert_eq!(recent.after(800, 1000), 7, "all of it in the window");
    // In a lease call at 1000 whose demand window starts then: the horizon before it saw 20 of
    // them, so the lease is one horizon of that rate and the waiter (it was lease_max, 50).
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let _ = claim(&pool, "k", 600);
    let (_, want) = pool.begin_flight("k", 1, u, 1000, 1100, &SIZING).unwrap();
    assert_eq!(want, 21);
}

/// The rule holds requests up to 300 ms (`max_wait_ms`).
const HOLDING: Sizing = Sizing {
    hold_ms: 300,
    ..SIZING
};

/// A reservation of 20 tokens deposited at 0 for `k`, refilled at 100/s until 200 (nothing
/// spendable before 10 ms).
fn reserved_20(pool: &LeasePool) {
    let c = claim(pool, "k", 0);
    deposit(pool, c, (20, 0, 1200, 200), 0);
}

#[test]
fn a_held_request_takes_the_next_token_to_refill_and_waits_for_it() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    reserved_20(&pool);
    let held = |pool: &LeasePool, now| match pool
        .take_batch("k", 1, now, &HOLDING, (false, Back::default()))
        .unwrap()
    {
        Taken::Held(spent) => Some(spent.delay_ms),
        _ => None,
    };
    assert_eq!(held(&pool, 0), Some(10), "the first token refills at 10 ms");
    assert_eq!(held(&pool, 0), Some(20), "the next one, 10 ms later");
    assert_eq!(
        pool.peek("k").unwrap().tokens,
        18,
        "taken at once, into no stash"
    );
    assert_eq!(pool.peek("k").unwrap().lent, 0);
    // 18 left: the last refills at 200, more than 300 ms away only for a 31st token.
    for _ in 0..18 {
        assert!(held(&pool, 0).is_some_and(|ms| ms <= 200));
    }
    assert_eq!(held(&pool, 0), None, "the reservation is all taken");
    // Without max_wait_ms nothing is held: the request is told when a token is there.
    let plain = MemStore::default();
    let pool = LeasePool::new(&plain, "ns");
    reserved_20(&pool);
    assert_eq!(
        pool.take_batch("k", 1, 0, &SIZING, (false, Back::default())),
        Ok(Taken::Refilling(10))
    );
}

/// A reservation vests at the refill it was granted under, whatever the limits of the request that
/// spends it: granted at 100/s, 20 tokens are 10 spendable 100 ms before the end to a request of a
/// slower tier too (not 19); granted at 10/s, the one token still refilling 100 ms before the end
/// leaves 19 to a faster tier's request too (not 10).
#[test]
fn a_reservation_vests_at_the_refill_it_was_granted_under() {
    let slow = Sizing { rate: 10, ..SIZING };
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    reserved_20(&pool);
    assert_eq!(pool.peek("k").unwrap().spendable(100, &slow), 10);
    assert_eq!(pool.peek("k").unwrap().spendable(100, &SIZING), 10);
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 0);
    pool.deposit(c, &reserved(20, 2000, 200), &[], 0, &slow)
        .unwrap();
    assert_eq!(pool.peek("k").unwrap().spendable(100, &SIZING), 19);
    assert_eq!(pool.peek("k").unwrap().spendable(100, &slow), 19);
}

/// A held request takes the tokens refilled already before later ones refill: a smaller cost
/// after it is held too, never admitted from tokens the held one took (which would spend ahead of
/// the refill, and past zero).
#[test]
fn after_a_held_request_a_smaller_one_waits_its_turn() {
    for (costs, want) in [
        (&[20, 10][..], vec![100]),
        (&[15, 5][..], vec![50, 100]),
        (&[15, 10][..], vec![50]),
    ] {
        let s = MemStore::default();
        let pool = LeasePool::new(&s, "ns");
        reserved_20(&pool);
        // At 100 ms, 10 of the 20 have refilled.
        let t = pool.take("k", costs, 100, &HOLDING).unwrap();
        let delays: Vec<u64> = t.spent.iter().map(|s| s.delay_ms).collect();
        assert_eq!(delays, want, "{costs:?}");
        let taken: u64 = costs.iter().take(want.len()).sum();
        assert_eq!(pool.peek("k").unwrap().tokens, 20 - taken, "{costs:?}");
    }
}

#[test]
fn a_request_is_held_only_as_long_as_the_rule_lets_it_wait() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 0);
    // 50 tokens refilled at 100/s until 500: the first is there at 10 ms, the 31st at 310.
    deposit(&pool, c, (50, 0, 1500, 500), 0);
    let t = pool.take("k", &[1; 40], 0, &HOLDING).unwrap();
    assert_eq!(t.spent.len(), 30, "held up to 300 ms");
    assert_eq!(t.spent.last().map(|s| s.delay_ms), Some(300));
    assert!(t.spent.windows(2).all(|w| w[0].delay_ms < w[1].delay_ms));
}

#[test]
fn no_second_call_while_the_reservation_refills_even_once_held_requests_took_it_all() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    reserved_20(&pool);
    let t = pool.take("k", &[1; 20], 0, &HOLDING).unwrap();
    assert_eq!(t.spent.len(), 20);
    assert_eq!(pool.peek("k").unwrap().tokens, 0);
    // One reservation at a time: a proxy that chained them could hold more than its share.
    match pool.begin_flight("k", 1, Unmet::default(), 50, 150, &HOLDING) {
        Ok((Flight::Refilling(ms), _)) => assert_eq!(ms, 150, "until the last has refilled"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        pool.begin_flight("k", 1, Unmet::default(), 200, 300, &HOLDING),
        Ok((Flight::Claimed(..), _))
    ));
}

#[test]
fn a_saturated_key_s_lease_lives_longer_after_its_reservation_has_refilled() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 0);
    assert_eq!(c.life_ms(), 400, "never reserved here: two horizons");
    deposit(&pool, c, (20, 0, 1200, 200), 0);
    assert_eq!(pool.peek("k").unwrap().expires_ms, 600);
    // The next call comes after the reservation has refilled: the key is saturated here.
    let c = claim(&pool, "k", 300);
    assert_eq!(c.life_ms(), 1200, "six horizons");
    deposit(&pool, c, (20, 0, 1200, 200), 300);
    assert_eq!(pool.peek("k").unwrap().expires_ms, 500 + 1200);
    // Long after that lease would have expired, a call is back to two horizons.
    let c = claim(&pool, "k", 500 + 1200);
    assert_eq!(c.life_ms(), 400);
}

/// The fleet's admissions against the script's model: a proxy (this pool, two workers) and an
/// exact caller share a bucket of 10 at 100 a second. A worker's batch expires with the lease at
/// 400, but its worker hands it back (4 unspent) only at `back_at`, after the first lease call
/// since the expiry (at 450, whose report already said the proxy held nothing since then). Its
/// tokens are off the record then, and the bucket's refill has had their room: they must be
/// neither given back with the next call nor put back in the renewed lease (the grant of the
/// call at 450 lands at 470). Returns every admission's time (ms).
fn fleet_with_a_batch_handed_back_late(back_at: u64) -> (Limits, Vec<u64>) {
    let l = Limits {
        burst: 10,
        rate: 100,
        period_ms: 1000,
    };
    let mut state: Option<State> = None;
    let mut holders = Holders::default();
    let mut admitted: Vec<u64> = Vec::new();
    // One lease call through the model: the claim's report, seq and back, as the engine sends.
    let call = |state: &mut Option<State>, holders: &mut Holders, c: &Claim, want, now: u64| {
        let ask = Ask {
            cost: 1,
            lease_want: want,
            holder: Some(Holder::new(7, c.seq(), 500, c.report()).giving_back(c.back())),
            ..Ask::default()
        };
        let (next, r) = take_held(*state, holders, &l, &ask, now * 1000);
        *state = next;
        r.granted
    };
    let exact = |state: &mut Option<State>, holders: &mut Holders, now: u64| {
        let mut n = 0;
        loop {
            let ask = Ask {
                cost: 1,
                ..Ask::default()
            };
            let (next, r) = take_held(*state, holders, &l, &ask, now * 1000);
            *state = next;
            if !r.allowed {
                return n;
            }
            n += 1;
        }
    };
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    // 0: the proxy takes the whole bucket; a worker moves 5 into its stash and spends 1.
    let c = claim(&pool, "k", 0);
    let g = call(&mut state, &mut holders, &c, 10, 0);
    assert_eq!(g, 10);
    deposit(&pool, c, (g, 0, 100, 0), 0);
    let b = pool
        .take_batch("k", 5, 1, &SIZING, (false, Back::default()))
        .unwrap();
    assert!(matches!(b, Taken::Batch(Batch { tokens: 5, .. })), "{b:?}");
    admitted.push(1);
    // The lease expires at 400. At 450 another worker calls: it gives back the pool's 5 and
    // reports holding nothing since the expiry; the bucket grants it 4.
    let c = claim(&pool, "k", 450);
    assert_eq!(c.back(), 5);
    let g = call(&mut state, &mut holders, &c, 4, 450);
    assert_eq!(g, 4);
    // The first worker's tick hands back its expired batch (4 unspent); 470: the grant lands.
    let late = Back {
        batch: 5,
        unspent: 4,
        ..Back::default()
    };
    if back_at < 470 {
        pool.take_back("k", late, back_at).unwrap();
    }
    deposit(&pool, c, (g, 0, 100, 0), 470);
    if back_at >= 470 {
        pool.take_back("k", late, back_at).unwrap();
    }
    // 840: the bucket has refilled all it can (10 less the 4 on lease); an exact caller takes it.
    let n = exact(&mut state, &mut holders, 840);
    admitted.extend(std::iter::repeat_n(840, n));
    // 845: the proxy spends its 4; 850: its next call, then the exact caller again.
    let t = pool.take("k", &[1; 8], 845, &SIZING).unwrap();
    admitted.extend(std::iter::repeat_n(845, spent(&t)));
    let c = claim(&pool, "k", 850);
    let g = call(&mut state, &mut holders, &c, 1, 850);
    admitted.extend(std::iter::repeat_n(850, usize::try_from(g).unwrap()));
    let n = exact(&mut state, &mut holders, 850);
    admitted.extend(std::iter::repeat_n(850, n));
    pool.release(c, None, 851).unwrap();
    (l, admitted)
}

/// Every window [from, to] of admissions: at most burst + the refill in it (rounded up).
fn assert_never_over(l: &Limits, admitted: &[u64]) {
    for (i, &from) in admitted.iter().enumerate() {
        for (j, &to) in admitted.iter().enumerate().skip(i) {
            let count = (j - i + 1) as u64;
            let bound = l.burst + ((to - from) * l.rate).div_ceil(l.period_ms);
            assert!(
                count <= bound,
                "{count} admitted in [{from}, {to}] ms, bound {bound}: {admitted:?}"
            );
        }
    }
}

#[test]
fn a_batch_handed_back_after_the_call_that_reported_its_lease_expired_is_not_given_back() {
    let (l, admitted) = fleet_with_a_batch_handed_back_late(460);
    assert_never_over(&l, &admitted);
}

#[test]
fn a_batch_of_an_expired_lease_never_joins_the_renewed_one() {
    let (l, admitted) = fleet_with_a_batch_handed_back_late(480);
    assert_never_over(&l, &admitted);
}

/// A worker spends its batch until the expiry the batch was taken with. A later grant on a key
/// no longer saturated lives two horizons, not six: the lease must not end before the batches
/// taken from it, or the next call reports holding nothing while a worker still spends them.
#[test]
fn a_grant_never_ends_the_lease_before_a_batch_taken_from_it() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    // 0: a reservation refilling until 100.
    let c = claim(&pool, "k", 0);
    deposit(&pool, c, (10, 0, 500, 100), 0);
    // 600: the key is saturated here (its reservation refilled less than six horizons ago): the
    // grant lives six horizons, to 1800; a worker takes a batch with that expiry.
    let c = claim(&pool, "k", 600);
    assert_eq!(c.life_ms(), SIZING.life_ms(true));
    deposit(&pool, c, (20, 0, 500, 0), 600);
    let b = batch(&pool, 5, 650, false).unwrap();
    assert_eq!(b.expires_ms, 1800);
    // 1300: no longer saturated; a grant of two horizons.
    let c = claim(&pool, "k", 1300);
    assert_eq!(c.life_ms(), SIZING.life_ms(false));
    deposit(&pool, c, (1, 0, 500, 0), 1300);
    // 1750: the worker may still spend its batch; the call must report it as held.
    let c = claim(&pool, "k", 1750);
    let held_now = c.report().last().map_or(0, |&(held, _)| held);
    assert!(
        held_now >= b.tokens,
        "reports holding {held_now} while a batch of {} lives until {}: {:?}",
        b.tokens,
        b.expires_ms,
        c.report()
    );
    pool.release(c, None, 1751).unwrap();
}

/// A key's entry evicted while a worker's batch of it is out (the lease expired, the batch not
/// handed back yet) comes back as a new entry whose first call reports holding nothing: the old
/// batch is off the record then, and must not join the new entry's lease when it comes back.
#[test]
fn a_batch_of_an_evicted_entry_never_joins_the_key_s_new_lease() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let keys = same_set_keys(&pool, 6);
    let claim_of = |key: &str, now: u64| match pool
        .begin_flight(key, 1, Unmet::default(), now, now + 100, &SIZING)
        .unwrap()
    {
        (Flight::Claimed(c, _), _) => c,
        other => panic!("{key}: {other:?}"),
    };
    let k = keys[0].as_str();
    let c = claim_of(k, 0);
    deposit(&pool, c, (10, 0, 500, 0), 0);
    let Taken::Batch(b) = pool
        .take_batch(k, 5, 1, &SIZING, (false, Back::default()))
        .unwrap()
    else {
        panic!("no batch");
    };
    // 450: k's lease has expired (at 400), its batch still out. Three keys holding tokens and
    // a fourth that only asked fill the set: the fourth evicts k.
    for other in &keys[1..4] {
        let c = claim_of(other, 450);
        deposit(&pool, c, (3, 0, 500, 0), 450);
    }
    let c = claim_of(&keys[4], 450);
    pool.release(c, None, 451).unwrap();
    assert!(pool.peek(k).is_none(), "k evicted");
    // 460: k is back (evicting the fourth); its call reports holding nothing; 470: a grant of 4.
    let c = claim_of(k, 460);
    assert_eq!(c.report(), [(0, 0)]);
    deposit(&pool, c, (4, 0, 500, 0), 470);
    // 480: the old batch comes back, 4 unspent.
    let back = Back {
        batch: b.tokens,
        unspent: 4,
        epoch: b.epoch,
    };
    assert_eq!(pool.take_back(k, back, 480).unwrap(), 4, "dropped");
    assert_eq!(pool.peek(k).unwrap().tokens, 4, "only the new grant");
}

/// A lease call reports the proxy's demand since its previous call: what it spent (a worker's
/// batch as far as it was spent when handed back) and what its requests were denied here, over
/// the time since that call (thousandths of a token per second). The first call of an entry
/// knows no previous one: none.
#[test]
fn a_call_reports_the_demand_since_the_previous_one() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 1000);
    assert_eq!(c.demand(), None, "no previous call");
    // The waiting request spends its token from the grant: it counts toward the next call.
    let grant = Grant {
        tokens: 20,
        global_remaining: 50,
        reset_after_ms: 500,
        refill_ms: 0,
    };
    pool.deposit(c, &grant, &[1], 1001, &SIZING).unwrap();
    // A worker takes a batch of 4 (a quarter of 19) and hands 1 back unspent; another spends 2.
    let b = batch(&pool, 1, 1100, false).unwrap();
    assert_eq!(b.tokens, 4);
    let back = Back {
        batch: 4,
        unspent: 1,
        epoch: b.epoch,
    };
    pool.take_back("k", back, 1150).unwrap();
    assert_eq!(spent(&pool.take("k", &[1, 1], 1200, &SIZING).unwrap()), 2);
    // 1 + 3 + 2 = 6 tokens taken, and 2 denied here since 1400: 8 in 500 ms, 16 a second.
    let unmet = Unmet {
        tokens: 2,
        since_ms: 1400,
    };
    let (flight, _) = pool
        .begin_flight("k", 1, unmet, 1500, 1600, &SIZING)
        .unwrap();
    let Flight::Claimed(c, _) = flight else {
        panic!("{flight:?}");
    };
    assert_eq!(c.demand(), Some(16_000));
    pool.release(c, None, 1501).unwrap();
    // Nothing since: a demand of 0. A long-quiet proxy reports a small one.
    let c = claim(&pool, "k", 3500);
    assert_eq!(c.demand(), Some(0));
    pool.release(c, None, 3501).unwrap();
    assert_eq!(spent(&pool.take("k", &[1], 3600, &SIZING).unwrap()), 0);
    assert_eq!(demand_rate(1, 5000), 200, "one token in 5 s");
    assert_eq!(
        demand_rate(u64::MAX, 1),
        MAX_DEMAND,
        "never past what the script takes"
    );
}

/// The demand a call reports is what the proxy spent (and was denied), not what its workers moved
/// into their stashes: a batch is a quarter of the lease taken at once, and counting it whole
/// would report a proxy that spent two tokens in a second as spending seventeen (a bigger
/// share, a bigger lease, bigger batches: the report would feed on itself). A batch's spent
/// tokens count when the worker hands it back, even after the lease it came from expired.
#[test]
fn a_call_reports_what_was_spent_not_what_workers_stashed() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 0);
    deposit(&pool, c, (40, 60, 500, 0), 0);
    // Two workers each take a batch (10, then 7) and spend one token of it.
    let a = batch(&pool, 1, 10, false).unwrap();
    let b = batch(&pool, 1, 10, false).unwrap();
    assert_eq!((a.tokens, b.tokens), (10, 7));
    // A second on (the lease expired at 400): two tokens spent in a second, 2 a second.
    let c = claim(&pool, "k", 1000);
    assert_eq!(
        c.demand(),
        Some(0),
        "nothing handed back yet: nothing known spent"
    );
    pool.release(c, None, 1001).unwrap();
    // The workers hand their batches back (written off with the expired lease): one token of
    // each was spent, which the next call reports.
    for (x, tokens) in [(a, 10), (b, 7)] {
        let back = Back {
            batch: tokens,
            unspent: tokens - 1,
            epoch: x.epoch,
        };
        pool.take_back("k", back, 1100).unwrap();
    }
    let c = claim(&pool, "k", 2000);
    assert_eq!(c.demand(), Some(2_000), "2 tokens in 1 s");
}

/// A clock that went back since the previous claim (the host's wall clock, stepped back) gives
/// no time to measure a demand over: the call reports none (the equal share), not its tokens as
/// if spent in a millisecond (a thousand times their count a second, up to the most there is).
#[test]
fn a_clock_gone_back_reports_no_demand() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let c = claim(&pool, "k", 5000);
    deposit(&pool, c, (20, 60, 500, 0), 5000);
    assert_eq!(
        spent(&pool.take("k", &[1, 1, 1], 5001, &SIZING).unwrap()),
        3
    );
    let c = claim(&pool, "k", 3000);
    assert_eq!(c.demand(), None);
}

/// A proxy is quiet on a key only while it holds none of it, has no demand beyond the waiting
/// request in the current and previous horizon, and no answer lately said the key was short.
#[test]
fn a_proxy_is_quiet_on_a_key_it_holds_none_of_and_seldom_asks_for() {
    let s = MemStore::default();
    let pool = LeasePool::new(&s, "ns");
    let quiet = |now| {
        pool.check_quietly("k", 1, Unmet::default(), now, &SIZING)
            .unwrap()
    };
    assert!(!quiet(0), "nothing known of the key: lease");
    let c = claim(&pool, "k", 0);
    deposit(&pool, c, (3, 50, 500, 0), 1);
    assert!(!quiet(100), "it holds tokens");
    assert_eq!(spent(&pool.take("k", &[1, 1, 1], 100, &SIZING).unwrap()), 3);
    assert!(!quiet(300), "three requests in the previous horizon");
    assert!(quiet(2000), "none for two horizons");
    assert!(!quiet(2001), "a second request at once");
    assert!(quiet(5000));
    pool.note_short("k", 0, 5000).unwrap();
    let memory = SIZING.horizon_ms * SHORT_MEMORY_HORIZONS;
    assert!(!quiet(5000 + memory - 1), "short of tokens lately");
    assert!(quiet(5000 + memory));
    assert!(
        !quiet_with_unmet(&pool, 2 * 5000 + memory),
        "denied here since the last call"
    );
}

fn quiet_with_unmet(pool: &LeasePool, now: u64) -> bool {
    let unmet = Unmet {
        tokens: 3,
        since_ms: now - 10,
    };
    pool.check_quietly("k", 1, unmet, now, &SIZING).unwrap()
}

/// A peak as large as a stored entry can say (shared data is the workers' and older modules'
/// writing) still reports its eighths exactly, never a product that wrapped.
#[test]
fn the_eighths_of_any_peak_are_reported_exactly() {
    let lease = Lease {
        peak: u64::MAX / 4,
        eighths_ms: [1; 7],
        expires_ms: 100,
        ..Lease::default()
    };
    let steps = lease.report(10);
    assert_eq!(steps.first().map(|s| s.0), Some(u64::MAX / 4 / 8 * 7 + 6));
    assert_eq!(steps.get(6).map(|s| s.0), Some(u64::MAX / 4 / 8));
}
