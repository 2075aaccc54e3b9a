//! Usage that never becomes readable cannot lower a charge: every admission of a usage rule
//! settles once, with the usage its response reported, what its stream showed before it was cut
//! short, or the worst case (never below the up-front cost); and a body usage is asked for
//! unencoded.

use super::*;

const BODY: &str = r#"{"name":"llm","key":["header:x-user"],"rate":1,"period_ms":60000,
    "burst":100,"usage":{"body_field":"usage.total_tokens"}}"#;

const SSE: &[(&str, &str)] = &[("content-type", "text/event-stream")];

/// Request `ctx` of user `u`, admitted by the backend at an up-front cost of 1.
fn admit(e: &mut Engine, h: &mut Fake, ctx: u32, u: &str) {
    assert_eq!(send(e, h, ctx, &user(u)), Action::Pause);
    let token = *h.tokens().last().unwrap();
    deliver(e, h, token, 200, &answer(true, 50, 0, 100, 1));
    assert!(h.resumed.contains(&ctx));
}

/// A whole event stream for `ctx`, `events` in one chunk.
fn stream(e: &mut Engine, h: &mut Fake, ctx: u32, events: &[u8]) {
    assert_eq!(
        e.response_headers(h, ctx.into(), &resp(SSE)),
        Some(Look::Whole)
    );
    e.response_body(h, ctx.into(), Chunk::whole(events), true);
    e.done(h, ctx.into());
}

const USED_40: &[u8] = b"data: {\"usage\":{\"total_tokens\":40}}\n\ndata: [DONE]\n\n";
const NO_USAGE: &[u8] = b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n";

#[test]
fn a_stream_without_usage_is_charged_the_largest_usage_read_lately() {
    let (mut e, rec) = engine("", BODY);
    let mut h = Fake::default();
    // Nothing read yet: the worst case is the up-front cost, so nothing more is charged.
    admit(&mut e, &mut h, 10, "a");
    stream(&mut e, &mut h, 10, NO_USAGE);
    assert_eq!(rec.get(0, Counter::UsageMissing), 1);
    assert_eq!(rec.get(0, Counter::UsageWorstCase), 1);
    assert_eq!(rec.get(0, Counter::UsageCharged), 0);
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0, "never a refund");
    // An honest answer of another user: 40.
    admit(&mut e, &mut h, 11, "b");
    stream(&mut e, &mut h, 11, USED_40);
    assert_eq!(rec.get(0, Counter::UsageCharged), 39);
    // Now a stream without usage costs 40 too, whoever sends it.
    admit(&mut e, &mut h, 12, "a");
    stream(&mut e, &mut h, 12, NO_USAGE);
    assert_eq!(rec.get(0, Counter::UsageMissing), 2);
    assert_eq!(rec.get(0, Counter::UsageCharged), 2 * 39);
    // The charge rides on the key's next call.
    send(&mut e, &mut h, 13, &user("a"));
    assert_eq!(settle_arg(h.sent.last().unwrap()), 39);
}

#[test]
fn another_worker_reads_the_same_record() {
    let (mut e1, _) = engine("", BODY);
    let (mut e2, rec2) = engine("", BODY);
    let mut h = Fake::default();
    admit(&mut e1, &mut h, 10, "a");
    stream(
        &mut e1,
        &mut h,
        10,
        b"data: {\"usage\":{\"total_tokens\":70}}\n\n",
    );
    admit(&mut e2, &mut h, 11, "b");
    stream(&mut e2, &mut h, 11, NO_USAGE);
    assert_eq!(
        rec2.get(0, Counter::UsageCharged),
        69,
        "shared data, per proxy"
    );
}

