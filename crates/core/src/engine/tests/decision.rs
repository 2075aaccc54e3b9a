//! The decision record each request a rule checked leaves with the host (filter state
//! `wasm.tollgate` in Envoy), and the response code details of the filter's local replies: who
//! answered each rule, on every path (a script call, the lease, the deny cache, each failure mode).

use super::*;

/// The configuration's top-level field that turns the record on.
const ON: &str = r#""record_decisions":true,"#;

/// The details the local reply to `ctx` carried.
fn details(h: &Fake, ctx: u32) -> Option<&str> {
    h.responded
        .iter()
        .find(|(c, _)| *c == ctx)
        .map(|(_, r)| r.details.as_str())
}

#[test]
fn a_call_records_each_rule_that_answered_in_configuration_order() {
    let rules =
        format!(r#"{EXACT}, {{"name":"try","key":["header:x-user"],"rate":1,"shadow":true}}"#);
    let (mut e, _) = engine(ON, &rules);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    // The shadow rule answers first; the record keeps the configuration's order.
    deliver(&mut e, &mut h, 2, 200, &answer(false, 0, 900, 900, 0));
    assert_eq!(h.decision(10), None, "not decided yet");
    deliver(&mut e, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(h.resumed, [10]);
    assert_eq!(
        h.decision(10),
        Some("per-user:admitted:19:redis,try:shadow_denied:0:redis")
    );
}

#[test]
fn a_denial_names_its_rule_in_the_details_then_the_deny_cache_answers() {
    let (mut e, _) = engine(ON, EXACT);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(false, 0, 500, 500, 0));
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(details(&h, 10), Some("tollgate_rate_limited{per-user}"));
    assert_eq!(h.decision(10), Some("per-user:denied:0:redis"));
    // The next request of the key is refused from the deny cache, inside its own headers.
    assert_eq!(
        e.request_headers(&mut h, 11.into(), &user("a")),
        Action::Pause
    );
    assert_eq!(h.sent.len(), 1, "no call");
    assert_eq!(details(&h, 11), Some("tollgate_rate_limited{per-user}"));
    assert_eq!(h.decision(11), Some("per-user:denied:0:deny_cache"));
}

#[test]
fn leased_tokens_are_recorded_as_the_lease_s_answer() {
    let (mut e, _) = engine(ON, LEASE);
    let mut h = Fake::default();
    deposit_at_0(&h, &e, TWENTY_LEASED);
    assert_eq!(
        e.request_headers(&mut h, 10.into(), &user("a")),
        Action::Continue
    );
    let record = h.decision(10).unwrap().to_string();
    let fields: Vec<&str> = record.split(':').collect();
    assert_eq!(
        (fields[0], fields[1], fields[3]),
        ("hot", "admitted", "lease")
    );
    // What the RateLimit header says of it.
    e.response_headers(&mut h, 10.into(), &resp(&[]));
    let ratelimit = header(&h.added[0].1, "ratelimit").unwrap();
    assert_eq!(ratelimit, format!("\"hot\";r={};t=1", fields[2]));
}

#[test]
fn a_lease_waiter_records_the_lease_when_the_grant_comes() {
    let (mut e, _) = engine(ON, LEASE);
    let mut h = Fake::default();
    assert_eq!(
        e.request_headers(&mut h, 10.into(), &user("a")),
        Action::Pause
    );
    grant_all(&mut e, &mut h, 1);
    assert_eq!(h.resumed, [10]);
    assert!(
        h.decision(10)
            .is_some_and(|d| d.starts_with("hot:admitted:") && d.ends_with(":lease")),
        "{:?}",
        h.decision(10)
    );
}

#[test]
fn each_failure_mode_is_named_and_closed_names_its_rule() {
    for (top, record, status) in [
        (
            r#""failure_mode":"open","#,
            "per-user:admitted:-:failure_open",
            None,
        ),
        (
            r#""failure_mode":"closed","#,
            "per-user:denied:-:failure_closed",
            Some(503),
        ),
    ] {
        let (mut e, _) = engine(&format!("{ON}{top}"), EXACT);
        let mut h = Fake::default();
        e.request_headers(&mut h, 10.into(), &user("a"));
        deliver(&mut e, &mut h, 1, 0, b"");
        assert_eq!(h.status_of(10), status, "{top}");
        assert_eq!(h.decision(10), Some(record), "{top}");
        if status.is_some() {
            assert_eq!(
                details(&h, 10),
                Some("tollgate_backend_unavailable{per-user}")
            );
        }
    }
    // local (the default): the rule's fallback bucket answers, and is named.
    let (mut e, _) = engine(
        ON,
        r#"{"name":"r","key":["header:x-user"],"rate":1,"burst":10,
            "fallback":{"rate":1,"period_ms":1000,"burst":2}}"#,
    );
    let mut h = Fake::default();
    for ctx in 10..13 {
        e.request_headers(&mut h, ctx.into(), &user("a"));
        let t = *h.tokens().last().unwrap();
        deliver(&mut e, &mut h, t, 503, b"");
    }
    assert_eq!(h.decision(10), Some("r:admitted:1:fallback"));
    assert_eq!(h.decision(11), Some("r:admitted:0:fallback"));
    assert_eq!(h.decision(12), Some("r:denied:0:fallback"));
    assert_eq!(details(&h, 12), Some("tollgate_rate_limited{r}"));
}

#[test]
fn a_bad_cost_names_its_rule_and_a_request_no_rule_checked_records_nothing() {
    let (mut e, _) = engine(ON, EXACT);
    let mut h = Fake::default();
    let bad = req("/api/x", &[("x-user", "a"), ("x-cost", "-1")]);
    assert_eq!(e.request_headers(&mut h, 10.into(), &bad), Action::Pause);
    assert_eq!(h.status_of(10), Some(BAD_COST_STATUS));
    assert_eq!(details(&h, 10), Some("tollgate_bad_cost{per-user}"));
    assert_eq!(h.decision(10), None, "no rule decided it");
    // No key: the rule does not apply.
    let none = req("/api/x", &[]);
    assert_eq!(
        e.request_headers(&mut h, 11.into(), &none),
        Action::Continue
    );
    assert_eq!(h.decision(11), None);
}

#[test]
fn an_enforced_denial_records_only_the_checks_that_answered() {
    let rules = format!(r#"{EXACT}, {{"name":"global","rate":100,"burst":100}}"#);
    let (mut e, _) = engine(ON, &rules);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 2, 200, &answer(false, 0, 300, 300, 0));
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(details(&h, 10), Some("tollgate_rate_limited{global}"));
    assert_eq!(h.decision(10), Some("global:denied:0:redis"));
}

#[test]
fn without_record_decisions_nothing_is_recorded_but_replies_keep_their_details() {
    let (mut e, _) = engine("", EXACT);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(false, 0, 500, 500, 0));
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(details(&h, 10), Some("tollgate_rate_limited{per-user}"));
    assert!(h.decisions.is_empty());
    let (mut e, _) = engine("", LEASE);
    let mut h = Fake::default();
    deposit_at_0(&h, &e, TWENTY_LEASED);
    assert_eq!(
        e.request_headers(&mut h, 10.into(), &user("a")),
        Action::Continue
    );
    assert!(
        h.decisions.is_empty(),
        "the lease path makes no host call for it"
    );
}
