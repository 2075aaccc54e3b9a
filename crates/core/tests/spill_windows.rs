//! Refunds never break "at most `burst + rate × W` in any window of W ms", on the model
//! (`bucket::take_held` in the tracked form) and the proxies' settle tables
//! (`shared::settle`).
//!
//! Invariant: proxies take from one bucket and ask for their take's spill epoch; a request
//! refused by another rule asks for all it took back, one whose response used less for the
//! difference, after a random delay (at once, or after a long answer), with the epoch its take's
//! reply gave. A proxy's refunds of the key merge in its table; a settle-only call flushes them,
//! a later take carries them. A call may fail before it leaves (what it carried is pending again,
//! charge and refund) or after its script may have run (its charge is pending again, its refund
//! dropped). Scripts run in the order of their run times, each a little after its call was sent.
//! Every window of every length is checked. Refunds given back whole, as if banked (what the
//! script did before it kept a spill epoch), must break the bound: the check can fail; so must
//! a proxy that sends again the refund of a call that may have run.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;

use tollgate_core::bucket::{take_held, Ask, Holders, Limits, Stamp, State, Tracked};
use tollgate_core::shared::mem::MemStore;
use tollgate_core::shared::settle::{self, Refund};

mod common;

use common::{excess, Rng};

/// A call's script runs at most this long after the call was sent.
const LATENCY_MS: u64 = 30;
const KEY: &str = "k";
const NS: &str = "ns";

/// How refunds reach the bucket in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// The script's spill epoch; a refund whose call may have run is dropped.
    Spill,
    /// Given back whole, whenever they reach the script, never past full.
    Unreduced,
    /// No refund ever comes back (for comparison: what the refunds are worth).
    Never,
}

enum Event {
    /// Proxy `p` sends a request's call; `keeps`: whether its request keeps all it takes, or
    /// asks for all of it back (None: either, or part, at random).
    Request {
        p: usize,
        cost: u64,
        keeps: Option<bool>,
    },
    /// Proxy `p` flushes its pending settlement for the key.
    Flush { p: usize },
    /// A call's script runs, carrying `taken`; `cost` 0: settle-only. `fails`: the proxy then
    /// sees it fail (a timeout: the script may have run).
    Run {
        p: usize,
        cost: u64,
        taken: settle::Taken,
        keeps: Option<bool>,
        fails: bool,
    },
    /// Proxy `p` learns that `tokens` of a take answered with `stamp` go back.
    Refund { p: usize, tokens: u64, stamp: Stamp },
}

struct Sim {
    rng: Rng,
    l: Limits,
    rule: Rule,
    state: Option<State>,
    tables: Vec<MemStore>,
    events: BTreeMap<(u64, u64), Event>,
    seq: u64,
    /// (time, tokens used) of every admission.
    used: Vec<(u64, u64)>,
}

impl Sim {
    fn new(seed: u64, l: Limits, proxies: usize, rule: Rule) -> Sim {
        Sim {
            rng: Rng(seed),
            l,
            rule,
            state: None,
            tables: (0..proxies).map(|_| MemStore::default()).collect(),
            events: BTreeMap::new(),
            seq: 0,
            used: Vec::new(),
        }
    }

    fn at(&mut self, t: u64, e: Event) {
        self.seq += 1;
        self.events.insert((t, self.seq), e);
    }

    fn limit(&self) -> u64 {
        self.l.burst * 4
    }

    /// What proxy `p`'s call sent now carries of its pending settlement.
    fn carry(&mut self, p: usize) -> settle::Taken {
        settle::take_within(&self.tables[p], NS, KEY, self.limit()).unwrap()
    }

    fn put_back(&mut self, p: usize, now: u64, taken: settle::Taken, refund_too: bool) {
        if taken.charge > 0 {
            let limit = self.limit();
            assert!(settle::add_charge(&self.tables[p], NS, KEY, taken.charge, limit).unwrap());
        }
        if refund_too && taken.refund.tokens > 0 {
            self.add_refund(p, now, taken.refund);
        }
    }

