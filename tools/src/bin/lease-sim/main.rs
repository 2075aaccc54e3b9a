//! A deterministic simulator of lease mode: `make sim SIM_ARGS='[options]'`.
//!
//! It runs the real engine (`tollgate_core::engine::Engine`, one per worker, the proxy's shared data an
//! in-memory store shared by the workers of one proxy) against a simulated clock, paced clients like
//! `make bench`'s (h2load `--rps`, one request in flight per connection, every client's timer firing
//! once per period from its connection), and the global bucket as `tollgate_core::bucket` (the model of
//! the Lua script) answering each call after a random latency. No Envoy, no Redis, no wall clock:
//! the same options and seed give the same figures.
//!
//! What the host does is modelled on Envoy: a callout belongs to the worker's root context (as
//! proxy-wasm-cpp-host's `http_call` does), so its answer comes there even after the request whose
//! callback sent it is done; a resumed request completes at once (the bench's route is a direct
//! response); the tick fires only when asked for, at the period asked.
//!
//! It prints admitted ÷ ideal (ideal = burst + rate × T, T = first request start to last
//! completion, as the bench), script calls per 1000 admitted, and where the tokens went: refill
//! that overflowed the full global bucket, tokens still in the global bucket at the end, leased
//! tokens dropped (expired or evicted) or still held in pools and stashes at the end; and the calls
//! by kind. `--sweep` runs a set of shapes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::rc::Rc;

use tollgate_core::backend::{Answer, BackendError, Outgoing, Payload};
use tollgate_core::bucket::{self, Ask, Holder, Holders, Limits, State};
use tollgate_core::config::Config;
use tollgate_core::engine::{Action, ContextId, Engine, Host, LocalReply, Plugin};
use tollgate_core::metrics::{Counter, Recorder};
use tollgate_core::rule::RequestView;
use tollgate_core::shared::lease::LeasePool;
use tollgate_core::shared::mem::MemStore;
use tollgate_core::shared::Store;

const USAGE: &str = "\
usage: cargo run --release -p tollgate-tools --bin lease-sim -- [options]   (make sim SIM_ARGS='[options]')
  --rate N           tokens per second of the hot key                       (default 200)
  --burst N          its burst                                              (default 200)
  --load N           requests per second offered in total                   (default 1000)
  --duration MS      length of one load                                     (default 3000)
  --pause ON:OFF     within the load, clients send for ON ms, then pause for OFF ms, in turn
                     (default: no pause)
  --jitter MS        each load lasts duration ± up to this, uniformly: averages over where in
                     the key's rhythm the load stops                          (default 0)
  --proxies N        proxies (Envoys), the load split evenly                (default 2)
  --workers N        workers per proxy                                      (default 2)
  --clients N        paced clients per proxy                                (default 10)
  --latency A[-B]    script call round trip in ms, uniform in [A, B]        (default 1-2)
  --horizon MS       the rule's lease_horizon_ms                            (default: config default)
  --lease-max N      the rule's lease_max                                   (default: config default)
  --assign random|rr connections to workers: random (SO_REUSEPORT) or round robin (default random)
  --runs N           loads (fresh key, fresh proxies), seeds seed..seed+N   (default 20)
  --seed N           first seed                                             (default 1)
  --trace            print every script call of the first run
  --sweep            run the standard shapes (bench, burst 10x, 2x and 20x overload, 4 proxies,
                     latency 5 ms, one proxy, a light key) and print one line each";

/// The simulated clock starts at a realistic Unix time (µs), as the proxy's clock would read.
const EPOCH_US: u64 = 1_700_000_000_000_000;
/// The bench's header key and its value.
const USER_HEADER: &str = "x-user-id";
const ROOT: u32 = 1;
/// Client to Envoy and back, and Envoy's direct response, in µs.
const NET_US: u64 = 40;
const UPSTREAM_US: u64 = 30;
/// Connections of one h2load process are set up this far apart (µs).
const CONNECT_STAGGER_US: u64 = 120;
/// Each timer firing of a client is late by up to this (µs).
const FIRE_JITTER_US: u64 = 200;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Assign {
    Random,
    RoundRobin,
}

