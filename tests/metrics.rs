//! Metrics end to end: after a known sequence of requests through a real Envoy, `/stats` and
//! `/stats/prometheus` show exactly the expected per-rule counters, the rule as a Prometheus label.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use common::{Envoy, Stack};

const COUNTERS: [&str; 10] = [
    "allowed",
    "denied",
    "shadow_denied",
    "local_allowed",
    "local_denied",
    "backend_calls",
    "backend_errors",
    "failure_mode_allowed",
    "lease_granted",
    "lease_dropped",
];

/// Every counter of `rule` is what `want` says (0 if it does not name it), once the filter has
/// pushed its counts (polled until they all match).
fn assert_counters(envoy: &Envoy, rule: &str, want: &[(&str, u64)]) {
    // Envoy puts custom metrics under its `wasmcustom.` stat namespace.
    let expected = |name: &str| {
        let full = format!("wasmcustom.tollgate.{rule}.{name}");
        let value = want.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v);
        (full, value)
    };
    let stats = envoy.stats_when(|stats| {
        COUNTERS.iter().all(|name| {
            let (full, value) = expected(name);
            common::envoy::stat_in(stats, &full) == Some(value)
        })
    });
    for name in COUNTERS {
        let (full, expected) = expected(name);
        let got = common::envoy::stat_in(&stats, &full);
        assert_eq!(
            got,
            Some(expected),
            "{full}\n{}",
            stats
                .lines()
                .filter(|l| l.contains("tollgate"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// An enforced rule and a shadow rule over four requests of one user: the shadow rule never
/// denies, but counts what it would have denied; cached denials count as local.
#[test]
fn counters_after_a_known_sequence() {
    let cfg = r#"{ "backend": { "timeout_ms": 2000 },
        "rules": [
          { "name": "per-user", "key": ["header:x-user-id"], "rate": 1, "period_ms": 60000, "burst": 2 },
          { "name": "try", "rate": 1, "period_ms": 60000, "burst": 1, "shadow": true } ] }"#;
    let stack = Stack::start("metrics-seq", cfg);
    // Load the script first: which rule's first call meets NOSCRIPT would otherwise be a race.
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(tollgate_core::backend::script::SOURCE)
        .query(&mut stack.redis.conn())
        .unwrap();
    let statuses: Vec<u16> = (0..4)
        .map(|_| stack.get("/x", &[("x-user-id", "alice")]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429, 429], "{}", stack.logs());
    assert_counters(
        &stack.envoy,
        "per-user",
        &[
            ("allowed", 2),
            ("denied", 2),
            ("local_denied", 1),
            ("backend_calls", 3),
        ],
    );
    assert_counters(
        &stack.envoy,
        "try",
        &[
            ("allowed", 1),
            ("shadow_denied", 3),
            ("local_denied", 2),
            ("backend_calls", 2),
        ],
    );
    // The stats_tags of envoy/envoy.yaml make the rule a label: one metric per counter.
    let prom = stack.envoy.admin("/stats/prometheus").body;
    let ours = || {
        prom.lines()
            .filter(|l| l.contains("tollgate"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for line in [
        "tollgate_allowed{rule=\"per-user\"} 2",
        "tollgate_allowed{rule=\"try\"} 1",
        "tollgate_denied{rule=\"per-user\"} 2",
        "tollgate_shadow_denied{rule=\"try\"} 3",
        "tollgate_local_denied{rule=\"try\"} 2",
    ] {
        assert!(
            prom.lines().any(|l| l == line),
            "{line} missing from /stats/prometheus:\n{}",
            ours()
        );
    }
    // Histogram values appear only at the next stats flush (5 s); the series are there at once.
    assert!(
        prom.lines()
            .any(|l| l.starts_with("tollgate_backend_latency_ms_bucket{rule=\"per-user\",le=")),
        "latency histogram buckets:\n{}",
        ours()
    );
    assert!(
        !prom
            .lines()
            .any(|l| l.starts_with("tollgate_per_user") || l.starts_with("tollgate_try")),
        "no metric name carries the rule:\n{}",
        ours()
    );
}

/// A backend that cannot be reached: the first five calls fail (backend errors), then the
/// circuit breaker opens and the failure mode (open) answers without calling at all; the log says
/// so once, not once per request.
#[test]
fn failure_mode_and_breaker_counts() {
    let cfg = r#"{ "backend": { "cluster": "no_such_cluster", "timeout_ms": 2000,
                                "breaker_failures": 5, "breaker_cooloff_ms": 600000 },
        "failure_mode": "open",
        "rules": [ { "name": "r", "key": ["header:x-user-id"], "rate": 1, "burst": 1 } ] }"#;
    let stack = Stack::start("metrics-fail", cfg);
    for _ in 0..8 {
        assert_eq!(
            stack.get("/x", &[("x-user-id", "a")]).status,
            200,
            "{}",
            stack.logs()
        );
    }
    assert_counters(
        &stack.envoy,
        "r",
        &[
            ("allowed", 8),
            ("failure_mode_allowed", 8),
            ("backend_errors", 5),
        ],
    );
    let log = stack.envoy.log_text();
    assert_eq!(
        log.matches("circuit open after 5 consecutive failures")
            .count(),
        1,
        "{log}"
    );
}

/// Lease mode counts the tokens leases took and the admissions spent from them.
#[test]
fn lease_counters() {
    let cfg = r#"{ "backend": { "timeout_ms": 2000 },
        "rules": [ { "name": "l", "key": ["header:x-user-id"], "mode": "lease",
                     "rate": 1, "period_ms": 60000, "burst": 20 } ] }"#;
    let stack = Stack::start("metrics-lease", cfg);
    let statuses: Vec<u16> = (0..22)
        .map(|_| stack.get("/x", &[("x-user-id", "a")]).status)
        .collect();
    let mut want = vec![200; 20];
    want.extend([429, 429]);
    assert_eq!(statuses, want, "{}", stack.logs());
    let stat = |stats: &str, n: &str| {
        common::envoy::stat_in(stats, &format!("wasmcustom.tollgate.l.{n}")).unwrap()
    };
    let stats = stack.envoy.stats_when(|s| {
        (
            stat(s, "allowed"),
            stat(s, "denied"),
            stat(s, "lease_granted"),
        ) == (20, 2, 20)
    });
    let get = |n: &str| stat(&stats, n);
    assert_eq!(get("allowed"), 20);
    assert_eq!(get("denied"), 2);
    assert_eq!(
        get("lease_granted"),
        20,
        "the whole burst went through leases"
    );
    assert!(
        get("local_allowed") >= 1,
        "some admissions spent leased tokens"
    );
    assert!(get("backend_calls") < 22, "fewer calls than requests");
}
