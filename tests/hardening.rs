//! Attacks and sick backends through real Envoy, Webdis and Redis: a client that tries to lower its
//! cost, a Redis that answers every script with OOM (the proxy must stop hammering it, and enforce
//! again once it heals), and a gRPC client being limited (it must be told RESOURCE_EXHAUSTED, not
//! UNAVAILABLE, which gRPC clients retry at once).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::envoy::stat_in;
use common::stack::Stack;
use common::webdis::WebdisOpts;

/// `cost: 10`, `burst: 100`, a cost header: a client saying `x-cost: 1` still pays 10.
#[test]
fn the_cost_header_cannot_lower_the_cost() {
    let cfg = r#"{ "backend": { "timeout_ms": 2000 },
        "rules": [ { "name": "c", "key": ["header:x-user-id"], "rate": 1, "period_ms": 60000,
                     "burst": 100, "cost": 10, "cost_header": "x-cost" } ] }"#;
    let stack = Stack::start("hard-cost", cfg);
    let admitted = (0..40)
        .filter(|_| {
            let r = stack.get("/api/x", &[("x-user-id", "mallory"), ("x-cost", "1")]);
            r.status == 200
        })
        .count();
    assert_eq!(admitted, 10, "{}", stack.logs());
    eprintln!("cost floor: x-cost: 1 against cost 10, burst 100: {admitted} of 40 admitted");
}

/// Redis with `maxmemory 1` + `noeviction` rejects every script with OOM: the breaker opens after
/// `breaker_failures` calls, so the proxy stops sending them; once Redis has memory again the
/// probe succeeds and the rule is enforced by the global bucket again.
#[test]
fn an_oom_redis_opens_the_breaker_and_enforcement_resumes_when_it_heals() {
    let cfg = r#"{ "failure_mode": "closed",
        "backend": { "timeout_ms": 2000, "breaker_failures": 5, "breaker_cooloff_ms": 1000 },
        "rules": [ { "name": "r", "key": ["header:x-user-id"], "rate": 1, "period_ms": 60000,
                     "burst": 3 } ] }"#;
    let stack = Stack::start_with(
        "hard-oom",
        cfg,
        &["--maxmemory", "1", "--maxmemory-policy", "noeviction"],
        &WebdisOpts::default(),
    );
    let statuses: Vec<u16> = (0..200)
        .map(|_| stack.get("/api/x", &[("x-user-id", "ann")]).status)
        .collect();
    assert!(
        statuses.iter().all(|s| *s == 503),
        "{statuses:?}\n{}",
        stack.logs()
    );
    let calls_and_overloaded = |stats: &str| {
        (
            stat_in(stats, "wasmcustom.tollgate.r.backend_calls").unwrap_or(0),
            stat_in(stats, "wasmcustom.tollgate.r.backend_error.overloaded").unwrap_or(0),
        )
    };
    // Once the 200 decisions (failure_mode closed: each in `denied`) and the calls are counted.
    let stats = stack.envoy.stats_when(|s| {
        let (calls, overloaded) = calls_and_overloaded(s);
        common::envoy::decided_in(s, "r") == 200 && overloaded + 1 == calls
    });
    let (calls, overloaded) = calls_and_overloaded(&stats);
    // Five failures open it; at most one probe per second of the run follows.
    assert!(
        calls <= 10,
        "{calls} calls for 200 requests\n{}",
        stack.logs()
    );
    // Every call failed with OOM, but the first EVALSHA (NOSCRIPT, answered by sending EVAL).
    assert_eq!(overloaded + 1, calls, "{}", stack.logs());
    let log = stack.envoy.log_text();
    assert_eq!(
        log.matches("backend error (overloaded)").count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("circuit open").count(), 1);
    eprintln!(
        "OOM Redis: 200 requests, {calls} script calls, all answered 503 (failure_mode closed)"
    );

    // Heal Redis; the next probe (within a cool-off) closes the breaker.
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{}/", stack.redis.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query(&mut c)
        .unwrap();
    let healed = Instant::now();
    let deadline = healed + Duration::from_secs(10);
    while stack.get("/api/x", &[("x-user-id", "ann")]).status != 200 {
        assert!(Instant::now() < deadline, "never resumed\n{}", stack.logs());
        std::thread::sleep(Duration::from_millis(20)); // polling the proxy, not a fixed wait
    }
    let resumed = healed.elapsed();
    // Enforced again by the global bucket: the burst, then 429 (not 503).
    let after: Vec<u16> = (0..4)
        .map(|_| stack.get("/api/x", &[("x-user-id", "ann")]).status)
        .collect();
    assert_eq!(after, [200, 200, 429, 429], "{}", stack.logs());
    assert!(stack.envoy.log_text().contains("circuit closed"));
    eprintln!(
        "OOM Redis healed: enforcement resumed after {} ms",
        resumed.as_millis()
    );
}

/// A denied gRPC request (curl speaking h2c with `content-type: application/grpc`) gets HTTP 200
/// with `grpc-status: 8` and the rate-limit headers.
#[test]
fn a_limited_grpc_client_is_told_resource_exhausted() {
    let cfg = r#"{ "backend": { "timeout_ms": 2000 },
        "rules": [ { "name": "g", "key": ["header:x-user-id"], "rate": 1, "period_ms": 60000,
                     "burst": 1 } ] }"#;
    let stack = Stack::start("hard-grpc", cfg);
    let call = || {
        let out = Command::new("curl")
            .args(["-s", "-i", "--http2-prior-knowledge", "-X", "POST"])
            .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
            .args(["-H", "x-user-id: grpc-client", "--data-binary", ""])
            .arg(format!(
                "http://127.0.0.1:{}/api/pkg.Svc/Method",
                stack.port()
            ))
            .output()
            .expect("curl (make setup installs it)");
        String::from_utf8_lossy(&out.stdout).to_lowercase()
    };
    let first = call();
    assert!(!first.contains("grpc-status: 8"), "{first}");
    let denied = call();
    assert!(
        denied.starts_with("http/2 200"),
        "{denied}\n{}",
        stack.logs()
    );
    assert!(denied.contains("grpc-status: 8"), "{denied}");
    assert!(denied.contains("grpc-message: rate limited"), "{denied}");
    assert!(denied.contains("ratelimit: \"g\";r=0"), "{denied}");
    assert!(denied.contains("retry-after:"), "{denied}");
}
