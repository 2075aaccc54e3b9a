//! Key sources and overrides.

use super::*;

#[test]
fn all_key_sources_and_lowercasing() {
    let r = one_rule(
        r#""rate":1,"key":["header:X-User","query:User Id","client_ip","path","method","authority","literal:Fixed"],
               "cost_header":"X-Cost","match":{"methods":["get","Post"],"headers":[{"name":"X-A","present":true}]}"#,
    );
    assert_eq!(
        r.key,
        vec![
            KeySource::Header("x-user".into()),
            KeySource::Query("User Id".into()),
            KeySource::CLIENT_IP,
            KeySource::Path,
            KeySource::Method,
            KeySource::Authority,
            KeySource::Literal("Fixed".into()),
        ]
    );
    assert_eq!(r.cost_header.as_deref(), Some("x-cost"));
    assert_eq!(r.matcher.methods, vec!["GET", "POST"]);
    assert_eq!(
        r.matcher.headers,
        vec![HeaderMatch {
            name: "x-a".into(),
            value: HeaderValueMatch::Present
        }]
    );
}

#[test]
fn unknown_key_source() {
    assert_eq!(
        rule_error(r#""rate":1,"key":["client_ip","foo"]"#),
        "rules[0].key[1]: unknown key source \"foo\" (expected header:NAME, query:NAME, \
         cookie:NAME, client_ip, client_ip:v4=/N,v6=/M, path, method, authority, literal:TEXT, \
         property:PATH or metadata:NAMESPACE:FIELD)"
    );
}

#[test]
fn empty_key_source_names() {
    assert_eq!(
        rule_error(r#""rate":1,"key":["header:"]"#),
        r#"rules[0].key[0]: header:NAME needs a non-empty header name of token characters (got "header:")"#
    );
    assert_eq!(
        rule_error(r#""rate":1,"key":["header:x y"]"#),
        r#"rules[0].key[0]: header:NAME needs a non-empty header name of token characters (got "header:x y")"#
    );
    assert_eq!(
        rule_error(r#""rate":1,"key":["query:"]"#),
        r#"rules[0].key[0]: query:NAME needs a non-empty name (got "query:")"#
    );
    assert_eq!(
        rule_error(r#""rate":1,"key":["literal:"]"#),
        r#"rules[0].key[0]: literal:TEXT needs a non-empty text (got "literal:")"#
    );
}

#[test]
fn too_many_key_sources() {
    assert_eq!(
        rule_error(
            r#""rate":1,"key":["path","path","path","path","path","path","path","path","path"]"#
        ),
        "rules[0].key: must have at most 8 key sources (got 9)"
    );
}

#[test]
fn identity_key_sources() {
    let key = |k: &str| {
        one_rule(&format!(r#""rate":1,"key":["{k}"]"#))
            .key
            .remove(0)
    };
    assert_eq!(
        key("cookie:session_id"),
        KeySource::Cookie("session_id".into())
    );
    assert_eq!(
        key("property:connection.requested_server_name"),
        KeySource::Property {
            spelled: "connection.requested_server_name".into(),
            path: vec!["connection".into(), "requested_server_name".into()],
        }
    );
    // Envoy has no source.principal: it is the peer certificate's URI SAN.
    let principal = key("property:source.principal");
    assert_eq!(
        principal,
        KeySource::Property {
            spelled: "source.principal".into(),
            path: vec!["connection".into(), "uri_san_peer_certificate".into()],
        }
    );
    assert_eq!(principal.to_string(), "property:source.principal");
    let jwt = key("metadata:envoy.filters.http.jwt_authn:jwt_payload.sub");
    assert_eq!(
        jwt,
        KeySource::Metadata {
            namespace: "envoy.filters.http.jwt_authn".into(),
            fields: vec!["jwt_payload".into(), "sub".into()],
        }
    );
    assert_eq!(
        jwt.to_string(),
        "metadata:envoy.filters.http.jwt_authn:jwt_payload.sub"
    );
    assert_eq!(
        key("metadata:lua:tenant"),
        KeySource::Metadata {
            namespace: "lua".into(),
            fields: vec!["tenant".into()],
        }
    );
    for (bad, want) in [
        (
            "cookie:",
            r#"cookie:NAME needs a non-empty cookie name of token characters (got "cookie:")"#,
        ),
        (
            "cookie:a b",
            r#"cookie:NAME needs a non-empty cookie name of token characters (got "cookie:a b")"#,
        ),
        (
            "property:",
            r#"property:PATH needs 1 to 16 non-empty dot-separated segments (got "property:")"#,
        ),
        (
            "property:source..address",
            r#"property:PATH needs 1 to 16 non-empty dot-separated segments (got "property:source..address")"#,
        ),
        (
            "property:response.code",
            r#"response attributes are not known yet when a request is checked (got "property:response.code")"#,
        ),
        (
            "property:sauce.address",
            r#"unknown attribute "sauce" (Envoy's attributes start with request, connection, source, destination, upstream, metadata, filter_state, upstream_filter_state, xds, node, plugin_name, plugin_root_id, plugin_vm_id) (got "property:sauce.address")"#,
        ),
        (
            "metadata:ns",
            r#"metadata:NAMESPACE:FIELD[.FIELD…] needs a namespace and 1 to 16 non-empty fields (got "metadata:ns")"#,
        ),
        (
            "metadata::a",
            r#"metadata:NAMESPACE:FIELD[.FIELD…] needs a namespace and 1 to 16 non-empty fields (got "metadata::a")"#,
        ),
        (
            "metadata:ns:",
            r#"metadata:NAMESPACE:FIELD[.FIELD…] needs a namespace and 1 to 16 non-empty fields (got "metadata:ns:")"#,
        ),
        (
            "metadata:ns:a.",
            r#"metadata:NAMESPACE:FIELD[.FIELD…] needs a namespace and 1 to 16 non-empty fields (got "metadata:ns:a.")"#,
        ),
    ] {
        assert_eq!(
            rule_error(&format!(r#""rate":1,"key":["{bad}"]"#)),
            format!("rules[0].key[0]: {want}"),
        );
    }
    let deep = vec!["a"; 17].join(".");
    assert!(
        rule_error(&format!(r#""rate":1,"key":["metadata:ns:{deep}"]"#))
            .contains("1 to 16 non-empty fields")
    );
}

#[test]
fn overrides() {
    let r = one_rule(
        r#""rate":10,"period_ms":60000,"key":["header:x-tenant","client_ip:v6=/56","authority"],
               "overrides":[
                 {"key":["acme","2001:db8:0:100::/56","API.example.com"],"rate":1000,"burst":2000},
                 {"key":[" internal\t","10.0.0.1","a"],"unlimited":true},
                 {"key":["slow","::ffff:10.0.0.2","a"],"rate":1,"period_ms":1000}]"#,
    );
    let o = |t: &[&str]| {
        let k: Vec<Vec<u8>> = t.iter().map(|v| v.as_bytes().to_vec()).collect();
        r.overrides.get(&k).copied()
    };
    assert_eq!(r.overrides.len(), 3);
    // period_ms defaults to the rule's; burst to the override's rate.
    assert_eq!(
        o(&["acme", "2001:db8:0:100::/56", "api.example.com"]),
        Some(Override::Limits(quota(Limits {
            rate: 1000,
            burst: 2000,
            period_ms: 60000
        })))
    );
    // A header's value as a request's is read: without the spaces and tabs around it.
    assert_eq!(o(&["internal", "10.0.0.1", "a"]), Some(Override::Unlimited));
    let blank = rule_error(
        r#""rate":1,"key":["header:x-user"],"overrides":[{"key":[" "],"unlimited":true}]"#,
    );
    assert!(blank.contains("only whitespace"), "{blank}");
    assert_eq!(
        o(&["slow", "10.0.0.2", "a"]),
        Some(Override::Limits(quota(Limits {
            rate: 1,
            burst: 1,
            period_ms: 1000
        })))
    );
    let c = parse(r#"{"rules":[{"name":"t","rate":5,"key":["header:x"],"overrides":[{"key":["a"],"unlimited":true}]}]}"#).unwrap();
    assert_eq!(c.summary(), "1 rule: t 5/1000ms burst 5 exact (1 override)");

    // A path override is normalised as requests are.
    let r = one_rule(r#""rate":1,"key":["path"],"overrides":[{"key":["//api/./x"],"rate":9}]"#);
    assert!(r.overrides.contains_key(&vec![b"/api/x".to_vec()]));
    // ... and lower-cased where the rule's path match ignores case, as requests' values are.
    let r = one_rule(
        r#""rate":1,"match":{"path_prefix":"/api/","path_ignore_case":true},
               "key":["path","property:request.path"],"overrides":[{"key":["/API//X","/Api/x?Q=1"],"rate":9}]"#,
    );
    assert!(r
        .overrides
        .contains_key(&vec![b"/api/x".to_vec(), b"/api/x?q=1".to_vec()]));
    // A cookie value as requests give it: unquoted and percent-decoded.
    let r =
        one_rule(r#""rate":1,"key":["cookie:sid"],"overrides":[{"key":["\"s%3Aab\""],"rate":9}]"#);
    assert!(r.overrides.contains_key(&vec![b"s:ab".to_vec()]));

    for (body, want) in [
        (r#""overrides":[{"key":["a"],"rate":1}]"#, "rules[0].overrides: needs key sources: a rule without a key has one bucket, give it these limits instead"),
        (r#""key":["header:x"],"overrides":{}"#, "rules[0].overrides: must be an array"),
        (r#""key":["header:x"],"overrides":[{"rate":1}]"#, "rules[0].overrides[0].key: required"),
        (r#""key":["header:x"],"overrides":[{"key":"a","rate":1}]"#, "rules[0].overrides[0].key: must be an array"),
        (r#""key":["header:x"],"overrides":[{"key":["a","b"],"rate":1}]"#, "rules[0].overrides[0].key: must have one value per key source (1, got 2)"),
        (r#""key":["header:x"],"overrides":[{"key":[1],"rate":1}]"#, "rules[0].overrides[0].key[0]: must be a string"),
        (r#""key":["header:x"],"overrides":[{"key":["a"]}]"#, "rules[0].overrides[0].rate: required"),
        (r#""key":["header:x"],"overrides":[{"key":["a"],"rate":0}]"#, "rules[0].overrides[0].rate: must be an integer >= 1"),
        (r#""key":["header:x"],"overrides":[{"key":["a"],"unlimited":true,"burst":3}]"#, r#"rules[0].overrides[0]: must have either "unlimited": true or limits (rate, period_ms, burst), not both"#),
        (r#""key":["header:x"],"overrides":[{"key":["a"],"unlimited":false}]"#, "rules[0].overrides[0].unlimited: must be true"),
        (r#""key":["cookie:sid"],"overrides":[{"key":["\"a\\b\""],"rate":1}]"#, r#"rules[0].overrides[0].key[0]: a quoted cookie value with a backslash is read differently by different servers, so it is never a key (got "\"a\\b\"")"#),
        (r#""key":["header:x"],"overrides":[{"key":["a"],"rate":1,"cost":2}]"#, "rules[0].overrides[0].cost: unknown field"),
        (r#""key":["header:x"],"overrides":[{"key":["a"],"rate":1},{"key":["b"],"rate":1},{"key":["a"],"unlimited":true}]"#, "rules[0].overrides[2].key: names the same key as an earlier override"),
        (r#""key":["authority"],"overrides":[{"key":["A.com"],"rate":1},{"key":["a.com"],"rate":2}]"#, "rules[0].overrides[1].key: names the same key as an earlier override"),
        (r#""key":["authority"],"overrides":[{"key":["a.com"],"rate":1},{"key":["A.com.:443"],"rate":2}]"#, "rules[0].overrides[1].key: names the same key as an earlier override"),
        (r#""key":["client_ip"],"overrides":[{"key":["2001:db8::1"],"rate":1}]"#, r#"rules[0].overrides[0].key[0]: must be an address or network as client_ip gives it: IPv4 /32, IPv6 /64, host bits zero (got "2001:db8::1")"#),
        (r#""key":["client_ip:v4=/24"],"overrides":[{"key":["10.0.0.7/24"],"rate":1}]"#, r#"rules[0].overrides[0].key[0]: must be an address or network as client_ip:v4=/24 gives it: IPv4 /24, IPv6 /64, host bits zero (got "10.0.0.7/24")"#),
        (r#""key":["header:x"],"cost":3,"burst":5,"overrides":[{"key":["a"],"rate":2}]"#, "rules[0].overrides[0].burst: must be at least the rule's cost (3)"),
        (r#""key":["header:x"],"overrides":[{"key":["a"],"rate":1,"burst":1000000000,"period_ms":86400001}]"#, "rules[0].overrides[0].burst: with burst 1000000000, a period this long must be whole seconds: period_ms must be a multiple of 1000 (burst × period_ms is above 2^50 = 1125899906842624)"),
    ] {
        assert_eq!(rule_error(&format!(r#""rate":5,{body}"#)), want, "{body}");
    }
}

#[test]
fn client_ip_prefixes() {
    let key = |k: &str| one_rule(&format!(r#""rate":1,"key":["{k}"]"#)).key;
    let ip = |v4_prefix, v6_prefix| {
        vec![KeySource::ClientIp {
            v4_prefix,
            v6_prefix,
        }]
    };
    assert_eq!(key("client_ip"), ip(32, 64));
    assert_eq!(key("client_ip:v6=/56"), ip(32, 56));
    assert_eq!(key("client_ip:v4=/24"), ip(24, 64));
    assert_eq!(key("client_ip:v4=/24,v6=/48"), ip(24, 48));
    assert_eq!(key("client_ip:v6=/48,v4=/8"), ip(8, 48));
    assert_eq!(key("client_ip:v6=/128"), ip(32, 128));
    assert_eq!(
        key("client_ip:v6=/64").first().unwrap().to_string(),
        "client_ip"
    );
    assert_eq!(
        key("client_ip:v6=/56").first().unwrap().to_string(),
        "client_ip:v6=/56"
    );
    for bad in [
        "client_ip:",
        "client_ip:v6=56",
        "client_ip:v6=/7",
        "client_ip:v6=/129",
        "client_ip:v4=/33",
        "client_ip:v4=/+24",
        "client_ip:v5=/24",
        "client_ip:v6=/56,v6=/48",
        "client_ip:v6=/56,",
    ] {
        assert_eq!(
            rule_error(&format!(r#""rate":1,"key":["{bad}"]"#)),
            format!(
                "rules[0].key[0]: client_ip takes v4=/N (8-32) and/or v6=/M (8-128), \
                 comma-separated (got {bad:?})"
            )
        );
    }
}

/// The spelling the digest takes is the `Display` one, byte for byte, for every kind of source:
/// a difference would move every bucket of a rule to a fresh key.
#[test]
fn the_name_a_digest_takes_is_the_display_spelling() {
    let sources = [
        KeySource::Header("x-user".into()),
        KeySource::Query("User Id".into()),
        KeySource::CLIENT_IP,
        KeySource::ClientIp {
            v4_prefix: 24,
            v6_prefix: 56,
        },
        KeySource::Path,
        KeySource::Method,
        KeySource::Authority,
        KeySource::Literal("Fixed".into()),
        KeySource::Property {
            spelled: "source.principal".into(),
            path: vec!["source".into(), "principal".into()],
        },
        KeySource::Metadata {
            namespace: "envoy.filters.http.jwt_authn".into(),
            fields: vec!["payload".into(), "sub".into()],
        },
        KeySource::Cookie("session".into()),
    ];
    for source in sources {
        let mut name = b"x".to_vec();
        source.push_name(&mut name);
        assert_eq!(name, format!("x{source}").into_bytes(), "{source:?}");
    }
}
