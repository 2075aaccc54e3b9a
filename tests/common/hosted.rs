//! Helpers for tests that run tollgate in the proxy-wasm test host (testhost/).

use std::net::SocketAddr;

use tollgate_testhost::Proxy;

/// 127.0.0.1:`port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Asserts the host ran clean: no trap in any VM, no host call it does not model.
pub fn assert_clean(host: &Proxy) {
    assert!(
        host.traps().is_empty(),
        "traps: {:?}\n{}",
        host.traps(),
        host.log_text()
    );
    assert!(
        host.unmodelled().is_empty(),
        "unmodelled host calls: {:?}",
        host.unmodelled()
    );
}
