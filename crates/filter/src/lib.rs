//! tollgate.wasm: the proxy-wasm filter. `filter` maps the host's callbacks to engine events;
//! `host` carries out the engine's actions over the ABI, `request` reads the stream being called
//! back, `metrics` keeps the Envoy stats and `redis` the worker's Redis client (Higress). All
//! logic is in `tollgate-core`; every host call goes through `tollgate-abi`.
//!
//! Only builds for wasm32: natively there is no host to call.
#![cfg(target_arch = "wasm32")]

mod filter;
mod host;
mod metrics;
mod redis;
mod request;

/// The module's allocator: talc instead of the standard library's dlmalloc. The local path
/// allocates a few dozen small buffers per request (header values, the key, the response
/// headers), and dlmalloc's bookkeeping made allocation most of that path's cost in wasm.
#[global_allocator]
static ALLOCATOR: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();
