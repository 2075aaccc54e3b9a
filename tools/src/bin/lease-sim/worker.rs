//! One simulated worker: its engine on the engine tests' fake host
//! (`tollgate_core::engine::testkit`), which records the calls, resumes, replies and tick the
//! engine asks for during a callback; the configuration it runs (the bench's backend around each
//! simulator's rules); the callbacks both simulators run on it, and [`Asked`], what a callback
//! asked of the host, drained for the simulation to carry out after it (when, and what it records,
//! is each simulation's own); and the bench's request and response as the engine reads them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;

use tollgate_core::backend::{Answer, Payload};
use tollgate_core::bucket;
use tollgate_core::config::Config;
use tollgate_core::engine::testkit::{self, FakeHost};
use tollgate_core::engine::{Action, Engine, Plugin};
use tollgate_core::metrics::Recorder;
use tollgate_core::rule::RequestView;
use tollgate_core::shared::mem::MemStore;

use crate::webdis;

/// The bench's header key and its value.
pub const USER_HEADER: &str = "x-user-id";
/// The worker's root context: a tick and every call's answer run on it.
pub const ROOT: u32 = 1;

/// The bench's request: `GET /api/bench` from one user.
pub struct Req;

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

/// A fleet request: `GET <path>` from one user (the fleet's rules match the path and key on the
/// user header).
pub struct KeyedReq<'a> {
    pub path: &'a str,
    pub user: &'a str,
}

impl RequestView for KeyedReq<'_> {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let value: &[u8] = match name {
            ":path" => self.path.as_bytes(),
            ":method" => b"GET",
            USER_HEADER => self.user.as_bytes(),
            _ => return None,
        };
        Some(Cow::Borrowed(value))
    }
    fn client_ip(&self) -> Option<Vec<u8>> {
        Some(b"127.0.0.1".to_vec())
    }
}

/// A response with no headers (the bench's direct response, as the engine reads it).
pub struct NoHeaders;

impl RequestView for NoHeaders {
    fn header(&self, _: &str) -> Option<Cow<'_, [u8]>> {
        None
    }
    fn client_ip(&self) -> Option<Vec<u8>> {
        None
    }
}

