//! The proxy-wasm ABI (0.2.1), written out here instead of taken from the proxy-wasm SDK.
//!
//! Why: the host calls a callback only if the module exports it (proxy-wasm-cpp-host checks each
//! one), and every call into the VM costs Envoy a crossing. The SDK exports all of them, so
//! Envoy called it for each request's log and done events and for every request body chunk and
//! trailer, which tollgate never needs. `filter` exports exactly the callbacks tollgate uses.
//! It also means no host call can panic the VM: every status is a plain `u32` the caller handles
//! (the SDK's wrappers panic on statuses they do not expect, and its logger on a failed log).
//!
//! Invariant: every import returns its status as a `u32`; the wrappers below turn it into an
//! `Option`/`Result` and never panic. Buffers the host returns were allocated by this module's
//! `proxy_on_memory_allocate` and are taken back as a `Vec<u8>` of exactly that capacity.

/// Envoy's `WasmResult::Ok`.
pub const OK: u32 = 0;
/// `WasmResult::NotFound`.
pub const NOT_FOUND: u32 = 1;
/// `WasmResult::CasMismatch`.
pub const CAS_MISMATCH: u32 = 8;

/// `WasmHeaderMapType`.
pub const MAP_REQUEST_HEADERS: u32 = 0;
pub const MAP_RESPONSE_HEADERS: u32 = 2;
pub const MAP_RESPONSE_TRAILERS: u32 = 3;
pub const MAP_CALL_RESPONSE_HEADERS: u32 = 6;

/// `WasmBufferType`.
pub const BUFFER_RESPONSE_BODY: u32 = 1;
pub const BUFFER_CALL_RESPONSE_BODY: u32 = 4;
pub const BUFFER_PLUGIN_CONFIGURATION: u32 = 7;

/// `WasmStreamType::Request`.
pub const STREAM_REQUEST: u32 = 0;

/// `MetricType`.
pub const METRIC_COUNTER: u32 = 0;
pub const METRIC_GAUGE: u32 = 1;
pub const METRIC_HISTOGRAM: u32 = 2;

/// What a stream callback tells the host.
pub const ACTION_CONTINUE: u32 = 0;
pub const ACTION_PAUSE: u32 = 1;

#[allow(clashing_extern_declarations)]
mod imports {
    #[link(wasm_import_module = "env")]
    extern "C" {
        pub fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
        pub fn proxy_get_log_level(return_level: *mut u32) -> u32;
        pub fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
        pub fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
        pub fn proxy_set_effective_context(context_id: u32) -> u32;
        pub fn proxy_get_buffer_bytes(
            buffer_type: u32,
            start: usize,
            max_size: usize,
            return_data: *mut *mut u8,
            return_size: *mut usize,
        ) -> u32;
        pub fn proxy_get_header_map_value(
            map_type: u32,
            key_data: *const u8,
            key_size: usize,
            return_data: *mut *mut u8,
            return_size: *mut usize,
        ) -> u32;
        pub fn proxy_get_header_map_pairs(
            map_type: u32,
            return_data: *mut *mut u8,
            return_size: *mut usize,
        ) -> u32;
        pub fn proxy_add_header_map_value(
            map_type: u32,
            key_data: *const u8,
            key_size: usize,
            value_data: *const u8,
            value_size: usize,
        ) -> u32;
        pub fn proxy_replace_header_map_value(
            map_type: u32,
            key_data: *const u8,
            key_size: usize,
            value_data: *const u8,
            value_size: usize,
        ) -> u32;
        pub fn proxy_get_property(
            path_data: *const u8,
            path_size: usize,
            return_data: *mut *mut u8,
            return_size: *mut usize,
        ) -> u32;
        pub fn proxy_continue_stream(stream_type: u32) -> u32;
        pub fn proxy_send_local_response(
            status_code: u32,
            details_data: *const u8,
            details_size: usize,
            body_data: *const u8,
            body_size: usize,
            headers_data: *const u8,
            headers_size: usize,
            grpc_status: i32,
        ) -> u32;
        pub fn proxy_get_shared_data(
            key_data: *const u8,
            key_size: usize,
            return_data: *mut *mut u8,
            return_size: *mut usize,
            return_cas: *mut u32,
        ) -> u32;
        pub fn proxy_set_shared_data(
            key_data: *const u8,
            key_size: usize,
            value_data: *const u8,
            value_size: usize,
            cas: u32,
        ) -> u32;
        pub fn proxy_register_shared_queue(
            name_data: *const u8,
            name_size: usize,
            return_id: *mut u32,
        ) -> u32;
        pub fn proxy_enqueue_shared_queue(
            queue_id: u32,
            value_data: *const u8,
            value_size: usize,
        ) -> u32;
        pub fn proxy_dequeue_shared_queue(
            queue_id: u32,
            return_data: *mut *mut u8,
            return_size: *mut usize,
        ) -> u32;
        pub fn proxy_http_call(
            upstream_data: *const u8,
            upstream_size: usize,
            headers_data: *const u8,
            headers_size: usize,
            body_data: *const u8,
            body_size: usize,
            trailers_data: *const u8,
            trailers_size: usize,
            timeout_ms: u32,
            return_token: *mut u32,
        ) -> u32;
        pub fn proxy_define_metric(
            metric_type: u32,
            name_data: *const u8,
            name_size: usize,
            return_id: *mut u32,
        ) -> u32;
        pub fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
        pub fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    }
}

