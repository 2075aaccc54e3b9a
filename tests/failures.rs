//! Failure modes and hostile input, end to end with real processes: Redis or Webdis dying, a
//! backend that never answers, wrong credentials, and request values built to break things. The
//! filter must never panic and never let a request bypass its rule.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{wait_until, Envoy, Stack, WebdisOpts};

fn config(failure_mode: &str, extra_backend: &str) -> String {
    format!(
        r#"{{ "backend": {{ "cluster": "tollgate_backend", "timeout_ms": 300,
                            "breaker_failures": 3, "breaker_cooloff_ms": 200 {extra_backend} }},
             "failure_mode": "{failure_mode}",
             "rules": [ {{ "name": "per-user", "key": ["header:x-user-id"],
                           "rate": 1, "period_ms": 60000, "burst": 3,
                           "fallback": {{ "rate": 1, "period_ms": 60000, "burst": 2 }} }} ] }}"#
    )
}

fn statuses(port: u16, user: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| common::get(port, "/x", &[("x-user-id", user)]).status)
        .collect()
}

/// No filter crash: the plugin still answers and still limits a fresh user exactly.
fn assert_filter_healthy(envoy: &Envoy) {
    let user = format!("health-{}", common::free_port());
    let got = statuses(envoy.listen_port, &user, 4);
    assert_eq!(got, [200, 200, 200, 429], "{}", envoy.log_text());
    let log = envoy.log_text();
    for bad in ["panicked", "wasm trap", "Function: proxy_on_"] {
        assert!(!log.contains(bad), "{bad} in the Envoy log:\n{log}");
    }
}

/// Redis dies under traffic: `open` admits, `closed` answers 503, `local` admits under the
/// fallback bucket. Redis comes back empty (no script cached): limiting resumes through NOSCRIPT.
#[test]
fn redis_down_then_back_per_failure_mode() {
    for (mode, during) in [
        ("open", vec![200, 200, 200, 200]),
        ("closed", vec![503, 503, 503, 503]),
        ("local", vec![200, 200, 429, 429]),
    ] {
        let mut stack = Stack::start(&format!("fail-redis-{mode}"), &config(mode, ""));
        assert_eq!(statuses(stack.port(), "a", 1), [200], "{}", stack.logs());
        let port = stack.redis.port;
        stack.redis.proc.stop();
        let got = statuses(stack.port(), "b", 4);
        assert_eq!(got, during, "{mode} while Redis is down\n{}", stack.logs());
        if mode == "closed" {
            let r = common::get(stack.port(), "/x", &[("x-user-id", "b")]);
            assert_eq!(r.header("retry-after"), Some("1"));
        }
        stack.redis = common::Redis::start_on(&stack.dir, port, &[]);
        // Enforcement resumes once Webdis reconnects and the breaker's probe succeeds: poll
        // until the script has written a bucket into the new (empty) Redis.
        let fresh = format!("after-{mode}");
        let resumed = wait_until(Duration::from_secs(10), || {
            common::get(stack.port(), "/x", &[("x-user-id", &fresh)]);
            let keys: u64 = redis::cmd("DBSIZE").query(&mut stack.redis.conn()).unwrap();
            keys > 0
        });
        assert!(resumed, "{mode}: limiting did not resume\n{}", stack.logs());
        let after = format!("later-{mode}");
        assert_eq!(statuses(stack.port(), &after, 4), [200, 200, 200, 429]);
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut stack.redis.conn())
            .unwrap();
        assert!(
            info.contains("cmdstat_eval:"),
            "the script came back through EVAL"
        );
    }
}

/// A fallback without its own `period_ms` counts in the rule's period: 60 per minute with a
/// fallback of 2 admits 2 per minute while Redis is down, not 2 per second. Twelve requests spread
/// over about 5 s stay within the fallback's bound for the time they took (a per-second fallback
/// admitted 10 of them).
#[test]
fn a_fallback_counts_in_the_rule_s_period() {
    let cfg = r#"{ "backend": { "cluster": "tollgate_backend", "timeout_ms": 300 },
                   "failure_mode": "local",
                   "rules": [ { "name": "per-user", "key": ["header:x-user-id"],
                                "rate": 60, "period_ms": 60000,
                                "fallback": { "rate": 2 } } ] }"#;
    let mut stack = Stack::start("fail-fallback-period", cfg);
    stack.redis.proc.stop();
    let start = Instant::now();
    let mut got = Vec::new();
    for i in 0..12 {
        // The attack's shape: requests spread over 5 s, so a per-second refill would show.
        let due = start + Duration::from_millis(450 * i);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        got.push(common::get(stack.port(), "/x", &[("x-user-id", "mallory")]).status);
    }
    let elapsed = start.elapsed();
    let admitted = got.iter().filter(|s| **s == 200).count() as u128;
    assert!(
        got.iter().all(|s| *s == 200 || *s == 429),
        "{got:?}\n{}",
        stack.logs()
    );
    // burst 2 + 2 per minute × the time taken.
    let bound = 2 + 2 * elapsed.as_millis() / 60_000;
    eprintln!(
        "fallback: {admitted} of 12 admitted in {:.1} s with Redis down (bound {bound}): {got:?}",
        elapsed.as_secs_f64()
    );
    assert!(
        admitted <= bound,
        "{admitted} admitted in {elapsed:?}, at most {bound}: {got:?}"
    );
    assert_eq!(&got[..2], [200, 200], "the fallback's burst admits");
}