#[test]
fn a_stream_cut_short_settles_what_it_showed_or_the_worst_case() {
    let (mut e, rec) = engine("", BODY);
    let mut h = Fake::default();
    admit(&mut e, &mut h, 10, "a");
    assert_eq!(
        e.response_headers(&mut h, 10.into(), &resp(SSE)),
        Some(Look::Whole)
    );
    e.response_body(
        &mut h,
        10.into(),
        Chunk::whole(b"data: {\"choices\":[]}\n\ndata: {\"usage\":{\"total_tokens\":30}}\n\n"),
        false,
    );
    // The client leaves before the end.
    e.done(&mut h, 10.into());
    assert_eq!(rec.get(0, Counter::UsageUnfinished), 1);
    assert_eq!(rec.get(0, Counter::UsageWorstCase), 0, "its usage was seen");
    assert_eq!(rec.get(0, Counter::UsageCharged), 29);
    // Cut before any usage: the worst case (30, read just now).
    admit(&mut e, &mut h, 11, "a");
    assert_eq!(
        e.response_headers(&mut h, 11.into(), &resp(SSE)),
        Some(Look::Whole)
    );
    e.response_body(
        &mut h,
        11.into(),
        Chunk::whole(b"data: {\"choices\":[]}\n\n"),
        false,
    );
    e.done(&mut h, 11.into());
    assert_eq!(rec.get(0, Counter::UsageUnfinished), 2);
    assert_eq!(rec.get(0, Counter::UsageWorstCase), 1);
    assert_eq!(rec.get(0, Counter::UsageCharged), 2 * 29);
    // Gone before the response even started: the worst case too.
    admit(&mut e, &mut h, 12, "a");
    e.done(&mut h, 12.into());
    assert_eq!(rec.get(0, Counter::UsageUnfinished), 3);
    assert_eq!(rec.get(0, Counter::UsageCharged), 3 * 29);
    assert_eq!(e.load().0, 0, "every request forgotten");
}

#[test]
fn trailers_end_the_body() {
    let (mut e, rec) = engine("", BODY);
    let mut h = Fake::default();
    admit(&mut e, &mut h, 10, "a");
    assert_eq!(
        e.response_headers(&mut h, 10.into(), &resp(SSE)),
        Some(Look::Whole)
    );
    // The body's last chunk does not end the stream: trailers do.
    e.response_body(&mut h, 10.into(), Chunk::whole(USED_40), false);
    e.response_trailers(&mut h, 10.into(), &resp(&[("grpc-status", "0")]));
    assert_eq!(rec.get(0, Counter::UsageCharged), 39);
    assert_eq!(e.load().0, 0, "settled and forgotten at the trailers");
    e.done(&mut h, 10.into());
    assert_eq!(rec.get(0, Counter::UsageCharged), 39, "settled once");
    assert_eq!(rec.get(0, Counter::UsageUnfinished), 0);
}

#[test]
fn a_body_usage_is_asked_for_unencoded_and_an_encoded_answer_is_the_worst_case() {
    let (mut e, rec) = engine("", BODY);
    let mut h = Fake::default();
    let gzip = [("x-user", "a"), ("accept-encoding", "gzip, br")];
    send(&mut e, &mut h, 10, &req("/api/x", &gzip));
    assert_eq!(
        h.set_headers,
        [(10, "accept-encoding".to_string(), "identity".to_string())]
    );
    deliver(&mut e, &mut h, 1, 200, &answer(true, 50, 0, 100, 1));
    assert_eq!(
        e.response_headers(&mut h, 10.into(), &resp(SSE)),
        Some(Look::Whole)
    );
    e.response_body(&mut h, 10.into(), Chunk::whole(USED_40), true);
    // An upstream that compresses anyway: not read, the worst case (40).
    send(&mut e, &mut h, 11, &req("/api/x", &gzip));
    deliver(&mut e, &mut h, 2, 200, &answer(true, 50, 0, 100, 1));
    let gzipped = resp(&[
        ("content-type", "application/json"),
        ("content-encoding", "gzip"),
    ]);
    assert_eq!(
        e.response_headers(&mut h, 11.into(), &gzipped),
        None,
        "not watched"
    );
    assert_eq!(rec.get(0, Counter::UsageEncoded), 1);
    assert_eq!(rec.get(0, Counter::UsageCharged), 2 * 39);
    // A rule reading a header leaves the request's headers alone.
    let (mut e, _) = engine("", LLM);
    let mut h = Fake::default();
    send(&mut e, &mut h, 12, &req("/api/x", &gzip));
    assert!(h.set_headers.is_empty());
}

