//! A rule's match: paths, methods, headers and hosts in the forms requests are compared in.

use super::*;

#[test]
fn header_match_with_both_exact_and_present() {
    assert_eq!(
        rule_error(r#""rate":1,"match":{"headers":[{"name":"a","exact":"b","present":true}]}"#),
        r#"rules[0].match.headers[0]: must have exactly one of "exact", "prefix", "regex", "present" or "absent", not exact and present"#
    );
}

#[test]
fn header_match_with_neither() {
    assert_eq!(
        rule_error(r#""rate":1,"match":{"headers":[{"name":"a"}]}"#),
        r#"rules[0].match.headers[0]: must have exactly one of "exact", "prefix", "regex", "present" or "absent""#
    );
}

#[test]
fn header_match_kinds() {
    let m = |h: &str| {
        one_rule(&format!(r#""rate":1,"match":{{"headers":[{h}]}}"#))
            .matcher
            .headers
            .remove(0)
            .value
    };
    assert_eq!(
        m(r#"{"name":"a","prefix":"Bearer "}"#),
        HeaderValueMatch::Prefix("Bearer ".into())
    );
    // Read as a request's value is: without the spaces and tabs around it (a prefix keeps its
    // end), so a condition written with them still holds for some value.
    assert_eq!(
        m(r#"{"name":"a","prefix":" \tBearer "}"#),
        HeaderValueMatch::Prefix("Bearer ".into())
    );
    assert_eq!(
        m(r#"{"name":"a","exact":" free\t"}"#),
        HeaderValueMatch::Exact("free".into())
    );
    let refused = rule_error(r#""rate":1,"match":{"headers":[{"name":"a","prefix":" \t"}]}"#);
    assert!(refused.contains("only spaces or tabs"), "{refused}");
    assert_eq!(m(r#"{"name":"a","absent":true}"#), HeaderValueMatch::Absent);
    assert_eq!(
        m(r#"{"name":"a","exact":""}"#),
        HeaderValueMatch::Exact(String::new())
    );
    match m(r#"{"name":"a","regex":"v[0-9]+"}"#) {
        HeaderValueMatch::Regex(p) => {
            assert_eq!(p.source, "v[0-9]+");
            // Anchored: the whole value must match.
            assert!(p.is_match(b"v12"));
            assert!(!p.is_match(b"xv12"));
            assert!(!p.is_match(b"v12x"));
            // Bytes that are not UTF-8 read as U+FFFD: one character, not a digit.
            assert!(!p.is_match(&[b'v', 0xff]));
            assert!(Pattern::new("v.").unwrap().is_match(&[b'v', 0xff]));
        }
        other => panic!("{other:?}"),
    }
    // An alternation is anchored as a whole.
    match m(r#"{"name":"a","regex":"a|b"}"#) {
        HeaderValueMatch::Regex(p) => {
            assert!(p.is_match(b"a") && p.is_match(b"b"));
            assert!(!p.is_match(b"ab") && !p.is_match(b"xb"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rule_error(r#""rate":1,"match":{"headers":[{"name":"a","absent":false}]}"#),
        "rules[0].match.headers[0].absent: must be true"
    );
    assert_eq!(
        rule_error(r#""rate":1,"match":{"headers":[{"name":"a","prefix":"x","absent":true}]}"#),
        r#"rules[0].match.headers[0]: must have exactly one of "exact", "prefix", "regex", "present" or "absent", not prefix and absent"#
    );
    assert_eq!(
        rule_error(r#""rate":1,"match":{"headers":[{"name":"a","prefix":1}]}"#),
        "rules[0].match.headers[0].prefix: must be a string"
    );
    let e = rule_error(r#""rate":1,"match":{"headers":[{"name":"a","regex":"(x"}]}"#);
    assert!(
        e.starts_with("rules[0].match.headers[0].regex: is not a valid regular expression: "),
        "{e}"
    );
    // Backreferences and look-around (what makes backtracking engines blow up) do not exist.
    for pat in [r"(a)\\1", "(?=a)a", "(?<=a)b"] {
        let e = rule_error(&format!(
            r#""rate":1,"match":{{"headers":[{{"name":"a","regex":"{pat}"}}]}}"#
        ));
        assert!(
            e.contains("is not a valid regular expression"),
            "{pat}: {e}"
        );
    }
    let long = "a".repeat(1025);
    assert_eq!(
        rule_error(&format!(
            r#""rate":1,"match":{{"headers":[{{"name":"a","regex":"{long}"}}]}}"#
        )),
        "rules[0].match.headers[0].regex: must be at most 1024 bytes"
    );
    // Too many repetitions compile to more than the size limit.
    let e =
        rule_error(r#""rate":1,"match":{"headers":[{"name":"a","regex":"((a{100}){100}){100}"}]}"#);
    assert!(e.contains("is not a valid regular expression"), "{e}");
}

#[test]
fn hosts() {
    let hosts = |h: &str| {
        one_rule(&format!(r#""rate":1,"match":{{"hosts":{h}}}"#))
            .matcher
            .hosts
    };
    assert_eq!(
        hosts(
            r#"["API.Example.com", "*.Tenant.example.com.", "10.0.0.1", "[::1]", "a_b.local",
                    "[0:0::0001]", "[2001:DB8:0:0::AB]", "[::ffff:10.0.0.2]"]"#
        ),
        [
            "api.example.com",
            "*.tenant.example.com",
            "10.0.0.1",
            "[::1]",
            "a_b.local",
            "[::1]",
            "[2001:db8::ab]",
            "10.0.0.2"
        ]
    );
    for (bad, why) in [
        ("api.example.com:443", "must not have a port (hosts are compared without it)"),
        ("10.0.0.1:80", "must not have a port (hosts are compared without it)"),
        ("[::1]:80", "must be a host name, an IPv4 address or [IPv6], without port"),
        ("[nope]", "must be a host name, an IPv4 address or [IPv6], without port"),
        ("[fe80::1%25eth0]", "must not have a zone id (it names the client's interface; requests are compared without it)"),
        ("", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
        ("a..b", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
        ("*", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
        ("a.*.com", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
        ("*example.com", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
        ("ex ample.com", "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\""),
    ] {
        assert_eq!(
            rule_error(&format!(r#""rate":1,"match":{{"hosts":["ok.com","{bad}"]}}"#)),
            format!("rules[0].match.hosts[1]: {why} (got {bad:?})")
        );
    }
    assert_eq!(
        rule_error(r#""rate":1,"match":{"hosts":"a.com"}"#),
        "rules[0].match.hosts: must be an array"
    );
}

#[test]
fn header_match_present_false() {
    assert_eq!(
        rule_error(r#""rate":1,"match":{"headers":[{"name":"a","present":false}]}"#),
        "rules[0].match.headers[0].present: must be true"
    );
}

#[test]
fn header_match_bad_name() {
    assert_eq!(
        rule_error(r#""rate":1,"match":{"headers":[{"name":"","present":true}]}"#),
        "rules[0].match.headers[0].name: must not be empty"
    );
    assert_eq!(
        rule_error(r#""rate":1,"match":{"headers":[{"name":"a:b","present":true}]}"#),
        r#"rules[0].match.headers[0].name: must be a header name of token characters (got "a:b")"#
    );
    assert_eq!(
        rule_error(r#""rate":1,"match":{"headers":[{"exact":"x"}]}"#),
        "rules[0].match.headers[0].name: required"
    );
}

#[test]
fn path_prefix_must_be_normal() {
    for (bad, reads) in [
        ("//api/", "/api/"),
        ("/./api/", "/api/"),
        ("/%61pi/", "/api/"),
        ("/x/../api/", "/api/"),
        ("/api%2f", "/api%2F"),
    ] {
        assert_eq!(
            rule_error(&format!(r#""rate":1,"match":{{"path_prefix":"{bad}"}}"#)),
            format!(
                "rules[0].match.path_prefix: must be in normal form, as requests are compared \
                 in it (got {bad:?}, which reads as {reads:?})"
            )
        );
    }
    // Irregular prefixes can never be normal.
    assert_eq!(
        rule_error(r#""rate":1,"match":{"path_prefix":"/../a"}"#),
        "rules[0].match.path_prefix: must be in normal form, as requests are compared in it \
         (got \"/../a\", which reads as \"/a\")"
    );
    assert!(rule_error(r#""rate":1,"match":{"path_prefix":"/a%zz"}"#).contains("normal form"));
    for good in ["/", "/api", "/api/", "/a;b/", "/a%2Fb", "/~u/", "/a%20b"] {
        let r = one_rule(&format!(r#""rate":1,"match":{{"path_prefix":"{good}"}}"#));
        assert_eq!(r.matcher.path_prefix.as_deref(), Some(good));
        assert!(!r.matcher.path_ignore_case);
    }
    let r = one_rule(r#""rate":1,"match":{"path_prefix":"/api/","path_ignore_case":true}"#);
    assert!(r.matcher.path_ignore_case);
    assert_eq!(
        rule_error(r#""rate":1,"match":{"path_ignore_case":1}"#),
        "rules[0].match.path_ignore_case: must be a boolean"
    );
}

#[test]
fn path_prefix_without_slash() {
    assert_eq!(
        rule_error(r#""rate":1,"match":{"path_prefix":"api/"}"#),
        r#"rules[0].match.path_prefix: must start with '/' (got "api/")"#
    );
}

#[test]
fn path_prefix_with_query() {
    assert_eq!(
        rule_error(r#""rate":1,"match":{"path_prefix":"/a?b"}"#),
        "rules[0].match.path_prefix: must not contain '?' or '#': it is matched against the \
         path without the query (got \"/a?b\")"
    );
}

#[test]
fn bad_methods() {
    assert_eq!(
        rule_error(r#""rate":1,"match":{"methods":["GET",""]}"#),
        "rules[0].match.methods[1]: must not be empty"
    );
    assert_eq!(
        rule_error(r#""rate":1,"match":{"methods":["G T"]}"#),
        r#"rules[0].match.methods[0]: must be an HTTP method of token characters (got "G T")"#
    );
}

/// Envoy keeps the `Host` header of an HTTP/1 request (and any `host` line) as `:authority`: its
/// header map stores a `host` line under `:authority`, so the lines a filter reads never have a
/// `host`. `GET /api/x HTTP/1.1` + `Host: api.example.com` reaches the filter as
/// `:authority: api.example.com` and the application as `Host: api.example.com`. A condition or a
/// key on `host` would never find it: the rule would silently limit nothing. A condition on
/// `host` is a condition on `:authority`; a key on it is refused, naming the `authority` source.
#[test]
fn the_host_header_is_the_authority() {
    struct Envoy;
    impl crate::rule::RequestView for Envoy {
        fn header(&self, name: &str) -> Option<std::borrow::Cow<'_, [u8]>> {
            let value: &[u8] = match name {
                ":authority" => b"api.example.com",
                ":path" => b"/api/x",
                ":method" => b"GET",
                _ => return None,
            };
            Some(std::borrow::Cow::Borrowed(value))
        }
        fn client_ip(&self) -> Option<Vec<u8>> {
            None
        }
    }
    for condition in [
        r#"{"name":"host","exact":"api.example.com"}"#,
        r#"{"name":"Host","prefix":"api."}"#,
        r#"{"name":"host","present":true}"#,
    ] {
        let r = one_rule(&format!(r#""rate":1,"match":{{"headers":[{condition}]}}"#));
        assert!(crate::rule::matches(&r.matcher, &Envoy), "{condition}");
    }
    let r = one_rule(r#""rate":1,"match":{"headers":[{"name":"host","absent":true}]}"#);
    assert!(!crate::rule::matches(&r.matcher, &Envoy));
    for key in [
        r#""header:host""#,
        r#""header:Host""#,
        r#""property:request.headers.host""#,
    ] {
        let refused = rule_error(&format!(r#""rate":1,"key":[{key}]"#));
        assert!(refused.contains("authority"), "{key}: {refused}");
    }
}