/// The ABI version this module speaks.
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// The host allocates every buffer it hands the module through this: `size` bytes from the
/// global allocator, taken back later as a `Vec<u8>` of that capacity (`take`). A size the VM
/// cannot allocate answers null, which the host turns into a failed call (the SDK's allocator
/// aborted the VM there).
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    if size == 0 {
        return std::ptr::NonNull::<u8>::dangling().as_ptr();
    }
    match std::alloc::Layout::array::<u8>(size) {
        // SAFETY: a non-zero size, as `alloc` requires.
        Ok(layout) => unsafe { std::alloc::alloc(layout) },
        Err(_) => std::ptr::null_mut(),
    }
}

#[cfg(target_os = "wasi")]
extern "C" {
    fn __wasm_call_ctors();
}

/// Reactor start: runs the module's static constructors (wasi-libc's among them).
#[no_mangle]
pub extern "C" fn _initialize() {
    #[cfg(target_os = "wasi")]
    // SAFETY: called once by the host before any other export, as the reactor model requires.
    unsafe {
        __wasm_call_ctors();
    }
}

/// Takes back a buffer the host allocated with `proxy_on_memory_allocate`; None for a status
/// other than Ok, Some(empty) for Ok without data.
///
/// # Safety
/// `data`/`size` must be what the host wrote for a call that answered `status`.
unsafe fn take(status: u32, data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if status != OK {
        return None;
    }
    if data.is_null() {
        return Some(Vec::new());
    }
    // SAFETY: see above: `size` bytes of the global allocator's with alignment 1
    // (`proxy_on_memory_allocate`), filled by the host: a `Vec<u8>` of capacity `size`.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

pub fn log(level: u32, message: &str) {
    // SAFETY: pointer/length of a live string.
    let _ = unsafe { imports::proxy_log(level, message.as_ptr(), message.len()) };
}

/// Envoy's log level for wasm (0 trace … 5 critical, 6 off); None if the host would not say.
pub fn log_level() -> Option<u32> {
    let mut level = 0u32;
    // SAFETY: the host writes one u32 to a live local.
    (unsafe { imports::proxy_get_log_level(&mut level) } == OK).then_some(level)
}

/// Wall-clock time in nanoseconds since the Unix epoch.
pub fn now_ns() -> Option<u64> {
    let mut t = 0u64;
    // SAFETY: the host writes one u64 to a live local.
    (unsafe { imports::proxy_get_current_time_nanoseconds(&mut t) } == OK).then_some(t)
}

pub fn set_tick_period_ms(period: u32) -> u32 {
    // SAFETY: plain integer argument.
    unsafe { imports::proxy_set_tick_period_milliseconds(period) }
}

pub fn set_effective_context(ctx: u32) -> u32 {
    // SAFETY: plain integer argument.
    unsafe { imports::proxy_set_effective_context(ctx) }
}

/// Up to `max` bytes of buffer `kind` from `start`.
pub fn buffer(kind: u32, start: usize, max: usize) -> Option<Vec<u8>> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: the host writes a pointer and a size to live locals; see `take`.
    unsafe {
        let status = imports::proxy_get_buffer_bytes(kind, start, max, &mut data, &mut size);
        take(status, data, size)
    }
}

/// The first value of header `name` in map `map`.
pub fn header(map: u32, name: &str) -> Option<Vec<u8>> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: as `buffer`; the name outlives the call.
    unsafe {
        let status = imports::proxy_get_header_map_value(
            map,
            name.as_ptr(),
            name.len(),
            &mut data,
            &mut size,
        );
        take(status, data, size)
    }
}

/// Every header of map `map`, in the proxy-wasm map encoding (a u32 pair count, each name's and value's u32 length, then each NUL-terminated).
pub fn header_pairs(map: u32) -> Option<Vec<u8>> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: as `buffer`.
    unsafe {
        let status = imports::proxy_get_header_map_pairs(map, &mut data, &mut size);
        take(status, data, size)
    }
}

