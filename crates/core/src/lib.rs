//! tollgate's core: global token-bucket rate limiting for Envoy / Istio / Higress, as plain Rust.
//!
//! Nothing here touches the proxy-wasm host: the filter crate turns the host's callbacks into
//! engine events and carries out the engine's actions through [`engine::Host`], and every branch of
//! a request's flow runs natively under `cargo test`.
//!
//! A request's path: `engine` (rules from `config` matched by `rule`, the local stage in `shared`,
//! calls encoded by `backend`, health in `engine::health`) -> the `Host` the filter implements.
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
pub mod property;
pub mod rule;
pub mod shared;
