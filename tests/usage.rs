//! Usage-based limits through a real Envoy, Webdis and Redis: an application behind Envoy reports
//! what each request used (a header, a JSON body, a server-sent event stream), and the difference
//! from the up-front cost is charged to the same global bucket.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::envoy::{brief_log, Envoy};
use common::upstream::Upstream;

/// Rate 1/min, burst 100, up-front cost 1, the usage read from `usage`.
fn config(usage: &str) -> String {
    format!(
        r#"{{ "backend": {{ "timeout_ms": 2000 }},
        "rules": [ {{ "name": "llm", "match": {{ "path_prefix": "/app/" }}, "key": ["header:x-user-id"],
                     "rate": 1, "period_ms": 60000, "burst": 100, "usage": {usage} }} ] }}"#
    )
}

fn http_response(headers: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A streamed answer: chunked transfer, one chunk per event, the last carrying `usage`.
fn event_stream(used: u64) -> Vec<Vec<u8>> {
    let events = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n".to_string(),
        "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n".to_string(),
        format!("data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":10,\"total_tokens\":{used}}}}}\n\n"),
        "data: [DONE]\n\n".to_string(),
    ];
    let mut out = vec![b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
        transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        .to_vec()];
    for e in events {
        out.push(format!("{:x}\r\n{e}\r\n", e.len()).into_bytes());
    }
    out.push(b"0\r\n\r\n".to_vec());
    out
}

/// Sequential requests for one user until the first 429: (admitted, that 429's retry-after).
fn until_denied(envoy: &Envoy, app: &Upstream, body_check: &str) -> (usize, u64) {
    for n in 0..10 {
        let r = envoy.get("/app/chat", &[("x-user-id", "ada")]);
        match r.status {
            200 => assert!(r.body.contains(body_check), "{r:?}"),
            429 => {
                let retry = r.header("retry-after").unwrap().parse().unwrap();
                assert_eq!(
                    app.hits() as usize,
                    n,
                    "denied requests never reach the app"
                );
                return (n, retry);
            }
            other => panic!("status {other}: {r:?}\n{}", brief_log(&envoy.log_text())),
        }
    }
    panic!("never denied:\n{}", brief_log(&envoy.log_text()));
}

fn run(name: &str, usage: &str, reply: Vec<Vec<u8>>, body_check: &str) -> Envoy {
    let dir = common::scratch_dir(name);
    let redis = common::Redis::start(&dir);
    let webdis = common::Webdis::start(&dir, redis.port);
    let app = Upstream::start_answering(reply);
    // The build that reads bodies: these runs take usage from a header or from the body.
    let wasm = common::envoy::usage_body_wasm_path();
    let envoy = Envoy::try_start_wasm(&dir, &wasm, &config(usage), (webdis.port, app.port))
        .unwrap_or_else(|log| panic!("{}", brief_log(&log)));
    let (admitted, retry) = until_denied(&envoy, &app, body_check);
    // 100 - 1, then 39 more charged on each next call: 99, 59, 19 left; the fourth finds -20.
    assert_eq!(admitted, 3, "{}", brief_log(&envoy.log_text()));
    // The debt (20 tokens) plus the token asked for refill at 1/min: 21 minutes.
    assert_eq!(retry, 21 * 60, "Retry-After reflects the debt");
    let read = |stats: &str, n: &str| {
        common::envoy::stat_in(stats, &format!("wasmcustom.tollgate.llm.{n}")).unwrap_or(0)
    };
    let stats = envoy.stats_when(|s| {
        (
            read(s, "usage_charged"),
            read(s, "allowed"),
            read(s, "denied"),
        ) == (3 * 39, 3, 1)
    });
    let get = |n: &str| read(&stats, n);
    assert_eq!(get("usage_charged"), 3 * 39);
    assert_eq!(get("allowed"), 3);
    assert_eq!(get("denied"), 1);
    drop((webdis, redis));
    envoy
}

#[test]
fn usage_from_a_response_header() {
    let reply = vec![http_response("x-usage-tokens: 40\r\n", "done\n")];
    run(
        "usage-header",
        r#"{"header": "x-usage-tokens"}"#,
        reply,
        "done",
    );
}

#[test]
fn usage_from_a_json_body() {
    let body =
        r#"{"id":"c1","choices":[{"text":"hi"}],"usage":{"prompt_tokens":10,"total_tokens":40}}"#;
    let reply = vec![http_response("content-type: application/json\r\n", body)];
    run(
        "usage-json",
        r#"{"body_field": "usage.total_tokens"}"#,
        reply,
        "choices",
    );
}

#[test]
fn usage_from_the_last_event_of_a_stream() {
    run(
        "usage-sse",
        r#"{"body_field": "usage.total_tokens"}"#,
        event_stream(40),
        "[DONE]",
    );
}

/// A response that used less than the up-front cost gives tokens back (never past the burst).
#[test]
fn a_refund_never_fills_past_the_burst() {
    let dir = common::scratch_dir("usage-refund");
    let redis = common::Redis::start(&dir);
    let webdis = common::Webdis::start(&dir, redis.port);
    let app = Upstream::start_answering(vec![http_response("x-used: 0\r\n", "ok\n")]);
    let cfg = r#"{ "backend": { "timeout_ms": 2000 },
        "rules": [ { "name": "r", "match": { "path_prefix": "/app/" }, "key": ["header:x-user-id"],
                     "rate": 1, "period_ms": 60000, "burst": 10, "cost": 4,
                     "usage": { "header": "x-used" } } ] }"#;
    let envoy = Envoy::try_start_with_upstream(&dir, cfg, webdis.port, app.port)
        .unwrap_or_else(|log| panic!("{}", brief_log(&log)));
    // Without refunds two requests would fit (10 / 4); each gives its 4 back, so all pass.
    for _ in 0..6 {
        let r = envoy.get("/app/x", &[("x-user-id", "bo")]);
        assert_eq!(r.status, 200, "{r:?}\n{}", brief_log(&envoy.log_text()));
        // The remaining tokens shown never exceed the burst.
        let ratelimit = r.header("ratelimit").unwrap();
        let remaining: u64 = ratelimit
            .split(";r=")
            .nth(1)
            .and_then(|v| v.split(';').next())
            .unwrap()
            .parse()
            .unwrap();
        assert!(remaining <= 10, "{ratelimit}");
    }
    drop((webdis, redis));
}

/// Reading response bodies costs Envoy a call into the VM for every chunk of every response, so
/// only the usage-body build (and the Higress build, see tests/higress.rs) exports that callback.
/// The default build takes usage from headers (`a_refund_never_fills_past_the_burst` runs on it) and
/// refuses a `body_field` rule, naming it and the build to use.
#[test]
fn only_the_usage_body_build_reads_bodies_and_the_default_refuses_body_field() {
    let exports = |wasm: &std::path::Path| tollgate_testhost::module_interface(wasm).unwrap().1;
    let body = |names: Vec<String>| names.iter().any(|n| n == "proxy_on_response_body");
    assert!(!body(exports(&common::wasm_path())));
    assert!(body(exports(&common::envoy::usage_body_wasm_path())));
    let dir = common::scratch_dir("usage-body-refused");
    let log = match Envoy::try_start(&dir, &config(r#"{"body_field": "usage.total_tokens"}"#), 9) {
        Ok(_) => panic!("the default build accepted a body_field rule"),
        Err(log) => log,
    };
    assert!(
        log.contains(
            "tollgate: bad configuration: rules[0].usage.body_field: needs \
             tollgate-usage-body.wasm, the build that reads response bodies"
        ),
        "{}",
        brief_log(&log)
    );
}