#[derive(Clone, Debug)]
struct Opts {
    rate: u64,
    burst: u64,
    load: f64,
    duration_ms: u64,
    pause: Option<(u64, u64)>,
    jitter_ms: u64,
    proxies: usize,
    workers: usize,
    clients: usize,
    lat_min_us: u64,
    lat_max_us: u64,
    horizon_ms: Option<u64>,
    lease_max: Option<u64>,
    assign: Assign,
    runs: u64,
    seed: u64,
    trace: bool,
    sweep: bool,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            rate: 200,
            burst: 200,
            load: 1000.0,
            duration_ms: 3000,
            pause: None,
            jitter_ms: 0,
            proxies: 2,
            workers: 2,
            clients: 10,
            lat_min_us: 1000,
            lat_max_us: 2000,
            horizon_ms: None,
            lease_max: None,
            assign: Assign::Random,
            runs: 20,
            seed: 1,
            trace: false,
            sweep: false,
        }
    }
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let int = |v: String| v.parse::<u64>().map_err(|e| format!("{v}: {e}"));
        match flag.as_str() {
            "--rate" => o.rate = int(value()?)?,
            "--burst" => o.burst = int(value()?)?,
            "--load" => o.load = value()?.parse().map_err(|e| format!("--load: {e}"))?,
            "--duration" => o.duration_ms = int(value()?)?,
            "--jitter" => o.jitter_ms = int(value()?)?,
            "--pause" => {
                let v = value()?;
                let (on, off) = v.split_once(':').ok_or("--pause ON:OFF")?;
                o.pause = Some((int(on.to_string())?, int(off.to_string())?));
            }
            "--proxies" => o.proxies = int(value()?)? as usize,
            "--workers" => o.workers = int(value()?)? as usize,
            "--clients" => o.clients = int(value()?)? as usize,
            "--latency" => {
                let v = value()?;
                let ms = |s: &str| {
                    s.parse::<f64>()
                        .map(|x| (x * 1000.0) as u64)
                        .map_err(|e| format!("--latency {s}: {e}"))
                };
                let (a, b) = v.split_once('-').unwrap_or((&v, &v));
                (o.lat_min_us, o.lat_max_us) = (ms(a)?, ms(b)?);
            }
            "--horizon" => o.horizon_ms = Some(int(value()?)?),
            "--lease-max" => o.lease_max = Some(int(value()?)?),
            "--assign" => {
                o.assign = match value()?.as_str() {
                    "random" => Assign::Random,
                    "rr" => Assign::RoundRobin,
                    v => return Err(format!("--assign {v}: random or rr")),
                }
            }
            "--runs" => o.runs = int(value()?)?.max(1),
            "--seed" => o.seed = int(value()?)?,
            "--trace" => o.trace = true,
            "--sweep" => o.sweep = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if o.proxies == 0 || o.workers == 0 || o.clients == 0 || o.rate == 0 || o.burst == 0 {
        return Err("proxies, workers, clients, rate and burst must be at least 1".into());
    }
    Ok(o)
}

// ---------------------------------------------------------------------------------------------
// Deterministic randomness (splitmix64).

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi].
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next() % (hi - lo + 1)
    }
}

// ---------------------------------------------------------------------------------------------
// The host of one worker.

struct SimHost {
    now_us: u64,
    store: Rc<MemStore>,
    /// The context whose callback is running (it carries the calls sent meanwhile).
    current: u32,
    next_token: u32,
    /// (token, carrier, body) sent during the callback.
    dispatched: Vec<(u32, u32, Vec<u8>)>,
    resumed: Vec<u32>,
    responded: Vec<(u32, u32)>,
    /// The tick period asked for during the callback, if any.
    tick: Option<u64>,
}

impl Host for SimHost {
    fn now_ms(&self) -> u64 {
        self.now_us / 1000
    }
    fn store(&self) -> &dyn Store {
        &*self.store
    }
    fn dispatch(&mut self, _: &str, call: &Outgoing, _: u64) -> Result<u32, BackendError> {
        self.next_token += 1;
        self.dispatched
            .push((self.next_token, self.current, call.payload().to_vec()));
        Ok(self.next_token)
    }
    fn resume(&mut self, ctx: ContextId) {
        self.resumed.push(ctx.get());
    }
    fn respond(&mut self, ctx: ContextId, reply: &LocalReply) {
        self.responded.push((ctx.get(), reply.status));
    }
    fn add_response_headers(&mut self, _: ContextId, _: &[(&str, &str)]) {}
    fn set_tick(&mut self, period_ms: u64) {
        self.tick = Some(period_ms);
    }
    fn request_header(&mut self, _: ContextId, _: &str) -> Option<Vec<u8>> {
        None
    }
    // Lease mode only: no worker shares exact calls through a queue here.
    fn enqueue(&mut self, _: u32, _: &[u8]) -> bool {
        false
    }
    fn dequeue(&mut self, _: u32) -> Option<Vec<u8>> {
        None
    }
}

struct Req;

impl RequestView for Req {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let value: &'static [u8] = match name {
            ":path" => b"/api/bench",
            ":method" => b"GET",
            USER_HEADER => b"hot",
            _ => return None,
        };
        Some(Cow::Borrowed(value))
    }
    fn client_ip(&self) -> Option<Vec<u8>> {
        Some(b"127.0.0.1".to_vec())
    }
}

struct NoHeaders;

impl RequestView for NoHeaders {
    fn header(&self, _: &str) -> Option<Cow<'_, [u8]>> {
        None
    }
    fn client_ip(&self) -> Option<Vec<u8>> {
        None
    }
}

