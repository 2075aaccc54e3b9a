//! proxy-wasm glue: maps Envoy's callbacks to engine events, nothing else.
//!
//! Invariant: each worker's root context owns one `Engine`; its HTTP contexts hold only their id
//! and a handle to it, so all request state lives in the engine. Every callback that concerns a
//! request reaches the engine (headers, call answers, response headers, the end of the stream).

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

use crate::config::Config;
use crate::engine::{self, Engine, Plugin};
use crate::host::{self, HostMetrics, HostRequest, HostResponse, WasmHost};

type Shared = Rc<RefCell<Option<Engine>>>;

pub fn start() {
    // No host calls are allowed while the module initializes: start at Trace and narrow to
    // Envoy's wasm log level at configure time, so debug lines are not even formatted unless
    // someone asked for them.
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> {
        let engine: Shared = Rc::new(RefCell::new(None));
        #[cfg(feature = "redis-callout")]
        redis_callout::register(id, &engine);
        Box::new(Root { id, engine })
    });
}

/// Runs `f` on the engine with a host for context `ctx` (nothing if unconfigured or busy).
fn with_engine<T>(
    engine: &Shared,
    ctx: u32,
    f: impl FnOnce(&mut Engine, &mut WasmHost) -> T,
) -> Option<T> {
    let Ok(mut slot) = engine.try_borrow_mut() else {
        log::error!("tollgate: engine busy in a re-entrant callback (context {ctx})");
        return None;
    };
    let e = slot.as_mut()?;
    Some(f(e, &mut WasmHost::new(ctx)))
}

struct Root {
    id: u32,
    engine: Shared,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, _: usize) {
        let (status, bytes) = host::call_response(headers, body);
        with_engine(&self.engine, self.id, |e, h| {
            e.call_response(h, self.id, token, status, &bytes)
        });
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        log::set_max_level(host::log_filter());
        match Config::try_from(host::plugin_configuration().as_slice()) {
            Ok(config) => {
                log::info!("tollgate: configured: {}", config.summary());
                #[cfg(feature = "redis-callout")]
                host::configure_redis(&config.backend);
                let metrics = HostMetrics::define(&config);
                let plugin = Plugin::with_metrics(config, Box::new(metrics));
                let queue = host::register_queue(&plugin.ns);
                match self.engine.try_borrow_mut() {
                    Ok(mut slot) => {
                        let mut engine = Engine::new(plugin, self.id);
                        if let Some(q) = queue {
                            engine.set_queue(q);
                        }
                        *slot = Some(engine);
                        true
                    }
                    Err(_) => false,
                }
            }
            Err(e) => {
                log::error!("tollgate: bad configuration: {e}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        with_engine(&self.engine, self.id, |e, h| e.tick(h));
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        with_engine(&self.engine, self.id, |e, h| e.queue_ready(h, queue_id));
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            id: context_id,
            engine: self.engine.clone(),
            done: false,
            watch_body: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    id: u32,
    engine: Shared,
    done: bool,
    /// The engine reads this response's body (a usage rule's `body_field`).
    watch_body: bool,
}

impl Request {
    fn finish(&mut self) {
        if !std::mem::replace(&mut self.done, true) {
            with_engine(&self.engine, self.id, |e, h| e.done(h, self.id));
        }
    }
}

impl Context for Request {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, _: usize) {
        let (status, bytes) = host::call_response(headers, body);
        with_engine(&self.engine, self.id, |e, h| {
            e.call_response(h, self.id, token, status, &bytes)
        });
    }

    fn on_done(&mut self) -> bool {
        self.finish();
        true
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        self.finish();
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let action = with_engine(&self.engine, self.id, |e, h| {
            e.request_headers(h, self.id, &HostRequest)
        });
        match action {
            Some(engine::Action::Pause) => Action::Pause,
            Some(engine::Action::Continue) | None => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        let view = HostResponse::headers();
        self.watch_body = with_engine(&self.engine, self.id, |e, h| {
            e.response_headers(h, self.id, &view)
        })
        .unwrap_or(false);
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.watch_body {
            // Only looked at: every chunk goes on at once, nothing is buffered.
            let chunk = host::response_body(size);
            with_engine(&self.engine, self.id, |e, h| {
                e.response_body(h, self.id, &chunk, end_of_stream)
            });
            self.watch_body = !end_of_stream;
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _: usize) -> Action {
        let view = HostResponse::trailers();
        with_engine(&self.engine, self.id, |e, h| {
            e.response_trailers(h, self.id, &view)
        });
        Action::Continue
    }
}

/// The Higress build's callback for Redis callouts. The proxy-wasm SDK does not know it, so the
/// module exports it here: Higress calls it on the root context that made the call (Redis calls
/// are root-level), and it goes to that root's engine like an HTTP callout's answer.
#[cfg(feature = "redis-callout")]
mod redis_callout {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use super::{with_engine, Shared};
    use crate::backend::resp;
    use crate::host;

    thread_local! {
        /// This VM's root contexts and their engines.
        static ROOTS: RefCell<HashMap<u32, Shared>> = RefCell::new(HashMap::new());
    }

    pub fn register(id: u32, engine: &Shared) {
        ROOTS.with(|r| r.borrow_mut().insert(id, engine.clone()));
    }

    /// `proxy_on_redis_call_response(context_id, token, status, response_size)`: status 0 is a
    /// reply (possibly a Redis error) of `response_size` bytes in buffer 9; any other status
    /// (NetworkError) means no reply.
    #[no_mangle]
    pub extern "C" fn proxy_on_redis_call_response(
        context_id: u32,
        token: u32,
        status: u32,
        response_size: u32,
    ) {
        let size = usize::try_from(response_size).unwrap_or(usize::MAX);
        let status = resp::host_status(status, size);
        let bytes = if status == resp::REPLY {
            host::redis_reply(size)
        } else {
            Vec::new()
        };
        let Some(engine) = ROOTS.with(|r| r.borrow().get(&context_id).cloned()) else {
            return;
        };
        with_engine(&engine, context_id, |e, h| {
            e.call_response(h, context_id, token, status, &bytes)
        });
    }
}
