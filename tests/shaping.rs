//! Wait instead of reject (`max_wait_ms`), end to end: the script reserves future tokens and the
//! filter holds the request for exactly that long, then lets it through.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Stack;

fn config(rate: u64, burst: u64, max_wait_ms: u64) -> String {
    format!(
        r#"{{ "backend": {{ "timeout_ms": 2000 }},
             "rules": [ {{ "name": "hooks", "key": ["header:x-user-id"],
                           "rate": {rate}, "period_ms": 1000, "burst": {burst},
                           "max_wait_ms": {max_wait_ms} }} ] }}"#
    )
}

/// Sends `n` requests for `user` at once; returns (status, delay header, time taken) each.
fn burst(port: u16, user: &'static str, n: usize) -> Vec<(u16, Option<u64>, Duration)> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let r = common::get(port, "/hook", &[("x-user-id", user)]);
                let delay = r.header("x-ratelimit-delay-ms").map(|v| v.parse().unwrap());
                (r.status, delay, t0.elapsed())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// 2 × burst at once with a long enough wait: all admitted; the burst at once, the rest held one
/// emission interval (100 ms) after another, each for at least the delay it reports.
#[test]
fn a_burst_beyond_the_bucket_is_smoothed_not_rejected() {
    let stack = Stack::start("shape-smooth", &config(10, 5, 2000));
    let got = burst(stack.port(), "importer", 10);
    assert!(
        got.iter().all(|(s, _, _)| *s == 200),
        "{got:?}\n{}",
        stack.logs()
    );
    let mut delays: Vec<u64> = got.iter().filter_map(|(_, d, _)| *d).collect();
    delays.sort_unstable();
    assert_eq!(
        delays.len(),
        5,
        "the burst went through at once, the rest waited: {got:?}"
    );
    for pair in delays.windows(2) {
        let step = pair[1] - pair[0];
        assert!(
            (50..=100).contains(&step),
            "reservations one emission interval apart (less the arrival spread): {delays:?}"
        );
    }
    for (_, delay, took) in &got {
        if let Some(d) = delay {
            assert!(
                *took >= Duration::from_millis(*d),
                "held for at least the reported delay: {d} ms, took {took:?}"
            );
        }
    }
    let read = |stats: &str, n: &str| {
        common::envoy::stat_in(stats, &format!("wasmcustom.tollgate.hooks.{n}")).unwrap()
    };
    let want = (10, 5, delays.iter().sum::<u64>());
    let stats = stack.envoy.stats_when(|s| {
        (
            read(s, "allowed"),
            read(s, "delayed"),
            read(s, "delay_ms_total"),
        ) == want
    });
    let stat = |n: &str| read(&stats, n);
    assert_eq!(stat("allowed"), 10);
    assert_eq!(stat("delayed"), 5);
    assert_eq!(stat("delay_ms_total"), delays.iter().sum::<u64>());
}

/// With a short wait only what fits in it is reserved; the rest is rejected as before.
#[test]
fn beyond_the_wait_the_excess_is_rejected() {
    // One token a second, burst 2, wait up to 1.5 s: 2 now, 1 reserved 1 s ahead, the rest 429.
    let stack = Stack::start("shape-reject", &config(1, 2, 1500));
    let got = burst(stack.port(), "bursty", 6);
    let ok = got.iter().filter(|(s, _, _)| *s == 200).count();
    let limited = got.iter().filter(|(s, _, _)| *s == 429).count();
    let delayed: Vec<u64> = got.iter().filter_map(|(_, d, _)| *d).collect();
    assert_eq!((ok, limited), (3, 3), "{got:?}\n{}", stack.logs());
    assert_eq!(delayed.len(), 1, "{got:?}");
    assert!((500..=1000).contains(&delayed[0]), "{delayed:?}");
}

/// A client that hangs up while its request is held leaves nothing behind: the filter goes on
/// serving and holding other requests.
#[test]
fn a_client_hanging_up_mid_wait_leaves_the_filter_healthy() {
    let stack = Stack::start("shape-hangup", &config(1, 1, 5000));
    let port = stack.port();
    assert_eq!(
        common::get(port, "/hook", &[("x-user-id", "gone")]).status,
        200
    );
    // The next one would be held ~1 s: send it and hang up as soon as its reservation is back.
    // Envoy counts the filter's call at once (tollgate's own `delayed` arrives up to a second
    // later, by when the hold is over).
    let completed = "cluster.tollgate_backend.upstream_rq_completed";
    let calls = stack.envoy.stat_value(completed).unwrap_or(0);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /hook HTTP/1.1\r\nHost: t\r\nx-user-id: gone\r\n\r\n")
        .unwrap();
    let answered = common::wait_until(Duration::from_secs(5), || {
        stack.envoy.stat_value(completed).unwrap_or(0) > calls
    });
    assert!(answered, "the reservation came back\n{}", stack.logs());
    drop(s);
    let delayed = "wasmcustom.tollgate.hooks.delayed";
    assert_eq!(
        stack.envoy.stat_eventually(delayed, |v| v == Some(1)),
        Some(1),
        "the request was held\n{}",
        stack.logs()
    );
    // Other users are served, and held requests still complete after the dropped one's due time.
    assert_eq!(
        common::get(port, "/hook", &[("x-user-id", "next")]).status,
        200
    );
    let t0 = Instant::now();
    let r = common::get(port, "/hook", &[("x-user-id", "next")]);
    assert_eq!(r.status, 200, "{r:?}");
    let d: u64 = r.header("x-ratelimit-delay-ms").unwrap().parse().unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(d));
    let log = stack.envoy.log_text();
    assert!(
        !log.contains("panicked") && !log.contains("wasm trap"),
        "{log}"
    );
}

/// Envoy answers a request that is still held itself when its `request_timeout` ends first
/// (Envoy 1.40 answers a request it has whole `504`, one still arriving `408`; either passes the
/// filter's response path): the request never left the filter, so a `charge_on` rule that keeps
/// the cost of such answers gives it back all the same.
#[test]
fn envoys_timeout_of_a_held_request_gives_its_cost_back() {
    let config = r#"{ "backend": { "timeout_ms": 2000 },
        "rules": [ { "name": "hooks", "key": ["header:x-user-id"],
                     "rate": 1, "period_ms": 1000, "burst": 1, "max_wait_ms": 5000,
                     "charge_on": { "status": ["2xx", "4xx", "5xx"], "flush_ms": 20 } } ] }"#;
    let stack = Stack::start_edited("shape-408", config, |yaml, _| {
        yaml.replacen(
            "stat_prefix: ingress_http\n",
            "stat_prefix: ingress_http\n          request_timeout: 0.3s\n",
            1,
        )
    });
    let port = stack.port();
    // The first goes at once and keeps its cost; the second is held for a second, and Envoy
    // times it out first.
    let statuses: Vec<u16> = (0..2)
        .map(|_| common::get(port, "/hook", &[("x-user-id", "slow")]).status)
        .collect();
    assert_eq!(statuses, [200, 504], "{}", stack.logs());
    let stat = |n: &str| format!("wasmcustom.tollgate.hooks.{n}");
    assert_eq!(
        stack
            .envoy
            .stat_eventually(&stat("delayed"), |v| v == Some(1)),
        Some(1),
        "the second was held\n{}",
        stack.logs()
    );
    assert_eq!(
        stack
            .envoy
            .stat_eventually(&stat("refunded_tokens"), |v| v == Some(1)),
        Some(1),
        "the held one's cost went back\n{}",
        stack.logs()
    );
}
