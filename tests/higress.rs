//! The Higress build (tollgate-higress.wasm, the filter crate's feature `higress`): script calls go to Redis through
//! Higress' Redis callouts. Run through the proxy-wasm test host (testhost/, Higress mode) against a real
//! redis-server; tests/testhost.rs shows the host agrees with real Envoy on the HTTP build. Also: which
//! host functions each build imports, that stock Envoy refuses the Higress build, and that
//! envoy/higress/wasmplugin.yaml carries a configuration the Higress build accepts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use common::hosted::{assert_clean, loopback};

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::{repo_root, scratch_dir, wait_until, Redis, Resp};
use tollgate_testhost::{module_interface, resp_frame_len, Proxy, ProxyConfig};

/// How the Higress build names the Redis service in these tests, and the cluster Higress makes of it.
const SERVICE: &str = "redis.default.svc.cluster.local";
const CLUSTER: &str = "outbound|6379||redis.default.svc.cluster.local";

fn host_config(plugin_config: &str, redis_port: u16) -> ProxyConfig {
    let mut cfg = ProxyConfig::new(common::envoy::higress_wasm_path(), plugin_config)
        .cluster(CLUSTER, loopback(redis_port));
    cfg.higress = true;
    cfg
}

/// A Higress-mode test host with the Higress build, its cluster for `SERVICE` at `redis_port`.
fn start(plugin_config: &str, redis_port: u16) -> Proxy {
    Proxy::start(host_config(plugin_config, redis_port))
        .unwrap_or_else(|e| panic!("test host did not start: {e}"))
}

fn get(host: &Proxy, user: &str) -> Resp {
    common::get(host.port(), "/api/x", &[("x-user-id", user)])
}

fn statuses(host: &Proxy, user: &str, n: usize) -> Vec<u16> {
    (0..n).map(|_| get(host, user).status).collect()
}

fn stat(host: &Proxy, metric: &str) -> u64 {
    host.stat_value(&format!("wasmcustom.tollgate.per-user.{metric}"))
        .unwrap_or_else(|| panic!("no metric {metric}"))
}

/// `stat(host, metric)` once `ready` holds for it: the filter pushes its counts up to a second
/// after counting them (polled; the last value read if it never does).
fn stat_when(host: &Proxy, metric: &str, ready: impl Fn(u64) -> bool) -> u64 {
    common::eventually(|| stat(host, metric), |v| ready(*v))
}

/// The checks rule per-user decided, by the host's stats.
fn decided(host: &Proxy) -> u64 {
    common::decided(|name| host.stat_value(name), "per-user")
}

/// One exact rule keyed on `x-user-id` under `/api/`, refilling 1 token a minute.
fn exact_config(backend_extra: &str, extra: &str, burst: u64) -> String {
    format!(
        r#"{{ "backend": {{ "service_name": "{SERVICE}", "timeout_ms": 1000 {backend_extra} }},
             {extra}
             "rules": [ {{ "name": "per-user", "match": {{ "path_prefix": "/api/" }},
                           "key": ["header:x-user-id"],
                           "rate": 1, "period_ms": 60000, "burst": {burst} }} ] }}"#
    )
}

fn failure_config(mode: &str) -> String {
    format!(
        r#"{{ "backend": {{ "service_name": "{SERVICE}", "timeout_ms": 300,
                            "breaker_failures": 3, "breaker_cooloff_ms": 200 }},
             "failure_mode": "{mode}",
             "rules": [ {{ "name": "per-user", "match": {{ "path_prefix": "/api/" }},
                           "key": ["header:x-user-id"], "rate": 1, "period_ms": 60000, "burst": 3,
                           "fallback": {{ "rate": 1, "period_ms": 60000, "burst": 2 }} }} ] }}"#
    )
}

/// The HTTP build imports no Higress function (stock Envoy refuses unknown imports); the Higress
/// build imports exactly the two it uses and exports the callback.
#[test]
fn each_build_imports_what_its_host_has() {
    let (http_imports, http_exports) = module_interface(&common::wasm_path()).unwrap();
    let (h_imports, h_exports) = module_interface(&common::envoy::higress_wasm_path()).unwrap();
    let redis = |names: &[String]| -> Vec<String> {
        names
            .iter()
            .filter(|n| n.contains("redis"))
            .cloned()
            .collect()
    };
    assert_eq!(redis(&http_imports), Vec::<String>::new());
    assert_eq!(redis(&http_exports), Vec::<String>::new());
    assert_eq!(
        redis(&h_imports),
        ["env.proxy_redis_init", "env.proxy_redis_call"]
    );
    assert_eq!(redis(&h_exports), ["proxy_on_redis_call_response"]);
    // Higress is where usage from LLM answers is most wanted: its build reads response bodies.
    assert!(h_exports.iter().any(|e| e == "proxy_on_response_body"));
    // Higress registers its Redis functions for ABI 0.2.1 only.
    assert!(h_exports.iter().any(|e| e == "proxy_abi_version_0_2_1"));
}

