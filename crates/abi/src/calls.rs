//! Safe wrappers of the proxy-wasm ABI 0.2.1's host functions, one per import tollgate uses.
//!
//! Invariant: no wrapper panics, whatever the host answers: each returns its status as a typed
//! `Result` (`Status` names what failed), every pointer it passes describes a live buffer for the
//! call's duration, and every buffer the host hands back is taken by `module::take`.

use crate::imports as raw;
use crate::module::take;
use crate::{BufferType, LogLevel, MapType, MetricType, Status, StreamType};

/// `proxy_send_local_response`'s gRPC status for "none".
const NO_GRPC_STATUS: i32 = -1;

pub fn log(level: LogLevel, message: &str) -> Result<(), Status> {
    // SAFETY: pointer/length of a live string.
    Status::check(unsafe { raw::proxy_log(level.raw(), message.as_ptr(), message.len()) })
}

/// The level the host logs this module's messages at.
pub fn log_level() -> Result<LogLevel, Status> {
    let mut level = 0u32;
    // SAFETY: the host writes one u32 to a live local.
    Status::check(unsafe { raw::proxy_get_log_level(&mut level) })?;
    Ok(LogLevel::from_raw(level))
}

/// Wall-clock time in nanoseconds since the Unix epoch.
pub fn now_ns() -> Result<u64, Status> {
    let mut t = 0u64;
    // SAFETY: the host writes one u64 to a live local.
    Status::check(unsafe { raw::proxy_get_current_time_nanoseconds(&mut t) })?;
    Ok(t)
}

/// Ticks the current root context every `period_ms` (0: no more ticks).
pub fn set_tick_period_ms(period_ms: u32) -> Result<(), Status> {
    // SAFETY: plain integer argument.
    Status::check(unsafe { raw::proxy_set_tick_period_milliseconds(period_ms) })
}

/// Makes `ctx` the context the following host calls act for (BadArgument: it is gone).
pub fn set_effective_context(ctx: u32) -> Result<(), Status> {
    // SAFETY: plain integer argument.
    Status::check(unsafe { raw::proxy_set_effective_context(ctx) })
}

/// Up to `max` bytes of buffer `kind` from `start`.
pub fn buffer(kind: BufferType, start: usize, max: usize) -> Result<Vec<u8>, Status> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: the host writes a pointer and a size to live locals; see `take`.
    unsafe {
        let status = raw::proxy_get_buffer_bytes(kind as u32, start, max, &mut data, &mut size);
        take(status, data, size)
    }
}

/// The first value of header `name` in map `map`.
pub fn header(map: MapType, name: &str) -> Result<Vec<u8>, Status> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: as `buffer`; the name outlives the call.
    unsafe {
        let status = raw::proxy_get_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            &mut data,
            &mut size,
        );
        take(status, data, size)
    }
}

/// Every header of map `map`, in the proxy-wasm map encoding (a u32 pair count, each name's and
/// value's u32 length, then each NUL-terminated).
pub fn header_pairs(map: MapType) -> Result<Vec<u8>, Status> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: as `buffer`.
    unsafe {
        let status = raw::proxy_get_header_map_pairs(map as u32, &mut data, &mut size);
        take(status, data, size)
    }
}