/// The configuration every simulated worker runs: the bench's backend (Webdis, failing closed,
/// IETF headers, keys under `sim`) around `rules`, a JSON array of rules (what each simulator
/// limits is its own).
pub fn config(rules: serde_json::Value) -> Config {
    let json = serde_json::json!({
        "backend": { "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 100 },
        "key_prefix": "sim",
        "failure_mode": "closed",
        "response_headers": "ietf",
        "rules": rules,
    });
    Config::try_from(json.to_string().as_bytes()).unwrap()
}

/// One worker: its engine and host, and the simulation's bookkeeping of its requests and calls.
pub struct Worker {
    pub engine: Engine,
    pub host: FakeHost,
    pub rec: Rc<Recorder>,
    pub tick_ms: u64,
    pub tick_gen: u64,
    pub next_ctx: u32,
    /// Requests in the engine: ctx -> the simulation's index for it (a client, or a request).
    pub reqs: HashMap<u32, usize>,
    /// Calls out: token -> the simulation's index for it.
    pub calls: HashMap<u32, usize>,
}

/// What the engine asked of the host during one callback, taken from the host.
pub struct Asked {
    /// Calls dispatched, by token: what each sends and the context whose callback sent it.
    pub calls: Vec<(u32, testkit::Call)>,
    /// Requests resumed: their contexts.
    pub resumed: Vec<u32>,
    /// Requests answered locally: their contexts and the status.
    pub responded: Vec<(u32, u32)>,
    /// A tick to schedule: its period (ms) and generation (a tick of an older one is stale).
    pub tick: Option<(u64, u64)>,
}

impl Worker {
    /// A worker of the proxy whose shared data is `store`: a fresh engine on `config`, its
    /// metrics recorded, its host's current context the root.
    pub fn new(config: Config, store: Rc<MemStore>) -> Worker {
        let rec = Rc::new(Recorder::default());
        let plugin = Plugin::with_metrics(config, Box::new(rec.clone()));
        Worker {
            engine: Engine::new(plugin),
            host: FakeHost {
                current: ROOT,
                ..FakeHost::sharing(store)
            },
            rec,
            tick_ms: 0,
            tick_gen: 0,
            next_ctx: ROOT + 1,
            reqs: HashMap::new(),
            calls: HashMap::new(),
        }
    }

    /// A request arrives at `now_ms` on a fresh context, kept under `index` until it completes:
    /// its context and whether the engine let it go on at once.
    pub fn request(&mut self, now_ms: u64, index: usize, req: &dyn RequestView) -> (u32, Action) {
        let ctx = self.next_ctx;
        self.next_ctx += 1;
        self.reqs.insert(ctx, index);
        self.host.now = now_ms;
        self.host.current = ctx;
        let action = self.engine.request_headers(&mut self.host, ctx.into(), req);
        (ctx, action)
    }

    /// The request on `ctx` completes with `status` (its response headers first when 200): the
    /// index it was kept under, or `None` if it was done already.
    pub fn complete(&mut self, now_ms: u64, ctx: u32, status: u32) -> Option<usize> {
        let index = self.reqs.remove(&ctx)?;
        self.host.now = now_ms;
        self.host.current = ctx;
        if status == 200 {
            self.engine
                .response_headers(&mut self.host, ctx.into(), &NoHeaders);
        }
        self.engine.done(&mut self.host, ctx.into());
        Some(index)
    }

    /// The bucket's replies to the call `token` (one per key, in order) arrive, as Webdis answers
    /// a call of that `form`, on the root context whichever callback sent the call (as
    /// proxy-wasm-cpp-host's `http_call` does).
    pub fn answer(
        &mut self,
        now_ms: u64,
        token: u32,
        form: webdis::Form,
        replies: &[bucket::Reply],
    ) {
        self.host.now = now_ms;
        self.host.current = ROOT;
        let answer = Answer::Http {
            status: 200,
            body: Payload::Read(webdis::reply_body(form, replies).into_bytes()),
        };
        self.engine.call_response(&mut self.host, token, &answer);
    }

    /// The period (ms) of the tick of generation `gen`, while it is still the one asked for.
    pub fn ticking(&self, gen: u64) -> Option<u64> {
        (gen == self.tick_gen && self.tick_ms > 0).then_some(self.tick_ms)
    }

    /// The root's tick at `now_ms`, if `gen` is still the one asked for; whether it ran.
    pub fn tick(&mut self, now_ms: u64, gen: u64) -> bool {
        if self.ticking(gen).is_none() {
            return false;
        }
        self.host.now = now_ms;
        self.host.current = ROOT;
        self.engine.tick(&mut self.host);
        true
    }

    /// Takes what the engine asked of the host during the callback that just ran. What the host
    /// logged for the engine's tests (sent paths, headers added, decision records) is dropped; a
    /// tick period asked for becomes the worker's, in a new generation.
    pub fn drain(&mut self) -> Asked {
        let host = &mut self.host;
        let calls = std::mem::take(&mut host.out).into_iter().collect();
        host.sent.clear();
        host.added.clear();
        host.decisions.clear();
        let resumed = std::mem::take(&mut host.resumed);
        let responded = std::mem::take(&mut host.responded)
            .into_iter()
            .map(|(ctx, reply)| (ctx, reply.status))
            .collect();
        let tick = (host.tick_sets > 0).then_some(host.tick);
        host.tick_sets = 0;
        let tick = tick.and_then(|period| {
            self.tick_ms = period;
            self.tick_gen += 1;
            (period > 0).then_some((period, self.tick_gen))
        });
        Asked {
            calls,
            resumed,
            responded,
            tick,
        }
    }
}
