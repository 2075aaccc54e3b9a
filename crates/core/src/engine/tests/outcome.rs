//! `charge_on`: an admission keeps its up-front cost when its answer's status is in the rule's
//! set, and gets it back otherwise; an answer that never comes is charged; nothing that was not
//! admitted by the global bucket settles.

use super::*;

/// Logins keyed by user, 5 at once, 5 a minute; only 401 and 403 answers keep their token.
const LOGIN: &str = r#"{"name":"login","key":["header:x-user"],"rate":5,"period_ms":60000,
    "burst":5,"cost_header":"x-cost","charge_on":{"status":[401,403],"flush_ms":20}}"#;

/// Request `ctx` of `r`, admitted by Redis (its up-front cost taken); the settlement it carried.
fn admit(e: &mut Engine, h: &mut Fake, ctx: u32, r: &Req) -> i64 {
    assert_eq!(send(e, h, ctx, r), Action::Pause);
    let token = *h.tokens().last().unwrap();
    let carried = settle_arg(&h.out[&token].body);
    deliver(e, h, token, 200, &answer(true, 4, 0, 12_000, 1));
    assert!(h.resumed.contains(&ctx));
    carried
}

/// The response of `ctx` with `status`, then its end.
fn answered(e: &mut Engine, h: &mut Fake, ctx: u32, status: &str) {
    let wants_body = e.response_headers(h, ctx.into(), &resp(&[(":status", status)]));
    assert_eq!(wants_body, None, "a status needs no body");
    e.done(h, ctx.into());
}

#[test]
fn a_matching_status_keeps_the_cost_and_no_settlement_is_sent() {
    let (mut e, rec) = engine("", LOGIN);
    let mut h = Fake::default();
    admit(&mut e, &mut h, 10, &user("ada"));
    answered(&mut e, &mut h, 10, "401");
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0);
    assert_eq!(
        rec.get(0, Counter::UsageCharged),
        0,
        "nothing beyond the cost"
    );
    assert_eq!(rec.get(0, Counter::UsageWorstCase), 0);
    assert_eq!(h.tick, 0, "nothing pending: no flush");
    assert_eq!(
        admit(&mut e, &mut h, 11, &user("ada")),
        0,
        "nothing carried"
    );
    answered(&mut e, &mut h, 11, "403");
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0);
    assert_eq!(e.load().0, 0, "every request forgotten");
}

#[test]
fn another_status_refunds_the_whole_cost_on_the_next_call_or_the_flush() {
    let (mut e, rec) = engine("", LOGIN);
    let mut h = Fake::default();
    admit(&mut e, &mut h, 10, &user("ada"));
    answered(&mut e, &mut h, 10, "200");
    assert_eq!(rec.get(0, Counter::UsageRefunded), 1);
    // The refund rides on the key's next call, which Redis applies before it takes.
    assert_eq!(admit(&mut e, &mut h, 11, &user("ada")), -1);
    // A cost raised by the cost header is refunded whole.
    admit(
        &mut e,
        &mut h,
        12,
        &req("/api/x", &[("x-user", "ada"), ("x-cost", "3")]),
    );
    answered(&mut e, &mut h, 11, "302");
    answered(&mut e, &mut h, 12, "204");
    assert_eq!(rec.get(0, Counter::UsageRefunded), 1 + 1 + 3);
    // With no next call, the rule's flush_ms sends it: a settle-only call.
    assert_eq!(h.tick, 20, "the charge_on flush_ms");
    h.now = 20;
    e.tick(&mut h);
    let flush = h.sent.last().unwrap();
    assert!(
        flush.ends_with(&format!("/0/0/0/0%3A4%3A{EPOCH}%3A{MARK}")),
        "settle only, cost 0, the refund with its take's epoch: {flush}"
    );
}

#[test]
fn an_answer_that_never_comes_is_charged() {
    let (mut e, rec) = engine("", LOGIN);
    let mut h = Fake::default();
    // The client hangs up (or the stream is reset) before the response headers.
    admit(
        &mut e,
        &mut h,
        10,
        &req("/api/x", &[("x-user", "ada"), ("x-cost", "2")]),
    );
    e.done(&mut h, 10.into());
    assert_eq!(rec.get(0, Counter::UsageUnfinished), 1);
    assert_eq!(rec.get(0, Counter::UsageWorstCase), 1);
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0, "never a refund");
    assert_eq!(
        rec.get(0, Counter::UsageCharged),
        0,
        "the up-front cost, no more"
    );
    assert_eq!(
        admit(&mut e, &mut h, 11, &user("ada")),
        0,
        "nothing carried"
    );
    // A response without a status (never from Envoy) is charged too.
    assert_eq!(
        e.response_headers(&mut h, 11.into(), &resp(&[("x-other", "1")])),
        None
    );
    e.done(&mut h, 11.into());
    assert_eq!(rec.get(0, Counter::UsageMissing), 1);
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0);
    assert_eq!(e.load().0, 0);
}

#[test]
fn classes_hold_envoy_s_own_replies() {
    let rule = r#"{"name":"upstream","key":["header:x-user"],"rate":5,"burst":5,
        "charge_on":{"status":["5xx"]}}"#;
    let (mut e, rec) = engine("", rule);
    let mut h = Fake::default();
    // Envoy's local reply when no upstream is healthy, and its timeout: kept.
    for (ctx, status) in [(10, "503"), (11, "504"), (12, "500")] {
        admit(&mut e, &mut h, ctx, &user("ada"));
        answered(&mut e, &mut h, ctx, status);
    }
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0);
    for (ctx, status) in [(13, "200"), (14, "429"), (15, "404")] {
        admit(&mut e, &mut h, ctx, &user("ada"));
        answered(&mut e, &mut h, ctx, status);
    }
    assert_eq!(rec.get(0, Counter::UsageRefunded), 3);
}

/// Only admissions the global bucket made settle: a request it refused, or one a shadow rule
/// refused and let through, took no token, so its answer refunds nothing.
#[test]
fn what_the_bucket_did_not_admit_is_never_refunded() {
    let (mut e, rec) = engine("", LOGIN);
    let mut h = Fake::at(1000);
    assert_eq!(send(&mut e, &mut h, 10, &user("ada")), Action::Pause);
    deliver(&mut e, &mut h, 1, 200, &answer(false, 0, 12_000, 60_000, 0));
    assert_eq!(h.status_of(10), Some(429));
    // The filter's own 429 passes the response path too.
    e.response_headers(&mut h, 10.into(), &resp(&[(":status", "429")]));
    e.done(&mut h, 10.into());
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0);

    let shadow = LOGIN.replace(r#""burst":5,"#, r#""burst":5,"shadow":true,"#);
    let (mut e, rec) = engine("", &shadow);
    let mut h = Fake::default();
    assert_eq!(send(&mut e, &mut h, 10, &user("ada")), Action::Pause);
    deliver(&mut e, &mut h, 1, 200, &answer(false, 0, 12_000, 60_000, 0));
    assert_eq!(h.resumed, [10], "a shadow rule never denies");
    assert_eq!(rec.get(0, Counter::ShadowDenied), 1);
    answered(&mut e, &mut h, 10, "200");
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0, "it took nothing");
    // A shadow rule that admits settles as an enforced one does.
    admit(&mut e, &mut h, 11, &user("bob"));
    answered(&mut e, &mut h, 11, "200");
    assert_eq!(rec.get(0, Counter::UsageRefunded), 1);
}
