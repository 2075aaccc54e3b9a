//! Tiers: which sources may pick limits, and each tier's limits checked as an override's.

use super::*;

const JWT_PLAN: &str = "metadata:envoy.filters.http.jwt_authn:payload.plan";

fn tiers_rule(tiers: &str) -> Rule {
    one_rule(&format!(
        r#""rate":10,"period_ms":60000,"burst":5,"key":["metadata:envoy.filters.http.jwt_authn:payload.sub"],"tiers":{tiers}"#
    ))
}

fn tiers_error(tiers: &str) -> String {
    rule_error(&format!(
        r#""rate":10,"key":["metadata:envoy.filters.http.jwt_authn:payload.sub"],"tiers":{tiers}"#
    ))
}

#[test]
fn tiers_from_a_jwt_claim() {
    let r = tiers_rule(&format!(
        r#"{{"from":"{JWT_PLAN}","limits":{{
             "free":{{"rate":100,"burst":20}},
             "pro":{{"rate":1000,"period_ms":1000,"burst":200}},
             "internal":{{"unlimited":true}},
             "trial":{{"rate":3}}}}}}"#
    ));
    let t = r.tiers.clone().unwrap();
    assert_eq!(
        t.from,
        KeySource::Metadata {
            namespace: "envoy.filters.http.jwt_authn".into(),
            fields: vec!["payload".into(), "plan".into()],
        }
    );
    let tier = |name: &str| t.limits.get(name.as_bytes()).copied();
    // period_ms defaults to the rule's; burst to the tier's rate.
    assert_eq!(
        tier("free"),
        Some(Override::Limits(quota(Limits {
            rate: 100,
            burst: 20,
            period_ms: 60000
        })))
    );
    assert_eq!(
        tier("pro"),
        Some(Override::Limits(quota(Limits {
            rate: 1000,
            burst: 200,
            period_ms: 1000
        })))
    );
    assert_eq!(tier("internal"), Some(Override::Unlimited));
    assert_eq!(
        tier("trial"),
        Some(Override::Limits(quota(Limits {
            rate: 3,
            burst: 3,
            period_ms: 60000
        })))
    );
    assert_eq!(tier("Free"), None, "names are compared byte for byte");
    assert_eq!(t.limits.len(), 4);
    // The rule's own limits stay the default.
    assert_eq!(r.limits.burst, 5);
    assert_eq!(
        parse(&format!(
            r#"{{"rules":[{{"name":"t","rate":5,"key":["header:x"],"tiers":{{"from":"{JWT_PLAN}","limits":{{"a":{{"rate":9}},"b":{{"rate":8}}}}}}}}]}}"#
        ))
        .unwrap()
        .summary(),
        format!("1 rule: t 5/1000ms burst 5 exact (2 tiers by {JWT_PLAN})")
    );
}

/// A rule without a key has one bucket for every caller: each request would take it under its
/// own tier's limits, a smaller tier's clamping it for the others.
#[test]
fn tiers_need_a_key() {
    assert_eq!(
        rule_error(&format!(
            r#""rate":1,"tiers":{{"from":"{JWT_PLAN}","limits":{{"pro":{{"rate":9}}}}}}"#
        )),
        "rules[0].tiers: needs key sources: a rule without a key has one bucket for every caller, \
         which each request would take under its own tier's limits; key the rule on who the tier \
         is for"
    );
}

#[test]
fn verified_sources_pick_tiers_without_being_trusted() {
    for from in [
        JWT_PLAN,
        "metadata:acme.auth:tier",
        "property:source.principal",
        "property:connection.uri_san_peer_certificate",
        "property:connection.dns_san_peer_certificate",
        "property:connection.subject_peer_certificate",
        "property:connection.sha256_peer_certificate_digest",
        "property:connection.mtls",
        "property:metadata.filter_metadata.acme.tier",
        "property:filter_state.acme.tier",
    ] {
        let r = tiers_rule(&format!(
            r#"{{"from":"{from}","limits":{{"gold":{{"rate":9}}}}}}"#
        ));
        assert!(r.tiers.is_some(), "{from}");
    }
}