#[test]
fn a_missing_or_invalid_usage_header_is_the_worst_case() {
    let rules = r#"{"name":"hdr","key":["header:x-user"],"rate":1,"burst":100,
        "usage":{"header":"x-used","unreadable":60}}"#;
    let (mut e, rec) = engine("", rules);
    let mut h = Fake::default();
    // Neither in the headers nor in the trailers.
    admit(&mut e, &mut h, 10, "a");
    e.response_headers(&mut h, 10.into(), &resp(&[]));
    e.response_trailers(&mut h, 10.into(), &resp(&[]));
    assert_eq!(rec.get(0, Counter::UsageMissing), 1);
    assert_eq!(
        rec.get(0, Counter::UsageCharged),
        59,
        "the configured worst case"
    );
    // No trailers at all: missing when the request ends.
    admit(&mut e, &mut h, 11, "a");
    e.response_headers(&mut h, 11.into(), &resp(&[]));
    assert_eq!(
        rec.get(0, Counter::UsageMissing),
        1,
        "maybe in the trailers"
    );
    e.done(&mut h, 11.into());
    assert_eq!(rec.get(0, Counter::UsageMissing), 2);
    assert_eq!(rec.get(0, Counter::UsageUnfinished), 0);
    // Invalid.
    admit(&mut e, &mut h, 12, "a");
    e.response_headers(&mut h, 12.into(), &resp(&[("x-used", "-4")]));
    assert_eq!(rec.get(0, Counter::UsageInvalid), 1);
    assert_eq!(rec.get(0, Counter::UsageWorstCase), 3);
    assert_eq!(rec.get(0, Counter::UsageCharged), 3 * 59);
    // A readable usage is what it says, even below the worst case.
    admit(&mut e, &mut h, 13, "a");
    e.response_headers(&mut h, 13.into(), &resp(&[("x-used", "0")]));
    assert_eq!(rec.get(0, Counter::UsageRefunded), 1);
}

#[test]
fn the_worst_case_is_never_below_the_up_front_cost() {
    let rules = r#"{"name":"hdr","key":["header:x-user"],"rate":1,"burst":100,"cost":80,
        "usage":{"header":"x-used","unreadable":60}}"#;
    let (mut e, rec) = engine("", rules);
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 20, 0, 100, 80));
    e.response_headers(&mut h, 10.into(), &resp(&[]));
    e.done(&mut h, 10.into());
    assert_eq!(rec.get(0, Counter::UsageWorstCase), 1);
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0);
    assert_eq!(rec.get(0, Counter::UsageCharged), 0);
}

#[test]
fn a_body_that_ends_with_the_headers_is_missing() {
    let (mut e, rec) = engine("", BODY);
    let mut h = Fake::default();
    admit(&mut e, &mut h, 10, "a");
    let json = resp(&[("content-type", "application/json")]);
    assert_eq!(
        e.response_headers(&mut h, 10.into(), &json),
        Some(Look::Tail)
    );
    // What the filter does when the headers end the stream.
    e.response_body(&mut h, 10.into(), Chunk::whole(&[]), true);
    assert_eq!(rec.get(0, Counter::UsageMissing), 1);
    e.done(&mut h, 10.into());
    assert_eq!(rec.get(0, Counter::UsageWorstCase), 1, "settled once");
}

/// A worker whose worst case is 40 (an honest answer read so), with request 11 of user "a"
/// admitted and its JSON answer's headers in.
fn json_answer_after_a_usage_of_40() -> (Engine, Rc<Recorder>, Fake) {
    let (mut e, rec) = engine("", BODY);
    let mut h = Fake::default();
    admit(&mut e, &mut h, 10, "a");
    stream(&mut e, &mut h, 10, USED_40);
    admit(&mut e, &mut h, 11, "a");
    let json = resp(&[("content-type", "application/json")]);
    assert_eq!(
        e.response_headers(&mut h, 11.into(), &json),
        Some(Look::Tail)
    );
    (e, rec, h)
}

#[test]
fn a_body_too_large_to_read_is_the_worst_case() {
    let (mut e, rec, mut h) = json_answer_after_a_usage_of_40();
    let body = format!(
        r#"{{"usage":{{"total_tokens":1}},"text":"{}"}}"#,
        "x".repeat(usage::WINDOW)
    );
    for chunk in body.as_bytes().chunks(4096) {
        e.response_body(&mut h, 11.into(), Chunk::whole(chunk), false);
    }
    e.response_body(&mut h, 11.into(), Chunk::whole(&[]), true);
    assert_eq!(rec.get(0, Counter::UsageTooLarge), 1);
    assert_eq!(rec.get(0, Counter::UsageCharged), 2 * 39);
}

