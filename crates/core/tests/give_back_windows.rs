//! The fleet bound with holders that give back what they dropped, on the model
//! (`bucket::take_held`): in every window of W ms a key's callers admit at most
//! `burst + rate × W` (rate × W rounded up to a whole token).
//!
//! Invariant: the simulated proxies are honest, as the lease pool is meant to be: each reports
//! what it held exactly (at most X for the last q ms), gives back only tokens it was granted,
//! deposited and dropped unspent when its lease expired, each once, and spends a reservation only
//! once it has refilled. Calls may run late, after a later call of the same proxy (stale seq), or
//! after the proxy gave up on them (their grant is then never deposited). Many holders on a small
//! burst make them race (shares under `RACE_SHARE`); exact callers take what is left. Each call
//! reports a demand, skewed across proxies, sometimes none, sometimes the most the script takes
//! (a demand only weighs shares: whatever it is, the bound holds), and some grants are larger
//! than the equal share because of it. A liar (giving back tokens it spent) must break the bound:
//! the check can fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_core::bucket::{take_held, Ask, Holder, Holders, Limits, State, MAX_DEMAND};

mod common;

use common::Rng;

/// A lease call on its way: sent at `sent` by proxy `p`, runs at `runs`.
struct Call {
    p: usize,
    seq: u64,
    want: u64,
    back: u64,
    demand: Option<u64>,
    steps: Vec<(u64, u64)>,
    runs: u64,
}

/// A grant on its way back to proxy `p`.
struct Answer {
    p: usize,
    seq: u64,
    granted: u64,
    vest_at: u64,
    lands: u64,
}

#[derive(Default, Clone)]
struct Proxy {
    id: u64,
    seq: u64,
    /// Unspent deposited tokens, spendable from `vest_at`, dropped at `expires`.
    tokens: u64,
    vest_at: u64,
    expires: u64,
    /// Since when it has held exactly `tokens` (ms).
    since: u64,
    /// Dropped unspent since its last call.
    back: u64,
    /// Its latest call is out until then.
    flight_until: u64,
    /// Tokens spent since its last call (what a liar gives back).
    spent: u64,
}

const LIFE_MS: u64 = 40;
const TIMEOUT_MS: u64 = 8;
/// The script's hold covers the proxy's lease: its life plus the longest answer delay.
const HOLD_MS: u64 = LIFE_MS + TIMEOUT_MS + 5;

/// What one random run did.
struct Ran {
    /// Admission times (ms).
    admitted: Vec<u64>,
    /// Tokens given back.
    gave_back: u64,
    /// Grants larger than the equal share (burst ÷ holders): the demand weighed them.
    weighted: u64,
}

