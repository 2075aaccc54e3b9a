//! One simulated worker: its engine on the engine tests' fake host
//! (`tollgate_core::engine::testkit`), which records the calls, resumes, replies and tick the
//! engine asks for during a callback for the simulation to carry out after it; and the bench's
//! request and response as the engine reads them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;

use tollgate_core::engine::testkit::FakeHost;
use tollgate_core::engine::Engine;
use tollgate_core::metrics::Recorder;
use tollgate_core::rule::RequestView;

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

/// One worker: its engine and host, and the simulation's bookkeeping of its requests and calls.
pub struct Worker {
    pub engine: Engine,
    pub host: FakeHost,
    pub rec: Rc<Recorder>,
    pub tick_ms: u64,
    pub tick_gen: u64,
    pub next_ctx: u32,
    /// Requests in the engine: ctx -> client.
    pub reqs: HashMap<u32, usize>,
    /// Calls out: token -> call index.
    pub calls: HashMap<u32, usize>,
}
