//! Refunds: a request that never goes upstream (refused by another rule, or gone before it went)
//! gets back what the global bucket took for it, through the settlements' path: pending for the
//! key, then a settle-only call after the flush time (or the key's next call, for a usage rule).
//! Each admission is refunded once; a share of a shared call that another request used never is.

use super::*;

/// A quota of 1000 per 30 days and a cap of 10 a minute, on one key (the recipe's shape).
const MONTH: &str = r#"{"name":"monthly","key":["header:x-user"],"rate":1000,
    "period_ms":2592000000,"burst":1000,"cost_header":"x-cost"}"#;
const MINUTE: &str = r#"{"name":"per-minute","key":["header:x-user"],"rate":10,
    "period_ms":60000,"burst":10}"#;

fn month_and_minute() -> String {
    format!("{MONTH}, {MINUTE}")
}

fn admitted() -> Vec<u8> {
    answer(true, 9, 0, 6000, 1)
}

fn denied() -> Vec<u8> {
    answer(false, 0, 6000, 60_000, 0)
}

/// The calls sent when the flushes due `flush_ms` from now have gone out.
fn flushed(e: &mut Engine, h: &mut Fake, flush_ms: u64) -> Vec<String> {
    let before = h.sent.len();
    h.now += flush_ms;
    e.tick(h);
    h.sent[before..].to_vec()
}

/// Whether `body` is a settle-only call (cost 0) of rule `rule` that settles `settle`: a refund
/// in the tracked form, with the epoch its take's reply gave.
fn settles(body: &str, rule: &str, settle: i64) -> bool {
    let arg = match settle {
        s if s < 0 => format!("0%3A{}%3A{EPOCH}%3A{MARK}", -s),
        s => s.to_string(),
    };
    body.contains(&format!("%7B{rule}%3A")) && body.ends_with(&format!("/0/0/0/{arg}"))
}

#[test]
fn a_request_refused_by_one_rule_gets_back_what_the_others_took() {
    let (mut e, rec) = engine("", &month_and_minute());
    let mut h = Fake::at(1000);
    let three = req("/api/x", &[("x-user", "ann"), ("x-cost", "3")]);
    send(&mut e, &mut h, 10, &three);
    let [month, minute] = h.tokens()[..] else {
        panic!("{:?}", h.sent)
    };
    deliver(&mut e, &mut h, month, 200, &admitted());
    assert!(h.responded.is_empty() && h.resumed.is_empty(), "undecided");
    deliver(&mut e, &mut h, minute, 200, &denied());
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(rec.get(0, Counter::Refunded), 3, "the month's 3 tokens");
    assert_eq!(rec.get(1, Counter::Refunded), 0, "the cap took nothing");
    assert_eq!(h.tick, 100, "the refund's flush");
    let calls = flushed(&mut e, &mut h, 100);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(settles(&calls[0], "monthly", -3), "{}", calls[0]);
    // Given back once: nothing more is pending.
    assert!(flushed(&mut e, &mut h, 100).is_empty());
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0, "not a usage refund");
}

#[test]
fn an_answer_that_comes_after_the_refusal_is_given_back() {
    let (mut e, rec) = engine("", &month_and_minute());
    let mut h = Fake::at(1000);
    send(&mut e, &mut h, 10, &user("ann"));
    // The cap refuses first, while the month's call is still out.
    deliver(&mut e, &mut h, 2, 200, &denied());
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(rec.get(0, Counter::Refunded), 0, "nothing taken yet");
    deliver(&mut e, &mut h, 1, 200, &admitted());
    assert_eq!(h.responded.len(), 1, "the request is never touched again");
    assert_eq!(rec.get(0, Counter::Refunded), 1);
    let calls = flushed(&mut e, &mut h, 100);
    assert!(
        calls.len() == 1 && settles(&calls[0], "monthly", -1),
        "{calls:?}"
    );
    // A late denial, or a late failure, gives back nothing.
    send(&mut e, &mut h, 11, &user("bob"));
    deliver(&mut e, &mut h, 5, 200, &denied());
    deliver(&mut e, &mut h, 4, 200, &denied());
    send(&mut e, &mut h, 12, &user("cy"));
    deliver(&mut e, &mut h, 7, 200, &denied());
    deliver(&mut e, &mut h, 6, 0, b"");
    assert_eq!(rec.get(0, Counter::Refunded), 1);
    assert!(flushed(&mut e, &mut h, 100).is_empty());
    deliver(&mut e, &mut h, 3, 200, &answer(true, 1000, 0, 0, 0));
    assert_eq!(e.load(), (0, 0, 0));
}

