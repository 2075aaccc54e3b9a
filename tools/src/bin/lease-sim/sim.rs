//! The simulation: the real engine (`tollgate_core::engine::Engine`, one per worker, the proxy's
//! shared data an in-memory store shared by the workers of one proxy) on a simulated clock, driven
//! by paced clients like `make bench`'s (h2load `--rps`, one request in flight per connection,
//! every client's timer firing once per period from its connection). Events run in time order, ties
//! in the order they were scheduled, so the same options and seed give the same run. calls.rs
//! carries the script calls to the bucket model and back; account.rs keeps the ledger. The
//! callbacks on a worker, and what they ask of the host, are the worker's (worker.rs), shared with
//! the fleet.

mod account;
mod calls;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::rc::Rc;

use tollgate_core::bucket::{Holders, Limits, State};
use tollgate_core::engine::Action;
use tollgate_core::shared::mem::MemStore;

use crate::opts::{Assign, Opts};
use crate::run::Run;
use crate::worker::{self, Req, Worker, USER_HEADER};
use calls::{CallRec, Flight};

/// The simulated clock starts at a realistic Unix time (µs), as the proxy's clock would read.
const EPOCH_US: u64 = 1_700_000_000_000_000;
/// Client to Envoy and back, and Envoy's direct response, in µs.
const NET_US: u64 = 40;
const UPSTREAM_US: u64 = 30;
/// Connections of one h2load process are set up this far apart (µs).
const CONNECT_STAGGER_US: u64 = 120;
/// Each timer firing of a client is late by up to this (µs).
const FIRE_JITTER_US: u64 = 200;

/// Deterministic randomness (splitmix64).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi].
    pub(crate) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next() % (hi - lo + 1)
    }
}

struct Client {
    proxy: usize,
    worker: usize,
    period_us: u64,
    pending: u64,
    busy: bool,
    sent_at: u64,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Fire(usize),
    Arrive(usize),
    /// Redis runs a flight (an index into `flights`), and its answer arrives.
    Exec(usize),
    Answer(usize),
    Tick(usize, usize, u64),
    Complete(usize, usize, u32, u32),
    Receive(usize, u32),
    Sample,
}

/// A simulation of one load of one shape.
pub struct Sim<'o> {
    o: &'o Opts,
    rng: Rng,
    now_us: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, usize)>>,
    payloads: Vec<Ev>,
    workers: Vec<Vec<Worker>>,
    stores: Vec<Rc<MemStore>>,
    clients: Vec<Client>,
    calls: Vec<CallRec>,
    flights: Vec<Flight>,
    bucket: HashMap<String, (Option<State>, Holders)>,
    /// When the engine admitted each request (µs), in order.
    admits: Vec<u64>,
    /// When each counted request reached its proxy (µs).
    arrivals: Vec<u64>,
    end_us: u64,
    /// When the first client was due to start (the pauses count from it).
    load_start_us: u64,
    first_start: Option<u64>,
    last_end: u64,
    run: Run,
    bucket_samples: (f64, u64),
    held_samples: f64,
    limits: Limits,
    key: Option<String>,
    end_state: Option<State>,
    end_held: u64,
    last_tick: u64,
}

/// The shape's one rule: the bench's user header as the key, in lease mode.
fn rule(o: &Opts) -> serde_json::Value {
    let mut rule = serde_json::json!({
        "name": "per-user",
        "match": { "path_prefix": "/api/" },
        "key": [format!("header:{USER_HEADER}")],
        "rate": o.rate,
        "period_ms": 1000,
        "burst": o.burst,
        "mode": "lease",
    });
    if let Some(h) = o.horizon_ms {
        rule["lease_horizon_ms"] = h.into();
    }
    if let Some(m) = o.lease_max {
        rule["lease_max"] = m.into();
    }
    rule
}

impl<'o> Sim<'o> {
    pub fn new(o: &'o Opts, seed: u64) -> Sim<'o> {
        let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5bd1_e995);
        let config = worker::config(serde_json::json!([rule(o)]));
        let mut workers = Vec::new();
        let mut stores = Vec::new();
        for _ in 0..o.proxies {
            let store = Rc::new(MemStore::default());
            let mut ws = Vec::new();
            for _ in 0..o.workers {
                ws.push(Worker::new(config.clone(), store.clone()));
            }
            workers.push(ws);
            stores.push(store);
        }
        let per_client = o.load / (o.proxies * o.clients) as f64;
        let period_us = (1e6 / per_client).round().max(1.0) as u64;
        let mut clients = Vec::new();
        let mut sim = Sim {
            o,
            rng: Rng(0),
            now_us: 0,
            seq: 0,
            events: BinaryHeap::new(),
            payloads: Vec::new(),
            workers,
            stores,
            clients: Vec::new(),
            calls: Vec::new(),
            flights: Vec::new(),
            bucket: HashMap::new(),
            admits: Vec::new(),
            arrivals: Vec::new(),
            end_us: 0,
            load_start_us: 0,
            first_start: None,
            last_end: 0,
            run: Run {
                per_proxy: vec![0; o.proxies],
                calls_per_proxy: vec![0; o.proxies],
                ..Run::default()
            },
            bucket_samples: (0.0, 0),
            held_samples: 0.0,
            limits: Limits {
                burst: o.burst,
                rate: o.rate,
                period_ms: 1000,
            },
            key: None,
            end_state: None,
            end_held: 0,
            last_tick: 0,
        };
        // One h2load process per proxy, started in turn by the bench (a few ms apart, at a random
        // phase of the period); its clients connect one after another.
        let mut starts = Vec::new();
        for p in 0..o.proxies {
            let offset = rng.between(0, period_us.min(20_000));
            for c in 0..o.clients {
                let worker = match o.assign {
                    Assign::Random => rng.between(0, o.workers as u64 - 1) as usize,
                    Assign::RoundRobin => c % o.workers,
                };
                clients.push(Client {
                    proxy: p,
                    worker,
                    period_us,
                    pending: 0,
                    busy: false,
                    sent_at: 0,
                });
                starts.push(EPOCH_US + offset + c as u64 * CONNECT_STAGGER_US);
            }
        }
        sim.clients = clients;
        let first = starts.iter().copied().min().unwrap_or(0);
        let jitter = rng.between(0, 2 * o.jitter_ms * 1000);
        sim.end_us = first + (o.duration_ms * 1000 + jitter).saturating_sub(o.jitter_ms * 1000);
        sim.load_start_us = first;
        sim.rng = rng;
        for (c, at) in starts.into_iter().enumerate() {
            sim.at(at, Ev::Fire(c));
        }
        sim.at(first, Ev::Sample);
        sim
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.payloads.push(ev);
        self.events
            .push(Reverse((t, self.seq, self.payloads.len() - 1)));
    }

