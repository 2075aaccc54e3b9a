//! Limits: integers and their bounds, quotas, cost, fallback, waiting and usage.

use super::*;

#[test]
fn usage_sources_and_their_errors() {
    let r = one_rule(r#""rate":1,"usage":{"header":"X-Usage-Tokens"}"#);
    let want = Usage {
        source: UsageSource::Header("x-usage-tokens".into()),
        flush_ms: DEFAULT_USAGE_FLUSH_MS,
        unreadable: WorstCase::Recent,
    };
    assert_eq!(r.usage, Some(want));
    let r = one_rule(
        r#""rate":1,"usage":{"body_field":"usage.total_tokens","flush_ms":50,"unreadable":4000}"#,
    );
    let want = Usage {
        source: UsageSource::BodyField(vec!["usage".into(), "total_tokens".into()]),
        flush_ms: 50,
        unreadable: WorstCase::Fixed(4000),
    };
    assert_eq!(r.usage, Some(want));
    for (rule, message) in [
        (
            r#""rate":1,"usage":{}"#,
            r#"rules[0].usage: needs exactly one of "header" or "body_field""#,
        ),
        (
            r#""rate":1,"usage":{"header":"a","body_field":"b"}"#,
            r#"rules[0].usage: needs exactly one of "header" or "body_field""#,
        ),
        (
            r#""rate":1,"usage":{"body_field":"usage..total"}"#,
            r#"rules[0].usage.body_field: must be 1 to 8 dot-separated names of [A-Za-z0-9_-] (got "usage..total")"#,
        ),
        (
            r#""rate":1,"usage":{"body_field":"a.b.c.d.e.f.g.h.i"}"#,
            r#"rules[0].usage.body_field: must be 1 to 8 dot-separated names of [A-Za-z0-9_-] (got "a.b.c.d.e.f.g.h.i")"#,
        ),
        (
            r#""rate":1,"usage":{"header":"a b"}"#,
            r#"rules[0].usage.header: must be a header name of token characters (got "a b")"#,
        ),
        (
            r#""rate":1,"usage":{"header":"x","flush_ms":0}"#,
            "rules[0].usage.flush_ms: must be an integer >= 1",
        ),
        (
            r#""rate":1,"usage":{"header":"x","unreadable":0}"#,
            "rules[0].usage.unreadable: must be an integer >= 1",
        ),
        (
            r#""rate":1,"usage":{"header":"x","unreadable":1000000001}"#,
            "rules[0].usage.unreadable: must be an integer <= 1000000000",
        ),
        (
            r#""rate":1,"usage":{"header":"x","unreadable":"max"}"#,
            "rules[0].usage.unreadable: must be an integer >= 1",
        ),
        (
            r#""rate":1,"usage":{"header":"x","tokens":1}"#,
            "rules[0].usage.tokens: unknown field",
        ),
        (
            r#""rate":1,"mode":"lease","usage":{"header":"x"}"#,
            r#"rules[0].usage: needs "mode": "exact" (leased tokens are spent without a call, so a charge could not be counted before the next admission)"#,
        ),
    ] {
        let got = rule_error(rule);
        assert!(
            got.starts_with(message.split(" (got").next().unwrap()),
            "{rule}: {got}"
        );
        assert_eq!(got, message, "{rule}");
    }
}

#[test]
fn max_wait_holds_in_either_mode_within_a_bound() {
    let r = one_rule(r#""rate":5,"max_wait_ms":250"#);
    assert_eq!(r.max_wait_ms, 250);
    // Lease mode: how long a request waits for the tokens its proxy's reservation refills.
    let r = one_rule(r#""rate":5,"mode":"lease","max_wait_ms":250"#);
    assert_eq!((r.mode, r.max_wait_ms), (Mode::Lease, 250));
    assert_eq!(
        error(r#"{"rules":[{"name":"a","rate":5,"max_wait_ms":3600001}]}"#),
        "rules[0].max_wait_ms: must be an integer <= 3600000"
    );
}

#[test]
fn fallback_defaults_burst_and_period() {
    let r = one_rule(r#""rate":5,"fallback":{"rate":3}"#);
    assert_eq!(
        r.fallback,
        Some(quota(Limits {
            burst: 3,
            rate: 3,
            period_ms: 1000
        }))
    );
}

#[test]
fn a_fallback_period_defaults_to_the_rule_s() {
    // 60 per minute with a fallback of 2: 2 per minute, not 2 per second.
    let r = one_rule(r#""rate":60,"period_ms":60000,"fallback":{"rate":2}"#);
    assert_eq!(
        r.fallback,
        Some(quota(Limits {
            burst: 2,
            rate: 2,
            period_ms: 60000
        }))
    );
    // A period of its own is kept.
    let r = one_rule(r#""rate":60,"period_ms":60000,"fallback":{"rate":2,"period_ms":1000}"#);
    assert_eq!(r.fallback.map(|f| f.period_ms), Some(1000));
}

#[test]
fn a_fallback_burst_below_the_cost_is_an_error() {
    assert_eq!(
        rule_error(r#""rate":10,"cost":3,"fallback":{"rate":1,"burst":2}"#),
        "rules[0].fallback.burst: must be at least the rule's cost (3), or the fallback \
         denies every request (got 2)"
    );
    assert_eq!(
        rule_error(r#""rate":10,"cost":3,"fallback":{"rate":2}"#),
        "rules[0].fallback.burst: must be at least the rule's cost (3), or the fallback \
         denies every request (got 2: burst defaults to the fallback's rate)"
    );
    let r = one_rule(r#""rate":10,"cost":3,"fallback":{"rate":1,"burst":3}"#);
    assert_eq!(r.fallback.map(|f| f.burst), Some(3));
}

#[test]
fn limits_at_their_bounds() {
    // burst × period_ms exactly 2^50 (2^26 × 2^24) is accepted...
    let r = one_rule(r#""rate":1,"burst":67108864,"period_ms":16777216"#);
    assert_eq!(r.limits.burst * r.limits.period_ms, MAX_FULL_UNITS);
    // ...one token more is not.
    assert_eq!(
        rule_error(r#""rate":1,"burst":67108865,"period_ms":16777216"#),
        "rules[0].burst: with burst 67108865, a period this long must be whole seconds: \
         period_ms must be a multiple of 1000 (burst × period_ms is above 2^50 = 1125899906842624)"
    );
    let r = one_rule(r#""rate":1000000000,"period_ms":1000"#);
    assert_eq!(r.limits.burst, 1_000_000_000);
    let r = one_rule(r#""rate":1,"period_ms":86400000"#);
    assert_eq!(r.limits.period_ms, 86_400_000);
    // 366 days, with the largest burst: counted in whole minutes.
    let r = one_rule(r#""rate":1,"burst":1000000000,"period_ms":31622400000"#);
    assert_eq!(r.limits.period_ms, 31_622_400_000);
    assert_eq!(r.limits.step_ms(), Some(60_000));
    let r = one_rule(r#""rate":10,"cost":10"#);
    assert_eq!(r.cost, 10);
}

#[test]
fn zero_rate() {
    assert_eq!(
        rule_error(r#""rate":0"#),
        "rules[0].rate: must be an integer >= 1"
    );
}

#[test]
fn negative_rate() {
    assert_eq!(
        rule_error(r#""rate":-1"#),
        "rules[0].rate: must be an integer >= 1"
    );
}

#[test]
fn float_rate() {
    assert_eq!(
        rule_error(r#""rate":1.5"#),
        "rules[0].rate: must be an integer >= 1"
    );
    assert_eq!(
        rule_error(r#""rate":2.0"#),
        "rules[0].rate: must be an integer >= 1"
    );
}

#[test]
fn string_rate() {
    assert_eq!(
        rule_error(r#""rate":"3""#),
        "rules[0].rate: must be an integer >= 1"
    );
}

#[test]
fn missing_rate() {
    assert_eq!(rule_error(r#""burst":3"#), "rules[0].rate: required");
}

#[test]
fn rate_too_big() {
    assert_eq!(
        rule_error(r#""rate":1000000001"#),
        "rules[0].rate: must be an integer <= 1000000000"
    );
    assert_eq!(
        rule_error(r#""rate":100000000000000000000"#),
        "rules[0].rate: must be an integer <= 1000000000"
    );
}

#[test]
fn burst_zero() {
    assert_eq!(
        rule_error(r#""rate":1,"burst":0"#),
        "rules[0].burst: must be an integer >= 1"
    );
}

#[test]
fn period_ms_zero() {
    assert_eq!(
        rule_error(r#""rate":1,"period_ms":0"#),
        "rules[0].period_ms: must be an integer >= 1"
    );
}

#[test]
fn period_ms_too_big() {
    assert_eq!(
        rule_error(r#""rate":1,"period_ms":31622400001"#),
        "rules[0].period_ms: must be an integer <= 31622400000"
    );
}

#[test]
fn burst_times_period_too_big() {
    // Past 2^50 units in ms, a period must be whole seconds (or minutes) to be counted in them.
    assert_eq!(
        rule_error(r#""rate":1,"burst":1000000000,"period_ms":86400001"#),
        "rules[0].burst: with burst 1000000000, a period this long must be whole seconds: \
         period_ms must be a multiple of 1000 (burst × period_ms is above 2^50 = 1125899906842624)"
    );
    assert_eq!(
        rule_error(r#""rate":1,"burst":1000000000,"period_ms":2592001000"#),
        "rules[0].burst: with burst 1000000000, a period this long must be whole minutes: \
         period_ms must be a multiple of 60000 (burst × period_ms / 1000 is above 2^50 = 1125899906842624)"
    );
    // The default burst (= rate) is checked too.
    assert_eq!(
        rule_error(r#""rate":13100000,"period_ms":86400001"#),
        "rules[0].burst: with burst 13100000, a period this long must be whole seconds: \
         period_ms must be a multiple of 1000 (burst × period_ms is above 2^50 = 1125899906842624)"
    );
}

#[test]
fn fallback_burst_times_period_too_big() {
    assert_eq!(
        rule_error(r#""rate":1,"fallback":{"rate":1,"burst":1000000000,"period_ms":86400001}"#),
        "rules[0].fallback.burst: with burst 1000000000, a period this long must be whole \
         seconds: period_ms must be a multiple of 1000 (burst × period_ms is above 2^50 = \
         1125899906842624)"
    );
}

#[test]
fn fallback_zero_rate() {
    assert_eq!(
        rule_error(r#""rate":1,"fallback":{"rate":0}"#),
        "rules[0].fallback.rate: must be an integer >= 1"
    );
}

#[test]
fn cost_greater_than_burst() {
    assert_eq!(
        rule_error(r#""rate":10,"burst":20,"cost":21"#),
        "rules[0].cost: must be an integer <= 20 (the rule's burst)"
    );
}

#[test]
fn cost_zero() {
    assert_eq!(
        rule_error(r#""rate":10,"cost":0"#),
        "rules[0].cost: must be an integer >= 1"
    );
}

#[test]
fn bad_cost_header() {
    assert_eq!(
        rule_error(r#""rate":1,"cost_header":"x cost""#),
        r#"rules[0].cost_header: must be a header name of token characters (got "x cost")"#
    );
}
