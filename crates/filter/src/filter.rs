//! The module's exported callbacks: maps the host's events to engine events, nothing else.
//!
//! Only the callbacks tollgate uses are exported (see `abi`): context creation, configuration,
//! ticks, queue messages, callout answers, request and response headers, response body (a usage
//! rule's `body_field`; a chunk no rule watches returns at once, and of a watched one only the part
//! its readers look at is copied in) and trailers (a usage header may come there), and deletion;
//! in the Higress artifact also Redis callout answers. A request's end is its context's deletion:
//! Envoy calls `proxy_on_delete` right after `proxy_on_done` (`Context::onDestroy`), so the done
//! and log events, which would cost a crossing each, are not exported; a usage the response had
//! not reported by then is settled there.
//!
//! Invariant: each worker's root context owns one `Engine`; an HTTP context is only its id, the
//! root it belongs to and how much of its response body is looked at, so all request state lives
//! in the engine. Every callback that concerns a request reaches the engine (headers, call
//! answers, response headers, body, trailers, the end of the stream).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::host::{self, WasmHost};
use crate::metrics::HostMetrics;
use crate::redis;
use crate::request::HostView;
use tollgate_abi::{self as abi, Action};
use tollgate_core::config::{Artifact, Config, Protocol};
use tollgate_core::engine::{self, Chunk, Engine, Host, Look, Plugin};

type Shared = Rc<RefCell<Option<Engine>>>;

/// The artifact this build is: what its configuration may name as the backend.
const ARTIFACT: Artifact = if cfg!(feature = "higress") {
    Artifact::Higress
} else {
    Artifact::Envoy
};

/// An HTTP context: the engine of the root it was created under.
struct Stream {
    engine: Shared,
    /// How much of each chunk of this response's body the engine looks at, if it reads the body
    /// (a usage rule's `body_field`).
    body: Option<Look>,
}

#[derive(Default)]
struct Contexts {
    /// Root contexts (one per plugin configuration in this VM; usually one) and their engines.
    roots: Vec<(u32, Shared)>,
    streams: HashMap<u32, Stream, engine::ById>,
}

thread_local! {
    static CONTEXTS: RefCell<Contexts> = RefCell::new(Contexts::default());
}

/// The engine context `ctx` (a root or an HTTP context) belongs to.
fn engine_of(ctx: u32) -> Option<Shared> {
    CONTEXTS.with(|c| {
        let c = c.try_borrow().ok()?;
        if let Some(s) = c.streams.get(&ctx) {
            return Some(s.engine.clone());
        }
        c.roots
            .iter()
            .find(|(id, _)| *id == ctx)
            .map(|(_, e)| e.clone())
    })
}

