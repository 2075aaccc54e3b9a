//! One request, one reading, through a real Envoy 1.40 with the shipped edge settings
//! (envoy/envoy.yaml): a client cannot get fresh buckets by sending a key source's name twice
//! (a cookie, a query parameter, a header line) while its application reads the spent value, nor
//! reach a path's `unlimited` override by a spelling only one reading calls that path.
//!
//! Each attack test prints what it measured (`admitted N of 16`) before asserting it. Against a
//! filter that keys on one reading (the first cookie, the first parameter, the lines joined), the
//! junk values each get a bucket: 8, 8 and 16 of 16 admitted; here the repeated requests share the
//! rule's one bucket for ambiguous requests, so its burst: 3 of 16.
//! Needs `make setup` and `make build`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::net::{IpAddr, Ipv4Addr};

use common::Stack;
use tollgate_core::config::Config;
use tollgate_core::rule::{bucket_key, bucket_key_of, Part};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// One rule `r` keyed on `key`, burst `burst`, refilling one token a minute (nothing refills
/// during a test).
fn config(key: &str, burst: u64, extra: &str) -> String {
    format!(
        r#"{{ "backend": {{ "timeout_ms": 2000 }},
             "rules": [ {{ "name": "r", "key": ["{key}"], "rate": 1, "period_ms": 60000,
                          "burst": {burst} {extra} }} ] }}"#
    )
}

