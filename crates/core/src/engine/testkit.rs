//! A [`Host`] without a proxy: the one fake host the engine's tests and the lease simulator
//! (tools/src/bin/lease-sim) share, so what the simulator measures runs on the host the tests check.
//!
//! Invariant: it keeps the real host's semantics wherever the engine can tell the difference, and
//! records everything else for the caller to look at or carry out:
//! - shared data is a [`MemStore`] (CAS, no empty values, a create that never overwrites), one per
//!   proxy: the hosts of a proxy's workers share it ([`FakeHost::sharing`]);
//! - `dispatch` hands out tokens 1, 2, 3, … and keeps each call out until the caller answers it
//!   (through [`Engine::call_response`](super::Engine::call_response), on whatever context it
//!   likes: the host answers on the root context, whichever callback sent the call);
//! - the clock reads what the caller set, and counts its reads; the tick fires only when the caller
//!   fires it, at the period the engine asked for last;
//! - a paused request's headers stay readable only if the caller kept them
//!   ([`FakeHost::request_headers`]), as the host keeps a paused request's; a shared queue exists
//!   only once the caller made it, and a message to any other is refused.
//!
//! Plain Rust, never in the filter: nothing here may panic either (the core's lints apply).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;

use super::{ContextId, Host, LocalReply};
use crate::backend::{BackendError, Outgoing};
use crate::shared::mem::MemStore;
use crate::shared::Store;

/// A call the engine sent and the caller has not answered yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The context whose callback sent it ([`FakeHost::current`] then).
    pub sent_during: u32,
    /// What it sends: the Webdis path, or the RESP command (read as text, bytes that are not
    /// UTF-8 replaced).
    pub body: String,
}

/// One worker's host, as the engine sees it through [`Host`].
#[derive(Default)]
pub struct FakeHost {
    /// The proxy's clock, in milliseconds since the Unix epoch.
    pub now: u64,
    /// How many times the engine read the clock.
    pub clock_reads: Cell<u64>,
    /// The proxy's shared data.
    pub store: Rc<MemStore>,
    /// The context whose callback runs, as the host numbers it (the caller sets it; only recorded
    /// in [`Call`]).
    pub current: u32,
    /// The last token handed out.
    pub next_token: u32,
    /// Calls out, by token, until the caller takes them off (answering them).
    pub out: BTreeMap<u32, Call>,
    /// Every call's body, in the order sent.
    pub sent: Vec<String>,
    /// Every dispatch fails as the host's does for an unknown cluster.
    pub fail_dispatch: bool,
    /// Requests resumed, in order.
    pub resumed: Vec<u32>,
    /// Requests answered here, in order.
    pub responded: Vec<(u32, LocalReply)>,
    /// Response headers added, per request, in order.
    pub added: Vec<(u32, Vec<(String, String)>)>,
    /// Each request's decision record, as Envoy keeps it (filter state `wasm.tollgate`): the
    /// latest one set for the request replaces any earlier.
    pub decisions: HashMap<u32, String>,
    /// The tick period the engine asked for last (0: none), and how many times it asked.
    pub tick: u64,
    pub tick_sets: usize,
    /// The workers' shared queues, by token.
    pub queues: HashMap<u32, VecDeque<Vec<u8>>>,
    /// Request headers the host keeps readable after `request_headers`, by context.
    pub request_headers: HashMap<u32, HashMap<String, Vec<u8>>>,
    /// Request headers the engine set, in order.
    pub set_headers: Vec<(u32, String, String)>,
}

impl FakeHost {
    /// A host whose clock reads `now`.
    pub fn at(now: u64) -> FakeHost {
        FakeHost {
            now,
            ..FakeHost::default()
        }
    }

    /// The host of another worker of the same proxy: its shared data is `store`.
    pub fn sharing(store: Rc<MemStore>) -> FakeHost {
        FakeHost {
            store,
            ..FakeHost::default()
        }
    }

    /// The tokens of the calls out, in the order sent.
    pub fn tokens(&self) -> Vec<u32> {
        self.out.keys().copied().collect()
    }

    /// The decision record of request `ctx`, if one was set.
    pub fn decision(&self, ctx: u32) -> Option<&str> {
        self.decisions.get(&ctx).map(String::as_str)
    }

    /// The status request `ctx` was answered with here, if it was.
    pub fn status_of(&self, ctx: u32) -> Option<u32> {
        self.responded
            .iter()
            .find(|(c, _)| *c == ctx)
            .map(|(_, r)| r.status)
    }
}

impl Host for FakeHost {
    fn now_ms(&self) -> u64 {
        self.clock_reads
            .set(self.clock_reads.get().saturating_add(1));
        self.now
    }
    fn store(&self) -> &dyn Store {
        &*self.store
    }
    fn dispatch(&mut self, _: &str, call: &Outgoing, _: u64) -> Result<u32, BackendError> {
        if self.fail_dispatch {
            return Err(BackendError::Dispatch("BadArgument".into()));
        }
        self.next_token = self.next_token.wrapping_add(1).max(1);
        let body = String::from_utf8_lossy(call.payload()).into_owned();
        let sent_during = self.current;
        self.out.insert(
            self.next_token,
            Call {
                sent_during,
                body: body.clone(),
            },
        );
        self.sent.push(body);
        Ok(self.next_token)
    }
    fn resume(&mut self, ctx: ContextId) {
        self.resumed.push(ctx.get());
    }
    fn respond(&mut self, ctx: ContextId, reply: &LocalReply) {
        self.responded.push((ctx.get(), reply.clone()));
    }
    fn record_decision(&mut self, ctx: ContextId, record: &str) {
        self.decisions.insert(ctx.get(), record.to_string());
    }
    fn add_response_headers(&mut self, ctx: ContextId, headers: &[(&str, &str)]) {
        let owned = headers.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        self.added.push((ctx.get(), owned.collect()));
    }
    fn set_tick(&mut self, period_ms: u64) {
        self.tick = period_ms;
        self.tick_sets = self.tick_sets.saturating_add(1);
    }
    fn request_header(&mut self, ctx: ContextId, name: &str) -> Option<Vec<u8>> {
        self.request_headers.get(&ctx.get())?.get(name).cloned()
    }
    fn set_request_header(&mut self, ctx: ContextId, name: &str, value: &str) {
        self.set_headers
            .push((ctx.get(), name.to_string(), value.to_string()));
        if let Some(headers) = self.request_headers.get_mut(&ctx.get()) {
            headers.insert(name.to_string(), value.as_bytes().to_vec());
        }
    }
    fn enqueue(&mut self, queue: u32, message: &[u8]) -> bool {
        match self.queues.get_mut(&queue) {
            Some(q) => {
                q.push_back(message.to_vec());
                true
            }
            None => false,
        }
    }
    fn dequeue(&mut self, queue: u32) -> Option<Vec<u8>> {
        self.queues.get_mut(&queue)?.pop_front()
    }
}
