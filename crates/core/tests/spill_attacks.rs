//! Attacks on the spill epoch, on the model (`bucket::take_held` in the tracked form): refunds of
//! takes that reserved (max_wait_ms, the bucket in debt), takes and refunds beside lease holders
//! of the same key (grants, holders that expire mid-call), refunds carried on a take of the same
//! call, and keys deleted when full and created again. Every window of every length stays within
//! `burst + rate × W`.
//!
//! Invariant: each admission is counted as used when its request goes upstream (a reservation:
//! when its delay ends) for what it keeps (its cost less the refund it asks for, whatever comes
//! back); a holder's grant is spent at once. Each refund is sent once, with its take's stamp.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;

use tollgate_core::bucket::{take_held, Ask, Holder, Holders, Limits, Stamp, State, Tracked};

mod common;

use common::{excess, Rng};

enum Event {
    /// An exact-mode take of `cost`, holding up to `max_wait_ms`.
    Take { cost: u64, max_wait_ms: u64 },
    /// A holder's lease call wanting `want`.
    Lease { id: u64, want: u64, hold_ms: u64 },
    /// `tokens` of the take answered with `stamp` go back: carried on a settle-only call, or on a
    /// take (`carrier`).
    Refund {
        tokens: u64,
        stamp: Stamp,
        carrier: Option<(u64, u64)>,
    },
}

struct Sim {
    rng: Rng,
    l: Limits,
    state: Option<State>,
    holders: Holders,
    seqs: BTreeMap<u64, u64>,
    events: BTreeMap<(u64, u64), Event>,
    n: u64,
    used: Vec<(u64, u64)>,
    /// Whether refunds are sent at all (false: for comparison).
    refunds: bool,
    /// Exact-mode takes admitted.
    admitted: u64,
}

impl Sim {
    fn at(&mut self, t: u64, e: Event) {
        self.n += 1;
        self.events.insert((t, self.n), e);
    }

    fn call(&mut self, now_ms: u64, ask: &Ask) -> tollgate_core::bucket::Reply {
        let (s, r) = take_held(self.state, &mut self.holders, &self.l, ask, now_ms * 1000);
        self.state = s;
        r
    }

    fn take(&mut self, now: u64, cost: u64, max_wait_ms: u64, track: Tracked) {
        let ask = Ask {
            cost,
            max_wait_ms,
            track: Some(track),
            ..Ask::default()
        };
        let r = self.call(now, &ask);
        if !r.allowed || cost == 0 {
            return;
        }
        self.admitted += 1;
        let start = now + u64::try_from(r.retry_after_ms.max(0)).unwrap();
        let back = match self.rng.below(4) {
            0 => 0,
            1 | 2 => cost,
            _ => self.rng.below(cost + 1),
        };
        self.used.push((start, cost - back));
        if back == 0 || !self.refunds {
            return;
        }
        let token_ms = self.l.period_ms / self.l.rate;
        let delay = match self.rng.below(5) {
            0 => 0,
            1 => self.rng.below(token_ms + 1),
            2 => self.rng.below(token_ms * 4 + 1),
            3 => u64::try_from(r.retry_after_ms.max(0)).unwrap() + self.rng.below(3),
            _ => self.rng.below(token_ms * self.l.burst * 3 + 1),
        };
        let carrier = (self.rng.below(2) == 0).then(|| {
            (
                1 + self.rng.below(self.l.burst.min(3)),
                [0, 0, token_ms, token_ms * 3][self.rng.below(4) as usize],
            )
        });
        let stamp = r.epoch.expect("a tracked take has its stamp");
        self.at(
            now + delay,
            Event::Refund {
                tokens: back,
                stamp,
                carrier,
            },
        );
    }

    fn step(&mut self, now: u64, e: Event) {
        match e {
            Event::Take { cost, max_wait_ms } => {
                self.take(now, cost, max_wait_ms, Tracked::default())
            }
            Event::Refund {
                tokens,
                stamp,
                carrier,
            } => {
                let track = Tracked {
                    refund: tokens,
                    epoch: stamp.epoch,
                    mark: stamp.mark,
                };
                match carrier {
                    Some((cost, max_wait_ms)) => self.take(now, cost, max_wait_ms, track),
                    None => {
                        let ask = Ask {
                            track: Some(track),
                            ..Ask::default()
                        };
                        self.call(now, &ask);
                    }
                }
            }
            Event::Lease { id, want, hold_ms } => {
                let seq = self.seqs.entry(id).or_insert(0);
                *seq += 1;
                // It spent every grant at once: it holds nothing.
                let holder = Holder::new(id, *seq, hold_ms, &[(0, 0)]);
                let ask = Ask {
                    cost: 1,
                    lease_want: want,
                    holder: Some(holder),
                    ..Ask::default()
                };
                let r = self.call(now, &ask);
                if r.allowed {
                    let start = now + u64::try_from(r.retry_after_ms.max(0)).unwrap();
                    self.used.push((start, r.granted));
                }
            }
        }
    }
}

