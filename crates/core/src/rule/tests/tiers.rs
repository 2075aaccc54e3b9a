//! Tiers: the tier source's value picks the limits, never the bucket; an override wins over the
//! tier; what cannot be read as one value picks no tier.

use super::*;
use crate::config::Config;

/// A protobuf length-delimited field.
fn field(n: u8, b: &[u8]) -> Vec<u8> {
    let mut out = vec![n << 3 | 2, u8::try_from(b.len()).unwrap()];
    out.extend_from_slice(b);
    out
}

fn entry(k: &str, v: &[u8]) -> Vec<u8> {
    [field(1, k.as_bytes()), field(2, v)].concat()
}

/// `google.protobuf.Value`s.
fn string(s: &str) -> Vec<u8> {
    field(3, s.as_bytes())
}

fn number(n: f64) -> Vec<u8> {
    let mut v = vec![2 << 3 | 1];
    v.extend_from_slice(&n.to_bits().to_le_bytes());
    v
}

fn list(items: &[Vec<u8>]) -> Vec<u8> {
    let values: Vec<u8> = items.iter().flat_map(|i| field(1, i)).collect();
    field(6, &values)
}

/// A request whose `jwt` metadata namespace holds the struct `p` with these claims (name,
/// `Value` message), as Envoy serialises dynamic metadata.
fn with_claims(claims: &[(&str, Vec<u8>)]) -> Req {
    let payload: Vec<u8> = claims
        .iter()
        .flat_map(|(k, v)| field(1, &entry(k, v)))
        .collect();
    let ns = field(1, &entry("p", &field(5, &payload)));
    Req::new("GET", "/api/x").prop("metadata", field(1, &entry("jwt", &ns)))
}

fn user(sub: &str, plan: Vec<u8>) -> Req {
    with_claims(&[("sub", string(sub)), ("plan", plan)])
}

const CONFIG: &str = r#"{"rules":[{"name":"per-user","key":["metadata:jwt:p.sub"],
    "rate":1,"period_ms":60000,"burst":3,
    "tiers":{"from":"metadata:jwt:p.plan","limits":{
      "pro":{"rate":10,"burst":20},
      "2":{"rate":5,"burst":5},
      "internal":{"unlimited":true}}},
    "overrides":[{"key":["ci-bot"],"rate":100,"burst":100}]}]}"#;

fn rule_of(config: &str) -> Rule {
    Config::try_from(config.as_bytes()).unwrap().rules.remove(0)
}

fn limits(rate: u64, period_ms: u64, burst: u64) -> Limits {
    Limits {
        burst,
        rate,
        period_ms,
    }
}

fn apply(r: &Rule, req: &Req) -> Applied {
    applies("tg", (0, r), req, &mut KeyCache::default()).unwrap()
}

#[test]
fn the_tier_picks_the_limits_and_never_the_bucket() {
    let r = rule_of(CONFIG);
    let pro = apply(&r, &user("alice", string("pro")));
    assert_eq!(pro.limits, limits(10, 60_000, 20));
    assert_eq!(pro.by, LimitsBy::Tier);
    assert!(!pro.unlimited && !pro.ambiguous);
    // The same key whatever the tier: a change of plan keeps the bucket's state.
    let alice = bucket_key("tg", "per-user", &r.key, &[b"alice".to_vec()]);
    assert_eq!(pro.key, alice);
    for (plan, want, by) in [
        (Some(string("free")), limits(1, 60_000, 3), LimitsBy::Rule),
        (Some(string("PRO")), limits(1, 60_000, 3), LimitsBy::Rule),
        (Some(string("")), limits(1, 60_000, 3), LimitsBy::Rule),
        (None, limits(1, 60_000, 3), LimitsBy::Rule),
        // A numeric claim is its decimal text.
        (Some(number(2.0)), limits(5, 60_000, 5), LimitsBy::Tier),
    ] {
        let req = match &plan {
            Some(p) => user("alice", p.clone()),
            None => with_claims(&[("sub", string("alice"))]),
        };
        let a = apply(&r, &req);
        assert_eq!((a.limits, a.by), (want, by), "{plan:?}");
        assert_eq!(a.key, alice, "{plan:?}");
    }
    let internal = apply(&r, &user("alice", string("internal")));
    assert!(internal.unlimited);
    assert_eq!(internal.by, LimitsBy::Tier);
    assert_eq!(internal.key, alice);
    // Without a `sub` the rule does not apply, whatever the plan.
    assert_eq!(
        applies(
            "tg",
            (0, &r),
            &with_claims(&[("plan", string("pro"))]),
            &mut KeyCache::default()
        ),
        None
    );
}

#[test]
fn an_override_wins_over_the_tier() {
    let r = rule_of(CONFIG);
    for plan in ["pro", "free", "internal"] {
        let a = apply(&r, &user("ci-bot", string(plan)));
        assert_eq!(a.limits, limits(100, 60_000, 100), "{plan}");
        assert_eq!(a.by, LimitsBy::Override);
        assert!(
            !a.unlimited,
            "{plan}: the override's limits, not the tier's unlimited"
        );
    }
}

