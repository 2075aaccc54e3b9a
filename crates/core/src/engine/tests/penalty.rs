//! A penalty rule on the fake host: every call carries the penalty, the script's box denial is
//! cached for every cost until the box ends and answered without a call, with a Retry-After of
//! the box's time; the counters say which denials were the box's.

use super::*;

const BOXED: &str = r#"{"name":"login","key":["header:x-user"],"rate":10,"burst":2,
    "cost_header":"x-cost","penalty":{"ms":[120000,300000],"window_ms":3600000}}"#;

/// Webdis' answer to a penalty call: the five integers and the 6th, `penalized`.
fn answer6(allowed: bool, retry: i64, penalized: u8) -> Vec<u8> {
    format!(
        r#"{{"EVALSHA":[{},0,{retry},100,{},{penalized}]}}"#,
        u8::from(allowed),
        u8::from(allowed)
    )
    .into_bytes()
}

#[test]
fn every_call_carries_the_penalty_after_the_clock() {
    let (mut e, _) = engine("", BOXED);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    assert!(
        h.sent[0].ends_with("/0/0/time/3600000%3A120000%3A300000"),
        "{}",
        h.sent[0]
    );
}

#[test]
fn the_deny_cache_answers_a_boxed_key_for_every_cost_until_the_box_ends() {
    let (mut e, rec) = engine("", BOXED);
    let mut h = Fake::at(1000);
    // The offence: the bucket denied, and the script boxed the key for 120 s.
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer6(false, 120_000, 1));
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(
        header(&h.responded[0].1.headers, "retry-after"),
        Some("120")
    );
    assert_eq!(rec.get(0, Counter::PenaltyOffences), 1);
    assert_eq!(
        rec.get(0, Counter::Penalized),
        0,
        "the offence is not a boxed denial"
    );
    // Long after the bucket has refilled, any cost is refused without a call until the box ends.
    h.now = 100_000;
    let costly = req("/api/x", &[("x-user", "a"), ("x-cost", "1")]);
    send(&mut e, &mut h, 11, &costly);
    assert_eq!(h.status_of(11), Some(429));
    assert_eq!(h.sent.len(), 1, "answered from the deny cache");
    assert_eq!(header(&h.responded[1].1.headers, "retry-after"), Some("21"));
    assert_eq!(rec.get(0, Counter::LocalDenied), 1);
    assert_eq!(rec.get(0, Counter::Penalized), 1);
    // Another user is not boxed.
    e.request_headers(&mut h, 12.into(), &user("b"));
    assert_eq!(h.sent.len(), 2);
    // The box ended: Redis decides again.
    h.now = 121_000;
    e.request_headers(&mut h, 13.into(), &user("a"));
    assert_eq!(h.sent.len(), 3, "the box ended: asks Redis again");
}

#[test]
fn a_boxed_denial_from_redis_counts_as_penalized() {
    let (mut e, rec) = engine("", BOXED);
    let mut h = Fake::at(1000);
    // Another proxy boxed the key: this one learns it from Redis (2: already boxed).
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer6(false, 250_000, 2));
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(
        header(&h.responded[0].1.headers, "retry-after"),
        Some("250")
    );
    assert_eq!(rec.get(0, Counter::Penalized), 1);
    assert_eq!(rec.get(0, Counter::PenaltyOffences), 0);
    h.now = 250_999;
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(h.sent.len(), 1, "answered from the deny cache");
    assert_eq!(rec.get(0, Counter::Penalized), 2);
}

#[test]
fn a_bucket_denial_without_the_box_caches_only_its_cost() {
    let (mut e, rec) = engine("", BOXED);
    let mut h = Fake::at(1000);
    let two = req("/api/x", &[("x-user", "a"), ("x-cost", "2")]);
    send(&mut e, &mut h, 10, &two);
    deliver(&mut e, &mut h, 1, 200, &answer6(false, 100, 0));
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(rec.get(0, Counter::Penalized), 0);
    // A smaller cost may fit: it asks Redis.
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(h.sent.len(), 2);
}

#[test]
fn a_hot_penalty_key_is_never_shared_by_one_call() {
    let (mut e, _) = engine("", BOXED);
    let mut h = Fake::default();
    for ctx in 10..14 {
        e.request_headers(&mut h, ctx.into(), &user("a"));
    }
    // Each check sent its own call: a shared call that grants fewer than asked is an admission
    // in the script, so it could never box the key.
    assert_eq!(h.sent.len(), 4);
}