/// What the client writes (or chooses) is refused as a tier source, unless the configuration says
/// it is trusted; then it is accepted.
#[test]
fn client_controlled_sources_need_trusted() {
    for (from, why) in [
        ("header:x-plan", "a request header is written by the client"),
        ("query:plan", "a query parameter is written by the client"),
        ("cookie:plan", "a cookie is written by the client"),
        ("path", "the request line is written by the client"),
        ("method", "the request line is written by the client"),
        ("authority", "the request line is written by the client"),
        ("client_ip", "the client's address is where it connects from, not an identity Envoy verified"),
        ("client_ip:v4=/24", "the client's address is where it connects from, not an identity Envoy verified"),
        ("property:request.headers.x-plan", "this attribute is not an identity Envoy verified (the request, the connection's parameters and the addresses are the client's choice)"),
        ("property:request.path", "this attribute is not an identity Envoy verified (the request, the connection's parameters and the addresses are the client's choice)"),
        ("property:connection.requested_server_name", "this attribute is not an identity Envoy verified (the request, the connection's parameters and the addresses are the client's choice)"),
        ("property:source.address", "this attribute is not an identity Envoy verified (the request, the connection's parameters and the addresses are the client's choice)"),
        ("property:xds.route_name", "this attribute is not an identity Envoy verified (the request, the connection's parameters and the addresses are the client's choice)"),
    ] {
        let limits = if from == "client_ip" {
            r#"{"10.0.0.1":{"rate":9}}"#
        } else if from.starts_with("client_ip") {
            r#"{"10.0.0.0/24":{"rate":9}}"#
        } else {
            r#"{"gold":{"rate":9}}"#
        };
        assert_eq!(
            tiers_error(&format!(r#"{{"from":"{from}","limits":{limits}}}"#)),
            format!(
                "rules[0].tiers.from: \"{from}\" cannot pick a tier: {why}, so a client could \
                 pick its own. Use an identity Envoy verified (metadata:NAMESPACE:FIELD, \
                 property:source.principal), or add \"trusted\": true if a filter before \
                 tollgate sets or checks this value"
            )
        );
        let r = tiers_rule(&format!(
            r#"{{"from":"{from}","trusted":true,"limits":{limits}}}"#
        ));
        assert!(r.tiers.is_some(), "{from} with trusted: true");
    }
    // `"trusted": false` is the default, said out loud.
    assert!(
        tiers_error(r#"{"from":"header:x-plan","trusted":false,"limits":{"a":{"rate":1}}}"#)
            .starts_with("rules[0].tiers.from: \"header:x-plan\" cannot pick a tier")
    );
    // A tier named as the source gives values: a trusted client_ip's by its network.
    let r = tiers_rule(
        r#"{"from":"client_ip:v4=/24","trusted":true,"limits":{"10.1.2.0/24":{"rate":9}}}"#,
    );
    assert!(r.tiers.unwrap().limits.contains_key(&b"10.1.2.0/24"[..]));
    let r = tiers_rule(
        r#"{"from":"authority","trusted":true,"limits":{"API.example.com":{"rate":9}}}"#,
    );
    assert!(r
        .tiers
        .unwrap()
        .limits
        .contains_key(&b"api.example.com"[..]));
}

#[test]
fn bad_tiers_are_refused_with_their_field() {
    let many: Vec<String> = (0..257)
        .map(|i| format!(r#""t{i}":{{"rate":1}}"#))
        .collect();
    let long = "x".repeat(65);
    for (tiers, want) in [
        (r#"{"from":"literal:pro","trusted":true,"limits":{"pro":{"rate":1}}}"#.to_string(),
         r#"rules[0].tiers.from: a literal picks the same tier for every request: give the rule those limits (got "literal:pro")"#.to_string()),
        (r#"{"from":"header:","limits":{"a":{"rate":1}}}"#.into(),
         r#"rules[0].tiers.from: header:NAME needs a non-empty header name of token characters (got "header:")"#.into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{}}}}"#), "rules[0].tiers.limits: must name at least one tier".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{{}}}}}"#, many.join(",")), "rules[0].tiers.limits: must have at most 256 tiers (got 257)".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{"":{{"rate":1}}}}}}"#), "rules[0].tiers.limits.: a tier name must be 1 to 64 bytes without control characters".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{"{long}":{{"rate":1}}}}}}"#), format!("rules[0].tiers.limits.{}…: a tier name must be 1 to 64 bytes without control characters", "x".repeat(64))),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{"a\nb":{{"rate":1}}}}}}"#), r"rules[0].tiers.limits.a\nb: a tier name must be 1 to 64 bytes without control characters".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{"pro":{{}}}}}}"#), "rules[0].tiers.limits.pro.rate: required".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{"pro":{{"rate":0}}}}}}"#), "rules[0].tiers.limits.pro.rate: must be an integer >= 1".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{"pro":{{"rate":1,"cost":2}}}}}}"#), "rules[0].tiers.limits.pro.cost: unknown field".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{"pro":{{"unlimited":true,"rate":3}}}}}}"#), r#"rules[0].tiers.limits.pro: must have either "unlimited": true or limits (rate, period_ms, burst), not both"#.into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{"pro":{{"unlimited":false}}}}}}"#), "rules[0].tiers.limits.pro.unlimited: must be true".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{"pro":{{"rate":1,"burst":1000000000,"period_ms":86400001}}}}}}"#), "rules[0].tiers.limits.pro.burst: with burst 1000000000, a period this long must be whole seconds: period_ms must be a multiple of 1000 (burst × period_ms is above 2^50 = 1125899906842624)".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{"pro":1}}}}"#), "rules[0].tiers.limits.pro: must be an object".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":[]}}"#), "rules[0].tiers.limits: must be an object".into()),
        (format!(r#"{{"from":"{JWT_PLAN}"}}"#), "rules[0].tiers.limits: required".into()),
        (r#"{"limits":{"a":{"rate":1}}}"#.into(), "rules[0].tiers.from: required".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","trusted":"yes","limits":{{"a":{{"rate":1}}}}}}"#), "rules[0].tiers.trusted: must be a boolean".into()),
        (format!(r#"{{"from":"{JWT_PLAN}","limits":{{"a":{{"rate":1}}}},"default":"a"}}"#), "rules[0].tiers.default: unknown field".into()),
        (r#"{"from":"authority","trusted":true,"limits":{"A.com":{"rate":1},"a.com":{"rate":2}}}"#.into(), "rules[0].tiers.limits.a.com: names the same value of authority as another tier".into()),
        (r#"{"from":"client_ip","trusted":true,"limits":{"10.0.0.0/8":{"rate":1}}}"#.into(), r#"rules[0].tiers.limits.10.0.0.0/8: must be an address or network as client_ip gives it: IPv4 /32, IPv6 /64, host bits zero (got "10.0.0.0/8")"#.into()),
        ("[]".into(), "rules[0].tiers: must be an object".into()),
    ] {
        assert_eq!(tiers_error(&tiers), want, "{tiers}");
    }
    // A tier's burst must hold the rule's cost.
    assert_eq!(
        rule_error(&format!(
            r#""rate":10,"cost":3,"key":["header:x"],"tiers":{{"from":"{JWT_PLAN}","limits":{{"free":{{"rate":2}}}}}}"#
        )),
        "rules[0].tiers.limits.free.burst: must be at least the rule's cost (3)"
    );
}
