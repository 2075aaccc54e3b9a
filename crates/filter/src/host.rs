//! The one place that calls proxy-wasm host functions: it implements the engine's `Host`, the
//! shared-data `Store` and the `RequestView` of the current request, and defines the metrics.
//!
//! Invariant: no host call here can panic the VM: every call goes through `abi`, whose statuses
//! are plain numbers, and every status becomes a logged error or an absent value.

use std::borrow::Cow;

use tollgate_abi as abi;
use tollgate_core::backend::{BackendError, HttpRequest};
use tollgate_core::config::Config;
use tollgate_core::engine::{Host, LocalReply};
use tollgate_core::metrics::{self, Counter, Metrics};
use tollgate_core::rule::{Lines, RequestView};
use tollgate_core::shared::{Store, StoreError};

/// Most bytes of a callout answer read into the VM: a script reply is well under 100 bytes, so a
/// larger answer is garbage and is refused without copying it.
pub const MAX_REPLY_BYTES: usize = 4096;

/// Envoy's log level for wasm as a `log` filter (`off` and anything unknown turn logging off).
pub fn log_filter() -> log::LevelFilter {
    let Some(level) = abi::log_level() else {
        return log::LevelFilter::Info;
    };
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
        abi::shared_data(key).map_err(|s| StoreError::Host(format!("status {s}")))
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        match abi::set_shared_data(key, value, cas) {
            abi::OK => Ok(()),
            abi::CAS_MISMATCH => Err(StoreError::CasMismatch),
            other => Err(StoreError::Host(format!("status {other}"))),
        }
    }
}

/// Registers this worker's shared queue: its number comes from shared data, so each worker's
/// name is its own (a name registered twice would move the queue to the later worker). None if
/// the host has no shared queues (the engine then shares calls within a worker only).
pub fn register_queue(ns: &str) -> Option<u32> {
    let n = tollgate_core::shared::lead::worker_number(&HostStore, ns).ok()?;
    let name = format!("{ns}|queue|{n}");
    abi::register_queue(&name)
}

/// The current request, read lazily from the host: all its headers in one call, the first time
/// a rule needs one (each header read on its own would cost Envoy a call and an allocation
/// callback into the VM).
#[derive(Default)]
pub struct HostRequest {
    headers: std::cell::OnceCell<Option<Vec<u8>>>,
}

impl HostRequest {
    /// The request's headers as the host encodes them, read once.
    fn pairs(&self) -> Option<&[u8]> {
        self.headers
            .get_or_init(|| {
                let pairs = abi::header_pairs(abi::MAP_REQUEST_HEADERS);
                if pairs.is_none() {
                    log::error!("tollgate: the host gave no request headers; rules see none");
                }
                pairs
            })
            .as_deref()
    }
}

impl RequestView for HostRequest {
    /// Every line of a repeated header, joined with `,` as Envoy's `request.headers` attribute
    /// joins them (`get_header_map_value` would give only the first line).
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        tollgate_core::pairs::lookup(self.pairs()?, name)
    }

    /// The map's lines whose name some server reads as `name` (`x_api_key` for `x-api-key`).
    fn header_lines(&self, name: &str) -> Lines<'_> {
        let Some(pairs) = self.pairs() else {
            return Lines::None;
        };
        let mut lines = Lines::None;
        let wanted = |key: &[u8]| tollgate_core::rule::reading::is_header_name(key, name);
        match tollgate_core::pairs::each(pairs, wanted, |v| lines.push(Cow::Borrowed(v))) {
            Some(()) => lines,
            None => Lines::None,
        }
    }

    fn client_ip(&self) -> Option<Vec<u8>> {
        let addr = property(&["source", "address"])?;
        Some(strip_port(&addr).to_vec())
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        property(path)
    }
}

/// An Envoy attribute by its path segments: Some(bytes) when the host has it (Some(empty) for an
/// empty value), None when it has not or cannot serialise it. Never panics.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
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
    abi::property(serialized)
}

/// The current response's headers or trailers.
pub struct HostResponse(u32);

impl HostResponse {
    pub fn headers() -> HostResponse {
        HostResponse(abi::MAP_RESPONSE_HEADERS)
    }

    pub fn trailers() -> HostResponse {
        HostResponse(abi::MAP_RESPONSE_TRAILERS)
    }
}

impl RequestView for HostResponse {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        abi::header(self.0, name).map(Cow::Owned)
    }

    fn client_ip(&self) -> Option<Vec<u8>> {
        None
    }
}

/// The response body chunk being delivered (at most `usage::WINDOW` bytes of it are ever kept).
pub fn response_body(size: usize) -> Vec<u8> {
    abi::buffer(abi::BUFFER_RESPONSE_BODY, 0, size).unwrap_or_default()
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
    abi::buffer(abi::BUFFER_PLUGIN_CONFIGURATION, 0, usize::MAX).unwrap_or_default()
}

