//! One worker: a thread with its own VM instance and root context, driven by an event loop, the way
//! an Envoy worker thread drives its Wasm filter.
//!
//! Order of callbacks (proxy-wasm-cpp-host src/context.cc, Envoy source/extensions/common/wasm/context.cc):
//! - start: `_initialize` (no proxy_* host call allowed), `proxy_on_context_create(root, 0)`,
//!   `proxy_on_vm_start(root, vm_config_size)`, `proxy_on_configure(root, plugin_config_size)`;
//! - request: `proxy_on_context_create(ctx, root)`, `proxy_on_request_headers(ctx, n, end_of_stream)`;
//!   then on Continue (and no local reply) the route answers: `proxy_on_response_headers`,
//!   `proxy_on_response_body`; at the end `proxy_on_log`, `proxy_on_done`, `proxy_on_delete`;
//! - callouts are answered on the root context: `proxy_on_http_call_response(root, token, headers,
//!   body_size, trailers)`, `proxy_on_redis_call_response(root, token, status, size)`;
//! - `proxy_on_tick(root)` every tick period, re-armed after each tick and whenever the period is set.
//! - `proxy_on_queue_ready(root, token)` on the worker that registered a shared queue, once per
//!   message put on it (from any worker).
//!
//! After every VM call the deferred actions run in order (Envoy's `DeferAfterCallActions`): resuming a
//! request and sending a local reply never happen inside the call that asked for them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmi::{Engine, Instance, Linker, Module, Store, WasmParams, WasmResults};

use crate::net::{CalloutFailure, CalloutResponse};
use crate::redis::{RedisClient, RedisConfig};
use crate::Shared;

/// A downstream request handed to a worker.
pub struct Request {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub peer: SocketAddr,
    pub reply: mpsc::Sender<Response>,
}

/// What the downstream client gets.
pub enum Response {
    Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// The stream was reset.
    Reset,
}

pub enum Event {
    Request(Request),
    HttpDone {
        token: u32,
        result: Result<CalloutResponse, CalloutFailure>,
    },
    RedisDone {
        token: u32,
        status: u32,
        reply: Vec<u8>,
    },
    /// A message was put on shared queue `token`, registered by root context `root` here.
    QueueReady {
        root: u32,
        token: u32,
    },
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Inside `proxy_on_request_headers`.
    RequestHeaders,
    /// The filter stopped iteration: waiting for a resume or a local reply.
    Paused,
    /// The response is being encoded (or sent).
    Responding,
}

pub struct Stream {
    pub phase: Phase,
    /// Available until the request continues (Envoy nulls it on Continue / continueStream); the
    /// `request.*` attributes read it too, so they end with it.
    pub request_headers: Option<Vec<(String, String)>>,
    /// Available during `proxy_on_response_headers` only.
    pub response_headers: Option<Vec<(String, String)>>,
    /// Available during `proxy_on_response_body` only.
    pub response_body: Option<Vec<u8>>,
    pub peer: SocketAddr,
    pub path: String,
    pub local_reply_hold: bool,
    /// `proxy_on_request_headers` stopped the request (it can be continued).
    pub stopped_once: bool,
    /// The response code details of the local reply sent, if any.
    pub details: Option<String>,
    /// Filter state the module set (`proxy_set_property`), by key: `wasm.<path>`.
    pub filter_state: BTreeMap<String, Vec<u8>>,
    pub reply: Option<mpsc::Sender<Response>>,
}

