//! proxy-wasm glue: the root context (configure, lease calls, tick) and one HTTP context per
//! request, driving the `decision` state machine with host calls from `host`.
//!
//! Invariant: a request paused in `on_http_request_headers` is always resumed or answered. Exact
//! checks call the backend from the request's own context; every callout ends (answer, error,
//! reset or timeout) in `decision::on_reply`. Lease checks wait in their worker's queue; the
//! worker's root context makes one lease call per key (per proxy, through the shared flight
//! claim) and settles waiters as tokens, denials or failures arrive; a waiter that outlives
//! twice the backend timeout gets the failure mode. A waiter whose client went away is dropped
//! from the queue and never touched again.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

use crate::backend::{webdis, BackendError, HttpRequest, ScriptReply};
use crate::config::Config;
use crate::decision::{self, LeaseFlight, LeaseResult, Next, Pending, Plugin, Step, Verdict};
use crate::host::{self, HostMetrics, HostRequest, HostStore};
use crate::metrics::Counter;

/// Envoy's log level for wasm (Info if it cannot tell).
fn host_log_level() -> LogLevel {
    hostcalls::get_log_level().unwrap_or(LogLevel::Info)
}

fn to_filter(level: LogLevel) -> log::LevelFilter {
    match level {
        LogLevel::Trace => log::LevelFilter::Trace,
        LogLevel::Debug => log::LevelFilter::Debug,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Error | LogLevel::Critical => log::LevelFilter::Error,
    }
}

/// How often the root context looks at its waiters while there are any.
const TICK: Duration = Duration::from_millis(1);

pub fn start() {
    // No host calls are allowed while the module initializes: start at Trace and narrow to
    // Envoy's wasm log level at configure time, so debug lines are not even formatted unless
    // someone asked for them.
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> {
        Box::new(Root {
            plugin: None,
            worker: Rc::new(RefCell::new(Worker::new(id))),
        })
    });
}

/// One request's shared state (the HTTP context and its worker's lease queue both reach it).
#[derive(Default)]
struct ReqState {
    pending: Option<Pending>,
    response_headers: Vec<(String, String)>,
}

/// A lease check waiting for tokens.
struct Waiter {
    ctx: u32,
    state: Rc<RefCell<ReqState>>,
    idx: usize,
    rule: usize,
    key: String,
    cost: u64,
    since_ms: u64,
}

/// Per-worker state, shared by the root context and the worker's HTTP contexts.
struct Worker {
    root_id: u32,
    waiters: Vec<Waiter>,
    /// This worker's lease calls out: token -> (flight, sent at µs).
    flights: HashMap<u32, (LeaseFlight, u64)>,
    /// Admitted requests held for a reservation: (context, due at ms).
    held: Vec<(u32, u64)>,
    ticking: bool,
}

impl Worker {
    fn new(root_id: u32) -> Self {
        Worker {
            root_id,
            waiters: Vec::new(),
            flights: HashMap::new(),
            held: Vec::new(),
            ticking: false,
        }
    }

    /// Holds request `ctx` until `due_ms` (the root context's tick resumes it).
    fn hold(&mut self, ctx: u32, due_ms: u64) {
        self.held.push((ctx, due_ms));
        if !self.ticking && hostcalls::set_tick_period(TICK).is_ok() {
            self.ticking = true;
        }
    }
}

/// Feeds one call's result to the proxy's circuit breaker, and logs what `record_backend` says
/// deserves a line: backend trouble is one line per change of state, not one per request.
fn note(plugin: &Plugin, result: Result<(), &BackendError>) {
    let now_ms = host::now_us() / 1000;
    if let Some((level, line)) = decision::record_backend(plugin, &HostStore, result, now_ms) {
        log::log!(level, "{line}");
    }
}

/// Sends one script call and counts it (or the failure to send it).
fn dispatch(plugin: &Plugin, rule: usize, req: &HttpRequest) -> Result<u32, BackendError> {
    let backend = &plugin.config.backend;
    let sent = host::dispatch(&backend.cluster, req, backend.timeout_ms);
    match &sent {
        Ok(_) => plugin.metrics.count(rule, Counter::BackendCalls, 1),
        Err(e) => {
            plugin.metrics.count(rule, Counter::BackendErrors, 1);
            note(plugin, Err(e));
        }
    }
    sent
}

/// Reads and decodes the answer being delivered, and records its latency and outcome. A
/// NOSCRIPT that will be answered by sending EVAL is not counted as an error.
fn receive(
    plugin: &Plugin,
    rule: usize,
    sent_us: u64,
    num_headers: usize,
    body_size: usize,
    will_resend: bool,
) -> Result<ScriptReply, BackendError> {
    let (status, body) = host::call_response(num_headers, body_size);
    let reply = webdis::decode_reply(status, &body);
    let ms = host::now_us().saturating_sub(sent_us) / 1000;
    plugin.metrics.latency(rule, ms);
    match &reply {
        Err(BackendError::NoScript) if will_resend => {}
        Err(e) => {
            plugin.metrics.count(rule, Counter::BackendErrors, 1);
            note(plugin, Err(e));
        }
        Ok(_) => note(plugin, Ok(())),
    }
    reply
}

