//! Tiers through the engine: each check carries its tier's limits to the script (exact and lease
//! mode) and into its policy header, on the key's one bucket; a tier value that is not one value
//! is checked under the rule's limits and counted in `ambiguous`; the fallback bucket follows the
//! tier as it follows an override.

use super::*;

/// Keyed on `x-user`, the tier from the query parameter `plan` (trusted here: the engine tests'
/// requests carry headers and a path only).
const TIERS: &str = r#"{"name":"per-user","key":["header:x-user"],"rate":10,"burst":3,
    "tiers":{"from":"query:plan","trusted":true,"limits":{
      "pro":{"rate":100,"burst":20},"internal":{"unlimited":true}}}}"#;

/// The key, burst, rate and period_ms of a script call's body
/// (`EVALSHA/<sha>/1/<key>/<burst>/<rate>/<period_ms>/…`).
fn sent(body: &str) -> (&str, u64, u64, u64) {
    let segs: Vec<&str> = body.split('/').collect();
    let n = |i: usize| segs[i].parse::<u64>().unwrap();
    (segs[3], n(4), n(5), n(6))
}

fn plan_req(u: &str, query: &str) -> Req {
    req(&format!("/api/x{query}"), &[("x-user", u)])
}

#[test]
fn each_check_carries_its_tier_s_limits_on_the_key_s_one_bucket() {
    let (mut e, rec) = engine("", TIERS);
    let mut h = Fake::default();
    let mut keys = Vec::new();
    for (ctx, query, limits, policy) in [
        (10, "?plan=pro", (20, 100, 1000), "\"per-user\";q=20;w=1"),
        (11, "?plan=free", (3, 10, 1000), "\"per-user\";q=3;w=1"),
        (12, "", (3, 10, 1000), "\"per-user\";q=3;w=1"),
        // Named twice: no tier, whatever the values.
        (
            13,
            "?plan=pro&plan=pro",
            (3, 10, 1000),
            "\"per-user\";q=3;w=1",
        ),
    ] {
        assert_eq!(
            send(&mut e, &mut h, ctx, &plan_req("a", query)),
            Action::Pause
        );
        let t = *h.tokens().last().unwrap();
        let (key, burst, rate, period) = sent(&h.out[&t].body);
        assert_eq!((burst, rate, period), limits, "{query}");
        keys.push(key.to_string());
        deliver(&mut e, &mut h, t, 200, &answer(true, 2, 0, 100, 1));
        e.response_headers(&mut h, ctx.into(), &resp(&[]));
        let added = &h.added.last().unwrap().1;
        assert_eq!(header(added, "ratelimit-policy"), Some(policy), "{query}");
        e.done(&mut h, ctx.into());
    }
    assert!(keys.iter().all(|k| *k == keys[0]), "one bucket: {keys:?}");
    assert_eq!(rec.get(0, Counter::Ambiguous), 1, "the repeated plan");
    assert_eq!(rec.get(0, Counter::Allowed), 4);
    // An unlimited tier: admitted without a call, still counted.
    let calls = h.sent.len();
    assert_eq!(
        send(&mut e, &mut h, 14, &plan_req("a", "?plan=internal")),
        Action::Continue
    );
    assert_eq!(h.sent.len(), calls);
    assert_eq!(rec.get(0, Counter::Allowed), 5);
}

#[test]
fn a_lease_call_asks_under_the_tier_s_limits() {
    let rules = TIERS.replace(r#""rate":10,"#, r#""rate":10,"mode":"lease","#);
    let (mut e, _) = engine("", &rules);
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &plan_req("a", "?plan=pro"));
    let [t] = h.tokens()[..] else { panic!() };
    assert_eq!(sent(&h.out[&t].body).1, 20);
    grant_all(&mut e, &mut h, t);
    send(&mut e, &mut h, 11, &plan_req("b", ""));
    let t = *h.tokens().last().unwrap();
    assert_eq!(sent(&h.out[&t].body).1, 3);
}

