//! `tollgate_core::bucket::take_batch` is the model of the script's batched form: on random
//! batches over a few keys (a key often twice, lease holders, reservations, settlements,
//! penalties, resets and credits, refused groups), the replies, every key's stored hash, holders
//! and offences, and its PTTL agree bit for bit.

use super::{expiry_ms, harness, lim, Harness, Rng, T0};
use redis::Value;
use std::num::NonZeroU64;
use tollgate_core::bucket::{
    batch_integers, take_batch, Ask, Group, GroupError, Holder, Limits, Operation, Penalty, Stamp,
    Stored, Tracked,
};

const KEYS: usize = 4;
const BATCHES: usize = 600;
/// Past what the script reads exactly: it reads 2^53 + 1 as 2^53 (a double), so 2^53 + 2.
const TOO_BIG: u64 = (1 << 53) + 2;

/// A group's single-form arguments (ARGV[1..c], c = 8 or 9).
fn arguments(g: &Group, rng: &mut Rng) -> Vec<String> {
    let lease = match (g.op, g.ask.holder) {
        (Some(op), _) => op.argument(),
        (None, Some(h)) => {
            let mut lease = format!("{}:{}:{}:{}", g.ask.lease_want, h.id, h.seq, h.hold_ms);
            if h.back > 0 {
                lease.push_str(&format!(":{}", h.back));
            }
            for (held, quiet) in h.steps() {
                lease.push_str(&format!(":{held}:{quiet}"));
            }
            if let Some(d) = h.demand {
                lease.push_str(&format!("/{d}"));
            }
            lease
        }
        (None, None) => g.ask.lease_want.to_string(),
    };
    let mut args = vec![
        g.limits.burst.to_string(),
        g.limits.rate.to_string(),
        g.limits.period_ms.to_string(),
        g.ask.cost.to_string(),
        lease,
        g.ask.max_wait_ms.to_string(),
        match g.ask.track {
            Some(t) => format!("{}:{}:{}:{}", g.ask.settle, t.refund, t.epoch, t.mark),
            None => g.ask.settle.to_string(),
        },
        g.now_us.map_or("time".to_string(), |n| n.to_string()),
    ];
    match g.penalty {
        Some(p) => {
            let mut arg = Vec::new();
            p.push_argument(&mut arg);
            args.push(String::from_utf8(arg).unwrap());
        }
        None if rng.chance(50) => args.push("0".to_string()),
        None => {}
    }
    args
}

const LIMITS: [Limits; KEYS] = [
    Limits {
        burst: 5,
        rate: 1,
        period_ms: 1000,
    },
    Limits {
        burst: 10,
        rate: 3,
        period_ms: 100,
    },
    Limits {
        burst: 3,
        rate: 2,
        period_ms: 7,
    },
    Limits {
        burst: 1 << 40,
        rate: 999_999_937,
        period_ms: 1024,
    },
];

