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
//!
//! With `hold` (scenario `wasm-floor-hold`) it holds every request behind a callout, the way
//! tollgate's exact mode holds a new key's request, with no logic around it: a worker has at most
//! one callout out (a Webdis `PING`), the requests that arrive meanwhile wait for it and leave
//! together in the next one, and an answer resumes the requests its callout was for. What Envoy
//! spends on it is the price of holding a request for a shared check, whatever the check decides.
//!
//! With `hold-script <sha>` (`make peers`' `wasm-floor-script`) each callout is instead one
//! `EVALSHA` of `minimal_bucket.lua` (loaded by `make peers`, which passes its SHA) for the keys
//! of the requests it is for: the least a shared token bucket per key costs in this architecture
//! (a held request, a batched Webdis callout, one script run), without tollgate's own work. Its
//! key is `floor:` and the hex of the request's `x-user-id` (at most its first 64 bytes).
//!
//! Those two make the request whose context sent a callout wait for the next one too (the SDK
//! hands an answer only to the context that sent it, and that context sends the next): the
//! requests of a worker then move in one wave. With `kept-script <sha>` (`make peers`'
//! `wasm-floor-kept`) the callouts go from the root context instead, so a request waits for no
//! more than the callout out and its own, as tollgate promises: the requests that come while no
//! callout is out leave at the end of the host's round of events (a note on the worker's queue),
//! those that come while one is out leave when it is answered, and an answer resumes exactly the
//! requests it was for. The same script and keys as `hold-script`.

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { mode: Mode::Floor }) });
}}

struct Root {
    mode: Mode,
}

#[derive(Clone, PartialEq, Eq)]
enum Mode {
    Floor,
    /// Configured with `host-calls`.
    HostCalls,
    /// Configured with `hold`, or with `hold-script <sha>` (the script's SHA).
    Hold(Option<Rc<str>>),
    /// Configured with `kept-script <sha>`.
    Kept(Rc<str>),
}

impl Context for Root {
    fn on_http_call_response(&mut self, _: u32, _: usize, body_size: usize, _: usize) {
        let _ = hostcalls::get_buffer(
            proxy_wasm::types::BufferType::HttpCallResponseBody,
            0,
            body_size,
        );
        let done = KEPT.with(|k| {
            let mut k = k.borrow_mut();
            k.out = false;
            std::mem::take(&mut k.flight)
        });
        resume(done);
        self.leave();
    }
}

impl Root {
    /// With `kept-script`: the requests that came while no callout was out, or while the one
    /// answered was, leave in one callout from the root context (its answer comes here).
    fn leave(&self) {
        let Mode::Kept(sha) = &self.mode else {
            return;
        };
        let (flight, keys) = KEPT.with(|k| {
            let mut k = k.borrow_mut();
            (std::mem::take(&mut k.waiting), std::mem::take(&mut k.keys))
        });
        if flight.is_empty() {
            return;
        }
        match get_from_webdis(self, &script_path(sha, &keys)) {
            Ok(_) => KEPT.with(|k| {
                let mut k = k.borrow_mut();
                k.out = true;
                k.flight = flight;
            }),
            Err(_) => resume(flight),
        }
    }
}

