//! `tollgate_core::bucket::take` is the model of `lua/token_bucket.lua`: the same sequence of calls gives the
//! same replies, bit for bit, and the hash Redis stores (u t p, or no key) is the model's `State`.
//! Sequences are pseudo-random but deterministic (a fixed-seed xorshift), with time jumps (forward and
//! back), cost > burst, lease requests and a limits change midway. The batched form's model,
//! `take_batch`, is checked in model/batch.rs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use common::script::{Rng, SCRIPT};
use common::{scratch_dir, Redis};
use redis::Value;
use tollgate_core::bucket::{
    operate, operate_penalized, take_held, take_penalized, Ask, Holder, Holders, Holding, Limits,
    Offences, Operation, Penalty, Reply, Spill, Stamp, State, Tracked, MAX_DEMAND,
};

#[path = "model/batch.rs"]
mod batch;

const T0: u64 = 1_700_000_000_000_000;

/// Refunds in `run`'s sequences that gave something back (the tracked form reached its point).
static GAVE_BACK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Racers' grants in `run`'s sequences that told the holder its next turn (a negative retry).
static PACED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const STEPS: usize = 3000;

/// The script, verbatim, wrapped so that the key's PTTL is read and the expiry removed inside the same
/// script run. The script's clock here is the explicit ARGV now, so real time must not expire the key
/// between two steps; Redis freezes time during a script, so nothing expires in between.
fn wrapped_script() -> String {
    format!(
        "local function tollgate_script()\n{SCRIPT}\nend\n\
         local r = tollgate_script()\n\
         local ttl = redis.call('PTTL', KEYS[1])\n\
         redis.call('PERSIST', KEYS[1])\n\
         table.insert(r, ttl)\n\
         return r\n"
    )
}

fn lim(burst: u64, rate: u64, period_ms: u64) -> Limits {
    Limits {
        burst,
        rate,
        period_ms,
    }
}

struct Harness {
    conn: redis::Connection,
    sha: String,
    key: String,
}

/// Whether a PTTL read right after the script set an expiry of `want` ms is that expiry: Redis 7.0
/// reads its clock again for PTTL, so milliseconds may have passed since PEXPIRE on a busy machine
/// (up to a second is taken as the same expiry). -1 (none) and -2 (no key) are exact.
fn pttl_is(ttl: i64, want: i64) -> bool {
    ttl == want || (want > 0 && ttl <= want && ttl > want - 1000)
}

impl Harness {
    /// Runs the script and returns its reply and the key's PTTL right after it.
    fn script(&mut self, l: &Limits, ask: &Ask, now: u64) -> (Vec<i64>, i64) {
        self.script_with(l, ask, None, now)
    }

    /// Runs the script with a penalty (ARGV[9]; ARGV[8] is the test clock) and returns its six
    /// integers and the key's PTTL.
    fn script_penalized(
        &mut self,
        l: &Limits,
        ask: &Ask,
        op: Option<Operation>,
        penalty: &Penalty,
        now: u64,
    ) -> (Vec<i64>, i64) {
        let mut arg = Vec::new();
        penalty.push_argument(&mut arg);
        let penalty = String::from_utf8(arg).unwrap();
        self.run(l, ask, op, &[now.to_string(), penalty])
    }

    /// Runs the script with `op` (an operator's operation) instead of the lease when there is one.
    fn script_with(
        &mut self,
        l: &Limits,
        ask: &Ask,
        op: Option<Operation>,
        now: u64,
    ) -> (Vec<i64>, i64) {
        let (ints, ttl) = self.run(l, ask, op, &[now.to_string()]);
        // Five integers, eight (penalized, the epoch, the mark) in the tracked form.
        let want = if ask.track.is_some() { 8 } else { 5 };
        assert_eq!(ints.len(), want, "integers and a PTTL: {ints:?}");
        (ints, ttl)
    }

