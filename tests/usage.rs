//! Usage-based limits through a real Envoy, Webdis and Redis: an application behind Envoy reports
//! what each request used (a header, a JSON body, a server-sent event stream), and the difference
//! from the up-front cost is charged to the same global bucket.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use common::envoy::{brief_log, Envoy};
use common::upstream::{Upstream, HOLD};

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
    let wasm = common::wasm_path();
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

/// A JSON answer of a megabyte, its usage at the end: Envoy hands it over in chunks far larger
/// than the 16 KiB the filter keeps, of which the filter copies only each chunk's tail.
#[test]
fn usage_from_the_tail_of_a_large_json_body() {
    let body = format!(
        r#"{{"id":"c1","choices":[{{"text":"{}"}}],"usage":{{"total_tokens":40}}}}"#,
        "x".repeat(1 << 20)
    );
    let reply = vec![http_response("content-type: application/json\r\n", &body)];
    run(
        "usage-json-large",
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

/// One Envoy artifact reads usage from bodies and headers alike, so a `body_field` rule needs no
/// other build; the Higress artifact differs only in its Redis imports. tollgate.wasm refuses a
/// configuration meant for the Higress artifact (its Redis fields), naming the artifact to use.
#[test]
fn one_envoy_artifact_reads_bodies_and_names_the_higress_one_for_redis_fields() {
    let exports = |wasm: &std::path::Path| tollgate_testhost::module_interface(wasm).unwrap().1;
    let body = |names: &[String]| names.iter().any(|n| n == "proxy_on_response_body");
    let redis = |names: &[String]| names.iter().any(|n| n == "proxy_on_redis_call_response");
    let envoy = exports(&common::wasm_path());
    let higress = exports(&common::envoy::higress_wasm_path());
    assert!(body(&envoy) && !redis(&envoy), "{envoy:?}");
    assert!(body(&higress) && redis(&higress), "{higress:?}");
    let dir = common::scratch_dir("redis-fields-refused");
    let redis_config =
        r#"{ "backend": { "password": "p" }, "rules": [ { "name": "a", "rate": 1 } ] }"#;
    let log = match Envoy::try_start(&dir, redis_config, 9) {
        Ok(_) => panic!("tollgate.wasm accepted a Redis password"),
        Err(log) => log,
    };
    assert!(
        log.contains(
            "tollgate: bad configuration: backend.password: only in the Higress build \
             (tollgate-higress.wasm, Redis callouts); this build reaches Redis through Webdis"
        ),
        "{}",
        brief_log(&log)
    );
}

// ----- usage that never becomes readable: each way is charged the worst case -----
//
// Each attack below runs against the same rule (burst 100, up-front cost 1, usage read from
// `usage.total_tokens`): one honest request first (its stream reports 40, the largest usage the
// proxy has read), then the attack's requests until the first 429. An honest client gets 3 of 4;
// before the worst case existed, every attack got all 7 of 7.

/// The user's honest request: its answer reports 40 tokens.
const HONEST: (&str, &str) = ("x-mode", "honest");

/// Requests after the honest one; enough that an attack charged 1 each would never be denied.
const ATTACKS: usize = 6;

/// An event stream with these events, chunked, then `tail` (the end of the chunked body, or
/// [`HOLD`] to leave it open).
fn stream_of(events: &[&str], tail: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
        transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        .to_vec()];
    for e in events {
        out.push(format!("{:x}\r\n{e}\r\n", e.len()).into_bytes());
    }
    out.push(tail.to_vec());
    out
}

const CONTENT: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n";
const USAGE_40: &str =
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"total_tokens\":40}}\n\n";
const DONE: &str = "data: [DONE]\n\n";
const END: &[u8] = b"0\r\n\r\n";

/// The app: the honest request gets a stream reporting 40; every other one `attack(head)`.
fn app(attack: impl Fn(&str) -> Vec<Vec<u8>> + Send + Sync + 'static) -> Upstream {
    Upstream::start_with(move |head| {
        if head.contains("x-mode: honest") {
            event_stream(40)
        } else {
            attack(head)
        }
    })
}

/// Runs an attack: the honest request, then up to [`ATTACKS`] sent by `send` (its status) until
/// the first 429. Prints and returns (admitted, sent); Envoy stays up for the metrics.
fn attack(
    name: &str,
    envoy: &Envoy,
    app: &Upstream,
    send: impl Fn(&Envoy, &Upstream) -> u16,
) -> (usize, usize) {
    let r = envoy.get("/app/chat", &[("x-user-id", "ada"), HONEST]);
    assert_eq!(r.status, 200, "{r:?}\n{}", brief_log(&envoy.log_text()));
    let (mut admitted, mut sent) = (1, 1);
    for _ in 0..ATTACKS {
        sent += 1;
        match send(envoy, app) {
            200 => admitted += 1,
            429 => break,
            other => panic!("status {other}\n{}", brief_log(&envoy.log_text())),
        }
    }
    eprintln!("usage attack: {name}: admitted {admitted} of {sent} (an honest client: 3 of 4)");
    (admitted, sent)
}

/// Redis, Webdis and Envoy with the usage rule `usage` loaded from `wasm`, in front of `app`.
struct Proxy {
    envoy: Envoy,
    _backend: (common::Webdis, common::Redis),
}

fn proxy(name: &str, wasm: &std::path::Path, usage: &str, app: &Upstream) -> Proxy {
    proxy_yaml(name, wasm, usage, app, |yaml| yaml)
}

/// Like [`proxy`], with the rendered bootstrap passed through `edit`.
fn proxy_yaml(
    name: &str,
    wasm: &std::path::Path,
    usage: &str,
    app: &Upstream,
    edit: impl Fn(String) -> String,
) -> Proxy {
    let dir = common::scratch_dir(name);
    let redis = common::Redis::start(&dir);
    let webdis = common::Webdis::start(&dir, redis.port);
    let cfg = config(usage);
    let envoy = Envoy::try_start_yaml(&dir, |listen, admin| {
        edit(common::render_envoy_yaml(
            &cfg,
            webdis.port,
            listen,
            admin,
            wasm,
            app.port,
        ))
    })
    .unwrap_or_else(|log| panic!("{}", brief_log(&log)));
    Proxy {
        envoy,
        _backend: (webdis, redis),
    }
}

/// Asserts the honest client's figure: 3 admitted of 4 (the fourth denied).
fn assert_honest_figure(envoy: &Envoy, figure: (usize, usize)) {
    assert_eq!(figure, (3, 4), "{}", brief_log(&envoy.log_text()));
}

/// Polls the rule's counters until they are `want`, then asserts them (named without the
/// `wasmcustom.tollgate.llm.` prefix; a counter Envoy does not show reads 0).
fn assert_usage_counters(envoy: &Envoy, want: &[(&str, u64)]) {
    let read = |stats: &str, n: &str| {
        common::envoy::stat_in(stats, &format!("wasmcustom.tollgate.llm.{n}")).unwrap_or(0)
    };
    let stats = envoy.stats_when(|s| want.iter().all(|(n, v)| read(s, n) == *v));
    for (n, v) in want {
        assert_eq!(read(&stats, n), *v, "{n}");
    }
}

/// The honest answer's 39 plus two attacks charged 39 each (40 used, 1 paid up front).
const CHARGED: u64 = 3 * 39;

/// Asserts the honest client's figure, and both attacks admitted charged the worst case (39
/// each), counted in `why`.
fn assert_worst_case_twice(envoy: &Envoy, figure: (usize, usize), why: &str) {
    assert_honest_figure(envoy, figure);
    assert_usage_counters(
        envoy,
        &[
            (why, 2),
            ("usage_worst_case", 2),
            ("usage_charged", CHARGED),
        ],
    );
}

/// An OpenAI-compatible stream carries no usage unless the request asks for it
/// (`stream_options.include_usage`): such an answer is charged the largest usage read lately.
#[test]
fn a_stream_without_a_usage_event_is_charged_the_worst_case() {
    let app = app(|_| stream_of(&[CONTENT, DONE], END));
    let wasm = common::wasm_path();
    let p = proxy("usage-no-event", &wasm, BODY_FIELD, &app);
    let figure = attack(
        "stream without a usage event",
        &p.envoy,
        &app,
        |envoy, _| envoy.get("/app/chat", &[("x-user-id", "ada")]).status,
    );
    assert_honest_figure(&p.envoy, figure);
    assert_usage_counters(
        &p.envoy,
        &[
            ("usage_missing", 2),
            ("usage_worst_case", 2),
            ("usage_charged", CHARGED),
            ("usage_refunded", 0),
        ],
    );
}

const BODY_FIELD: &str = r#"{"body_field": "usage.total_tokens"}"#;

/// A usage header on two lines, the low one first (what a gateway that passes on a header the
/// client set, then adds the upstream's, sends), is charged the worst case: Envoy's
/// `get_header_map_value` would give the first line.
#[test]
fn a_usage_header_on_two_lines_is_charged_the_worst_case() {
    let app = Upstream::start_with(|head| {
        let usage = if head.contains("x-mode: honest") {
            "x-usage-tokens: 40\r\n"
        } else {
            "x-usage-tokens: 1\r\nx-usage-tokens: 40\r\n"
        };
        vec![http_response(usage, "done\n")]
    });
    let wasm = common::wasm_path();
    let p = proxy(
        "usage-header-twice",
        &wasm,
        r#"{"header": "x-usage-tokens"}"#,
        &app,
    );
    let figure = attack("usage header on two lines", &p.envoy, &app, |envoy, _| {
        envoy.get("/app/chat", &[("x-user-id", "ada")]).status
    });
    assert_honest_figure(&p.envoy, figure);
    assert_usage_counters(
        &p.envoy,
        &[
            ("usage_invalid", 2),
            ("usage_worst_case", 2),
            ("usage_charged", CHARGED),
            ("usage_refunded", 0),
        ],
    );
}

/// A JSON answer with usage 40, gzipped.
fn gzipped_answer() -> Vec<Vec<u8>> {
    use std::io::Write;
    let body = r#"{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":10,"total_tokens":40}}"#;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(body.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    let mut out = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        gz.len()
    )
    .into_bytes();
    out.extend_from_slice(&gz);
    vec![out]
}