#[test]
fn a_body_with_a_chunk_the_host_could_not_give_is_the_worst_case() {
    let (mut e, rec, mut h) = json_answer_after_a_usage_of_40();
    // `"total_tokens":40` with the chunk holding the `0` lost reads as 4 around the hole.
    e.response_body(
        &mut h,
        11.into(),
        Chunk::whole(br#"{"usage":{"total_tokens":4"#),
        false,
    );
    e.response_body_lost(&mut h, 11.into(), false);
    e.response_body(&mut h, 11.into(), Chunk::whole(b"}}"), true);
    assert_eq!(rec.get(0, Counter::UsageTooLarge), 1);
    assert_eq!(
        rec.get(0, Counter::UsageCharged),
        2 * 39,
        "the worst case: 40"
    );
    // An event stream whose last chunk is lost: the usage it showed before may not be its last.
    admit(&mut e, &mut h, 12, "a");
    assert_eq!(
        e.response_headers(&mut h, 12.into(), &resp(SSE)),
        Some(Look::Whole)
    );
    e.response_body(
        &mut h,
        12.into(),
        Chunk::whole(b"data: {\"usage\":{\"total_tokens\":2}}\n\n"),
        false,
    );
    e.response_body_lost(&mut h, 12.into(), true);
    assert_eq!(rec.get(0, Counter::UsageTooLarge), 2);
    assert_eq!(rec.get(0, Counter::UsageCharged), 3 * 39);
}

#[test]
fn a_request_gone_while_held_for_its_reservation_used_nothing_more() {
    let rules = r#"{"name":"llm","key":["header:x-user"],"rate":10,"burst":100,"max_wait_ms":800,
        "usage":{"header":"x-used","unreadable":60}}"#;
    let (mut e, rec) = engine("", rules);
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 0, 300, 800, 1));
    assert!(h.resumed.is_empty(), "held");
    e.done(&mut h, 10.into());
    assert_eq!(rec.get(0, Counter::UsageWorstCase), 0);
    assert_eq!(rec.get(0, Counter::UsageCharged), 0);
    // Once resumed it may have reached the upstream: gone before its answer is the worst case.
    send(&mut e, &mut h, 11, &user("a"));
    deliver(&mut e, &mut h, 2, 200, &answer(true, 0, 300, 800, 1));
    h.now = 300;
    e.tick(&mut h);
    assert_eq!(h.resumed, [11]);
    e.done(&mut h, 11.into());
    assert_eq!(rec.get(0, Counter::UsageUnfinished), 1);
    assert_eq!(rec.get(0, Counter::UsageCharged), 59);
}

/// A worker reads at most `MAX_READERS` bodies at once (16 KiB each at most): a response that
/// would start one more reader is not read, and its admission is charged the worst case at once;
/// every reader gives its place back when it ends, however it ends.
#[test]
fn past_the_readers_cap_a_response_is_not_read_and_charged_the_worst_case() {
    let (mut e, rec) = engine("", BODY);
    let mut h = Fake::default();
    // An honest answer: the worst case is 40 from now on.
    admit(&mut e, &mut h, 1, "honest");
    stream(&mut e, &mut h, 1, USED_40);
    assert_eq!(rec.get(0, Counter::UsageCharged), 39);
    let json = [("content-type", "application/json")];
    let first = 10;
    let cap = u32::try_from(usage::MAX_READERS).unwrap();
    for ctx in first..first + cap {
        admit(&mut e, &mut h, ctx, &format!("u{ctx}"));
        let headers = resp(if ctx % 2 == 0 { SSE } else { &json });
        assert!(
            e.response_headers(&mut h, ctx.into(), &headers).is_some(),
            "read"
        );
        e.response_body(
            &mut h,
            ctx.into(),
            Chunk::whole(b"data: {\"choices\":[]}\n\n"),
            false,
        );
    }
    assert_eq!(e.usage.readers().alive(), usage::MAX_READERS);
    // One more: not read, and charged the worst case at once, before its body.
    let late = first + cap;
    admit(&mut e, &mut h, late, "late");
    assert_eq!(
        e.response_headers(&mut h, late.into(), &resp(SSE)),
        None,
        "not read"
    );
    assert_eq!(rec.get(0, Counter::UsageReadersFull), 1);
    assert_eq!(rec.get(0, Counter::UsageWorstCase), 1);
    assert_eq!(rec.get(0, Counter::UsageCharged), 2 * 39);
    assert_eq!(
        e.usage.readers().alive(),
        usage::MAX_READERS,
        "no reader for it"
    );
    // Its body changes nothing: it was settled once.
    e.response_body(
        &mut h,
        late.into(),
        Chunk::whole(b"data: {\"usage\":{\"total_tokens\":0}}\n\n"),
        true,
    );
    e.done(&mut h, late.into());
    assert_eq!(rec.get(0, Counter::UsageCharged), 2 * 39);
    assert_eq!(rec.get(0, Counter::UsageRefunded), 0);
    assert_eq!(rec.get(0, Counter::UsageWorstCase), 1);
    // A stream that ends gives its place back: the next response is read.
    e.response_body(
        &mut h,
        first.into(),
        Chunk::whole(b"data: {\"usage\":{\"total_tokens\":5}}\n\n"),
        true,
    );
    assert_eq!(rec.get(0, Counter::UsageCharged), 2 * 39 + 4);
    assert_eq!(e.usage.readers().alive(), usage::MAX_READERS - 1);
    let next = late + 1;
    admit(&mut e, &mut h, next, "next");
    assert_eq!(
        e.response_headers(&mut h, next.into(), &resp(SSE)),
        Some(Look::Whole),
        "read again"
    );
    e.response_body(
        &mut h,
        next.into(),
        Chunk::whole(b"data: {\"usage\":{\"total_tokens\":7}}\n\n"),
        true,
    );
    assert_eq!(rec.get(0, Counter::UsageCharged), 2 * 39 + 4 + 6);
    assert_eq!(rec.get(0, Counter::UsageReadersFull), 1);
    // Trailers end a body, a hang-up ends the rest: every place is given back.
    e.response_trailers(&mut h, ContextId::from(first + 1), &resp(&[]));
    assert_eq!(e.usage.readers().alive(), usage::MAX_READERS - 2);
    for ctx in first..first + cap {
        e.done(&mut h, ctx.into());
    }
    assert_eq!(e.usage.readers().alive(), 0);
    assert_eq!(e.load().0, 0, "every request forgotten");
}