#[test]
fn a_shadow_penalty_rule_counts_and_never_denies() {
    let shadow = BOXED.replace(r#""rate":10"#, r#""rate":10,"shadow":true"#);
    let (mut e, rec) = engine("", &shadow);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer6(false, 120_000, 1));
    assert_eq!(h.resumed, [10]);
    // The deny cache knows the box: the shadow rule lets the request go on at once, no call.
    let go_on = e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(go_on, Action::Continue);
    assert_eq!(h.status_of(11), None);
    assert_eq!(h.sent.len(), 1);
    assert_eq!(rec.get(0, Counter::PenaltyOffences), 1);
    assert_eq!(rec.get(0, Counter::Penalized), 1);
    assert_eq!(rec.get(0, Counter::ShadowDenied), 2);
}

/// A front that answers a call without a penalty with a 6th integer claiming the box (a hostile
/// or confused Webdis): the reply is not the script's answer to that call (the script adds the
/// 6th only for ARGV[9]), so it boxes nothing: no entry refusing every cost, no penalty counter
/// on a rule that has no penalty.
#[test]
fn a_box_claimed_for_a_call_without_a_penalty_is_malformed() {
    let plain = BOXED.replace(
        r#","penalty":{"ms":[120000,300000],"window_ms":3600000}"#,
        "",
    );
    let (mut e, rec) = engine("", &plain);
    let mut h = Fake::at(1000);
    let five = req("/api/x", &[("x-user", "a"), ("x-cost", "2")]);
    send(&mut e, &mut h, 10, &five);
    assert!(
        !h.sent[0].contains("time"),
        "no penalty sent: {}",
        h.sent[0]
    );
    deliver(&mut e, &mut h, 1, 200, &answer6(false, 120_000, 1));
    assert_eq!(rec.get(0, Counter::PenaltyOffences), 0);
    assert_eq!(rec.get(0, Counter::Penalized), 0);
    // A cost of 1 is not refused from a box this rule cannot have: it asks Redis.
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(
        h.sent.len(),
        2,
        "refused from a box the call never asked for"
    );
}

/// A boxed client cannot get a request through by the cost it asks for: a cost of 0, a cost
/// that is not a number, one above the burst (never admissible, so never an offence) are refused
/// locally (400), and a cost of 1 by the box, all without a call and never forwarded.
#[test]
fn no_cost_header_gets_a_boxed_key_through() {
    let (mut e, _) = engine("", BOXED);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer6(false, 120_000, 1));
    assert_eq!(h.status_of(10), Some(429));
    h.now = 60_000;
    for (ctx, cost, status) in [
        (11, "0", 400),
        (12, "-1", 400),
        (13, "3", 400),
        (14, "1", 429),
    ] {
        let r = req("/api/x", &[("x-user", "a"), ("x-cost", cost)]);
        let action = send(&mut e, &mut h, ctx, &r);
        assert_ne!(action, Action::Continue, "cost {cost} went through");
        assert_eq!(h.status_of(ctx), Some(status), "cost {cost}");
    }
    assert_eq!(h.sent.len(), 1, "no call for any of them");
    assert!(h.resumed.is_empty(), "nothing forwarded: {:?}", h.resumed);
}

/// The bucket key of rule `idx` for request `r`.
fn key_of(e: &Engine, idx: usize, r: &Req) -> String {
    crate::rule::applies(
        &e.plugin.config.key_prefix,
        (idx, &e.plugin.config.rules[idx]),
        r,
        &mut crate::rule::KeyCache::default(),
    )
    .unwrap()
    .key
}

/// A value of `x-key` whose bucket under rule 1 lands in the deny cache's slot of `target`
/// (the slot is an FNV hash of the bucket key: anyone who knows the configuration can find one
/// offline in a few thousand tries).
fn colliding_key(e: &Engine, target: &str) -> String {
    use crate::shared::{deny::SLOTS, hash};
    let slot = hash(target) % SLOTS;
    (0..1_000_000)
        .map(|i| format!("k{i}"))
        .find(|v| {
            let k = key_of(e, 1, &req("/other", &[("x-key", v)]));
            hash(&k) % SLOTS == slot
        })
        .unwrap()
}