/// A client asks for gzip: the filter asks the upstream for identity instead, so an upstream
/// that honours `accept-encoding` answers in the clear and its usage is read.
#[test]
fn a_usage_body_is_asked_for_unencoded() {
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = heads.clone();
    let app = app(move |head| {
        seen.lock().unwrap().push(head.to_ascii_lowercase());
        // An upstream that compresses when it may.
        if head.to_ascii_lowercase().contains("accept-encoding: gzip") {
            gzipped_answer()
        } else {
            vec![http_response(
                "content-type: application/json\r\n",
                r#"{"choices":[{"text":"hi"}],"usage":{"total_tokens":40}}"#,
            )]
        }
    });
    let wasm = common::wasm_path();
    let p = proxy("usage-gzip-asked", &wasm, BODY_FIELD, &app);
    let figure = attack("accept-encoding: gzip", &p.envoy, &app, |envoy, _| {
        let r = envoy.get(
            "/app/chat",
            &[("x-user-id", "ada"), ("accept-encoding", "gzip")],
        );
        if r.status == 200 {
            assert!(r.body.contains("total_tokens"), "{r:?}");
        }
        r.status
    });
    assert_honest_figure(&p.envoy, figure);
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 2, "the denied request never reached the app");
    for head in heads.iter() {
        assert!(head.contains("accept-encoding: identity\r\n"), "{head}");
    }
    assert_usage_counters(
        &p.envoy,
        &[
            ("usage_encoded", 0),
            ("usage_worst_case", 0),
            ("usage_charged", CHARGED),
        ],
    );
}

