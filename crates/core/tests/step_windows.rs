//! The fleet bound at refill steps of a second and a minute, on the model (`bucket::take_held`):
//! in every window of W ms the bucket's callers admit at most `burst + rate × W`, W rounded up to
//! a whole step (the script's promise for long periods).
//!
//! Invariant: every admission is counted when the caller may act on it, at its worst: a held
//! request when its reservation's delay ends, a lease holder's tokens as early as the proxy's
//! lease pool lets them be spent (`shared::lease`: a reservation vests at the bucket's rate, up to
//! the time the script said). Random sequences, limits changing between steps of different sizes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_core::bucket::{take_held, Ask, Holder, Holders, Limits, State};

mod common;

use common::Rng;

const DAY_MS: u64 = 86_400_000;

/// (first, second) limits of one key; the sequence switches halfway.
fn cases() -> Vec<(Limits, Limits)> {
    let l = |burst, rate, period_ms| Limits {
        burst,
        rate,
        period_ms,
    };
    vec![
        // A second's step, 11,574 tokens a step.
        (
            l(1_000_000_000, 1_000_000_000, DAY_MS),
            l(1_000_000_000, 1_000_000_000, DAY_MS),
        ),
        // A minute's step, 1,897 tokens a step (10^9 a leap year).
        (
            l(1_000_000_000, 1_000_000_000, 366 * DAY_MS),
            l(1_000_000_000, 1_000_000_000, 366 * DAY_MS),
        ),
        // A second's step, then a minute's: the units rescale with state.
        (
            l(1_000_000_000, 1_000_000_000, DAY_MS),
            l(1_000_000_000, 1_000_000_000, 366 * DAY_MS),
        ),
        // A ms step (400,000 a month), then a second's (1,000,000 a month), and back.
        (
            l(400_000, 400_000, 30 * DAY_MS),
            l(1_000_000, 1_000_000, 30 * DAY_MS),
        ),
        (
            l(1_000_000, 1_000_000, 30 * DAY_MS),
            l(400_000, 400_000, 30 * DAY_MS),
        ),
        // Small bursts at a minute's step: 3 tokens a step.
        (
            l(2_000_000_000 / 2, 3 * 366 * 24 * 60, 366 * DAY_MS),
            l(2_000_000_000 / 2, 3 * 366 * 24 * 60, 366 * DAY_MS),
        ),
    ]
}

fn step_ms(l: &Limits) -> u64 {
    l.step_ms().expect("valid limits")
}

/// Tokens refilled by `k` whole steps, rounded up.
fn refill(l: &Limits, k: u64) -> u64 {
    let t = u128::from(k) * u128::from(l.rate) * u128::from(step_ms(l));
    u64::try_from(t.div_ceil(u128::from(l.period_ms))).unwrap_or(u64::MAX)
}

/// The bound over a window of `w` ms under either limits: the wider burst plus the faster refill
/// over w rounded up to whole steps.
fn bound(a: &Limits, b: &Limits, w: u64) -> u64 {
    let r = |l: &Limits| refill(l, w.div_ceil(step_ms(l)));
    a.burst.max(b.burst) + r(a).max(r(b))
}

/// Every window that starts at an admission, up to `STEPS_CHECKED` steps long: at most `bound`.
/// The bound is constant between multiples of either step, so the window up to the last
/// admission before each multiple is the worst of its stretch.
fn check_windows(ctx: &str, a: &Limits, b: &Limits, mut events: Vec<(u64, u64)>) -> usize {
    const STEPS_CHECKED: u64 = 12;
    events.sort_unstable();
    let mut times: Vec<u64> = Vec::new();
    let mut prefix: Vec<u64> = vec![0];
    for (t, n) in events {
        if times.last() == Some(&t) {
            *prefix.last_mut().unwrap() += n;
        } else {
            times.push(t);
            prefix.push(prefix.last().unwrap() + n);
        }
    }
    let mut widths: Vec<u64> = (0..=STEPS_CHECKED)
        .flat_map(|k| [k * step_ms(a), k * step_ms(b)])
        .collect();
    widths.sort_unstable();
    widths.dedup();
    for &w in &widths {
        let max = bound(a, b, w);
        // j: the last admission at or before times[i] + w (moves forward with i).
        let mut j = 0;
        for i in 0..times.len() {
            while j + 1 < times.len() && times[j + 1] <= times[i] + w {
                j += 1;
            }
            let admitted = prefix[j + 1] - prefix[i];
            assert!(
                admitted <= max,
                "{ctx}: {admitted} tokens admitted from {} ms to {} ms (within {w} ms), bound \
                 {max} ({a:?} / {b:?})",
                times[i],
                times[j]
            );
        }
    }
    times.len()
}