/// A list of plans (or a struct) is not one plan: its JSON text never names a tier, even one
/// spelled like it; the rule's limits, counted as ambiguous.
#[test]
fn a_tier_value_that_is_not_one_value_picks_no_tier() {
    let mut r = rule_of(CONFIG);
    let t = r.tiers.as_mut().unwrap();
    t.limits
        .insert(br#"["pro"]"#.to_vec(), crate::config::Override::Unlimited);
    for plan in [
        list(&[string("pro")]),
        list(&[string("free"), string("pro")]),
        field(5, &field(1, &entry("name", &string("pro")))),
    ] {
        let a = apply(&r, &user("alice", plan.clone()));
        assert_eq!(a.limits, r.limits.limits(), "{plan:?}");
        assert_eq!(a.by, LimitsBy::AmbiguousTier);
        assert!(!a.unlimited && !a.ambiguous);
        assert_eq!(
            a.key,
            bucket_key("tg", "per-user", &r.key, &[b"alice".to_vec()])
        );
    }
}

/// A trusted header named twice picks no tier, even when both lines name the same one.
#[test]
fn a_repeated_trusted_header_picks_no_tier() {
    let r = rule_of(
        r#"{"rules":[{"name":"per-user","key":["header:x-user"],"rate":1,"burst":3,
            "tiers":{"from":"header:x-plan","trusted":true,"limits":{"pro":{"rate":10,"burst":20}}}}]}"#,
    );
    let req = |lines: &[(&str, &str)]| {
        lines.iter().fold(
            Req::new("GET", "/").with("x-user", "alice"),
            |req, (n, v)| req.line(n, v),
        )
    };
    let once = apply(&r, &req(&[("x-plan", "pro")]));
    assert_eq!((once.limits.burst, once.by), (20, LimitsBy::Tier));
    for lines in [
        &[("x-plan", "pro"), ("x-plan", "pro")][..],
        &[("x-plan", "free"), ("x_plan", "pro")],
        &[("X-Plan", "pro"), ("x-plan", "free")],
        // Alone, but not the spelling the filter in front sets or strips: the client's own.
        &[("x_plan", "pro")],
    ] {
        let a = apply(&r, &req(lines));
        assert_eq!(
            (a.limits.burst, a.by),
            (3, LimitsBy::AmbiguousTier),
            "{lines:?}"
        );
        assert_eq!(a.key, once.key, "the same bucket");
    }
    // One line with a comma is one value, which no tier names.
    assert_eq!(
        apply(&r, &req(&[("x-plan", "free,pro")])).by,
        LimitsBy::Rule
    );
}

/// An ambiguous key gets the rule's ambiguous bucket under the rule's limits: no tier there.
#[test]
fn an_ambiguous_key_gets_no_tier() {
    let r = rule_of(
        r#"{"rules":[{"name":"per-user","key":["header:x-user"],"rate":1,"burst":3,
            "tiers":{"from":"metadata:jwt:p.plan","limits":{"pro":{"rate":10,"burst":20}}}}]}"#,
    );
    let req = user("x", string("pro"))
        .line("x-user", "alice")
        .line("x-user", "bob");
    let a = apply(&r, &req);
    assert!(a.ambiguous);
    assert_eq!((a.limits.burst, a.by), (3, LimitsBy::Rule));
    let one = user("x", string("pro")).line("x-user", "alice");
    assert_eq!(apply(&r, &one).limits.burst, 20);
}

/// A trusted path source picks a tier only where every reading of the path agrees, as a path
/// override applies.
#[test]
fn a_path_tier_needs_every_reading_to_agree() {
    let r = rule_of(
        r#"{"rules":[{"name":"all","key":["header:x-user"],"rate":1,"burst":3,
            "tiers":{"from":"path","trusted":true,"limits":{"/bulk":{"rate":10,"burst":20}}}}]}"#,
    );
    let by = |p: &str| apply(&r, &Req::new("GET", p).with("x-user", "a")).by;
    assert_eq!(by("/bulk"), LimitsBy::Tier);
    assert_eq!(by("/bulk?x=1"), LimitsBy::Tier);
    assert_eq!(by("/other"), LimitsBy::Rule);
    for p in ["/x/..;/bulk", "//bulk", "/%62ulk", "/bulk;v=1"] {
        assert_eq!(by(p), LimitsBy::AmbiguousTier, "{p}");
    }
    // A rule that ignores the path's case picks the tier of a path in any case.
    let r = rule_of(
        r#"{"rules":[{"name":"all","key":["header:x-user"],"rate":1,"burst":3,
            "match":{"path_prefix":"/","path_ignore_case":true},
            "tiers":{"from":"path","trusted":true,"limits":{"/Bulk":{"rate":10,"burst":20}}}}]}"#,
    );
    let by = |p: &str| apply(&r, &Req::new("GET", p).with("x-user", "a")).by;
    for p in ["/bulk", "/BULK", "/Bulk"] {
        assert_eq!(by(p), LimitsBy::Tier, "{p}");
    }
}