/// An upstream that compresses whatever the request says: the body cannot be read, so the
/// answer is charged the worst case.
#[test]
fn an_upstream_that_compresses_anyway_is_charged_the_worst_case() {
    let app = app(|_| gzipped_answer());
    let wasm = common::wasm_path();
    let p = proxy("usage-gzip-anyway", &wasm, BODY_FIELD, &app);
    let figure = attack("gzip despite identity", &p.envoy, &app, |envoy, _| {
        envoy
            .get(
                "/app/chat",
                &[("x-user-id", "ada"), ("accept-encoding", "gzip")],
            )
            .status
    });
    assert_honest_figure(&p.envoy, figure);
    assert_usage_counters(
        &p.envoy,
        &[
            ("usage_encoded", 2),
            ("usage_worst_case", 2),
            ("usage_charged", CHARGED),
        ],
    );
}

/// A raw GET of the chat for user ada that hangs up once it has read `until` (or the response
/// ended): the response's status. If the app answered, waits until Envoy has closed the app's
/// held connection (the filter ends the request before the router resets the upstream).
fn hang_up(envoy: &Envoy, app: &Upstream, until: &str) -> u16 {
    use std::io::{Read, Write};
    let closed = app.held_closed();
    let unfinished = "wasmcustom.tollgate.llm.usage_unfinished";
    let unfinished_before = envoy.stat_value(unfinished).unwrap_or(0);
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", envoy.listen_port)).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    conn.write_all(b"GET /app/chat HTTP/1.1\r\nhost: localhost\r\nx-user-id: ada\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(until) {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("{e} after {:?}", String::from_utf8_lossy(&got)),
        }
        // A denial is complete once its body is there.
        if String::from_utf8_lossy(&got).contains("rate limited\n") {
            break;
        }
    }
    drop(conn);
    let text = String::from_utf8_lossy(&got);
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    if status == 200 {
        let gone = common::wait_until(std::time::Duration::from_secs(10), || {
            app.held_closed() > closed
        });
        assert!(
            gone,
            "Envoy never closed the app's stream\n{}",
            brief_log(&envoy.log_text())
        );
        // The app sees its stream closed before Envoy ends the filter's request, where the
        // charge is recorded: the next request waits for the charge, or it could go out before it.
        let counted = envoy.stat_eventually(unfinished, |v| v.unwrap_or(0) > unfinished_before);
        assert!(
            counted.unwrap_or(0) > unfinished_before,
            "the hang-up was never counted in usage_unfinished\n{}",
            brief_log(&envoy.log_text())
        );
    }
    status
}

