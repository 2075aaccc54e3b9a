//! What the engine needs from the proxy: the [`Host`] trait the filter implements over the ABI
//! (and the tests and the lease simulator over fakes with the host's semantics).
//!
//! Invariant: the engine reaches the proxy only through this trait; every call it makes while
//! handling any event belongs to the root context, which the call's answer comes back on.

use super::ids::ContextId;
use super::verdict::LocalReply;
use crate::backend::{BackendError, Outgoing};
use crate::shared::Store;

/// What the engine needs from the proxy. Context ids are Envoy's; a call made while handling any
/// event belongs to the root context, which its answer comes back on (proxy-wasm-cpp-host's
/// `http_call`, Higress' Redis calls).
pub trait Host {
    /// Milliseconds since the Unix epoch by the proxy's clock.
    fn now_ms(&self) -> u64;
    fn store(&self) -> &dyn Store;
    /// Sends a backend call to `cluster` the way its kind says (an HTTP callout, or a command on
    /// the Redis client); its answer comes back as
    /// [`Engine::call_response`](super::Engine::call_response) with this token. A host that
    /// cannot send this kind of call answers `BackendError::Dispatch`.
    fn dispatch(
        &mut self,
        cluster: &str,
        call: &Outgoing,
        timeout_ms: u64,
    ) -> Result<u32, BackendError>;
    /// Lets paused request `ctx` go on.
    fn resume(&mut self, ctx: ContextId);
    /// Answers request `ctx` here.
    fn respond(&mut self, ctx: ContextId, reply: &LocalReply);
    /// A header of paused request `ctx` (every line, joined with `,`), read after its
    /// `request_headers` callback.
    fn request_header(&mut self, ctx: ContextId, name: &str) -> Option<Vec<u8>>;
    /// Keeps `record`, the decision record of request `ctx` ([`decision`](super::decision)),
    /// where the proxy's access log can print it: Envoy keeps it as the request's filter state
    /// `wasm.tollgate` (a later record of the same request replaces it). Called once per request
    /// a rule checked, when its verdict is applied, if the configuration's `record_decisions`
    /// says so.
    fn record_decision(&mut self, ctx: ContextId, record: &str);
    /// Adds headers to the response of `ctx` (called while its response headers are processed).
    fn add_response_headers(&mut self, ctx: ContextId, headers: &[(&str, &str)]);
    /// Sets request header `name` of `ctx` to `value`, replacing every line of it (called inside
    /// its `request_headers`, before it goes upstream). Without an override a host has no request
    /// headers to change (the lease simulator), so nothing happens.
    fn set_request_header(&mut self, ctx: ContextId, name: &str, value: &str) {
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