pub fn add_header(map: MapType, name: &str, value: &str) -> Result<(), Status> {
    // SAFETY: pointer/length pairs of live strings.
    Status::check(unsafe {
        raw::proxy_add_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Sets header `name` of map `map` to `value`, replacing every line of it.
pub fn replace_header(map: MapType, name: &str, value: &str) -> Result<(), Status> {
    // SAFETY: pointer/length pairs of live strings.
    Status::check(unsafe {
        raw::proxy_replace_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// An attribute by its serialized path (each segment followed by a NUL).
pub fn property(serialized_path: &[u8]) -> Result<Vec<u8>, Status> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: as `buffer`; the path outlives the call.
    unsafe {
        let status = raw::proxy_get_property(
            serialized_path.as_ptr(),
            serialized_path.len(),
            &mut data,
            &mut size,
        );
        take(status, data, size)
    }
}

/// Sets property `path` of the effective context's stream to `value`. Envoy keeps it as the
/// stream's filter state `wasm.<path>` (a byte string, for the filter chain's life: access logs
/// print it with `%FILTER_STATE(wasm.<path>:PLAIN)%`), replacing an earlier value; NotFound when
/// the effective context has no stream (a root context). The path goes as it is: one segment,
/// no NUL.
pub fn set_property(path: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: pointer/length pairs of live buffers.
    Status::check(unsafe {
        raw::proxy_set_property(path.as_ptr(), path.len(), value.as_ptr(), value.len())
    })
}

/// Lets the paused stream of the effective context go on.
pub fn continue_stream(stream: StreamType) -> Result<(), Status> {
    // SAFETY: plain integer argument.
    Status::check(unsafe { raw::proxy_continue_stream(stream as u32) })
}

/// A local reply; `headers` in the proxy-wasm map encoding; a gRPC status for gRPC requests
/// (one that does not fit the ABI's i32 is sent as none).
pub fn send_local_response(
    status: u32,
    details: &[u8],
    body: &[u8],
    headers: &[u8],
    grpc_status: Option<u32>,
) -> Result<(), Status> {
    let grpc = grpc_status
        .and_then(|s| i32::try_from(s).ok())
        .unwrap_or(NO_GRPC_STATUS);
    // SAFETY: every pointer/length pair describes a live buffer for the call's duration.
    Status::check(unsafe {
        raw::proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            grpc,
        )
    })
}

/// A shared-data value and its CAS; `(None, 0)` when the key is absent. An empty value reads as
/// absent, as in the SDK (the host hands over no buffer for it).
pub fn shared_data(key: &str) -> Result<(Option<Vec<u8>>, u32), Status> {
    let (mut data, mut size, mut cas) = (std::ptr::null_mut(), 0usize, 0u32);
    // SAFETY: as `buffer`; the key outlives the call.
    let status = unsafe {
        raw::proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas)
    };
    // SAFETY: what the host wrote for this call.
    match unsafe { take(status, data, size) } {
        Ok(value) => Ok((Some(value).filter(|v| !v.is_empty()), cas)),
        Err(Status::NotFound) => Ok((None, 0)),
        Err(other) => Err(other),
    }
}

/// Sets a shared-data value; `cas` 0 sets it unconditionally (CasMismatch: it changed since).
pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> Result<(), Status> {
    // SAFETY: pointer/length pairs of live buffers.
    Status::check(unsafe {
        raw::proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
    })
}

/// Registers a shared queue this VM's context is called for (`proxy_on_queue_ready`); its id.
pub fn register_queue(name: &str) -> Result<u32, Status> {
    let mut id = 0u32;
    // SAFETY: the name outlives the call; the host writes one u32 to `id`.
    Status::check(unsafe { raw::proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

pub fn enqueue(queue: u32, message: &[u8]) -> Result<(), Status> {
    // SAFETY: the message outlives the call.
    Status::check(unsafe {
        raw::proxy_enqueue_shared_queue(queue, message.as_ptr(), message.len())
    })
}

/// The next message on `queue` (Empty: there is none; NotFound: the queue is gone).
pub fn dequeue(queue: u32) -> Result<Vec<u8>, Status> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: as `buffer`.
    unsafe {
        let status = raw::proxy_dequeue_shared_queue(queue, &mut data, &mut size);
        take(status, data, size)
    }
}

/// An HTTP callout to `cluster`, without trailers; `headers` in the proxy-wasm map encoding;
/// `timeout_ms` 0 means none; a longer one than i32::MAX is the longest Envoy takes (its
/// `Context::httpCall` reads the timeout as an `int` and refuses a negative one with BadArgument).
/// The token its answer will come with.
pub fn http_call(
    cluster: &str,
    headers: &[u8],
    body: &[u8],
    timeout_ms: u64,
) -> Result<u32, Status> {
    // The encoding of an empty map (no trailers): its pair count, 0.
    let no_trailers = [0u8; 4];
    let timeout = u32::try_from(timeout_ms.min(i32::MAX as u64)).unwrap_or(u32::MAX >> 1);
    let mut token = 0u32;
    // SAFETY: every pointer/length pair describes a live buffer; the host writes one u32.
    Status::check(unsafe {
        raw::proxy_http_call(
            cluster.as_ptr(),
            cluster.len(),
            headers.as_ptr(),
            headers.len(),
            body.as_ptr(),
            body.len(),
            no_trailers.as_ptr(),
            no_trailers.len(),
            timeout,
            &mut token,
        )
    })?;
    Ok(token)
}

/// Defines (or finds: workers defining the same name share one) a custom metric; its id.
pub fn define_metric(kind: MetricType, name: &str) -> Result<u32, Status> {
    let mut id = 0u32;
    // SAFETY: the name outlives the call; the host writes one u32 to `id`.
    Status::check(unsafe {
        raw::proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id)
    })?;
    Ok(id)
}

pub fn increment_metric(id: u32, by: i64) -> Result<(), Status> {
    // SAFETY: plain integer arguments.
    Status::check(unsafe { raw::proxy_increment_metric(id, by) })
}

pub fn record_metric(id: u32, value: u64) -> Result<(), Status> {
    // SAFETY: plain integer arguments.
    Status::check(unsafe { raw::proxy_record_metric(id, value) })
}