/// A client that reads the stream up to its usage event and hangs up before the end: the usage
/// it saw is settled.
#[test]
fn a_client_gone_after_the_usage_event_is_charged_that_usage() {
    let app = app(|_| stream_of(&[CONTENT, USAGE_40], HOLD));
    let wasm = common::wasm_path();
    let p = proxy("usage-hangup-after", &wasm, BODY_FIELD, &app);
    let figure = attack(
        "hang-up after the usage event",
        &p.envoy,
        &app,
        |envoy, app| hang_up(envoy, app, "total_tokens\":40"),
    );
    assert_honest_figure(&p.envoy, figure);
    assert_usage_counters(
        &p.envoy,
        &[
            ("usage_unfinished", 2),
            ("usage_worst_case", 0),
            ("usage_charged", CHARGED),
        ],
    );
}

/// A client that hangs up before any usage event: the worst case.
#[test]
fn a_client_gone_before_the_usage_event_is_charged_the_worst_case() {
    let app = app(|_| stream_of(&[CONTENT], HOLD));
    let wasm = common::wasm_path();
    let p = proxy("usage-hangup-before", &wasm, BODY_FIELD, &app);
    let figure = attack(
        "hang-up before the usage event",
        &p.envoy,
        &app,
        |envoy, app| hang_up(envoy, app, "Hello"),
    );
    assert_honest_figure(&p.envoy, figure);
    assert_usage_counters(
        &p.envoy,
        &[
            ("usage_unfinished", 2),
            ("usage_worst_case", 2),
            ("usage_charged", CHARGED),
        ],
    );
}

