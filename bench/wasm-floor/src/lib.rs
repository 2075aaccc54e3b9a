//! The wasm floor: a proxy-wasm HTTP filter that reads one request header (`x-user-id`, the header
//! tollgate's bench rule is keyed on) and continues. It holds no state and makes no callouts, so what
//! Envoy spends on it is the fixed price of running any proxy-wasm filter.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Floor))
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
        let _ = proxy_wasm::hostcalls::get_map_value(
            proxy_wasm::types::MapType::HttpRequestHeaders,
            "x-user-id",
        );
        Action::Continue
    }
}