/// "A proxy that learns of the box keeps it in its deny cache until the box ends", and "while
/// Redis cannot answer, a proxy still refuses the keys its deny cache knows are boxed". The deny
/// cache is direct-mapped and shared by every rule: another key's denial in the same slot (any
/// rule's, here one the client keys itself) used to overwrite the box, and once Redis was away
/// the boxed client was admitted by the fallback bucket, which has no penalty. A box learned
/// stays until it ends: another key's entry never replaces it.
#[test]
fn another_key_s_denial_never_evicts_a_box_from_the_deny_cache() {
    let rules = format!(r#"{BOXED}, {{"name":"api","key":["header:x-key"],"rate":1,"burst":1}}"#);
    let (mut e, _) = engine("", &rules);
    let mut h = Fake::at(1000);
    // The offence: user a is boxed for 120 s.
    e.request_headers(&mut h, 10.into(), &user("a"));
    let t = *h.tokens().last().unwrap();
    deliver(&mut e, &mut h, t, 200, &answer6(false, 120_000, 1));
    assert_eq!(h.status_of(10), Some(429));
    // The same client spends a key of its own choosing under another rule until Redis denies it:
    // that denial is cached in the box's slot.
    let boxed = key_of(&e, 0, &user("a"));
    let other = colliding_key(&e, &boxed);
    let flood = req("/other", &[("x-key", &other)]);
    send(&mut e, &mut h, 11, &flood);
    let t = *h.tokens().last().unwrap();
    deliver(&mut e, &mut h, t, 200, &answer(false, 0, 1000, 1000, 0));
    assert_eq!(h.status_of(11), Some(429));
    // Redis goes away. Still boxed: user a must be refused, by the deny cache, without a call.
    h.now = 5000;
    let calls = h.sent.len();
    send(&mut e, &mut h, 12, &user("a"));
    if h.sent.len() > calls {
        let t = *h.tokens().last().unwrap();
        deliver(&mut e, &mut h, t, 0, b"");
    }
    assert_eq!(
        h.status_of(12),
        Some(429),
        "the boxed client got through the fallback (resumed: {:?})",
        h.resumed
    );
    assert_eq!(h.sent.len(), calls, "the box was forgotten: asked Redis");
}

/// A rule whose penalty is removed (a new configuration, the same rule name, so the same bucket
/// keys) lets its boxed keys in at once, as its calls without the penalty ignore the box in Redis:
/// the box a proxy cached under the old configuration refuses no request of the new one.
#[test]
fn a_box_in_the_deny_cache_refuses_nothing_once_the_penalty_is_removed() {
    let (mut e, _) = engine("", BOXED);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer6(false, 120_000, 1));
    assert_eq!(h.status_of(10), Some(429), "boxed");
    let unboxed = BOXED.replace(
        r#","penalty":{"ms":[120000,300000],"window_ms":3600000}"#,
        "",
    );
    let (mut next, _) = engine("", &unboxed);
    let mut h2 = Fake::sharing(h.store.clone());
    h2.now = 2000;
    next.request_headers(&mut h2, 11.into(), &user("a"));
    assert_eq!(
        h2.sent.len(),
        1,
        "the key goes to Redis, which ignores the box"
    );
    deliver(&mut next, &mut h2, 1, 200, &answer(true, 1, 0, 100, 1));
    assert_eq!(h2.resumed, [11]);
}

/// A lease rule's denial reaches its waiters only through the deny cache: the call's answer is
/// remembered there, and the waiters are served from the pool and the cache. Another key's box in
/// the same slot keeps the slot (it must), so the denial was never cached: the waiters, neither
/// served nor denied, started another lease call, and another, each denied, until their patience
/// ran out and the failure mode (the fallback bucket, full for a key it never saw) let them
/// through. A client that boxes a key of its own choosing in its lease key's slot (a few thousand
/// tries offline) so got past the global bucket while Redis answered every call.
#[test]
fn a_lease_denial_reaches_its_waiters_when_another_keys_box_holds_the_deny_slot() {
    let rules = format!(
        r#"{}, {{"name":"login","key":["header:x-key"],"rate":10,"burst":2,
            "penalty":{{"ms":[120000,300000],"window_ms":3600000}}}}"#,
        super::LEASE
    );
    let (mut e, _) = engine("", &rules);
    let mut h = Fake::at(1000);
    // The client boxes a key of its own under the penalty rule, in its lease key's deny slot.
    let leased = key_of(&e, 0, &user("a"));
    let other = colliding_key(&e, &leased);
    send(&mut e, &mut h, 10, &req("/other", &[("x-key", &other)]));
    let t = *h.tokens().last().unwrap();
    deliver(&mut e, &mut h, t, 200, &answer6(false, 120_000, 1));
    assert_eq!(h.status_of(10), Some(429));
    // Its lease key is spent: Redis denies even a reservation, every time it is asked.
    send(&mut e, &mut h, 20, &user("a"));
    let mut calls = 0;
    while let Some(&t) = h.tokens().last() {
        calls += 1;
        if calls > 20 {
            break;
        }
        deliver(&mut e, &mut h, t, 200, &answer(false, 0, 300, 5000, 0));
    }
    for now in [1100, 1200, 1500, 3000, 10_000] {
        h.now = now;
        e.tick(&mut h);
    }
    assert!(
        h.resumed.is_empty(),
        "admitted past a denial: {:?}",
        h.resumed
    );
    assert_eq!(h.status_of(20), Some(429));
    assert_eq!(calls, 1, "one lease call, denied, for the request");
}