/// Envoy passes an HTTP/1 upstream's trailers on only with `enable_trailers`; gRPC and HTTP/2
/// upstreams send them anyway.
fn app_trailers(yaml: String) -> String {
    let app = "  - name: app\n    type: STATIC\n    connect_timeout: 0.25s\n";
    assert!(
        yaml.contains(app),
        "the app cluster moved in envoy/envoy.yaml"
    );
    yaml.replace(
        app,
        &format!(
            "{app}    typed_extension_protocol_options:\n      \
             envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \
             \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        \
             explicit_http_config:\n          http_protocol_options:\n            \
             enable_trailers: true\n"
        ),
    )
}

/// Trailers after the body: the body has ended at the trailers, and its usage is read then.
#[test]
fn trailers_after_the_body_end_it() {
    let app = app(|_| {
        stream_of(
            &[CONTENT, USAGE_40, DONE],
            b"0\r\nx-request-cost: 0\r\n\r\n",
        )
    });
    let wasm = common::wasm_path();
    let p = proxy_yaml("usage-trailers", &wasm, BODY_FIELD, &app, app_trailers);
    let figure = attack("trailers after the body", &p.envoy, &app, |envoy, _| {
        envoy.get("/app/chat", &[("x-user-id", "ada")]).status
    });
    assert_honest_figure(&p.envoy, figure);
    assert_usage_counters(
        &p.envoy,
        &[
            ("usage_unfinished", 0),
            ("usage_worst_case", 0),
            ("usage_charged", CHARGED),
        ],
    );
}

/// A JSON answer whose usage comes first and is followed by more than the 16 KiB the filter
/// keeps: the usage is out of reach, so the worst case.
#[test]
fn a_body_too_large_to_read_is_charged_the_worst_case() {
    let body = format!(
        r#"{{"usage":{{"total_tokens":1}},"choices":[{{"text":"{}"}}]}}"#,
        "x".repeat(20 * 1024)
    );
    let reply = vec![http_response("content-type: application/json\r\n", &body)];
    let app = app(move |_| reply.clone());
    let wasm = common::wasm_path();
    let p = proxy("usage-too-large", &wasm, BODY_FIELD, &app);
    let figure = attack("usage outside the window", &p.envoy, &app, |envoy, _| {
        envoy.get("/app/chat", &[("x-user-id", "ada")]).status
    });
    assert_worst_case_twice(&p.envoy, figure, "usage_too_large");
}

/// The default build (usage from a header): an answer without the header, and one with an
/// invalid value, are charged the worst case too.
#[test]
fn a_missing_or_invalid_usage_header_is_charged_the_worst_case() {
    let n = std::sync::atomic::AtomicU64::new(0);
    let upstream = Upstream::start_with(move |head| {
        let used = if head.contains("x-mode: honest") {
            "x-usage-tokens: 40\r\n"
        } else if n
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            .is_multiple_of(2)
        {
            ""
        } else {
            "x-usage-tokens: -1\r\n"
        };
        vec![http_response(used, "done\n")]
    });
    let p = proxy(
        "usage-header-missing",
        &common::wasm_path(),
        r#"{"header": "x-usage-tokens"}"#,
        &upstream,
    );
    let figure = attack(
        "usage header missing or invalid",
        &p.envoy,
        &upstream,
        |envoy, _| envoy.get("/app/chat", &[("x-user-id", "ada")]).status,
    );
    assert_honest_figure(&p.envoy, figure);
    assert_usage_counters(
        &p.envoy,
        &[
            ("usage_missing", 1),
            ("usage_invalid", 1),
            ("usage_worst_case", 2),
            ("usage_charged", CHARGED),
        ],
    );
}