    fn send(&mut self, p: usize, now: u64, cost: u64, keeps: Option<bool>) {
        let taken = self.carry(p);
        // Never left: all of it is pending again.
        if self.rng.below(10) == 0 && !taken.is_empty() {
            self.put_back(p, now, taken, true);
            return;
        }
        // It runs; now and then the proxy sees it time out (its request refused, then).
        let fails = self.rng.below(9) == 0;
        let keeps = if fails { Some(true) } else { keeps };
        let run = now + self.rng.below(LATENCY_MS + 1);
        self.at(
            run,
            Event::Run {
                p,
                cost,
                taken,
                keeps,
                fails,
            },
        );
    }

    fn add_refund(&mut self, p: usize, now: u64, refund: Refund) {
        let limit = self.limit();
        assert!(settle::add_refund(&self.tables[p], NS, KEY, refund, limit)
            .unwrap()
            .is_some());
        let flush_ms = 1 + self.rng.below(60);
        self.at(now + flush_ms, Event::Flush { p });
    }

    /// The script's step at `now` for a call of `cost` carrying `taken`.
    fn script(
        &mut self,
        now: u64,
        cost: u64,
        taken: settle::Taken,
    ) -> tollgate_core::bucket::Reply {
        let l = self.l;
        let mut ask = Ask {
            cost,
            settle: i64::try_from(taken.charge).unwrap(),
            track: Some(Tracked {
                refund: taken.refund.tokens,
                epoch: taken.refund.epoch,
                mark: taken.refund.mark,
            }),
            ..Ask::default()
        };
        if self.rule == Rule::Unreduced && taken.refund.tokens > 0 {
            // As the script did before: refill to now, then the refund as if banked, never
            // past full; then the rest of the call.
            let refill = Ask {
                track: Some(Tracked::default()),
                ..Ask::default()
            };
            let (s, _) = take_held(self.state, &mut Holders::default(), &l, &refill, now * 1000);
            let per_token = l.units_per_token().unwrap() as i64;
            let full = l.burst as i64 * per_token;
            self.state = s.map(|mut s| {
                let back = taken.refund.tokens as i64 * per_token;
                s.units = s.units.max((s.units + back).min(full));
                s
            });
            ask.track = Some(Tracked::default());
        }
        let (s, r) = take_held(self.state, &mut Holders::default(), &l, &ask, now * 1000);
        self.state = s;
        r
    }

    fn step(&mut self, now: u64, e: Event) {
        match e {
            Event::Request { p, cost, keeps } => self.send(p, now, cost, keeps),
            Event::Flush { p } => self.send(p, now, 0, None),
            Event::Refund { p, tokens, stamp } => {
                let (epoch, mark) = (stamp.epoch, stamp.mark);
                self.add_refund(
                    p,
                    now,
                    Refund {
                        tokens,
                        epoch,
                        mark,
                    },
                )
            }
            Event::Run {
                p,
                cost,
                taken,
                keeps,
                fails,
            } => {
                let r = self.script(now, cost, taken);
                if fails {
                    // The proxy saw a timeout: its charge goes again; its refund too only as the
                    // filter did before. Its request got the failure mode (refused).
                    let refund_too = self.rule == Rule::Unreduced;
                    self.put_back(p, now, taken, refund_too);
                    return;
                }
                if cost == 0 || !r.allowed {
                    return;
                }
                let back = match (keeps, self.rng.below(4)) {
                    // Went upstream and used it all.
                    (Some(true), _) | (None, 0) => 0,
                    // Refused by another rule: all of it.
                    (Some(false), _) | (None, 1 | 2) => cost,
                    // Its response used less.
                    (None, _) => self.rng.below(cost + 1),
                };
                self.used.push((now, cost - back));
                if back == 0 || self.rule == Rule::Never {
                    return;
                }
                let token_ms = self.l.period_ms / self.l.rate;
                let delay = match self.rng.below(4) {
                    0 => self.rng.below(5),
                    1 => self.rng.below(token_ms + 1),
                    2 => self.rng.below(token_ms * 4 + 1),
                    _ => self.rng.below(token_ms * self.l.burst * 3 + 1),
                };
                let stamp = r.epoch.expect("a take in the tracked form has its stamp");
                self.at(
                    now + delay,
                    Event::Refund {
                        p,
                        tokens: back,
                        stamp,
                    },
                );
            }
        }
    }