/// Webdis dies: the same failure modes apply (Envoy answers the callout itself with 503).
#[test]
fn webdis_down_follows_failure_mode() {
    for (mode, want) in [("open", 200), ("closed", 503)] {
        let mut stack = Stack::start(&format!("fail-webdis-{mode}"), &config(mode, ""));
        stack.webdis.proc.stop();
        assert_eq!(
            statuses(stack.port(), "a", 5),
            vec![want; 5],
            "{}",
            stack.logs()
        );
    }
}

/// An unknown callout cluster: dispatch fails at once; the failure mode applies.
#[test]
fn unknown_cluster_follows_failure_mode() {
    let cfg = config("closed", "").replace("\"tollgate_backend\"", "\"no_such_cluster\"");
    let stack = Stack::start("fail-cluster", &cfg);
    assert_eq!(
        statuses(stack.port(), "a", 4),
        [503, 503, 503, 503],
        "{}",
        stack.logs()
    );
}

/// A backend answer too large to be a script reply (over `MAX_REPLY_BYTES`, the bound of a full
/// batched reply) is not read into the VM, and its HTTP status still says what it is: with 200 it
/// is not the script's reply (`malformed`, which does not open the breaker), with 503 the backend
/// cannot serve (`unreachable`). Either way the failure mode applies and nothing in the body is
/// taken for a reply.
#[test]
fn a_backend_answer_too_large_to_read_is_judged_by_its_status() {
    for (status, class) in [
        ("200 OK", "malformed"),
        ("503 Service Unavailable", "unreachable"),
    ] {
        let size = tollgate_core::backend::MAX_REPLY_BYTES + 1;
        let mut answer =
            format!("HTTP/1.1 {status}\r\ncontent-length: {size}\r\nconnection: close\r\n\r\n")
                .into_bytes();
        // A body that would decode as an admission if it were read: it must not be.
        let reply = br#"{"EVALSHA":[1,99,0,10,1]}"#;
        answer.extend_from_slice(reply);
        answer.resize(answer.len() + size - reply.len(), b' ');
        let backend = common::upstream::Upstream::start_answering(vec![answer]);
        let dir = common::scratch_dir("fail-big-answer");
        let envoy = Envoy::start(&dir, &config("closed", ""), backend.port);
        assert_eq!(
            statuses(envoy.listen_port, "a", 2),
            [503, 503],
            "{status}\n{}",
            envoy.log_text()
        );
        let name = format!("wasmcustom.tollgate.per-user.backend_error.{class}");
        assert_eq!(
            envoy.stat_eventually(&name, |v| v == Some(2)),
            Some(2),
            "{status}: {name}\n{}",
            envoy.log_text()
        );
    }
}

/// A backend that accepts connections and never answers: each request ends after the callout
/// timeout (not hanging), by the failure mode; after 3 failures the breaker opens and requests
/// stop waiting for it at all.
#[test]
fn silent_backend_times_out_and_opens_the_breaker() {
    let port = common::silent_backend();
    let dir = common::scratch_dir("fail-silent");
    let cfg = config("open", "").replace(
        "\"breaker_cooloff_ms\": 200",
        "\"breaker_cooloff_ms\": 600000",
    );
    let envoy = Envoy::start(&dir, &cfg, port);
    let mut took = Vec::new();
    for _ in 0..6 {
        let t0 = Instant::now();
        let r = common::get(envoy.listen_port, "/x", &[("x-user-id", "a")]);
        took.push(t0.elapsed());
        assert_eq!(r.status, 200, "open admits\n{}", envoy.log_text());
    }
    // Liveness, not speed: every request came back, well before the client's own 10 s timeout.
    assert!(took.iter().all(|d| *d < Duration::from_secs(5)), "{took:?}");
    let read = |stats: &str, n: &str| {
        common::envoy::stat_in(stats, &format!("wasmcustom.tollgate.per-user.{n}")).unwrap()
    };
    let stats = envoy.stats_when(|s| {
        let got = ["backend_calls", "backend_errors", "failure_mode_allowed"].map(|n| read(s, n));
        got == [3, 3, 6]
    });
    let stat = |n: &str| read(&stats, n);
    assert_eq!(
        stat("backend_calls"),
        3,
        "the breaker stopped the calls after 3 failures"
    );
    assert_eq!(stat("backend_errors"), 3);
    assert_eq!(stat("failure_mode_allowed"), 6);
    assert_eq!(
        envoy
            .log_text()
            .matches("circuit open after 3 consecutive failures")
            .count(),
        1
    );
}