/// Stock Envoy refuses to load the Higress build (a missing import), and so does the test host in
/// stock mode; the HTTP build loads in both (every other test).
#[test]
fn stock_envoy_refuses_the_higress_build() {
    let dir = scratch_dir("higress-stock");
    let wasm = common::envoy::higress_wasm_path();
    let cfg = exact_config("", "", 3);
    let refused = common::Envoy::try_start_yaml(&dir, |listen, admin| {
        common::render_envoy_yaml(&cfg, common::free_port(), listen, admin, &wasm, 9)
    });
    let log = match refused {
        Ok(envoy) => panic!("Envoy loaded the Higress build:\n{}", envoy.log_text()),
        Err(log) => log,
    };
    assert!(
        log.contains("proxy_redis"),
        "{}",
        common::envoy::brief_log(&log)
    );
    let mut stock = host_config(&cfg, common::free_port());
    stock.higress = false;
    let err = Proxy::start(stock)
        .err()
        .expect("the stock test host loaded the Higress build");
    assert!(err.contains("proxy_redis"), "{err}");
}

/// One hot exact key from 16 clients on two workers, through Redis callouts: exactly the burst is
/// admitted, the workers share calls through shared queues, and Redis ran no more script runs than
/// calls.
#[test]
fn a_hot_exact_key_shares_redis_calls_across_workers() {
    let dir = scratch_dir("higress-shared-exact");
    let redis = Redis::start(&dir);
    let burst = 200u64;
    let host = start(&exact_config("", "", burst), redis.port);
    let (ok, limited, other) = common::drive(&[host.port()], 16, "hot", 2.0);
    let (evalsha, eval) = redis.script_calls();
    // Once every decision and every call is counted (a worker counts a check it forwards before
    // its decision).
    let (calls, decisions) = common::eventually(
        || (stat(&host, "backend_calls"), decided(&host)),
        |&(calls, decisions)| calls >= evalsha + eval && decisions == ok + limited,
    );
    let forwarded = stat(&host, "forwarded");
    eprintln!("higress: admitted {ok}, limited {limited}, calls {calls}, forwarded {forwarded}");
    assert_eq!(other, 0, "no errors\n{}", host.log_text());
    assert!(limited > 0, "the load must exceed the bucket");
    assert!((burst..=burst + 1).contains(&ok), "admitted {ok}");
    // A script run decides one call, or several when they shared a backend request.
    assert!(
        evalsha + eval <= calls,
        "{evalsha} + {eval} script runs for {calls} calls"
    );
    assert_eq!(decisions, ok + limited, "every decision counted once");
    assert!(calls < ok, "{calls} calls for {ok} admissions");
    assert!(forwarded > 0, "no check went to the leader");
    assert_clean(&host);
}

/// Burst then 429 with the rate-limit headers, like the HTTP build; other keys are independent; a
/// request no rule matches passes untouched.
#[test]
fn burst_then_429_and_independent_keys() {
    let dir = scratch_dir("higress-burst");
    let redis = Redis::start(&dir);
    let host = start(
        &exact_config("", r#""deny": {"status": 429, "body": "slow down\n"},"#, 4),
        redis.port,
    );
    for i in 0..4u64 {
        let r = get(&host, "alice");
        assert_eq!(r.status, 200, "request {i}: {r:?}\n{}", host.log_text());
        assert_eq!(
            r.header("ratelimit"),
            Some(format!("\"per-user\";r={};t={}", 3 - i, 60 * (i + 1)).as_str())
        );
        assert_eq!(r.header("ratelimit-policy"), Some("\"per-user\";q=4;w=240"));
    }
    let r = get(&host, "alice");
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.body, "slow down\n");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "retry-after {retry}");
    assert_eq!(statuses(&host, "bob", 5), [200, 200, 200, 200, 429]);
    let r = common::get(host.port(), "/other", &[("x-user-id", "alice")]);
    assert_eq!((r.status, r.header("ratelimit")), (200, None));
    // Every admission and denial went through Redis' script or the deny cache, never Webdis.
    let (evalsha, eval) = redis.script_calls();
    assert!(evalsha >= 8 && eval == 1, "EVALSHA {evalsha}, EVAL {eval}");
    assert_eq!(stat_when(&host, "allowed", |v| v == 8), 8);
    assert_clean(&host);
}

