//! Lease mode end to end: real Envoy processes (2 workers each) sharing one Redis through Webdis.
//! The invariant under test: the fleet never admits more than the global bucket allows, while
//! most admissions are answered from leased tokens without a Redis call.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::time::Duration;

use common::{Envoy, Stack};

fn lease_config(rate: u64, period_ms: u64, burst: u64) -> String {
    lease_config_horizon(rate, period_ms, burst, 200)
}

fn lease_config_horizon(rate: u64, period_ms: u64, burst: u64, horizon_ms: u64) -> String {
    format!(
        r#"{{ "backend": {{ "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 2000 }},
             "rules": [ {{ "name": "per-user", "match": {{ "path_prefix": "/api/" }},
                           "key": ["header:x-user-id"], "mode": "lease",
                           "rate": {rate}, "period_ms": {period_ms}, "burst": {burst},
                           "lease_horizon_ms": {horizon_ms} }} ] }}"#
    )
}

/// Twelve requests of `user` on a rule with burst 8 and a slow refill: exactly eight admitted.
fn assert_burst_of_8_then_429(stack: &Stack, user: &str) {
    let statuses: Vec<u16> = (0..12)
        .map(|_| stack.get("/api/x", &[("x-user-id", user)]).status)
        .collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 200, 200, 200, 429, 429, 429, 429],
        "{}",
        stack.logs()
    );
}

/// With `max_wait_ms`, a request its proxy's reservation covers waits for its token instead of
/// getting a 429: one client's requests, one after another, to a key of rate 20/s and burst 4
/// all go through; those past the burst are held (`x-ratelimit-delay-ms`) at least as long as
/// they report, and none goes through ahead of the bucket's refill.
#[test]
fn a_lease_request_waits_for_its_proxy_s_reservation_with_max_wait() {
    let config = lease_config(20, 1000, 4).replace(
        r#""lease_horizon_ms": 200"#,
        r#""lease_horizon_ms": 200, "max_wait_ms": 1000"#,
    );
    let stack = Stack::start("lease-hold", &config);
    let start = std::time::Instant::now();
    let mut delayed = 0;
    for i in 0..16 {
        let t = std::time::Instant::now();
        let r = stack.get("/api/x", &[("x-user-id", "carol")]);
        assert_eq!(r.status, 200, "request {i}: {r:?}\n{}", stack.logs());
        if let Some(d) = r.header("x-ratelimit-delay-ms") {
            let d: u64 = d.parse().unwrap();
            assert!(
                t.elapsed() >= Duration::from_millis(d),
                "held {d} ms: {r:?}"
            );
            delayed += 1;
        }
    }
    let took = start.elapsed().as_secs_f64();
    assert!(delayed >= 1, "past the burst, requests wait for the refill");
    assert!(
        16.0 <= 4.0 + 20.0 * took + 1.0,
        "16 admitted in {took} s: ahead of burst + rate x W"
    );
    let counted = stack
        .envoy
        .stat_eventually("wasmcustom.tollgate.per-user.delayed", |v| {
            v == Some(delayed)
        });
    assert_eq!(
        counted,
        Some(delayed),
        "delayed is counted\n{}",
        stack.logs()
    );
}

/// With a slow refill the counts are exact: leasing never admits more than the burst, and the
/// tokens a lease holds are spent before anyone is denied.
#[test]
fn lease_mode_admits_exactly_the_burst() {
    let stack = Stack::start("lease-burst", &lease_config(1, 60_000, 8));
    assert_burst_of_8_then_429(&stack, "alice");
    let r = stack.get("/api/x", &[("x-user-id", "alice")]);
    assert!(r.header("retry-after").is_some(), "{r:?}");
    // Another user has a bucket of their own.
    assert_eq!(stack.get("/api/x", &[("x-user-id", "bob")]).status, 200);
}

/// A flood of keys seen once: once a worker has seen 16 new keys and none came back, each new key
/// is checked with one script call of its own and no lease. A key that comes back under the flood
/// is admitted exactly its burst, whichever way each of its checks went.
#[test]
fn a_flood_of_new_keys_costs_one_call_each_and_no_leases() {
    const N: u64 = 200;
    let stack = Stack::start("lease-flood", &lease_config(1, 60_000, 8));
    // Loads the script (an EVALSHA answered NOSCRIPT, then EVAL), so that what follows counts
    // calls, not attempts.
    assert_eq!(stack.get("/api/x", &[("x-user-id", "first")]).status, 200);
    let (sha, eval) = stack.redis.script_calls();
    for i in 0..N {
        let user = format!("new-{i}");
        assert_eq!(stack.get("/api/x", &[("x-user-id", &user)]).status, 200);
    }
    let (sha2, eval2) = stack.redis.script_calls();
    assert_eq!(sha2 + eval2 - sha - eval, N, "one script call per new key");
    let stat = |s: &str, n: &str| {
        common::envoy::stat_in(s, &format!("wasmcustom.tollgate.per-user.{n}")).unwrap_or(0)
    };
    let stats = stack.envoy.stats_when(|s| stat(s, "allowed") == N + 1);
    assert_eq!(stat(&stats, "allowed"), N + 1);
    let leased = stat(&stats, "lease_granted");
    assert!(
        leased <= 2 * 15,
        "each of the two workers leases only its first 15 new keys: {leased} tokens leased"
    );
    assert_burst_of_8_then_429(&stack, "back");
}

