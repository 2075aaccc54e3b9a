//! The wasm floor: a proxy-wasm HTTP filter that reads one request header (`x-user-id`, the header
//! tollgate's bench rule is keyed on) and continues. It holds no state and makes no callouts, so what
//! Envoy spends on it is the fixed price of running any proxy-wasm filter.
//!
//! With the plugin configuration `host-calls` (scenario `wasm-floor-calls`) it makes, instead, the
//! host calls tollgate's lease path makes for a request answered from leased tokens, with no logic
//! around them: the clock, `:path`, the key header through the `request.headers` attribute, two
//! counter increments, and two response headers. Its cost over the floor is what those host calls
//! cost Envoy; tollgate-lease's cost over it is what tollgate's own wasm code costs.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType, MetricType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { counters: None }) });
}}

struct Root {
    /// With `host-calls`: the two counters each request increments.
    counters: Option<(u32, u32)>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = hostcalls::get_buffer(proxy_wasm::types::BufferType::PluginConfiguration, 0, 64);
        if matches!(config, Ok(Some(c)) if c == b"host-calls") {
            let a = hostcalls::define_metric(MetricType::Counter, "wasm_floor.allowed");
            let b = hostcalls::define_metric(MetricType::Counter, "wasm_floor.local_allowed");
            if let (Ok(a), Ok(b)) = (a, b) {
                self.counters = Some((a, b));
            }
        }
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // The floor's context is a zero-sized type, so boxing it allocates nothing: the floor
        // stays what it was before the host-calls variant existed.
        Some(match self.counters {
            None => Box::new(Floor),
            Some((a, b)) => Box::new(HostCalls { a, b }),
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
struct HostCalls {
    a: u32,
    b: u32,
}

impl Context for HostCalls {}

impl HttpContext for HostCalls {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let _ = hostcalls::get_current_time();
        let _ = hostcalls::get_map_value(MapType::HttpRequestHeaders, ":path");
        let _ = hostcalls::get_property(vec!["request", "headers", "x-user-id"]);
        let _ = hostcalls::increment_metric(self.a, 1);
        let _ = hostcalls::increment_metric(self.b, 1);
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
