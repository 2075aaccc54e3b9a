//! tollgate: global token-bucket rate limiting for Envoy / Istio.
//!
//! Everything except `host` and `filter` is plain Rust, tested natively with `cargo test`; those two
//! modules are the only ones that touch proxy-wasm and only build for `wasm32`.
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
pub mod decision;
pub mod headers;
pub mod local;
pub mod metrics;
pub mod rule;

#[cfg(target_arch = "wasm32")]
mod filter;
#[cfg(target_arch = "wasm32")]
mod host;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    filter::start();
}}