struct Root {
    plugin: Option<Rc<Plugin>>,
    worker: Rc<RefCell<Worker>>,
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _: usize,
    ) {
        let Some(plugin) = self.plugin.clone() else {
            return;
        };
        let Some((mut flight, sent_us)) = self.worker.borrow_mut().flights.remove(&token) else {
            return;
        };
        let reply = receive(
            &plugin,
            flight.rule,
            sent_us,
            num_headers,
            body_size,
            !flight.eval_sent,
        );
        let now = host::now_us();
        match decision::lease_reply(&plugin, &HostStore, &mut flight, reply, now / 1000) {
            LeaseResult::Resend(req) => {
                if let Err(e) = self.send_flight(&plugin, flight.clone(), &req, now) {
                    self.fail_waiters(&plugin, &flight.call.key, &e, now);
                }
            }
            LeaseResult::Recorded => {}
            LeaseResult::Failed(e) => self.fail_waiters(&plugin, &flight.call.key, &e, now),
        }
        self.serve(&plugin, now);
    }
}

impl Root {
    /// Sends a lease call; its answer comes back to this root context.
    fn send_flight(
        &mut self,
        plugin: &Plugin,
        flight: LeaseFlight,
        req: &HttpRequest,
        now_us: u64,
    ) -> Result<(), BackendError> {
        let token = dispatch(plugin, flight.rule, req)?;
        self.worker
            .borrow_mut()
            .flights
            .insert(token, (flight, now_us));
        Ok(())
    }

    /// Settles the waiters that the pool or the deny cache can answer, gives the failure mode to
    /// those that waited too long, and starts lease calls for keys still waiting.
    fn serve(&mut self, plugin: &Plugin, now_us: u64) {
        let now_ms = now_us / 1000;
        let patience = plugin.config.backend.timeout_ms.saturating_mul(2);
        let waiters = std::mem::take(&mut self.worker.borrow_mut().waiters);
        let mut still = Vec::new();
        for w in waiters {
            let next = {
                let mut st = w.state.borrow_mut();
                match st.pending.as_mut() {
                    None => Some(Next::Wait), // already finished: drop it
                    Some(p) => match decision::serve_waiter(plugin, &HostStore, p, w.idx, now_ms) {
                        Some(n) => Some(n),
                        None if now_ms.saturating_sub(w.since_ms) > patience => {
                            Some(decision::on_reply(
                                plugin,
                                &HostStore,
                                p,
                                w.idx,
                                Err(BackendError::Reset),
                                now_us,
                            ))
                        }
                        None => None,
                    },
                }
            };
            match next {
                None => still.push(w),
                Some(Next::Done(v)) => self.finish(w.ctx, &w.state, v),
                Some(_) => {}
            }
        }
        // Lease calls: one per key still waiting, unless one is out already (here or on another
        // worker of this proxy).
        let mut need: Vec<(usize, String, u64, u64)> = Vec::new();
        for w in &still {
            match need.iter_mut().find(|(_, k, _, _)| *k == w.key) {
                Some(entry) => entry.3 = entry.3.saturating_add(w.cost),
                None => need.push((w.rule, w.key.clone(), w.cost, w.cost)),
            }
        }
        let mut failed = Vec::new();
        for (rule, key, first, total) in need {
            let out = self
                .worker
                .borrow()
                .flights
                .values()
                .any(|(f, _)| f.call.key == key);
            if out {
                continue;
            }
            let (flight, req) = match decision::lease_flight(
                plugin, &HostStore, rule, &key, first, total, now_ms,
            ) {
                Ok(Some(f)) => f,
                Ok(None) => continue,
                Err(e) => {
                    failed.push((key, e));
                    continue;
                }
            };
            let mut copy = flight.clone();
            if let Err(e) = self.send_flight(plugin, flight, &req, now_us) {
                let _ =
                    decision::lease_reply(plugin, &HostStore, &mut copy, Err(e.clone()), now_ms);
                failed.push((key, e));
            }
        }
        self.requeue(still);
        for (key, e) in failed {
            self.fail_waiters(plugin, &key, &e, now_us);
        }
        self.set_ticking();
    }

    /// Puts `still` back in the queue, ahead of anything queued meanwhile.
    fn requeue(&self, mut still: Vec<Waiter>) {
        let mut worker = self.worker.borrow_mut();
        still.append(&mut worker.waiters);
        worker.waiters = still;
    }

