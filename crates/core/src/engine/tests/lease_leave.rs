//! Lease waiters that leave their key's queue before they are served: their client reset the
//! stream, or another rule decided their request. Each leaves in a step (its entry stays, gone,
//! until the queue is compacted), and from then on it is as if it had never waited: never served,
//! never counted in what the key's next call asks for.

use super::*;

#[test]
fn waiters_that_all_leave_a_keys_queue_cost_a_step_each() {
    let (mut e, _) = engine("", LEASE);
    let mut h = Fake::default();
    // A lease call out for key a, never answered while 20,000 more streams wait on the key and
    // then reset, oldest first.
    e.request_headers(&mut h, 10.into(), &user("a"));
    let n = 20_000u32;
    for ctx in 11..11 + n {
        e.request_headers(&mut h, ctx.into(), &user("a"));
    }
    assert_eq!(e.load().2, 1 + n as usize);
    for ctx in 11..11 + n {
        e.done(&mut h, ctx.into());
    }
    let (scanned, kept) = e.waits.work();
    assert!(
        scanned < 2 * n as usize,
        "{scanned} queue entries looked through for {n} waiters leaving"
    );
    assert!(kept <= 2 + 64, "{kept} kept for one waiter");
    let deadlines = e.waits.deadlines();
    assert!(deadlines <= 2 + 64, "{deadlines} patience deadlines kept");
    assert_eq!(e.load().2, 1, "10 still waits");
    deliver(&mut e, &mut h, 1, 200, &answer(true, 40, 0, 300, 1));
    assert_eq!(h.resumed, [10]);
    assert_eq!(h.sent.len(), 1, "no call for the gone");
    assert_eq!(e.load().2, 0);
}

#[test]
fn streams_reset_behind_a_keys_lease_call_do_not_grow_its_queue() {
    let (mut e, mut h) = streams_reset_behind_a_call_out(LEASE);
    let (scanned, kept) = e.waits.work();
    // Two waiters (10, 11): twice them plus 64.
    assert!(kept <= 4 + 64, "{kept} kept");
    assert!(scanned < 2 * 100_000, "{scanned} looked through");
    let deadlines = e.waits.deadlines();
    assert!(deadlines <= 4 + 64, "{deadlines} patience deadlines kept");
    // The two still waiting are served, by this call and the next.
    deliver(&mut e, &mut h, 1, 200, &answer(true, 40, 0, 300, 1));
    assert_eq!(h.resumed, [10]);
    grant_all(&mut e, &mut h, 2);
    assert_eq!(h.resumed, [10, 11]);
    assert_eq!(e.load().2, 0);
}

/// Key a's second lease call (for 11) out, with `waiting` queued behind it and `leaving` of them
/// reset; that call is answered with all it asked for. What it asked for, who was let through,
/// the tokens left in the pool, and what the call after it (for those still waiting) asks for.
fn served_behind_a_call(waiting: &[u32], leaving: &[u32]) -> (u64, Vec<u32>, u64, Option<u64>) {
    let (mut e, _) = engine("", LEASE);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    e.request_headers(&mut h, 11.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 40, 0, 300, 1));
    assert_eq!(h.sent.len(), 2, "the call for 11 is out");
    for &ctx in waiting {
        e.request_headers(&mut h, ctx.into(), &user("a"));
    }
    for &ctx in leaving {
        e.done(&mut h, ctx.into());
    }
    let asked = grant_all(&mut e, &mut h, 2);
    let pool = LeasePool::new(&*h.store, &e.plugin.ns);
    let left = pool.peek(&lease_key(&e, "a")).map_or(0, |l| l.tokens);
    let next = h.out.contains_key(&3).then(|| asked_of(&h, 3));
    (asked, h.resumed.clone(), left, next)
}

fn asked_of(h: &Fake, token: u32) -> u64 {
    asked(h, token)
}

#[test]
fn a_waiter_that_left_is_neither_served_nor_asked_for() {
    let left_behind = served_behind_a_call(&[12, 13, 14, 15, 16, 17, 18, 19], &[12, 14, 15, 18]);
    let never_came = served_behind_a_call(&[13, 16, 17, 19], &[]);
    assert_eq!(left_behind, never_came);
}

#[test]
fn a_waiter_whose_request_another_rule_decided_leaves_the_queue() {
    // The exact rule checks each user; the lease rule (the request's second check) their tenant.
    let tenant = r#"{"name":"tenant","key":["header:x-tenant"],"mode":"lease","rate":100,
        "burst":50,"lease_max":20}"#;
    let (mut e, _) = engine("", &format!("{EXACT}, {tenant}"));
    let mut h = Fake::default();
    let of = |u: &str| req("/api/x", &[("x-user", u), ("x-tenant", "t")]);
    for (ctx, u) in [(10, "u0"), (11, "u1"), (12, "u2")] {
        e.request_headers(&mut h, ctx.into(), &of(u));
    }
    assert_eq!(e.load().2, 3, "all three wait for the tenant's lease call");
    // User u1's exact call says no: request 11 is refused, and stops waiting for the lease.
    let config = &e.plugin.config;
    let key = crate::rule::applies(
        &config.key_prefix,
        (0, &config.rules[0]),
        &of("u1"),
        &mut crate::rule::KeyCache::default(),
    )
    .unwrap()
    .key;
    let mut encoded = Vec::new();
    crate::backend::webdis::encode_segment(key.as_bytes(), &mut encoded);
    let encoded = String::from_utf8(encoded).unwrap();
    let u1 = h
        .tokens()
        .into_iter()
        .find(|t| h.out[t].body.contains(&encoded))
        .unwrap();
    deliver(&mut e, &mut h, u1, 200, &answer(false, 0, 100, 2000, 0));
    assert_eq!(h.status_of(11), Some(429));
    assert_eq!(e.load().2, 2, "10 and 12 still wait");
}
