//! End-to-end tests: real Envoy (V8) running tollgate.wasm, calling Webdis in front of a real Redis.
//! Needs `make setup` (Envoy, Redis, Webdis) and `make build` (the wasm); `make e2e` does both.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use common::{demo_config, Envoy, Stack};

/// The whole stack starts with the demo config, and a path no rule matches passes straight through.
#[test]
fn smoke_unmatched_path_passes_through() {
    let stack = Stack::start("e2e-smoke", &demo_config());
    let resp = stack.get("/", &[]);
    assert_eq!(resp.status, 200, "{resp:?}\n{}", stack.logs());
    assert_eq!(resp.body, "ok\n", "{resp:?}\n{}", stack.logs());
}

/// The demo's configuration, which Docker Compose ships too, keys on the client address: each address
/// gets the burst of 10 under /api/, a header the client writes changes nothing, and a second address
/// has a bucket of its own.
#[test]
fn demo_config_limits_each_client_address() {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    let stack = Stack::start("e2e-demo-config", &demo_config());
    let envoy = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), stack.port());
    let statuses = |client: [u8; 4], n: usize| -> Vec<u16> {
        let from = IpAddr::V4(Ipv4Addr::from(client));
        (0..n)
            .map(|i| {
                // A fresh made-up user id on every request: it must not matter.
                let user = format!("user-{i}");
                let headers = [("x-user-id", user.as_str())];
                common::http::raw_request_from(Some(from), envoy, "GET", "/api/orders", &headers)
                    .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()))
                    .status
            })
            .collect()
    };
    let mut limited = vec![200; 10];
    limited.push(429);
    assert_eq!(statuses([127, 0, 0, 31], 11), limited, "{}", stack.logs());
    assert_eq!(
        statuses([127, 0, 0, 32], 11),
        limited,
        "another client address"
    );
}

/// A plugin configuration with one rule keyed on `x-user-id` under `/api/`; `extra` adds top-level
/// fields (ending with a comma).
fn config(extra: &str, rate: u64, period_ms: u64, burst: u64) -> String {
    format!(
        r#"{{ "backend": {{ "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 2000 }},
             {extra}
             "rules": [ {{ "name": "per-user", "match": {{ "path_prefix": "/api/" }},
                           "key": ["header:x-user-id"], "cost_header": "x-cost",
                           "rate": {rate}, "period_ms": {period_ms}, "burst": {burst} }} ] }}"#
    )
}

fn user(id: &str) -> [(&str, &str); 1] {
    [("x-user-id", id)]
}

/// A slow refill (1 token a minute) makes the counts exact: the first `burst` requests pass, then
/// 429 with Retry-After, the IETF headers and the configured body.
#[test]
fn burst_is_admitted_then_429_with_headers() {
    let stack = Stack::start(
        "e2e-burst",
        &config(
            r#""deny": {"status": 429, "body": "slow down\n"},"#,
            1,
            60_000,
            5,
        ),
    );
    for i in 0..5u64 {
        let r = stack.get("/api/orders", &user("alice"));
        assert_eq!(r.status, 200, "request {i}: {r:?}\n{}", stack.logs());
        assert_eq!(
            r.header("ratelimit"),
            Some(format!("\"per-user\";r={};t={}", 4 - i, 60 * (i + 1)).as_str()),
            "{r:?}"
        );
        assert_eq!(r.header("ratelimit-policy"), Some("\"per-user\";q=5;w=300"));
    }
    let r = stack.get("/api/orders", &user("alice"));
    assert_eq!(r.status, 429, "{r:?}\n{}", stack.logs());
    assert_eq!(r.body, "slow down\n");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "retry-after {retry}");
    assert_eq!(
        r.header("ratelimit"),
        Some(format!("\"per-user\";r=0;t={retry}").as_str())
    );
    assert_eq!(r.header("ratelimit-policy"), Some("\"per-user\";q=5;w=300"));
}

/// Two keys have two buckets; a request without the key source is not limited at all; a path the
/// rule does not match is not limited.
#[test]
fn keys_are_independent_and_missing_key_is_not_limited() {
    let stack = Stack::start("e2e-keys", &config("", 1, 60_000, 2));
    let statuses = |id: &str, n: usize| -> Vec<u16> {
        (0..n)
            .map(|_| stack.get("/api/x", &user(id)).status)
            .collect()
    };
    assert_eq!(statuses("alice", 3), [200, 200, 429], "{}", stack.logs());
    assert_eq!(statuses("bob", 3), [200, 200, 429]);
    for _ in 0..10 {
        let r = stack.get("/api/x", &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("ratelimit"), None, "no rule applied: no headers");
        assert_eq!(stack.get("/other", &user("alice")).status, 200);
    }
    // Same user text in another header is another key source: still alice's bucket only via x-user-id.
    assert_eq!(stack.get("/api/x", &[("x-other", "bob")]).status, 200);
}