/// Redis with a password: Webdis with the right one works; with a wrong one every call fails,
/// the failure mode applies, and the log says so once (not once per request).
#[test]
fn redis_password_right_and_wrong() {
    let good = WebdisOpts {
        redis_auth: Some("s3cret".to_string()),
        ..Default::default()
    };
    let stack = Stack::start_with(
        "fail-auth-good",
        &config("closed", ""),
        &["--requirepass", "s3cret"],
        &good,
    );
    assert_eq!(
        statuses(stack.port(), "a", 4),
        [200, 200, 200, 429],
        "{}",
        stack.logs()
    );

    let bad = WebdisOpts {
        redis_auth: Some("wrong".to_string()),
        ..Default::default()
    };
    let stack = Stack::start_with(
        "fail-auth-bad",
        &config("closed", ""),
        &["--requirepass", "s3cret"],
        &bad,
    );
    assert_eq!(
        statuses(stack.port(), "a", 10),
        vec![503; 10],
        "{}",
        stack.logs()
    );
    // One line per change of state, not one per request: the auth class starts failing, and
    // (auth errors mean this backend cannot serve) the breaker opens. Redis answers NOAUTH, or (to
    // an unauthenticated client's EVAL) "unauthenticated multibulk length" and closes, which
    // Webdis may follow with a 503: each class logs once.
    let log = stack.envoy.log_text();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("tollgate: backend error"))
        .collect();
    let classes: Vec<&str> = errors
        .iter()
        .filter_map(|l| l.split("backend error (").nth(1)?.split(')').next())
        .collect();
    let mut unique = classes.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        classes.len(),
        "one line per class: {errors:#?}"
    );
    assert!(
        errors.iter().any(
            |l| l.contains("(auth)") && (l.contains("NOAUTH") || l.contains("unauthenticated"))
        ),
        "{errors:#?}"
    );
    assert_eq!(log.matches("circuit open").count(), 1, "{}", stack.logs());
}