/// With `failure_mode: local` and no `fallback`, a check falls back to a per-proxy bucket with its
/// own limits: the tier's, as an override's.
#[test]
fn the_fallback_bucket_has_the_tier_s_limits() {
    let admitted = |query: &str| {
        let (mut e, _) = engine("", TIERS);
        let mut h = Fake {
            fail_dispatch: true,
            ..Fake::default()
        };
        (10..40u32)
            .filter(|&ctx| {
                let a = send(&mut e, &mut h, ctx, &plan_req("a", query));
                e.done(&mut h, ctx.into());
                a == Action::Continue
            })
            .count()
    };
    assert_eq!(admitted("?plan=pro"), 20);
    assert_eq!(admitted("?plan=free"), 3);
}

/// A cost header is measured against the tier's burst: within `pro`'s 20 it is checked, above the
/// rule's 3 (a request of no tier) it can never be admitted and is answered 400.
#[test]
fn a_cost_header_is_measured_against_the_tier_s_burst() {
    let rules = TIERS.replace(r#""burst":3,"#, r#""burst":3,"cost_header":"x-cost","#);
    let (mut e, _) = engine("", &rules);
    let mut h = Fake::default();
    let costly = |query: &str| {
        req(
            &format!("/api/x{query}"),
            &[("x-user", "a"), ("x-cost", "10")],
        )
    };
    assert_eq!(
        send(&mut e, &mut h, 10, &costly("?plan=pro")),
        Action::Pause
    );
    let t = *h.tokens().last().unwrap();
    assert!(
        h.out[&t].body.ends_with("/20/100/1000/10/0/0/0"),
        "{}",
        h.out[&t].body
    );
    send(&mut e, &mut h, 11, &costly("?plan=free"));
    assert_eq!(h.status_of(11), Some(400));
    assert_eq!(
        h.sent.len(),
        1,
        "no call for a cost that can never be admitted"
    );
}

/// A shadow rule with tiers checks under the tier's limits and only counts its denials.
#[test]
fn a_shadow_rule_checks_under_the_tier_and_never_refuses() {
    let rules = TIERS.replace(r#""burst":3,"#, r#""burst":3,"shadow":true,"#);
    let (mut e, rec) = engine("", &rules);
    let mut h = Fake::default();
    assert_eq!(
        send(&mut e, &mut h, 10, &plan_req("a", "?plan=pro")),
        Action::Pause
    );
    let t = *h.tokens().last().unwrap();
    assert_eq!(sent(&h.out[&t].body).1, 20);
    deliver(&mut e, &mut h, t, 200, &answer(false, 0, 500, 1000, 0));
    assert_eq!(h.resumed, [10], "a shadow denial lets the request through");
    assert_eq!(rec.get(0, Counter::ShadowDenied), 1);
    assert_eq!(rec.get(0, Counter::Denied), 0);
}

/// Usage keyed by user, with a `pro` tier whose burst is far above the rule's.
const TIERED_USAGE: &str = r#"{"name":"llm","key":["header:x-user"],"rate":10,"burst":3,
    "usage":{"header":"x-usage-tokens","flush_ms":100},
    "tiers":{"from":"query:plan","trusted":true,"limits":{"pro":{"rate":100,"burst":200}}}}"#;

/// Admits request `ctx` of user `a` under `query`'s tier: the settlement its call carried, which
/// must be one the script takes under that call's burst (at most 4 bursts: Redis refuses more,
/// and the request would get the failure mode).
fn admit_tiered(e: &mut Engine, h: &mut Fake, ctx: u32, query: &str) -> i64 {
    assert_eq!(send(e, h, ctx, &plan_req("a", query)), Action::Pause);
    let t = *h.tokens().last().unwrap();
    let body = h.out[&t].body.clone();
    let carried = settle_arg(&body);
    let burst = sent(&body).1;
    assert!(
        carried.unsigned_abs() <= 4 * burst,
        "a call under burst {burst} carries {carried}: the script refuses it"
    );
    deliver(e, h, t, 200, &answer(true, 2, 0, 100, 1));
    carried
}

/// Runs the flushes due until none is left, answering each: what they carried.
fn flush_all(e: &mut Engine, h: &mut Fake) -> i64 {
    let mut carried = 0;
    for _ in 0..100 {
        let Some(due) = e.usage.next_flush() else {
            break;
        };
        h.now = h.now.max(due);
        e.tick(h);
        for t in h.tokens() {
            let body = h.out[&t].body.clone();
            let s = settle_arg(&body);
            let burst = sent(&body).1;
            assert!(
                s.unsigned_abs() <= 4 * burst,
                "a flush under burst {burst} carries {s}"
            );
            carried += s;
            deliver(e, h, t, 200, &answer(true, 2, 0, 100, 0));
        }
    }
    carried
}

/// A `pro` request's charge rides on the key's next call, which may be a `free` request's: that
/// call carries at most 4 of its own bursts and the rest stays pending for the calls and flushes
/// after it. Nothing is lost, and nothing is sent that Redis would refuse.
#[test]
fn a_charge_settled_under_a_bigger_tier_reaches_the_bucket_whole_through_smaller_calls() {
    let (mut e, _) = engine("", TIERED_USAGE);
    let mut h = Fake::default();
    admit_tiered(&mut e, &mut h, 10, "?plan=pro");
    e.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "700")]));
    e.done(&mut h, 10.into());
    let mut carried = 0;
    for ctx in 11..15u32 {
        carried += admit_tiered(&mut e, &mut h, ctx, "");
        e.response_headers(&mut h, ctx.into(), &resp(&[("x-usage-tokens", "1")]));
        e.done(&mut h, ctx.into());
    }
    carried += flush_all(&mut e, &mut h);
    assert_eq!(carried, 699, "the pro request's whole charge");
}