struct Worker {
    engine: Engine,
    host: SimHost,
    rec: Rc<Recorder>,
    tick_ms: u64,
    tick_gen: u64,
    next_ctx: u32,
    /// Requests in the engine: ctx -> client.
    reqs: HashMap<u32, usize>,
    /// Calls out: token -> call index.
    calls: HashMap<u32, usize>,
}

// ---------------------------------------------------------------------------------------------
// The simulation.

struct Client {
    proxy: usize,
    worker: usize,
    period_us: u64,
    pending: u64,
    busy: bool,
    sent_at: u64,
}

#[derive(Debug, Clone)]
struct CallRec {
    proxy: usize,
    worker: usize,
    carrier: u32,
    key: String,
    limits: Limits,
    cost: u64,
    want: u64,
    holder: Option<Holder>,
    max_wait_ms: u64,
    settle: i64,
    sent_us: u64,
    lat_us: u64,
    /// The bucket's answer, once Redis ran it; and the tokens it held just before.
    reply: Option<(bucket::Reply, u64)>,
    exec_us: u64,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Fire(usize),
    Arrive(usize),
    Exec(usize),
    Answer(usize),
    Tick(usize, usize, u64),
    Complete(usize, usize, u32, u32),
    Receive(usize, u32),
    Sample,
}

/// Figures of one load.
#[derive(Debug, Clone, Default)]
struct Run {
    admitted: u64,
    limited: u64,
    other: u64,
    ideal: f64,
    calls: u64,
    /// Lease calls: all granted, part granted, denied; exact calls (no slot); calls carried by the
    /// root context (a tick: another worker's call ended, or a lost call retried).
    lease_full: u64,
    lease_partial: u64,
    /// Lease calls granted a reservation (part of the grant refills later).
    lease_reserved: u64,
    lease_denied: u64,
    exact: u64,
    from_root: u64,
    /// Calls that found the global bucket full (its refill was overflowing until then).
    at_full: u64,
    granted: u64,
    overflow: f64,
    /// Tokens in the global bucket at the end; negative: reserved ahead of its refill.
    in_bucket_end: f64,
    dropped: u64,
    held_end: u64,
    /// Of `held_end`, those the bucket had refilled by the end.
    held_end_refilled: f64,
    /// Admitted by the engine after the load's last counted completion.
    spent_after: u64,
    /// 429s answered while the global bucket held at least one token.
    limited_with_tokens: u64,
    /// Mean tokens in the global bucket, and held live in pools and stashes (refilled or not),
    /// over the load.
    mean_bucket: f64,
    mean_held: f64,
    /// Admitted per proxy.
    per_proxy: Vec<u64>,
    calls_per_proxy: Vec<u64>,
    /// 429s answered from the deny cache.
    local_denied: u64,
    /// How long after the load's last completion the last tick fired (idle CPU: ticks stop).
    ticks_after_ms: f64,
    /// The window that came closest to the bound burst + rate × W (or passed it most).
    worst: Window,
    /// What one perfect token bucket would have admitted of the same requests as they arrived
    /// (the most any limiter can admit and keep the bound in every window).
    perfect: u64,
}

/// Admissions in one window of the run, against the token bucket's bound for its length.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    start_ms: f64,
    len_ms: u64,
    admitted: u64,
    bound: f64,
}

impl Window {
    fn excess(&self) -> f64 {
        self.admitted as f64 - self.bound
    }
}

/// Window lengths checked, in ms: every window of each length that starts at an admission (the
/// most admissions any window of that length holds is found among those).
const WINDOWS_MS: [u64; 12] = [1, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000];

impl Run {
    fn ratio(&self) -> f64 {
        self.admitted as f64 / self.ideal
    }
    fn per_1k(&self) -> f64 {
        self.calls as f64 * 1000.0 / self.admitted.max(1) as f64
    }
}

struct Sim<'o> {
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

