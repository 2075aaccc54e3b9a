//! proxy-wasm glue: the root context (configure) and one HTTP context per request, driving the
//! `decision` state machine with host calls from `host`.
//!
//! Invariant: a request paused in `on_http_request_headers` is always resumed or answered — each
//! dispatched call is matched to its check by token, and every callout ends (answer, error,
//! reset or timeout) in `decision::on_reply`.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

use crate::backend::{webdis, BackendError, HttpRequest};
use crate::config::Config;
use crate::decision::{self, Next, Pending, Plugin, Step, Verdict};
use crate::host::{self, HostRequest, HostStore};

pub fn start() {
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { plugin: None }) });
}

struct Root {
    plugin: Option<Rc<Plugin>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        match Config::try_from(host::plugin_configuration().as_slice()) {
            Ok(config) => {
                log::info!("tollgate: configured: {}", config.summary());
                self.plugin = Some(Rc::new(Plugin::new(config)));
                true
            }
            Err(e) => {
                log::error!("tollgate: bad configuration: {e}");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            plugin: self.plugin.clone(),
            pending: None,
            calls: Vec::new(),
            response_headers: Vec::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    /// None only if configure never succeeded (Envoy then refuses the filter anyway).
    plugin: Option<Rc<Plugin>>,
    pending: Option<Pending>,
    /// Outstanding callouts: (token, check index).
    calls: Vec<(u32, usize)>,
    response_headers: Vec<(String, String)>,
}

impl Request {
    /// Sends `req` for check `idx`; a dispatch failure is fed back as that check's answer.
    /// Returns the verdict if that completed the request.
    fn send(&mut self, plugin: &Plugin, idx: usize, req: HttpRequest) -> Option<Verdict> {
        let mut req = req;
        loop {
            let result = host::dispatch(
                &plugin.config.backend.cluster,
                &req,
                plugin.config.backend.timeout_ms,
            );
            let err = match result {
                Ok(token) => {
                    self.calls.push((token, idx));
                    return None;
                }
                Err(e) => e,
            };
            log::warn!("tollgate: {err}");
            match self.answer(plugin, idx, Err(err)) {
                Next::Wait => return None,
                Next::Done(v) => return Some(v),
                Next::Resend(r) => req = r,
            }
        }
    }

    fn answer(
        &mut self,
        plugin: &Plugin,
        idx: usize,
        reply: Result<crate::backend::ScriptReply, BackendError>,
    ) -> Next {
        match self.pending.as_mut() {
            Some(p) => decision::on_reply(plugin, &HostStore, p, idx, reply, host::now_us()),
            None => Next::Wait,
        }
    }

    /// Applies a verdict: keeps headers for the response, or answers now. Returns whether the
    /// request goes on.
    fn apply(&mut self, verdict: Verdict) -> bool {
        self.pending = None;
        match verdict {
            Verdict::Allow { headers } => {
                self.response_headers = headers;
                true
            }
            Verdict::Respond {
                status,
                headers,
                body,
            } => {
                host::send_response(status, &headers, &body);
                false
            }
        }
    }
}

impl Context for Request {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _: usize,
    ) {
        let Some(plugin) = self.plugin.clone() else {
            return;
        };
        let Some(pos) = self.calls.iter().position(|(t, _)| *t == token) else {
            return;
        };
        let (_, idx) = self.calls.swap_remove(pos);
        let (status, body) = host::call_response(num_headers, body_size);
        let reply = webdis::decode_reply(status, &body);
        if let Err(e) = &reply {
            if *e != BackendError::NoScript {
                log::warn!("tollgate: {e}");
            }
        }
        let verdict = match self.answer(&plugin, idx, reply) {
            Next::Wait => None,
            Next::Done(v) => Some(v),
            Next::Resend(req) => self.send(&plugin, idx, req),
        };
        if let Some(v) = verdict {
            if self.apply(v) {
                host::resume_request();
            }
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        match decision::start(&plugin, &HostStore, &HostRequest, host::now_us()) {
            Step::Done(v) => {
                if self.apply(v) {
                    Action::Continue
                } else {
                    Action::Pause
                }
            }
            Step::Call(pending, calls) => {
                self.pending = Some(pending);
                for (idx, req) in calls {
                    if let Some(v) = self.send(&plugin, idx, req) {
                        return if self.apply(v) {
                            Action::Continue
                        } else {
                            Action::Pause
                        };
                    }
                }
                Action::Pause
            }
        }
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        if !self.response_headers.is_empty() {
            host::add_response_headers(&self.response_headers);
        }
        Action::Continue
    }
}
