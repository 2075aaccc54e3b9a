//! The fleet's event loop: every proxy's workers (the real engine each, one in-memory shared-data
//! store per proxy) on one simulated clock, requests arriving per proxy as a Poisson process, and
//! one bucket model per key (`tollgate_core::bucket`, the Lua script's model) answering each call
//! after a random round trip. Events run in time order, ties in the order they were scheduled, so
//! the same options and seed give the same requests (the engines' holder ids are their own). The
//! callbacks on a worker, and what they ask of the host, are the worker's (worker.rs), shared with
//! the original simulator; what this loop records of them is its own.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::rc::Rc;

use tollgate_core::bucket::{self, Ask, Holders, Limits, State};
use tollgate_core::engine::Action;
use tollgate_core::shared::mem::MemStore;

use super::demand::{self, Proxy};
use super::FleetOpts;
use crate::sim::Rng;
use crate::webdis::{parse_request, Form};
use crate::worker::{self, KeyedReq, Worker, USER_HEADER};

/// The simulated clock starts at a realistic Unix time (µs), as the proxy's clock would read.
const EPOCH_US: u64 = 1_700_000_000_000_000;
/// Envoy's direct response after an admission, in µs.
const UPSTREAM_US: u64 = 30;
/// The hot key's user.
pub const HOT_USER: &str = "hot";

/// A request: where it came from, which key, when it arrived and when it was admitted.
#[derive(Debug, Clone, Copy)]
pub struct ReqRec {
    pub proxy: u32,
    /// `None`: the hot key; else the warm key's number.
    pub warm: Option<u32>,
    pub arrived_us: u64,
    pub admitted_us: Option<u64>,
}

/// One request to the backend: its worker, its token, its form and its keys' records (indices
/// into `FleetSim::calls`), run together and answered together.
#[derive(Debug, Clone)]
pub struct Flight {
    pub proxy: u32,
    pub worker: u32,
    pub token: u32,
    pub form: Form,
    pub calls: Vec<usize>,
    pub lat_us: u64,
}

/// One key's script call (a single call, or one key of a batched one) and what the bucket
/// answered.
#[derive(Debug, Clone)]
pub struct CallRec {
    pub hot: bool,
    /// The proxy that sent it.
    pub proxy: u32,
    pub key: String,
    pub limits: Limits,
    pub ask: Ask,
    pub sent_us: u64,
    pub reply: Option<bucket::Reply>,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Arrive(u32),
    /// Redis runs a flight (an index into `flights`), and its answer arrives.
    Exec(u32),
    Answer(u32),
    Tick(u32, u32, u64),
    Complete(u32, u32, u32, u32),
}

/// One run of a fleet.
pub struct FleetSim<'o> {
    pub o: &'o FleetOpts,
    rng: Rng,
    now_us: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    pub proxies: Vec<Proxy>,
    workers: Vec<Vec<Worker>>,
    /// Requests per second each proxy sends at most (hot and warm together), and the hot part.
    rate_of: Vec<(f64, f64)>,
    pub reqs: Vec<ReqRec>,
    pub calls: Vec<CallRec>,
    flights: Vec<Flight>,
    buckets: HashMap<String, (Option<State>, Holders)>,
    warm_users: Vec<String>,
}