/// `usage.unreadable` sets the worst case: with no honest answer read, a stream without usage
/// costs 60.
#[test]
fn a_configured_worst_case() {
    let app = Upstream::start_answering(stream_of(&[CONTENT, DONE], END));
    let wasm = common::wasm_path();
    let p = proxy(
        "usage-unreadable-fixed",
        &wasm,
        r#"{"body_field": "usage.total_tokens", "unreadable": 60}"#,
        &app,
    );
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let r = p.envoy.get("/app/chat", &[("x-user-id", "ada")]);
        statuses.push(r.status);
        if r.status == 429 {
            break;
        }
    }
    // 100 - 1, then 59 more: 40 left; the second leaves -20.
    assert_eq!(
        statuses,
        [200, 200, 429],
        "{}",
        brief_log(&p.envoy.log_text())
    );
    assert_usage_counters(
        &p.envoy,
        &[
            ("usage_missing", 2),
            ("usage_worst_case", 2),
            ("usage_charged", 2 * 59),
        ],
    );
}

/// An upstream that honours `Range` on its JSON answers (a static file, Go's `ServeContent`): a
/// client asks for a body over 16 KiB cut right after the first digit of its usage
/// (`"tokens_used":4` of `40`). The filter reads such a body from its tail, and takes no number
/// the body ends in as whole: each cut answer is charged the worst case. Against the build before,
/// every cut answer was charged 4: admitted 7 of 7.
#[test]
fn a_body_cut_in_its_usage_is_charged_the_worst_case() {
    let whole = format!(r#"{{"pad":"{}","tokens_used":40}}"#, "x".repeat(20_000));
    let cut_after = whole.find(":40}").unwrap() + 2;
    let app = Upstream::start_with(move |head| {
        let json = "content-type: application/json\r\n";
        if head.to_ascii_lowercase().contains("\r\nrange:") {
            let body = &whole[..cut_after];
            vec![format!(
                "HTTP/1.1 206 Partial Content\r\n{json}content-range: bytes 0-{}/{}\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                cut_after - 1,
                whole.len(),
                body.len()
            )
            .into_bytes()]
        } else {
            vec![http_response(json, &whole)]
        }
    });
    let wasm = common::wasm_path();
    let p = proxy(
        "usage-range-cut",
        &wasm,
        r#"{"body_field": "tokens_used"}"#,
        &app,
    );
    let figure = attack("body cut in its usage", &p.envoy, &app, |envoy, _| {
        let range = format!("bytes=0-{}", cut_after - 1);
        let status = envoy
            .get("/app/chat", &[("x-user-id", "ada"), ("range", &range)])
            .status;
        // The cut answer is the application's 206: admitted.
        if status == 206 {
            200
        } else {
            status
        }
    });
    assert_worst_case_twice(&p.envoy, figure, "usage_too_large");
}

/// A client that asks for a range of the answer picks the bytes the filter would read: here the
/// one item of a list answer that reports a usage of 1 (a whole JSON document on its own). A
/// partial answer (206 with a content-range) is charged the worst case, not the part's usage.
#[test]
fn a_partial_answer_to_a_range_request_is_charged_the_worst_case() {
    let part = r#"{"usage":{"total_tokens":1}}"#;
    let app = app(move |_| {
        vec![format!(
            "HTTP/1.1 206 Partial Content\r\ncontent-type: application/json\r\n\
             content-range: bytes 100-{}/4000\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{part}",
            100 + part.len() - 1,
            part.len()
        )
        .into_bytes()]
    });
    let wasm = common::wasm_path();
    let p = proxy("usage-range", &wasm, BODY_FIELD, &app);
    let figure = attack("a range of the answer", &p.envoy, &app, |envoy, _| {
        let r = envoy.get(
            "/app/chat",
            &[("x-user-id", "ada"), ("range", "bytes=100-127")],
        );
        // The part went to the client: admitted.
        match r.status {
            206 => 200,
            other => other,
        }
    });
    assert_worst_case_twice(&p.envoy, figure, "usage_too_large");
}