#[test]
fn a_client_that_leaves_before_the_verdict_gets_back_what_was_taken() {
    let (mut e, rec) = engine("", &month_and_minute());
    let mut h = Fake::at(1000);
    send(&mut e, &mut h, 10, &user("ann"));
    deliver(&mut e, &mut h, 1, 200, &admitted());
    e.done(&mut h, 10.into());
    assert_eq!(rec.get(0, Counter::Refunded), 1, "answered before it left");
    // The other call's answer comes after: given back as it comes.
    deliver(&mut e, &mut h, 2, 200, &admitted());
    assert_eq!(rec.get(1, Counter::Refunded), 1);
    assert!(h.resumed.is_empty() && h.responded.is_empty());
    let mut calls = flushed(&mut e, &mut h, 100);
    calls.sort();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(settles(&calls[0], "monthly", -1), "{}", calls[0]);
    assert!(settles(&calls[1], "per-minute", -1), "{}", calls[1]);
    // An admitted request that went upstream and then ended gives back nothing.
    send(&mut e, &mut h, 11, &user("bob"));
    deliver(&mut e, &mut h, 5, 200, &admitted());
    deliver(&mut e, &mut h, 6, 200, &admitted());
    assert_eq!(h.resumed, [11]);
    e.done(&mut h, 11.into());
    assert_eq!(
        rec.get(0, Counter::Refunded) + rec.get(1, Counter::Refunded),
        2
    );
}

#[test]
fn a_shared_call_gives_a_gone_requests_share_to_the_next_or_back_once() {
    let (mut e, rec) = engine("", EXACT);
    let mut h = Fake::default();
    for ctx in 10..13 {
        e.request_headers(&mut h, ctx.into(), &user("a"));
    }
    deliver(&mut e, &mut h, 1, 200, &answer(true, 9, 0, 100, 1));
    assert!(
        h.sent[1].ends_with("/1/2/0/0"),
        "one call for two: {}",
        h.sent[1]
    );
    // 11 leaves while the shared call is out; Redis grants one token: 12 takes it.
    e.done(&mut h, 11.into());
    deliver(&mut e, &mut h, 2, 200, &answer(true, 0, 0, 100, 1));
    assert_eq!(
        h.resumed,
        [10, 12],
        "the share went to the one still waiting"
    );
    assert!(h.responded.is_empty());
    assert_eq!(
        rec.get(0, Counter::Refunded),
        0,
        "used by 12: never given back"
    );
    // Two shares, one request left to use them: one goes back, once.
    for ctx in 20..23 {
        e.request_headers(&mut h, ctx.into(), &user("b"));
    }
    deliver(&mut e, &mut h, 3, 200, &answer(true, 9, 0, 100, 1));
    e.done(&mut h, 21.into());
    deliver(&mut e, &mut h, 4, 200, &answer(true, 7, 0, 100, 2));
    assert_eq!(h.resumed, [10, 12, 20, 22]);
    assert_eq!(rec.get(0, Counter::Refunded), 1);
    // A lone rule's calls never ask for the bucket's spill epoch (nothing but a client that
    // leaves while its call is out refunds them): the token is dropped, counted, not sent.
    assert_eq!(rec.get(0, Counter::RefundDropped), 1);
    assert!(flushed(&mut e, &mut h, 100).is_empty());
}

#[test]
fn a_forwarded_check_whose_request_left_gives_its_token_back_on_its_own_worker_once() {
    let ((mut w1, rec1), (mut w2, rec2), mut h) = two_workers();
    lead_a(&mut w1, &mut h);
    w2.request_headers(&mut h, 20.into(), &user("a"));
    assert_eq!(rec2.get(0, Counter::Forwarded), 1);
    ready(&mut w1, &mut h, 1);
    deliver(&mut w1, &mut h, 2, 200, &answer(true, 8, 0, 100, 1));
    // The leader's shared call is out with worker 2's check in it; its client leaves.
    w2.done(&mut h, 20.into());
    deliver(&mut w1, &mut h, 3, 200, &answer(true, 7, 0, 100, 1));
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.resumed, [10, 11]);
    assert_eq!(rec1.get(0, Counter::Refunded), 0, "the leader cannot know");
    assert_eq!(rec2.get(0, Counter::Refunded), 1);
    // A lone rule's calls never ask for the spill epoch: dropped on its own worker, once.
    assert_eq!(rec2.get(0, Counter::RefundDropped), 1);
    assert_eq!(rec1.get(0, Counter::RefundDropped), 0);
    assert!(flushed(&mut w2, &mut h, 100).is_empty());
    assert!(flushed(&mut w1, &mut h, 100).is_empty());
}

