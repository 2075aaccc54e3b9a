//! The flood path pays nothing for refunds: a rule alone in its configuration, without `usage`,
//! `charge_on` or `max_wait_ms`, never sends the tracked form, so its buckets store no spill
//! epoch (no E, D, N, T, W); a rule beside another one does (another rule may refuse its
//! request, and the refund needs its take's epoch). Real Envoy, Webdis and Redis.
//!
//! Invariant: a bucket any call in the tracked form touched stores E; so a key without it was
//! never reached by the tracked form.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::HashMap;

use tollgate_e2e as common;

use common::Stack;

const SPILL_FIELDS: [&str; 5] = ["E", "D", "N", "T", "W"];

fn rule(name: &str, header: &str) -> String {
    format!(
        r#"{{ "name": "{name}", "key": ["header:{header}"],
             "rate": 1, "period_ms": 60000, "burst": 5 }}"#
    )
}

/// Every bucket key in Redis and its hash's fields.
fn buckets(stack: &Stack) -> HashMap<String, Vec<String>> {
    let mut conn = stack.redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    keys.into_iter()
        .map(|k| {
            let fields: Vec<String> = redis::cmd("HKEYS").arg(&k).query(&mut conn).unwrap();
            (k, fields)
        })
        .collect()
}

fn spill_fields(fields: &[String]) -> Vec<&String> {
    fields
        .iter()
        .filter(|f| SPILL_FIELDS.contains(&f.as_str()))
        .collect()
}

#[test]
fn a_lone_exact_rule_stores_no_spill_epoch() {
    let config = format!(r#"{{ "rules": [ {} ] }}"#, rule("flood", "x-user"));
    let stack = Stack::start("spill-cost-lone", &config);
    for _ in 0..3 {
        let r = stack.get("/", &[("x-user", "alice")]);
        assert_eq!(r.status, 200, "{}", stack.logs());
    }
    let got = buckets(&stack);
    assert_eq!(got.len(), 1, "one bucket: {got:?}\n{}", stack.logs());
    for (key, fields) in &got {
        assert!(fields.iter().any(|f| f == "u"), "{key}: {fields:?}");
        assert!(
            spill_fields(fields).is_empty(),
            "{key} stores a spill epoch: {fields:?}"
        );
    }
}

#[test]
fn rules_beside_each_other_store_their_spill_epoch() {
    let config = format!(
        r#"{{ "rules": [ {}, {} ] }}"#,
        rule("per-user", "x-user"),
        rule("per-team", "x-team")
    );
    let stack = Stack::start("spill-cost-two", &config);
    for _ in 0..3 {
        let r = stack.get("/", &[("x-user", "alice"), ("x-team", "red")]);
        assert_eq!(r.status, 200, "{}", stack.logs());
    }
    let got = buckets(&stack);
    assert_eq!(got.len(), 2, "two buckets: {got:?}\n{}", stack.logs());
    for (key, fields) in &got {
        assert_eq!(
            spill_fields(fields).len(),
            SPILL_FIELDS.len(),
            "{key}: {fields:?}"
        );
    }
}
