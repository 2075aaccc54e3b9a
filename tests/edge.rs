//! Edge hardening through a real Envoy: a client cannot escape a rule by how it spells the path, by
//! writing its own `x-forwarded-for`, or by hopping inside its IPv6 /64 (repeating a key source's
//! name: tests/ambiguity.rs).
//! Each path test runs twice: with the edge settings envoy/envoy.yaml ships (`normalize_path`,
//! `merge_slashes`, `path_with_escaped_slashes_action`, `use_remote_address`) and with Envoy's
//! defaults, where the filter sees every spelling as sent and must normalise it itself.
//! Needs `make setup` and `make build`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::Stack;
use tollgate_core::config::KeySource;
use tollgate_core::rule::bucket_key;

/// The four lines of envoy/envoy.yaml that make it edge-safe.
const EDGE_SETTINGS: [&str; 4] = [
    "use_remote_address:",
    "normalize_path:",
    "merge_slashes:",
    "path_with_escaped_slashes_action:",
];

/// The rendered bootstrap as shipped.
fn shipped(yaml: String, _listen_port: u16) -> String {
    for setting in EDGE_SETTINGS {
        assert!(
            yaml.lines().any(|l| l.trim_start().starts_with(setting)),
            "envoy/envoy.yaml sets {setting}"
        );
    }
    yaml
}

/// The rendered bootstrap with Envoy's defaults for the edge settings (the lines removed).
fn envoy_defaults(yaml: String, _listen_port: u16) -> String {
    yaml.lines()
        .filter(|l| !EDGE_SETTINGS.iter().any(|s| l.trim_start().starts_with(s)))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn config(rule: &str) -> String {
    format!(
        r#"{{ "backend": {{ "timeout_ms": 2000 }},
             "rules": [ {{ "name": "r", "rate": 1, "period_ms": 60000, {rule} }} ] }}"#
    )
}

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Statuses of `n` requests for `path` as user `user`.
fn statuses(stack: &Stack, path: &str, user: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| {
            stack
                .raw_get(LOCALHOST, path, &[("x-user-id", user)])
                .status
        })
        .collect()
}

/// The hardening issue's attack: `path_prefix: /api/`, burst 3. Every spelling of /api/x is limited
/// after 3, and all spellings of one path share one `path` bucket.
fn path_spellings_are_limited(stack: &Stack, spellings: &[&str]) {
    let limited = [200, 200, 200, 429, 429, 429, 429, 429];
    for (i, spelling) in spellings.iter().enumerate() {
        let got = statuses(stack, spelling, &format!("u{i}"), 8);
        eprintln!("{spelling:<16} {got:?}");
        assert_eq!(got, limited, "{spelling}\n{}", stack.logs());
    }
    // One user cycling through the spellings: 3 admitted in all, the bucket is /api/x's.
    let mut admitted = 0;
    for round in 0..2 {
        for spelling in spellings {
            let r = stack.raw_get(LOCALHOST, spelling, &[("x-user-id", "mix")]);
            assert!(
                r.status == 200 || r.status == 429,
                "{round} {spelling}: {r:?}"
            );
            admitted += usize::from(r.status == 200);
        }
    }
    assert_eq!(admitted, 3, "{}", stack.logs());
    assert_eq!(statuses(stack, "/api/x", "mix", 1), [429]);
    // Not under /api/: not limited.
    assert_eq!(statuses(stack, "/other/x", "u0", 5), [200; 5]);
}

const PATH_RULE: &str = r#""match": { "path_prefix": "/api/" }, "key": ["header:x-user-id", "path"],
                          "burst": 3"#;

#[test]
fn path_spellings_with_shipped_settings() {
    let stack = Stack::start_edited("edge-paths-shipped", &config(PATH_RULE), shipped);
    path_spellings_are_limited(
        &stack,
        &["/api/x", "//api/x", "/./api/x", "/%61pi/x", "/x/../api/x"],
    );
    // path_with_escaped_slashes_action: REJECT_REQUEST: Envoy refuses an encoded slash itself.
    let r = stack.raw_get(LOCALHOST, "/api%2Fx", &[("x-user-id", "u9")]);
    assert_eq!(r.status, 400, "{r:?}");
    // normalize_path clamps `..` at the root, so the filter sees /other: not under /api/.
    assert_eq!(statuses(&stack, "/../other", "u9", 5), [200; 5]);
}