pub enum After {
    Continue(u32),
    LocalReply {
        ctx: u32,
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    Reset(u32),
}

/// The VM's view of the host (the store data).
pub struct Host {
    pub shared: Arc<Shared>,
    pub worker: usize,
    pub root: u32,
    next_context: u32,
    pub streams: HashMap<u32, Stream>,
    /// The context whose callback is running, and the one `set_effective_context` chose.
    pub current: u32,
    pub effective: u32,
    pub after: VecDeque<After>,
    pub stop_iteration: bool,
    pub initializing: bool,
    pub vm_config_available: bool,
    pub plugin_config_available: bool,
    pub call_response: Option<CalloutResponse>,
    pub redis_response: Option<Vec<u8>>,
    pub tick_period: Duration,
    pub tick_due: Option<Instant>,
    /// HTTP callouts out: token -> deadline (None: no timeout).
    pub http_calls: HashMap<u32, Option<Instant>>,
    pub next_http: u32,
    pub redis_calls: HashMap<u32, ()>,
    pub next_redis: u32,
    pub redis: HashMap<String, RedisClient>,
    pub redis_config: HashMap<String, RedisConfig>,
    /// The definition of each cluster the worker's Redis client and settings belong to.
    pub redis_definition: HashMap<String, u64>,
    pub events: mpsc::Sender<Event>,
    pub next_metric: [u32; 3],
    pub metrics: HashMap<u32, String>,
}

impl Host {
    /// The worker's Redis client and settings for cluster `name` belong to its current definition:
    /// a cluster removed and defined again is a new thread-local entry, whose client has Higress'
    /// defaults (no AUTH, database 0) until `proxy_redis_init` sets it up.
    pub fn follow_definition(&mut self, name: &str) {
        let current = self.shared.definition(name);
        if self.redis_definition.get(name) != Some(&current) {
            self.redis.remove(name);
            self.redis_config.remove(name);
            self.redis_definition.insert(name.to_string(), current);
        }
    }

    /// Envoy's `contextOrEffectiveContext()`: the effective context if one is set and still
    /// exists, else the current one.
    pub fn context(&self) -> u32 {
        if self.effective != 0
            && (self.effective == self.root || self.streams.contains_key(&self.effective))
        {
            self.effective
        } else {
            self.current
        }
    }

    pub fn exists(&self, ctx: u32) -> bool {
        ctx == self.root || self.streams.contains_key(&ctx)
    }

