//! The per-worker request engine: Envoy's callbacks come in as events (`request_headers`,
//! `call_response`, `tick`, `response_headers`, `done`), and the engine answers through the
//! [`Host`] trait (dispatch, resume, respond, add headers, tick period, shared data).
//!
//! Invariant: the engine owns every paused request by context id, and every paused request is
//! resumed or answered exactly once: each of its checks gets an outcome from the local stage, a
//! backend answer, a failed or refused call (the failure mode), or its patience running out
//! (twice the backend timeout, for lease waits whose call was lost). A request whose client went
//! away (`done`) is forgotten and never touched again.
//!
//! Lease checks wait per key ([`lease`]): one call per key per proxy, served when its tokens
//! arrive, not by polling; the tick runs only while something is due (a held request, a
//! patience deadline, another worker's lease call on a key waited for here, counts waiting to be
//! pushed to the host).

mod coalesce;
mod handover;
pub mod health;
mod lease;
pub mod plugin;
mod sightings;
mod stash;
pub mod usage;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::backend::{Answer, BackendError, Outgoing, Reply, ScriptCall};
use crate::config::FailureMode;
use crate::metrics::{Counter, Metrics, METRICS_FLUSH_MS};
use crate::rule::RequestView;
use crate::shared::deny::DenyCache;
use crate::shared::lease::{Back, Claim, LeasePool, Taken};
use crate::shared::{fallback, settle, Store};

pub use handover::Pending;
use health::{Event, Health};
use lease::Queues;
pub use plugin::{LocalReply, Outcome, Plugin, Shown, Source, Verdict};

/// What the engine needs from the proxy. Context ids are Envoy's; a call made while handling any
/// event belongs to the root context, which its answer comes back on (proxy-wasm-cpp-host's
/// `http_call`, Higress' Redis calls).
pub trait Host {
    /// Milliseconds since the Unix epoch by the proxy's clock.
    fn now_ms(&self) -> u64;
    fn store(&self) -> &dyn Store;
    /// Sends a backend call to `cluster` the way its kind says (an HTTP callout, or a command on
    /// the Redis client); its answer comes back as [`Engine::call_response`] with this token. A
    /// host that cannot send this kind of call answers `BackendError::Dispatch`.
    fn dispatch(
        &mut self,
        cluster: &str,
        call: &Outgoing,
        timeout_ms: u64,
    ) -> Result<u32, BackendError>;
    /// Lets paused request `ctx` go on.
    fn resume(&mut self, ctx: u32);
    /// Answers request `ctx` here.
    fn respond(&mut self, ctx: u32, reply: &LocalReply);
    /// A header of paused request `ctx` (every line, joined with `,`), read after its
    /// `request_headers` callback.
    fn request_header(&mut self, ctx: u32, name: &str) -> Option<Vec<u8>>;
    /// Adds headers to the response of `ctx` (called while its response headers are processed).
    fn add_response_headers(&mut self, ctx: u32, headers: &[(&str, &str)]);
    /// Sets request header `name` of `ctx` to `value`, replacing every line of it (called inside
    /// its `request_headers`, before it goes upstream). Without an override a host has no request
    /// headers to change (the lease simulator), so nothing happens.
    fn set_request_header(&mut self, ctx: u32, name: &str, value: &str) {
        let _ = (ctx, name, value);
    }
    /// Ticks every `period_ms` (0: stop).
    fn set_tick(&mut self, period_ms: u64);
    /// Puts `message` on another worker's shared queue `queue` (false: no such queue).
    fn enqueue(&mut self, queue: u32, message: &[u8]) -> bool;
    /// Takes the next message off this worker's shared queue `queue`.
    fn dequeue(&mut self, queue: u32) -> Option<Vec<u8>>;
}

/// What Envoy does with the request after `request_headers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    Pause,
}

/// One matching rule's check of a request.
#[derive(Debug, Clone)]
struct Check {
    rule: usize,
    call: ScriptCall,
    outcome: Option<Outcome>,
    route: Route,
    /// The outcome came from a script call (so the global bucket charged the up-front cost).
    backend: bool,
}

/// Where a check goes when the local stage has no answer for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Its own call, or its share of one call for its key (exact mode).
    Exact,
    /// The proxy's lease call for its key.
    Lease,
    /// Its own call: a lease key new to this worker and its proxy, while most new keys lately
    /// were seen only once ([`sightings`]).
    Alone,
}

/// Why the proxy's pool had no leased token for a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoLease {
    /// The proxy's reservation for the key covers the cost in this many ms.
    Refilling(u64),
    /// The key's lease holds too few tokens, now and later.
    Spent,
    /// The pool has no lease for the key.
    Unknown,
}

/// A worker's batch of `key` (of rule `rule`) goes back to the proxy's pool; what the pool drops
/// of it (its lease expired, or the store failed) is counted.
fn give_back(
    pool: &LeasePool,
    metrics: &dyn Metrics,
    (rule, key, back): (usize, &str, Back),
    now: u64,
) {
    let dropped = pool.take_back(key, back, now).unwrap_or(back.unspent);
    metrics.count(rule, Counter::LeaseDropped, dropped);
}