#[test]
fn path_spellings_with_envoy_defaults() {
    let stack = Stack::start_edited("edge-paths-default", &config(PATH_RULE), envoy_defaults);
    path_spellings_are_limited(
        &stack,
        &[
            "/api/x",
            "//api/x",
            "/./api/x",
            "/%61pi/x",
            "/x/../api/x",
            "/api%2Fx",
            "/api%2fx",
            "/api\\x",
            "/api;jsessionid=1/x",
            "/x/..;/api/x",
        ],
    );
    // An irregular path (`..` above the root, a bad escape) counts against every path rule.
    assert_eq!(
        statuses(&stack, "/../other", "u-irregular", 5),
        [200, 200, 200, 429, 429]
    );
    assert_eq!(
        statuses(&stack, "/other/%zz", "u-bad-escape", 5),
        [200, 200, 200, 429, 429]
    );
    // Case is kept: /API/ is another path (README: path_ignore_case).
    assert_eq!(statuses(&stack, "/API/x", "u-case", 5), [200; 5]);
}

const IP_RULE: &str = r#""key": ["client_ip"], "burst": 2"#;

/// Five requests, each with another x-forwarded-for, from one client.
fn xff_statuses(stack: &Stack) -> Vec<u16> {
    (1..=5)
        .map(|i| {
            let xff = format!("{i}.{i}.{i}.{i}");
            stack
                .raw_get(LOCALHOST, "/x", &[("x-forwarded-for", &xff)])
                .status
        })
        .collect()
}

#[test]
fn forged_x_forwarded_for_does_not_change_client_ip() {
    let stack = Stack::start_edited("edge-xff-shipped", &config(IP_RULE), shipped);
    assert_eq!(
        xff_statuses(&stack),
        [200, 200, 429, 429, 429],
        "{}",
        stack.logs()
    );
}

/// What the README warns about: without `use_remote_address`, Envoy takes the client address from
/// x-forwarded-for, and a client picks a fresh bucket with every request.
#[test]
fn without_use_remote_address_x_forwarded_for_picks_the_bucket() {
    let stack = Stack::start_edited("edge-xff-default", &config(IP_RULE), envoy_defaults);
    assert_eq!(xff_statuses(&stack), [200; 5], "{}", stack.logs());
}

/// Envoy listening on ::1: the client's key is its /64 (`::/64`), found in Redis under the digest
/// computed here, and the limit holds.
#[test]
fn ipv6_client_is_keyed_by_its_64() {
    let listen_on_v6 = |yaml: String, listen_port: u16| {
        let from = format!("address: 127.0.0.1\n        port_value: {listen_port}\n");
        assert_eq!(yaml.matches(&from).count(), 1, "one listener address");
        shipped(
            yaml.replace(
                &from,
                &format!("address: \"::1\"\n        port_value: {listen_port}\n"),
            ),
            listen_port,
        )
    };
    let stack = Stack::start_edited("edge-ipv6", &config(IP_RULE), listen_on_v6);
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let key = bucket_key(
        "tollgate",
        "r",
        &[KeySource::CLIENT_IP],
        &[b"::/64".to_vec()],
    );
    let exists = |k: &str| stack.redis.exists(k);
    assert!(!exists(&key));
    let got: Vec<u16> = (0..3)
        .map(|_| stack.raw_get(v6, "/x", &[]).status)
        .collect();
    assert_eq!(got, [200, 200, 429], "{}", stack.logs());
    assert!(exists(&key), "bucket {key} (client_ip ::/64) is in Redis");
}