/// A request that names the key source once or twice: (path, header lines).
type Spelled = (String, Vec<(&'static str, String)>);

fn status(stack: &Stack, (path, headers): &Spelled) -> u16 {
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let r = stack.raw_get(LOCALHOST, path, &headers);
    assert!(
        r.status == 200 || r.status == 429,
        "{r:?}\n{}",
        stack.logs()
    );
    r.status
}

/// The attack on a rule keyed on `source` with burst 3: `VALID` spends its 3, then 16 requests
/// name the source twice, a fresh junk value first (Django, Starlette, PHP and Rack read the last
/// one) or last (Go and Java read the first). Every other request spelling `VALID` alone (in any
/// way a server reads as `VALID`) stays in `VALID`'s spent bucket. Returns how many of the 16
/// were admitted, after printing it.
fn attack(
    name: &str,
    source: &str,
    once: impl Fn(&str) -> Spelled,
    twice: impl Fn(&str, &str) -> Spelled,
    also_valid: &[Spelled],
) -> usize {
    let cfg = config(source, 3, "");
    let stack = Stack::start(name, &cfg);
    let valid: Vec<u16> = (0..4).map(|_| status(&stack, &once("VALID"))).collect();
    assert_eq!(valid, [200, 200, 200, 429], "{}", stack.logs());
    let admitted = (0..16)
        .filter(|i| {
            let junk = format!("R{i}");
            let request = if i % 2 == 0 {
                twice(&junk, "VALID")
            } else {
                twice("VALID", &junk)
            };
            status(&stack, &request) == 200
        })
        .count();
    eprintln!("{source}: twice, junk and VALID: admitted {admitted} of 16");
    assert_eq!(admitted, 3, "{source}: admitted {admitted} of 16");
    for request in also_valid {
        assert_eq!(
            status(&stack, request),
            429,
            "{request:?} is VALID's bucket"
        );
    }
    // The shared bucket is the rule's marker bucket, in Redis under its digest; counted.
    let rule = Config::try_from(cfg.as_bytes()).unwrap().rules.remove(0);
    let shared = bucket_key_of("tollgate", "r", &rule.key, &[Part::Ambiguous]);
    assert!(stack.redis.exists(&shared), "{shared}\n{}", stack.logs());
    assert!(stack
        .redis
        .exists(&bucket_key("tollgate", "r", &rule.key, &[b"VALID"])));
    let counted = stack
        .envoy
        .stat_eventually("wasmcustom.tollgate.r.ambiguous", |v| v == Some(16));
    assert_eq!(counted, Some(16), "{}", stack.envoy.stats());
    admitted
}

fn no_headers(path: String) -> Spelled {
    (path, Vec::new())
}

#[test]
fn a_cookie_named_twice_gets_no_fresh_bucket() {
    let cookie = |v: String| ("/x".to_string(), vec![("cookie", v)]);
    attack(
        "ambiguous-cookie",
        "cookie:session",
        |v| cookie(format!("a=1; session={v}")),
        |a, b| cookie(format!("session={a}; session={b}")),
        &[
            cookie("session=\"VALID\"".into()),
            cookie("session=%56ALID".into()),
            // Two cookie lines, the name once.
            (
                "/x".into(),
                vec![("cookie", "a=1".into()), ("cookie", "session=VALID".into())],
            ),
        ],
    );
}

#[test]
fn a_query_parameter_named_twice_gets_no_fresh_bucket() {
    attack(
        "ambiguous-query",
        "query:key",
        |v| no_headers(format!("/x?key={v}")),
        |a, b| no_headers(format!("/x?key={a}&key={b}")),
        &[
            no_headers("/x?%6Bey=VALID".into()),
            no_headers("/x?key=V%41LID".into()),
            no_headers("/x?KEY=VALID".into()),
            no_headers("/x?a=1;key=VALID".into()),
            // PHP's name ends at a NUL.
            no_headers("/x?key%00junk=VALID".into()),
        ],
    );
}

/// Through a real Envoy, a request that asks its application to route it as another method
/// (Symfony, Laravel, Rack, ASP.NET Core's and Express's middleware, Slim, Yii) counts in a rule
/// naming that method: after 3 DELETEs spent the burst, each way of asking for DELETE is refused.
#[test]
fn a_request_that_asks_for_delete_counts_as_a_delete() {
    let cfg = config(
        "header:x-user",
        3,
        r#", "match": { "methods": ["DELETE"] }"#,
    );
    let stack = Stack::start("ambiguous-method", &cfg);
    let send = |method: &str, path: &str, headers: &[(&str, &str)]| {
        let mut lines = vec![("x-user", "ann")];
        lines.extend_from_slice(headers);
        stack.request(method, path, &lines).status
    };
    let deletes: Vec<u16> = (0..3).map(|_| send("DELETE", "/x", &[])).collect();
    assert_eq!(deletes, [200, 200, 200], "{}", stack.logs());
    assert_eq!(send("DELETE", "/x", &[]), 429);
    assert_eq!(send("POST", "/x", &[]), 200, "a POST is not a DELETE");
    for (method, path, headers) in [
        ("POST", "/x", &[("x-http-method-override", "DELETE")][..]),
        ("POST", "/x", &[("x-http-method", "delete")]),
        ("POST", "/x", &[("x-method-override", "DELETE, GET")]),
        ("POST", "/x?_method=DELETE", &[]),
        ("GET", "/x", &[("x-http-method-override", "DELETE")]),
    ] {
        assert_eq!(
            send(method, path, headers),
            429,
            "{method} {path} {headers:?}\n{}",
            stack.logs()
        );
    }
}

#[test]
fn a_header_sent_twice_gets_no_fresh_bucket() {
    let header = |lines: &[(&'static str, &str)]| -> Spelled {
        (
            "/x".into(),
            lines.iter().map(|(n, v)| (*n, v.to_string())).collect(),
        )
    };
    attack(
        "ambiguous-header",
        "header:x-api-key",
        |v| header(&[("x-api-key", v)]),
        |a, b| header(&[("x-api-key", a), ("x-api-key", b)]),
        // CGI, WSGI and PHP read `x_api_key` as `x-api-key` (Envoy passes it by default).
        &[header(&[("x_api_key", "VALID")])],
    );
}

/// The lines of envoy/envoy.yaml that set the edge settings (README: "Edge settings").
const EDGE_SETTINGS: [&str; 4] = [
    "use_remote_address:",
    "normalize_path:",
    "merge_slashes:",
    "path_with_escaped_slashes_action:",
];

/// The rendered bootstrap with Envoy's defaults for the edge settings (the lines removed).
fn envoy_defaults(yaml: String, _listen_port: u16) -> String {
    let kept: String = yaml
        .lines()
        .filter(|l| !EDGE_SETTINGS.iter().any(|s| l.trim_start().starts_with(s)))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        yaml.lines().count(),
        kept.lines().count() + EDGE_SETTINGS.len()
    );
    kept
}

const HEALTH_UNLIMITED: &str = r#", "overrides": [ { "key": ["/health"], "unlimited": true } ]"#;

fn statuses(stack: &Stack, path: &str) -> Vec<u16> {
    (0..6)
        .map(|_| status(stack, &no_headers(path.into())))
        .collect()
}

/// The override attack: `/health` unlimited on a `path`-keyed rule, burst 2, behind an Envoy with
/// its default path handling, which forwards `/api/search/..;/..;/health` as sent (so do most
/// routers: only a Java servlet container resolves `..;`). Only the reading that cuts `;params`
/// calls it `/health`: it is limited in `/health`'s bucket under the rule's burst, while `/health`
/// itself stays unlimited.
#[test]
fn a_path_override_is_not_reached_by_a_spelling_one_reading_resolves() {
    let stack = Stack::start_edited(
        "ambiguous-path-override",
        &config("path", 2, HEALTH_UNLIMITED),
        envoy_defaults,
    );
    let spelled = statuses(&stack, "/api/search/..;/..;/health");
    let admitted = spelled.iter().filter(|&&s| s == 200).count();
    eprintln!("/api/search/..;/..;/health: admitted {admitted} of 6 ({spelled:?})");
    assert_eq!(admitted, 2, "admitted {admitted} of 6\n{}", stack.logs());
    assert_eq!(spelled, [200, 200, 429, 429, 429, 429]);
    // The bucket is /health's (the loosest reading's); /health itself has its override.
    let key = bucket_key(
        "tollgate",
        "r",
        &[tollgate_core::config::KeySource::Path],
        &[b"/health"],
    );
    assert!(stack.redis.exists(&key), "{key}\n{}", stack.logs());
    assert_eq!(statuses(&stack, "/health"), [200; 6], "{}", stack.logs());
    for other in ["/x/..;/health", "/health;v=1", "//health", "/%68ealth"] {
        assert_eq!(
            statuses(&stack, other),
            [429; 6],
            "{other}\n{}",
            stack.logs()
        );
    }
}

/// With the shipped edge settings Envoy's `normalize_path` resolves `..;` as `..` itself (Envoy
/// 1.40), so the filter, Envoy's routes and the application all see `/health`: the override
/// applies, as it does to `/health`.
#[test]
fn with_the_edge_settings_envoy_resolves_the_spelling_itself() {
    let stack = Stack::start(
        "ambiguous-path-override-shipped",
        &config("path", 2, HEALTH_UNLIMITED),
    );
    assert_eq!(
        statuses(&stack, "/api/search/..;/..;/health"),
        [200; 6],
        "{}",
        stack.logs()
    );
    // A spelling Envoy keeps as sent still does not reach the override.
    assert_eq!(
        statuses(&stack, "/health;v=1"),
        [200, 200, 429, 429, 429, 429],
        "{}",
        stack.logs()
    );
}
