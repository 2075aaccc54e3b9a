//! The one place that calls proxy-wasm host functions: shared data, request headers and
//! properties, the clock, callouts. Everything else sees the host through small traits.
//!
//! Invariant: every host call goes through `proxy_wasm::hostcalls` and its `Result`; a failing
//! host call becomes an absent value or an error, never a panic in the VM.

use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType, Status};

use crate::backend::{BackendError, HttpRequest};
use crate::config::Config;
use crate::local::{SharedStore, StoreError};
use crate::metrics::{self, Counter, Metrics};
use crate::rule::RequestView;

/// Proxy-wide shared data (one store per VM id, shared by the proxy's workers).
pub struct HostStore;

impl SharedStore for HostStore {
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

/// The current request, read lazily from the host.
pub struct HostRequest;

impl RequestView for HostRequest {
    /// Through Envoy's `request.headers` attribute, which joins repeated lines with `,`
    /// (`get_header_map_value` would give only the first line).
    fn header(&self, name: &str) -> Option<Vec<u8>> {
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
    let mut serialized = Vec::with_capacity(path.iter().map(|p| p.len() + 1).sum());
    for segment in path {
        serialized.extend_from_slice(segment.as_bytes());
        serialized.push(0);
    }
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

/// Microseconds since the Unix epoch by the proxy's clock (0 if the host can't tell).
pub fn now_us() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Dispatches a callout to `cluster`; the answer arrives in `on_http_call_response(token, ..)`.
pub fn dispatch(cluster: &str, req: &HttpRequest, timeout_ms: u64) -> Result<u32, BackendError> {
    let headers: Vec<(&str, &str)> = req
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    hostcalls::dispatch_http_call(
        cluster,
        headers,
        Some(&req.body),
        Vec::new(),
        Duration::from_millis(timeout_ms),
    )
    .map_err(|s| BackendError::Dispatch(format!("{s:?} (is cluster \"{cluster}\" defined?)")))
}

/// Status and body of the callout answer being delivered (status 0 when there are no headers:
/// the stream was reset or timed out).
pub fn call_response(num_headers: usize, body_size: usize) -> (u32, Vec<u8>) {
    if num_headers == 0 {
        return (0, Vec::new());
    }
    let status = hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u32>().ok())
        .unwrap_or(0);
    let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
        .ok()
        .flatten()
        .unwrap_or_default();
    (status, body)
}

/// The plugin configuration bytes.
pub fn plugin_configuration() -> Vec<u8> {
    hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Continues the paused request of the current context.
pub fn resume_request() {
    if let Err(s) = hostcalls::resume_http_request() {
        log::warn!("tollgate: resume_http_request failed: {s:?}");
    }
}

/// Answers the current request locally.
pub fn send_response(status: u32, headers: &[(String, String)], body: &str) {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if let Err(s) = hostcalls::send_http_response(status, headers, Some(body.as_bytes())) {
        log::warn!("tollgate: send_http_response failed: {s:?}");
    }
}

/// Adds headers to the response of the current context.
pub fn add_response_headers(headers: &[(String, String)]) {
    for (k, v) in headers {
        if let Err(s) = hostcalls::add_map_value(MapType::HttpResponseHeaders, k, v) {
            log::warn!("tollgate: adding response header {k} failed: {s:?}");
        }
    }
}

/// Envoy stats for every rule's counters and latency histogram, defined once per worker at
/// configure time (workers defining the same name share one stat).
pub struct HostMetrics {
    /// Per rule, one id per `Counter::ALL` entry (None if the host refused the name).
    counters: Vec<Vec<Option<u32>>>,
    latency: Vec<Option<u32>>,
}

impl HostMetrics {
    pub fn define(config: &Config) -> HostMetrics {
        let define = |kind: MetricType, name: String| match hostcalls::define_metric(kind, &name) {
            Ok(id) => Some(id),
            Err(s) => {
                log::error!("tollgate: cannot define metric {name}: {s:?}");
                None
            }
        };
        HostMetrics {
            counters: config
                .rules
                .iter()
                .map(|r| {
                    Counter::ALL
                        .iter()
                        .map(|c| define(MetricType::Counter, metrics::name(&r.name, c.suffix())))
                        .collect()
                })
                .collect(),
            latency: config
                .rules
                .iter()
                .map(|r| {
                    define(
                        MetricType::Histogram,
                        metrics::name(&r.name, metrics::LATENCY_SUFFIX),
                    )
                })
                .collect(),
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
}