    fn run(mut self) -> Vec<(u64, u64)> {
        while let Some(((now, _), e)) = self.events.pop_first() {
            self.step(now, e);
        }
        self.used
    }
}

/// What one random run used, by time: `proxies` proxies, each with requests arriving at random.
fn run(seed: u64, l: Limits, proxies: usize, rule: Rule) -> Vec<(u64, u64)> {
    let mut sim = Sim::new(seed, l, proxies, rule);
    let token_ms = l.period_ms / l.rate;
    // Odd seeds come in bursts: a few requests at once, then quiet up to twice the time the
    // bucket takes to fill (so it fills, and refunds come back after it did).
    let bursty = seed % 2 == 1;
    let mut t = 1_000_000;
    for _ in 0..300 {
        t += match sim.rng.below(4) {
            0 => sim.rng.below(3),
            _ if bursty && sim.rng.below(2) == 0 => 0,
            _ if bursty => sim.rng.below(token_ms * l.burst * 2 + 1),
            1 | 2 => sim.rng.below(token_ms + 1),
            _ => sim.rng.below(token_ms * l.burst + 1),
        };
        if seed % 3 == 2 {
            t = episode(&mut sim, t, proxies);
            continue;
        }
        let p = sim.rng.below(proxies as u64) as usize;
        // Small costs, and now and then most of the bucket at once.
        let cost = if sim.rng.below(4) == 0 {
            1 + sim.rng.below(l.burst)
        } else {
            1 + sim.rng.below(l.burst.min(3))
        };
        sim.at(
            t,
            Event::Request {
                p,
                cost,
                keeps: None,
            },
        );
    }
    sim.run()
}

/// One round of what makes a refund dangerous, from time `t`: requests at once that drain the
/// bucket and ask for all of it back (some soon, some after long answers), then, once the bucket
/// may have filled again, requests at once that keep what they take. When the next round starts.
fn episode(sim: &mut Sim, t: u64, proxies: usize) -> u64 {
    let l = sim.l;
    let fill_ms = l.period_ms * l.burst / l.rate;
    for _ in 0..1 + sim.rng.below(l.burst.min(6)) {
        let p = sim.rng.below(proxies as u64) as usize;
        let cost = 1 + sim.rng.below(l.burst.min(4));
        sim.at(
            t,
            Event::Request {
                p,
                cost,
                keeps: Some(false),
            },
        );
    }
    let mut later = t;
    for _ in 0..2 {
        later += fill_ms / 4 + sim.rng.below(fill_ms + 1);
        for _ in 0..1 + sim.rng.below(l.burst) {
            let p = sim.rng.below(proxies as u64) as usize;
            sim.at(
                later,
                Event::Request {
                    p,
                    cost: 1,
                    keeps: Some(true),
                },
            );
        }
    }
    later + sim.rng.below(fill_ms * 2 + 1)
}

fn lim(burst: u64, rate: u64, period_ms: u64) -> Limits {
    Limits {
        burst,
        rate,
        period_ms,
    }
}

fn cases() -> Vec<(Limits, usize)> {
    vec![
        (lim(1, 1, 1000), 1),
        (lim(1, 1, 1000), 3),
        (lim(5, 1, 200), 2),
        (lim(10, 10, 1000), 1),
        (lim(10, 10, 1000), 4),
        (lim(20, 3, 1000), 3),
    ]
}

/// The worst excess over the cases and `seeds` seeds each, where it was, and the tokens used.
fn worst(rule: Rule, seeds: u64) -> (i64, String, u64) {
    let mut worst = (i64::MIN, String::new(), 0);
    for (case, (l, proxies)) in cases().into_iter().enumerate() {
        for seed in 0..seeds {
            let used = run(0x5eed_0000 + seed * 31 + case as u64, l, proxies, rule);
            worst.2 += used.iter().map(|u| u.1).sum::<u64>();
            let e = excess(&l, &used);
            if e > worst.0 {
                worst.0 = e;
                worst.1 = format!("{l:?}, {proxies} proxies, seed {seed}");
            }
        }
    }
    worst
}

