//! The host of one simulated worker: what Envoy does for the engine, modelled on Envoy. A callout
//! belongs to the worker's root context (as proxy-wasm-cpp-host's `http_call` does), so its answer
//! comes there even after the request whose callback sent it is done; calls, resumes, replies and
//! the tick asked for during a callback are collected for the simulation to carry out after it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;

use tollgate_core::backend::{BackendError, Outgoing};
use tollgate_core::engine::{ContextId, Engine, Host, LocalReply};
use tollgate_core::metrics::Recorder;
use tollgate_core::rule::RequestView;
use tollgate_core::shared::mem::MemStore;
use tollgate_core::shared::Store;

/// The bench's header key and its value.
pub const USER_HEADER: &str = "x-user-id";
pub const ROOT: u32 = 1;

/// One worker's host, between two callbacks.
pub struct SimHost {
    pub now_us: u64,
    pub store: Rc<MemStore>,
    /// The context whose callback is running (it carries the calls sent meanwhile).
    pub current: u32,
    pub next_token: u32,
    /// (token, carrier, body) sent during the callback.
    pub dispatched: Vec<(u32, u32, Vec<u8>)>,
    pub resumed: Vec<u32>,
    pub responded: Vec<(u32, u32)>,
    /// The tick period asked for during the callback, if any.
    pub tick: Option<u64>,
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

/// One worker: its engine and host, and the simulation's bookkeeping of its requests and calls.
pub struct Worker {
    pub engine: Engine,
    pub host: SimHost,
    pub rec: Rc<Recorder>,
    pub tick_ms: u64,
    pub tick_gen: u64,
    pub next_ctx: u32,
    /// Requests in the engine: ctx -> client.
    pub reqs: HashMap<u32, usize>,
    /// Calls out: token -> call index.
    pub calls: HashMap<u32, usize>,
}