/// Webdis' basic-auth ACL with wrong credentials: 403 from Webdis is a backend failure.
#[test]
fn webdis_acl_wrong_credentials_follow_failure_mode() {
    let opts = WebdisOpts {
        basic_auth: Some("tollgate:right".to_string()),
        ..Default::default()
    };
    let cfg = config("closed", r#", "basic_auth": "tollgate:wrong""#);
    let stack = Stack::start_with("fail-acl", &cfg, &[], &opts);
    assert_eq!(
        statuses(stack.port(), "a", 3),
        [503, 503, 503],
        "{}",
        stack.logs()
    );
}

/// Sends raw bytes as an HTTP/1.1 request and returns the status code (0 if none came back).
fn raw_status(port: u16, request: &[u8]) -> u16 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Key values built to break a URL, Webdis' parser, JSON or the filter itself are just more
/// keys: each is limited on its own, none reaches another user's bucket, and the filter stays up.
#[test]
fn hostile_key_values_are_just_keys() {
    let stack = Stack::start("fail-hostile", &config("closed", ""));
    let port = stack.port();
    let hostile = [
        "a/b",
        "a+b",
        "a?b=c",
        "100%",
        "%2F%00",
        "x.json",
        "x.txt",
        "..",
        "../../etc",
        "{per-user:tag}",
        "EVAL/x",
        "\"quoted\"",
    ];
    for value in hostile {
        assert_eq!(
            statuses(port, value, 4),
            [200, 200, 200, 429],
            "value {value:?}\n{}",
            stack.logs()
        );
    }
    // "a" was never used: all the values above that decode or split to it did not touch it.
    assert_eq!(statuses(port, "a", 1), [200]);

    // Bytes that are not UTF-8 (obs-text is legal in a header value).
    let req =
        b"GET /x HTTP/1.1\r\nHost: t\r\nx-user-id: \xff\xfe\x80bin\r\nConnection: close\r\n\r\n";
    let got: Vec<u16> = (0..4).map(|_| raw_status(port, req)).collect();
    assert_eq!(got, [200, 200, 200, 429], "{}", stack.logs());

    // NUL and bare CR/LF never reach the filter: Envoy's codec refuses them.
    let nul = b"GET /x HTTP/1.1\r\nHost: t\r\nx-user-id: a\x00b\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_status(port, nul), 400);

    // A 50 KiB value (under Envoy's 60 KiB header limit) is digested like any other.
    let big = "v".repeat(50 * 1024);
    assert_eq!(statuses(port, &big, 4), [200, 200, 200, 429]);

    // Thousands of distinct keys: Redis holds each only until it would be full again.
    let keys_before: u64 = redis::cmd("DBSIZE").query(&mut stack.redis.conn()).unwrap();
    for i in 0..2000 {
        let r = common::get(port, "/x", &[("x-user-id", &format!("many-{i}"))]);
        assert_eq!(r.status, 200);
    }
    let mut conn = stack.redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tollgate:*")
        .query(&mut conn)
        .unwrap();
    assert!(keys.len() as u64 >= 2000 + keys_before.min(1));
    for k in keys.iter().take(200) {
        let ttl: i64 = redis::cmd("PTTL").arg(k).query(&mut conn).unwrap();
        assert!(ttl > 0, "{k} has no expiry ({ttl})");
        assert!(
            k.starts_with("tollgate:{per-user:") && k.len() == "tollgate:{per-user:}".len() + 32,
            "{k}"
        );
    }
    assert_filter_healthy(&stack.envoy);
}

/// Statuses of `GET /x` as `x-user-id: user` from 16 clients at once for `secs`, counted by status
/// (0: no answer within the client's 10 s).
fn hammer(port: u16, user: &'static str, secs: f64) -> std::collections::BTreeMap<u16, u64> {
    let handles: Vec<_> = (0..16)
        .map(|_| {
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_secs_f64(secs) {
                    seen.push(common::get(port, "/x", &[("x-user-id", user)]).status);
                }
                seen
            })
        })
        .collect();
    let mut counts = std::collections::BTreeMap::new();
    for h in handles {
        for s in h.join().unwrap() {
            *counts.entry(s).or_insert(0) += 1;
        }
    }
    counts
}

/// One hot exact key shared across Envoy's two workers while Redis dies under it and comes back:
/// every request is answered (503 from `closed` while Redis is away, never a hang), nothing traps,
/// and shared calls resume once Redis is back.
#[test]
fn a_hot_exact_key_shared_across_workers_rides_out_redis_dying() {
    let cfg = config("closed", "").replace("\"burst\": 3", "\"burst\": 1000000");
    let mut stack = Stack::start("fail-shared-exact", &cfg);
    let port = stack.port();
    let before = hammer(port, "hot", 1.0);
    assert_eq!(
        before.keys().copied().collect::<Vec<_>>(),
        [200],
        "{before:?}"
    );
    let redis_port = stack.redis.port;
    stack.redis.proc.stop();
    let during = hammer(port, "hot", 1.0);
    assert!(
        during.keys().all(|s| [200, 503].contains(s)),
        "only admissions still in flight and the failure mode: {during:?}\n{}",
        stack.logs()
    );
    assert!(during.get(&503).is_some_and(|n| *n > 0), "{during:?}");
    stack.redis = common::Redis::start_on(&stack.dir, redis_port, &[]);
    let resumed = wait_until(Duration::from_secs(10), || {
        common::get(port, "/x", &[("x-user-id", "hot")]).status == 200
    });
    assert!(resumed, "limiting did not resume\n{}", stack.logs());
    let after = hammer(port, "hot", 1.0);
    assert_eq!(
        after.keys().copied().collect::<Vec<_>>(),
        [200],
        "{after:?}"
    );
    let forwarded = stack
        .envoy
        .stat_eventually("wasmcustom.tollgate.per-user.forwarded", |v| {
            v.is_some_and(|n| n > 0)
        })
        .unwrap_or(0);
    eprintln!("shared exact, Redis dying: before {before:?}, during {during:?}, after {after:?}, forwarded {forwarded}");
    assert!(forwarded > 0, "the workers shared calls");
    let log = stack.envoy.log_text();
    for bad in ["panicked", "wasm trap", "Function: proxy_on_"] {
        assert!(!log.contains(bad), "{bad} in the Envoy log:\n{log}");
    }
}