#[test]
fn refunds_bounded_by_the_spill_epoch_never_pass_the_bound_in_any_window() {
    let (over, at, used) = worst(Rule::Spill, 40);
    println!("spill epoch: {over} tokens over the bound at worst ({at}); {used} tokens used");
    assert!(over <= 0, "{over} tokens over the bound ({at})");
    // What comes back is used again: the same runs use less when nothing ever comes back.
    let (_, _, without) = worst(Rule::Never, 40);
    println!("no refund ever: {without} tokens used");
    assert!(
        used > without,
        "{used} used with refunds, {without} without"
    );
}

#[test]
fn refunds_given_back_unreduced_pass_the_bound() {
    let (over, at, _) = worst(Rule::Unreduced, 40);
    println!("unreduced: {over} tokens over the bound at worst ({at})");
    assert!(over > 0, "the check can fail");
}

/// What a call carries to give back `tokens` of the take answered with `r`.
fn refund_of(tokens: u64, r: &tollgate_core::bucket::Reply) -> settle::Taken {
    let stamp = r.epoch.expect("a take in the tracked form has its stamp");
    settle::Taken {
        refund: Refund {
            tokens,
            epoch: stamp.epoch,
            mark: stamp.mark,
        },
        ..settle::Taken::default()
    }
}

/// A refund given back twice (a call that timed out after its script ran, sent again) mints a
/// token within the stretch's headroom: burst 4, no refill to speak of. X takes 2 and keeps
/// them, R takes 1 and is refused, Y takes 1; R's token comes back, twice if retried; Z takes
/// 2. Five tokens at one instant where the bound is 4.
fn given_back_twice(twice: bool) -> i64 {
    let l = lim(4, 1, 3_600_000);
    let mut sim = Sim::new(1, l, 1, Rule::Spill);
    // The tracked form throughout: R's refund is bounded by the stretch's headroom, not by R.
    let take = |sim: &mut Sim, cost| {
        let r = sim.script(0, cost, settle::Taken::default());
        assert!(r.allowed);
        r
    };
    take(&mut sim, 2);
    let r = take(&mut sim, 1);
    take(&mut sim, 1);
    let refund = refund_of(1, &r);
    sim.script(0, 0, refund);
    if twice {
        sim.script(0, 0, refund);
    }
    let z = sim.script(0, 2, settle::Taken::default());
    let used = [2, 1, if z.allowed { 2 } else { 0 }];
    let used: Vec<(u64, u64)> = used.into_iter().map(|n| (0, n)).collect();
    excess(&l, &used)
}

#[test]
fn a_refund_given_back_twice_passes_the_bound_and_once_does_not() {
    assert_eq!(
        given_back_twice(false),
        -1,
        "X 2 + Y 1 within the bound of 4"
    );
    assert_eq!(given_back_twice(true), 1, "the check can fail");
}

/// The refunds are not for nothing: with the spill epoch, a refund from a drained bucket comes
/// back (the runs use more than they would if no refund ever came back).
#[test]
fn refunds_from_a_drained_bucket_come_back() {
    let l = lim(5, 1, 1000);
    let mut sim = Sim::new(1, l, 1, Rule::Spill);
    let take = |sim: &mut Sim, now, cost| sim.script(now, cost, settle::Taken::default());
    let a = take(&mut sim, 0, 5);
    assert!(a.allowed && a.remaining == 0);
    // Refunded 100 ms later: 0.1 token refilled since, so 4.9 come back.
    sim.script(100, 0, refund_of(5, &a));
    let b = take(&mut sim, 100, 5);
    assert!(b.allowed, "the bucket is full again");
    let c = take(&mut sim, 100, 1);
    assert!(!c.allowed, "and never more");
}
