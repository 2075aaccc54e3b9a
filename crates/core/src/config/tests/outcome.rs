//! `charge_on`: the statuses it lists, and where it may not go.

use super::*;

#[test]
fn charge_on_compiles_to_a_usage_by_status() {
    let r = one_rule(r#""rate":5,"charge_on":{"status":[401,403,"5xx"]}"#);
    let mut codes = vec![401, 403];
    codes.extend(500..600);
    let want = Usage {
        source: UsageSource::Status(StatusSet::of(&codes).unwrap()),
        flush_ms: DEFAULT_USAGE_FLUSH_MS,
        unreadable: WorstCase::Upfront,
    };
    assert_eq!(r.usage, Some(want));
    assert!(!r.reads_body(), "a status needs no body");
    let r = one_rule(r#""rate":5,"charge_on":{"status":["1xx",599],"flush_ms":20}"#);
    let Some(Usage {
        source: UsageSource::Status(set),
        flush_ms: 20,
        ..
    }) = r.usage
    else {
        panic!("{:?}", r.usage);
    };
    assert_eq!(set.to_string(), "1xx, 599");
    assert!(set.contains(100) && set.contains(199) && !set.contains(200));
    // The most entries there may be.
    let many: Vec<String> = (400..432).map(|c| c.to_string()).collect();
    one_rule(&format!(
        r#""rate":5,"charge_on":{{"status":[{}]}}"#,
        many.join(",")
    ));
}

#[test]
fn charge_on_errors() {
    let too_many: Vec<String> = (400..433).map(|c| c.to_string()).collect();
    let too_many = format!(
        r#""rate":1,"charge_on":{{"status":[{}]}}"#,
        too_many.join(",")
    );
    let status = r#"must be a status code 100 to 599 or a class "1xx" to "5xx""#;
    for (rule, message) in [
        (r#""rate":1,"charge_on":{}"#, "rules[0].charge_on.status: required".to_string()),
        (
            r#""rate":1,"charge_on":{"status":[]}"#,
            "rules[0].charge_on.status: must have 1 to 32 entries (got 0)".to_string(),
        ),
        (
            &too_many,
            "rules[0].charge_on.status: must have 1 to 32 entries (got 33)".to_string(),
        ),
        (
            r#""rate":1,"charge_on":{"status":401}"#,
            "rules[0].charge_on.status: must be an array".to_string(),
        ),
        (r#""rate":1,"charge_on":{"status":[99]}"#, format!("rules[0].charge_on.status[0]: {status}")),
        (r#""rate":1,"charge_on":{"status":[401,600]}"#, format!("rules[0].charge_on.status[1]: {status}")),
        (r#""rate":1,"charge_on":{"status":[-401]}"#, format!("rules[0].charge_on.status[0]: {status}")),
        (r#""rate":1,"charge_on":{"status":[401.0]}"#, format!("rules[0].charge_on.status[0]: {status}")),
        (r#""rate":1,"charge_on":{"status":["6xx"]}"#, format!("rules[0].charge_on.status[0]: {status}")),
        (r#""rate":1,"charge_on":{"status":["4XX"]}"#, format!("rules[0].charge_on.status[0]: {status}")),
        (r#""rate":1,"charge_on":{"status":["401"]}"#, format!("rules[0].charge_on.status[0]: {status}")),
        (r#""rate":1,"charge_on":{"status":[null]}"#, format!("rules[0].charge_on.status[0]: {status}")),
        (r#""rate":1,"charge_on":{"status":[[401]]}"#, format!("rules[0].charge_on.status[0]: {status}")),
        (
            r#""rate":1,"charge_on":{"status":[401,403,401]}"#,
            "rules[0].charge_on.status[2]: repeats a status given before (401)".to_string(),
        ),
        (
            r#""rate":1,"charge_on":{"status":["4xx",429]}"#,
            "rules[0].charge_on.status[1]: repeats a status given before (429)".to_string(),
        ),
        (
            r#""rate":1,"charge_on":{"status":[503,"5xx"]}"#,
            "rules[0].charge_on.status[1]: repeats a status given before (503)".to_string(),
        ),
        (
            r#""rate":1,"charge_on":{"status":[401],"flush_ms":0}"#,
            "rules[0].charge_on.flush_ms: must be an integer >= 1".to_string(),
        ),
        (
            r#""rate":1,"charge_on":{"status":[401],"flush_ms":10001}"#,
            "rules[0].charge_on.flush_ms: must be an integer <= 10000".to_string(),
        ),
        (
            r#""rate":1,"charge_on":{"status":[401],"headers":["x"]}"#,
            "rules[0].charge_on.headers: unknown field".to_string(),
        ),
        (
            r#""rate":1,"mode":"lease","charge_on":{"status":[401]}"#,
            r#"rules[0].charge_on: needs "mode": "exact" (lease admissions spend local tokens without a call, so a refund could not reach the global bucket before the next admission)"#.to_string(),
        ),
        (
            r#""rate":1,"usage":{"header":"x-used"},"charge_on":{"status":[401]}"#,
            r#"rules[0].charge_on: not together with "usage" (both settle the same admission: one by the answer's status, the other by the usage it reports)"#.to_string(),
        ),
    ] {
        assert_eq!(rule_error(rule), message, "{rule}");
    }
}

/// The schema names `charge_on`'s fields (the reference documents exactly those).
#[test]
fn charge_on_is_in_the_schema() {
    let schema = schema();
    let (_, fields) = schema.iter().find(|(o, _)| *o == "charge_on").unwrap();
    assert_eq!(*fields, ["status", "flush_ms"]);
    let (_, rule) = schema.iter().find(|(o, _)| *o == "rules[]").unwrap();
    assert!(rule.contains(&"charge_on"));
}
