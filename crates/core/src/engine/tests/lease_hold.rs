//! Lease mode with `max_wait_ms`: a request that finds its proxy's reservation still refilling
//! waits for its token (when the reservation brings it within the wait) instead of a 429, and is
//! let through when that token has refilled: never before, so the fleet never admits ahead of the
//! bucket's refill. Without `max_wait_ms`, lease mode refuses it at once, as before.

use super::*;

/// The lease rule, holding requests up to 500 ms.
const HOLDING: &str = r#"{"name":"hot","key":["header:x-user"],"mode":"lease","rate":100,
    "burst":50,"lease_max":20,"max_wait_ms":500}"#;

#[test]
fn the_request_that_made_a_reservation_waits_for_it_instead_of_a_429() {
    let (mut e, rec) = engine("", HOLDING);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    // The bucket held nothing: the script reserved the token, refilled in 10 ms (100/s).
    deliver(&mut e, &mut h, 1, 200, &answer(true, 0, 10, 510, 1));
    assert_eq!(h.status_of(10), None, "held, not refused");
    assert!(h.resumed.is_empty(), "not before its token has refilled");
    assert_eq!(h.tick, 10);
    // The reservation's one token is taken: the next request is refused, with no second call.
    h.now = 1005;
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(h.status_of(11), Some(429));
    assert_eq!(
        h.sent.len(),
        1,
        "no second call while the reservation refills"
    );
    h.now = 1009;
    e.tick(&mut h);
    assert!(h.resumed.is_empty());
    h.now = 1010;
    e.tick(&mut h);
    assert_eq!(h.resumed, [10], "let through once refilled");
    assert_eq!(rec.get(0, Counter::Delayed), 1);
    assert_eq!(rec.get(0, Counter::DelayMs), 10);
}

#[test]
fn a_reservation_beyond_the_wait_is_refused_as_before() {
    let (mut e, _) = engine("", HOLDING);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    // Refilled only in 600 ms: longer than the rule lets a request wait.
    deliver(&mut e, &mut h, 1, 200, &answer(true, 0, 600, 1100, 1));
    assert_eq!(h.status_of(10), Some(429));
}

#[test]
fn requests_arriving_while_the_reservation_refills_take_its_tokens_in_turn() {
    let (mut e, _) = engine("", HOLDING);
    let mut h = Fake::default();
    // The proxy's pool holds three reserved tokens, refilled at 100/s: at 10, 20 and 30 ms.
    let three = crate::shared::lease::Grant {
        tokens: 3,
        global_remaining: 0,
        reset_after_ms: 530,
        refill_ms: 30,
    };
    deposit_at_0(&h, &e, three);
    for ctx in [10, 11, 12, 13] {
        assert_eq!(
            e.request_headers(&mut h, ctx.into(), &user("a")),
            Action::Pause
        );
    }
    assert_eq!(h.status_of(13), Some(429), "the reservation holds three");
    assert!(h.sent.is_empty(), "no call while the reservation refills");
    let mut released = Vec::new();
    for now in 0..=40 {
        h.now = now;
        e.tick(&mut h);
        for ctx in h.resumed.drain(..) {
            released.push((ctx, now));
        }
    }
    assert_eq!(
        released,
        [(10, 10), (11, 20), (12, 30)],
        "in order, each once its token has refilled"
    );
}

#[test]
fn held_requests_of_two_workers_are_let_through_no_faster_than_the_bucket_refills() {
    // 20 tokens: 5 the bucket held, 15 it refills at 100/s over the next 150 ms.
    let (mut w1, mut w2) = (engine("", HOLDING).0, engine("", HOLDING).0);
    let mut h = Fake::default();
    deposit_at_0(
        &h,
        &w1,
        crate::shared::lease::Grant {
            tokens: 20,
            global_remaining: 0,
            reset_after_ms: 650,
            refill_ms: 150,
        },
    );
    let (mut admitted, mut ctx) = (0u64, 100u32);
    for now in 0..=200 {
        h.now = now;
        for w in [&mut w1, &mut w2] {
            w.tick(&mut h);
            admitted += h.resumed.drain(..).count() as u64;
            ctx += 1;
            if w.request_headers(&mut h, ctx.into(), &user("a")) == Action::Continue {
                admitted += 1;
            }
        }
        assert!(
            admitted <= 5 + now / 10,
            "{admitted} let through by {now} ms: ahead of the refill"
        );
    }
    assert_eq!(admitted, 20, "all of it once refilled");
}