/// Two requests of one key in flight under different tiers: the `free` one's settlement, added
/// after the `pro` one's, does not cut the key's pending charge to 4 `free` bursts.
#[test]
fn a_smaller_tier_s_settlement_never_cuts_a_bigger_one_s_pending_charge() {
    let (mut e, _) = engine("", TIERED_USAGE);
    let mut h = Fake::default();
    admit_tiered(&mut e, &mut h, 10, "?plan=pro");
    admit_tiered(&mut e, &mut h, 11, "");
    e.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "700")]));
    e.done(&mut h, 10.into());
    e.response_headers(&mut h, 11.into(), &resp(&[("x-usage-tokens", "2")]));
    e.done(&mut h, 11.into());
    assert_eq!(flush_all(&mut e, &mut h), 699 + 1, "both charges, whole");
}

/// With `failure_mode: local` and no `fallback`, an overridden key and another key of the rule may
/// share a fallback slot: the other key gets no more than its own limits allow, however often the
/// overridden key with its faster refill takes from the slot.
#[test]
fn a_key_sharing_a_fallback_slot_with_an_overridden_one_keeps_its_own_limits() {
    let rule = r#"{"name":"per-user","key":["header:x-user"],"rate":1,"burst":2,
        "overrides":[{"key":["vip"],"rate":100,"burst":100}]}"#;
    let (mut e, _) = engine("", rule);
    let mut h = Fake {
        fail_dispatch: true,
        ..Fake::default()
    };
    let config = &e.plugin.config;
    let key_of = |u: &str| {
        crate::rule::applies(
            &config.key_prefix,
            (0, &config.rules[0]),
            &user(u),
            &mut crate::rule::KeyCache::default(),
        )
        .unwrap()
        .key
    };
    let slot = |u: &str| crate::shared::hash(&key_of(u)) % crate::shared::fallback::SLOTS;
    let other = (0..)
        .map(|i| format!("u{i}"))
        .find(|u| slot(u) == slot("vip"))
        .unwrap();
    let mut ctx = 10u32;
    let mut admitted = 0;
    for step in 0..10 {
        h.now = 1000 + step * 100;
        // The overridden key, far under its limits: a request every 100 ms.
        ctx += 1;
        send(&mut e, &mut h, ctx, &user("vip"));
        e.done(&mut h, ctx.into());
        for _ in 0..5 {
            ctx += 1;
            if send(&mut e, &mut h, ctx, &user(&other)) == Action::Continue {
                admitted += 1;
            }
            e.done(&mut h, ctx.into());
        }
    }
    // In 900 ms a fallback bucket of its own (burst 2, 1/s) admits at most 3.
    assert!(
        admitted <= 3,
        "{other}: {admitted} admitted by its fallback in 900 ms, its own limits allow 3"
    );
}
