//! A rule's `penalty`: durations, the window and its default, bounds, exact mode only.

use super::*;
use crate::bucket::Penalty;

#[test]
fn durations_and_window_as_given() {
    let r = one_rule(r#""rate":5,"penalty":{"ms":[120000,300000,600000],"window_ms":3600000}"#);
    assert_eq!(
        r.penalty,
        Penalty::new(3_600_000, &[120_000, 300_000, 600_000])
    );
    assert_eq!(one_rule(r#""rate":5"#).penalty, None);
}

#[test]
fn the_window_defaults_to_twice_the_longest_and_at_least_an_hour() {
    let window = |ms: &str| {
        one_rule(&format!(r#""rate":5,"penalty":{{"ms":{ms}}}"#))
            .penalty
            .unwrap()
            .window_ms()
    };
    assert_eq!(window("[1500, 3000]"), 3_600_000);
    assert_eq!(window("[3600000]"), 7_200_000);
    assert_eq!(window("[86400000]"), 172_800_000);
}

#[test]
fn bad_penalties_name_the_field() {
    for (penalty, message) in [
        (r#"{"ms":[]}"#, "rules[0].penalty.ms: must list 1 to 8 durations"),
        (
            r#"{"ms":[1,2,3,4,5,6,7,8,9]}"#,
            "rules[0].penalty.ms: must list 1 to 8 durations",
        ),
        (
            r#"{"ms":[300000,120000]}"#,
            "rules[0].penalty.ms[1]: must be at least the duration before it (a repeat offence is never boxed shorter)",
        ),
        (
            r#"{"ms":[0]}"#,
            "rules[0].penalty.ms[0]: must be an integer >= 1",
        ),
        (
            r#"{"ms":[86400001]}"#,
            "rules[0].penalty.ms[0]: must be an integer <= 86400000",
        ),
        (
            r#"{"ms":[60000],"window_ms":59999}"#,
            "rules[0].penalty.window_ms: must be at least the longest duration (60000), or an offence is forgotten before its box ends",
        ),
        (
            r#"{"ms":[60000],"window_ms":604800001}"#,
            "rules[0].penalty.window_ms: must be an integer <= 604800000",
        ),
        (
            r#"{"ms":[60000],"max_ms":1}"#,
            "rules[0].penalty.max_ms: unknown field",
        ),
    ] {
        let got = rule_error(&format!(r#""rate":5,"penalty":{penalty}"#));
        assert!(got.starts_with(message), "{penalty}: {got}");
    }
}

/// A held request would be let through while its key is boxed: a penalty rule holds none.
#[test]
fn a_penalty_needs_requests_never_held() {
    assert_eq!(
        rule_error(r#""rate":5,"max_wait_ms":60000,"penalty":{"ms":[1000]}"#),
        "rules[0].penalty: needs \"max_wait_ms\": 0 (a request held for its reservation would be let through while its key is boxed)"
    );
}

#[test]
fn a_penalty_needs_exact_mode() {
    assert_eq!(
        rule_error(r#""rate":5,"mode":"lease","penalty":{"ms":[1000]}"#),
        "rules[0].penalty: needs \"mode\": \"exact\" (leased tokens are spent without a call, so the other proxies would keep admitting a boxed client until their leases run out)"
    );
}