pub fn add_header(map: u32, name: &str, value: &str) -> u32 {
    // SAFETY: pointer/length pairs of live strings.
    unsafe {
        imports::proxy_add_header_map_value(
            map,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    }
}

/// Sets header `name` of map `map` to `value`, replacing every line of it.
pub fn replace_header(map: u32, name: &str, value: &str) -> u32 {
    // SAFETY: pointer/length pairs of live strings.
    unsafe {
        imports::proxy_replace_header_map_value(
            map,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    }
}

/// An attribute by its serialized path (each segment followed by a NUL).
pub fn property(serialized_path: &[u8]) -> Option<Vec<u8>> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: as `buffer`; the path outlives the call.
    unsafe {
        let status = imports::proxy_get_property(
            serialized_path.as_ptr(),
            serialized_path.len(),
            &mut data,
            &mut size,
        );
        take(status, data, size)
    }
}

pub fn continue_request() -> u32 {
    // SAFETY: plain integer argument.
    unsafe { imports::proxy_continue_stream(STREAM_REQUEST) }
}

/// A local reply; `headers` in the proxy-wasm map encoding, `grpc_status` -1 for none.
pub fn send_local_response(
    status: u32,
    details: &[u8],
    body: &[u8],
    headers: &[u8],
    grpc_status: i32,
) -> u32 {
    // SAFETY: every pointer/length pair describes a live buffer for the call's duration.
    unsafe {
        imports::proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            grpc_status,
        )
    }
}

/// A shared-data value and its CAS; Ok((None, 0)) when the key is absent.
pub fn shared_data(key: &str) -> Result<(Option<Vec<u8>>, u32), u32> {
    let (mut data, mut size, mut cas) = (std::ptr::null_mut(), 0usize, 0u32);
    // SAFETY: as `buffer`; the key outlives the call.
    let status = unsafe {
        imports::proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas)
    };
    match status {
        // SAFETY: Ok: the host handed over `data`/`size`. An empty value reads as absent, as in
        // the SDK (the host hands over no buffer for it).
        OK => Ok((
            unsafe { take(OK, data, size) }.filter(|v| !v.is_empty()),
            cas,
        )),
        NOT_FOUND => Ok((None, 0)),
        other => Err(other),
    }
}

/// Sets a shared-data value; `cas` 0 sets it unconditionally.
pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> u32 {
    // SAFETY: pointer/length pairs of live buffers.
    unsafe {
        imports::proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
    }
}

pub fn register_queue(name: &str) -> Option<u32> {
    let mut id = 0u32;
    // SAFETY: the name outlives the call; the host writes one u32 to `id`.
    let status =
        unsafe { imports::proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) };
    (status == OK).then_some(id)
}

pub fn enqueue(queue: u32, message: &[u8]) -> u32 {
    // SAFETY: the message outlives the call.
    unsafe { imports::proxy_enqueue_shared_queue(queue, message.as_ptr(), message.len()) }
}

/// The next message on `queue`; None when it is empty or gone.
pub fn dequeue(queue: u32) -> Option<Vec<u8>> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: as `buffer`.
    unsafe {
        let status = imports::proxy_dequeue_shared_queue(queue, &mut data, &mut size);
        take(status, data, size).filter(|_| !data.is_null())
    }
}

/// An HTTP callout to `cluster`; `headers` in the proxy-wasm map encoding. The token, or the
/// host's status.
pub fn http_call(cluster: &str, headers: &[u8], body: &[u8], timeout_ms: u32) -> Result<u32, u32> {
    // The encoding of an empty map (no trailers): its pair count, 0.
    let empty = [0u8; 4];
    let mut token = 0u32;
    // SAFETY: every pointer/length pair describes a live buffer; the host writes one u32.
    let status = unsafe {
        imports::proxy_http_call(
            cluster.as_ptr(),
            cluster.len(),
            headers.as_ptr(),
            headers.len(),
            body.as_ptr(),
            body.len(),
            empty.as_ptr(),
            empty.len(),
            timeout_ms,
            &mut token,
        )
    };
    if status == OK {
        Ok(token)
    } else {
        Err(status)
    }
}

pub fn define_metric(kind: u32, name: &str) -> Result<u32, u32> {
    let mut id = 0u32;
    // SAFETY: the name outlives the call; the host writes one u32 to `id`.
    let status = unsafe { imports::proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) };
    if status == OK {
        Ok(id)
    } else {
        Err(status)
    }
}

pub fn increment_metric(id: u32, by: i64) -> u32 {
    // SAFETY: plain integer arguments.
    unsafe { imports::proxy_increment_metric(id, by) }
}

pub fn record_metric(id: u32, value: u64) -> u32 {
    // SAFETY: plain integer arguments.
    unsafe { imports::proxy_record_metric(id, value) }
}

/// The `log` crate's records go to the host's log (nothing is formatted above `log`'s max level).
struct HostLogger;

static LOGGER: HostLogger = HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Trace => 0,
            log::Level::Debug => 1,
            log::Level::Info => 2,
            log::Level::Warn => 3,
            log::Level::Error => 4,
        };
        log(level, &record.args().to_string());
    }

    fn flush(&self) {}
}

/// Sends `log` records to the host, and a panic's message too (before the VM aborts).
pub fn install_logger() {
    if log::set_logger(&LOGGER).is_ok() {
        std::panic::set_hook(Box::new(|info| log(5, &info.to_string())));
    }
}
