//! The wasm floor: a proxy-wasm HTTP filter that reads one request header (`x-user-id`, the header
//! tollgate's bench rule is keyed on) and continues. It holds no state and makes no callouts, so what
//! Envoy spends on it is the fixed price of running any proxy-wasm filter.
//!
//! With the plugin configuration `host-calls` (scenario `wasm-floor-calls`) it makes, instead, the
//! host calls tollgate's lease path makes for a request answered from leased tokens, with no logic
//! around them: the request's headers (all in one read) and two response headers (tollgate reads
//! no clock there, and batches its counters: it pushes them about once a second per worker).
//! Its cost over the floor is what those host calls cost Envoy. tollgate-lease's cost over it is
//! what tollgate's own wasm code costs, less what tollgate saves by not exporting the callbacks it
//! does not use (this module is built with the proxy-wasm SDK, which exports them all: Envoy calls
//! it for each request's done and log events, tollgate it does not).

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { host_calls: false }) });
}}

struct Root {
    /// Configured with `host-calls`.
    host_calls: bool,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config =
            hostcalls::get_buffer(proxy_wasm::types::BufferType::PluginConfiguration, 0, 64);
        self.host_calls = matches!(config, Ok(Some(c)) if c == b"host-calls");
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Both contexts are zero-sized types, so boxing them allocates nothing: the floor stays
        // what it was before the host-calls variant existed.
        Some(if self.host_calls {
            Box::new(HostCalls)
        } else {
            Box::new(Floor)
        })
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Floor;

impl Context for Floor {}

impl HttpContext for Floor {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        // The hostcall directly (Result, never a panic), as tollgate does; the value is not used.
        let _ = hostcalls::get_map_value(MapType::HttpRequestHeaders, "x-user-id");
        Action::Continue
    }
}

/// The host-calls variant: tollgate-lease's host calls for a locally answered request.
struct HostCalls;

impl Context for HostCalls {}

impl HttpContext for HostCalls {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let _ = hostcalls::get_map(MapType::HttpRequestHeaders);
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let _ = hostcalls::add_map_value(
            MapType::HttpResponseHeaders,
            "ratelimit-policy",
            "\"per-user\";q=1000000;w=1",
        );
        let _ = hostcalls::add_map_value(
            MapType::HttpResponseHeaders,
            "ratelimit",
            "\"per-user\";r=999999;t=1",
        );
        Action::Continue
    }
}
