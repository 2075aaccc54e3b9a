//! The backend, the denial, and the fields each artifact refuses.

use super::*;

#[test]
fn backend_timeout_bounds() {
    assert_eq!(
        error(r#"{"backend":{"timeout_ms":0},"rules":[{"name":"a","rate":1}]}"#),
        "backend.timeout_ms: must be an integer >= 1"
    );
    assert_eq!(
        error(r#"{"backend":{"timeout_ms":60001},"rules":[{"name":"a","rate":1}]}"#),
        "backend.timeout_ms: must be an integer <= 60000"
    );
}

#[test]
fn deny_status_bounds() {
    assert_eq!(
        error(r#"{"deny":{"status":200},"rules":[{"name":"a","rate":1}]}"#),
        "deny.status: must be an integer >= 400"
    );
    assert_eq!(
        error(r#"{"deny":{"status":600},"rules":[{"name":"a","rate":1}]}"#),
        "deny.status: must be an integer <= 599"
    );
}

#[test]
fn deny_body_too_long() {
    let body = "x".repeat(4097);
    assert_eq!(
        error(&format!(
            r#"{{"deny":{{"body":"{body}"}},"rules":[{{"name":"a","rate":1}}]}}"#
        )),
        "deny.body: must be at most 4096 bytes (got 4097)"
    );
}

#[test]
fn backend_strings() {
    assert_eq!(
        error(r#"{"backend":{"cluster":""},"rules":[{"name":"a","rate":1}]}"#),
        "backend.cluster: must not be empty"
    );
    assert_eq!(
        error(r#"{"backend":{"authority":"a\u0000b"},"rules":[{"name":"a","rate":1}]}"#),
        "backend.authority: must not contain control characters"
    );
    let long = "c".repeat(256);
    assert_eq!(
        error(&format!(
            r#"{{"backend":{{"cluster":"{long}"}},"rules":[{{"name":"a","rate":1}}]}}"#
        )),
        "backend.cluster: must be at most 255 bytes"
    );
}

#[test]
fn basic_auth_without_colon() {
    assert_eq!(
        error(r#"{"backend":{"basic_auth":"secret"},"rules":[{"name":"a","rate":1}]}"#),
        "backend.basic_auth: must have the form user:pass"
    );
}

#[test]
fn higress_match_rules_are_refused_plainly() {
    assert_eq!(
        error(r#"{"rules":[{"name":"a","rate":1}],"_rules_":[{"_match_route_":["r"]}]}"#),
        "_rules_: per-route matchRules are not supported: give the plugin config as \
         defaultConfig and select requests with each rule's match"
    );
}

#[test]
fn http_build_refuses_redis_fields() {
    for field in [
        r#""service_name":"redis.default.svc.cluster.local""#,
        r#""service_port":6379"#,
        r#""username":"u""#,
        r#""password":"p""#,
        r#""database":1"#,
    ] {
        let name = field.split('"').nth(1).unwrap();
        assert_eq!(
            error(&format!(
                r#"{{"backend":{{{field}}},"rules":[{{"name":"a","rate":1}}]}}"#
            )),
            format!(
                "backend.{name}: only in the Higress build (tollgate-higress.wasm, Redis callouts); \
                 this build reaches Redis through Webdis"
            )
        );
    }
}

#[test]
fn higress_build_refuses_webdis_fields() {
    for field in [r#""authority":"webdis""#, r#""basic_auth":"u:p""#] {
        let name = field.split('"').nth(1).unwrap();
        assert_eq!(
            higress_error(&format!(
                r#"{{"backend":{{{field}}},"rules":[{{"name":"a","rate":1}}]}}"#
            )),
            format!(
                "backend.{name}: only in tollgate.wasm (the HTTP build, Webdis); this Higress build calls Redis directly"
            )
        );
    }
}

#[test]
fn higress_build_redis_fields() {
    let backend = |json: &str| {
        parse_higress(&format!(
            r#"{{"backend":{json},"rules":[{{"name":"a","rate":1}}]}}"#
        ))
        .map(|c| c.backend)
    };
    let b = backend(
        r#"{"service_name":"redis.default.svc.cluster.local","username":"tg","password":"s3cret",
                "database":2,"timeout_ms":30}"#,
    )
    .unwrap();
    assert_eq!(b.cluster, "outbound|6379||redis.default.svc.cluster.local");
    assert_eq!(b.username.as_deref(), Some("tg"));
    assert_eq!(b.password.as_deref(), Some("s3cret"));
    assert_eq!((b.database, b.timeout_ms), (2, 30));
    // Higress' static services listen on logical port 80.
    let b = backend(r#"{"service_name":"redis.static"}"#).unwrap();
    assert_eq!(b.cluster, "outbound|80||redis.static");
    let b = backend(r#"{"service_name":"redis.dns","service_port":6380}"#).unwrap();
    assert_eq!(b.cluster, "outbound|6380||redis.dns");
    // A cluster named as it is (plain Envoy with Higress' patches, or the test host).
    let b = backend(r#"{"cluster":"redis_cluster","password":"p"}"#).unwrap();
    assert_eq!(
        (b.cluster.as_str(), b.username.as_deref()),
        ("redis_cluster", None)
    );
    let e = |json: &str| backend(json).unwrap_err().to_string();
    assert_eq!(
        e(r#"{"cluster":"c","service_name":"s"}"#),
        "backend.service_name: give either cluster or service_name, not both"
    );
    assert_eq!(
        e(r#"{"service_port":6379}"#),
        "backend.service_port: needs service_name"
    );
    // A port beside a cluster would be ignored: the cluster's name says the port.
    assert_eq!(
        e(r#"{"cluster":"outbound|6379||redis","service_port":6380}"#),
        "backend.service_port: goes with service_name, not cluster (a cluster's name says its port)"
    );
    assert_eq!(e(r#"{"username":"u"}"#), "backend.username: needs password");
    // Only Redis refusing an unauthenticated client tells a worker that xDS gave it a new one,
    // which starts in database 0 (buckets split between two databases admit up to twice).
    assert_eq!(
        e(r#"{"database":3}"#),
        "backend.database: other than 0 needs password (a client Higress makes anew starts in \
         database 0, and only Redis refusing it unauthenticated tells tollgate to select it again)"
    );
    assert_eq!(backend(r#"{"database":0}"#).unwrap().database, 0);
    assert_eq!(
        e(r#"{"password":""}"#),
        "backend.password: must not be empty"
    );
    assert_eq!(
        e(r#"{"password":"a\u000ab"}"#),
        "backend.password: must not contain control characters"
    );
    assert!(
        !e(r#"{"password":"a\u000ab"}"#).contains("a\nb"),
        "secrets are never echoed"
    );
    assert_eq!(
        e(r#"{"service_name":"r","service_port":0}"#),
        "backend.service_port: must be an integer >= 1"
    );
    assert_eq!(
        e(r#"{"database":-1}"#),
        "backend.database: must be an integer >= 0"
    );
}

/// Higress cuts the cluster at its first `?` and reads the rest as its Redis client's parameters
/// (`db=N`, `buffer_flush_timeout`, ...): a `?` in `cluster` or `service_name` would pass
/// parameters tollgate does not know of, `db=3` without the password `backend.database` needs
/// (buckets split between two databases admit up to twice), and push `buffer_flush_timeout=0`
/// out of the parameters.
#[test]
fn a_higress_cluster_name_carries_no_redis_client_parameters() {
    for backend in [
        r#"{"cluster":"redis?db=3&"}"#,
        r#"{"service_name":"redis.default.svc.cluster.local?db=3&"}"#,
    ] {
        let json = format!(r#"{{"backend":{backend},"rules":[{{"name":"a","rate":1}}]}}"#);
        match parse_higress(&json) {
            Err(e) => assert!(e.to_string().contains("'?'"), "{backend}: {e}"),
            Ok(c) => panic!(
                "{backend}: accepted, Higress is given {:?}",
                crate::backend::resp::redis_target(&c.backend.cluster, c.backend.database)
            ),
        }
    }
}