/// A random group of key `key` at `now`; now and then one the script refuses.
fn random_group(rng: &mut Rng, key: usize, now: u64, seq: &mut u64, epochs: &[Stamp]) -> Group {
    let l = if rng.chance(90) {
        LIMITS[key]
    } else {
        LIMITS[rng.below(KEYS as u64) as usize]
    };
    let burst = l.burst.min(20);
    let cost = match rng.below(100) {
        0..=4 => 0,
        5..=9 => l.burst + 1,
        10..=24 => 1 + rng.below(l.burst),
        _ => 1 + rng.below(burst.min(3)),
    };
    let holder = rng.chance(30).then(|| {
        *seq += 1;
        let steps: Vec<(u64, u64)> = (0..1 + rng.below(3))
            .map(|_| (rng.below(burst + 2), rng.below(2000)))
            .collect();
        let seq = if rng.chance(85) {
            *seq
        } else {
            1 + rng.below(*seq)
        };
        let back = if rng.chance(25) {
            rng.below(burst + 2)
        } else {
            0
        };
        let h = Holder::new(1 + rng.below(3), seq, rng.below(3000), &steps).giving_back(back);
        if rng.chance(60) {
            h.demanding(rng.below(50_000))
        } else {
            h
        }
    });
    let mut ask = Ask {
        cost,
        lease_want: if rng.chance(40) {
            rng.below(burst * 2)
        } else {
            0
        },
        holder,
        max_wait_ms: if rng.chance(30) { rng.below(3000) } else { 0 },
        settle: if rng.chance(20) {
            i64::try_from(rng.below(burst * 4 + 1)).unwrap() * [1, -1][rng.below(2) as usize]
        } else {
            0
        },
        track: None,
    };
    // The tracked form now and then (its charge never negative): a take that may be refunded,
    // or a refund with a recent epoch.
    if rng.chance(35) {
        ask.settle = ask.settle.max(0);
        let stamp = match epochs.len() as u64 {
            0 => Stamp {
                epoch: now,
                mark: 0,
            },
            n => epochs[(n - 1 - rng.below(n.min(4))) as usize],
        };
        ask.track = Some(Tracked {
            refund: rng.below(burst * 2 + 1),
            epoch: stamp.epoch,
            mark: stamp.mark,
        });
    }
    let op = match rng.below(100) {
        0..=2 => Some(Operation::Reset),
        3..=5 => Some(Operation::Credit(
            NonZeroU64::new(1 + rng.below(burst * 3)).unwrap(),
        )),
        _ => None,
    };
    if op.is_some() {
        ask = Ask {
            max_wait_ms: ask.max_wait_ms,
            ..Ask::default()
        };
    }
    let penalty = rng.chance(40).then(|| {
        [
            Penalty::new(1000, &[200, 500]).unwrap(),
            Penalty::new(50, &[1]).unwrap(),
            Penalty::new(100_000, &[3000, 6000]).unwrap(),
        ][rng.below(3) as usize]
    });
    let mut g = Group {
        key,
        limits: l,
        ask,
        op,
        penalty,
        now_us: Some(now),
    };
    if rng.chance(7) {
        // One argument the script refuses (the model must name the same one).
        match rng.below(12) {
            0 => g.limits.burst = 0,
            1 => g.limits.rate = 1_000_000_001,
            2 => g.limits.period_ms = 0,
            3 => g.limits = lim((1 << 50) + 1, 1, 1),
            4 => g.ask.cost = TOO_BIG,
            5 => g.op = Some(Operation::Credit(NonZeroU64::new(TOO_BIG).unwrap())),
            6 => {
                g.op = Some(Operation::Reset);
                g.ask.cost = 1;
            }
            7 => {
                g.op = None;
                g.ask.holder = Some(Holder::new(0, 1, 100, &[(0, 0)]));
            }
            8 => {
                g.op = None;
                g.ask.holder = Some(Holder::new(1, 1, 100, &[]));
            }
            9 => g.ask.max_wait_ms = 3_600_001,
            10 => g.ask.settle = -(i64::try_from(g.limits.burst * 4 + 1).unwrap()),
            _ => g.now_us = Some(TOO_BIG),
        }
    }
    g
}

/// The key's PTTL after the batch: what its last applied group set (the wrapper reads it at the
/// end of the run), or -1 / -2 for a key the batch did not write (persisted / absent).
fn want_ttl(stored: &Stored, last: Option<&Group>) -> i64 {
    let Some(s) = stored.state else {
        return -2;
    };
    let Some(g) = last else {
        return -1;
    };
    let now = g.now_us.unwrap();
    let keep = g
        .penalty
        .map_or(0, |p| stored.offences.keep_ms(&p, now) as i64);
    match expiry_ms(&g.limits, s, &stored.holders, now) {
        -1 => -1,
        bucket => (bucket - 1000).max(keep) + 1000,
    }
}

fn read(h: &mut Harness, key: String) -> Stored {
    h.key = key;
    Stored {
        state: h.stored(),
        holders: h.stored_holders(),
        offences: h.stored_offences(),
    }
}