/// One random run.
fn run(seed: u64, l: Limits, proxies: usize, liar: bool) -> Ran {
    let mut rng = Rng(seed);
    let mut state: Option<State> = None;
    let mut holders = Holders::default();
    let mut ps: Vec<Proxy> = (0..proxies)
        .map(|i| Proxy {
            id: 100 + i as u64,
            ..Proxy::default()
        })
        .collect();
    let mut calls: Vec<Call> = Vec::new();
    let mut answers: Vec<Answer> = Vec::new();
    let mut admitted = Vec::new();
    let mut gave_back = 0;
    let mut weighted = 0;
    for now in 1..1500u64 {
        // Proxies drop what expired, and spend.
        for (n, p) in ps.iter_mut().enumerate() {
            if now >= p.expires && p.tokens > 0 {
                p.back += p.tokens;
                p.tokens = 0;
                p.since = p.expires;
            }
            // Busy proxies and quiet ones (whose leases expire with tokens unspent).
            let quiet = 1 + 30 * ((n as u64 + seed) % 3);
            while p.tokens > 0 && now >= p.vest_at && rng.below(3 * quiet) < 2 {
                p.tokens -= 1;
                p.spent += 1;
                p.since = now;
                admitted.push(now);
            }
        }
        // Calls that run now.
        let mut i = 0;
        while i < calls.len() {
            if calls[i].runs != now {
                i += 1;
                continue;
            }
            let c = calls.swap_remove(i);
            let holder = Holder::new(ps[c.p].id, c.seq, HOLD_MS, &c.steps).giving_back(c.back);
            let holder = match c.demand {
                Some(d) => holder.demanding(d),
                None => holder,
            };
            let ask = Ask {
                cost: 1,
                lease_want: c.want,
                holder: Some(holder),
                max_wait_ms: 10 * rng.below(3),
                settle: 0,
                track: None,
            };
            let (next, r) = take_held(state, &mut holders, &l, &ask, now * 1000);
            state = next;
            let equal = l.burst / (holders.0.len() as u64).max(1);
            weighted += u64::from(r.granted > equal.max(1));
            if r.allowed && r.granted > 0 {
                answers.push(Answer {
                    p: c.p,
                    seq: c.seq,
                    granted: r.granted,
                    // A negative retry is a racer's next turn: its tokens are there now.
                    vest_at: now + u64::try_from(r.retry_after_ms.max(0)).unwrap(),
                    lands: now + rng.below(5),
                });
            }
        }
        // Answers that land now: deposited only by the latest call.
        let mut i = 0;
        while i < answers.len() {
            if answers[i].lands != now {
                i += 1;
                continue;
            }
            let a = answers.swap_remove(i);
            let p = &mut ps[a.p];
            if a.seq == p.seq {
                p.tokens += a.granted;
                p.vest_at = p.vest_at.max(a.vest_at);
                p.expires = p.expires.max(p.vest_at.max(now) + LIFE_MS);
                p.since = now;
                p.flight_until = 0;
            }
        }
        // Exact callers.
        if rng.below(4) == 0 {
            for _ in 0..=rng.below(3) {
                let ask = Ask {
                    cost: 1,
                    ..Ask::default()
                };
                let (next, r) = take_held(state, &mut holders, &l, &ask, now * 1000);
                state = next;
                if r.allowed {
                    admitted.push(now);
                }
            }
        }
        // Proxies out of tokens call (one call out at a time, unless it lapsed).
        for (n, p) in ps.iter_mut().enumerate() {
            if p.tokens > 1 || now < p.flight_until || rng.below(3) != 0 {
                continue;
            }
            p.seq += 1;
            let steps = if now >= p.expires {
                vec![(0, now - p.expires)]
            } else {
                vec![(p.tokens, now - p.since)]
            };
            let back = if liar {
                p.back = 0;
                std::mem::take(&mut p.spent)
            } else {
                p.spent = 0;
                std::mem::take(&mut p.back)
            };
            p.flight_until = now + TIMEOUT_MS;
            // Most run at once; some late, after a later call or after the proxy gave up.
            let delay = match rng.below(10) {
                0 => TIMEOUT_MS + rng.below(20),
                1..=2 => rng.below(TIMEOUT_MS),
                _ => 0,
            };
            gave_back += back;
            // Skewed: the first proxy busiest; now and then none, or the most there is.
            let demand = match rng.below(8) {
                0 => None,
                1 => Some(MAX_DEMAND),
                2 => Some(0),
                _ => Some(rng.below(1000) * 1000 / (n as u64 + 1).pow(2)),
            };
            calls.push(Call {
                p: n,
                seq: p.seq,
                // Any size, or (so that holders often hold under half the burst, where demands
                // weigh shares) a small one.
                want: 1 + match rng.below(2) {
                    0 => rng.below(l.burst),
                    _ => rng.below((l.burst / (2 * proxies as u64)).max(1)),
                },
                back,
                demand,
                steps,
                runs: now + delay,
            });
        }
    }
    Ran {
        admitted,
        gave_back,
        weighted,
    }
}

/// The largest excess of admissions over burst + refill in any window.
fn excess(l: &Limits, admitted: &[u64]) -> i64 {
    let mut worst = i64::MIN;
    for (i, &from) in admitted.iter().enumerate() {
        for (j, &to) in admitted.iter().enumerate().skip(i) {
            let count = (j - i + 1) as i64;
            let bound = l.burst + ((to - from) * l.rate).div_ceil(l.period_ms);
            worst = worst.max(count - bound as i64);
        }
    }
    worst
}

fn cases() -> Vec<(Limits, usize)> {
    let l = |burst, rate, period_ms| Limits {
        burst,
        rate,
        period_ms,
    };
    vec![
        (l(10, 100, 1000), 1),
        (l(10, 100, 1000), 3),
        // Shares of 2 and 1: racing.
        (l(12, 200, 1000), 6),
        (l(20, 50, 1000), 12),
        (l(4, 30, 1000), 3),
        (l(40, 400, 1000), 9),
        (l(100, 20, 100), 30),
        // Refill to spare, many holders: the bucket holds plenty, and the demands weigh shares.
        (l(200, 4000, 1000), 20),
        (l(60, 1000, 1000), 15),
        (l(1000, 20000, 1000), 12),
    ]
}

#[test]
fn honest_holders_giving_back_never_pass_burst_plus_rate_in_any_window() {
    let mut weighted_any = 0;
    for (l, proxies) in cases() {
        let (mut admitted_any, mut back_any) = (0, 0);
        for seed in 0..12u64 {
            let ran = run(seed * 7919 + proxies as u64, l, proxies, false);
            admitted_any += ran.admitted.len();
            back_any += ran.gave_back;
            weighted_any += ran.weighted;
            let e = excess(&l, &ran.admitted);
            assert!(e <= 0, "{l:?} x{proxies} seed {seed}: {e} over");
        }
        assert!(admitted_any > 100, "{l:?}: the run admits ({admitted_any})");
        assert!(back_any > 10, "{l:?}: proxies give back ({back_any})");
    }
    assert!(
        weighted_any > 50,
        "demands weigh some grants past the equal share ({weighted_any})"
    );
}

#[test]
fn a_holder_giving_back_what_it_spent_passes_the_bound() {
    let over = cases()
        .into_iter()
        .filter(|&(l, proxies)| {
            (0..12u64).any(|s| excess(&l, &run(s, l, proxies, true).admitted) > 0)
        })
        .count();
    assert!(over > 0, "the check sees a liar");
}
