//! The one place that calls proxy-wasm host functions: it implements the engine's `Host`, the
//! shared-data `Store` and the `RequestView` of the current request, and defines the metrics.
//!
//! Invariant: no host call here can panic the VM. `proxy_wasm::hostcalls` functions are used only
//! where Envoy cannot return a status they do not expect; the others (continue, local reply, tick,
//! effective context, adding a header, the log level) are called through their raw imports, and
//! every status becomes a logged error or an absent value.

use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType, Status};

use crate::backend::{BackendError, HttpRequest};
use crate::config::Config;
use crate::engine::{Host, LocalReply};
use crate::metrics::{self, Counter, Metrics};
use crate::rule::RequestView;
use crate::shared::{Store, StoreError};

/// Most bytes of a callout answer read into the VM: a script reply is well under 100 bytes, so a
/// larger answer is garbage and is refused without copying it.
pub const MAX_REPLY_BYTES: usize = 4096;

/// The raw imports whose SDK wrappers panic on statuses Envoy may return.
#[allow(clashing_extern_declarations)]
mod raw {
    #[link(wasm_import_module = "env")]
    extern "C" {
        pub fn proxy_continue_stream(stream_type: u32) -> u32;
        pub fn proxy_send_local_response(
            status_code: u32,
            details_data: *const u8,
            details_size: usize,
            body_data: *const u8,
            body_size: usize,
            headers_data: *const u8,
            headers_size: usize,
            grpc_status: i32,
        ) -> u32;
        pub fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
        pub fn proxy_set_effective_context(context_id: u32) -> u32;
        pub fn proxy_add_header_map_value(
            map_type: u32,
            key_data: *const u8,
            key_size: usize,
            value_data: *const u8,
            value_size: usize,
        ) -> u32;
        pub fn proxy_get_log_level(return_level: *mut u32) -> u32;
        pub fn proxy_register_shared_queue(
            name_data: *const u8,
            name_size: usize,
            return_id: *mut u32,
        ) -> u32;
        pub fn proxy_enqueue_shared_queue(
            queue_id: u32,
            value_data: *const u8,
            value_size: usize,
        ) -> u32;
        pub fn proxy_dequeue_shared_queue(
            queue_id: u32,
            return_value_data: *mut *mut u8,
            return_value_size: *mut usize,
        ) -> u32;
    }
}

const OK: u32 = 0;
const STREAM_REQUEST: u32 = 0;
const MAP_RESPONSE_HEADERS: u32 = 2;

/// Envoy's log level for wasm as a `log` filter (`off` and anything unknown turn logging off).
pub fn log_filter() -> log::LevelFilter {
    let mut level: u32 = 2;
    // SAFETY: the host writes one u32 through a pointer to a live local.
    let status = unsafe { raw::proxy_get_log_level(&mut level) };
    if status != OK {
        return log::LevelFilter::Info;
    }
    match level {
        0 => log::LevelFilter::Trace,
        1 => log::LevelFilter::Debug,
        2 => log::LevelFilter::Info,
        3 => log::LevelFilter::Warn,
        4 | 5 => log::LevelFilter::Error,
        _ => log::LevelFilter::Off,
    }
}

/// Proxy-wide shared data (one store per VM id, shared by the proxy's workers).
pub struct HostStore;

impl Store for HostStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        hostcalls::get_shared_data(key)
            .map(|(value, cas)| (value, cas.unwrap_or(0)))
            .map_err(|s| StoreError::Host(format!("{s:?}")))
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        let cas = (cas != 0).then_some(cas);
        hostcalls::set_shared_data(key, Some(value), cas).map_err(|s| match s {
            Status::CasMismatch => StoreError::CasMismatch,
            other => StoreError::Host(format!("{other:?}")),
        })
    }
}