#[test]
fn a_shadow_rules_admission_is_given_back_and_its_denial_refuses_nothing() {
    let shadow_month = MONTH.replace(r#""rate":1000,"#, r#""rate":1000,"shadow":true,"#);
    let (mut e, rec) = engine("", &format!("{shadow_month}, {MINUTE}"));
    let mut h = Fake::at(1000);
    send(&mut e, &mut h, 10, &user("ann"));
    deliver(&mut e, &mut h, 1, 200, &admitted());
    deliver(&mut e, &mut h, 2, 200, &denied());
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(
        rec.get(0, Counter::Refunded),
        1,
        "the preview is given back"
    );
    // A shadow rule's denial lets the request through: nothing is given back.
    let shadow_minute = MINUTE.replace(r#""rate":10,"#, r#""rate":10,"shadow":true,"#);
    let (mut e, rec) = engine("", &format!("{MONTH}, {shadow_minute}"));
    let mut h = Fake::at(1000);
    send(&mut e, &mut h, 10, &user("ann"));
    deliver(&mut e, &mut h, 1, 200, &admitted());
    deliver(&mut e, &mut h, 2, 200, &denied());
    assert_eq!(h.resumed, [10]);
    assert_eq!(rec.get(0, Counter::Refunded), 0);
    assert!(flushed(&mut e, &mut h, 100).is_empty());
}

#[test]
fn a_usage_admission_of_a_refused_request_is_refunded_whole_once() {
    let llm = r#"{"name":"llm","key":["header:x-user"],"rate":1000,"burst":1000,
        "cost_header":"x-cost","usage":{"header":"x-usage-tokens","flush_ms":50}}"#;
    let (mut e, rec) = engine("", &format!("{llm}, {MINUTE}"));
    let mut h = Fake::at(1000);
    send(
        &mut e,
        &mut h,
        10,
        &req("/", &[("x-user", "ann"), ("x-cost", "40")]),
    );
    deliver(&mut e, &mut h, 1, 200, &admitted());
    deliver(&mut e, &mut h, 2, 200, &denied());
    assert_eq!(h.status_of(10), Some(429));
    // The filter's own 429 passes the response path: no usage is read from it.
    assert_eq!(
        e.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "900")])),
        None
    );
    e.done(&mut h, 10.into());
    assert_eq!(rec.get(0, Counter::Refunded), 40);
    for c in [
        Counter::UsageRefunded,
        Counter::UsageCharged,
        Counter::UsageWorstCase,
        Counter::UsageUnfinished,
    ] {
        assert_eq!(rec.get(0, c), 0, "{c:?}: it never went upstream");
    }
    // A usage rule's pending settlement rides on the key's next call (once the cap's denial,
    // cached here, is over).
    h.now += 6000;
    send(&mut e, &mut h, 11, &user("ann"));
    let t = *h.tokens().first().unwrap();
    assert_eq!(settle_arg(&h.out[&t].body), -40);
    assert!(flushed(&mut e, &mut h, 50).is_empty(), "carried: no flush");
}

#[test]
fn a_charge_on_admission_of_a_refused_request_is_refunded_once() {
    let login = r#"{"name":"login","key":["header:x-user"],"rate":5,"period_ms":60000,
        "burst":5,"charge_on":{"status":[401],"flush_ms":20}}"#;
    let (mut e, rec) = engine("", &format!("{login}, {MINUTE}"));
    let mut h = Fake::at(1000);
    send(&mut e, &mut h, 10, &user("ann"));
    deliver(&mut e, &mut h, 1, 200, &admitted());
    deliver(&mut e, &mut h, 2, 200, &denied());
    e.response_headers(&mut h, 10.into(), &resp(&[(":status", "429")]));
    e.done(&mut h, 10.into());
    assert_eq!(rec.get(0, Counter::Refunded), 1);
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0, "not settled twice");
    let calls = flushed(&mut e, &mut h, 20);
    assert!(
        calls.len() == 1 && settles(&calls[0], "login", -1),
        "{calls:?}"
    );
}