/// The filter reads a request's headers in one copy of the whole map: the key header is found as
/// well among 60 large headers (~55 KB, under Envoy's 60 KiB default) as in a small request, its
/// name in any case, and both requests share one bucket.
#[test]
fn the_key_header_is_found_among_many_large_headers_in_any_case() {
    let stack = Stack::start_edited(
        "edge-many-headers",
        &config(r#""key": ["header:x-user-id"], "burst": 2"#),
        shipped,
    );
    let filler: Vec<(String, String)> = (0..60)
        .map(|i| (format!("x-filler-{i}"), "f".repeat(900)))
        .collect();
    let mut headers: Vec<(&str, &str)> = filler
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    headers.push(("X-User-Id", "mallory"));
    let got: Vec<u16> = (0..3)
        .map(|_| stack.raw_get(LOCALHOST, "/x", &headers).status)
        .collect();
    assert_eq!(got, [200, 200, 429], "{}", stack.logs());
    assert_eq!(
        stack
            .raw_get(LOCALHOST, "/x", &[("x-user-id", "mallory")])
            .status,
        429,
        "a small request is the same bucket"
    );
}

/// Envoy gives a request's `Host` header as `:authority`: a rule matching the `host` header sees
/// it, and a key on the host attribute is one bucket per host, however the client spells it.
#[test]
fn the_host_header_is_matched_and_keyed_as_the_authority() {
    let rules = r#"{ "backend": { "timeout_ms": 2000 }, "rules": [
        { "name": "by-host-header", "rate": 1, "period_ms": 60000, "burst": 2, "key": [],
          "match": { "path_prefix": "/h/",
                     "headers": [ { "name": "host", "exact": "api.example.com" } ] } },
        { "name": "by-host-attribute", "rate": 1, "period_ms": 60000, "burst": 2,
          "key": ["property:request.host"], "match": { "path_prefix": "/p/" } } ] }"#;
    let stack = Stack::start_edited("edge-host", rules, shipped);
    let with_host =
        |path: &str, host: &str| stack.raw_get(LOCALHOST, path, &[("Host", host)]).status;
    let got: Vec<u16> = (0..3)
        .map(|_| with_host("/h/x", "api.example.com"))
        .collect();
    assert_eq!(got, [200, 200, 429], "{}", stack.logs());
    assert_eq!(
        with_host("/h/x", "other.example.com"),
        200,
        "the rule does not apply"
    );
    let got: Vec<u16> = [
        "api.example.com",
        "API.Example.com:8080",
        "api.example.com.",
    ]
    .iter()
    .map(|host| with_host("/p/x", host))
    .collect();
    assert_eq!(
        got,
        [200, 200, 429],
        "one bucket per host: {}",
        stack.logs()
    );
}

/// The status Envoy answers a GET of `/x` whose `x-api-key` line holds `value`, byte for byte.
fn status_with_key_bytes(stack: &Stack, value: &[u8]) -> u16 {
    let addr = std::net::SocketAddr::new(LOCALHOST, stack.port());
    common::http::raw_request_bytes(None, addr, "GET", "/x", &[("x-api-key", value)])
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()))
        .status
}

/// Envoy passes a header value's NO-BREAK SPACE and NEL to the application (a control byte such
/// as `\x1f` it refuses with a 400), where gunicorn up to 21 strips them: `K\xa0` is the key `K`
/// there, so it is `K`'s bucket here too.
#[test]
fn a_key_header_with_bytes_a_server_strips_is_the_keys_bucket() {
    let stack = Stack::start_edited(
        "edge-key-bytes",
        &config(r#""key": ["header:x-api-key"], "burst": 2"#),
        shipped,
    );
    let got: Vec<u16> = [&b"K"[..], b"K\xa0", b"K\x85\xa0", b"\xa0K"]
        .iter()
        .map(|value| status_with_key_bytes(&stack, value))
        .collect();
    assert_eq!(got, [200, 200, 429, 429], "{}", stack.logs());
    assert_eq!(status_with_key_bytes(&stack, b"L\xa0"), 200, "another key");
    assert_eq!(
        status_with_key_bytes(&stack, b"K\x1f"),
        400,
        "Envoy refuses it"
    );
}