/// A request of two rules is one Redis command (the script's batched form, in one callout), each
/// rule decided by its own part; Redis gone fails both checks into the failure mode.
#[test]
fn a_requests_two_rules_share_one_redis_command() {
    let dir = scratch_dir("higress-two-rules");
    let mut redis = Redis::start(&dir);
    let config = format!(
        r#"{{ "backend": {{ "service_name": "{SERVICE}", "timeout_ms": 300 }},
             "failure_mode": "closed",
             "rules": [
               {{ "name": "per-user", "key": ["header:x-user-id"], "rate": 1,
                  "period_ms": 60000, "burst": 2 }},
               {{ "name": "per-path", "key": ["path"], "rate": 1, "period_ms": 60000,
                  "burst": 100 }} ] }}"#
    );
    let host = start(&config, redis.port);
    assert_eq!(statuses(&host, "alice", 3), [200, 200, 429]);
    let (evalsha, eval) = redis.script_calls();
    // Three requests, one command each, and the first's EVALSHA again as EVAL after NOSCRIPT;
    // the third's per-user denial came from Redis too (nothing cached yet). Without batching,
    // twice as many.
    assert_eq!(evalsha + eval, 4, "EVALSHA {evalsha}, EVAL {eval}");
    assert_eq!(eval, 1);
    // Counted per check: three, and the EVAL resend.
    assert_eq!(stat_when(&host, "backend_calls", |v| v == 4), 4);
    redis.proc.stop();
    let r = get(&host, "bob");
    assert_eq!(r.status, 503, "{r:?}\n{}", host.log_text());
    assert_eq!(stat_when(&host, "backend_errors", |v| v == 1), 1);
    let path_errors = host
        .stat_value("wasmcustom.tollgate.per-path.backend_errors")
        .unwrap_or(0);
    assert_eq!(path_errors, 1, "each check of the failed command");
    assert_clean(&host);
}

/// After `SCRIPT FLUSH` the next EVALSHA answers `-NOSCRIPT`: the filter sends EVAL once, then
/// EVALSHA again, and limits exactly throughout.
#[test]
fn noscript_after_script_flush() {
    let dir = scratch_dir("higress-noscript");
    let redis = Redis::start(&dir);
    let host = start(&exact_config("", "", 3), redis.port);
    assert_eq!(statuses(&host, "u", 1), [200], "{}", host.log_text());
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut redis.conn())
        .unwrap();
    let before = redis.script_calls();
    assert_eq!(statuses(&host, "u", 3), [200, 200, 429]);
    let after = redis.script_calls();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (3, 1),
        "(EVALSHA, EVAL) after the flush"
    );
    // Once the four decisions are counted.
    assert_eq!(common::eventually(|| decided(&host), |d| *d == 4), 4);
    assert_eq!(
        stat(&host, "backend_errors"),
        0,
        "NOSCRIPT answered by EVAL is not an error"
    );
    assert_clean(&host);
}

/// Redis killed under traffic: each failure mode answers (open admits, closed 503 with Retry-After,
/// local the fallback bucket); Redis back, empty: limiting resumes through EVAL.
#[test]
fn redis_killed_and_back_per_failure_mode() {
    for (mode, during) in [
        ("open", vec![200, 200, 200, 200]),
        ("closed", vec![503, 503, 503, 503]),
        ("local", vec![200, 200, 429, 429]),
    ] {
        let dir = scratch_dir(&format!("higress-down-{mode}"));
        let mut redis = Redis::start(&dir);
        let port = redis.port;
        let host = start(&failure_config(mode), port);
        assert_eq!(
            statuses(&host, "a", 1),
            [200],
            "{mode}\n{}",
            host.log_text()
        );
        redis.proc.stop();
        assert_eq!(
            statuses(&host, "b", 4),
            during,
            "{mode} while Redis is down\n{}",
            host.log_text()
        );
        if mode == "closed" {
            assert_eq!(get(&host, "b").header("retry-after"), Some("1"));
        }
        redis = Redis::start_on(&dir, port, &[]);
        let fresh = format!("after-{mode}");
        let resumed = wait_until(Duration::from_secs(10), || {
            get(&host, &fresh);
            let keys: u64 = redis::cmd("DBSIZE").query(&mut redis.conn()).unwrap();
            keys > 0
        });
        assert!(
            resumed,
            "{mode}: limiting did not resume\n{}",
            host.log_text()
        );
        assert_eq!(
            statuses(&host, &format!("later-{mode}"), 4),
            [200, 200, 200, 429]
        );
        assert!(
            redis.script_calls().1 >= 1,
            "{mode}: the script came back through EVAL"
        );
        assert!(stat_when(&host, "backend_errors", |v| v >= 1) >= 1);
        assert_clean(&host);
    }
}