/// An admission of a usage rule, waiting for the response to say what it used.
#[derive(Debug)]
struct Admitted {
    rule: usize,
    key: String,
    /// The key's effective limits (a settlement must not change them).
    limits: crate::bucket::Limits,
    upfront: u64,
    /// The response's headers have been seen.
    answered: bool,
    /// Following the body, for a `body_field` source.
    reader: Option<usage::BodyReader>,
}

/// A request the engine is deciding, holding, or keeping response headers for.
#[derive(Debug)]
struct Request {
    checks: Vec<Check>,
    /// Whether the client speaks gRPC: read only for a local answer (None until then).
    grpc: Option<bool>,
    /// Still deciding (false once the verdict is applied).
    deciding: bool,
    /// What the response's headers say, once admitted (until they are added).
    headers: Option<Shown>,
    /// Usage rules that admitted it, until the response says what it used.
    usage: Vec<Admitted>,
}

/// Why a backend call is out.
#[derive(Debug)]
enum Purpose {
    /// Check `idx` of request `ctx` (exact mode).
    Check { ctx: u32, idx: usize },
    /// The proxy's lease call for `claim`'s key.
    Lease(Claim),
    /// One call for several exact checks of one key (of this worker or sent by others), one
    /// token each, in order.
    Batch(Vec<coalesce::Waiter>),
    /// Carries a key's pending usage settlement, nothing else (cost 0).
    Settle,
}

#[derive(Debug)]
struct Call {
    rule: usize,
    call: ScriptCall,
    purpose: Purpose,
    /// When the first attempt was sent (a denial is cached from then, never later).
    sent_ms: u64,
    /// Whether this is the EVAL resend after NOSCRIPT.
    with_source: bool,
}

impl Call {
    /// A first attempt (EVALSHA), sent now.
    fn new(rule: usize, call: ScriptCall, purpose: Purpose, now: u64) -> Call {
        Call {
            rule,
            call,
            purpose,
            sent_ms: now,
            with_source: false,
        }
    }
}

/// The engine of one worker (one plugin configuration).
pub struct Engine {
    plugin: Plugin,
    requests: HashMap<u32, Request, ById>,
    calls: HashMap<u32, Call, ById>,
    /// Bucket keys of recently seen key values (a hot key's requests skip the digest).
    keys: crate::rule::KeyCache,
    queues: Queues,
    stashes: stash::Stashes,
    sightings: sightings::Sightings,
    /// Lease keys: tokens this worker's requests asked for and were denied locally (the deny
    /// cache, or a reservation still refilling) since the key's last lease call; the next call
    /// counts them as demand, so a saturated key asks for what its clients want.
    unmet: HashMap<String, u64, crate::rule::hash::Seeded>,
    chains: coalesce::Chains,
    /// Admitted requests held for a reservation, by due time.
    held: BinaryHeap<Reverse<(u64, u32)>>,
    /// Keys with a usage settlement to flush if no call has carried it by then.
    flushes: BinaryHeap<Reverse<(u64, usize, String, crate::bucket::Limits)>>,
    /// The tick period asked of the host (0: off).
    tick_ms: u64,
    /// When that tick fires next (as of the clock reading it was asked or last fired at).
    tick_next_ms: u64,
    /// The latest time this worker read from the host's clock ([`Engine::now`]). A request
    /// admitted from the worker's stash reads no clock of its own: it goes by this one.
    clock_ms: u64,
    /// Whether an unreadable usage was logged already (once per worker).
    usage_logged: bool,
    /// The response bodies this worker is reading for usage (capped).
    readers: usage::Readers,
    /// The request whose `request_headers` is running, and what its verdict says Envoy should do
    /// when that callback returns (a verdict reached inside it is returned, never resumed).
    in_headers: Option<(u32, Option<Action>)>,
    /// Where response headers are written (kept: its capacity is reused).
    header_buf: String,
    /// An empty Vec for the next request's checks: one decided inside its `request_headers`
    /// gives its own back, so the local path allocates none.
    spare_checks: Vec<Check>,
}

/// Hashes the host's context ids and callout tokens, which the host hands out (a client cannot
/// choose them), and the numbers of checks sent to other workers, with one multiplication instead
/// of SipHash: the request map is touched several times per request.
pub type ById = std::hash::BuildHasherDefault<IdHasher>;