/// Status and body of the callout answer being delivered: status 0 when there are no headers
/// (reset or timed out); a body over `MAX_REPLY_BYTES` is not read (its status becomes 0x1_0000 +
/// the HTTP status, which no decoder accepts).
pub fn call_response(num_headers: usize, body_size: usize) -> (u32, Vec<u8>) {
    if num_headers == 0 {
        return (0, Vec::new());
    }
    let status = abi::header(abi::MAP_CALL_RESPONSE_HEADERS, ":status")
        .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u32>().ok())
        .unwrap_or(0);
    if body_size > MAX_REPLY_BYTES {
        return (status.saturating_add(0x1_0000), Vec::new());
    }
    let body = abi::buffer(abi::BUFFER_CALL_RESPONSE_BODY, 0, body_size).unwrap_or_default();
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

    /// A host for root context `root` while a callback of context `running` (another root) runs:
    /// the host's calls switch to `root` first.
    pub fn for_root_from(root: u32, running: u32) -> WasmHost {
        WasmHost {
            effective: std::cell::Cell::new(running),
            ..WasmHost::new(root)
        }
    }

    /// Makes `ctx` the context the host's calls act for; false if the host refused (gone).
    fn act_for(&self, ctx: u32) -> bool {
        if self.effective.get() == ctx {
            return true;
        }
        if abi::set_effective_context(ctx) != abi::OK {
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
        req: &HttpRequest,
        timeout_ms: u64,
    ) -> Result<u32, BackendError> {
        // The call is carried by (and answered through) the context whose callback this is.
        if !self.act_for(self.current) {
            return Err(BackendError::Dispatch(
                "set_effective_context refused".into(),
            ));
        }
        if cfg!(feature = "higress") {
            // The Redis client's op timeout was set once, at configure time.
            return redis_call(cluster, &req.body);
        }
        let headers = tollgate_core::pairs::encode(&req.headers);
        let timeout = u32::try_from(timeout_ms).unwrap_or(u32::MAX);
        abi::http_call(cluster, &headers, &req.body, timeout).map_err(|s| {
            BackendError::Dispatch(format!("status {s} (is cluster \"{cluster}\" defined?)"))
        })
    }

    fn resume(&mut self, ctx: u32) {
        let status = self.in_context(ctx, abi::continue_request);
        if status != abi::OK {
            log::warn!("tollgate: resuming request {ctx} failed (status {status})");
        }
    }

    fn respond(&mut self, ctx: u32, reply: &LocalReply) {
        let headers = tollgate_core::pairs::encode(&reply.headers);
        let details = b"tollgate";
        let grpc = reply
            .grpc_status
            .and_then(|s| i32::try_from(s).ok())
            .unwrap_or(-1);
        let status = self.in_context(ctx, || {
            abi::send_local_response(reply.status, details, reply.body.as_bytes(), &headers, grpc)
        });
        if status != abi::OK {
            log::warn!("tollgate: local reply to request {ctx} failed (status {status})");
        }
    }

    fn add_response_headers(&mut self, ctx: u32, headers: &[(&str, &str)]) {
        for (k, v) in headers {
            let status = self.in_context(ctx, || abi::add_header(abi::MAP_RESPONSE_HEADERS, k, v));
            if status != abi::OK {
                log::warn!("tollgate: adding response header {k} failed (status {status})");
            }
        }
    }

    fn set_request_header(&mut self, ctx: u32, name: &str, value: &str) {
        let status = self.in_context(ctx, || {
            abi::replace_header(abi::MAP_REQUEST_HEADERS, name, value)
        });
        if status != abi::OK {
            log::warn!("tollgate: setting request header {name} failed (status {status})");
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
        abi::enqueue(queue, message) == abi::OK
    }

    fn dequeue(&mut self, queue: u32) -> Option<Vec<u8>> {
        abi::dequeue(queue)
    }

    fn set_tick(&mut self, period_ms: u64) {
        let period = u32::try_from(period_ms).unwrap_or(u32::MAX);
        let _ = self.act_for(self.current);
        let status = abi::set_tick_period_ms(period);
        if status != abi::OK {
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

fn define(kind: u32, name: &str) -> Option<u32> {
    match abi::define_metric(kind, name) {
        Ok(id) => Some(id),
        Err(s) => {
            log::error!("tollgate: cannot define metric {name}: status {s}");
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
                        .map(|c| define(abi::METRIC_COUNTER, &metrics::name(&r.name, &c.suffix())))
                        .collect()
                })
                .collect(),
            latency: config
                .rules
                .iter()
                .map(|r| {
                    define(
                        abi::METRIC_HISTOGRAM,
                        &metrics::name(&r.name, metrics::LATENCY_SUFFIX),
                    )
                })
                .collect(),
            breaker: define(abi::METRIC_GAUGE, metrics::BREAKER_GAUGE),
        }
    }
}

impl Metrics for HostMetrics {
    fn count(&self, rule: usize, counter: Counter, n: u64) {
        let id = self
            .counters
            .get(rule)
            .and_then(|ids| ids.get(counter.index()).copied().flatten());
        if let (Some(id), Ok(n @ 1..)) = (id, i64::try_from(n)) {
            let _ = abi::increment_metric(id, n);
        }
    }

    fn latency(&self, rule: usize, ms: u64) {
        if let Some(id) = self.latency.get(rule).copied().flatten() {
            let _ = abi::record_metric(id, ms);
        }
    }

    fn breaker_open(&self, open: bool) {
        if let Some(id) = self.breaker {
            let _ = abi::record_metric(id, u64::from(open));
        }
    }
}

#[cfg(not(feature = "higress"))]
fn redis_call(_cluster: &str, _query: &[u8]) -> Result<u32, BackendError> {
    Err(BackendError::Dispatch(
        "Redis callouts are only in the Higress build".to_string(),
    ))
}

#[cfg(feature = "higress")]
pub use redis::{configure_redis, redis_call, redis_reply};

/// Higress' Redis callouts (envoy/higress/ABI.md), in the Higress build only: the HTTP build must not
/// import them (stock Envoy refuses a module with imports it does not have).
#[cfg(feature = "higress")]
mod redis {
    use std::cell::RefCell;

    use tollgate_core::backend::resp::MAX_REPLY_BYTES;
    use tollgate_core::backend::BackendError;
    use tollgate_core::config::Backend;

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
    }

    use tollgate_abi::{self as abi, OK};

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
        abi::buffer(REDIS_CALL_RESPONSE, 0, response_size).unwrap_or_default()
    }
}
