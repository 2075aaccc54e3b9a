//! A rule's `match`: every condition, and no way out of it by how a request spells what it
//! matches on.

use super::*;

#[test]
fn empty_match_matches_everything() {
    assert!(matches(&Match::default(), &Req::default()));
}

#[test]
fn path_prefix() {
    let m = Match {
        path_prefix: Some("/api/".into()),
        ..Match::default()
    };
    assert!(matches(&m, &Req::new("GET", "/api/users")));
    assert!(matches(&m, &Req::new("GET", "/api/")));
    assert!(!matches(&m, &Req::new("GET", "/api")));
    assert!(!matches(&m, &Req::new("GET", "/other/api/")));
    // Only the path counts, not the query or fragment.
    assert!(!matches(&m, &Req::new("GET", "/x?next=/api/")));
    assert!(!matches(&m, &Req::new("GET", "/x#/api/")));
    assert!(matches(&m, &Req::new("GET", "/api/?q=1")));
    // Byte prefix: case-sensitive.
    assert!(!matches(&m, &Req::new("GET", "/API/users")));
    // No :path, no match.
    assert!(!matches(&m, &Req::default()));
}

#[test]
fn methods() {
    let m = Match {
        methods: vec!["GET".into(), "POST".into()],
        ..Match::default()
    };
    assert!(matches(&m, &Req::new("GET", "/")));
    assert!(matches(&m, &Req::new("POST", "/")));
    assert!(!matches(&m, &Req::new("PUT", "/")));
    // HTTP/2 lets a client send a lower-case method, which Django and Werkzeug upper-case and
    // run: it holds for the rule naming it upper-case.
    assert!(matches(&m, &Req::new("get", "/")));
    assert!(matches(&m, &Req::new("Post", "/")));
    assert!(!matches(&m, &Req::new("put", "/")));
    // HEAD runs the GET handler: a GET rule holds for it; nothing else is widened.
    assert!(matches(&m, &Req::new("HEAD", "/")));
    let post = Match {
        methods: vec!["POST".into()],
        ..Match::default()
    };
    assert!(!matches(&post, &Req::new("HEAD", "/")));
    let head = Match {
        methods: vec!["HEAD".into()],
        ..Match::default()
    };
    assert!(matches(&head, &Req::new("HEAD", "/")));
    assert!(matches(&head, &Req::new("head", "/")));
    assert!(!matches(&head, &Req::new("GET", "/")));
    assert!(!matches(&m, &Req::default().with(":path", "/")));
    // Empty list = any method.
    assert!(matches(&Match::default(), &Req::new("DELETE", "/")));
}

/// A POST that asks the application to route it as another method (Symfony, Laravel, Rack,
/// ASP.NET Core's middleware) holds for a rule naming that method too.
#[test]
fn a_request_that_asks_for_another_method_matches_that_method() {
    let delete = Match {
        methods: vec!["DELETE".into()],
        ..Match::default()
    };
    let post = |path: &str| Req::new("POST", path);
    for req in [
        post("/").line("X-HTTP-Method-Override", "DELETE"),
        post("/").line("x-http-method-override", "delete"),
        post("/").line("X_HTTP_METHOD_OVERRIDE", "DELETE"),
        post("/").line("X-HTTP-Method", "DELETE"),
        post("/").line("X-Method-Override", "Delete"),
        post("/")
            .line("x-http-method-override", "PUT")
            .line("x-http-method-override", "DELETE"),
        post("/?_method=DELETE"),
        post("/?x=1;_method=delete"),
        post("/?%5Fmethod=DELETE"),
        post("/?_method=PUT&_method=DELETE"),
        post("/").line("x-http-method-override", "DELETE, GET"), // Express reads the first
        post("/").line("x-http-method-override", "GET,delete"),
        Req::new("GET", "/").line("x-http-method-override", "DELETE"), // Slim, Yii
        Req::new("PUT", "/").line("x-http-method", "DELETE"),
    ] {
        assert!(matches(&delete, &req), "{:?}", req.lines);
    }
    // `_method` only on a POST; the POST itself still matches a POST rule; HEAD asked for is GET.
    assert!(!matches(&delete, &Req::new("GET", "/?_method=DELETE")));
    assert!(!matches(&delete, &post("/?method=DELETE")));
    assert!(!matches(
        &delete,
        &post("/").line("x-http-method-override", "DELETEX")
    ));
    let posts = Match {
        methods: vec!["POST".into()],
        ..Match::default()
    };
    assert!(matches(&posts, &post("/?_method=DELETE")));
    let gets = Match {
        methods: vec!["GET".into()],
        ..Match::default()
    };
    assert!(matches(
        &gets,
        &post("/").line("x-http-method-override", "HEAD")
    ));
}

#[test]
fn header_exact() {
    let m = Match {
        headers: vec![HeaderMatch {
            name: "x-tier".into(),
            value: HeaderValueMatch::Exact("free".into()),
        }],
        ..Match::default()
    };
    assert!(matches(&m, &Req::new("GET", "/").with("x-tier", "free")));
    assert!(!matches(&m, &Req::new("GET", "/").with("x-tier", "Free")));
    assert!(!matches(&m, &Req::new("GET", "/").with("x-tier", "free ")));
    assert!(!matches(&m, &Req::new("GET", "/").with("x-tier", "")));
    assert!(!matches(&m, &Req::new("GET", "/")));
}