#[test]
fn a_reservation_is_given_back_when_another_rule_refuses_or_the_client_leaves_while_held() {
    let hooks = r#"{"name":"hooks","key":["header:x-user"],"rate":10,"burst":5,"max_wait_ms":800}"#;
    let (mut e, rec) = engine("", &format!("{hooks}, {MINUTE}"));
    let mut h = Fake::at(1000);
    send(&mut e, &mut h, 10, &user("ann"));
    // Reserved: due in 300 ms; the cap refuses.
    deliver(&mut e, &mut h, 1, 200, &answer(true, 0, 300, 800, 1));
    deliver(&mut e, &mut h, 2, 200, &denied());
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(rec.get(0, Counter::Refunded), 1, "the reservation");
    let calls = flushed(&mut e, &mut h, 100);
    assert!(
        calls.len() == 1 && settles(&calls[0], "hooks", -1),
        "{calls:?}"
    );
    // Admitted by both, held for the reservation; the client leaves before it is due.
    send(&mut e, &mut h, 11, &user("bob"));
    deliver(&mut e, &mut h, 4, 200, &answer(true, 0, 300, 800, 1));
    deliver(&mut e, &mut h, 5, 200, &admitted());
    assert!(h.resumed.is_empty(), "held");
    e.done(&mut h, 11.into());
    assert_eq!(rec.get(0, Counter::Refunded), 2);
    assert_eq!(rec.get(1, Counter::Refunded), 1);
    // One that was let go went upstream: nothing back.
    send(&mut e, &mut h, 12, &user("cy"));
    deliver(&mut e, &mut h, 6, 200, &answer(true, 0, 300, 800, 1));
    deliver(&mut e, &mut h, 7, 200, &admitted());
    h.now += 300;
    e.tick(&mut h);
    assert_eq!(h.resumed, [12]);
    e.done(&mut h, 12.into());
    assert_eq!(rec.get(0, Counter::Refunded), 2);
    assert_eq!(rec.get(1, Counter::Refunded), 1);
}

/// Envoy answers a request still held for its reservation itself (a 504 when its
/// `request_timeout` ends the wait; a 408 for one still arriving): that answer passes the
/// response path, but the request never went upstream, so what it paid goes back whole and
/// nothing is read from that answer.
#[test]
fn envoys_own_answer_to_a_held_request_charges_nothing() {
    for (name, rule, answer_headers) in [
        (
            "llm",
            r#"{"name":"llm","key":["header:x-user"],"rate":10,"burst":5,"max_wait_ms":800,
                "usage":{"header":"x-usage-tokens","unreadable":50,"flush_ms":50}}"#,
            vec![(":status", "408")],
        ),
        (
            "chat",
            r#"{"name":"chat","key":["header:x-user"],"rate":10,"burst":5,"max_wait_ms":800,
                "usage":{"body_field":"usage.total_tokens","unreadable":50,"flush_ms":50}}"#,
            vec![(":status", "408"), ("content-type", "application/json")],
        ),
        (
            "login",
            r#"{"name":"login","key":["header:x-user"],"rate":10,"burst":5,"max_wait_ms":800,
                "charge_on":{"status":[408],"flush_ms":50}}"#,
            vec![(":status", "408")],
        ),
    ] {
        let (mut e, rec) = engine("", &format!("{rule}, {MINUTE}"));
        let mut h = Fake::at(1000);
        send(&mut e, &mut h, 10, &user("ann"));
        deliver(&mut e, &mut h, 1, 200, &answer(true, 0, 300, 800, 1));
        deliver(&mut e, &mut h, 2, 200, &admitted());
        assert!(h.resumed.is_empty(), "held");
        e.response_headers(&mut h, 10.into(), &resp(&answer_headers));
        e.response_body(&mut h, 10.into(), Chunk::whole(b"request timeout"), true);
        e.done(&mut h, 10.into());
        assert_eq!(rec.get(0, Counter::Refunded), 1, "{rule}: what it paid");
        for c in [
            Counter::UsageCharged,
            Counter::UsageWorstCase,
            Counter::UsageUnfinished,
        ] {
            assert_eq!(rec.get(0, c), 0, "{rule}: {c:?}: it never went upstream");
        }
        let calls = flushed(&mut e, &mut h, 50);
        assert!(
            calls.len() == 1 && settles(&calls[0], name, -1),
            "{rule}: {calls:?}"
        );
    }
}

#[test]
fn a_penalty_rules_refund_carries_its_penalty() {
    let boxed = r#"{"name":"login","key":["header:x-user"],"rate":10,"burst":2,
        "penalty":{"ms":[120000],"window_ms":3600000}}"#;
    let (mut e, rec) = engine("", &format!("{boxed}, {MINUTE}"));
    let mut h = Fake::at(1000);
    send(&mut e, &mut h, 10, &user("ann"));
    deliver(&mut e, &mut h, 1, 200, br#"{"EVALSHA":[1,1,0,100,1,0]}"#);
    deliver(&mut e, &mut h, 2, 200, &denied());
    assert_eq!(rec.get(0, Counter::Refunded), 1);
    let calls = flushed(&mut e, &mut h, 100);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0].contains("%7Blogin%3A")
            && calls[0].ends_with(&format!(
                "/0/0/0/0%3A1%3A{EPOCH}%3A{MARK}/time/3600000%3A120000"
            )),
        "{}",
        calls[0]
    );
}