/// A client that sends `Range` picks which bytes of the upstream's answer the filter reads: a
/// `206` body is a part of the answer, never its whole. A part that holds a smaller usage of the
/// answer (an item's own `usage` object, a stream's first event), or that ends just after one,
/// must not be read as the answer's usage: it is charged the worst case (here 40), as a body cut
/// in its number already is.
#[test]
fn a_partial_answer_to_a_range_request_is_the_worst_case() {
    let partial = |status: &'static str, ct: &'static str, range: &'static str| {
        resp(&[
            (":status", status),
            ("content-type", ct),
            ("content-range", range),
        ])
    };
    let json = "application/json";
    let pad = "x".repeat(2 * usage::WINDOW);
    // The whole answer: `{"data":[{"text":…,"usage":{"total_tokens":1}}, …],"usage":{…40…}}`.
    let parts: Vec<(Req, Vec<u8>)> = vec![
        // The bytes of the first item's usage alone: a whole JSON document.
        (
            partial("206", json, "bytes 9-36/90000"),
            br#"{"usage":{"total_tokens":1}}"#.to_vec(),
        ),
        // The same range from an upstream that says so only in `content-range`.
        (
            partial("200", json, "bytes 9-36/90000"),
            br#"{"usage":{"total_tokens":1}}"#.to_vec(),
        ),
        // A large answer cut just after the first item (read from its tail).
        (
            partial("206", json, "bytes 0-33000/90000"),
            format!(r#"{{"data":[{{"text":"{pad}","usage":{{"total_tokens":1}}}},"#).into_bytes(),
        ),
        // A stream's part that ends before its last usage event.
        (
            partial("206", "text/event-stream", "bytes 0-40/900"),
            b"data: {\"usage\":{\"total_tokens\":1}}\n\n".to_vec(),
        ),
    ];
    for (n, (headers, body)) in parts.into_iter().enumerate() {
        let (mut e, rec, mut h) = json_answer_after_a_usage_of_40();
        // Answer 11 never came: the worst case, 40.
        e.done(&mut h, 11.into());
        assert_eq!(rec.get(0, Counter::UsageCharged), 2 * 39);
        admit(&mut e, &mut h, 12, "a");
        // The filter feeds the body only to a response whose readers look at it.
        if e.response_headers(&mut h, 12.into(), &headers).is_some() {
            e.response_body(&mut h, 12.into(), Chunk::whole(&body), true);
        }
        e.done(&mut h, 12.into());
        assert_eq!(
            rec.get(0, Counter::UsageCharged),
            3 * 39,
            "part {n}: charged the worst case, not the 1 it shows"
        );
        assert_eq!(rec.get(0, Counter::UsageWorstCase), 2);
    }
}
