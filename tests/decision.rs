//! The decision in Envoy's own access log, end to end: a real Envoy running envoy/envoy.yaml (its
//! access log format as shipped, written to a file here) in front of real Webdis and Redis. For an
//! admitted, a denied, a shadow-denied, a leased and a failure-mode request, the line Envoy wrote
//! names the rule, the outcome, the tokens left and who answered (`tollgate=`, the filter state
//! `wasm.tollgate`), and the filter's own replies carry `tollgate_rate_limited{<rule>}` or
//! `tollgate_backend_unavailable{<rule>}` in `%RESPONSE_CODE_DETAILS%`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::path::Path;
use std::time::Duration;

use common::envoy::{brief_log, render_envoy_yaml_logging, NO_UPSTREAM};
use common::{wait_until, wasm_path, Envoy, Redis, Webdis};

/// Envoy flushes a file access log every 10 s by default: a tenth of a second here, so the test
/// polls for its lines instead of waiting.
const FLUSH: [&str; 2] = ["--file-flush-interval-msec", "100"];

/// Envoy with envoy/envoy.yaml and `config`, its access log written to `log`.
fn envoy_logging_to(dir: &Path, config: &str, webdis_port: u16, log: &Path) -> Envoy {
    let wasm = wasm_path();
    Envoy::try_start_yaml_args(dir, &FLUSH, |listen, admin| {
        render_envoy_yaml_logging(
            config,
            webdis_port,
            listen,
            admin,
            &wasm,
            NO_UPSTREAM,
            &log.to_string_lossy(),
        )
    })
    .unwrap_or_else(|log| panic!("envoy did not start; log:\n{}", brief_log(&log)))
}

/// One access log line, as the shipped format writes it.
#[derive(Debug)]
struct Line {
    status: u16,
    details: String,
    /// What follows `tollgate=`: the decision record, or `-`.
    record: String,
}

/// The line of the request to `path` (each request of a test has its own path), once Envoy has
/// flushed it to `log`.
fn line(log: &Path, path: &str, envoy: &Envoy) -> Line {
    let request = format!("\"GET {path} HTTP/1.1\"");
    let mut found = None;
    let flushed = wait_until(Duration::from_secs(20), || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        found = text
            .lines()
            .find(|l| l.contains(&request))
            .map(str::to_string);
        found.is_some()
    });
    assert!(
        flushed,
        "no access log line for {path} in {}\nenvoy log:\n{}",
        log.display(),
        brief_log(&envoy.log_text())
    );
    let text = found.unwrap();
    // `[start] "GET path HTTP/1.1" status details address duration tollgate=record`
    let rest = text.split_once(&request).unwrap().1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    assert_eq!(fields.len(), 5, "{text}");
    Line {
        status: fields[0].parse().unwrap(),
        details: fields[1].to_string(),
        record: fields[4]
            .strip_prefix("tollgate=")
            .unwrap_or_else(|| panic!("no tollgate= field: {text}"))
            .to_string(),
    }
}

const CLOSED: &str = r#"{
  "backend": { "cluster": "tollgate_backend", "timeout_ms": 300 },
  "failure_mode": "closed",
  "response_headers": "ietf",
  "record_decisions": true,
  "rules": [
    { "name": "per-user", "match": { "path_prefix": "/api/" }, "key": ["header:x-user-id"],
      "rate": 1, "period_ms": 60000, "burst": 2 },
    { "name": "trial", "match": { "path_prefix": "/api/" }, "key": ["header:x-trial"],
      "rate": 1, "period_ms": 60000, "burst": 1, "shadow": true },
    { "name": "per-client", "match": { "path_prefix": "/lease/" }, "key": ["client_ip"],
      "rate": 100, "burst": 100, "mode": "lease" }
  ]
}"#;

