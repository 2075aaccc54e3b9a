//! The engine's `Host` and the shared-data `Store`, carried out over the ABI for the callback that
//! is running; and the few reads the callbacks need (configuration, a response body chunk, a
//! callout's answer).
//!
//! Invariant: only calls through `tollgate_abi` happen here, each status handled: a failed call is
//! a logged warning, an absent value or a `BackendError`, never a panic. What an answer or an
//! address means is decided by the core (`backend::Answer`, `property`), not here.

use tollgate_abi::{self as abi, BufferType, MapType, StreamType};
use tollgate_core::backend::{Answer, BackendError, Outgoing};
use tollgate_core::engine::{decision, ContextId, Host, LocalReply};
use tollgate_core::property;
use tollgate_core::shared::{Store, StoreError};

use crate::redis;

/// Proxy-wide shared data (one store per VM id, shared by the proxy's workers).
pub struct HostStore;

impl Store for HostStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        abi::shared_data(key).map_err(|s| StoreError::Host(format!("{s}")))
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        abi::set_shared_data(key, value, cas).map_err(|s| match s {
            abi::Status::CasMismatch => StoreError::CasMismatch,
            other => StoreError::Host(format!("{other}")),
        })
    }
}

/// Registers this worker's shared queue, under a name of its own. None if the host has no shared
/// queues (the engine then shares calls within a worker only).
pub fn register_queue(ns: &str) -> Option<u32> {
    let name = tollgate_core::shared::lead::queue_name(&HostStore, ns).ok()?;
    abi::register_queue(&name).ok()
}

/// The plugin configuration bytes.
pub fn plugin_configuration() -> Vec<u8> {
    abi::buffer(BufferType::PluginConfiguration, 0, usize::MAX).unwrap_or_default()
}

/// `len` bytes from `start` of the response body chunk being delivered (the part the engine looks
/// at, see `Look`); None if the host could not give them.
pub fn response_body(start: usize, len: usize) -> Option<Vec<u8>> {
    if len == 0 {
        return Some(Vec::new());
    }
    abi::buffer(BufferType::HttpResponseBody, start, len).ok()
}

/// The HTTP callout answer being delivered (`proxy_on_http_call_response`).
pub fn http_answer(headers: usize, body_size: usize) -> Answer {
    Answer::http(
        headers,
        || abi::header(MapType::HttpCallResponseHeaders, ":status").ok(),
        body_size,
        |n| abi::buffer(BufferType::HttpCallResponseBody, 0, n).ok(),
    )
}

/// An Envoy attribute by its path segments: Some(bytes) when the host has it (Some(empty) for an
/// empty value), None when it has not or cannot serialise it.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    property::with_path(path, |p| abi::property(p).ok())
}

/// The engine's view of the proxy while one callback of context `current` runs.
pub struct WasmHost {
    current: u32,
    /// The context the host's calls act for: `set_effective_context` is called only when it
    /// changes (resuming a batch of requests switches once per request, not twice), and Envoy
    /// resets it when the callback returns.
    effective: std::cell::Cell<u32>,
    /// The clock, read once per callback.
    now_ms: std::cell::Cell<Option<u64>>,
}

impl WasmHost {
    pub fn new(current: u32) -> WasmHost {
        WasmHost {
            current,
            effective: std::cell::Cell::new(current),
            now_ms: std::cell::Cell::new(None),
        }
    }

    /// A host for root context `root` while a callback of context `running` (another root) runs:
    /// the host's calls switch to `root` first.
    pub fn for_root_from(root: u32, running: u32) -> WasmHost {
        WasmHost {
            effective: std::cell::Cell::new(running),
            ..WasmHost::new(root)
        }
    }

    /// Makes `ctx` the context the host's calls act for (BadArgument: it is gone).
    fn act_for(&self, ctx: u32) -> Result<(), abi::Status> {
        if self.effective.get() == ctx {
            return Ok(());
        }
        abi::set_effective_context(ctx)?;
        self.effective.set(ctx);
        Ok(())
    }

    /// Runs `f` with `ctx` as the host's effective context (it stays so until another context
    /// is needed: calls sent by this callback switch back to its own first).
    fn in_context(
        &self,
        ctx: u32,
        f: impl FnOnce() -> Result<(), abi::Status>,
    ) -> Result<(), abi::Status> {
        self.act_for(ctx)?;
        f()
    }
}