    pub fn run(mut self, trace: bool) -> Run {
        while let Some(Reverse((t, _, i))) = self.events.pop() {
            self.now_us = t;
            match self.payloads[i] {
                Ev::Fire(c) => self.fire(c),
                Ev::Arrive(c) => self.arrive(c),
                Ev::Exec(call) => self.exec(call),
                Ev::Answer(call) => self.answer(call),
                Ev::Tick(p, w, gen) => self.tick(p, w, gen),
                Ev::Complete(p, w, ctx, status) => self.complete(p, w, ctx, status),
                Ev::Receive(c, status) => self.receive(c, status),
                Ev::Sample => {
                    if self.now_us < self.end_us {
                        let level = self.level(self.now_us) as f64;
                        self.bucket_samples.0 += level;
                        self.bucket_samples.1 += 1;
                        let held = self.held(self.now_us);
                        self.held_samples += held as f64;
                        if self.o.trace && self.bucket_samples.1 % 10 == 1 {
                            let first = self.first_start.unwrap_or(0);
                            println!(
                                "  level {:8.1} ms: bucket {level:4} held {held:4} admitted {:4}",
                                self.now_us.saturating_sub(first) as f64 / 1000.0,
                                self.run.admitted
                            );
                        }
                        self.at(self.now_us + 1000, Ev::Sample);
                    }
                }
            }
        }
        if trace {
            self.print_calls();
        }
        self.finish()
    }

    fn fire(&mut self, c: usize) {
        if self.now_us >= self.end_us {
            return;
        }
        let jitter = self.rng.between(0, FIRE_JITTER_US);
        let period = self.clients[c].period_us;
        self.at(self.now_us + period + jitter, Ev::Fire(c));
        if let Some((on, off)) = self.o.pause {
            let since = self.now_us.saturating_sub(self.load_start_us) / 1000;
            if since % (on + off).max(1) >= on {
                return; // pausing
            }
        }
        self.clients[c].pending += 1;
        if !self.clients[c].busy {
            self.send(c);
        }
    }

    fn send(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        cl.pending -= 1;
        cl.busy = true;
        cl.sent_at = self.now_us;
        self.first_start.get_or_insert(self.now_us);
        self.at(self.now_us + NET_US, Ev::Arrive(c));
    }

    fn arrive(&mut self, c: usize) {
        let (p, w) = (self.clients[c].proxy, self.clients[c].worker);
        let now = self.now_us;
        if now <= self.end_us {
            self.arrivals.push(now);
        }
        let (ctx, action) = self.workers[p][w].request(now / 1000, c, &Req);
        if action == Action::Continue {
            self.at(now + UPSTREAM_US, Ev::Complete(p, w, ctx, 200));
        }
        self.after(p, w);
    }

    fn complete(&mut self, p: usize, w: usize, ctx: u32, status: u32) {
        let now = self.now_us;
        let Some(c) = self.workers[p][w].complete(now / 1000, ctx, status) else {
            return;
        };
        if status == 200 {
            // Admitted by the engine when it let the request go on, the upstream's time ago.
            self.admits.push(now - UPSTREAM_US);
        }
        self.after(p, w);
        if status == 429 && self.now_us < self.end_us && self.level(now) >= 1 {
            self.run.limited_with_tokens += 1;
        }
        self.at(now + NET_US, Ev::Receive(c, status));
    }

    fn receive(&mut self, c: usize, status: u32) {
        self.clients[c].busy = false;
        if self.now_us > self.end_us {
            return; // h2load stopped: not counted
        }
        self.last_end = self.last_end.max(self.now_us);
        // The global bucket and the leased tokens as they were then (the ledger's end).
        self.end_state = self
            .key
            .as_ref()
            .and_then(|k| self.bucket.get(k).and_then(|(s, _)| *s));
        self.end_held = self.held(self.now_us);
        match status {
            200 => {
                self.run.admitted += 1;
                self.run.per_proxy[self.clients[c].proxy] += 1;
            }
            429 => self.run.limited += 1,
            _ => self.run.other += 1,
        }
        if self.clients[c].pending > 0 {
            self.send(c);
        }
    }
}
