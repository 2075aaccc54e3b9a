//! The configuration's unit tests: the document as a whole here, each area in its own file.

use std::collections::BTreeMap;

use super::*;
use crate::bucket::{Limits, MAX_FULL_UNITS};
use crate::rule::pattern::Pattern;

/// The plugin configuration example of the design reference (shared/DESIGN.md, outside this
/// repository), kept here verbatim.
const DESIGN_EXAMPLE: &str = r#"{
  "backend":  { "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 25,
                "basic_auth": "user:pass" },
  "key_prefix": "tollgate",
  "failure_mode": "local",
  "response_headers": "ietf",
  "deny": { "status": 429, "body": "rate limited\n" },
  "rules": [
    { "name": "per-user",
      "match": { "path_prefix": "/api/", "methods": ["GET", "POST"],
                 "headers": [ { "name": "x-tier", "exact": "free" } ] },
      "key": ["header:x-user-id"],
      "rate": 100, "period_ms": 1000, "burst": 200,
      "cost": 1, "cost_header": "x-cost",
      "mode": "lease",
      "shadow": false,
      "fallback": { "rate": 25, "period_ms": 1000, "burst": 50 } }
  ]
}"#;

/// Limits a test knows are a quota.
fn quota(l: Limits) -> Quota {
    Quota::try_from(l).unwrap()
}

fn parse(s: &str) -> Result<Config, ConfigError> {
    Config::try_from(s.as_bytes())
}

fn parse_higress(s: &str) -> Result<Config, ConfigError> {
    Config::parse(s.as_bytes(), Artifact::Higress)
}

fn higress_error(s: &str) -> String {
    match parse_higress(s) {
        Ok(c) => panic!("expected an error, parsed {c:?}"),
        Err(e) => e.to_string(),
    }
}

/// The Display of the error for `s`.
fn error(s: &str) -> String {
    match parse(s) {
        Ok(c) => panic!("expected an error, parsed {c:?}"),
        Err(e) => e.to_string(),
    }
}