impl Host for WasmHost {
    fn now_ms(&self) -> u64 {
        if let Some(now) = self.now_ms.get() {
            return now;
        }
        let now = abi::now_ns().map_or(0, |ns| ns / 1_000_000);
        self.now_ms.set(Some(now));
        now
    }

    fn store(&self) -> &dyn Store {
        &HostStore
    }

    fn dispatch(
        &mut self,
        cluster: &str,
        call: &Outgoing,
        timeout_ms: u64,
    ) -> Result<u32, BackendError> {
        // The call is carried by (and answered through) the context whose callback this is.
        self.act_for(self.current)
            .map_err(|s| BackendError::Dispatch(format!("set_effective_context answered {s}")))?;
        match call {
            Outgoing::Http(req) => {
                let headers = tollgate_core::pairs::encode(&req.headers);
                abi::http_call(cluster, &headers, &req.body, timeout_ms).map_err(|s| {
                    BackendError::Dispatch(format!("{s} (is cluster \"{cluster}\" defined?)"))
                })
            }
            // The Redis client's op timeout was set when it was configured.
            Outgoing::Resp(command) => redis::call(cluster, command),
        }
    }

    fn resume(&mut self, ctx: ContextId) {
        let ctx = ctx.get();
        if let Err(s) = self.in_context(ctx, || abi::continue_stream(StreamType::HttpRequest)) {
            log::warn!("tollgate: resuming request {ctx} failed ({s})");
        }
    }

    fn respond(&mut self, ctx: ContextId, reply: &LocalReply) {
        let ctx = ctx.get();
        let headers = tollgate_core::pairs::encode(&reply.headers);
        let details = reply.details.as_bytes();
        let sent = self.in_context(ctx, || {
            let body = reply.body.as_bytes();
            abi::send_local_response(reply.status, details, body, &headers, reply.grpc_status)
        });
        if let Err(s) = sent {
            log::warn!("tollgate: local reply to request {ctx} failed ({s})");
        }
    }

    fn record_decision(&mut self, ctx: ContextId, record: &str) {
        let ctx = ctx.get();
        let set = self.in_context(ctx, || {
            abi::set_property(decision::PROPERTY, record.as_bytes())
        });
        if let Err(s) = set {
            // Per request: not worth a warning each time (the access log shows "-" instead).
            log::debug!("tollgate: recording the decision of request {ctx} failed ({s})");
        }
    }

    fn add_response_headers(&mut self, ctx: ContextId, headers: &[(&str, &str)]) {
        let ctx = ctx.get();
        for (k, v) in headers {
            let added =
                self.in_context(ctx, || abi::add_header(MapType::HttpResponseHeaders, k, v));
            if let Err(s) = added {
                log::warn!("tollgate: adding response header {k} failed ({s})");
            }
        }
    }

    fn set_request_header(&mut self, ctx: ContextId, name: &str, value: &str) {
        let ctx = ctx.get();
        let set = self.in_context(ctx, || {
            abi::replace_header(MapType::HttpRequestHeaders, name, value)
        });
        if let Err(s) = set {
            log::warn!("tollgate: setting request header {name} failed ({s})");
        }
    }

    fn request_header(&mut self, ctx: ContextId, name: &str) -> Option<Vec<u8>> {
        let ctx = ctx.get();
        // The attribute, as `HostView::header` reads it, in the request's own context.
        self.act_for(ctx).ok()?;
        property(&["request", "headers", name])
    }

    fn enqueue(&mut self, queue: u32, message: &[u8]) -> bool {
        abi::enqueue(queue, message).is_ok()
    }

    fn dequeue(&mut self, queue: u32) -> Option<Vec<u8>> {
        // A message without bytes is no message (the host handed over no buffer).
        abi::dequeue(queue).ok().filter(|m| !m.is_empty())
    }

    fn set_tick(&mut self, period_ms: u64) {
        let period = u32::try_from(period_ms).unwrap_or(u32::MAX);
        let _ = self.act_for(self.current);
        if let Err(s) = abi::set_tick_period_ms(period) {
            log::warn!("tollgate: setting the tick period failed ({s})");
        }
    }
}