impl RootContext for Root {
    fn on_queue_ready(&mut self, queue_id: u32) {
        while let Ok(Some(_)) = hostcalls::dequeue_shared_queue(queue_id) {}
        let idle = KEPT.with(|k| {
            let mut k = k.borrow_mut();
            k.leaving = false;
            !k.out
        });
        if idle {
            self.leave();
        }
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let config =
            hostcalls::get_buffer(proxy_wasm::types::BufferType::PluginConfiguration, 0, 64);
        let config = match config {
            Ok(Some(c)) => c,
            _ => Vec::new(),
        };
        // A script's SHA1 in hex after its word, or the configuration is refused (Envoy does
        // not start).
        let sha = |word: &[u8]| -> Option<Option<Rc<str>>> {
            let sha = config.strip_prefix(word)?.strip_prefix(b" ")?;
            Some(
                (sha.len() == 40 && sha.iter().all(u8::is_ascii_hexdigit))
                    .then(|| String::from_utf8_lossy(sha).into()),
            )
        };
        self.mode = match (config.as_slice(), sha(b"hold-script"), sha(b"kept-script")) {
            (b"host-calls", ..) => Mode::HostCalls,
            (b"hold", ..) => Mode::Hold(None),
            (_, Some(Some(sha)), _) => Mode::Hold(Some(sha)),
            (_, _, Some(Some(sha))) => Mode::Kept(sha),
            (_, Some(None), _) | (_, _, Some(None)) => return false,
            _ => Mode::Floor,
        };
        if matches!(self.mode, Mode::Kept(_)) {
            // A queue of this worker's own: each worker's VM registers one, under a name no
            // other VM draws (a name registered again would go to the later VM).
            use std::hash::{BuildHasher, Hasher};
            let drawn = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish();
            match hostcalls::register_shared_queue(&format!("wasm-floor-{drawn:016x}")) {
                Ok(q) => KEPT.with(|k| k.borrow_mut().queue = q),
                Err(_) => return false,
            }
        }
        true
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Floor and HostCalls are zero-sized types, so boxing them allocates nothing: the floor
        // stays what it was before the other variants existed.
        Some(match &self.mode {
            Mode::Floor => Box::new(Floor),
            Mode::HostCalls => Box::new(HostCalls),
            Mode::Hold(sha) => Box::new(Hold {
                id: context_id,
                sha: sha.clone(),
            }),
            Mode::Kept(_) => Box::new(KeptRequest { id: context_id }),
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

/// The worker's held requests (the VM is per worker: one of these per worker).
#[derive(Default)]
struct Held {
    /// A callout is out.
    out: bool,
    /// The requests the callout out is for.
    flight: Vec<u32>,
    /// The requests that came while it was out: the next callout's.
    waiting: Vec<u32>,
    /// Their bucket keys, with `hold-script` (empty with `hold`).
    keys: Vec<String>,
    /// The request whose context sent the callout out.
    anchor: u32,
}

thread_local! {
    static HELD: RefCell<Held> = RefCell::new(Held::default());
}

/// The hold variant: a request waits for the worker's next callout.
struct Hold {
    id: u32,
    /// With `hold-script`: the SHA of minimal_bucket.lua.
    sha: Option<Rc<str>>,
}

/// The bucket key of a request whose `x-user-id` is `user`: `floor:` and its hex (at most its
/// first 64 bytes), so no request byte reaches the callout's path as it came.
fn bucket_key(user: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut key = String::from("floor:");
    let digit = |n: u8| char::from(HEX.get(usize::from(n)).copied().unwrap_or(b'0'));
    for b in user.iter().take(64) {
        key.push(digit(b >> 4));
        key.push(digit(b & 15));
    }
    key
}

impl Hold {
    /// Sends the callout for `flight` from this request's context (the SDK hands the answer to
    /// the context that sent it, so this request is in `flight` and stays until it comes).
    fn send(&self, flight: Vec<u32>, keys: Vec<String>) -> Result<(), Vec<u32>> {
        // `hold` builds nothing per callout, as before the script variant existed.
        let path: Cow<'static, str> = match &self.sha {
            // Webdis: EVALSHA <sha> <n> <keys> <burst> <rate> <period_ms> (a limit never reached).
            Some(sha) => Cow::Owned(script_path(sha, &keys)),
            None => Cow::Borrowed("/PING"),
        };
        match get_from_webdis(self, &path) {
            Ok(_) => {
                HELD.with(|h| {
                    let mut h = h.borrow_mut();
                    h.out = true;
                    h.anchor = self.id;
                    h.flight = flight;
                });
                Ok(())
            }
            Err(_) => Err(flight),
        }
    }
}

/// A callout `GET <path>` to Webdis (cluster `tollgate_backend`) from context `ctx`, whose
/// `on_http_call_response` gets the answer.
fn get_from_webdis<C: Context + ?Sized>(
    ctx: &C,
    path: &str,
) -> Result<u32, proxy_wasm::types::Status> {
    let headers = vec![
        (":method", "GET"),
        (":path", path),
        (":authority", "webdis"),
    ];
    ctx.dispatch_http_call(
        "tollgate_backend",
        headers,
        None,
        vec![],
        Duration::from_secs(1),
    )
}

/// Webdis: EVALSHA <sha> <n> <keys> <burst> <rate> <period_ms> (a limit never reached).
fn script_path(sha: &str, keys: &[String]) -> String {
    let mut p = format!("/EVALSHA/{sha}/{}", keys.len());
    for k in keys {
        p.push('/');
        p.push_str(k);
    }
    p.push_str("/1000000/1000000/1000");
    p
}

/// The `kept-script` worker state: at most one callout out, sent from the root context.
#[derive(Default)]
struct Kept {
    out: bool,
    /// A note is on the worker's queue: the waiting leave when it comes.
    leaving: bool,
    flight: Vec<u32>,
    waiting: Vec<u32>,
    keys: Vec<String>,
    queue: u32,
}

thread_local! {
    static KEPT: RefCell<Kept> = RefCell::new(Kept::default());
}

/// The `kept-script` variant: a request waits for the callout out, if any, and its own, which
/// leaves at the end of the host's round of events (a note on the worker's queue) or when the
/// callout out is answered; its answer resumes exactly the requests it was for.
struct KeptRequest {
    id: u32,
}

impl Context for KeptRequest {}

impl HttpContext for KeptRequest {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let user = hostcalls::get_map_value(MapType::HttpRequestHeaders, "x-user-id");
        let key = bucket_key(user.ok().flatten().unwrap_or_default().as_bytes());
        let note = KEPT.with(|k| {
            let mut k = k.borrow_mut();
            k.waiting.push(self.id);
            k.keys.push(key);
            let note = !k.out && !k.leaving;
            k.leaving |= note;
            note.then_some(k.queue)
        });
        if let Some(queue) = note {
            if hostcalls::enqueue_shared_queue(queue, Some(b"leave")).is_err() {
                // No note will come: this request goes on unchecked, and the next one tries.
                KEPT.with(|k| {
                    let mut k = k.borrow_mut();
                    k.waiting.pop();
                    k.keys.pop();
                    k.leaving = false;
                });
                return Action::Continue;
            }
        }
        Action::Pause
    }
}

fn resume(ids: impl IntoIterator<Item = u32>) {
    for id in ids {
        if hostcalls::set_effective_context(id).is_ok() {
            let _ = hostcalls::resume_http_request();
        }
    }
}

impl Context for Hold {
    /// A request that sent the callout out and ends first (its client went away) takes the
    /// callout's answer with it: the SDK gives an answer only to the context that sent it. The
    /// others of its flight go on unchecked, and the next request sends a callout for the ones
    /// waiting.
    fn on_done(&mut self) -> bool {
        let orphans = HELD.with(|h| {
            let mut h = h.borrow_mut();
            if h.out && h.anchor == self.id {
                h.out = false;
                std::mem::take(&mut h.flight)
            } else {
                Vec::new()
            }
        });
        resume(orphans.into_iter().filter(|id| *id != self.id));
        true
    }

    fn on_http_call_response(&mut self, _: u32, _: usize, body_size: usize, _: usize) {
        // The answer is read, as tollgate reads its own.
        let _ = hostcalls::get_buffer(
            proxy_wasm::types::BufferType::HttpCallResponseBody,
            0,
            body_size,
        );
        let (done, mut next, keys) = HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.out = false;
            (
                std::mem::take(&mut h.flight),
                std::mem::take(&mut h.waiting),
                std::mem::take(&mut h.keys),
            )
        });
        if next.is_empty() {
            resume(done);
            return;
        }
        // The next callout leaves from this context, which therefore waits for it too (with
        // no key of its own: it was checked by the callout just answered).
        next.push(self.id);
        match self.send(next, keys) {
            Ok(()) => resume(done.into_iter().filter(|id| *id != self.id)),
            Err(next) => {
                resume(done.into_iter().filter(|id| *id != self.id));
                resume(next);
            }
        }
    }
}

impl HttpContext for Hold {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let user = hostcalls::get_map_value(MapType::HttpRequestHeaders, "x-user-id");
        let key = self
            .sha
            .as_ref()
            .map(|_| bucket_key(user.ok().flatten().unwrap_or_default().as_bytes()));
        let idle = HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.waiting.push(self.id);
            h.keys.extend(key);
            (!h.out).then(|| (std::mem::take(&mut h.waiting), std::mem::take(&mut h.keys)))
        });
        if let Some((flight, keys)) = idle {
            if let Err(flight) = self.send(flight, keys) {
                resume(flight.into_iter().filter(|id| *id != self.id));
                return Action::Continue;
            }
        }
        Action::Pause
    }
}