#[test]
fn header_present() {
    let m = Match {
        headers: vec![HeaderMatch {
            name: "authorization".into(),
            value: HeaderValueMatch::Present,
        }],
        ..Match::default()
    };
    assert!(matches(
        &m,
        &Req::new("GET", "/").with("authorization", "x")
    ));
    assert!(matches(&m, &Req::new("GET", "/").with("authorization", "")));
    assert!(!matches(&m, &Req::new("GET", "/")));
}

#[test]
fn all_conditions_must_hold() {
    let m = Match {
        path_prefix: Some("/api/".into()),
        path_ignore_case: false,
        hosts: vec![],
        methods: vec!["GET".into()],
        headers: vec![
            HeaderMatch {
                name: "x-a".into(),
                value: HeaderValueMatch::Present,
            },
            HeaderMatch {
                name: "x-b".into(),
                value: HeaderValueMatch::Exact("1".into()),
            },
        ],
    };
    let ok = Req::new("GET", "/api/x").with("x-a", "").with("x-b", "1");
    assert!(matches(&m, &ok));
    assert!(!matches(&m, &Req::new("GET", "/api/x").with("x-a", "")));
    assert!(!matches(
        &m,
        &Req::new("POST", "/api/x").with("x-a", "").with("x-b", "1")
    ));
    assert!(!matches(
        &m,
        &Req::new("GET", "/x").with("x-a", "").with("x-b", "1")
    ));
}

#[test]
fn header_prefix_absent_regex() {
    let prefix = header_rule("authorization", HeaderValueMatch::Prefix("Bearer ".into()));
    let get = |h: &[(&str, &str)]| {
        h.iter()
            .fold(Req::new("GET", "/"), |r, (n, v)| r.with(n, v))
    };
    assert!(matches(&prefix, &get(&[("authorization", "Bearer abc")])));
    assert!(matches(&prefix, &get(&[("authorization", "Bearer ")])));
    assert!(!matches(&prefix, &get(&[("authorization", "bearer abc")])));
    assert!(!matches(&prefix, &get(&[])));
    let absent = header_rule("x-internal", HeaderValueMatch::Absent);
    assert!(matches(&absent, &get(&[])));
    assert!(!matches(&absent, &get(&[("x-internal", "")])));
    assert!(!matches(&absent, &get(&[("x-internal", "1")])));
    let re = header_rule(
        "x-tier",
        HeaderValueMatch::Regex(crate::rule::pattern::Pattern::new("free|trial-[0-9]+").unwrap()),
    );
    assert!(matches(&re, &get(&[("x-tier", "free")])));
    assert!(matches(&re, &get(&[("x-tier", "trial-12")])));
    assert!(!matches(&re, &get(&[("x-tier", "trial-")])));
    assert!(!matches(&re, &get(&[("x-tier", "freedom")])));
    assert!(!matches(&re, &get(&[])));
    // Repeated lines arrive joined: "free,free" is not "free".
    assert!(!matches(&re, &get(&[("x-tier", "free,free")])));
}

#[test]
fn hosts_match_without_port_case_and_wildcard() {
    let m = Match {
        hosts: vec![
            "api.example.com".into(),
            "*.tenant.example.com".into(),
            "[::1]".into(),
            "10.0.0.2".into(),
        ],
        ..Match::default()
    };
    let host = |a: &str| matches(&m, &Req::new("GET", "/").with(":authority", a));
    for yes in [
        "api.example.com",
        "API.Example.COM",
        "api.example.com:8443",
        "api.example.com.",
        "api.example.com.:80",
        "user@api.example.com:1",
        "a.tenant.example.com",
        "x.y.tenant.example.com:443",
        "[::1]:8080",
        "[::1]",
        // Every spelling of the literal, as the configured one was canonicalised too.
        "[0:0::1]:8080",
        "[::0001]",
        "[0:0:0:0:0:0:0:1]:80",
        "[::1%25eth0]:80",
        "10.0.0.2:80",
        "[::FFFF:10.0.0.2]:80",
    ] {
        assert!(host(yes), "{yes}");
    }
    for no in [
        "tenant.example.com",
        ".tenant.example.com",
        "api.example.com.evil",
        "evilapi.example.com",
        "example.com",
        "api.example.co",
        "[::2]:80",
        "[::1:0]",
        "[::ffff:10.0.0.3]",
        "",
    ] {
        assert!(!host(no), "{no}");
    }
    assert!(!matches(&m, &Req::new("GET", "/")), "no :authority");
    assert!(matches(&Match::default(), &Req::new("GET", "/")));
}

#[test]
fn a_header_condition_holds_for_any_line_of_a_repeated_header() {
    let m = header_rule("x-tier", HeaderValueMatch::Exact("free".into()));
    let req = |lines: &[&str]| {
        lines
            .iter()
            .fold(Req::new("GET", "/"), |r, l| r.line("x-tier", l))
    };
    assert!(matches(&m, &req(&["free"])));
    // An application that reads the first (or the last) line sees "free".
    assert!(matches(&m, &req(&["free", "paid"])));
    assert!(matches(&m, &req(&["paid", "free"])));
    assert!(!matches(&m, &req(&["paid", "gold"])));
    let joined = header_rule("x-tier", HeaderValueMatch::Exact("paid,gold".into()));
    assert!(matches(&joined, &req(&["paid", "gold"])));
    let present = header_rule("x-tier", HeaderValueMatch::Present);
    assert!(matches(&present, &Req::new("GET", "/").line("x_tier", "1")));
    let absent = header_rule("x-tier", HeaderValueMatch::Absent);
    assert!(!matches(&absent, &req(&["a", "b"])));
    assert!(matches(&absent, &Req::new("GET", "/")));
}