    /// Gives every waiter on `key` the failure mode for `err`.
    fn fail_waiters(&mut self, plugin: &Plugin, key: &str, err: &BackendError, now_us: u64) {
        let waiters = std::mem::take(&mut self.worker.borrow_mut().waiters);
        let mut still = Vec::new();
        for w in waiters {
            if w.key != key {
                still.push(w);
                continue;
            }
            let next = w.state.borrow_mut().pending.as_mut().map(|p| {
                decision::on_reply(plugin, &HostStore, p, w.idx, Err(err.clone()), now_us)
            });
            if let Some(Next::Done(v)) = next {
                self.finish(w.ctx, &w.state, v);
            }
        }
        self.requeue(still);
    }

    /// Applies a waiter's verdict in its own context, then returns to the root context.
    fn finish(&self, ctx: u32, state: &Rc<RefCell<ReqState>>, verdict: Verdict) {
        if hostcalls::set_effective_context(ctx).is_err() {
            return;
        }
        match apply(state, verdict) {
            Applied::Go => host::resume_request(),
            Applied::Hold(due) => self.worker.borrow_mut().hold(ctx, due),
            Applied::Answered => {}
        }
        let root = self.worker.borrow().root_id;
        let _ = hostcalls::set_effective_context(root);
    }

    /// Resumes the held requests that are due.
    fn release(&self, now_ms: u64) {
        let due: Vec<u32> = {
            let mut worker = self.worker.borrow_mut();
            let (due, later): (Vec<_>, Vec<_>) =
                worker.held.iter().partition(|(_, at)| *at <= now_ms);
            worker.held = later;
            due.into_iter().map(|(ctx, _)| ctx).collect()
        };
        if due.is_empty() {
            return;
        }
        for ctx in due {
            if hostcalls::set_effective_context(ctx).is_ok() {
                host::resume_request();
            }
        }
        let root = self.worker.borrow().root_id;
        let _ = hostcalls::set_effective_context(root);
    }