// The events are ordered by time and then by sequence number only; Ev needs an order to sit in
// the heap's tuple, never used (sequence numbers are unique).
impl PartialEq for Ev {
    fn eq(&self, _: &Ev) -> bool {
        true
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, other: &Ev) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ev {
    fn cmp(&self, _: &Ev) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// The fleet's two rules: the hot key's and the warm keys', each on its own path prefix.
fn rules(o: &FleetOpts) -> serde_json::Value {
    let rule = |name: &str, rate: u64, burst: u64| {
        let mut r = serde_json::json!({
            "name": name,
            "match": { "path_prefix": format!("/{name}/") },
            "key": [format!("header:{USER_HEADER}")],
            "rate": rate,
            "period_ms": 1000,
            "burst": burst,
            "mode": o.mode,
        });
        if let (Some(h), "lease") = (o.horizon_ms, o.mode) {
            r["lease_horizon_ms"] = h.into();
        }
        if o.max_wait_ms > 0 {
            r["max_wait_ms"] = o.max_wait_ms.into();
        }
        r
    };
    serde_json::json!([
        rule("hot", o.hot_rate, o.hot_burst),
        rule("warm", o.warm_rate, o.warm_burst),
    ])
}

impl<'o> FleetSim<'o> {
    pub fn new(o: &'o FleetOpts) -> FleetSim<'o> {
        let config = worker::config(rules(o));
        let proxies = demand::proxies(o);
        let (hot, warm) = demand::rates(o);
        let mut workers = Vec::new();
        for _ in 0..o.proxies {
            let store = Rc::new(MemStore::default());
            let ws = (0..o.workers)
                .map(|_| Worker::new(config.clone(), store.clone()))
                .collect();
            workers.push(ws);
        }
        let rate_of = proxies
            .iter()
            .map(|p| ((hot + warm) * p.weight, hot * p.weight))
            .collect();
        let mut sim = FleetSim {
            o,
            rng: Rng(o.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5bd1_e995),
            now_us: 0,
            seq: 0,
            events: BinaryHeap::new(),
            proxies,
            workers,
            rate_of,
            reqs: Vec::new(),
            calls: Vec::new(),
            flights: Vec::new(),
            buckets: HashMap::new(),
            warm_users: (0..o.warm_keys).map(|k| format!("user-{k}")).collect(),
        };
        for p in 0..o.proxies {
            let first = sim.proxies[p].join_us + sim.gap(p);
            sim.at(first, Ev::Arrive(p as u32));
        }
        sim
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.rng.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// The time to a proxy's next request (µs): exponential, at its rate.
    fn gap(&mut self, p: usize) -> u64 {
        let rate = self.rate_of[p].0;
        if rate <= 0.0 {
            return u64::MAX / 2;
        }
        (-self.unit().ln() / rate * 1e6).ceil() as u64
    }

    /// Runs to the end: requests arrive for `duration_ms`, then what is out settles.
    pub fn run(mut self) -> FleetSim<'o> {
        let end = self.o.duration_ms * 1000;
        while let Some(Reverse((t, _, ev))) = self.events.pop() {
            self.now_us = t;
            match ev {
                Ev::Arrive(p) => {
                    let p = p as usize;
                    if t >= end || t >= self.proxies[p].leave_us {
                        continue;
                    }
                    let next = t + self.gap(p);
                    self.at(next, Ev::Arrive(p as u32));
                    self.arrive(p);
                }
                Ev::Exec(c) => self.exec(c as usize),
                Ev::Answer(c) => self.answer(c as usize),
                Ev::Tick(p, w, gen) => {
                    // A proxy that left is gone: its ticks with it.
                    if t < self.proxies[p as usize].leave_us && t < end + 10_000_000 {
                        self.tick(p as usize, w as usize, gen);
                    }
                }
                Ev::Complete(p, w, ctx, status) => {
                    self.complete(p as usize, w as usize, ctx, status)
                }
            }
        }
        self
    }

    fn arrive(&mut self, p: usize) {
        let (all, hot) = self.rate_of[p];
        let warm = if self.o.warm_keys == 0 || self.unit() * all <= hot {
            None
        } else {
            Some((self.rng.next() % self.o.warm_keys as u64) as u32)
        };
        let w = self.rng.between(0, self.o.workers as u64 - 1) as usize;
        let now = self.now_us;
        let idx = self.reqs.len();
        self.reqs.push(ReqRec {
            proxy: p as u32,
            warm,
            arrived_us: now,
            admitted_us: None,
        });
        let (path, user) = match warm {
            None => ("/hot/x", HOT_USER),
            Some(k) => ("/warm/x", self.warm_users[k as usize].as_str()),
        };
        let req = KeyedReq { path, user };
        let (ctx, action) = self.workers[p][w].request((EPOCH_US + now) / 1000, idx, &req);
        if action == Action::Continue {
            self.reqs[idx].admitted_us = Some(now);
            self.at(
                now + UPSTREAM_US,
                Ev::Complete(p as u32, w as u32, ctx, 200),
            );
        }
        self.after(p, w);
    }

    fn complete(&mut self, p: usize, w: usize, ctx: u32, status: u32) {
        let now_ms = (EPOCH_US + self.now_us) / 1000;
        if self.workers[p][w].complete(now_ms, ctx, status).is_none() {
            return;
        }
        self.after(p, w);
    }

    /// Carries out what the engine asked of the host during a callback.
    fn after(&mut self, p: usize, w: usize) {
        let now = self.now_us;
        let asked = self.workers[p][w].drain();
        for (token, call) in asked.calls {
            let (form, groups) = parse_request(&call.body);
            let lat = self.rng.between(self.o.lat_min_us, self.o.lat_max_us);
            let f = self.flights.len();
            let mut calls = Vec::with_capacity(groups.len());
            for g in groups {
                calls.push(self.calls.len());
                self.calls.push(CallRec {
                    hot: g.key.contains("{hot:"),
                    proxy: p as u32,
                    key: g.key,
                    limits: g.limits,
                    ask: g.ask,
                    sent_us: now,
                    reply: None,
                });
            }
            self.flights.push(Flight {
                proxy: p as u32,
                worker: w as u32,
                token,
                form,
                calls,
                lat_us: lat,
            });
            self.at(now + lat / 2, Ev::Exec(f as u32));
        }
        for ctx in asked.resumed {
            if let Some(&r) = self.workers[p][w].reqs.get(&ctx) {
                self.reqs[r].admitted_us.get_or_insert(now);
            }
            self.at(
                now + UPSTREAM_US,
                Ev::Complete(p as u32, w as u32, ctx, 200),
            );
        }
        for (ctx, status) in asked.responded {
            self.at(
                now + UPSTREAM_US,
                Ev::Complete(p as u32, w as u32, ctx, status),
            );
        }
        if let Some((period, gen)) = asked.tick {
            self.at(now + period * 1000, Ev::Tick(p as u32, w as u32, gen));
        }
    }

    /// Redis runs the flight `f`: each key's call in order, each seeing the ones before.
    fn exec(&mut self, f: usize) {
        let now = EPOCH_US + self.now_us;
        for &i in &self.flights[f].calls {
            let call = &self.calls[i];
            let (state, mut holders) = self.buckets.remove(&call.key).unwrap_or_default();
            let (state, reply) =
                bucket::take_held(state, &mut holders, &call.limits, &call.ask, now);
            self.buckets.insert(call.key.clone(), (state, holders));
            self.calls[i].reply = Some(reply);
        }
        let lat = self.flights[f].lat_us;
        self.at(self.now_us + lat - lat / 2, Ev::Answer(f as u32));
    }

    fn answer(&mut self, f: usize) {
        let flight = &self.flights[f];
        let (p, w, token, form) = (
            flight.proxy as usize,
            flight.worker as usize,
            flight.token,
            flight.form,
        );
        let Some(replies) = flight
            .calls
            .iter()
            .map(|&i| self.calls[i].reply)
            .collect::<Option<Vec<_>>>()
        else {
            return;
        };
        if self.now_us >= self.proxies[p].leave_us {
            return; // the proxy is gone: nobody reads the answer
        }
        let now_ms = (EPOCH_US + self.now_us) / 1000;
        self.workers[p][w].answer(now_ms, token, form, &replies);
        self.after(p, w);
    }

    fn tick(&mut self, p: usize, w: usize, gen: u64) {
        let now = self.now_us;
        if !self.workers[p][w].tick((EPOCH_US + now) / 1000, gen) {
            return;
        }
        self.after(p, w);
        if let Some(period) = self.workers[p][w].ticking(gen) {
            self.at(now + period * 1000, Ev::Tick(p as u32, w as u32, gen));
        }
    }
}