/// Registers this worker's shared queue: its number comes from shared data, so each worker's
/// name is its own (a name registered twice would move the queue to the later worker). None if
/// the host has no shared queues (the engine then shares calls within a worker only).
pub fn register_queue(ns: &str) -> Option<u32> {
    let n = crate::shared::lead::worker_number(&HostStore, ns).ok()?;
    let name = format!("{ns}|queue|{n}");
    let mut id = 0u32;
    // SAFETY: the name outlives the call; the host writes one u32 to `id`.
    let status = unsafe { raw::proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) };
    (status == OK).then_some(id)
}

/// The current request, read lazily from the host.
pub struct HostRequest;

impl RequestView for HostRequest {
    /// Through Envoy's `request.headers` attribute, which joins repeated lines with `,`
    /// (`get_header_map_value` would give only the first line). A pseudo-header (`:path`,
    /// `:method`, `:authority`) has one line by construction (Envoy's codecs reject a repeated
    /// one), so it is read from the header map directly, which costs Envoy far less than an
    /// attribute lookup.
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        if name.starts_with(':') {
            return hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name)
                .ok()
                .flatten();
        }
        property(&["request", "headers", name])
    }

    fn client_ip(&self) -> Option<Vec<u8>> {
        let addr = property(&["source", "address"])?;
        Some(strip_port(&addr).to_vec())
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        property(path)
    }
}

#[link(wasm_import_module = "env")]
extern "C" {
    // Declared here with a plain u32 status: the SDK's declaration returns its `Status` enum, and a
    // status the enum does not list (Envoy can answer e.g. InvalidMemoryAccess) would be undefined
    // behaviour there, and a panic in `hostcalls::get_property`.
    #[link_name = "proxy_get_property"]
    fn tollgate_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
}

/// An Envoy attribute by its path segments: Some(bytes) when the host has it (Some(empty) for an
/// empty value), None when it has not or cannot serialise it. Never panics.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    const OK: u32 = 0;
    // On the stack when short (a header's path is): a heap buffer costs the local path more than
    // the rest of this call's work in the VM.
    let mut short = [0u8; 128];
    let mut long = Vec::new();
    let len: usize = path.iter().map(|p| p.len() + 1).sum();
    let serialized: &[u8] = match short.get_mut(..len) {
        Some(buf) => {
            // Each segment, then a NUL (the buffer is zeroed).
            let mut at = 0;
            for segment in path {
                let end = at + segment.len();
                if let Some(text) = buf.get_mut(at..end) {
                    text.copy_from_slice(segment.as_bytes());
                }
                at = end + 1;
            }
            buf
        }
        None => {
            long.reserve_exact(len);
            for segment in path {
                long.extend_from_slice(segment.as_bytes());
                long.push(0);
            }
            &long
        }
    };
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: the path buffer outlives the call; on success the host hands over a buffer it
    // allocated with this module's allocator (proxy_on_memory_allocate), which we then own.
    let status = unsafe {
        tollgate_get_property(serialized.as_ptr(), serialized.len(), &mut data, &mut size)
    };
    if status != OK {
        return None;
    }
    if data.is_null() {
        return Some(Vec::new());
    }
    // SAFETY: see above; `size` is the buffer's length and capacity.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

/// The current response's headers or trailers.
pub struct HostResponse(MapType);

impl HostResponse {
    pub fn headers() -> HostResponse {
        HostResponse(MapType::HttpResponseHeaders)
    }

    pub fn trailers() -> HostResponse {
        HostResponse(MapType::HttpResponseTrailers)
    }
}

impl RequestView for HostResponse {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        hostcalls::get_map_value_bytes(self.0, name).ok().flatten()
    }

    fn client_ip(&self) -> Option<Vec<u8>> {
        None
    }
}