/// A known denial is answered by the proxy itself (the deny cache shared by both workers): a flood of
/// over-limit requests does not reach Redis.
#[test]
fn over_limit_flood_is_answered_locally() {
    let stack = Stack::start("e2e-deny-cache", &config("", 1, 60_000, 1));
    assert_eq!(
        stack.get("/api/x", &user("carol")).status,
        200,
        "{}",
        stack.logs()
    );
    assert_eq!(stack.get("/api/x", &user("carol")).status, 429);
    let before = stack.redis.script_calls();
    for _ in 0..30 {
        // New connection each time: requests land on both workers.
        assert_eq!(stack.get("/api/x", &user("carol")).status, 429);
    }
    assert_eq!(
        stack.redis.script_calls(),
        before,
        "denials must come from the cache"
    );
    // Another user still reaches Redis.
    assert_eq!(stack.get("/api/x", &user("dave")).status, 200);
    assert!(stack.redis.script_calls().0 > before.0);
}

/// After `SCRIPT FLUSH` (or a Redis restart) EVALSHA answers NOSCRIPT; the filter sends EVAL once and
/// limiting goes on with the same counts.
#[test]
fn limits_survive_script_flush() {
    let stack = Stack::start("e2e-noscript", &config("", 1, 60_000, 4));
    assert_eq!(
        stack.get("/api/x", &user("erin")).status,
        200,
        "{}",
        stack.logs()
    );
    let (evalsha, eval) = stack.redis.script_calls();
    assert!(eval >= 1, "a fresh Redis has no script: EVAL was needed");
    assert!(evalsha >= 1);
    assert_eq!(stack.get("/api/x", &user("erin")).status, 200);
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut stack.redis.conn())
        .unwrap();
    assert_eq!(
        stack.get("/api/x", &user("erin")).status,
        200,
        "{}",
        stack.logs()
    );
    assert_eq!(
        stack.redis.script_calls().1,
        eval + 1,
        "one EVAL after the flush"
    );
    assert_eq!(stack.get("/api/x", &user("erin")).status, 200);
    assert_eq!(stack.get("/api/x", &user("erin")).status, 429);
    assert_eq!(
        stack.redis.script_calls().1,
        eval + 1,
        "EVALSHA works again"
    );
}

/// A bad configuration makes Envoy refuse the filter, with one log line naming the field.
#[test]
fn bad_config_is_rejected_with_the_field_named() {
    let dir = common::scratch_dir("e2e-bad-config");
    let bad = r#"{"rules": [{"name": "per-user", "key": ["header:x-user-id"], "rate": 0}]}"#;
    let log = match Envoy::try_start(&dir, bad, common::free_port()) {
        Ok(_) => panic!("Envoy accepted a rule with rate 0"),
        Err(log) => log,
    };
    assert!(
        log.contains("tollgate: bad configuration: rules[0].rate: must be an integer >= 1"),
        "{}",
        common::envoy::brief_log(&log)
    );
    let dir = common::scratch_dir("e2e-bad-json");
    let log = match Envoy::try_start(&dir, "{not json", common::free_port()) {
        Ok(_) => panic!("Envoy accepted invalid JSON"),
        Err(log) => log,
    };
    assert!(
        log.contains("tollgate: bad configuration: configuration: invalid JSON"),
        "{}",
        common::envoy::brief_log(&log)
    );
}

/// The cost header takes that many tokens; a bad or oversized cost is a 400, never cost 0.
#[test]
fn cost_header_spends_tokens_and_bad_costs_are_rejected() {
    let stack = Stack::start("e2e-cost", &config("", 1, 60_000, 10));
    let with_cost = |c: &str| stack.get("/api/x", &[("x-user-id", "frank"), ("x-cost", c)]);
    let r = with_cost("7");
    assert_eq!(r.status, 200, "{}", stack.logs());
    assert_eq!(r.header("ratelimit"), Some("\"per-user\";r=3;t=420"));
    for bad in ["0", "-1", "1.5", "abc", "11"] {
        assert_eq!(with_cost(bad).status, 400, "cost {bad:?}");
    }
    assert_eq!(with_cost("4").status, 429, "3 tokens left");
    assert_eq!(with_cost("3").status, 200, "a smaller cost still fits");
}

/// Webdis' basic-auth ACL: the filter sends the configured credentials.
#[test]
fn webdis_basic_auth_is_sent() {
    let opts = common::WebdisOpts {
        basic_auth: Some("tollgate:s3cret".to_string()),
        ..Default::default()
    };
    let cfg = config("", 1, 60_000, 1).replacen(
        r#""timeout_ms": 2000"#,
        r#""timeout_ms": 2000, "basic_auth": "tollgate:s3cret""#,
        1,
    );
    let stack = Stack::start_with("e2e-auth", &cfg, &[], &opts);
    assert_eq!(
        stack.get("/api/x", &user("gina")).status,
        200,
        "{}",
        stack.logs()
    );
    assert_eq!(
        stack.get("/api/x", &user("gina")).status,
        429,
        "{}",
        stack.logs()
    );
}

