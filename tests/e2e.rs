//! End-to-end tests: real Envoy (V8) running tollgate.wasm, calling Webdis in front of a real Redis.
//! Needs `make setup` (Envoy, Redis, Webdis) and `make build` (the wasm); `make e2e` does both.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{demo_config, Stack};

/// The whole stack starts with the demo config, and a path no rule matches passes straight through.
#[test]
fn smoke_unmatched_path_passes_through() {
    let stack = Stack::start("e2e-smoke", &demo_config());
    let resp = stack.get("/", &[]);
    assert_eq!(resp.status, 200, "{resp:?}\n{}", stack.logs());
    assert_eq!(resp.body, "ok\n", "{resp:?}\n{}", stack.logs());
}