#[derive(Default)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl Engine {
    pub fn new(plugin: Plugin) -> Engine {
        Engine {
            plugin,
            requests: HashMap::default(),
            calls: HashMap::default(),
            keys: crate::rule::KeyCache::default(),
            queues: Queues::default(),
            stashes: stash::Stashes::default(),
            sightings: sightings::Sightings::default(),
            unmet: HashMap::default(),
            chains: coalesce::Chains::default(),
            held: BinaryHeap::new(),
            flushes: BinaryHeap::new(),
            tick_ms: 0,
            tick_next_ms: 0,
            clock_ms: 0,
            usage_logged: false,
            readers: usage::Readers::default(),
            in_headers: None,
            header_buf: String::new(),
            spare_checks: Vec::new(),
        }
    }

    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// Requests, calls and waiters the engine holds (for tests and the idle check).
    pub fn load(&self) -> (usize, usize, usize) {
        (self.requests.len(), self.calls.len(), self.queues.waiters())
    }

    /// Leased tokens this worker holds in its stash for bucket `key`, and when they expire (for
    /// `examples/lease_sim.rs`' account of where tokens went).
    pub fn stashed(&self, key: &str) -> Option<(u64, u64)> {
        self.stashes.held(key)
    }

    // ----- events -----

    /// A request's headers: decide what can be decided locally, send what needs the backend.
    pub fn request_headers(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        req: &dyn RequestView,
    ) -> Action {
        self.in_headers = Some((ctx, None));
        self.decide_headers(host, ctx, req);
        let decided = self.in_headers.take().and_then(|(_, action)| action);
        // The time this request read, or, if it read none (the stash admitted it), the worker's
        // latest reading: all it can have added is counts, whose tick then comes at most as much
        // later as that reading is old.
        self.schedule(host, self.clock_ms, false);
        decided.unwrap_or(Action::Pause)
    }

    /// The host's clock, read now, and kept as the worker's latest reading.
    fn now(&mut self, host: &dyn Host) -> u64 {
        let now = host.now_ms();
        self.clock_ms = self.clock_ms.max(now);
        now
    }

    fn decide_headers(&mut self, host: &mut dyn Host, ctx: u32, req: &dyn RequestView) {
        let mut checks = std::mem::take(&mut self.spare_checks);
        for idx in 0..self.plugin.config.rules.len() {
            let (call, lease) = match self.plugin.check_for(idx, req, &mut self.keys) {
                plugin::Plan::Skip => continue,
                plugin::Plan::Unlimited => {
                    self.plugin.metrics.count(idx, Counter::Allowed, 1);
                    continue;
                }
                plugin::Plan::BadCost(e) => {
                    return self.apply(host, ctx, None, plugin::bad_cost(&e), false);
                }
                plugin::Plan::Check(call, lease) => (call, lease),
            };
            let (outcome, route) = self.local_outcome(host, idx, &call, lease);
            if let Some(o) = outcome {
                self.plugin.count(idx, (o, Source::Local));
            }
            checks.push(Check {
                rule: idx,
                call,
                outcome,
                route,
                backend: false,
            });
        }
        let mut request = Request {
            checks,
            grpc: None,
            deciding: true,
            headers: None,
            usage: Vec::new(),
        };
        // Whether the client speaks gRPC matters only for a local answer: read it only then.
        let verdict = match self.verdict_if_done(&request) {
            Some(Verdict::Respond(_)) => {
                request.grpc = Some(plugin::is_grpc(req.header("content-type").as_deref()));
                self.verdict_if_done(&request)
            }
            other => other,
        };
        if let Some(verdict) = verdict {
            let grpc = request.grpc.unwrap_or(false);
            for c in request.checks.drain(..) {
                self.keys.recycle(c.call.key);
            }
            self.spare_checks = request.checks;
            return self.apply(host, ctx, None, verdict, grpc);
        }
        self.send_undecided(host, ctx, request);
    }

    /// Keeps `request`, which the local stage left undecided, and sends (or queues) the calls its
    /// undecided checks need. Out of line: the local path, which answers most requests, never
    /// runs it, and its code would sit between that path's instructions.
    #[inline(never)]
    fn send_undecided(&mut self, host: &mut dyn Host, ctx: u32, request: Request) {
        let undecided: Vec<(usize, Route)> = request
            .checks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.outcome.is_none())
            .map(|(i, c)| (i, c.route))
            .collect();
        if request.checks.iter().any(|c| {
            self.plugin
                .rule(c.rule)
                .is_some_and(crate::config::Rule::reads_body)
        }) {
            // Its usage will be read from the body, which the filter reads only unencoded: ask
            // the upstream for that (an answer encoded anyway is charged the worst case).
            host.set_request_header(ctx, "accept-encoding", "identity");
        }
        self.requests.insert(ctx, request);
        let now = self.now(host);
        // A lease call checks the breaker when it is about to go out; the others check it here.
        let own_call = |route: &Route| *route != Route::Lease;
        if undecided.iter().any(|(_, r)| own_call(r)) && !self.backend_allowed(host, now) {
            // The breaker is open: the failure mode answers now, no request waits on a dead backend.
            for (idx, _) in undecided.iter().filter(|(_, r)| own_call(r)) {
                self.fail_check(host, ctx, *idx, &BackendError::CircuitOpen, now);
            }
        }
        for (idx, route) in undecided {
            if !self.is_waiting(ctx, idx) {
                continue;
            }
            match route {
                Route::Exact => self.send_exact(host, ctx, idx, now),
                Route::Lease => self.wait_for_lease(host, ctx, idx, now),
                Route::Alone => self.send_check(host, ctx, idx, now),
            }
        }
    }

    /// The answer to call `token` (the host delivers it on the root context, whichever callback
    /// sent it).
    pub fn call_response(&mut self, host: &mut dyn Host, token: u32, answer: &Answer) {
        let Some(call) = self.calls.remove(&token) else {
            return;
        };
        let now = self.now(host);
        self.plugin
            .metrics
            .latency(call.rule, now.saturating_sub(call.sent_ms));
        let reply = self.plugin.transport.decode(answer);
        if matches!(reply, Err(BackendError::NoScript)) && !call.with_source {
            self.resend_with_source(host, call, now);
        } else {
            self.record(host, call.rule, reply.as_ref().map(|_| ()), now);
            if reply.is_err() {
                self.settlement_failed(host, call.rule, &call.call, now);
            }
            match call.purpose {
                Purpose::Check { ctx, idx } => {
                    let outcome = match reply {
                        Ok(r) => self.reply_outcome(host, &call.call, &r, call.sent_ms),
                        Err(e) => self.failure_outcome(host, call.rule, &call.call, &e, now),
                    };
                    self.settle(host, ctx, idx, outcome);
                    if coalesce::eligible(&call.call) {
                        self.chain_next(host, &call.call.key, now);
                    }
                }
                Purpose::Batch(checks) => {
                    self.batch_answer(host, &call.call, checks, reply, call.sent_ms, now);
                    self.chain_next(host, &call.call.key, now);
                }
                Purpose::Settle => {}
                Purpose::Lease(claim) => {
                    let (rule, sent_ms, asked) = (call.rule, call.sent_ms, call.call);
                    let answer = (reply, sent_ms);
                    self.lease_answer(host, rule, claim, &asked, answer, now);
                }
            }
        }
        self.schedule(host, now, false);
    }

    /// The periodic tick of the worker's root context.
    pub fn tick(&mut self, host: &mut dyn Host) {
        let now = self.now(host);
        let metrics = &self.plugin.metrics;
        // An expired stash's batch goes back to the pool: the proxy no longer holds it, and its
        // unspent tokens are the pool's again while the key's lease lives (else they are dropped).
        let pool = LeasePool::new(host.store(), &self.plugin.ns);
        self.stashes.expire(now, |rule, key, back| {
            give_back(&pool, metrics, (rule, key, back), now)
        });
        while let Some(Reverse((due, ctx))) = self.held.peek().copied() {
            if due > now {
                break;
            }
            self.held.pop();
            if self.requests.contains_key(&ctx) {
                host.resume(ctx);
            }
        }
        self.expire_waiters(host, now);
        self.expire_forwarded(host, now);
        self.poll_leases(host, now);
        self.defer_flushes_while_open(host, now);
        self.flush_settlements(host, now);
        self.schedule(host, now, true);
    }

    /// While the breaker is open no settlement can go out: every flush due before it would let a
    /// call through waits until then, so the tick fires once at that time instead of every
    /// millisecond (a flush the breaker refused would otherwise stay due, or come back after
    /// `flush_ms`). The settlements stay pending in shared data meanwhile; a call for the key
    /// still carries its own.
    fn defer_flushes_while_open(&mut self, host: &mut dyn Host, now: u64) {
        if self.flushes.peek().is_none_or(|Reverse(f)| f.0 > now) {
            return;
        }
        let Some(until) = self.health(host.store()).open_until().filter(|t| *t > now) else {
            return;
        };
        // One flush per key is enough: it takes whatever the key has pending by then.
        let mut deferred =
            std::collections::BTreeMap::<String, (usize, crate::bucket::Limits)>::new();
        while let Some(Reverse(f)) = self.flushes.peek() {
            if f.0 >= until {
                break;
            }
            if let Some(Reverse((_, rule, key, limits))) = self.flushes.pop() {
                deferred.insert(key, (rule, limits));
            }
        }
        let later = deferred.into_iter();
        self.flushes
            .extend(later.map(|(key, (rule, limits))| Reverse((until, rule, key, limits))));
    }

    /// The response headers of `ctx` (read through `response`): add the rate-limit headers kept
    /// for it, and read usage from a header. True if the engine wants to see the body.
    pub fn response_headers(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        response: &dyn RequestView,
    ) -> bool {
        let Some(r) = self.requests.get_mut(&ctx) else {
            return false;
        };
        if let Some(shown) = r.headers.take() {
            let written = self.plugin.write_headers(&shown, &mut self.header_buf);
            if !written.is_empty() {
                let pairs = written.pairs(&self.header_buf);
                host.add_response_headers(ctx, written.headers(&pairs));
            }
        }
        !r.usage.is_empty() && self.usage_from_headers(host, ctx, response, false)
    }

    /// A chunk of the response body of `ctx` (`end`: the last one). Only looked at.
    pub fn response_body(&mut self, host: &mut dyn Host, ctx: u32, chunk: &[u8], end: bool) {
        self.usage_from_body(host, ctx, chunk, end);
    }

    /// The response trailers of `ctx`: a usage header may come there.
    pub fn response_trailers(&mut self, host: &mut dyn Host, ctx: u32, trailers: &dyn RequestView) {
        self.usage_from_headers(host, ctx, trailers, true);
    }

    /// Context `ctx` is gone (the client went away, or the request ended): forget it, settling
    /// the usage its response has not reported yet. Calls it sent stay out: the host owns every
    /// callout on the root context and answers it there even after the request that sent it is
    /// gone (proxy-wasm-cpp-host `http_call` and Higress' Redis calls), so their grants still
    /// serve the other waiters and the pool.
    pub fn done(&mut self, host: &mut dyn Host, ctx: u32) {
        let Some(mut r) = self.requests.remove(&ctx) else {
            return;
        };
        // A request still held for its reservation never went upstream: it used nothing beyond
        // what it paid up front.
        if !r.usage.is_empty() && !self.held.iter().any(|Reverse((_, held))| *held == ctx) {
            let usage = std::mem::take(&mut r.usage);
            self.usage_at_end(host, ctx, usage);
        }
        let mut waited = false;
        for c in r.checks.iter().filter(|c| c.outcome.is_none()) {
            waited = true;
            match c.route {
                Route::Lease => self.queues.remove_waiter(&c.call.key, ctx),
                Route::Exact => self.chains.remove_waiter(&c.call.key, ctx),
                Route::Alone => {}
            }
        }
        if waited {
            let now = self.now(host);
            self.schedule(host, now, false);
        }
    }

    // ----- checks -----

    /// What the local stage answers for a check: a leased token (from this worker's stash, or a
    /// batch moved from the proxy's pool) or a cached denial; and where the check goes if neither.
    fn local_outcome(
        &mut self,
        host: &dyn Host,
        idx: usize,
        call: &ScriptCall,
        lease: bool,
    ) -> (Option<Outcome>, Route) {
        if lease {
            // By the worker's latest clock reading (see [`stash`]): the local path's one
            // clock-free answer.
            if let Some(spent) = self.stashes.spend(&call.key, call.cost, self.clock_ms) {
                return (Some(Outcome::leased(spent)), Route::Lease);
            }
        }
        self.shared_outcome(host, idx, call, lease)
    }

    /// [`Engine::local_outcome`] past this worker's stash: the proxy's pool and deny cache in
    /// shared data. Out of line, as [`Engine::send_undecided`].
    #[inline(never)]
    fn shared_outcome(
        &mut self,
        host: &dyn Host,
        idx: usize,
        call: &ScriptCall,
        lease: bool,
    ) -> (Option<Outcome>, Route) {
        let now = self.now(host);
        let store = host.store();
        let mut refilling = None;
        let mut route = Route::Exact;
        if lease {
            let why = match self.spend_leased(store, idx, call, now) {
                Ok(s) => return (Some(Outcome::leased(s)), Route::Lease),
                Err(why) => why,
            };
            let alone = self.sightings.goes_alone(&call.key);
            route = match why {
                NoLease::Refilling(later) => {
                    refilling = Some(later);
                    Route::Lease
                }
                NoLease::Unknown if alone => Route::Alone,
                NoLease::Unknown | NoLease::Spent => Route::Lease,
            };
        }
        let denied = DenyCache::new(store, &self.plugin.ns)
            .denied(&call.key, call.cost, now)
            .or(refilling)
            .map(|retry_ms| Outcome::Denied { retry_ms });
        if lease && denied.is_some() {
            if self.unmet.len() >= stash::MAX_KEYS && !self.unmet.contains_key(&call.key) {
                self.unmet.clear();
            }
            let unmet = self.unmet.entry(call.key.clone()).or_insert(0);
            *unmet = unmet.saturating_add(call.cost);
        }
        (denied, route)
    }

    /// Spends `call`'s cost from a batch moved out of the proxy's pool into this worker's stash;
    /// or says why it cannot.
    fn spend_leased(
        &mut self,
        store: &dyn Store,
        idx: usize,
        call: &ScriptCall,
        now: u64,
    ) -> Result<crate::shared::lease::Spent, NoLease> {
        let metrics = &self.plugin.metrics;
        let pool = LeasePool::new(store, &self.plugin.ns);
        let (room, gone) = self.stashes.room_for(&call.key, now);
        for (rule, key, back) in gone {
            give_back(&pool, metrics, (rule, &key, back), now);
        }
        let Some(sizing) = self
            .plugin
            .rule(idx)
            .map(|r| lease::sizing(r, &call.limits()))
        else {
            return Err(NoLease::Unknown);
        };
        let back = self.stashes.hand_back(&call.key);
        match pool.take_batch(&call.key, call.cost, now, &sizing, (!room, back)) {
            Ok(Taken::Batch(batch)) if room => {
                Ok(self.stashes.keep((idx, &call.key), &batch, call.cost, now))
            }
            // Exactly the cost, spent at once: nothing to keep.
            Ok(Taken::Batch(batch)) => Ok(crate::shared::lease::Spent {
                remaining: batch.global_remaining,
                reset_ms: batch.reset_at_ms.saturating_sub(now),
            }),
            Ok(Taken::Refilling(ms)) => Err(NoLease::Refilling(ms)),
            Ok(Taken::Miss) => Err(NoLease::Spent),
            // A failing store knows nothing either.
            Ok(Taken::Unknown) | Err(_) => Err(NoLease::Unknown),
        }
    }

    fn is_waiting(&self, ctx: u32, idx: usize) -> bool {
        self.requests
            .get(&ctx)
            .and_then(|r| r.checks.get(idx))
            .is_some_and(|c| c.outcome.is_none())
    }

    fn check_call(&self, ctx: u32, idx: usize) -> Option<(usize, ScriptCall)> {
        let c = self.requests.get(&ctx)?.checks.get(idx)?;
        Some((c.rule, c.call.clone()))
    }

    /// Sends exact check `idx`'s call, or queues it behind the call out for its key.
    fn send_exact(&mut self, host: &mut dyn Host, ctx: u32, idx: usize, now: u64) {
        let Some((rule, call)) = self.check_call(ctx, idx) else {
            return;
        };
        if coalesce::eligible(&call) && self.join_chain(host, (rule, &call), ctx, idx, now) {
            return;
        }
        self.send_check(host, ctx, idx, now);
        if !self.is_waiting(ctx, idx) {
            // The call failed at once: the chain it started is over.
            self.chain_next(host, &call.key, now);
        }
    }

    /// Sends check `idx`'s own call (exact mode, or a lease check whose key has no lease slot).
    fn send_check(&mut self, host: &mut dyn Host, ctx: u32, idx: usize, now: u64) {
        let Some((rule, mut call)) = self.check_call(ctx, idx) else {
            return;
        };
        call.lease_want = 0;
        let purpose = Purpose::Check { ctx, idx };
        if let Err((e, _)) = self.send(host, Call::new(rule, call, purpose, now)) {
            self.fail_check(host, ctx, idx, &e, now);
        }
    }

    /// Sends one script call; gives the purpose back if it did not go out.
    fn send(&mut self, host: &mut dyn Host, out: Call) -> Result<(), (BackendError, Purpose)> {
        let Call {
            rule,
            mut call,
            purpose,
            with_source,
            ..
        } = out;
        let backend = &self.plugin.config.backend;
        if self.calls.len() as u64 >= backend.max_inflight {
            self.plugin
                .metrics
                .count(rule, Counter::InflightRejected, 1);
            return Err((BackendError::Overflow, purpose));
        }
        if call.settle == 0 && self.plugin.rule(rule).is_some_and(|r| r.usage.is_some()) {
            // This proxy's pending usage for the key rides on the call: Redis settles it first,
            // so this very check sees every charge this proxy knows of.
            call.settle = settle::take(host.store(), &self.plugin.ns, &call.key).unwrap_or(0);
        }
        let backend = &self.plugin.config.backend;
        let req = self.plugin.transport.request(&call, with_source);
        match host.dispatch(&backend.cluster, &req, backend.timeout_ms) {
            Ok(token) => {
                self.plugin.metrics.count(rule, Counter::BackendCalls, 1);
                self.calls.insert(
                    token,
                    Call {
                        call,
                        purpose,
                        ..out
                    },
                );
                Ok(())
            }
            Err(e) => {
                let now = self.now(host);
                self.record(host, rule, Err(&e), now);
                self.settlement_failed(host, rule, &call, now);
                Err((e, purpose))
            }
        }
    }

    /// NOSCRIPT: the same call again with the script's source (EVAL), once.
    fn resend_with_source(&mut self, host: &mut dyn Host, call: Call, now: u64) {
        let key = call.call.key.clone();
        if let Purpose::Lease(claim) = &call.purpose {
            // A second timeout for the same claim: no other lease call for the key meanwhile.
            let until = self.claim_until(now);
            let _ = LeasePool::new(host.store(), &self.plugin.ns).renew(claim, until);
        }
        let again = Call {
            with_source: true,
            ..call
        };
        match self.send(host, again) {
            Ok(()) => {}
            Err((e, Purpose::Check { ctx, idx })) => self.fail_check(host, ctx, idx, &e, now),
            Err((e, Purpose::Batch(checks))) => {
                self.fail_chained(host, &checks, &e, now);
                self.chain_next(host, &key, now);
            }
            Err((_, Purpose::Settle)) => {}
            Err((e, Purpose::Lease(claim))) => {
                let _ = LeasePool::new(host.store(), &self.plugin.ns).release(claim, None, now);
                self.queues.flight_lost(&key);
                self.fail_waiters(host, &key, &e, now);
            }
        }
    }

    /// What a script reply means for a check; a denial is remembered in the deny cache.
    fn reply_outcome(
        &self,
        host: &mut dyn Host,
        call: &ScriptCall,
        r: &Reply,
        sent_ms: u64,
    ) -> Outcome {
        let outcome = Outcome::of_reply(r);
        if let Outcome::Denied { retry_ms } = outcome {
            let until = sent_ms.saturating_add(retry_ms);
            let _ =
                DenyCache::new(host.store(), &self.plugin.ns).remember(&call.key, call.cost, until);
        }
        outcome
    }

    /// The failure mode's outcome for a check whose call failed (or was never sent).
    fn failure_outcome(
        &self,
        host: &mut dyn Host,
        rule_idx: usize,
        call: &ScriptCall,
        _err: &BackendError,
        now: u64,
    ) -> Outcome {
        let Some(rule) = self.plugin.rule(rule_idx) else {
            return Outcome::FailClosed;
        };
        match self.plugin.config.failure_mode {
            FailureMode::Open => Outcome::FailOpen,
            FailureMode::Closed => Outcome::FailClosed,
            FailureMode::Local => {
                let limits = rule.fallback.map_or(call.limits(), |f| f.limits());
                let table = format!("{}|{}", self.plugin.ns, rule.name);
                match fallback::take(host.store(), &table, &call.key, &limits, call.cost, now) {
                    Ok(r) => match Outcome::of_reply(&r) {
                        Outcome::Reserved { .. } => Outcome::FailClosed,
                        o => o,
                    },
                    // Shared data kept failing: deny rather than admit unaccounted.
                    Err(_) => Outcome::Denied { retry_ms: 1000 },
                }
            }
        }
    }

    fn fail_check(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        idx: usize,
        e: &BackendError,
        now: u64,
    ) {
        let Some((rule, call)) = self.check_call(ctx, idx) else {
            return;
        };
        let outcome = self.failure_outcome(host, rule, &call, e, now);
        self.settle(host, ctx, idx, outcome);
    }

    /// Records check `idx`'s outcome (once), and applies the verdict when the request has one.
    fn settle(&mut self, host: &mut dyn Host, ctx: u32, idx: usize, outcome: Outcome) {
        let Some(request) = self.requests.get_mut(&ctx) else {
            return;
        };
        if !request.deciding {
            return;
        }
        let Some(check) = request.checks.get_mut(idx) else {
            return;
        };
        if check.outcome.is_some() {
            return;
        }
        check.outcome = Some(outcome);
        let source = match outcome {
            Outcome::FailOpen | Outcome::FailClosed => Source::Failure,
            _ => Source::Backend,
        };
        check.backend = source == Source::Backend;
        let rule = check.rule;
        self.plugin.count(rule, (outcome, source));
        let Some(request) = self.requests.get(&ctx) else {
            return;
        };
        let mut verdict = self.verdict_if_done(request);
        let mut grpc = request.grpc;
        if matches!(verdict, Some(Verdict::Respond(_))) && grpc.is_none() {
            // A local answer after all: its shape depends on whether the client speaks gRPC.
            grpc = Some(plugin::is_grpc(
                host.request_header(ctx, "content-type").as_deref(),
            ));
            if let Some(request) = self.requests.get_mut(&ctx) {
                request.grpc = grpc;
            }
            verdict = self
                .requests
                .get(&ctx)
                .and_then(|r| self.verdict_if_done(r));
        }
        if let Some(verdict) = verdict {
            let request = self.requests.remove(&ctx);
            self.apply(host, ctx, request, verdict, grpc.unwrap_or(false));
        }
    }

    /// The verdict, once every check has an outcome or an enforced rule refused.
    fn verdict_if_done(&self, request: &Request) -> Option<Verdict> {
        let cfg = &self.plugin.config;
        let enforced = |c: &&Check| !cfg.rules.get(c.rule).is_some_and(|r| r.shadow);
        let refused = request
            .checks
            .iter()
            .filter(enforced)
            .any(|c| c.outcome.is_some_and(|o| o.refuses()));
        let complete = request.checks.iter().all(|c| c.outcome.is_some());
        (refused || complete).then(|| {
            plugin::verdict(
                cfg,
                request
                    .checks
                    .iter()
                    .filter_map(|c| Some((c.rule, c.outcome?, c.call.limits()))),
                request.grpc.unwrap_or(false),
            )
        })
    }

    /// Applies a verdict to `ctx`, whose `request` the caller took out of the engine's requests
    /// (None: decided inside its `request_headers`, it was never kept). Inside its own
    /// `request_headers` the action is returned to Envoy from there; otherwise the paused request
    /// is resumed or answered here.
    fn apply(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        request: Option<Request>,
        verdict: Verdict,
        grpc: bool,
    ) {
        log::debug!("tollgate: {}", describe(&verdict));
        let usage = request
            .map(|r| self.close_request(ctx, &r))
            .unwrap_or_default();
        match verdict {
            Verdict::Respond(reply) => {
                host.respond(ctx, &reply);
                self.decided_in_headers(ctx, Action::Pause);
            }
            Verdict::Allow(shown) => {
                let delay_ms = shown.delay_ms;
                let style = self.plugin.config.response_headers;
                if shown.any(style) || !usage.is_empty() {
                    self.requests.insert(
                        ctx,
                        Request {
                            checks: Vec::new(),
                            grpc: Some(grpc),
                            deciding: false,
                            headers: Some(shown),
                            usage,
                        },
                    );
                }
                if delay_ms > 0 {
                    let now = self.now(host);
                    self.held.push(Reverse((now.saturating_add(delay_ms), ctx)));
                    self.schedule(host, now, false);
                    self.decided_in_headers(ctx, Action::Pause);
                } else if !self.decided_in_headers(ctx, Action::Continue) {
                    host.resume(ctx);
                }
            }
        }
    }

    /// Takes decided request `r` of `ctx` off the lease queues it still waits in; its usage
    /// admissions. Out of line: a request decided inside its `request_headers` has none.
    #[inline(never)]
    fn close_request(&mut self, ctx: u32, r: &Request) -> Vec<Admitted> {
        for c in r
            .checks
            .iter()
            .filter(|c| c.route == Route::Lease && c.outcome.is_none())
        {
            self.queues.remove_waiter(&c.call.key, ctx);
        }
        self.usage_admissions(r)
    }

    /// Records `action` as the answer of `ctx`'s running `request_headers`; false if `ctx` is not
    /// the request whose headers are being handled (it is paused, and must be resumed).
    fn decided_in_headers(&mut self, ctx: u32, action: Action) -> bool {
        match &mut self.in_headers {
            Some((current, decided)) if *current == ctx => {
                *decided = Some(action);
                true
            }
            _ => false,
        }
    }

    // ----- backend health -----

    fn backend_allowed(&self, host: &mut dyn Host, now: u64) -> bool {
        self.health(host.store()).allow(now)
    }

    fn health<'a>(&self, store: &'a dyn Store) -> Health<'a> {
        let b = &self.plugin.config.backend;
        Health::new(
            store,
            &self.plugin.ns,
            b.breaker_failures,
            b.breaker_cooloff_ms,
        )
    }

    /// Feeds one call's result to the proxy's health, counts a failure, and logs a change of state.
    fn record(
        &self,
        host: &mut dyn Host,
        rule: usize,
        result: Result<(), &BackendError>,
        now: u64,
    ) {
        if let Err(e) = result {
            let m = &self.plugin.metrics;
            m.count(rule, Counter::BackendErrors, 1);
            m.count(rule, Counter::BackendError(e.class()), 1);
        }
        let mode = self.plugin.config.failure_mode;
        let b = &self.plugin.config.backend;
        for event in self.health(host.store()).record(result, now) {
            match event {
                Event::Opened => {
                    self.plugin.metrics.breaker_open(true);
                    log::warn!(
                        "tollgate: backend failing: circuit open after {} consecutive failures; \
                         failure_mode {mode:?} answers, one probe every {} ms",
                        b.breaker_failures,
                        b.breaker_cooloff_ms
                    );
                }
                Event::Closed => {
                    self.plugin.metrics.breaker_open(false);
                    log::info!("tollgate: backend answering again: circuit closed");
                }
                Event::Failing(class, msg) => log::warn!(
                    "tollgate: backend error ({}): {msg}; failure_mode {mode:?} applies to the \
                     requests it concerns (logged again only after it recovers)",
                    class.name()
                ),
                Event::Recovered(classes) => {
                    let names: Vec<&str> = classes.iter().map(|c| c.name()).collect();
                    log::info!("tollgate: backend recovered from: {}", names.join(", "));
                }
            }
        }
    }

    // ----- the tick -----

    /// Keeps the tick running at the period of the nearest deadline, and off when nothing is due.
    /// Outside a tick it only ever shortens the period (so a busy worker does not re-arm the
    /// timer on every request). Every event that can count ends here: batched counts are pushed
    /// to the host once due, and keep a tick coming until they are.
    fn schedule(&mut self, host: &mut dyn Host, now: u64, in_tick: bool) {
        // Outside a tick, pending counts only need some tick at most `METRICS_FLUSH_MS` apart
        // (the tick then aims at their deadline): asking for the time left would shorten the
        // period again on every request as the deadline nears.
        let mut next = self.plugin.metrics.flush_if_due(now).map(|due| {
            if in_tick {
                due
            } else {
                now.saturating_add(METRICS_FLUSH_MS)
            }
        });
        // Deadlines of checks that were served meanwhile are nothing to watch.
        while let Some((ctx, idx)) = self.queues.patience_front() {
            if self.is_waiting(ctx, idx) {
                break;
            }
            self.queues.pop_patience();
        }
        if let Some(due) = self.queues.next_due(now) {
            next = Some(next.map_or(due, |n: u64| n.min(due)));
        }
        if let Some(Reverse((due, _, _, _))) = self.flushes.peek() {
            next = Some(next.map_or(*due, |n: u64| n.min(*due)));
        }
        if let Some(due) = self.chains.next_deadline() {
            next = Some(next.map_or(due, |n: u64| n.min(due)));
        }
        if let Some(Reverse((due, _))) = self.held.peek() {
            next = Some(next.map_or(*due, |n: u64| n.min(*due)));
        }
        if let Some(due) = self.stashes.next_expiry() {
            next = Some(next.map_or(due, |n: u64| n.min(due)));
        }
        let want = next.map_or(0, |due| due.saturating_sub(now).max(1));
        // Outside a tick the tick is only ever brought forward, and only when something is due
        // before it fires anyway: a deadline that stays put does not re-arm it at every event.
        let change = if in_tick {
            want != self.tick_ms
        } else {
            want != 0 && (self.tick_ms == 0 || now.saturating_add(want) < self.tick_next_ms)
        };
        if change {
            host.set_tick(want);
            self.tick_ms = want;
        }
        if change || in_tick {
            self.tick_next_ms = now.saturating_add(self.tick_ms);
        }
    }
}

/// A verdict for a debug log line: status and rate-limit headers (rule names and numbers only,
/// never request values).
fn describe(v: &Verdict) -> String {
    match v {
        Verdict::Allow(shown) => format!("allow after {} ms [{:?}]", shown.delay_ms, shown.admit),
        Verdict::Respond(r) => {
            let hs: Vec<String> = r.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            format!("answer {} [{}]", r.status, hs.join("; "))
        }
    }
}

#[cfg(test)]
mod tests;