/// Calls spent at once or held for their reservation (exact mode, and the model's plain lease).
#[test]
fn exact_calls_never_pass_the_bound_in_any_window_at_long_steps() {
    for (case, (a, b)) in cases().into_iter().enumerate() {
        let mut rng = Rng(0x5eed + case as u64);
        let mut state: Option<State> = None;
        let mut now_us: u64 = 1_000_000_000;
        let mut events = Vec::new();
        const CALLS: usize = 1500;
        for i in 0..CALLS {
            let l = if i < CALLS / 2 { a } else { b };
            let step = step_ms(&l);
            now_us += match rng.below(10) {
                0..=5 => rng.below(step * 1000 / 4),
                6..=8 => rng.below(step * 3000),
                _ => rng.below(step * 100_000),
            };
            let per_step = refill(&l, 1).max(1);
            let cost = 1 + rng.below(per_step * 2);
            let cost = cost.min(l.burst);
            let ask = Ask {
                cost,
                lease_want: if rng.below(3) == 0 {
                    rng.below(l.burst)
                } else {
                    0
                },
                holder: None,
                max_wait_ms: if rng.below(2) == 0 {
                    rng.below(step * 4)
                } else {
                    0
                },
                settle: 0,
                track: None,
            };
            let (s, r) = take_held(state, &mut Holders::default(), &l, &ask, now_us);
            state = s;
            if r.allowed && r.granted > 0 {
                let at_ms = now_us / 1000 + u64::try_from(r.retry_after_ms).unwrap_or(0);
                events.push((at_ms, r.granted));
            }
        }
        let ctx = format!("case {case} (exact)");
        let n = check_windows(&ctx, &a, &b, events);
        assert!(n > 50, "{ctx}: the sequence admits ({n} times)");
    }
}

/// Two lease holders that spend their grants as early as the proxy's lease pool lets them: what
/// is there at once, a reservation as it vests at the bucket's rate until the time the script
/// said (`Lease::spendable`), each reporting truthfully what it still holds.
#[test]
fn lease_holders_never_pass_the_bound_in_any_window_at_long_steps() {
    for (case, (a, b)) in cases().into_iter().enumerate() {
        let mut rng = Rng(0xfee1 + case as u64);
        let mut state: Option<State> = None;
        let mut holders = Holders::default();
        let mut now_us: u64 = 1_000_000_000;
        let mut events: Vec<(u64, u64)> = Vec::new();
        // Per holder: (ms, tokens) it will spend, not yet spent.
        let mut pending: [Vec<(u64, u64)>; 2] = [Vec::new(), Vec::new()];
        let mut seq = [0u64; 2];
        const CALLS: usize = 400;
        for i in 0..CALLS {
            let l = if i < CALLS / 2 { a } else { b };
            let step = step_ms(&l);
            now_us += match rng.below(10) {
                0..=5 => rng.below(step * 1000 / 4),
                6..=8 => rng.below(step * 3000),
                _ => rng.below(step * 100_000),
            };
            let now_ms = now_us / 1000;
            let who = rng.below(2) as usize;
            for p in pending.iter_mut() {
                p.retain(|&(t, n)| {
                    if t <= now_ms {
                        events.push((t, n));
                        false
                    } else {
                        true
                    }
                });
            }
            let held: u64 = pending[who].iter().map(|&(_, n)| n).sum();
            seq[who] += 1;
            let per_step = refill(&l, 1).max(1);
            let cost = (1 + rng.below(per_step)).min(l.burst);
            // Now and then as much as it can get (its share), to drain the bucket.
            let want = if rng.below(5) == 0 {
                l.burst
            } else {
                cost + rng.below(per_step * 4)
            };
            let horizon = rng.below(step);
            let holder = Holder::new(who as u64 + 1, seq[who], horizon * 2, &[(held, 0)]);
            let ask = Ask {
                cost,
                lease_want: want,
                holder: Some(holder),
                max_wait_ms: horizon * 10,
                settle: 0,
                track: None,
            };
            let (s, r) = take_held(state, &mut holders, &l, &ask, now_us);
            state = s;
            if !r.allowed || r.granted == 0 {
                continue;
            }
            // The lease pool: spendable = granted - refill_in(vest_until - now), refill_in(ms) =
            // ceil(ms × rate / period_ms), vest_until = now + retry_after_ms.
            let retry = u64::try_from(r.retry_after_ms).unwrap_or(0);
            let vest_until = now_ms + retry;
            let locked = u64::try_from(
                (u128::from(retry) * u128::from(l.rate)).div_ceil(u128::from(l.period_ms)),
            )
            .unwrap_or(u64::MAX)
            .min(r.granted);
            if r.granted > locked {
                events.push((now_ms, r.granted - locked));
            }
            // Token i of the locked ones (1..=locked) is spendable once at most locked - i are
            // still refilling: at vest_until - floor((locked - i) × period_ms / rate). Grouped
            // by time so a large grant stays a few events.
            let mut i = 1;
            while i <= locked {
                let at = |i: u64| {
                    vest_until
                        - u64::try_from(
                            u128::from(locked - i) * u128::from(l.period_ms) / u128::from(l.rate),
                        )
                        .unwrap_or(0)
                };
                let t = at(i);
                // The last token spendable in the same ms (at() grows with i).
                let mut lo = i;
                let mut hi = locked;
                while lo < hi {
                    let mid = lo + (hi - lo).div_ceil(2);
                    if at(mid) == t {
                        lo = mid;
                    } else {
                        hi = mid - 1;
                    }
                }
                pending[who].push((t.max(now_ms), lo - i + 1));
                i = lo + 1;
            }
        }
        for p in pending.iter() {
            events.extend(p.iter().copied());
        }
        let ctx = format!("case {case} (lease)");
        let n = check_windows(&ctx, &a, &b, events);
        assert!(n > 50, "{ctx}: the sequence admits ({n} times)");
    }
}