/// Two proxies, two workers each, one hot key far over its limit: the fleet admits at most
/// burst + rate × W in every window W it sees (plus one request per proxy), and leases answer
/// most admissions without a Redis call.
#[test]
fn two_proxies_never_exceed_the_global_bucket() {
    let (rate, burst) = (200u64, 100u64);
    let cfg = lease_config(rate, 1000, burst);
    let stack = Stack::start("lease-fleet", &cfg);
    let dir2 = common::scratch_dir("lease-fleet-b");
    let second = Envoy::start(&dir2, &cfg, stack.webdis.port);
    let (sha, eval) = stack.redis.script_calls();
    let calls_before = sha + eval;
    let ports = [stack.port(), second.listen_port];
    let timed = common::drive_timed(&ports, 3, "hot", &[(true, Duration::from_secs(2))]);
    let (sha, eval) = stack.redis.script_calls();
    let calls = sha + eval - calls_before;
    let count = |status: u16| timed.iter().filter(|t| t.status == status).count() as u64;
    let (ok, limited) = (count(200), count(429));
    eprintln!("fleet: admitted {ok}, limited {limited}, script calls {calls}");
    let logs = format!("{}\n{}", stack.logs(), second.log_text());
    assert_eq!(ok + limited, timed.len() as u64, "no errors\n{logs}");
    assert!(limited > 0, "the load must exceed the limit");
    assert!(ok >= burst, "at least the burst is admitted ({ok})");
    common::assert_windows(&timed, burst, rate, 2, &logs);
    assert!(
        calls * 2 <= ok,
        "leases must answer most admissions locally: {calls} calls for {ok} admitted"
    );
}

/// The load that broke the bound: two proxies of two workers, one key at 100/s with a burst of
/// 100, loaded 0.6 s then idle 1.2 s, four times, with lease horizons of 10 s and 1 s. Tokens
/// leased or reserved before a pause were spent on top of a bucket that had refilled meanwhile
/// (about 130 admitted within 0.1 s, where 110 is the bound); now what is out on lease counts
/// against the bucket's capacity, in every window.
#[test]
fn pauses_never_let_the_fleet_over_the_bound() {
    let (rate, burst) = (100u64, 100u64);
    let on = (true, Duration::from_millis(600));
    let off = (false, Duration::from_millis(1200));
    for horizon in [10_000, 1000] {
        let cfg = lease_config_horizon(rate, 1000, burst, horizon);
        let stack = Stack::start(&format!("lease-pauses-{horizon}"), &cfg);
        let dir2 = common::scratch_dir(&format!("lease-pauses-{horizon}-b"));
        let second = Envoy::start(&dir2, &cfg, stack.webdis.port);
        let ports = [stack.port(), second.listen_port];
        let timed = common::drive_timed(&ports, 3, "hot", &[on, off, on, off, on, off, on]);
        let ok = timed.iter().filter(|t| t.status == 200).count();
        let logs = format!("{}\n{}", stack.logs(), second.log_text());
        assert!(
            timed.iter().all(|t| t.status == 200 || t.status == 429),
            "no errors\n{logs}"
        );
        eprintln!("horizon {horizon}: admitted {ok} of {}", timed.len());
        assert!(ok as u64 > burst, "the load went on after the first burst");
        common::assert_windows(&timed, burst, rate, 2, &logs);
    }
}

/// Many keys at once through two proxies: each key has its own bucket and its own bound.
#[test]
fn keys_are_independent_under_lease() {
    let (rate, burst) = (10u64, 5u64);
    let cfg = lease_config(rate, 1000, burst);
    let stack = Stack::start("lease-keys", &cfg);
    let dir2 = common::scratch_dir("lease-keys-b");
    let second = Envoy::start(&dir2, &cfg, stack.webdis.port);
    let users: [&'static str; 4] = ["u1", "u2", "u3", "u4"];
    let handles: Vec<_> = users
        .iter()
        .map(|&u| {
            let ports = [stack.port(), second.listen_port];
            let on = (true, Duration::from_millis(1500));
            std::thread::spawn(move || common::drive_timed(&ports, 1, u, &[on]))
        })
        .collect();
    let results: Vec<Vec<common::Timed>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let logs = format!("{}\n{}", stack.logs(), second.log_text());
    for (u, timed) in users.iter().zip(&results) {
        let count = |status: u16| timed.iter().filter(|t| t.status == status).count() as u64;
        let (ok, limited) = (count(200), count(429));
        eprintln!("{u}: admitted {ok}, limited {limited}");
        assert_eq!(ok + limited, timed.len() as u64, "{u}: no errors\n{logs}");
        assert!(limited > 0, "{u} was over its limit");
        assert!(ok >= burst, "{u} got at least its burst ({ok})");
        common::assert_windows(timed, burst, rate, 2, &logs);
    }
}