/// The response body chunk being delivered (at most `usage::WINDOW` bytes of it are ever kept).
pub fn response_body(size: usize) -> Vec<u8> {
    hostcalls::get_buffer(BufferType::HttpResponseBody, 0, size)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// `1.2.3.4:5678` -> `1.2.3.4`, `[::1]:5678` -> `::1`; anything else as it is.
pub fn strip_port(addr: &[u8]) -> &[u8] {
    if let Some(rest) = addr.strip_prefix(b"[") {
        if let Some(end) = rest.iter().position(|&b| b == b']') {
            return rest.get(..end).unwrap_or(rest);
        }
        return addr;
    }
    let colons = addr.iter().filter(|&&b| b == b':').count();
    if colons == 1 {
        if let Some(pos) = addr.iter().position(|&b| b == b':') {
            return addr.get(..pos).unwrap_or(addr);
        }
    }
    addr
}

/// The plugin configuration bytes.
pub fn plugin_configuration() -> Vec<u8> {
    hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Status and body of the callout answer being delivered: status 0 when there are no headers
/// (reset or timed out); a body over `MAX_REPLY_BYTES` is not read (its status becomes 0x1_0000 +
/// the HTTP status, which no decoder accepts).
pub fn call_response(num_headers: usize, body_size: usize) -> (u32, Vec<u8>) {
    if num_headers == 0 {
        return (0, Vec::new());
    }
    let status = hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u32>().ok())
        .unwrap_or(0);
    if body_size > MAX_REPLY_BYTES {
        return (status.saturating_add(0x1_0000), Vec::new());
    }
    let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
        .ok()
        .flatten()
        .unwrap_or_default();
    (status, body)
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

    /// Makes `ctx` the context the host's calls act for; false if the host refused (gone).
    fn act_for(&self, ctx: u32) -> bool {
        if self.effective.get() == ctx {
            return true;
        }
        // SAFETY: plain integer argument.
        if unsafe { raw::proxy_set_effective_context(ctx) } != OK {
            return false;
        }
        self.effective.set(ctx);
        true
    }

    /// Runs `f` with `ctx` as the host's effective context (it stays so until another context
    /// is needed: calls sent by this callback switch back to its own first).
    fn in_context(&self, ctx: u32, f: impl FnOnce() -> u32) -> u32 {
        if !self.act_for(ctx) {
            return u32::MAX;
        }
        f()
    }
}

fn serialize_pairs(pairs: &[(String, String)]) -> Vec<u8> {
    // proxy-wasm map encoding: count, then (key len, value len) pairs, then each key\0value\0.
    let mut out = Vec::new();
    let count = u32::try_from(pairs.len()).unwrap_or(0);
    out.extend_from_slice(&count.to_le_bytes());
    for (k, v) in pairs.iter().take(count as usize) {
        out.extend_from_slice(&u32::try_from(k.len()).unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&u32::try_from(v.len()).unwrap_or(0).to_le_bytes());
    }
    for (k, v) in pairs.iter().take(count as usize) {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

impl Host for WasmHost {
    fn now_ms(&self) -> u64 {
        if let Some(now) = self.now_ms.get() {
            return now;
        }
        let now = hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.now_ms.set(Some(now));
        now
    }

    fn store(&self) -> &dyn Store {
        &HostStore
    }

    fn dispatch(
        &mut self,
        cluster: &str,
        req: &HttpRequest,
        timeout_ms: u64,
    ) -> Result<u32, BackendError> {
        // The call is carried by (and answered through) the context whose callback this is.
        if !self.act_for(self.current) {
            return Err(BackendError::Dispatch(
                "set_effective_context refused".into(),
            ));
        }
        if cfg!(feature = "redis-callout") {
            // The Redis client's op timeout was set once, at configure time.
            return redis_call(cluster, &req.body);
        }
        let headers: Vec<(&str, &str)> = req
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        // Envoy answers Ok, BadArgument (unknown cluster, missing pseudo-header) or
        // InternalFailure: the statuses this wrapper expects.
        hostcalls::dispatch_http_call(
            cluster,
            headers,
            Some(&req.body),
            Vec::new(),
            Duration::from_millis(timeout_ms),
        )
        .map_err(|s| BackendError::Dispatch(format!("{s:?} (is cluster \"{cluster}\" defined?)")))
    }

    fn resume(&mut self, ctx: u32) {
        // SAFETY: plain integer argument.
        let status = self.in_context(ctx, || unsafe {
            raw::proxy_continue_stream(STREAM_REQUEST)
        });
        if status != OK {
            log::warn!("tollgate: resuming request {ctx} failed (status {status})");
        }
    }

    fn respond(&mut self, ctx: u32, reply: &LocalReply) {
        let headers = serialize_pairs(&reply.headers);
        let details = b"tollgate";
        let grpc = reply
            .grpc_status
            .and_then(|s| i32::try_from(s).ok())
            .unwrap_or(-1);
        let status = self.in_context(ctx, || {
            // SAFETY: every pointer/length pair describes a live buffer for the call's duration.
            unsafe {
                raw::proxy_send_local_response(
                    reply.status,
                    details.as_ptr(),
                    details.len(),
                    reply.body.as_ptr(),
                    reply.body.len(),
                    headers.as_ptr(),
                    headers.len(),
                    grpc,
                )
            }
        });
        if status != OK {
            log::warn!("tollgate: local reply to request {ctx} failed (status {status})");
        }
    }

    fn add_response_headers(&mut self, ctx: u32, headers: &[(&str, &str)]) {
        for (k, v) in headers {
            let status = self.in_context(ctx, || {
                // SAFETY: pointer/length pairs of live strings.
                unsafe {
                    raw::proxy_add_header_map_value(
                        MAP_RESPONSE_HEADERS,
                        k.as_ptr(),
                        k.len(),
                        v.as_ptr(),
                        v.len(),
                    )
                }
            });
            if status != OK {
                log::warn!("tollgate: adding response header {k} failed (status {status})");
            }
        }
    }

    fn request_header(&mut self, ctx: u32, name: &str) -> Option<Vec<u8>> {
        // The attribute, as `HostRequest::header` reads it, in the request's own context.
        if !self.act_for(ctx) {
            return None;
        }
        property(&["request", "headers", name])
    }

    fn enqueue(&mut self, queue: u32, message: &[u8]) -> bool {
        // SAFETY: the message outlives the call. Envoy answers Ok or NotFound.
        unsafe { raw::proxy_enqueue_shared_queue(queue, message.as_ptr(), message.len()) == OK }
    }

    fn dequeue(&mut self, queue: u32) -> Option<Vec<u8>> {
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: the host allocates the value through proxy_on_memory_allocate (this module's
        // allocator) and hands it over; it is taken back as a Vec of exactly that size.
        unsafe {
            if raw::proxy_dequeue_shared_queue(queue, &mut data, &mut size) != OK || data.is_null()
            {
                return None;
            }
            Some(Vec::from_raw_parts(data, size, size))
        }
    }

    fn set_tick(&mut self, period_ms: u64) {
        let period = u32::try_from(period_ms).unwrap_or(u32::MAX);
        let _ = self.act_for(self.current);
        // SAFETY: plain integer argument.
        let status = unsafe { raw::proxy_set_tick_period_milliseconds(period) };
        if status != OK {
            log::warn!("tollgate: setting the tick period failed (status {status})");
        }
    }
}

/// Envoy stats for every rule's counters and latency histogram, and the breaker gauge, defined
/// once per worker at configure time (workers defining the same name share one stat).
pub struct HostMetrics {
    /// Per rule, one id per `Counter::ALL` entry (None if the host refused the name).
    counters: Vec<Vec<Option<u32>>>,
    latency: Vec<Option<u32>>,
    breaker: Option<u32>,
}

fn define(kind: MetricType, name: &str) -> Option<u32> {
    // Envoy answers Ok or BadArgument (a name it cannot take) here.
    match hostcalls::define_metric(kind, name) {
        Ok(id) => Some(id),
        Err(s) => {
            log::error!("tollgate: cannot define metric {name}: {s:?}");
            None
        }
    }
}

impl HostMetrics {
    pub fn define(config: &Config) -> HostMetrics {
        HostMetrics {
            counters: config
                .rules
                .iter()
                .map(|r| {
                    Counter::ALL
                        .iter()
                        .map(|c| define(MetricType::Counter, &metrics::name(&r.name, &c.suffix())))
                        .collect()
                })
                .collect(),
            latency: config
                .rules
                .iter()
                .map(|r| {
                    define(
                        MetricType::Histogram,
                        &metrics::name(&r.name, metrics::LATENCY_SUFFIX),
                    )
                })
                .collect(),
            breaker: define(MetricType::Gauge, metrics::BREAKER_GAUGE),
        }
    }
}

impl Metrics for HostMetrics {
    fn count(&self, rule: usize, counter: Counter, n: u64) {
        let Some(pos) = Counter::ALL.iter().position(|c| *c == counter) else {
            return;
        };
        let id = self
            .counters
            .get(rule)
            .and_then(|ids| ids.get(pos).copied().flatten());
        if let (Some(id), Ok(n @ 1..)) = (id, i64::try_from(n)) {
            let _ = hostcalls::increment_metric(id, n);
        }
    }

    fn latency(&self, rule: usize, ms: u64) {
        if let Some(id) = self.latency.get(rule).copied().flatten() {
            let _ = hostcalls::record_metric(id, ms);
        }
    }

    fn breaker_open(&self, open: bool) {
        if let Some(id) = self.breaker {
            let _ = hostcalls::record_metric(id, u64::from(open));
        }
    }
}

#[cfg(not(feature = "redis-callout"))]
fn redis_call(_cluster: &str, _query: &[u8]) -> Result<u32, BackendError> {
    Err(BackendError::Dispatch(
        "Redis callouts are only in the Higress build".to_string(),
    ))
}

#[cfg(feature = "redis-callout")]
pub use redis::{configure_redis, redis_call, redis_reply};

/// Higress' Redis callouts (envoy/higress/ABI.md), in the Higress build only: the HTTP build must not
/// import them (stock Envoy refuses a module with imports it does not have).
#[cfg(feature = "redis-callout")]
mod redis {
    use std::cell::RefCell;

    use crate::backend::resp::MAX_REPLY_BYTES;
    use crate::backend::BackendError;
    use crate::config::Backend;

    #[allow(clashing_extern_declarations)]
    #[link(wasm_import_module = "env")]
    extern "C" {
        fn proxy_redis_init(
            cluster_data: *const u8,
            cluster_size: usize,
            username_data: *const u8,
            username_size: usize,
            password_data: *const u8,
            password_size: usize,
            timeout_ms: u32,
        ) -> u32;
        fn proxy_redis_call(
            cluster_data: *const u8,
            cluster_size: usize,
            query_data: *const u8,
            query_size: usize,
            token: *mut u32,
        ) -> u32;
        fn proxy_get_buffer_bytes(
            buffer_type: u32,
            start: usize,
            max_size: usize,
            data: *mut *mut u8,
            size: *mut usize,
        ) -> u32;
    }

    const OK: u32 = 0;
    const BAD_ARGUMENT: u32 = 2;
    const INTERNAL_FAILURE: u32 = 10;
    /// Higress' `WasmBufferType::RedisCallResponse`.
    const REDIS_CALL_RESPONSE: u32 = 9;

    /// This worker's `proxy_redis_init` arguments, and whether the host took them.
    struct Init {
        /// The cluster with Higress' parameters: `?buffer_flush_timeout=0` (send each command at
        /// once instead of batching for 3 ms) and `db=N` (`SELECT N`; Higress ignores parameters
        /// it does not know).
        target: String,
        username: String,
        password: String,
        timeout_ms: u32,
        ready: bool,
    }

    thread_local! {
        static INIT: RefCell<Option<Init>> = const { RefCell::new(None) };
    }

    fn init(i: &Init) -> u32 {
        // SAFETY: pointer/length pairs of live strings; the host copies them.
        unsafe {
            proxy_redis_init(
                i.target.as_ptr(),
                i.target.len(),
                i.username.as_ptr(),
                i.username.len(),
                i.password.as_ptr(),
                i.password.len(),
                i.timeout_ms,
            )
        }
    }

    /// Configures this worker's Redis client (each worker has its own). Higress answers
    /// BadArgument while the cluster is unknown to this worker (not yet pushed, or misspelt):
    /// then it is tried again before each call, and calls fail (the failure mode) until it works.
    pub fn configure_redis(backend: &Backend) {
        let mut target = format!("{}?buffer_flush_timeout=0", backend.cluster);
        if backend.database != 0 {
            target.push_str(&format!("&db={}", backend.database));
        }
        let mut i = Init {
            target,
            username: backend.username.clone().unwrap_or_default(),
            password: backend.password.clone().unwrap_or_default(),
            timeout_ms: u32::try_from(backend.timeout_ms).unwrap_or(u32::MAX),
            ready: false,
        };
        let status = init(&i);
        i.ready = status == OK;
        if !i.ready {
            log::warn!(
                "tollgate: proxy_redis_init for cluster \"{}\" answered status {status}; retrying before each call",
                backend.cluster
            );
        }
        INIT.with(|slot| *slot.borrow_mut() = Some(i));
    }

    /// Sends one RESP command on this worker's connection to `cluster`; the answer comes back as
    /// `proxy_on_redis_call_response` on the root context.
    pub fn redis_call(cluster: &str, query: &[u8]) -> Result<u32, BackendError> {
        let ready = INIT.with(|slot| match slot.borrow_mut().as_mut() {
            Some(i) if i.ready => Ok(()),
            Some(i) => match init(i) {
                OK => {
                    i.ready = true;
                    log::info!("tollgate: proxy_redis_init for cluster \"{cluster}\" succeeded");
                    Ok(())
                }
                s => Err(BackendError::Dispatch(format!(
                    "proxy_redis_init answered status {s} (is cluster \"{cluster}\" known?)"
                ))),
            },
            None => Err(BackendError::Dispatch("not configured".to_string())),
        });
        ready?;
        let mut token: u32 = 0;
        // SAFETY: pointer/length pairs of live buffers; the host writes one u32 to `token`.
        let status = unsafe {
            proxy_redis_call(
                cluster.as_ptr(),
                cluster.len(),
                query.as_ptr(),
                query.len(),
                &mut token,
            )
        };
        match status {
            OK => Ok(token),
            BAD_ARGUMENT => Err(BackendError::Dispatch(format!(
                "BadArgument (is cluster \"{cluster}\" defined?)"
            ))),
            INTERNAL_FAILURE => Err(BackendError::Dispatch(
                "InternalFailure (no Redis host to send to)".to_string(),
            )),
            s => Err(BackendError::Dispatch(format!("status {s}"))),
        }
    }

    /// The Redis reply being delivered (`response_size` bytes of buffer 9); empty if there is none
    /// or it is larger than any script reply (the caller decodes that as malformed).
    pub fn redis_reply(response_size: usize) -> Vec<u8> {
        if response_size == 0 || response_size > MAX_REPLY_BYTES {
            return Vec::new();
        }
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: the host writes a pointer and a size through pointers to live locals.
        let status = unsafe {
            proxy_get_buffer_bytes(REDIS_CALL_RESPONSE, 0, response_size, &mut data, &mut size)
        };
        if status != OK || data.is_null() {
            return Vec::new();
        }
        // SAFETY: as the SDK's get_buffer: the host allocated `size` bytes with the module's
        // proxy_on_memory_allocate (a Vec of that capacity) and filled them.
        unsafe { Vec::from_raw_parts(data, size, size) }
    }
}