    pub fn log(&self, line: String) {
        self.shared.log_line(format!("[w{}] {line}", self.worker));
    }
}

struct Worker {
    index: usize,
    store: Store<Host>,
    instance: Instance,
    failed: bool,
}

/// The worker thread: loads and configures the VM, reports on `ready`, then serves events.
pub fn run(
    index: usize,
    shared: Arc<Shared>,
    wasm: &[u8],
    events: mpsc::Sender<Event>,
    rx: mpsc::Receiver<Event>,
    ready: mpsc::Sender<Result<(), String>>,
) {
    let mut w = match Worker::load(index, shared, wasm, events) {
        Ok(w) => w,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if let Err(e) = w.configure() {
        let _ = ready.send(Err(e));
        return;
    }
    let _ = ready.send(Ok(()));
    w.serve(rx);
}

impl Worker {
    fn load(
        index: usize,
        shared: Arc<Shared>,
        wasm: &[u8],
        events: mpsc::Sender<Event>,
    ) -> Result<Worker, String> {
        let mut engine_config = wasmi::Config::default();
        engine_config.consume_fuel(true);
        let engine = Engine::new(&engine_config);
        let module = Module::new(&engine, wasm).map_err(|e| format!("bad module: {e}"))?;
        let higress = shared.config.higress;
        let exports: Vec<String> = module.exports().map(|e| e.name().to_string()).collect();
        let abi_021 = exports.iter().any(|n| n == "proxy_abi_version_0_2_1");
        if !abi_021 && !exports.iter().any(|n| n == "proxy_abi_version_0_2_0") {
            return Err("module exports no supported proxy_abi_version_0_2_*".to_string());
        }
        // Higress registers proxy_redis_* only for ABI 0.2.1 / 0.2.100
        // (higress-group/proxy-wasm-cpp-host src/wasm.cc).
        let with_redis = higress && abi_021;
        let host = Host {
            shared,
            worker: index,
            root: 1,
            next_context: 2,
            streams: HashMap::new(),
            current: 0,
            effective: 0,
            after: VecDeque::new(),
            stop_iteration: false,
            initializing: true,
            vm_config_available: false,
            plugin_config_available: false,
            call_response: None,
            redis_response: None,
            tick_period: Duration::ZERO,
            tick_due: None,
            http_calls: HashMap::new(),
            next_http: 0,
            redis_calls: HashMap::new(),
            next_redis: 3,
            redis: HashMap::new(),
            redis_config: HashMap::new(),
            redis_definition: HashMap::new(),
            events,
            next_metric: [0, 1, 2],
            metrics: HashMap::new(),
        };
        let mut store = Store::new(&engine, host);
        store.set_fuel(u64::MAX).map_err(|e| format!("fuel: {e}"))?;
        let mut linker = Linker::new(&engine);
        crate::abi::define(&mut linker, with_redis).map_err(|e| format!("linker: {e}"))?;
        // Like Envoy, a module importing a function the host does not have fails to load.
        let instance = linker
            .instantiate_and_start(&mut store, &module)
            .map_err(|e| {
                format!("Failed to load Wasm module due to a missing import or a trap: {e}")
            })?;
        if let Ok(init) = instance.get_typed_func::<(), ()>(&store, "_initialize") {
            init.call(&mut store, ())
                .map_err(|e| format!("_initialize failed: {e}"))?;
        }
        store.data_mut().initializing = false;
        Ok(Worker {
            index,
            store,
            instance,
            failed: false,
        })
    }

    fn host(&mut self) -> &mut Host {
        self.store.data_mut()
    }

    /// Calls export `name` for context `ctx`; None if the module lacks it (the host then skips the
    /// callback, as Envoy does) or it trapped (the worker fails).
    fn call<P: WasmParams, R: WasmResults>(
        &mut self,
        ctx: u32,
        name: &str,
        params: P,
    ) -> Option<R> {
        if self.failed {
            return None;
        }
        let f = self
            .instance
            .get_typed_func::<P, R>(&self.store, name)
            .ok()?;
        let h = self.host();
        let saved = (h.current, h.effective);
        h.current = ctx;
        h.effective = 0;
        let fuel = self.store.get_fuel().unwrap_or(0);
        if self.host().shared.config.trace {
            eprintln!("TRACE >{name} {fuel}");
        }
        let out = f.call(&mut self.store, params);
        let spent = fuel.saturating_sub(self.store.get_fuel().unwrap_or(0));
        let h = self.host();
        h.shared.fuel(name, spent);
        h.current = saved.0;
        h.effective = saved.1;
        match out {
            Ok(v) => Some(v),
            Err(e) => {
                self.fail(&format!("{name}({ctx}): {e}"));
                None
            }
        }
    }

    /// A trap fails the VM: every stream of this worker is answered 503 (Envoy's default
    /// FAIL_CLOSED `failStream`), and so is every later request.
    fn fail(&mut self, what: &str) {
        self.failed = true;
        let line = format!("w{} {what}", self.index);
        if let Ok(mut t) = self.host().shared.traps.lock() {
            t.push(line.clone());
        }
        self.host().log(format!("critical VM failed: {what}"));
        let streams: Vec<Stream> = self.host().streams.drain().map(|(_, s)| s).collect();
        for s in streams {
            if let Some(tx) = s.reply {
                let _ = tx.send(fail_closed());
            }
        }
    }

    /// The plugin goes away (proxy-wasm-cpp-host `WasmBase::startShutdown`): the root context's
    /// `proxy_on_done`, then, when it answers true (or is not exported), its `proxy_on_delete`.
    fn shut_down(&mut self) {
        let root = self.host().root;
        let done = self.call::<i32, i32>(root, "proxy_on_done", root as i32);
        if done != Some(0) {
            self.call::<i32, ()>(root, "proxy_on_delete", root as i32);
            let period = self.host().tick_period;
            if let Ok(mut t) = self.host().shared.ticks_left.lock() {
                t.push(period);
            }
        }
        self.after();
    }

    fn configure(&mut self) -> Result<(), String> {
        let root = self.host().root;
        self.call::<(i32, i32), ()>(root, "proxy_on_context_create", (root as i32, 0));
        self.after();
        let vm_len = self.host().shared.config.vm_config.len() as i32;
        self.host().vm_config_available = true;
        let started =
            self.call::<(i32, i32), i32>(root, "proxy_on_vm_start", (root as i32, vm_len));
        self.host().vm_config_available = false;
        self.after();
        if started == Some(0) {
            return Err("proxy_on_vm_start returned false".to_string());
        }
        let len = self.host().shared.config.plugin_config.len() as i32;
        self.host().plugin_config_available = true;
        let ok = self.call::<(i32, i32), i32>(root, "proxy_on_configure", (root as i32, len));
        self.host().plugin_config_available = false;
        self.after();
        if self.failed {
            return Err(format!(
                "VM failed while configuring: {:?}",
                self.host().shared.traps.lock().map(|t| t.clone())
            ));
        }
        if ok == Some(0) {
            return Err("proxy_on_configure returned false: configuration rejected".to_string());
        }
        Ok(())
    }

    fn serve(&mut self, rx: mpsc::Receiver<Event>) {
        loop {
            let deadline = self.next_deadline();
            let event = match deadline {
                Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                    Ok(e) => Some(e),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                },
                None => match rx.recv() {
                    Ok(e) => Some(e),
                    Err(_) => return,
                },
            };
            match event {
                Some(Event::Stop) => return self.shut_down(),
                Some(Event::Request(r)) => self.on_request(r),
                Some(Event::HttpDone { token, result }) => self.on_http_done(token, result),
                Some(Event::RedisDone {
                    token,
                    status,
                    reply,
                }) => self.on_redis_done(token, status, reply),
                Some(Event::QueueReady { root, token }) if !self.failed => {
                    self.call::<(i32, i32), ()>(
                        root,
                        "proxy_on_queue_ready",
                        (root as i32, token as i32),
                    );
                    self.after();
                }
                Some(Event::QueueReady { .. }) => {}
                None => {}
            }
            self.fire_timers();
        }
    }

    fn next_deadline(&mut self) -> Option<Instant> {
        let h = self.host();
        let calls = h.http_calls.values().filter_map(|d| *d).min();
        match (h.tick_due, calls) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        let mut due: Vec<(Instant, u32)> = self
            .host()
            .http_calls
            .iter()
            .filter_map(|(t, d)| d.filter(|d| *d <= now).map(|d| (d, *t)))
            .collect();
        due.sort();
        for (_, token) in due {
            if self.host().http_calls.remove(&token).is_some() {
                // Envoy's router times the callout out with a local reply: 504 "upstream request
                // timeout", delivered as a normal response.
                self.deliver_http(token, local_response(504, "upstream request timeout"));
            }
        }
        if self.host().tick_due.is_some_and(|d| d <= now) && !self.failed {
            self.host().tick_due = None;
            let root = self.host().root;
            self.call::<i32, ()>(root, "proxy_on_tick", root as i32);
            self.after();
            // Envoy's tickHandler re-arms the timer with the current period after each tick.
            let period = self.host().tick_period;
            if !period.is_zero() {
                self.host().tick_due = Some(Instant::now() + period);
            }
        }
    }

    /// Runs the deferred actions queued during the last VM call(s), in order.
    fn after(&mut self) {
        self.host().stop_iteration = false;
        while let Some(a) = self.host().after.pop_front() {
            if self.failed {
                return;
            }
            match a {
                After::Continue(ctx) => {
                    let (paused, stopped_once) =
                        self.host().streams.get(&ctx).map_or((false, true), |s| {
                            (s.phase == Phase::Paused, s.stopped_once)
                        });
                    if paused {
                        self.upstream(ctx);
                    } else if !stopped_once {
                        // Envoy's continueDecoding of a filter whose headers went on at once
                        // runs them through the rest of the chain again (commonContinue:
                        // `headers_continued_` is still false): not modelled.
                        self.host().shared.unmodelled(
                            "proxy_continue_stream(request) of a request whose headers were never stopped",
                        );
                    }
                }
                After::LocalReply {
                    ctx,
                    status,
                    headers,
                    body,
                } => {
                    let open = self
                        .host()
                        .streams
                        .get(&ctx)
                        .is_some_and(|s| s.phase != Phase::Responding);
                    if open {
                        self.encode(ctx, status, headers, body);
                    }
                }
                After::Reset(ctx) => self.reset(ctx),
            }
        }
    }

    fn on_request(&mut self, req: Request) {
        if self.failed {
            let _ = req.reply.send(fail_closed());
            return;
        }
        let h = self.host();
        let ctx = h.next_context;
        h.next_context += 1;
        let root = h.root;
        let n = req.headers.len() as i32;
        let path = req
            .headers
            .iter()
            .find(|(k, _)| k == ":path")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        h.streams.insert(
            ctx,
            Stream {
                phase: Phase::RequestHeaders,
                request_headers: Some(req.headers),
                response_headers: None,
                response_body: None,
                peer: req.peer,
                path,
                local_reply_hold: false,
                stopped_once: false,
                details: None,
                filter_state: BTreeMap::new(),
                reply: Some(req.reply),
            },
        );
        self.call::<(i32, i32), ()>(ctx, "proxy_on_context_create", (ctx as i32, root as i32));
        self.after();
        let end_of_stream = i32::from(req.body.is_empty());
        let action = self.call::<(i32, i32, i32), i32>(
            ctx,
            "proxy_on_request_headers",
            (ctx as i32, n, end_of_stream),
        );
        if self.failed {
            return;
        }
        // cpp-host convertVmCallResultToFilterHeadersStatus: a local reply sent during the call
        // stops iteration whatever the call returned.
        let go = action.unwrap_or(0) == 0 && !self.host().stop_iteration;
        if let Some(s) = self.host().streams.get_mut(&ctx) {
            if go {
                s.request_headers = None;
            }
            s.stopped_once = !go;
            s.phase = if go { Phase::Responding } else { Phase::Paused };
        }
        self.after();
        if go && self.host().streams.contains_key(&ctx) && !self.failed {
            self.route(ctx);
        }
    }

    /// The request continues to the route (after a resume).
    fn upstream(&mut self, ctx: u32) {
        if let Some(s) = self.host().streams.get_mut(&ctx) {
            s.phase = Phase::Responding;
            s.request_headers = None;
        }
        self.route(ctx);
    }

    /// envoy/envoy.yaml's routes: everything answers 200 "ok\n" (direct_response); /app/ has no
    /// application here (Envoy's tests point it at the discard port): 503.
    fn route(&mut self, ctx: u32) {
        let app = self
            .host()
            .streams
            .get(&ctx)
            .is_some_and(|s| s.path.starts_with("/app/"));
        if app {
            self.encode(ctx, 503, Vec::new(), b"no healthy upstream".to_vec());
        } else {
            self.encode(ctx, 200, Vec::new(), b"ok\n".to_vec());
        }
    }

    /// Sends a response (the route's or a local reply) through the filter's encoder callbacks to
    /// the client, then ends the stream.
    fn encode(&mut self, ctx: u32, status: u16, extra: Vec<(String, String)>, body: Vec<u8>) {
        let mut headers = vec![
            (":status".to_string(), status.to_string()),
            ("content-length".to_string(), body.len().to_string()),
        ];
        if !body.is_empty() {
            headers.push(("content-type".to_string(), "text/plain".to_string()));
        }
        headers.extend(extra.into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)));
        let n = headers.len() as i32;
        match self.host().streams.get_mut(&ctx) {
            Some(s) => {
                s.phase = Phase::Responding;
                s.request_headers = None;
                s.response_headers = Some(headers);
            }
            None => return,
        }
        let action = self.call::<(i32, i32, i32), i32>(
            ctx,
            "proxy_on_response_headers",
            (ctx as i32, n, i32::from(body.is_empty())),
        );
        let stopped = self.response_stopped(action);
        self.after();
        if stopped {
            return self.hold_response(ctx, "proxy_on_response_headers");
        }
        let Some(headers) = self
            .host()
            .streams
            .get_mut(&ctx)
            .and_then(|s| s.response_headers.take())
        else {
            return;
        };
        let mut body = body;
        if !body.is_empty() {
            if let Some(s) = self.host().streams.get_mut(&ctx) {
                s.response_body = Some(body.clone());
            }
            let action = self.call::<(i32, i32, i32), i32>(
                ctx,
                "proxy_on_response_body",
                (ctx as i32, body.len() as i32, 1),
            );
            let stopped = self.response_stopped(action);
            self.after();
            if stopped {
                return self.hold_response(ctx, "proxy_on_response_body");
            }
            match self
                .host()
                .streams
                .get_mut(&ctx)
                .and_then(|s| s.response_body.take())
            {
                Some(b) => body = b,
                None => return,
            }
        }
        let status = headers
            .iter()
            .find(|(k, _)| k == ":status")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(status);
        if let Some(tx) = self
            .host()
            .streams
            .get_mut(&ctx)
            .and_then(|s| s.reply.take())
        {
            let _ = tx.send(Response::Reply {
                status,
                headers,
                body,
            });
        }
        self.finish(ctx);
    }

    /// Whether Envoy stops the response after an encoder callback that answered `action`:
    /// cpp-host's `convertVmCallResultToFilterHeadersStatus` / `...DataStatus` stop it for any
    /// non-zero answer and whenever a local reply was sent during the call, to this stream or
    /// to any other (`stopNextIteration` is the VM's, not the stream's).
    fn response_stopped(&mut self, action: Option<i32>) -> bool {
        !self.failed && (action.is_some_and(|a| a != 0) || self.host().stop_iteration)
    }

    /// A response Envoy would hold until `proxy_continue_stream(response)` (its client waits
    /// for the stream's idle timeout): not modelled, so recorded, and the client's stream reset
    /// instead of left hanging.
    fn hold_response(&mut self, ctx: u32, callback: &str) {
        self.host().shared.unmodelled(&format!(
            "{callback}: the response was stopped (a non-zero answer, or a local reply sent \
             during the call); Envoy holds it until proxy_continue_stream(response)"
        ));
        self.reset(ctx);
    }

    /// The client of stream `ctx` gets a reset, and the stream ends.
    fn reset(&mut self, ctx: u32) {
        if let Some(tx) = self
            .host()
            .streams
            .get_mut(&ctx)
            .and_then(|s| s.reply.take())
        {
            let _ = tx.send(Response::Reset);
        }
        self.finish(ctx);
    }

    /// The end of a stream: `proxy_on_log`, `proxy_on_done`, `proxy_on_delete`, then the context is
    /// gone.
    fn finish(&mut self, ctx: u32) {
        if !self.host().streams.contains_key(&ctx) {
            return;
        }
        self.call::<i32, ()>(ctx, "proxy_on_log", ctx as i32);
        self.after();
        self.call::<i32, i32>(ctx, "proxy_on_done", ctx as i32);
        self.after();
        self.call::<i32, ()>(ctx, "proxy_on_delete", ctx as i32);
        self.after();
        self.host().streams.remove(&ctx);
    }

    fn on_http_done(&mut self, token: u32, result: Result<CalloutResponse, CalloutFailure>) {
        if self.host().http_calls.remove(&token).is_none() {
            return; // timed out already
        }
        let response = match result {
            Ok(r) => r,
            // Envoy's router answers a failed upstream connection or a reset before headers with a
            // local reply (503), which the callout receives as a normal response.
            Err(CalloutFailure::Connect(e)) => local_response(
                503,
                &format!("upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: {e}"),
            ),
            Err(CalloutFailure::Reset(_)) => local_response(
                503,
                "upstream connect error or disconnect/reset before headers. reset reason: connection termination",
            ),
        };
        self.deliver_http(token, response);
    }

    fn deliver_http(&mut self, token: u32, response: CalloutResponse) {
        if self.failed {
            return;
        }
        let n = response.0.len() as i32;
        let body_len = response.1.len() as i32;
        let root = self.host().root;
        self.host().call_response = Some(response);
        self.call::<(i32, i32, i32, i32, i32), ()>(
            root,
            "proxy_on_http_call_response",
            (root as i32, token as i32, n, body_len, 0),
        );
        self.host().call_response = None;
        self.after();
    }

    fn on_redis_done(&mut self, token: u32, status: u32, reply: Vec<u8>) {
        if self.failed || self.host().redis_calls.remove(&token).is_none() {
            return;
        }
        let root = self.host().root;
        let size = reply.len() as i32;
        self.host().redis_response = Some(reply);
        self.call::<(i32, i32, i32, i32), ()>(
            root,
            "proxy_on_redis_call_response",
            (root as i32, token as i32, status as i32, size),
        );
        self.host().redis_response = None;
        self.after();
    }
}

/// A response Envoy makes itself (a local reply): status, content-length, content-type, body.
pub fn local_response(status: u16, body: &str) -> CalloutResponse {
    (
        vec![
            (":status".to_string(), status.to_string()),
            ("content-length".to_string(), body.len().to_string()),
            ("content-type".to_string(), "text/plain".to_string()),
        ],
        body.as_bytes().to_vec(),
    )
}

fn fail_closed() -> Response {
    Response::Reply {
        status: 503,
        headers: Vec::new(),
        body: Vec::new(),
    }
}
