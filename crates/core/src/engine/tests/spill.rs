//! Refunds and the bucket's spill epoch: a take that may be refunded asks for its epoch, its
//! refund carries that epoch through the settle table to the script, refunds of two epochs never
//! merge (the older is dropped), and a call that failed after its script may have run gives
//! its charge again but never its refund.

use super::*;

/// A quota per user and a cap per request id: the cap's refusal refunds the quota's take (a
/// new id each time, so no denial is cached).
const QUOTA: &str = r#"{"name":"quota","key":["header:x-user"],"rate":1000,
    "period_ms":2592000000,"burst":1000}"#;
const CAP: &str = r#"{"name":"cap","key":["header:x-req"],"rate":10,
    "period_ms":60000,"burst":10}"#;

/// Request `ctx` of `u`: the quota admits it with spill epoch `epoch`, the cap refuses it.
fn refused(e: &mut Engine, h: &mut Fake, ctx: u32, u: &str, epoch: u64) {
    let before = h.tokens().len();
    let id = ctx.to_string();
    send(e, h, ctx, &req("/api/x", &[("x-user", u), ("x-req", &id)]));
    let tokens = h.tokens();
    let [quota, cap] = tokens[before..] else {
        panic!("{:?}", h.sent)
    };
    assert!(
        h.out[&quota].body.ends_with("/0/0/0%3A0%3A0%3A0"),
        "asks for its epoch"
    );
    // Its mark: the request's number (the units taken in the stretch, as far as a test cares).
    let admitted = format!(r#"{{"EVALSHA":[1,9,0,6000,1,0,{epoch},{ctx}]}}"#);
    deliver(e, h, quota, 200, admitted.as_bytes());
    deliver(e, h, cap, 200, &answer(false, 0, 6000, 60_000, 0));
    assert_eq!(h.status_of(ctx), Some(429));
}

/// The calls the flushes due `ms` from now send.
fn flush(e: &mut Engine, h: &mut Fake, ms: u64) -> Vec<String> {
    let before = h.sent.len();
    h.now += ms;
    e.tick(h);
    h.sent[before..].to_vec()
}

#[test]
fn a_refund_carries_its_takes_epoch_and_an_older_epochs_refund_is_dropped() {
    let (mut e, rec) = engine("", &format!("{QUOTA}, {CAP}"));
    let mut h = Fake::at(1000);
    refused(&mut e, &mut h, 10, "ann", 700);
    refused(&mut e, &mut h, 11, "ann", 700);
    // A take answered before the bucket's last spill (a slow call): its refund would give
    // nothing back; it is dropped here and counted.
    refused(&mut e, &mut h, 12, "ann", 500);
    assert_eq!(rec.get(0, Counter::Refunded), 3, "what was to come back");
    assert_eq!(rec.get(0, Counter::RefundDropped), 1, "the older epoch's");
    let calls = flush(&mut e, &mut h, 100);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0].contains("%7Bquota%3A") && calls[0].ends_with("/0/0/0/0%3A2%3A700%3A10"),
        "the two of epoch 700, with it and the smaller mark: {}",
        calls[0]
    );
    // A newer epoch replaces what is pending.
    refused(&mut e, &mut h, 13, "ann", 900);
    let [t] = h.tokens()[..] else {
        panic!("{:?}", h.out)
    };
    deliver(&mut e, &mut h, t, 200, &answer(true, 0, 0, 0, 0));
    refused(&mut e, &mut h, 14, "ann", 700);
    assert_eq!(rec.get(0, Counter::RefundDropped), 2);
    let calls = flush(&mut e, &mut h, 100);
    assert!(
        calls.len() == 1 && calls[0].ends_with("/0/0/0/0%3A1%3A900%3A13"),
        "{calls:?}"
    );
}

/// LLM tokens: 1 up front, the usage from a header.
const LLM: &str = r#"{"name":"llm","key":["header:x-user"],"rate":1,"period_ms":60000,
    "burst":100,"usage":{"header":"x-usage-tokens","flush_ms":50}}"#;

#[test]
fn a_failed_call_gives_its_charge_again_and_its_refund_only_if_it_never_left() {
    let (mut e, rec) = engine("", LLM);
    let mut h = Fake::at(1000);
    // Two admissions of one key: one used 40 (39 to charge), one used nothing (1 to refund).
    for ctx in [10, 11] {
        send(&mut e, &mut h, ctx, &user("a"));
        let t = *h.tokens().last().unwrap();
        assert!(
            h.out[&t].body.ends_with("/0%3A0%3A0%3A0"),
            "{}",
            h.out[&t].body
        );
        deliver(&mut e, &mut h, t, 200, &answer(true, 50, 0, 100, 1));
    }
    let used = |n: &str| resp(&[("x-usage-tokens", n)]);
    e.response_headers(&mut h, 10.into(), &used("40"));
    e.done(&mut h, 10.into());
    e.response_headers(&mut h, 11.into(), &used("0"));
    e.done(&mut h, 11.into());
    let both = format!("/0/0/0/39%3A1%3A{EPOCH}%3A{MARK}");
    // The flush cannot leave (the host refuses the dispatch): both are pending again.
    h.fail_dispatch = true;
    assert!(flush(&mut e, &mut h, 50).is_empty(), "not dispatched");
    h.fail_dispatch = false;
    let calls = flush(&mut e, &mut h, 50);
    assert!(calls.len() == 1 && calls[0].ends_with(&both), "{calls:?}");
    assert_eq!(rec.get(0, Counter::RefundDropped), 0);
    // This one times out: its script may have run. The charge goes again (twice, it only
    // lowers the bucket); the refund does not (twice, it could pass the bound).
    let [t] = h.tokens()[..] else {
        panic!("{:?}", h.out)
    };
    deliver(&mut e, &mut h, t, 0, b"");
    assert_eq!(rec.get(0, Counter::RefundDropped), 1);
    let calls = flush(&mut e, &mut h, 50);
    assert!(
        calls.len() == 1 && calls[0].ends_with("/0/0/0/39"),
        "the charge alone: {calls:?}"
    );
}
