//! The proxy-wasm ABI (0.2.1) and Higress' Redis callouts, written out here instead of taken from
//! the proxy-wasm SDK: docs/adr/0001-own-abi.md says why (the host calls only the callbacks a
//! module exports, and the SDK exports all of them; its host calls and logger panic on statuses
//! they do not expect) and what would make us go back.
//!
//! Invariant: nothing here panics. Every import is declared in `imports` and called only through
//! a wrapper that returns a typed `Result` (`Status` for what failed); the numbers the module
//! sends are the discriminants of closed enums, the numbers it receives decode to a variant or
//! `Unknown(n)`, and every one of them is pinned to the SDK's `types` (Higress' to its ABI
//! document) by the tests in `pinned.rs`. Buffers the host returns were allocated by this
//! module's `proxy_on_memory_allocate` and are taken back as a `Vec<u8>` of exactly that
//! capacity.
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod calls;
pub mod higress;
mod imports;
mod logger;
mod module;
#[cfg(test)]
mod pinned;
mod types;

pub use calls::*;
pub use logger::{filter_for, install_logger, log_filter};
pub use module::{proxy_abi_version_0_2_1, proxy_on_memory_allocate};
pub use types::{Action, BufferType, LogLevel, MapType, MetricType, Status, StreamType, NO_PARENT};