#[test]
fn failure_mode_and_lease_admissions_are_not_refunded() {
    // The failure mode admitted: no token was taken in Redis.
    let (mut e, rec) = engine(r#""failure_mode":"open","#, &month_and_minute());
    let mut h = Fake::at(1000);
    send(&mut e, &mut h, 10, &user("ann"));
    deliver(&mut e, &mut h, 1, 503, b"");
    deliver(&mut e, &mut h, 2, 200, &denied());
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(rec.get(0, Counter::Refunded), 0);
    // A lease rule's tokens are this proxy's: left as they are.
    let (mut e, rec) = engine("", &format!("{LEASE}, {MINUTE}"));
    let mut h = Fake::default();
    deposit_at_0(&h, &e, TWENTY_LEASED);
    send(&mut e, &mut h, 10, &user("a"));
    let [t] = h.tokens()[..] else {
        panic!("{:?}", h.sent)
    };
    deliver(&mut e, &mut h, t, 200, &denied());
    assert_eq!(h.status_of(10), Some(429));
    assert_eq!(rec.get(0, Counter::Refunded), 0);
    assert!(flushed(&mut e, &mut h, 100).is_empty());
}

/// A shared call's reply that grants more than it asked for (garbled, or not the script's) gives
/// back no token it never took: the shares are what was asked, at most.
#[test]
fn a_shared_call_granted_more_than_it_asked_gives_back_only_its_own_shares() {
    let (mut e, rec) = engine("", EXACT);
    let mut h = Fake::default();
    for ctx in 10..13 {
        e.request_headers(&mut h, ctx.into(), &user("a"));
    }
    deliver(&mut e, &mut h, 1, 200, &answer(true, 9, 0, 100, 1));
    assert!(h.sent[1].ends_with("/1/2/0/0"), "two shares: {}", h.sent[1]);
    e.done(&mut h, 11.into());
    deliver(&mut e, &mut h, 2, 200, &answer(true, 0, 0, 100, 1000));
    assert_eq!(h.resumed, [10, 12]);
    assert_eq!(
        rec.get(0, Counter::Refunded),
        1,
        "the one share nobody used, not 999"
    );
}

/// A flight of refunds that fails in a way that may follow its script (Envoy's `upstream
/// failure`: the connection closed with the call pending) goes again key by key without them,
/// counted as dropped: given back twice, they would admit past the bucket. An error that comes
/// before the script runs (a Redis Cluster redirect) keeps them.
#[test]
fn a_failed_flights_refunds_go_again_only_if_its_script_never_ran() {
    for (error, kept) in [
        ("upstream failure", false),
        ("MOVED 866 127.0.0.1:7001", true),
    ] {
        let (mut e, rec) = engine(super::batch::BATCHED, &month_and_minute());
        let mut h = Fake::at(1000);
        for (ctx, who) in [(10, "ann"), (11, "bob")] {
            send(
                &mut e,
                &mut h,
                ctx,
                &req("/api/x", &[("x-user", who), ("x-cost", "3")]),
            );
            let [flight] = h.tokens()[..] else {
                panic!("{:?}", h.sent)
            };
            let reply = super::batch::batch_answer(&[
                super::batch::part(true, 9, 0),
                super::batch::part(false, 0, 6000),
            ]);
            deliver(&mut e, &mut h, flight, 200, &reply);
            assert_eq!(h.status_of(ctx), Some(429));
        }
        assert_eq!(rec.get(0, Counter::Refunded), 6);
        assert_eq!(
            flushed(&mut e, &mut h, 100).len(),
            1,
            "both refunds in one flight"
        );
        let [flight] = h.tokens()[..] else {
            panic!("{:?}", h.sent)
        };
        let before = h.sent.len();
        let failed = format!(r#"{{"EVALSHA":[false,"{error}"]}}"#);
        deliver(&mut e, &mut h, flight, 200, failed.as_bytes());
        let again = &h.sent[before..];
        if kept {
            assert_eq!(again.len(), 2, "{error}: each key alone");
            assert!(
                again.iter().all(|body| settles(body, "monthly", -3)),
                "{again:?}"
            );
        } else {
            assert!(
                again.is_empty(),
                "{error}: nothing else to settle: {again:?}"
            );
        }
        let dropped = if kept { 0 } else { 6 };
        assert_eq!(rec.get(0, Counter::RefundDropped), dropped, "{error}");
    }
}