/// What one run used, by time, and how many exact-mode takes it admitted.
fn run(seed: u64, l: Limits, holders: bool, refunds: bool) -> (Vec<(u64, u64)>, u64) {
    let mut sim = Sim {
        rng: Rng(seed),
        l,
        state: None,
        holders: Holders::default(),
        seqs: BTreeMap::new(),
        events: BTreeMap::new(),
        n: 0,
        used: Vec::new(),
        refunds,
        admitted: 0,
    };
    let token_ms = l.period_ms / l.rate;
    let mut t = 1_000_000;
    for _ in 0..300 {
        t += match sim.rng.below(5) {
            0 => 0,
            1 => sim.rng.below(3),
            2 => sim.rng.below(token_ms + 1),
            3 => sim.rng.below(token_ms * l.burst + 1),
            _ => sim.rng.below(token_ms * l.burst * 2 + 1),
        };
        let e = if holders && sim.rng.below(3) == 0 {
            Event::Lease {
                id: 1 + sim.rng.below(3),
                want: 1 + sim.rng.below(l.burst),
                hold_ms: sim.rng.below(token_ms * 3 + 1),
            }
        } else {
            let cost = if sim.rng.below(4) == 0 {
                1 + sim.rng.below(l.burst)
            } else {
                1 + sim.rng.below(l.burst.min(3))
            };
            let max_wait_ms =
                [0, token_ms, token_ms * 3, token_ms * l.burst * 2][sim.rng.below(4) as usize];
            Event::Take { cost, max_wait_ms }
        };
        sim.at(t, e);
    }
    while let Some(((now, _), e)) = sim.events.pop_first() {
        sim.step(now, e);
    }
    sim.used.sort();
    (sim.used, sim.admitted)
}

/// The worst excess over the cases, where it was, and the takes admitted.
fn worst(holders: bool, refunds: bool) -> (i64, String, u64) {
    let cases = [
        (5, 1, 200),
        (1, 1, 1000),
        (10, 10, 1000),
        (20, 3, 1000),
        (6, 2, 100),
    ];
    let mut worst = (i64::MIN, String::new(), 0);
    for (c, (burst, rate, period_ms)) in cases.into_iter().enumerate() {
        let l = Limits {
            burst,
            rate,
            period_ms,
        };
        for seed in 0..60 {
            let (used, admitted) = run(0xa77a_c000 + seed * 131 + c as u64, l, holders, refunds);
            worst.2 += admitted;
            let e = excess(&l, &used);
            if e > worst.0 {
                worst = (e, format!("{l:?}, seed {seed}"), worst.2);
            }
        }
    }
    worst
}

#[test]
fn refunds_of_reservations_and_carried_refunds_keep_the_bound() {
    let (over, at, admitted) = worst(false, true);
    println!(
        "reservations, carried refunds: {over} over the bound at worst ({at}); {admitted} admitted"
    );
    assert!(over <= 0, "{over} tokens over the bound ({at})");
    // What comes back is used again: the same runs admit fewer when no refund is sent.
    let (_, _, without) = worst(false, false);
    println!("no refund sent: {without} admitted");
    assert!(
        admitted > without,
        "{admitted} admitted with refunds, {without} without"
    );
}

#[test]
fn refunds_beside_lease_holders_keep_the_bound() {
    let (over, at, _) = worst(true, true);
    println!("beside holders: {over} over the bound at worst ({at})");
    assert!(over <= 0, "{over} tokens over the bound ({at})");
}

/// The harness counts reservations where their requests go: without refunds it finds nothing.
#[test]
fn without_refunds_the_runs_keep_the_bound() {
    for holders in [false, true] {
        let (over, at, _) = worst(holders, false);
        println!("no refund sent, holders {holders}: {over} over the bound at worst ({at})");
        assert!(over <= 0, "{over} tokens over the bound ({at})");
    }
}