#[test]
fn model_matches_script_on_random_batches() {
    let (_redis, mut h) = harness("model-batch");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(tollgate_e2e::script::with_expiries())
        .query(&mut h.conn)
        .unwrap();
    let mut rng = Rng(0xBA7C_4001);
    let mut keys = vec![Stored::default(); KEYS];
    let mut now = T0;
    let mut seq = 0;
    let mut epochs = Vec::new();
    // Seen: a key twice, a holder's grant, a reservation, an offence, a refused group.
    let mut seen = [0usize; 5];
    for round in 0..BATCHES {
        match rng.below(100) {
            0..=29 => {}
            30..=69 => now += rng.below(2000),
            70..=94 => now += rng.below(3_000_000),
            _ => now = now.saturating_sub(rng.below(1_000_000)),
        }
        let n = 1 + rng.below(16) as usize;
        let mut groups: Vec<Group> = Vec::with_capacity(n);
        for _ in 0..n {
            let key = match groups.last() {
                Some(g) if rng.chance(30) => g.key,
                _ => rng.below(KEYS as u64) as usize,
            };
            let at = match rng.below(10) {
                0 => now.saturating_sub(rng.below(500_000)),
                1 => now + rng.below(500_000),
                _ => now,
            };
            groups.push(random_group(&mut rng, key, at, &mut seq, &epochs));
        }
        let before = keys.clone();
        let replies = take_batch(&mut keys, &groups, 0).unwrap();
        let want = batch_integers(&groups, &replies);

        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&sha).arg(n);
        for g in &groups {
            cmd.arg(format!("m:{{k{}}}", g.key));
        }
        cmd.arg("batch");
        for g in &groups {
            let args = arguments(g, &mut rng);
            cmd.arg(args.len()).arg(args);
        }
        let got: Value = cmd.query(&mut h.conn).unwrap();
        let Value::Array(items) = got else {
            panic!("not an array: {got:?}")
        };
        let got: Vec<i64> = items
            .iter()
            .map(|v| match v {
                Value::Int(i) => *i,
                other => panic!("not an integer: {other:?}"),
            })
            .collect();
        let (got, ttls) = got.split_at(want.len());
        epochs.extend(replies.iter().filter_map(|r| r.as_ref().ok()?.epoch));
        let ctx = format!("round {round}: {groups:?} before {before:?}");
        assert_eq!(got, &want[..], "{ctx}: script vs model");
        for (k, stored) in keys.iter().enumerate() {
            assert_eq!(
                &read(&mut h, format!("m:{{k{k}}}")),
                stored,
                "{ctx}: key {k}"
            );
            let last = groups
                .iter()
                .zip(&replies)
                .rev()
                .find(|(g, r)| g.key == k && r.is_ok())
                .map(|(g, _)| g);
            if let Some(i) = groups.iter().position(|g| g.key == k) {
                let (ttl, want) = (ttls[i], want_ttl(stored, last));
                assert!(
                    ttl == want || (ttl <= want && ttl > want - 1000),
                    "{ctx}: key {k} PTTL {ttl}, want {want}"
                );
            }
        }
        let mut dup: Vec<usize> = groups.iter().map(|g| g.key).collect();
        dup.sort();
        seen[0] += usize::from(dup.windows(2).any(|w| w[0] == w[1]));
        for (g, r) in groups.iter().zip(&replies) {
            match r {
                Ok(r) => {
                    seen[1] += usize::from(g.ask.holder.is_some() && r.granted > 0);
                    seen[2] += usize::from(r.allowed && r.retry_after_ms > 0);
                    seen[3] += usize::from(r.penalized.code() == 1);
                }
                Err(e) => {
                    assert_ne!(*e, GroupError::Script, "{ctx}");
                    seen[4] += 1;
                }
            }
        }
    }
    assert!(
        seen.iter().all(|&n| n >= 20),
        "twice, holders, reservations, offences, refused: {seen:?}"
    );
}
