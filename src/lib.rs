//! tollgate: global token-bucket rate limiting for Envoy / Istio.
//!
//! Everything except `abi`, `host` and `filter` is plain Rust, tested natively with `cargo test`;
//! those three are the only ones that touch the proxy-wasm ABI and only build for `wasm32`.
//!
//! A request's path: `filter` (Envoy callbacks) -> `engine` (rules from `config` matched by `rule`,
//! the local stage in `shared`, calls encoded by `backend`, health in `engine::health`) -> `host`
//! (the proxy-wasm calls that carry out what the engine decided).
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod backend;
pub mod bucket;
pub mod config;
pub mod decimal;
pub mod engine;
pub mod headers;
pub mod metrics;
pub mod pairs;
pub mod rule;
pub mod shared;

#[cfg(target_arch = "wasm32")]
mod abi;
#[cfg(target_arch = "wasm32")]
mod filter;
#[cfg(target_arch = "wasm32")]
mod host;

/// The module's allocator: talc instead of the standard library's dlmalloc. The local path
/// allocates a few dozen small buffers per request (header values, the key, the response
/// headers), and dlmalloc's bookkeeping made allocation most of that path's cost in wasm.
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();