fn config_json(o: &Opts) -> String {
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
    serde_json::json!({
        "backend": { "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 100 },
        "key_prefix": "sim",
        "failure_mode": "closed",
        "response_headers": "ietf",
        "rules": [rule],
    })
    .to_string()
}

/// Undoes the Webdis percent-encoding of one argument.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

impl<'o> Sim<'o> {
    fn new(o: &'o Opts, seed: u64) -> Sim<'o> {
        let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5bd1_e995);
        let json = config_json(o);
        let mut workers = Vec::new();
        let mut stores = Vec::new();
        for _ in 0..o.proxies {
            let store = Rc::new(MemStore::default());
            let mut ws = Vec::new();
            for _ in 0..o.workers {
                let config = Config::try_from(json.as_bytes()).unwrap();
                let rec = Rc::new(Recorder::default());
                let plugin = Plugin::with_metrics(config, Box::new(rec.clone()));
                ws.push(Worker {
                    engine: Engine::new(plugin),
                    host: SimHost {
                        now_us: 0,
                        store: store.clone(),
                        current: ROOT,
                        next_token: 0,
                        dispatched: Vec::new(),
                        resumed: Vec::new(),
                        responded: Vec::new(),
                        tick: None,
                    },
                    rec,
                    tick_ms: 0,
                    tick_gen: 0,
                    next_ctx: ROOT + 1,
                    reqs: HashMap::new(),
                    calls: HashMap::new(),
                });
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

    fn run(mut self, trace: bool) -> Run {
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

    fn print_calls(&self) {
        let first = self.first_start.unwrap_or(0);
        println!(
            "  t ms     proxy.worker carrier  cost  want granted  held-before remaining  note"
        );
        for c in &self.calls {
            let t = c.sent_us.saturating_sub(first) as f64 / 1000.0;
            let (granted, before, remaining, allowed, retry) = match c.reply {
                Some((r, b)) => (r.granted, b, r.remaining, r.allowed, r.retry_after_ms),
                None => (0, 0, 0, false, 0),
            };
            let note = match (c.reply.is_some(), allowed) {
                (false, _) => "not answered".to_string(),
                (_, false) => format!("denied, retry in {retry} ms"),
                _ if retry > 0 => format!("reserved: refilled in {retry} ms"),
                _ => String::new(),
            };
            println!(
                "  {t:8.1}  {}.{}        {:<7} {:5} {:5} {:7} {:12} {:9}  {note}",
                c.proxy,
                c.worker,
                if c.carrier == ROOT { "root" } else { "request" },
                c.cost,
                c.want,
                granted,
                before,
                remaining
            );
        }
    }

    /// Whole tokens in the global bucket at `t_us` (without changing it).
    fn level(&self, t_us: u64) -> u64 {
        let Some(key) = &self.key else {
            return self.o.burst;
        };
        let (state, mut holders) = self.bucket.get(key).cloned().unwrap_or_default();
        bucket::take_held(state, &mut holders, &self.limits, &Ask::default(), t_us)
            .1
            .remaining
    }

    /// Tokens in the global bucket at `t_us` (the last counted completion), negative while it is
    /// in debt (reservations).
    fn signed_level(&self, t_us: u64) -> f64 {
        match bucket::take(self.end_state, &self.limits, 0, 0, 0, 0, t_us).0 {
            Some(st) => st.units as f64 / st.period_ms as f64,
            None => self.o.burst as f64,
        }
    }

    /// Live leased tokens in every pool and stash at `t_us`.
    fn held(&self, t_us: u64) -> u64 {
        let Some(key) = &self.key else {
            return 0;
        };
        let now_ms = t_us / 1000;
        let mut held = 0;
        for (p, ws) in self.workers.iter().enumerate() {
            let ns = &ws[0].engine.plugin().ns;
            if let Some(l) = LeasePool::new(&*self.stores[p], ns).peek(key) {
                held += l.live_tokens(now_ms);
            }
            for wk in ws {
                if let Some((tokens, expires)) = wk.engine.stashed(key) {
                    if now_ms < expires {
                        held += tokens;
                    }
                }
            }
        }
        held
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
        let wk = &mut self.workers[p][w];
        let ctx = wk.next_ctx;
        wk.next_ctx += 1;
        wk.reqs.insert(ctx, c);
        wk.host.now_us = now;
        wk.host.current = ctx;
        let action = wk.engine.request_headers(&mut wk.host, ctx.into(), &Req);
        if action == Action::Continue {
            self.at(now + UPSTREAM_US, Ev::Complete(p, w, ctx, 200));
        }
        self.after(p, w);
    }

    /// Carries out what the engine asked of the host during a callback.
    fn after(&mut self, p: usize, w: usize) {
        let now = self.now_us;
        let wk = &mut self.workers[p][w];
        let dispatched = std::mem::take(&mut wk.host.dispatched);
        let resumed = std::mem::take(&mut wk.host.resumed);
        let responded = std::mem::take(&mut wk.host.responded);
        let tick = wk.host.tick.take();
        for (token, carrier, body) in dispatched {
            let text = String::from_utf8(body).unwrap();
            let parts: Vec<&str> = text.split('/').collect();
            let num = |i: usize| parts[i].parse::<u64>().unwrap();
            let key = unescape(parts[3]);
            let lease: Vec<u64> = unescape(parts[8])
                .split(':')
                .map(|n| n.parse().unwrap())
                .collect();
            let limits = Limits {
                burst: num(4),
                rate: num(5),
                period_ms: num(6),
            };
            let lat = self.rng.between(self.o.lat_min_us, self.o.lat_max_us);
            let idx = self.calls.len();
            self.calls.push(CallRec {
                proxy: p,
                worker: w,
                carrier,
                key: key.clone(),
                limits,
                cost: num(7),
                want: lease[0],
                holder: (lease.len() > 1).then(|| {
                    let steps: Vec<(u64, u64)> =
                        lease[4..].chunks(2).map(|c| (c[0], c[1])).collect();
                    Holder::new(lease[1], lease[2], lease[3], &steps)
                }),
                max_wait_ms: num(9),
                settle: parts[10].parse().unwrap(),
                sent_us: now,
                lat_us: lat,
                reply: None,
                exec_us: 0,
            });
            self.key.get_or_insert(key);
            self.workers[p][w].calls.insert(token, idx);
            self.at(now + lat / 2, Ev::Exec(idx));
        }
        for ctx in resumed {
            self.at(now + UPSTREAM_US, Ev::Complete(p, w, ctx, 200));
        }
        for (ctx, status) in responded {
            self.at(now + UPSTREAM_US, Ev::Complete(p, w, ctx, status));
        }
        if let Some(period) = tick {
            let wk = &mut self.workers[p][w];
            wk.tick_ms = period;
            wk.tick_gen += 1;
            let gen = wk.tick_gen;
            if period > 0 {
                self.at(now + period * 1000, Ev::Tick(p, w, gen));
            }
        }
    }

    fn exec(&mut self, i: usize) {
        let call = &self.calls[i];
        let (state, mut holders) = self.bucket.get(&call.key).cloned().unwrap_or_default();
        let peek = &mut holders.clone();
        let before = bucket::take_held(state, peek, &call.limits, &Ask::default(), self.now_us)
            .1
            .remaining;
        let ask = Ask {
            cost: call.cost,
            lease_want: call.want,
            holder: call.holder,
            max_wait_ms: call.max_wait_ms,
            settle: call.settle,
        };
        let (state, reply) =
            bucket::take_held(state, &mut holders, &call.limits, &ask, self.now_us);
        self.bucket.insert(call.key.clone(), (state, holders));
        let lat = call.lat_us;
        self.calls[i].reply = Some((reply, before));
        self.calls[i].exec_us = self.now_us;
        self.at(self.now_us + lat - lat / 2, Ev::Answer(i));
    }

    fn answer(&mut self, i: usize) {
        let call = self.calls[i].clone();
        let (p, w) = (call.proxy, call.worker);
        let Some((reply, _)) = call.reply else {
            return;
        };
        let token = {
            let wk = &self.workers[p][w];
            *wk.calls.iter().find(|(_, &c)| c == i).unwrap().0
        };
        let now = self.now_us;
        let wk = &mut self.workers[p][w];
        wk.calls.remove(&token);
        let body = format!(
            r#"{{"EVALSHA":[{},{},{},{},{}]}}"#,
            u8::from(reply.allowed),
            reply.remaining,
            reply.retry_after_ms,
            reply.reset_after_ms,
            reply.granted
        );
        wk.host.now_us = now;
        // On the root context, whichever callback sent it.
        wk.host.current = ROOT;
        let answer = Answer::Http {
            status: 200,
            body: Payload::Read(body.into_bytes()),
        };
        wk.engine.call_response(&mut wk.host, token, &answer);
        self.after(p, w);
    }

    fn tick(&mut self, p: usize, w: usize, gen: u64) {
        let now = self.now_us;
        let wk = &mut self.workers[p][w];
        if gen != wk.tick_gen || wk.tick_ms == 0 {
            return;
        }
        wk.host.now_us = now;
        wk.host.current = ROOT;
        wk.engine.tick(&mut wk.host);
        self.last_tick = now;
        self.after(p, w);
        let wk = &self.workers[p][w];
        if wk.tick_gen == gen && wk.tick_ms > 0 {
            let next = now + wk.tick_ms * 1000;
            self.at(next, Ev::Tick(p, w, gen));
        }
    }

    fn complete(&mut self, p: usize, w: usize, ctx: u32, status: u32) {
        let now = self.now_us;
        let wk = &mut self.workers[p][w];
        let Some(c) = wk.reqs.remove(&ctx) else {
            return;
        };
        wk.host.now_us = now;
        wk.host.current = ctx;
        if status == 200 {
            wk.engine
                .response_headers(&mut wk.host, ctx.into(), &NoHeaders);
            // Admitted by the engine when it let the request go on, the upstream's time ago.
            self.admits.push(now - UPSTREAM_US);
        }
        wk.engine.done(&mut wk.host, ctx.into());
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

    fn finish(mut self) -> Run {
        let first = self.first_start.unwrap_or(0);
        let t_end = self.last_end.max(first);
        let o = self.o;
        let mut r = std::mem::take(&mut self.run);
        let secs = (t_end - first) as f64 / 1e6;
        r.ideal = o.burst as f64 + o.rate as f64 * secs;
        r.in_bucket_end = self.signed_level(t_end);
        r.mean_bucket = self.bucket_samples.0 / self.bucket_samples.1.max(1) as f64;
        r.mean_held = self.held_samples / self.bucket_samples.1.max(1) as f64;
        for ws in &self.workers {
            for wk in ws {
                // Counts still batched in the engine (a real worker pushes them at its next tick).
                wk.engine.plugin().metrics.flush();
                r.dropped += wk.rec.get(0, Counter::LeaseDropped);
                r.local_denied += wk.rec.get(0, Counter::LocalDenied);
            }
        }
        // Every admission the engine made spent a granted token; some were answered after the
        // load's last counted completion.
        let allowed: u64 = self
            .workers
            .iter()
            .flatten()
            .map(|wk| wk.rec.get(0, Counter::Allowed))
            .sum();
        r.spent_after = allowed.saturating_sub(r.admitted);
        for c in &self.calls {
            let Some((reply, before)) = c.reply else {
                continue;
            };
            if c.exec_us > t_end {
                continue;
            }
            r.calls += 1;
            r.calls_per_proxy[c.proxy] += 1;
            r.granted += reply.granted;
            if before >= c.limits.burst {
                r.at_full += 1;
            }
            if c.carrier == ROOT {
                r.from_root += 1;
            }
            if c.want == 0 {
                r.exact += 1;
            } else if !reply.allowed {
                r.lease_denied += 1;
            } else if reply.retry_after_ms > 0 {
                r.lease_reserved += 1;
            } else if reply.granted < c.want.max(c.cost) {
                r.lease_partial += 1;
            } else {
                r.lease_full += 1;
            }
        }
        r.held_end = self.end_held;
        r.worst = self.worst_window();
        r.perfect = self.perfect();
        r.ticks_after_ms = self.last_tick.saturating_sub(t_end) as f64 / 1000.0;
        // Tokens granted ahead of the refill (reserved) are not part of the ideal yet.
        let ahead = (-r.in_bucket_end).max(0.0);
        r.held_end_refilled = r.held_end as f64 - ahead;
        r.overflow = r.ideal - (r.granted as f64 - ahead) - r.in_bucket_end.max(0.0);
        r
    }
}

impl Sim<'_> {
    /// What one token bucket with the rule's limits, answering every request the moment it
    /// reached its proxy, would have admitted of the requests counted.
    fn perfect(&self) -> u64 {
        let mut arrivals = self.arrivals.clone();
        arrivals.sort_unstable();
        let (burst, rate) = (self.o.burst as f64, self.o.rate as f64);
        let (mut level, mut at, mut admitted) = (burst, arrivals.first().copied().unwrap_or(0), 0);
        for t in arrivals {
            level = (level + (t - at) as f64 * rate / 1e6).min(burst);
            at = t;
            if level >= 1.0 {
                level -= 1.0;
                admitted += 1;
            }
        }
        admitted
    }

    /// Of every window of each length in [`WINDOWS_MS`] that starts at an admission, the one with
    /// the most admissions over the bound burst + rate × W.
    fn worst_window(&self) -> Window {
        let mut admits = self.admits.clone();
        admits.sort_unstable();
        let first = self.first_start.unwrap_or(0);
        let mut worst = Window {
            bound: f64::INFINITY,
            ..Window::default()
        };
        for len_ms in WINDOWS_MS {
            let bound = self.o.burst as f64 + self.o.rate as f64 * len_ms as f64 / 1000.0;
            let mut end = 0;
            for (start, &t) in admits.iter().enumerate() {
                while end < admits.len() && admits[end] < t + len_ms * 1000 {
                    end += 1;
                }
                let w = Window {
                    start_ms: t.saturating_sub(first) as f64 / 1000.0,
                    len_ms,
                    admitted: (end - start) as u64,
                    bound,
                };
                if w.excess() > worst.excess() {
                    worst = w;
                }
            }
        }
        worst
    }
}

// ---------------------------------------------------------------------------------------------
// Reporting.

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0u64), |(s, n), x| (s + x, n + 1));
    s / n.max(1) as f64
}

fn run_shape(o: &Opts) -> Vec<Run> {
    (0..o.runs)
        .map(|i| Sim::new(o, o.seed + i).run(o.trace && i == 0))
        .collect()
}

fn report(o: &Opts, runs: &[Run]) {
    let ratio = median(runs.iter().map(Run::ratio).collect());
    let per_1k = median(runs.iter().map(Run::per_1k).collect());
    let m = |f: fn(&Run) -> f64| mean(runs.iter().map(f));
    println!(
        "shape: rate {}/s burst {} load {}/s over {} proxies x {} workers, {} clients per proxy, \
         {} ms (± {}), latency {}-{} ms, horizon {}, lease_max {}, {} runs from seed {}",
        o.rate,
        o.burst,
        o.load,
        o.proxies,
        o.workers,
        o.clients,
        o.duration_ms,
        o.jitter_ms,
        o.lat_min_us as f64 / 1000.0,
        o.lat_max_us as f64 / 1000.0,
        o.horizon_ms.map_or("default".into(), |h| h.to_string()),
        o.lease_max.map_or("default".into(), |h| h.to_string()),
        o.runs,
        o.seed
    );
    println!(
        "admitted / ideal: median {ratio:.3} (mean {:.3}, min {:.3}, max {:.3})",
        m(Run::ratio),
        runs.iter().map(Run::ratio).fold(f64::INFINITY, f64::min),
        runs.iter().map(Run::ratio).fold(0.0, f64::max)
    );
    println!(
        "admitted / what one perfect token bucket admits of the same requests: median {:.3} (min {:.3})",
        median(runs.iter().map(|r| r.admitted as f64 / r.perfect.max(1) as f64).collect()),
        runs.iter().map(|r| r.admitted as f64 / r.perfect.max(1) as f64).fold(f64::INFINITY, f64::min)
    );
    println!(
        "calls per 1000 admitted: median {per_1k:.1} (mean {:.1}, max {:.1})",
        m(Run::per_1k),
        runs.iter().map(Run::per_1k).fold(0.0, f64::max)
    );
    println!(
        "per load (means): admitted {:.1}, limited {:.1}, ideal {:.1}, calls {:.1}",
        m(|r| r.admitted as f64),
        m(|r| r.limited as f64),
        m(|r| r.ideal),
        m(|r| r.calls as f64),
    );
    println!(
        "where the ideal's tokens went (means): admitted {:.1} | overflowed the full bucket {:.1} | \
         in the bucket at the end {:.1} (negative: reserved ahead of the refill) | leased and \
         dropped (expired/evicted) {:.1} | held in pools/stashes at the end, refilled already \
         {:.1} | admitted after the load's end {:.1}",
        m(|r| r.admitted as f64),
        m(|r| r.overflow),
        m(|r| r.in_bucket_end),
        m(|r| r.dropped as f64),
        m(|r| r.held_end_refilled),
        m(|r| r.spent_after as f64),
    );
    println!(
        "calls by kind (means): lease granted in full {:.1}, in part {:.1}, reserved {:.1}, denied {:.1}, exact {:.1}; \
         sent from a tick {:.1}; found the bucket full {:.1}",
        m(|r| r.lease_full as f64),
        m(|r| r.lease_partial as f64),
        m(|r| r.lease_reserved as f64),
        m(|r| r.lease_denied as f64),
        m(|r| r.exact as f64),
        m(|r| r.from_root as f64),
        m(|r| r.at_full as f64),
    );
    let worst = runs
        .iter()
        .map(|r| r.worst)
        .max_by(|a, b| a.excess().total_cmp(&b.excess()))
        .unwrap_or_default();
    println!(
        "windows: the fullest, against burst + rate x W, over every window of {WINDOWS_MS:?} ms \
         starting at an admission, in every run: {} admitted in {} ms from {:.1} ms where the \
         bound is {:.0} (excess {:+.0}; allowed: at most one request per proxy, {})",
        worst.admitted,
        worst.len_ms,
        worst.start_ms,
        worst.bound,
        worst.excess(),
        o.proxies
    );
    let share = |r: &Run| {
        let total: u64 = r.per_proxy.iter().sum();
        let min = r.per_proxy.iter().copied().min().unwrap_or(0);
        min as f64 * r.per_proxy.len() as f64 / total.max(1) as f64
    };
    println!(
        "mean tokens in the global bucket {:.1}, in pools and stashes {:.1}; 429s while it held a token {:.1}; local 429s {:.1}; \
         smallest proxy share x proxies {:.3}; last tick {:.1} ms after the load (max {:.1})",
        m(|r| r.mean_bucket),
        m(|r| r.mean_held),
        m(|r| r.limited_with_tokens as f64),
        m(|r| r.local_denied as f64),
        m(share),
        m(|r| r.ticks_after_ms),
        runs.iter().map(|r| r.ticks_after_ms).fold(0.0, f64::max),
    );
}

fn shapes(base: &Opts) -> Vec<(&'static str, Opts)> {
    let b = base.clone();
    vec![
        ("bench (rate 200, burst 200, 5x, 2 proxies)", b.clone()),
        (
            "burst 10x rate (2000)",
            Opts {
                burst: 2000,
                ..b.clone()
            },
        ),
        (
            "2x overload (400/s)",
            Opts {
                load: 400.0,
                ..b.clone()
            },
        ),
        (
            "20x overload (4000/s)",
            Opts {
                load: 4000.0,
                ..b.clone()
            },
        ),
        (
            "4 proxies",
            Opts {
                proxies: 4,
                ..b.clone()
            },
        ),
        (
            "latency 5 ms",
            Opts {
                lat_min_us: 5000,
                lat_max_us: 5000,
                ..b.clone()
            },
        ),
        (
            "1 proxy (tenant-quiet)",
            Opts {
                proxies: 1,
                ..b.clone()
            },
        ),
        (
            "light key (20/s, 0.1x)",
            Opts {
                load: 20.0,
                ..b.clone()
            },
        ),
        (
            "on 0.6 s, off 1.2 s (rate 100, burst 100)",
            Opts {
                rate: 100,
                burst: 100,
                pause: Some((600, 1200)),
                duration_ms: 6600,
                ..b.clone()
            },
        ),
        (
            "bench over 30 s",
            Opts {
                duration_ms: 30_000,
                runs: b.runs.min(5),
                ..b
            },
        ),
    ]
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if !o.sweep {
        let runs = run_shape(&o);
        report(&o, &runs);
        return;
    }
    println!(
        "{:<44} {:>7} {:>7} {:>7} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7}",
        "shape",
        "adm/req",
        "adm/id",
        "min",
        "calls/1k",
        "max",
        "ovfl",
        "bucket",
        "drop",
        "held",
        "share",
        "window"
    );
    for (name, s) in shapes(&o) {
        let runs = run_shape(&s);
        let m = |f: fn(&Run) -> f64| mean(runs.iter().map(f));
        let share = |r: &Run| {
            let total: u64 = r.per_proxy.iter().sum();
            let min = r.per_proxy.iter().copied().min().unwrap_or(0);
            min as f64 * r.per_proxy.len() as f64 / total.max(1) as f64
        };
        println!(
            "{:<44} {:>7.3} {:>7.3} {:>7.3} {:>8.1} {:>8.1} {:>6.1} {:>6.1} {:>6.1} {:>6.1} {:>6.3} {:>+7.0}",
            name,
            m(|r| r.admitted as f64 / (r.admitted + r.limited + r.other).max(1) as f64),
            median(runs.iter().map(Run::ratio).collect()),
            runs.iter().map(Run::ratio).fold(f64::INFINITY, f64::min),
            median(runs.iter().map(Run::per_1k).collect()),
            runs.iter().map(Run::per_1k).fold(0.0, f64::max),
            m(|r| r.overflow),
            m(|r| r.in_bucket_end),
            m(|r| r.dropped as f64),
            m(|r| r.held_end_refilled),
            m(share),
            runs.iter()
                .map(|r| r.worst.excess())
                .fold(f64::NEG_INFINITY, f64::max),
        );
    }
    println!(
        "adm/req: admitted / requests (mean); adm/id: admitted / ideal, median and min over runs; calls/1k: median and max; then means per \
         load, in tokens: refill that overflowed the full bucket, left in the bucket (negative: \
         reserved ahead), leased and dropped, held in pools/stashes at the end (refilled already); \
         share: the smallest \
         proxy's admitted x proxies / all admitted; window: the most any window of any run \
         admitted over burst + rate x W (at most one request per proxy is allowed)"
    );
}

/// `cargo test --workspace` runs these: the bound in every
/// window, for the shapes of the sweep and the on/off load that broke it.
#[cfg(test)]
mod tests {
    use super::*;

    /// Every window of every run of `o` admits at most burst + rate × W, plus one request per
    /// proxy; returns the fullest.
    fn assert_windows(name: &str, o: &Opts) -> Window {
        let runs = run_shape(o);
        assert!(
            runs.iter().all(|r| r.admitted > 0),
            "{name}: nothing admitted"
        );
        let worst = runs
            .iter()
            .map(|r| r.worst)
            .max_by(|a, b| a.excess().total_cmp(&b.excess()))
            .unwrap();
        assert!(
            worst.excess() <= o.proxies as f64,
            "{name}: {} admitted in {} ms from {:.1} ms, where burst + rate x W is {}",
            worst.admitted,
            worst.len_ms,
            worst.start_ms,
            worst.bound
        );
        worst
    }

    /// Two proxies of two workers, one key at 100/s with a burst of 100, loaded 0.6 s then idle
    /// 1.2 s, four times, with lease horizons of 10 s and 1 s: tokens the proxies leased or
    /// reserved before a pause used to be spent on top of a bucket that refilled meanwhile (322
    /// admitted in 2 s where 300 is the bound).
    #[test]
    fn pauses_never_let_the_fleet_over_the_bound() {
        for horizon in [10_000, 1000] {
            let o = Opts {
                rate: 100,
                burst: 100,
                pause: Some((600, 1200)),
                duration_ms: 6600,
                horizon_ms: Some(horizon),
                runs: 5,
                ..Opts::default()
            };
            let worst = assert_windows(&format!("horizon {horizon}"), &o);
            // The load came back at full strength after each pause: the bound was reached.
            assert!(worst.excess() > -2.0, "{worst:?}");
        }
    }

    #[test]
    fn every_shape_of_the_sweep_keeps_the_bound_in_every_window() {
        for (name, o) in shapes(&Opts::default()) {
            let o = Opts {
                runs: 3,
                duration_ms: o.duration_ms.min(6600),
                ..o
            };
            assert_windows(name, &o);
        }
    }
}