/// Under steady overload from several clients for ~2 s, no window admits more than burst + rate ×
/// W (counting only admissions sent and answered inside it, so the check can only err towards
/// letting over-admission through, never towards a false alarm).
#[test]
fn steady_overload_never_admits_more_than_the_bucket() {
    let (rate, burst) = (20u64, 5u64);
    let stack = Stack::start("e2e-steady", &config("", rate, 1000, burst));
    let on = (true, std::time::Duration::from_secs(2));
    let timed = common::drive_timed(&[stack.port()], 4, "hot", &[on]);
    let count = |status: u16| timed.iter().filter(|t| t.status == status).count() as u64;
    let (ok, limited) = (count(200), count(429));
    assert_eq!(
        ok + limited,
        timed.len() as u64,
        "no errors\n{}",
        stack.logs()
    );
    assert!(limited > 0, "the load must exceed the limit");
    assert!(
        ok >= burst,
        "at least the burst is admitted (admitted {ok})"
    );
    common::assert_windows(&timed, burst, rate, 0, &stack.logs());
    eprintln!("steady overload: admitted {ok}, limited {limited}");
}

/// In front of a real application (cluster "app", paths under /app/): admitted requests reach it
/// with the rate-limit headers added on the way back; denied ones never do.
#[test]
fn limits_traffic_to_a_real_upstream() {
    let dir = common::scratch_dir("e2e-upstream");
    let redis = common::Redis::start(&dir);
    let webdis = common::Webdis::start(&dir, redis.port);
    let app = common::upstream::Upstream::start();
    let cfg = r#"{ "backend": { "timeout_ms": 2000 },
        "rules": [ { "name": "app", "match": { "path_prefix": "/app/" }, "key": ["header:x-user-id"],
                     "rate": 1, "period_ms": 60000, "burst": 3 } ] }"#;
    let envoy = Envoy::try_start_with_upstream(&dir, cfg, webdis.port, app.port)
        .unwrap_or_else(|log| panic!("{}", common::envoy::brief_log(&log)));
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let r = envoy.get("/app/orders", &user("hana"));
        if r.status == 200 {
            assert_eq!(r.body, "app\n", "the app answered");
            assert!(r.header("ratelimit").is_some(), "{r:?}");
        }
        statuses.push(r.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429], "{}", envoy.log_text());
    assert_eq!(app.hits(), 3, "only admitted requests reached the app");
}

/// Exact mode at one hot key on a two-worker Envoy: concurrent checks share calls, across workers
/// too (one worker leads the key, the other sends its checks to it through a shared queue), and
/// every request is still decided by the global bucket: exactly the burst is admitted.
#[test]
fn a_hot_exact_key_shares_calls_across_workers_and_admits_exactly_the_bucket() {
    // One token a minute after the burst: the run admits the burst and at most one refill.
    let burst = 300u64;
    let stack = Stack::start("e2e-shared-exact", &config("", 1, 60_000, burst));
    let (ok, limited, other) = common::drive(&[stack.port()], 16, "hot", 2.0);
    assert_eq!(other, 0, "no errors\n{}", stack.logs());
    assert!(limited > 0, "the load must exceed the bucket");
    assert!(
        (burst..=burst + 1).contains(&ok),
        "admitted {ok} of a bucket of {burst}"
    );
    let (evalsha, eval) = stack.redis.script_calls();
    // Once every decision and every call is counted (a worker counts a check it forwards before
    // its decision).
    let stats = stack.envoy.stats_when(|s| {
        common::envoy::decided_in(s, "per-user") == ok + limited
            && common::envoy::stat_in(s, "wasmcustom.tollgate.per-user.backend_calls")
                >= Some(evalsha + eval)
    });
    let stat = |name: &str| {
        common::envoy::stat_in(&stats, &format!("wasmcustom.tollgate.per-user.{name}"))
    };
    let calls = stat("backend_calls").unwrap_or(0);
    let forwarded = stat("forwarded").unwrap_or(0);
    eprintln!(
        "shared exact: admitted {ok}, limited {limited}, backend calls {calls}, forwarded {forwarded}"
    );
    // A script run decides one call, or several when they shared a backend request.
    assert!(
        evalsha + eval <= calls,
        "{evalsha} + {eval} script runs for {calls} calls"
    );
    assert_eq!(
        common::envoy::decided_in(&stats, "per-user"),
        ok + limited,
        "every decision counted once"
    );
    assert!(forwarded > 0, "the second worker sent checks to the leader");
    // Denials are cached per proxy, so most of the limited requests never call; the admitted
    // ones share calls.
    assert!(
        calls < ok,
        "{calls} calls for {ok} admissions: calls were shared"
    );
}