    /// Ticks while there are waiters or flights, and not otherwise (no idle cost).
    fn set_ticking(&self) {
        let mut worker = self.worker.borrow_mut();
        let busy =
            !worker.waiters.is_empty() || !worker.flights.is_empty() || !worker.held.is_empty();
        if busy != worker.ticking {
            let period = if busy { TICK } else { Duration::ZERO };
            if hostcalls::set_tick_period(period).is_ok() {
                worker.ticking = busy;
            }
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        log::set_max_level(to_filter(host_log_level()));
        match Config::try_from(host::plugin_configuration().as_slice()) {
            Ok(config) => {
                log::info!("tollgate: configured: {}", config.summary());
                let metrics = HostMetrics::define(&config);
                self.plugin = Some(Rc::new(Plugin::with_metrics(config, Box::new(metrics))));
                true
            }
            Err(e) => {
                log::error!("tollgate: bad configuration: {e}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let Some(plugin) = self.plugin.clone() else {
            return;
        };
        let now = host::now_us();
        self.release(now / 1000);
        self.serve(&plugin, now);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            id: context_id,
            plugin: self.plugin.clone(),
            worker: self.worker.clone(),
            state: Rc::new(RefCell::new(ReqState::default())),
            calls: Vec::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// What became of a request after its verdict.
enum Applied {
    /// Let it go on now.
    Go,
    /// Admitted on a reservation: hold it until this time (ms).
    Hold(u64),
    /// Answered here.
    Answered,
}

/// Applies a verdict to the current context: keeps headers for the response, or answers now.
fn apply(state: &Rc<RefCell<ReqState>>, verdict: Verdict) -> Applied {
    log::debug!("tollgate: {}", describe(&verdict));
    let mut st = state.borrow_mut();
    st.pending = None;
    match verdict {
        Verdict::Allow { headers, delay_ms } => {
            st.response_headers = headers;
            if delay_ms > 0 {
                Applied::Hold((host::now_us() / 1000).saturating_add(delay_ms))
            } else {
                Applied::Go
            }
        }
        Verdict::Respond {
            status,
            headers,
            body,
        } => {
            drop(st);
            host::send_response(status, &headers, &body);
            Applied::Answered
        }
    }
}

struct Request {
    id: u32,
    /// None only if configure never succeeded (Envoy then refuses the filter anyway).
    plugin: Option<Rc<Plugin>>,
    worker: Rc<RefCell<Worker>>,
    state: Rc<RefCell<ReqState>>,
    /// Outstanding exact-mode callouts.
    calls: Vec<Call>,
}

/// An exact-mode callout of one request.
struct Call {
    token: u32,
    /// The check's index in the pending request, and its rule.
    idx: usize,
    rule: usize,
    sent_us: u64,
    eval_sent: bool,
}

impl Request {
    /// Sends `req` for check `idx`; a dispatch failure is fed back as that check's answer.
    /// Returns the verdict if that completed the request.
    fn send(&mut self, plugin: &Plugin, idx: usize, req: HttpRequest) -> Option<Verdict> {
        let (rule, eval_sent) = self
            .state
            .borrow()
            .pending
            .as_ref()
            .and_then(|p| p.checks.get(idx))
            .map_or((0, false), |c| (c.rule, c.eval_sent));
        let err = match dispatch(plugin, rule, &req) {
            Ok(token) => {
                self.calls.push(Call {
                    token,
                    idx,
                    rule,
                    sent_us: host::now_us(),
                    eval_sent,
                });
                return None;
            }
            Err(e) => e,
        };
        match self.answer(plugin, idx, Err(err)) {
            Next::Wait | Next::Resend(_) => None,
            Next::Done(v) => Some(v),
        }
    }

    fn answer(
        &mut self,
        plugin: &Plugin,
        idx: usize,
        reply: Result<ScriptReply, BackendError>,
    ) -> Next {
        match self.state.borrow_mut().pending.as_mut() {
            Some(p) => decision::on_reply(plugin, &HostStore, p, idx, reply, host::now_us()),
            None => Next::Wait,
        }
    }

    /// Queues this request's waiting lease checks on the worker, and makes sure it ticks.
    fn wait_for_leases(&self, pending: &Pending, now_ms: u64) {
        let waits = pending.waiting_leases();
        if waits.is_empty() {
            return;
        }
        let mut worker = self.worker.borrow_mut();
        for idx in waits {
            if let Some(c) = pending.checks.get(idx) {
                worker.waiters.push(Waiter {
                    ctx: self.id,
                    state: self.state.clone(),
                    idx,
                    rule: c.rule,
                    key: c.call.key.clone(),
                    cost: c.call.cost,
                    since_ms: now_ms,
                });
            }
        }
        if !worker.ticking && hostcalls::set_tick_period(TICK).is_ok() {
            worker.ticking = true;
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        // The client may have gone while waiting: never touch this context again.
        if let Ok(mut st) = self.state.try_borrow_mut() {
            st.pending = None;
        }
        if let Ok(mut worker) = self.worker.try_borrow_mut() {
            worker.waiters.retain(|w| w.ctx != self.id);
            worker.held.retain(|(ctx, _)| *ctx != self.id);
        }
    }
}

impl Context for Request {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _: usize,
    ) {
        let Some(plugin) = self.plugin.clone() else {
            return;
        };
        let Some(pos) = self.calls.iter().position(|c| c.token == token) else {
            return;
        };
        let call = self.calls.swap_remove(pos);
        let reply = receive(
            &plugin,
            call.rule,
            call.sent_us,
            num_headers,
            body_size,
            !call.eval_sent,
        );
        let verdict = match self.answer(&plugin, call.idx, reply) {
            Next::Wait => None,
            Next::Done(v) => Some(v),
            Next::Resend(req) => self.send(&plugin, call.idx, req),
        };
        if let Some(v) = verdict {
            match apply(&self.state, v) {
                Applied::Go => host::resume_request(),
                Applied::Hold(due) => self.worker.borrow_mut().hold(self.id, due),
                Applied::Answered => {}
            }
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        let now = host::now_us();
        let verdict = match decision::start(&plugin, &HostStore, &HostRequest, now) {
            Step::Done(v) => Some(v),
            Step::Call(pending, calls) => {
                self.wait_for_leases(&pending, now / 1000);
                self.state.borrow_mut().pending = Some(pending);
                calls
                    .into_iter()
                    .find_map(|(idx, req)| self.send(&plugin, idx, req))
            }
        };
        match verdict.map(|v| apply(&self.state, v)) {
            Some(Applied::Go) => Action::Continue,
            Some(Applied::Hold(due)) => {
                self.worker.borrow_mut().hold(self.id, due);
                Action::Pause
            }
            None | Some(Applied::Answered) => Action::Pause,
        }
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        let headers = std::mem::take(&mut self.state.borrow_mut().response_headers);
        if !headers.is_empty() {
            host::add_response_headers(&headers);
        }
        Action::Continue
    }
}

/// A verdict for a debug log line: status and rate-limit headers (rule names and numbers only,
/// never request values).
fn describe(v: &Verdict) -> String {
    let (what, headers) = match v {
        Verdict::Allow { headers, delay_ms } => (format!("allow after {delay_ms} ms"), headers),
        Verdict::Respond {
            status, headers, ..
        } => (format!("answer {status}"), headers),
    };
    let hs: Vec<String> = headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{what} [{}]", hs.join("; "))
}