    /// Runs the script with ARGV[1..=7] from `ask` (or `op`) and then `tail`; its integers and the
    /// PTTL after it.
    fn run(
        &mut self,
        l: &Limits,
        ask: &Ask,
        op: Option<Operation>,
        tail: &[String],
    ) -> (Vec<i64>, i64) {
        let lease = match ask.holder {
            _ if op.is_some() => op.map(|o| o.argument()).unwrap(),
            Some(h) => {
                let mut lease = format!("{}:{}:{}:{}", ask.lease_want, h.id, h.seq, h.hold_ms);
                if h.back > 0 {
                    // What it gives back: the odd count of parts says it is there.
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
            None => ask.lease_want.to_string(),
        };
        let mut args = vec![
            l.burst.to_string(),
            l.rate.to_string(),
            l.period_ms.to_string(),
            ask.cost.to_string(),
            lease,
            ask.max_wait_ms.to_string(),
            match ask.track {
                Some(t) => format!("{}:{}:{}:{}", ask.settle, t.refund, t.epoch, t.mark),
                None => ask.settle.to_string(),
            },
        ];
        args.extend_from_slice(tail);
        let v: Value = redis::cmd("EVALSHA")
            .arg(&self.sha)
            .arg(1)
            .arg(&self.key)
            .arg(&args)
            .query(&mut self.conn)
            .unwrap_or_else(|e| panic!("EVALSHA {args:?}: {e}"));
        let Value::Array(items) = v else {
            panic!("not an array: {v:?}")
        };
        let ints: Vec<i64> = items
            .iter()
            .map(|x| match x {
                Value::Int(i) => *i,
                other => panic!("not an integer: {other:?}"),
            })
            .collect();
        let (ttl, ints) = ints.split_last().unwrap();
        (ints.to_vec(), *ttl)
    }

    /// The stored offences (`x`, `c`, `w`; all absent: none).
    fn stored_offences(&mut self) -> Offences {
        let (x, c, w): (Option<u64>, Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(&self.key)
            .arg(&["x", "c", "w"])
            .query(&mut self.conn)
            .unwrap();
        match (x, c, w) {
            (None, None, None) => Offences::default(),
            (Some(x), Some(c), Some(w)) => Offences {
                boxed_until_us: x,
                count: c,
                last_us: w,
            },
            other => panic!("partial offences: {other:?}"),
        }
    }

    /// The stored holders (`h<id>`, `e<id>`, `q<id>`, `d<id>`), checked against the aggregates
    /// `o`, `k`, `n`, `m`, `s` the script keeps for them: `o`, `k` and `s` (absent when 0)
    /// exactly, `n` no later than the earliest expiry (it may be stale-early: that only makes
    /// the script recount sooner), `m` the latest.
    fn stored_holders(&mut self) -> Holders {
        let all: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(&self.key)
            .query(&mut self.conn)
            .unwrap();
        let field = |name: &str| {
            all.iter()
                .find(|(f, _)| f == name)
                .map(|(_, v)| v.parse::<u64>().unwrap())
        };
        let mut holders = Vec::new();
        for (f, v) in &all {
            if let Some(id) = f.strip_prefix('e') {
                holders.push(Holding {
                    holder: id.parse().unwrap(),
                    held: field(&format!("h{id}")).unwrap(),
                    expires_us: v.parse().unwrap(),
                    seq: field(&format!("q{id}")).unwrap(),
                    demand: field(&format!("d{id}")).unwrap_or(0),
                });
            }
        }
        holders.sort();
        let holders = Holders(holders);
        if holders.0.is_empty() {
            assert_eq!(
                (field("o"), field("k"), field("n"), field("m"), field("s")),
                (None, None, None, None, None)
            );
            let demands = all.iter().filter(|(f, _)| f.starts_with('d')).count();
            assert_eq!(demands, 0, "no demand left behind: {all:?}");
        } else {
            assert_eq!(field("o"), Some(holders.held()), "o");
            assert_eq!(field("k"), Some(holders.0.len() as u64), "k");
            let s = holders.demand();
            assert_eq!(field("s"), (s > 0).then_some(s), "s");
            let earliest = holders.0.iter().map(|h| h.expires_us).min().unwrap();
            assert!(field("n").unwrap() <= earliest, "n");
            assert_eq!(field("m"), Some(holders.last_expiry_us()), "m");
        }
        holders
    }

    /// The stored hash as a `State`, or None when the key is absent. A bucket that tracks its
    /// spill epoch stores E and D, T, the t it wrote, and W, until when reservations wait.
    fn stored(&mut self) -> Option<State> {
        type Field = Option<String>;
        type Spilled = (Option<u64>, Option<i64>, Option<u64>, Field, Option<u64>);
        let (u, t, p): (Field, Field, Field) = redis::cmd("HMGET")
            .arg(&self.key)
            .arg(&["u", "t", "p"])
            .query(&mut self.conn)
            .unwrap();
        let (e, d, n, tt, w): Spilled = redis::cmd("HMGET")
            .arg(&self.key)
            .arg(&["E", "D", "N", "T", "W"])
            .query(&mut self.conn)
            .unwrap();
        let spill = match (e, d, n, tt, w) {
            (None, None, None, None, None) => None,
            (Some(epoch), Some(headroom), Some(taken), Some(written), Some(w)) => {
                assert_eq!(Some(&written), t.as_ref(), "T is the t this version wrote");
                Some(Spill {
                    epoch,
                    headroom,
                    taken,
                    reserved_until_us: w,
                })
            }
            other => panic!("partial spill epoch: {other:?}"),
        };
        match (u, t, p) {
            (None, None, None) => None,
            (Some(u), Some(t), Some(p)) => {
                let parse = |f: &str, s: &str| -> u64 {
                    s.parse()
                        .unwrap_or_else(|_| panic!("stored {f} is not a plain integer: {s:?}"))
                };
                let units = u
                    .parse()
                    .unwrap_or_else(|_| panic!("stored u is not a plain integer: {u:?}"));
                Some(State {
                    units,
                    ts_us: parse("t", &t),
                    per_token: parse("p", &p),
                    spill,
                })
            }
            other => panic!("partial hash: {other:?}"),
        }
    }
}

/// The PTTL the script sets after leaving `s`: until every holder expired, then until the bucket
/// is full (whole steps after its refill point), plus 1 s of slack; -1 (no expiry) when that is
/// more than 2^53 ms.
fn expiry_ms(l: &Limits, s: State, holders: &Holders, now: u64) -> i64 {
    let (per_token, step) = (l.units_per_token().unwrap(), l.step_ms().unwrap());
    let to_full = (l.burst * per_token) as i64 - s.units;
    let steps = (to_full + l.rate as i64 - 1) / l.rate as i64;
    let since_ms = (now - s.ts_us) as i64 / 1000;
    let refill = i128::from(steps) * i128::from(step) - i128::from(since_ms * i64::from(steps > 0));
    let last = holders.last_expiry_us().saturating_sub(now).div_ceil(1000) as i128;
    let ttl = refill + last + 1000;
    if ttl > 1 << 53 {
        -1
    } else {
        ttl as i64
    }
}

/// The script's integers for `r`: five, and in the tracked form `penalized` and the epoch.
fn as_ints(r: &Reply) -> Vec<i64> {
    let mut ints = vec![
        i64::from(r.allowed),
        r.remaining as i64,
        r.retry_after_ms,
        r.reset_after_ms as i64,
        r.granted as i64,
    ];
    if let Some(s) = r.epoch {
        ints.extend([r.penalized.code(), s.epoch as i64, s.mark as i64]);
    }
    ints
}

/// Runs `STEPS` calls, switching from `first` to `second` limits halfway, comparing model and script.
fn run(h: &mut Harness, seed: u64, first: Limits, second: Limits, jump_us: u64) -> (usize, usize) {
    let mut rng = Rng(seed);
    let mut state: Option<State> = None;
    let mut holders = Holders::default();
    let mut now = T0 + rng.below(1_000_000);
    // The stamps replies gave, oldest first.
    let mut epochs: Vec<Stamp> = Vec::new();
    let (mut allowed, mut denied) = (0, 0);
    for step in 0..STEPS {
        let l = if step < STEPS / 2 { first } else { second };
        // Time: mostly small moves (sub-ms and a few refill periods), some standing still,
        // rare big jumps forward (up to `jump_us`) and back (up to a minute).
        let period_us = l.period_ms * 1000;
        match rng.below(100) {
            0..=19 => {}
            20..=59 => now += rng.below(2000),
            60..=89 => now += rng.below(period_us.min(10_000_000) * 2),
            90..=95 => now += rng.below(jump_us),
            _ => now = now.saturating_sub(rng.below(60_000_000)),
        }
        // Cost: usually small, sometimes up to burst, sometimes more than burst.
        let cost = if rng.chance(5) {
            l.burst + 1 + rng.below(3)
        } else if rng.chance(15) {
            1 + rng.below(l.burst)
        } else {
            1 + rng.below(l.burst.min(3))
        };
        let lease = if rng.chance(40) {
            0
        } else {
            rng.below(l.burst.saturating_mul(2).min(1 << 52))
        };

        // Reservations: sometimes a wait horizon, from a few ms to a few refill periods.
        let wait = if rng.chance(30) {
            rng.below((l.period_ms * 3).min(3_600_000))
        } else {
            0
        };

        // Usage settlements: sometimes a charge or a refund, up to the four bursts allowed; a cost
        // of 0 (settle only) now and then.
        let settle = if rng.chance(25) {
            let magnitude = i64::try_from(rng.below(l.burst * 4 + 1)).unwrap();
            if rng.chance(50) {
                magnitude
            } else {
                -magnitude
            }
        } else {
            0
        };
        let cost = if rng.chance(5) { 0 } else { cost };
        // Lease calls from one of three holders (proxies), reporting at most what they hold.
        let holder = if rng.chance(50) {
            let id = 1 + rng.below(3);
            let on_record = holders
                .0
                .iter()
                .find(|x| x.holder == id)
                .map_or(0, |x| x.held);
            // Up to three steps, oldest first: more held longer ago, less held lately.
            let now_held = if rng.chance(70) {
                rng.below(on_record + 1)
            } else {
                on_record + rng.below(3)
            };
            let mut steps = Vec::new();
            let (mut held, mut quiet) = (now_held, 0);
            for _ in 0..1 + rng.below(3) {
                steps.push((held, quiet));
                held += rng.below(on_record + 2);
                quiet += rng.below(l.period_ms.min(100_000) * 2);
            }
            steps.reverse();
            // Calls of one holder mostly run in the order it sent them, now and then late.
            let seq = if rng.chance(85) {
                step as u64 + 1
            } else {
                1 + rng.below(step as u64 + 1)
            };
            // Now and then it gives back tokens it dropped: up to what it holds on record, or
            // more (the script puts back no more than the record counts).
            let back = if rng.chance(25) {
                rng.below(on_record + 3)
            } else {
                0
            };
            let h = Holder::new(id, seq, rng.below(l.period_ms.min(100_000) * 3), &steps)
                .giving_back(back);
            // Mostly a demand (its share is weighed by it), skewed across the holders; now
            // and then none (the old format), 0, or the most the script takes.
            Some(match rng.below(10) {
                0..=2 => h,
                3 => h.demanding(0),
                4 => h.demanding(MAX_DEMAND),
                _ => h.demanding(rng.below(100_000) * id * id),
            })
        } else {
            None
        };
        // The tracked form now and then: a take that may be refunded, or a refund with the
        // epoch of a recent take (mostly the latest), an older one, or one never given.
        let track = rng.chance(35).then(|| {
            let stamp = match (rng.below(10), epochs.len() as u64) {
                (_, 0) | (0, _) => Stamp {
                    epoch: now.saturating_sub(rng.below(3)),
                    mark: rng.below(1 << 20),
                },
                (1..=2, n) => epochs[rng.below(n) as usize],
                (_, n) => epochs[n as usize - 1],
            };
            Tracked {
                refund: if rng.chance(60) {
                    rng.below(l.burst * 4 + 1)
                } else {
                    0
                },
                epoch: stamp.epoch,
                // Now and then a mark past what was taken (the script never gives one).
                mark: if rng.chance(5) {
                    stamp.mark + rng.below(1 << 40)
                } else {
                    stamp.mark
                },
            }
        });
        let ask = Ask {
            cost,
            lease_want: lease,
            holder,
            max_wait_ms: wait,
            // The tracked form's charge: never negative.
            settle: if track.is_some() {
                settle.max(0)
            } else {
                settle
            },
            track,
        };

        // Now and then an operator's reset (with the wait of the step) or credit instead.
        let op = match rng.below(100) {
            0..=2 => Some(Operation::Reset),
            3..=5 => Some(Operation::Credit(
                std::num::NonZeroU64::new(1 + rng.below(l.burst * 6)).unwrap(),
            )),
            _ => None,
        };
        let ask = match op {
            Some(_) => Ask {
                max_wait_ms: wait,
                ..Ask::default()
            },
            None => ask,
        };

        let ctx = format!("seed {seed} step {step}: {l:?} {ask:?} {op:?} now {now}");
        let before = (state, holders.clone());
        let (next, reply) = match op {
            Some(op) => operate(state, &mut holders, &l, op, wait, now),
            None => take_held(state, &mut holders, &l, &ask, now),
        };
        let (got, ttl) = h.script_with(&l, &ask, op, now);
        assert_eq!(
            got,
            as_ints(&reply),
            "{ctx}: script vs model (before {before:?})"
        );
        assert_eq!(
            h.stored(),
            next,
            "{ctx}: stored state (reply {got:?}, PTTL {ttl})"
        );
        assert_eq!(h.stored_holders(), holders, "{ctx}: stored holders");
        // PEXPIRE: until every holder expired, then until the bucket is full, plus 1 s of slack;
        // a full bucket with no holders has no key (PTTL -2).
        let want = match next {
            Some(s) => expiry_ms(&l, s, &holders, now),
            None => -2,
        };
        assert!(pttl_is(ttl, want), "{ctx}: PTTL {ttl}, want {want}");
        if let (Some(_), Some(s)) = (op, next) {
            // What the bucket holds and what holders hold never pass burst together.
            let per_token = l.units_per_token().unwrap();
            let out = (holders.held() * per_token) as i64;
            let capacity = ((l.burst * per_token) as i64 - out).max(0);
            assert!(s.units <= capacity, "{ctx}: an operation passed burst");
        }
        // A refund whose epoch was the bucket's, that gave something back.
        let gave_back = ask.track.is_some_and(|t| {
            t.refund > 0
                && before
                    .0
                    .and_then(|s| s.spill)
                    .is_some_and(|sp| sp.epoch == t.epoch)
                && next.zip(before.0).is_some_and(|(n, b)| n.units > b.units)
        });
        GAVE_BACK.fetch_add(usize::from(gave_back), std::sync::atomic::Ordering::Relaxed);
        state = next;
        epochs.extend(reply.epoch);
        PACED.fetch_add(
            usize::from(reply.allowed && reply.retry_after_ms < 0),
            std::sync::atomic::Ordering::Relaxed,
        );
        if reply.allowed {
            allowed += 1;
        } else {
            denied += 1;
        }
    }
    (allowed, denied)
}

fn harness(name: &str) -> (Redis, Harness) {
    let redis = Redis::start(&scratch_dir(name));
    let mut conn = redis.conn();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(wrapped_script())
        .query(&mut conn)
        .unwrap();
    let h = Harness {
        conn,
        sha,
        key: String::new(),
    };
    (redis, h)
}

/// A day: the longest jump forward of the clock in `check`'s sequences.
const DAY_US: u64 = 86_400_000_000;

fn check(name: &str, cases: &[(Limits, Limits)]) {
    check_jumping(name, cases, DAY_US);
}

/// `check`, with the clock's big jumps forward up to `jump_us`.
fn check_jumping(name: &str, cases: &[(Limits, Limits)], jump_us: u64) {
    let (_redis, mut h) = harness(name);
    for (i, &(first, second)) in cases.iter().enumerate() {
        h.key = format!("tollgate:{{{name}:{i}}}");
        let (allowed, denied) = run(
            &mut h,
            0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1),
            first,
            second,
            jump_us,
        );
        // The sequences must exercise both outcomes to mean anything.
        assert!(
            allowed > 50 && denied > 50,
            "case {i}: {allowed} allowed, {denied} denied"
        );
    }
}

#[test]
fn model_matches_script_small_buckets() {
    check(
        "model-small",
        &[
            (lim(10, 1, 1000), lim(5, 1, 1000)),   // burst shrink
            (lim(5, 3, 7), lim(5, 3, 1000)),       // period change
            (lim(1, 1, 1), lim(2, 1, 3)),          // tiny, both change
            (lim(3, 2, 86_400_000), lim(3, 2, 1)), // a day period, then a ms
        ],
    );
    let gave_back = GAVE_BACK.load(std::sync::atomic::Ordering::Relaxed);
    assert!(gave_back > 50, "refunds that gave back: {gave_back}");
    let paced = PACED.load(std::sync::atomic::Ordering::Relaxed);
    assert!(paced > 20, "racers' paced grants: {paced}");
}

#[test]
fn model_matches_script_large_values() {
    check(
        "model-large",
        &[
            // High rate: refills within a ms.
            (lim(1000, 1_000_000_000, 1), lim(100, 1_000_000_000, 1)),
            // full = 2^50 units: every value the script handles is near its exactness limit.
            (lim(1 << 40, 999_999_937, 1024), lim(1 << 30, 3, 1 << 20)),
            // Rescale where units * period_ms passes 2^53 (the rounding-down branch).
            (lim(1 << 49, 1, 2), lim(1 << 10, 1, 1 << 40)),
            (lim(100, 7, 333), lim(1000, 1_000_000, 999)),
        ],
    );
}

/// Settlement never lifts a bucket, in the script and its model: over random sequences of
/// reservations (deep into debt), charges, refunds and period changes, a charge at an unchanged
/// clock never raises the stored units, a refund never lowers them, and a period change never
/// shrinks a debt counted in whole tokens.
#[test]
fn settlement_never_lifts_a_bucket() {
    let (_redis, mut h) = harness("model-settle");
    let periods = [1000, 100, 7, 60_000];
    let mut checked = [0usize; 3];
    for case in 0..6u64 {
        h.key = format!("tollgate:{{settle:{case}}}");
        let mut rng = Rng(0x5EED ^ (case + 1));
        let (burst, rate) = (1 + rng.below(20), 1 + rng.below(20));
        let mut l = lim(burst, rate, 1000);
        let mut state: Option<State> = None;
        let mut holders = Holders::default();
        let mut now = T0;
        for step in 0..600 {
            let before = state;
            let kind = rng.below(100);
            let ask = match kind {
                // A reservation with a long wait: takes the bucket deep into debt.
                0..=39 => Ask {
                    cost: 1 + rng.below(burst),
                    max_wait_ms: 3_600_000,
                    ..Ask::default()
                },
                40..=79 => {
                    let magnitude = i64::try_from(1 + rng.below(burst * 4)).unwrap();
                    Ask {
                        settle: if kind < 60 { magnitude } else { -magnitude },
                        ..Ask::default()
                    }
                }
                80..=89 => {
                    l = lim(burst, rate, periods[rng.below(4) as usize]);
                    Ask::default()
                }
                _ => {
                    now += rng.below(5_000_000);
                    Ask::default()
                }
            };
            let ctx = format!("case {case} step {step}: {l:?} {ask:?} before {before:?}");
            let (next, reply) = take_held(state, &mut holders, &l, &ask, now);
            let (got, _) = h.script(&l, &ask, now);
            assert_eq!(got, as_ints(&reply), "{ctx}: script vs model");
            assert_eq!(h.stored(), next, "{ctx}: stored state");
            let units = |s: Option<State>| s.map_or(i64::MAX, |s| s.units);
            let same_period = before.is_none_or(|b| Some(b.per_token) == l.units_per_token());
            if ask.settle > 0 && same_period {
                assert!(
                    units(next) <= units(before),
                    "{ctx}: a charge lifted the bucket"
                );
                checked[0] += usize::from(units(before) < -4 * (burst * 1000) as i64);
            } else if ask.settle < 0 && same_period {
                assert!(
                    units(next) >= units(before),
                    "{ctx}: a refund lowered the bucket"
                );
                checked[1] += 1;
            } else if let (Some(b), false) = (before, same_period) {
                if b.units < 0 {
                    let tokens = |u: i64, p: u64| {
                        (-u).div_euclid(p as i64) + i64::from((-u) % p as i64 != 0)
                    };
                    let after = next.map_or(0, |s| tokens(s.units.min(0), s.per_token));
                    assert!(
                        after >= tokens(b.units, b.per_token),
                        "{ctx}: a rescale shrank the debt"
                    );
                    checked[2] += 1;
                }
            }
            state = next;
        }
    }
    // The sequences reached what they are about: charges on buckets already deeper than four
    // bursts, refunds, and rescales of a debt.
    assert!(checked.iter().all(|&c| c > 5), "checked {checked:?}");
}

/// Periods up to 366 days with bursts up to 10^9: refill by whole seconds or minutes, a change
/// of step midway (the units rescaled), times that saturate at 2^53 ms and keys kept without an
/// expiry.
#[test]
fn model_matches_script_long_periods() {
    const MONTH: u64 = 2_592_000_000;
    const YEAR: u64 = 31_622_400_000;
    // Jumps of up to 100 days: 3000 steps stay below 2^53 µs (the script's largest now).
    check_jumping(
        "model-long",
        &[
            // 1,000,000 a month (a second's step), then 400,000 (a ms step).
            (
                lim(1_000_000, 1_000_000, MONTH),
                lim(400_000, 1_000_000, MONTH),
            ),
            // 10^9 a year at 1 a year (a minute's step, saturating), then 10^9 a year.
            (
                lim(1_000_000_000, 1, YEAR),
                lim(1_000_000_000, 1_000_000_000, YEAR),
            ),
            // 10^9 a month (minutes), then 10^9 an hour (seconds).
            (
                lim(1_000_000_000, 1_000_000_000, MONTH),
                lim(1_000_000_000, 3, 3_600_000),
            ),
            // A week of seconds, then small and fast.
            (lim(1_000_000_000, 7, 604_800_000), lim(3, 2, 1000)),
        ],
        100 * DAY_US,
    );
}

/// A 30-day quota of 1,000,000 driven over 45 days of the script's clock: what it admits at day
/// 0, 15, 30 and 45 is the arithmetic's exact integers, in the script and its model.
#[test]
fn a_thirty_day_quota_over_45_days_of_test_clock() {
    let (_redis, mut h) = harness("model-month");
    h.key = "tollgate:{month:1}".to_string();
    let l = lim(1_000_000, 1_000_000, 2_592_000_000);
    let mut state = None;
    let mut holders = Holders::default();
    let mut call = |h: &mut Harness, cost: u64, now: u64| {
        let ask = Ask {
            cost,
            ..Ask::default()
        };
        let (next, reply) = take_held(state, &mut holders, &l, &ask, now);
        let (got, ttl) = h.script(&l, &ask, now);
        assert_eq!(
            got,
            as_ints(&reply),
            "cost {cost} at {now}: script vs model"
        );
        assert_eq!(h.stored(), next);
        state = next;
        (got, ttl)
    };
    // [allowed, remaining, retry_after_ms, reset_after_ms, granted]
    let (got, ttl) = call(&mut h, 1_000_000, T0);
    assert_eq!(got, [1, 0, 0, 2_592_000_000, 1_000_000]);
    assert!(
        pttl_is(ttl, 2_592_001_000),
        "full in 30 days, plus 1 s: {ttl}"
    );
    assert_eq!(call(&mut h, 1, T0).0, [0, 0, 3000, 2_592_000_000, 0]);
    let day15 = T0 + 15 * DAY_US;
    assert_eq!(
        call(&mut h, 500_001, day15).0,
        [0, 500_000, 3000, 1_296_000_000, 0]
    );
    assert_eq!(
        call(&mut h, 500_000, day15).0,
        [1, 0, 0, 2_592_000_000, 500_000]
    );
    let day30 = T0 + 30 * DAY_US;
    assert_eq!(
        call(&mut h, 250_000, day30).0,
        [1, 250_000, 0, 1_944_000_000, 250_000]
    );
    let day45 = T0 + 45 * DAY_US;
    assert_eq!(
        call(&mut h, 750_001, day45).0,
        [0, 750_000, 3000, 648_000_000, 0]
    );
    assert_eq!(
        call(&mut h, 750_000, day45).0,
        [1, 0, 0, 2_592_000_000, 750_000]
    );
}

/// 10^9 tokens at 1 a year: replies saturate at 2^53 ms, and a key that would be full only
/// after that is kept without an expiry (PTTL -1), by the script.
#[test]
fn a_bucket_full_only_after_2_53_ms_has_no_expiry() {
    let (_redis, mut h) = harness("model-persist");
    h.key = "tollgate:{persist:1}".to_string();
    let l = lim(1_000_000_000, 1, 31_622_400_000);
    let ask = |cost| Ask {
        cost,
        ..Ask::default()
    };
    let (got, ttl) = h.script(&l, &ask(1), T0);
    assert_eq!(got, [1, 999_999_999, 0, 31_622_400_000, 1]);
    assert!(pttl_is(ttl, 31_622_401_000), "{ttl}");
    let (got, ttl) = h.script(&l, &ask(999_999_999), T0);
    assert_eq!(got, [1, 0, 0, 1 << 53, 999_999_999]);
    assert_eq!(ttl, -1, "kept without an expiry");
    // Once it is less than 2^53 ms from full again, it gets an expiry back.
    let (got, ttl) = h.script(&l, &ask(0), T0);
    assert_eq!((got[0], ttl), (1, -1));
    let credit = Operation::Credit(std::num::NonZeroU64::new(999_999_000).unwrap());
    let (got, ttl) = h.script_with(&l, &Ask::default(), Some(credit), T0);
    assert_eq!(got, [1, 999_999_000, 0, 1000 * 31_622_400_000, 0]);
    assert!(pttl_is(ttl, 1000 * 31_622_400_000 + 1000), "{ttl}");
}
/// The penalty box, in the script and its model, bit for bit: random sequences of calls with a
/// penalty (and now and then one without, which leaves the offences alone), reservations,
/// settlements, lease calls, resets and credits, with time moving on the scale of the penalty's
/// durations and window. Replies (six integers), the stored hash (`u t p`, `x c w`), the holders
/// and the PTTL must agree; and the box must be met: denied while boxed, never past its end.
#[test]
fn model_matches_script_with_a_penalty_box() {
    let (_redis, mut h) = harness("model-penalty");
    let cases = [
        (
            lim(5, 1, 1000),
            Penalty::new(10_000, &[1500, 3000, 6000]).unwrap(),
        ),
        (lim(3, 2, 7), Penalty::new(50, &[1, 2, 2, 40]).unwrap()),
        (lim(20, 1000, 1), Penalty::new(500, &[2000]).unwrap()), // the box outlasts the window
        (
            lim(2, 1, 60_000),
            Penalty::new(604_800_000, &[1, 2, 3, 4, 5, 6, 7, 86_400_000]).unwrap(),
        ),
    ];
    let mut seen = [0usize; 4]; // offences, boxed denials, repeat offences, resets of a box
    for (i, &(l, penalty)) in cases.iter().enumerate() {
        h.key = format!("tollgate:{{penalty:{i}}}");
        let mut rng = Rng(0xB0C5 ^ (i as u64 + 1));
        let (mut state, mut holders, mut offences) =
            (None, Holders::default(), Offences::default());
        let mut now = T0 + rng.below(1_000_000);
        let longest = penalty.durations_ms().last().copied().unwrap();
        for step in 0..STEPS {
            let scale_us = (longest.min(10_000_000) * 1000).max(2000);
            match rng.below(100) {
                0..=29 => {}
                30..=69 => now += rng.below(2000),
                70..=89 => now += rng.below(scale_us * 2),
                90..=95 => now += rng.below(penalty.window_ms().min(100_000_000) * 2000),
                _ => now = now.saturating_sub(rng.below(scale_us)),
            }
            let cost = match rng.below(100) {
                0..=4 => 0,
                5..=9 => l.burst + 1,
                _ => 1 + rng.below(l.burst.min(3)),
            };
            let holder = rng.chance(15).then(|| {
                let id = 1 + rng.below(2);
                Holder::new(id, step as u64 + 1, rng.below(3000), &[(0, rng.below(500))])
            });
            let ask = Ask {
                cost,
                lease_want: if rng.chance(20) {
                    rng.below(l.burst * 2)
                } else {
                    0
                },
                holder,
                max_wait_ms: if rng.chance(20) { rng.below(3000) } else { 0 },
                settle: if rng.chance(15) {
                    i64::try_from(rng.below(l.burst * 4 + 1)).unwrap()
                        * [1, -1][rng.below(2) as usize]
                } else {
                    0
                },
                track: None,
            };
            let op = match rng.below(100) {
                0..=1 => Some(Operation::Reset),
                2..=3 => Some(Operation::Credit(
                    std::num::NonZeroU64::new(1 + rng.below(l.burst * 2)).unwrap(),
                )),
                _ => None,
            };
            let ask = if op.is_some() {
                Ask {
                    max_wait_ms: ask.max_wait_ms,
                    ..Ask::default()
                }
            } else {
                ask
            };
            let with_penalty = !rng.chance(8);
            let ctx = format!(
                "case {i} step {step}: {l:?} {penalty:?} {ask:?} {op:?} penalty {with_penalty} \
                 now {now} before {state:?} {offences:?}"
            );
            let was_boxed = with_penalty && offences.boxed_until_us > now;
            let (next, reply, got, ttl) = match op {
                Some(op) => {
                    seen[3] += usize::from(op == Operation::Reset && offences.boxed_until_us > now);
                    let rule_penalty = with_penalty.then_some(&penalty);
                    let (next, reply) = operate_penalized(
                        state,
                        &mut holders,
                        (&mut offences, rule_penalty),
                        &l,
                        op,
                        ask.max_wait_ms,
                        now,
                    );
                    let (got, ttl) = match rule_penalty {
                        Some(p) => h.script_penalized(&l, &ask, Some(op), p, now),
                        None => {
                            let (got, ttl) = h.script_with(&l, &ask, Some(op), now);
                            (got.to_vec(), ttl)
                        }
                    };
                    (next, reply, got, ttl)
                }
                None if with_penalty => {
                    let (next, reply) = take_penalized(
                        state,
                        &mut holders,
                        &mut offences,
                        &l,
                        &ask,
                        Some(&penalty),
                        now,
                    );
                    let (got, ttl) = h.script_penalized(&l, &ask, None, &penalty, now);
                    (next, reply, got, ttl)
                }
                None => {
                    let (next, reply) =
                        take_penalized(state, &mut holders, &mut offences, &l, &ask, None, now);
                    let (got, ttl) = h.script_with(&l, &ask, None, now);
                    (next, reply, got.to_vec(), ttl)
                }
            };
            let mut want = as_ints(&reply).to_vec();
            if with_penalty {
                want.push(reply.penalized.code());
            }
            assert_eq!(got, want, "{ctx}: script vs model");
            assert_eq!(h.stored(), next, "{ctx}: stored state");
            assert_eq!(h.stored_holders(), holders, "{ctx}: stored holders");
            assert_eq!(h.stored_offences(), offences, "{ctx}: stored offences");
            // PEXPIRE: as without a penalty, but never before the box ends or the last offence
            // leaves the window.
            let want_ttl = match next {
                Some(s) => {
                    let keep = if with_penalty {
                        offences.keep_ms(&penalty, now) as i64
                    } else {
                        0
                    };
                    match expiry_ms(&l, s, &holders, now) {
                        -1 => -1,
                        bucket => (bucket - 1000).max(keep) + 1000,
                    }
                }
                None => -2,
            };
            assert!(
                ttl <= want_ttl && ttl > want_ttl - 1000,
                "{ctx}: PTTL {ttl}, want {want_ttl}"
            );
            // The box is met: a boxed call with 0 < cost <= burst is denied until the box ends.
            if was_boxed && ask.cost >= 1 && ask.cost <= l.burst {
                assert!(!reply.allowed, "{ctx}: admitted while boxed");
                seen[1] += 1;
            }
            if reply.penalized == tollgate_core::bucket::Penalized::Offence {
                assert!(
                    reply.retry_after_ms >= penalty.durations_ms()[0] as i64,
                    "{ctx}"
                );
                seen[0] += 1;
                seen[2] += usize::from(offences.count > 1);
            }
            state = next;
        }
    }
    assert!(
        seen.iter().all(|&n| n > 5),
        "offences, boxed, repeats, resets: {seen:?}"
    );
}