/// Runs `f` on the engine of `ctx` with a host for that context (nothing if unknown,
/// unconfigured or busy).
fn with_engine<T>(ctx: u32, f: impl FnOnce(&mut Engine, &mut WasmHost) -> T) -> Option<T> {
    let engine = engine_of(ctx)?;
    let Ok(mut slot) = engine.try_borrow_mut() else {
        log::error!("tollgate: engine busy in a re-entrant callback (context {ctx})");
        return None;
    };
    let e = slot.as_mut()?;
    Some(f(e, &mut WasmHost::new(ctx)))
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(ctx: u32, parent: u32) {
    let _ = CONTEXTS.with(|c| {
        let mut c = c.try_borrow_mut().ok()?;
        if parent == abi::NO_PARENT {
            if c.roots.is_empty() {
                abi::install_logger();
                log::set_max_level(abi::log_filter());
            }
            c.roots.retain(|(id, _)| *id != ctx);
            c.roots.push((ctx, Rc::new(RefCell::new(None))));
        } else {
            let engine = c.roots.iter().find(|(id, _)| *id == parent)?.1.clone();
            c.streams.insert(ctx, Stream { engine, body: None });
        }
        Some(())
    });
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(ctx: u32, _size: u32) -> bool {
    log::set_max_level(abi::log_filter());
    let Some(shared) = engine_of(ctx) else {
        return false;
    };
    let config = match Config::parse(&host::plugin_configuration(), ARTIFACT) {
        Ok(config) => config,
        Err(e) => {
            log::error!("tollgate: bad configuration: {e}");
            return false;
        }
    };
    log::info!("tollgate: configured: {}", config.summary());
    if config.backend.protocol == Protocol::Resp {
        redis::configure(&config.backend);
    }
    let metrics = HostMetrics::define(&config);
    let plugin = Plugin::with_metrics(config, Box::new(metrics));
    let queue = host::register_queue(&plugin.ns);
    let Ok(mut slot) = shared.try_borrow_mut() else {
        return false;
    };
    let mut engine = Engine::new(plugin);
    if let Some(q) = queue {
        engine.set_queue(q);
    }
    if let Some(mut old) = slot.take() {
        old.plugin().metrics.flush();
        // The new engine flushes what the old one still owed the backend; the answers to the old
        // one's calls come to this root, so to the new engine, too. What no rule of the new
        // configuration names is left: its buckets are no longer used.
        let pending = old.hand_over(&mut WasmHost::new(ctx), true);
        let _ = engine.adopt(&mut WasmHost::new(ctx), pending);
    }
    *slot = Some(engine);
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(ctx: u32) {
    with_engine(ctx, |e, h| e.tick(h));
}

#[no_mangle]
pub extern "C" fn proxy_on_queue_ready(ctx: u32, queue: u32) {
    with_engine(ctx, |e, h| e.queue_ready(h, queue));
}

/// A callout's answer. The host owns every callout on the root context (proxy-wasm-cpp-host
/// `http_call` runs on `root_context()`), so it comes on the root, even after the request whose
/// callback sent it has ended.
#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(
    ctx: u32,
    token: u32,
    headers: usize,
    body: usize,
    _trailers: usize,
) {
    let answer = host::http_answer(headers, body);
    with_engine(ctx, |e, h| e.call_response(h, token, &answer));
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(ctx: u32, _headers: usize, _end: u32) -> Action {
    match with_engine(ctx, |e, h| {
        e.request_headers(h, ctx.into(), &HostView::request())
    }) {
        Some(engine::Action::Pause) => Action::Pause,
        Some(engine::Action::Continue) | None => Action::Continue,
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(ctx: u32, _headers: usize, end: u32) -> Action {
    // The ABI's flags are u32s (a Rust `bool` parameter would trust the host to send 0 or 1).
    let end = end != 0;
    let view = HostView::response_headers();
    let look = with_engine(ctx, |e, h| e.response_headers(h, ctx.into(), &view)).flatten();
    if look.is_some() {
        if end {
            // No body follows: the readers see it end empty.
            with_engine(ctx, |e, h| {
                e.response_body(h, ctx.into(), Chunk::whole(&[]), true)
            });
        } else {
            with_stream(ctx, |s| s.body = look);
        }
    }
    Action::Continue
}

/// Runs `f` on HTTP context `ctx`'s entry, if there is one.
fn with_stream<T>(ctx: u32, f: impl FnOnce(&mut Stream) -> T) -> Option<T> {
    CONTEXTS.with(|c| c.try_borrow_mut().ok()?.streams.get_mut(&ctx).map(f))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(ctx: u32, size: usize, end: u32) -> Action {
    let end = end != 0;
    let look = with_stream(ctx, |s| if end { s.body.take() } else { s.body }).flatten();
    // Only looked at: every chunk goes on at once, nothing is buffered.
    if let Some(look) = look {
        let (skipped, len) = look.part(size);
        match host::response_body(skipped, len) {
            Some(bytes) => with_engine(ctx, |e, h| {
                e.response_body(
                    h,
                    ctx.into(),
                    Chunk {
                        skipped,
                        bytes: &bytes,
                    },
                    end,
                )
            }),
            None => with_engine(ctx, |e, h| e.response_body_lost(h, ctx.into(), end)),
        };
    }
    Action::Continue
}

/// Response trailers: a usage header may come there, and the body (if watched) has ended.
#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(ctx: u32, _trailers: usize) -> Action {
    with_stream(ctx, |s| s.body = None);
    let view = HostView::response_trailers();
    with_engine(ctx, |e, h| e.response_trailers(h, ctx.into(), &view));
    Action::Continue
}

/// A context is gone: a request's end (the engine forgets it), or a root's (its plugin is
/// removed or replaced, or the VM stops: the counts its engine has not pushed yet go to Envoy
/// first, and the settlements it has not flushed go to another root of this VM, if one lives on;
/// this is an ordinary callback, so host calls still work).
#[no_mangle]
pub extern "C" fn proxy_on_delete(ctx: u32) {
    let gone = CONTEXTS.with(|c| {
        let mut c = c.try_borrow_mut().ok()?;
        if let Some(s) = c.streams.remove(&ctx) {
            return Some((s.engine, false));
        }
        let at = c.roots.iter().position(|(id, _)| *id == ctx)?;
        Some((c.roots.swap_remove(at).1, true))
    });
    let Some((engine, root)) = gone else {
        return;
    };
    let Ok(mut slot) = engine.try_borrow_mut() else {
        return;
    };
    match slot.as_mut() {
        Some(e) if root => {
            e.plugin().metrics.flush();
            let mut host = WasmHost::new(ctx);
            let pending = e.hand_over(&mut host, false);
            // Envoy keeps a root's tick timer after the root is gone and re-arms it with its
            // last period (`Wasm::tickHandler`): left armed, it would wake the worker for ever.
            // Stopped for this root before another one takes the pending over (and its tick).
            host.set_tick(0);
            hand_to_other_roots(pending, ctx);
        }
        Some(e) => e.done(&mut WasmHost::new(ctx), ctx.into()),
        None => {}
    }
}

/// Gives a deleted root's pending settlements to the other roots of this VM (Envoy configures a
/// plugin's new configuration on a new root before it deletes the old one). Its calls in flight
/// are not handed over: their answers would come to the deleted root, which the host cancels.
fn hand_to_other_roots(mut pending: engine::Pending, deleted: u32) {
    if pending.is_empty() {
        return;
    }
    let total = pending.len();
    let roots = CONTEXTS.with(|c| c.try_borrow().map(|c| c.roots.clone()).unwrap_or_default());
    for (id, shared) in roots {
        let Ok(mut slot) = shared.try_borrow_mut() else {
            continue;
        };
        if let Some(e) = slot.as_mut() {
            pending = e.adopt(&mut WasmHost::for_root_from(id, deleted), pending);
        }
        if pending.is_empty() {
            break;
        }
    }
    log::info!(
        "tollgate: a replaced configuration handed {} of {total} pending usage settlements and \
         relayed checks to the configuration in force",
        total - pending.len()
    );
}

/// The Higress artifact's callback for Redis callouts: Higress calls it on the root context that
/// made the call (Redis calls are root-level), and it goes to that root's engine like an HTTP
/// callout's answer. A reply (possibly a Redis error) comes with `RedisStatus::Ok`; any other
/// status (NetworkError) means none.
#[cfg(feature = "higress")]
#[no_mangle]
pub extern "C" fn proxy_on_redis_call_response(
    ctx: u32,
    token: u32,
    status: u32,
    response_size: u32,
) {
    use tollgate_abi::higress::{redis_reply, RedisStatus};
    let replied = RedisStatus::from_raw(status).replied();
    let size = usize::try_from(response_size).unwrap_or(usize::MAX);
    let mut refused = false;
    let answer = tollgate_core::backend::Answer::redis(replied, size, |n| {
        let reply = redis_reply(n).ok();
        refused = reply
            .as_deref()
            .is_some_and(tollgate_core::backend::resp::refuses_the_client);
        reply
    });
    if refused {
        crate::redis::set_up_again();
    }
    with_engine(ctx, |e, h| e.call_response(h, token, &answer));
}