#[test]
fn the_access_log_names_the_rule_the_outcome_and_who_answered() {
    let dir = common::scratch_dir("decision");
    let redis = Redis::start(&dir);
    let mut webdis = Webdis::start(&dir, redis.port);
    let log = dir.join("access.log");
    let envoy = envoy_logging_to(&dir, CLOSED, webdis.port, &log);
    let alice = [("x-user-id", "alice"), ("x-trial", "alice")];
    let statuses: Vec<u16> = (1..=4)
        .map(|i| envoy.get(&format!("/api/{i}"), &alice).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429, 429]);
    let got = |path: &str| line(&log, path, &envoy);

    // Admitted by Redis; the shadow rule too, with its last token.
    let l = got("/api/1");
    assert_eq!(
        (l.status, l.record.as_str()),
        (200, "per-user:admitted:1:redis,trial:admitted:0:redis")
    );
    assert!(!l.details.starts_with("tollgate"), "{l:?}");
    // Admitted; the shadow rule would have refused.
    let l = got("/api/2");
    assert_eq!(
        (l.status, l.record.as_str()),
        (200, "per-user:admitted:0:redis,trial:shadow_denied:0:redis")
    );
    // Denied by Redis, the shadow rule's denial from the deny cache.
    let l = got("/api/3");
    assert_eq!(
        (l.status, l.details.as_str(), l.record.as_str()),
        (
            429,
            "tollgate_rate_limited{per-user}",
            "per-user:denied:0:redis,trial:shadow_denied:0:deny_cache"
        )
    );
    // Denied with no call: the deny cache holds both keys.
    let l = got("/api/4");
    assert_eq!(
        (l.status, l.details.as_str(), l.record.as_str()),
        (
            429,
            "tollgate_rate_limited{per-user}",
            "per-user:denied:0:deny_cache,trial:shadow_denied:0:deny_cache"
        )
    );

    // Lease mode: the lease answers, and the tokens left are what the RateLimit header says.
    for i in 1..=3 {
        let path = format!("/lease/{i}");
        let r = envoy.get(&path, &[]);
        assert_eq!(r.status, 200);
        let l = got(&path);
        let fields: Vec<&str> = l.record.split(':').collect();
        assert_eq!(
            (fields.len(), fields[0], fields[1], fields[3]),
            (4, "per-client", "admitted", "lease"),
            "{l:?}"
        );
        let ratelimit = r.header("ratelimit").unwrap();
        assert!(
            ratelimit.starts_with(&format!("\"per-client\";r={};", fields[2])),
            "{ratelimit} against {l:?}"
        );
    }

    // No rule checked it: no record.
    assert_eq!(envoy.get("/other", &[]).status, 200);
    assert_eq!(got("/other").record, "-");

    // Webdis down: failure mode closed refuses, and says which rule it refused for.
    webdis.proc.stop();
    let r = envoy.get("/api/5", &[("x-user-id", "bob")]);
    assert_eq!(r.status, 503);
    let l = got("/api/5");
    assert_eq!(
        (l.status, l.details.as_str(), l.record.as_str()),
        (
            503,
            "tollgate_backend_unavailable{per-user}",
            "per-user:denied:-:failure_closed"
        )
    );

    // Failure mode local: the fallback bucket answers, and is named.
    let local = r#"{
      "backend": { "cluster": "tollgate_backend", "timeout_ms": 300 },
      "record_decisions": true,
      "rules": [ { "name": "per-user", "key": ["header:x-user-id"], "rate": 1,
                   "period_ms": 60000, "burst": 5,
                   "fallback": { "rate": 1, "period_ms": 60000, "burst": 1 } } ]
    }"#;
    let local_log = dir.join("access-local.log");
    let local_envoy = envoy_logging_to(&dir, local, webdis.port, &local_log);
    let carol = [("x-user-id", "carol")];
    let statuses: Vec<u16> = (1..=2)
        .map(|i| local_envoy.get(&format!("/fb/{i}"), &carol).status)
        .collect();
    assert_eq!(statuses, [200, 429]);
    let l = line(&local_log, "/fb/1", &local_envoy);
    assert_eq!(
        (l.status, l.record.as_str()),
        (200, "per-user:admitted:0:fallback")
    );
    let l = line(&local_log, "/fb/2", &local_envoy);
    assert_eq!(
        (l.status, l.details.as_str(), l.record.as_str()),
        (
            429,
            "tollgate_rate_limited{per-user}",
            "per-user:denied:0:fallback"
        )
    );
}