/// A Redis that accepts and never answers: Higress' op timeout (backend.timeout_ms) fails the call
/// (NetworkError), the failure mode applies, and the breaker opens after 3 failures.
#[test]
fn silent_redis_times_out_and_opens_the_breaker() {
    let port = common::silent_backend();
    let cfg = failure_config("open").replace(
        "\"breaker_cooloff_ms\": 200",
        "\"breaker_cooloff_ms\": 600000",
    );
    let host = start(&cfg, port);
    for _ in 0..6 {
        let t0 = Instant::now();
        assert_eq!(get(&host, "a").status, 200, "{}", host.log_text());
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
    let counts =
        || ["backend_calls", "backend_errors", "failure_mode_allowed"].map(|m| stat(&host, m));
    let [calls, errors, failure_mode] = common::eventually(counts, |c| *c == [3, 3, 6]);
    assert_eq!(calls, 3, "{}", host.log_text());
    assert_eq!(errors, 3);
    assert_eq!(failure_mode, 6);
    assert_eq!(
        host.log_text()
            .matches("circuit open after 3 consecutive failures")
            .count(),
        1,
        "{}",
        host.log_text()
    );
    assert_clean(&host);
}

/// Redis' error replies: the right password works; a wrong one makes every call answer NOAUTH (Higress
/// sends AUTH itself and drops its reply): the failure mode applies, the log says so once, and the
/// breaker opens. (A command of more than 10 arguments would get `Protocol error: unauthenticated
/// multibulk length` and a closed connection instead: resp::command leaves zero optional arguments
/// out.)
#[test]
fn redis_error_replies_and_passwords() {
    let dir = scratch_dir("higress-auth");
    let redis = Redis::start_with(&dir, &["--requirepass", "s3cret"]);
    let good = start(
        &exact_config(
            r#", "password": "s3cret""#,
            r#""failure_mode": "closed","#,
            3,
        ),
        redis.port,
    );
    assert_eq!(
        statuses(&good, "a", 4),
        [200, 200, 200, 429],
        "{}",
        good.log_text()
    );
    assert_clean(&good);

    let bad = start(
        &exact_config(
            r#", "password": "wrong""#,
            r#""failure_mode": "closed","#,
            3,
        ),
        redis.port,
    );
    assert_eq!(statuses(&bad, "a", 6), vec![503; 6], "{}", bad.log_text());
    let log = bad.log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("tollgate: backend error"))
        .collect();
    assert_eq!(lines.len(), 1, "one line, not one per request: {lines:#?}");
    assert!(
        lines[0].contains("(auth): Redis error: NOAUTH"),
        "{}",
        lines[0]
    );
    // An auth error trips the breaker: the calls stop (one line for that too).
    assert_eq!(
        log.matches("circuit open after 5 consecutive failures")
            .count(),
        1,
        "{log}"
    );
    assert_clean(&bad);
}

