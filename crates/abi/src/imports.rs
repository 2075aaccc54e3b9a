//! Every host function the module can import, in one place: the proxy-wasm ABI 0.2.1's and
//! Higress' two Redis functions (envoy/higress/ABI.md).
//!
//! Invariant: only the wrappers in this crate call these. An import that nothing in the linked
//! module calls is not imported by the .wasm: the Envoy artifact never calls `proxy_redis_*`, so
//! stock Envoy, which has no such functions, loads it (tests/higress.rs checks both artifacts).

#[allow(clashing_extern_declarations)]
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
    pub fn proxy_set_property(
        path_data: *const u8,
        path_size: usize,
        value_data: *const u8,
        value_size: usize,
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

    /// Higress: configures this worker's Redis client for a cluster (`?param=...` after its name).
    pub fn proxy_redis_init(
        cluster_data: *const u8,
        cluster_size: usize,
        username_data: *const u8,
        username_size: usize,
        password_data: *const u8,
        password_size: usize,
        timeout_ms: u32,
    ) -> u32;
    /// Higress: sends one RESP command; the reply comes as `proxy_on_redis_call_response`.
    pub fn proxy_redis_call(
        cluster_data: *const u8,
        cluster_size: usize,
        query_data: *const u8,
        query_size: usize,
        return_token: *mut u32,
    ) -> u32;
}