/// The error for a document with one rule whose body is `rule` (without braces).
fn rule_error(rule: &str) -> String {
    error(&format!(r#"{{"rules":[{{"name":"r",{rule}}}]}}"#))
}

fn one_rule(rule: &str) -> Rule {
    let c = parse(&format!(r#"{{"rules":[{{"name":"r",{rule}}}]}}"#)).unwrap();
    c.rules.into_iter().next().unwrap()
}

mod backend;
mod keys;
mod limits;
mod matching;
mod outcome;
mod penalty;
mod tiers;

#[test]
fn design_example_parses() {
    let c = parse(DESIGN_EXAMPLE).unwrap();
    let want = Config {
        backend: Backend {
            cluster: "tollgate_backend".into(),
            authority: "webdis".into(),
            timeout_ms: 25,
            basic_auth: Some("user:pass".into()),
            username: None,
            password: None,
            database: 0,
            protocol: Protocol::Webdis,
            breaker_failures: 5,
            breaker_cooloff_ms: 1000,
            max_inflight: 256,
            batch_max_keys: 32,
        },
        key_prefix: "tollgate".into(),
        failure_mode: FailureMode::Local,
        response_headers: HeaderStyle::Ietf,
        deny: Deny {
            status: 429,
            body: "rate limited\n".into(),
            grpc_resource_exhausted: true,
        },
        record_decisions: false,
        rules: vec![Rule {
            name: "per-user".into(),
            matcher: Match {
                path_prefix: Some("/api/".into()),
                path_ignore_case: false,
                hosts: vec![],
                methods: vec!["GET".into(), "POST".into()],
                headers: vec![HeaderMatch {
                    name: "x-tier".into(),
                    value: HeaderValueMatch::Exact("free".into()),
                }],
            },
            key: vec![KeySource::Header("x-user-id".into())],
            limits: quota(Limits {
                burst: 200,
                rate: 100,
                period_ms: 1000,
            }),
            cost: 1,
            cost_header: Some("x-cost".into()),
            mode: Mode::Lease,
            max_wait_ms: 0,
            lease_max: 200,
            lease_horizon_ms: 200,
            shadow: false,
            fallback: Some(quota(Limits {
                burst: 50,
                rate: 25,
                period_ms: 1000,
            })),
            usage: None,
            overrides: BTreeMap::new(),
            tiers: None,
            penalty: None,
        }],
    };
    assert_eq!(c, want);
    assert_eq!(
        c.summary(),
        "1 rule: per-user 100/1000ms burst 200 lease (fallback 25/1000ms burst 50)"
    );
}

#[test]
fn defaults() {
    let c = parse(r#"{"rules":[{"name":"all","rate":10}]}"#).unwrap();
    let want = Config {
        backend: Backend {
            cluster: "tollgate_backend".into(),
            authority: "webdis".into(),
            timeout_ms: 50,
            basic_auth: None,
            username: None,
            password: None,
            database: 0,
            protocol: Protocol::Webdis,
            breaker_failures: 5,
            breaker_cooloff_ms: 1000,
            max_inflight: 256,
            batch_max_keys: 32,
        },
        key_prefix: "tollgate".into(),
        failure_mode: FailureMode::Local,
        response_headers: HeaderStyle::Ietf,
        deny: Deny {
            status: 429,
            body: "rate limited\n".into(),
            grpc_resource_exhausted: true,
        },
        record_decisions: false,
        rules: vec![Rule {
            name: "all".into(),
            matcher: Match::default(),
            key: vec![],
            limits: quota(Limits {
                burst: 10,
                rate: 10,
                period_ms: 1000,
            }),
            cost: 1,
            cost_header: None,
            mode: Mode::Exact,
            max_wait_ms: 0,
            lease_max: 10,
            lease_horizon_ms: 200,
            shadow: false,
            fallback: None,
            usage: None,
            overrides: BTreeMap::new(),
            tiers: None,
            penalty: None,
        }],
    };
    assert_eq!(c, want);
    // Empty sub-objects give the same defaults.
    let c2 =
        parse(r#"{"backend":{},"deny":{},"rules":[{"name":"all","rate":10,"match":{}}]}"#).unwrap();
    assert_eq!(c2, want);
}

#[test]
fn enums_and_summary() {
    let c = parse(
        r#"{"failure_mode":"closed","response_headers":"both","rules":[
                {"name":"a","rate":100,"burst":200,"mode":"lease"},
                {"name":"b","rate":5,"period_ms":60000,"shadow":true}]}"#,
    )
    .unwrap();
    assert_eq!(c.failure_mode, FailureMode::Closed);
    assert_eq!(c.response_headers, HeaderStyle::Both);
    assert_eq!(
        c.summary(),
        "2 rules: a 100/1000ms burst 200 lease, b 5/60000ms burst 5 exact shadow"
    );
    for (s, want) in [
        ("ietf", HeaderStyle::Ietf),
        ("legacy", HeaderStyle::Legacy),
        ("none", HeaderStyle::None),
    ] {
        let c = parse(&format!(
            r#"{{"response_headers":"{s}","rules":[{{"name":"a","rate":1}}]}}"#
        ))
        .unwrap();
        assert_eq!(c.response_headers, want);
    }
}

#[test]
fn non_utf8() {
    let e = Config::try_from(&b"{\"rules\":\xff}"[..]).unwrap_err();
    assert_eq!(e.to_string(), "configuration: not valid UTF-8 (at byte 9)");
}

#[test]
fn empty() {
    assert_eq!(error(""), "configuration: empty");
    assert_eq!(error(" \n\t "), "configuration: empty");
}

#[test]
fn invalid_json() {
    assert_eq!(
        error(r#"{"rules": [}"#),
        "configuration: invalid JSON: expected value at line 1 column 12"
    );
}

#[test]
fn not_an_object() {
    assert_eq!(error("[1]"), "configuration: must be a JSON object");
    assert_eq!(error("null"), "configuration: must be a JSON object");
}

#[test]
fn missing_rules() {
    assert_eq!(error("{}"), "rules: required");
}

#[test]
fn empty_rules() {
    assert_eq!(error(r#"{"rules":[]}"#), "rules: must not be empty");
}

#[test]
fn rules_not_an_array() {
    assert_eq!(error(r#"{"rules":{}}"#), "rules: must be an array");
}

#[test]
fn too_many_rules() {
    let rules: Vec<String> = (0..65)
        .map(|i| format!(r#"{{"name":"r{i}","rate":1}}"#))
        .collect();
    assert_eq!(
        error(&format!(r#"{{"rules":[{}]}}"#, rules.join(","))),
        "rules: must have at most 64 rules (got 65)"
    );
}

#[test]
fn rule_not_an_object() {
    assert_eq!(error(r#"{"rules":["x"]}"#), "rules[0]: must be an object");
}

#[test]
fn unknown_field_top_level() {
    assert_eq!(
        error(r#"{"rules":[{"name":"a","rate":1}],"rulez":1}"#),
        "rulez: unknown field"
    );
}

#[test]
fn unknown_field_backend() {
    assert_eq!(
        error(r#"{"backend":{"timeout":5},"rules":[{"name":"a","rate":1}]}"#),
        "backend.timeout: unknown field"
    );
}

#[test]
fn unknown_field_rule() {
    assert_eq!(
        error(r#"{"rules":[{"name":"a","rate":1},{"name":"b","rate":1,"limit":3}]}"#),
        "rules[1].limit: unknown field"
    );
}

#[test]
fn unknown_field_match() {
    assert_eq!(
        rule_error(r#""rate":1,"match":{"prefix":"/"}"#),
        "rules[0].match.prefix: unknown field"
    );
}

#[test]
fn unknown_field_header_match() {
    assert_eq!(
        rule_error(
            r#""rate":1,"match":{"headers":[{"name":"a","present":true},{"name":"b","suffix":"x"}]}"#
        ),
        "rules[0].match.headers[1].suffix: unknown field"
    );
}

#[test]
fn unknown_field_fallback() {
    assert_eq!(
        rule_error(r#""rate":1,"fallback":{"rate":1,"cost":1}"#),
        "rules[0].fallback.cost: unknown field"
    );
}

#[test]
fn unknown_field_name_is_escaped() {
    assert_eq!(error("{\"a\\nb\":1,\"rules\":[]}"), "a\\nb: unknown field");
}

#[test]
fn wrong_types() {
    assert_eq!(
        error(r#"{"backend":"x","rules":[{"name":"a","rate":1}]}"#),
        "backend: must be an object"
    );
    assert_eq!(
        error(r#"{"key_prefix":5,"rules":[{"name":"a","rate":1}]}"#),
        "key_prefix: must be a string"
    );
    assert_eq!(
        rule_error(r#""rate":1,"shadow":"yes""#),
        "rules[0].shadow: must be a boolean"
    );
    assert_eq!(
        rule_error(r#""rate":1,"key":"client_ip""#),
        "rules[0].key: must be an array"
    );
    assert_eq!(
        rule_error(r#""rate":1,"key":[1]"#),
        "rules[0].key[0]: must be a string"
    );
    assert_eq!(
        rule_error(r#""rate":1,"match":[]"#),
        "rules[0].match: must be an object"
    );
    assert_eq!(
        rule_error(r#""rate":1,"match":{"methods":[null]}"#),
        "rules[0].match.methods[0]: must be a string"
    );
    assert_eq!(
        error(r#"{"rules":[{"name":7,"rate":1}]}"#),
        "rules[0].name: must be a string"
    );
}

#[test]
fn bad_key_prefix() {
    assert_eq!(
        error(r#"{"key_prefix":"tg{x}","rules":[{"name":"a","rate":1}]}"#),
        r#"key_prefix: must be 1 to 64 characters of [A-Za-z0-9_.:-] (got "tg{x}")"#
    );
    assert_eq!(
        error(r#"{"key_prefix":"","rules":[{"name":"a","rate":1}]}"#),
        r#"key_prefix: must be 1 to 64 characters of [A-Za-z0-9_.:-] (got "")"#
    );
}

#[test]
fn bad_failure_mode() {
    assert_eq!(
        error(r#"{"failure_mode":"x","rules":[{"name":"a","rate":1}]}"#),
        r#"failure_mode: must be one of "open", "closed", "local" (got "x")"#
    );
}

#[test]
fn record_decisions_is_off_unless_asked_for() {
    let base = r#""rules":[{"name":"a","rate":1}]}"#;
    assert!(
        !Config::try_from(format!("{{{base}").as_bytes())
            .unwrap()
            .record_decisions
    );
    let on = format!(r#"{{"record_decisions":true,{base}"#);
    assert!(Config::try_from(on.as_bytes()).unwrap().record_decisions);
    assert_eq!(
        error(&format!(r#"{{"record_decisions":"yes",{base}"#)),
        "record_decisions: must be a boolean"
    );
}

#[test]
fn bad_response_headers() {
    assert_eq!(
        error(r#"{"response_headers":"IETF","rules":[{"name":"a","rate":1}]}"#),
        r#"response_headers: must be one of "ietf", "legacy", "both", "none" (got "IETF")"#
    );
}

#[test]
fn bad_mode() {
    assert_eq!(
        rule_error(r#""rate":1,"mode":"batch""#),
        r#"rules[0].mode: must be one of "exact", "lease" (got "batch")"#
    );
}

#[test]
fn missing_rule_name() {
    assert_eq!(
        error(r#"{"rules":[{"rate":1}]}"#),
        "rules[0].name: required"
    );
}

#[test]
fn bad_rule_name() {
    assert_eq!(
        error(r#"{"rules":[{"name":"a.b","rate":1}]}"#),
        r#"rules[0].name: must be 1 to 64 characters of [A-Za-z0-9_-] (got "a.b")"#
    );
    assert_eq!(
        error(r#"{"rules":[{"name":"","rate":1}]}"#),
        r#"rules[0].name: must be 1 to 64 characters of [A-Za-z0-9_-] (got "")"#
    );
}

#[test]
fn duplicate_rule_names() {
    assert_eq!(
        error(r#"{"rules":[{"name":"x","rate":1},{"name":"y","rate":1},{"name":"x","rate":2}]}"#),
        r#"rules[2].name: duplicate rule name "x""#
    );
}

#[test]
fn long_values_are_cut_in_messages() {
    let long = "z".repeat(100);
    let msg = error(&format!(
        r#"{{"failure_mode":"{long}","rules":[{{"name":"a","rate":1}}]}}"#
    ));
    assert_eq!(
        msg,
        format!(
            r#"failure_mode: must be one of "open", "closed", "local" (got "{}"…)"#,
            "z".repeat(64)
        )
    );
}

#[test]
fn null_is_a_value_not_a_missing_field() {
    // Only a field left out takes its default; `null` is refused like any other wrong value.
    for (doc, want) in [
        (
            r#"{"backend":null,"rules":[{"name":"a","rate":1}]}"#,
            "backend: must be an object",
        ),
        (
            r#"{"key_prefix":null,"rules":[{"name":"a","rate":1}]}"#,
            "key_prefix: must be a string",
        ),
        (
            r#"{"failure_mode":null,"rules":[{"name":"a","rate":1}]}"#,
            "failure_mode: must be a string",
        ),
        (
            r#"{"deny":{"status":null},"rules":[{"name":"a","rate":1}]}"#,
            "deny.status: must be an integer >= 400",
        ),
        (r#"{"rules":null}"#, "rules: must be an array"),
        (
            r#"{"rules":[{"name":"a","rate":1,"cost":null}]}"#,
            "rules[0].cost: must be an integer >= 1",
        ),
        (
            r#"{"rules":[{"name":"a","rate":1,"burst":null}]}"#,
            "rules[0].burst: must be an integer >= 1",
        ),
        (
            r#"{"rules":[{"name":"a","rate":1,"shadow":null}]}"#,
            "rules[0].shadow: must be a boolean",
        ),
        (
            r#"{"rules":[{"name":"a","rate":1,"fallback":null}]}"#,
            "rules[0].fallback: must be an object",
        ),
        (
            r#"{"rules":[{"name":"a","rate":1,"key":null}]}"#,
            "rules[0].key: must be an array",
        ),
        (
            r#"{"rules":[{"name":"a","rate":1,"match":{"path_prefix":null}}]}"#,
            "rules[0].match.path_prefix: must be a string",
        ),
        (
            r#"{"rules":[{"name":"a","rate":1,"usage":{"header":null}}]}"#,
            "rules[0].usage.header: must be a string",
        ),
    ] {
        assert_eq!(error(doc), want, "{doc}");
    }
}

/// A value of the wrong kind for every field the document has, at every level: each error is
/// in the reference's words, never serde's ("invalid type: …, expected u64").
#[test]
fn serde_s_words_never_reach_users() {
    let wrong = [
        json(r#"null"#),
        json(r#"true"#),
        json(r#"-1"#),
        json(r#"1.5"#),
        json(r#"1e30"#),
        json(r#""text""#),
        json(r#"[1]"#),
        json(r#"{"x":1}"#),
    ];
    let base = json(
        r#"{"rules":[{"name":"a","rate":1,"key":["header:x"],"match":{"headers":[{"name":"h","present":true}]},
            "fallback":{"rate":1},"usage":{"header":"u"},"overrides":[{"key":["k"],"rate":1}]}]}"#,
    );
    // Where each object of the schema sits in `base` (created when absent).
    let places: &[(&str, &[&str])] = &[
        ("top level", &[]),
        ("backend", &["backend"]),
        ("deny", &["deny"]),
        ("rules[]", &["rules", "0"]),
        ("match", &["rules", "0", "match"]),
        ("match.headers[]", &["rules", "0", "match", "headers", "0"]),
        ("usage", &["rules", "0", "usage"]),
        ("charge_on", &["rules", "0", "charge_on"]),
        ("fallback", &["rules", "0", "fallback"]),
        ("overrides[]", &["rules", "0", "overrides", "0"]),
        ("tiers", &["rules", "0", "tiers"]),
        ("tiers.limits.*", &["rules", "0", "tiers", "limits", "pro"]),
        ("penalty", &["rules", "0", "penalty"]),
    ];
    let mut checked = 0;
    for (object, fields) in schema() {
        let (_, at) = places.iter().find(|(name, _)| *name == object).unwrap();
        for field in fields {
            for bad in &wrong {
                let mut doc = base.clone();
                let mut node = &mut doc;
                for step in *at {
                    node = match step.parse::<usize>() {
                        Ok(i) => &mut node[i],
                        Err(_) => node
                            .as_object_mut()
                            .unwrap()
                            .entry(*step)
                            .or_insert_with(|| serde_json::json!({})),
                    };
                }
                node[*field] = bad.clone();
                let text = doc.to_string();
                for artifact in [Artifact::Envoy, Artifact::Higress] {
                    let Err(e) = Config::parse(text.as_bytes(), artifact) else {
                        continue;
                    };
                    let line = e.to_string();
                    for serde_word in [
                        "invalid type",
                        "expected",
                        "sequence",
                        "struct ",
                        "u64",
                        "variant",
                    ] {
                        assert!(!line.contains(serde_word), "{text}: {line}");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 700, "{checked} errors checked");
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap()
}

#[test]
fn unknown_fields_come_first_then_fields_in_their_declared_order() {
    // Whatever order the text gives them in, a rule's `rate` is read before its `burst`, and an
    // unknown field is reported before either.
    for doc in [
        r#"{"rules":[{"name":"a","rate":0,"burst":0}]}"#,
        r#"{"rules":[{"burst":0,"rate":0,"name":"a"}]}"#,
    ] {
        assert_eq!(
            error(doc),
            "rules[0].rate: must be an integer >= 1",
            "{doc}"
        );
    }
    assert_eq!(
        error(r#"{"rules":[{"name":"a","rate":0,"burst":0,"limit":1}]}"#),
        "rules[0].limit: unknown field"
    );
    // A field the user misplaced is unknown where it is, even when the document knows it elsewhere.
    assert_eq!(
        error(r#"{"rate":1,"rules":[{"name":"a","rate":1}]}"#),
        "rate: unknown field"
    );
}

#[test]
fn the_schema_lists_every_object_of_the_document() {
    let schema = schema();
    let names: Vec<&str> = schema.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        [
            "top level",
            "backend",
            "deny",
            "rules[]",
            "match",
            "match.headers[]",
            "usage",
            "charge_on",
            "fallback",
            "overrides[]",
            "tiers",
            "tiers.limits.*",
            "penalty"
        ]
    );
    let fields = |object: &str| schema.iter().find(|(n, _)| *n == object).unwrap().1;
    assert_eq!(
        fields("top level"),
        [
            "backend",
            "key_prefix",
            "failure_mode",
            "response_headers",
            "deny",
            "record_decisions",
            "rules"
        ]
    );
    assert!(
        fields("rules[]").contains(&"match"),
        "the serde name, not the Rust one"
    );
    assert!(schema.iter().all(|(_, f)| !f.is_empty()));
}