/// The Redis cluster removed and defined again, or defined anew in one push (xDS): the new
/// definition's client has Higress' defaults, no AUTH. A worker that found the cluster gone, or
/// whose call Redis refused with NOAUTH, sets its client up again before its next call, so its
/// checks are answered as the ACL user.
#[test]
fn a_cluster_defined_again_gets_its_client_set_up_again() {
    const PASSWORD: &str = "tollgate-acl-s3cret";
    let (redis, _admin, user) =
        common::redis_tls::redis_with_documented_user(&scratch_dir("higress-redefined"), PASSWORD);
    let credentials = format!(r#", "username": "{user}", "password": "{PASSWORD}""#);
    let mut cfg = host_config(
        &exact_config(&credentials, r#""failure_mode": "closed","#, 3),
        redis.port,
    );
    cfg.workers = 1;
    let host = Proxy::start(cfg).unwrap_or_else(|e| panic!("test host did not start: {e}"));
    assert_eq!(statuses(&host, "a", 1), [200], "{}", host.log_text());
    host.remove_cluster(CLUSTER);
    assert_eq!(statuses(&host, "b", 1), [503], "the cluster is gone");
    host.set_cluster(CLUSTER, Some(loopback(redis.port)));
    let ok = wait_until(Duration::from_secs(5), || get(&host, "probe").status == 200);
    assert!(ok, "{}", host.log_text());
    assert_eq!(
        statuses(&host, "c", 4),
        [200, 200, 200, 429],
        "{}",
        host.log_text()
    );
    // Defined anew in one push: the worker never finds it unknown, and its new client has no
    // AUTH. Redis' NOAUTH (the failure mode once) makes the worker set it up again.
    host.redefine_cluster(CLUSTER, loopback(redis.port));
    assert_eq!(statuses(&host, "d", 1), [503], "refused once: NOAUTH");
    assert_eq!(
        statuses(&host, "e", 4),
        [200, 200, 200, 429],
        "{}",
        host.log_text()
    );
    assert_clean(&host);
}

/// `backend.username` and `backend.password` against a real Redis ACL user, created with the
/// `ACL SETUSER` line of docs/deploy/redis.md (the `default` user has another password): the right
/// password admits the burst then 429, as that user; a wrong one gives the failure mode and the
/// `auth` class, and writes nothing.
#[test]
fn acl_user_from_the_docs_admits_and_a_wrong_password_is_auth() {
    const PASSWORD: &str = "tollgate-acl-s3cret";
    let (redis, mut admin, user) =
        common::redis_tls::redis_with_documented_user(&scratch_dir("higress-acl"), PASSWORD);

    let credentials =
        |password: &str| format!(r#", "username": "{user}", "password": "{password}""#);
    let good = start(
        &exact_config(&credentials(PASSWORD), r#""failure_mode": "closed","#, 3),
        redis.port,
    );
    let admitted = statuses(&good, "a", 5);
    eprintln!("ACL user {user}, right password: {admitted:?}");
    assert_eq!(admitted, [200, 200, 200, 429, 429], "{}", good.log_text());
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin).unwrap();
    assert!(
        clients
            .lines()
            .any(|l| l.contains(&format!(" user={user} "))),
        "no connection as {user}: {clients}"
    );
    let keys: u64 = redis::cmd("DBSIZE").query(&mut admin).unwrap();
    assert_eq!(keys, 1, "the bucket of a");
    assert_clean(&good);

    let bad = start(
        &exact_config(
            &credentials("not-the-password"),
            r#""failure_mode": "closed","#,
            3,
        ),
        redis.port,
    );
    let refused = statuses(&bad, "b", 6);
    let auth = stat_when(&bad, "backend_error.auth", |v| v >= 1);
    let log = bad.log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("tollgate: backend"))
        .collect();
    eprintln!(
        "wrong password: {refused:?}, backend_error.auth {auth}\n{}",
        lines.join("\n")
    );
    assert_eq!(refused, vec![503; 6], "{log}");
    assert!(auth >= 1, "{log}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("(auth): Redis error: NOAUTH")),
        "{lines:#?}"
    );
    let keys: u64 = redis::cmd("DBSIZE").query(&mut admin).unwrap();
    assert_eq!(keys, 1, "nothing written for b");
    assert_clean(&bad);
}

/// A fake Redis that answers every command with `reply`, then keeps the connection.
fn fake_redis(reply: Vec<u8>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let reply = reply.clone();
            std::thread::spawn(move || {
                let mut conn = conn;
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    while let Ok(Some(n)) = resp_frame_len(&buf, 0) {
                        buf.drain(..n);
                        if conn.write_all(&reply).is_err() {
                            return;
                        }
                    }
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    port
}

/// A reply larger than any script reply is not read into the VM: it is a malformed answer, the
/// failure mode applies; and a reply that is not the script's (a bulk string) is malformed too.
#[test]
fn oversized_and_foreign_replies_are_malformed() {
    // One byte over the bound (which leaves room for a batched call's reply).
    let size = tollgate_core::backend::MAX_REPLY_BYTES + 1 - 8 - 2;
    let mut big = format!("${size}\r\n").into_bytes();
    big.extend(std::iter::repeat_n(b'x', size));
    big.extend_from_slice(b"\r\n");
    assert_eq!(big.len(), tollgate_core::backend::MAX_REPLY_BYTES + 1);
    for (name, reply) in [("oversized", big), ("bulk", b"$2\r\nok\r\n".to_vec())] {
        let port = fake_redis(reply);
        let host = start(&failure_config("closed"), port);
        assert_eq!(
            statuses(&host, "a", 2),
            [503, 503],
            "{name}\n{}",
            host.log_text()
        );
        assert_eq!(stat_when(&host, "backend_errors", |v| v == 2), 2, "{name}");
        let log = host.log_text();
        assert!(log.contains("malformed backend reply"), "{name}\n{log}");
        if name == "oversized" {
            assert!(log.contains("not read"), "{log}");
        }
        assert_clean(&host);
    }
}

/// The Redis cluster unknown when the plugin starts (Higress answers proxy_redis_init with
/// BadArgument): calls fail by the failure mode until the cluster appears, then init is retried and
/// limiting works.
#[test]
fn cluster_that_appears_later() {
    let dir = scratch_dir("higress-late-cluster");
    let redis = Redis::start(&dir);
    let mut cfg = host_config(&failure_config("closed"), redis.port);
    cfg.clusters.clear();
    let host = Proxy::start(cfg).unwrap();
    assert!(
        host.log_text().contains("proxy_redis_init"),
        "{}",
        host.log_text()
    );
    assert_eq!(statuses(&host, "a", 2), [503, 503]);
    host.set_cluster(CLUSTER, Some(loopback(redis.port)));
    let ok = wait_until(Duration::from_secs(5), || get(&host, "probe").status == 200);
    assert!(ok, "{}", host.log_text());
    assert_eq!(statuses(&host, "b", 4), [200, 200, 200, 429]);
    assert_clean(&host);
}

/// Lease mode, two proxies with two workers each, one hot key far over its limit: the fleet never
/// admits more than burst + rate × elapsed, and most admissions need no Redis call.
#[test]
fn lease_two_proxies_never_over_the_limit() {
    let (rate, burst) = (200u64, 100u64);
    let cfg = format!(
        r#"{{ "backend": {{ "service_name": "{SERVICE}", "timeout_ms": 1000 }},
             "rules": [ {{ "name": "per-user", "match": {{ "path_prefix": "/api/" }},
                           "key": ["header:x-user-id"], "mode": "lease",
                           "rate": {rate}, "period_ms": 1000, "burst": {burst} }} ] }}"#
    );
    let dir = scratch_dir("higress-lease");
    let redis = Redis::start(&dir);
    let (a, b) = (start(&cfg, redis.port), start(&cfg, redis.port));
    let (sha, eval) = redis.script_calls();
    let on = (true, std::time::Duration::from_secs(2));
    let timed = common::drive_timed(&[a.port(), b.port()], 3, "hot", &[on]);
    let (sha2, eval2) = redis.script_calls();
    let calls = sha2 + eval2 - sha - eval;
    let count = |status: u16| timed.iter().filter(|t| t.status == status).count() as u64;
    let (ok, limited) = (count(200), count(429));
    eprintln!("higress lease: admitted {ok}, limited {limited}, script calls {calls}");
    let logs = format!("{}\n{}", a.log_text(), b.log_text());
    assert_eq!(ok + limited, timed.len() as u64, "no errors\n{logs}");
    assert!(limited > 0, "the load must exceed the limit");
    assert!(ok >= burst, "at least the burst ({ok})");
    common::assert_windows(&timed, burst, rate, 2, &logs);
    assert!(calls * 2 <= ok, "{calls} calls for {ok} admitted");
    assert_clean(&a);
    assert_clean(&b);
}

/// envoy/higress/wasmplugin.yaml: a Higress WasmPlugin whose defaultConfig the Higress build accepts
/// (on_configure, in the test host) and the HTTP build refuses with a message naming the field; the
/// Redis service is named the way Higress users write it, and the image is the Higress build's.
#[test]
fn higress_manifest_config_is_accepted_by_the_higress_build() {
    let text = std::fs::read_to_string(repo_root().join("envoy/higress/wasmplugin.yaml")).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    let plugin = docs
        .iter()
        .find(|d| d["kind"] == "WasmPlugin")
        .expect("a WasmPlugin document");
    assert_eq!(plugin["apiVersion"], "extensions.higress.io/v1alpha1");
    let spec = &plugin["spec"];
    assert!(
        spec["url"].as_str().unwrap().contains("tollgate-higress"),
        "{spec}"
    );
    assert!(
        spec.get("matchRules").is_none(),
        "matchRules become _rules_, which tollgate refuses"
    );
    let config = spec["defaultConfig"].to_string();
    let backend = &spec["defaultConfig"]["backend"];
    let service = backend["service_name"].as_str().unwrap();
    let port = backend["service_port"].as_u64().unwrap_or(6379);
    let cluster = format!("outbound|{port}||{service}");

    // A Redis with the manifest's password, so the configuration also works end to end.
    let dir = scratch_dir("higress-manifest");
    let mut redis_args = Vec::new();
    let password = backend["password"].as_str().map(str::to_string);
    if let Some(p) = &password {
        redis_args = vec!["--requirepass", p.as_str()];
    }
    let redis = Redis::start_with(&dir, &redis_args);
    let mut cfg = ProxyConfig::new(common::envoy::higress_wasm_path(), &config)
        .cluster(&cluster, loopback(redis.port));
    cfg.higress = true;
    let host =
        Proxy::start(cfg).unwrap_or_else(|e| panic!("the Higress build refused the manifest: {e}"));
    let rule = spec["defaultConfig"]["rules"][0].clone();
    let path = rule["match"]["path_prefix"]
        .as_str()
        .unwrap_or("/")
        .to_string()
        + "x";
    let key = rule["key"][0].as_str().unwrap_or_default();
    assert!(
        key == "client_ip" || key.starts_with("client_ip:"),
        "a key the client cannot choose: {key}"
    );
    let r = common::get(host.port(), &path, &[]);
    assert_eq!(r.status, 200, "{r:?}\n{}", host.log_text());
    assert!(r.header("ratelimit").is_some(), "the rule applied: {r:?}");
    let mut conn = redis.conn();
    if let Some(p) = &password {
        let _: () = redis::cmd("AUTH").arg(p).query(&mut conn).unwrap();
    }
    let (evalsha, eval) = common::script_calls(&mut conn);
    assert!(evalsha + eval >= 1, "the script ran in Redis");
    assert_clean(&host);

    let mut http = ProxyConfig::new(common::wasm_path(), &config);
    http.clusters.push((cluster, Some(loopback(redis.port))));
    let err = Proxy::start(http)
        .err()
        .expect("the HTTP build accepted a Higress configuration");
    assert!(err.contains("only in the Higress build"), "{err}");
}

/// The penalty box through Redis callouts (the RESP call of 13 arguments, the 6-integer reply):
/// an offence at one host boxes the key at a second host sharing the Redis, with the box's
/// Retry-After (10 minutes), not the bucket's (a token a minute). Higress itself never ran here:
/// this is the test host in Higress mode.
#[test]
fn a_penalty_box_holds_across_two_hosts() {
    let dir = scratch_dir("higress-penalty");
    let redis = Redis::start(&dir);
    let cfg = format!(
        r#"{{ "backend": {{ "service_name": "{SERVICE}", "timeout_ms": 1000 }},
             "rules": [ {{ "name": "per-user", "match": {{ "path_prefix": "/api/" }},
                           "key": ["header:x-user-id"], "rate": 1, "period_ms": 60000, "burst": 1,
                           "penalty": {{ "ms": [600000] }} }} ] }}"#
    );
    let (a, b) = (start(&cfg, redis.port), start(&cfg, redis.port));
    assert_eq!(get(&a, "eve").status, 200);
    let r = get(&a, "eve");
    assert_eq!(r.status, 429, "{r:?}\n{}", a.log_text());
    assert_eq!(r.header("retry-after"), Some("600"), "{r:?}");
    // B never saw eve: Redis answers that the key is boxed, with the box's time (the bucket
    // alone would say at most 60 s); another key is not boxed.
    assert_eq!(get(&b, "bob").status, 200);
    let r = get(&b, "eve");
    assert_eq!(r.status, 429, "{r:?}\n{}", b.log_text());
    let left: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((590..=600).contains(&left), "{r:?}");
    assert_eq!(stat_when(&b, "penalized", |v| v >= 1), 1);
    assert_eq!(stat_when(&a, "penalty_offences", |v| v >= 1), 1);
    assert_clean(&a);
    assert_clean(&b);
}
