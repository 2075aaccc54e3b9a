//! Flights: the exact checks of different keys (and a request's several rules) share one backend
//! request, each decided by its own part of the reply; a failed flight fails each of its checks
//! into its rule's failure mode; the breaker hears of a flight once; `max_inflight` counts
//! flights; `batch_max_keys` bounds a flight.

use super::*;

pub(super) const BATCHED: &str = r#""backend":{"batch_max_keys":32},"#;

/// The part of a batched reply for one key: `allowed, remaining, retry, reset, granted, 0`.
pub(super) fn part(allowed: bool, remaining: u64, retry: i64) -> String {
    format!(
        "{},{remaining},{retry},1000,{},0",
        u8::from(allowed),
        u8::from(allowed)
    )
}

/// Webdis' answer to a batched call.
pub(super) fn batch_answer(parts: &[String]) -> Vec<u8> {
    format!(r#"{{"EVALSHA":[{}]}}"#, parts.join(",")).into_bytes()
}

/// How many script calls the backend request `body` carries (1 for the single form).
fn keys_in(body: &str) -> usize {
    let mut segs = body.split('/');
    let _verb = segs.next();
    let _sha = segs.next();
    let n: usize = segs.next().unwrap().parse().unwrap();
    if n > 1 {
        assert!(body.contains("/batch/"), "{body}");
    }
    n
}

/// Sends one request per user in `users` as contexts from `first`.
fn requests(e: &mut Engine, h: &mut Fake, first: u32, users: &[&str]) {
    for (i, u) in users.iter().enumerate() {
        send(e, h, first + i as u32, &user(u));
    }
}

/// An engine configured by `top` whose flight 2 carries the checks of "b" (context 11) and "c"
/// (12): they came while flight 1 ("a", context 10, admitted) was out.
fn two_in_flight_2(top: &str) -> (Engine, Rc<Recorder>, Fake) {
    let (mut e, rec) = engine(top, EXACT);
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("a"));
    requests(&mut e, &mut h, 11, &["b", "c"]);
    deliver(&mut e, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(keys_in(&h.sent[1]), 2);
    (e, rec, h)
}

pub(super) const CLOSED: &str = r#""failure_mode":"closed","backend":{"batch_max_keys":32},"#;

#[test]
fn checks_of_different_keys_that_arrive_while_a_flight_is_out_share_the_next_one() {
    let (mut e, rec) = engine(BATCHED, EXACT);
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("a"));
    assert_eq!(
        h.sent.len(),
        1,
        "an idle worker's check leaves at the end of its callback"
    );
    assert_eq!(keys_in(&h.sent[0]), 1);
    requests(&mut e, &mut h, 11, &["b", "c", "d"]);
    assert_eq!(h.sent.len(), 1, "they wait for the flight out");
    deliver(&mut e, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(h.resumed, [10]);
    assert_eq!(h.sent.len(), 2, "the answer sends the open batch");
    assert_eq!(keys_in(&h.sent[1]), 3);
    let b = batch_answer(&[part(true, 19, 0), part(false, 0, 300), part(true, 5, 0)]);
    deliver(&mut e, &mut h, 2, 200, &b);
    assert_eq!(h.resumed, [10, 11, 13], "each by its own part");
    assert_eq!(h.status_of(12), Some(429));
    assert_eq!(rec.get(0, Counter::BackendCalls), 4, "counted per check");
    assert_eq!(rec.get(0, Counter::Allowed), 3);
    assert_eq!(rec.get(0, Counter::Denied), 1);
    assert_eq!(e.load().1, 0);
}

/// An engine configured by `top` whose worker has shared queue 1, as every Envoy worker has.
fn with_queue(top: &str) -> (Engine, Rc<Recorder>, Fake) {
    let (mut e, rec) = engine(top, EXACT);
    let mut h = Fake::default();
    h.queues.insert(1, Default::default());
    e.set_queue(1);
    (e, rec, h)
}

/// The host's round of events ends: what it posted to worker `e`'s queue 1 comes.
fn end_round(e: &mut Engine, h: &mut Fake) {
    ready(e, h, 1);
}

/// Worker `e` has had company: "x" (context 1) went alone, "y" and "z" (2, 3) gathered behind it
/// and went together; both flights are answered, so it is idle. Clears what the host recorded.
fn had_company(e: &mut Engine, h: &mut Fake) {
    requests(e, h, 1, &["x"]);
    assert_eq!(
        h.sent.len(),
        1,
        "a lone check on a quiet worker leaves at once"
    );
    assert!(h.queues[&1].is_empty(), "no note for it");
    requests(e, h, 2, &["y", "z"]);
    deliver(e, h, 1, 200, &answer(true, 19, 0, 100, 1));
    deliver(
        e,
        h,
        2,
        200,
        &batch_answer(&[part(true, 19, 0), part(true, 19, 0)]),
    );
    assert_eq!(h.resumed, [1, 2, 3]);
    end_round(e, h);
    h.sent.clear();
    h.resumed.clear();
}

#[test]
fn on_a_busy_worker_the_checks_of_one_round_of_events_leave_together() {
    let (mut e, _, mut h) = with_queue(BATCHED);
    had_company(&mut e, &mut h);
    requests(&mut e, &mut h, 10, &["a", "b", "c"]);
    assert!(h.sent.is_empty(), "nothing leaves before the round ends");
    assert_eq!(
        h.queues[&1].len(),
        1,
        "one note for the round, not one per request"
    );
    end_round(&mut e, &mut h);
    assert_eq!(h.sent.len(), 1);
    assert_eq!(keys_in(&h.sent[0]), 3, "{}", h.sent[0]);
    // While that flight is out, checks wait for its answer (no note), which sends them at once.
    requests(&mut e, &mut h, 13, &["d", "e"]);
    assert!(h.queues[&1].is_empty());
    let b = batch_answer(&[part(true, 19, 0), part(true, 19, 0), part(true, 19, 0)]);
    deliver(&mut e, &mut h, 3, 200, &b);
    assert_eq!(h.resumed, [10, 11, 12]);
    assert_eq!(
        h.sent.len(),
        2,
        "the answer sends what gathered, without a note"
    );
    assert_eq!(keys_in(&h.sent[1]), 2);
}

#[test]
fn a_worker_whose_last_flight_went_alone_sends_at_once_again() {
    let (mut e, _, mut h) = with_queue(BATCHED);
    had_company(&mut e, &mut h);
    send(&mut e, &mut h, 10, &user("a"));
    end_round(&mut e, &mut h);
    assert_eq!(
        h.sent.len(),
        1,
        "it had company: its flight left at the round's end, alone"
    );
    deliver(&mut e, &mut h, 3, 200, &answer(true, 19, 0, 100, 1));
    send(&mut e, &mut h, 11, &user("b"));
    assert_eq!(
        h.sent.len(),
        2,
        "one request at a time: no note, no wait for the round"
    );
    assert!(h.queues[&1].is_empty());
}

#[test]
fn a_note_that_comes_after_its_batch_left_sends_nothing_more() {
    let (mut e, _, mut h) = with_queue(r#""backend":{"batch_max_keys":2},"#);
    had_company(&mut e, &mut h);
    requests(&mut e, &mut h, 10, &["a", "b"]);
    assert_eq!(h.sent.len(), 1, "a full batch leaves at once");
    assert_eq!(h.queues[&1].len(), 1, "the note for \"a\" is still to come");
    end_round(&mut e, &mut h);
    assert_eq!(h.sent.len(), 1, "and sends nothing");
    deliver(
        &mut e,
        &mut h,
        3,
        200,
        &batch_answer(&[part(true, 1, 0), part(true, 1, 0)]),
    );
    // Idle again, with company: the next round's check leaves at its end.
    send(&mut e, &mut h, 12, &user("c"));
    assert_eq!(h.sent.len(), 1);
    end_round(&mut e, &mut h);
    assert_eq!(h.sent.len(), 2);
    assert_eq!(keys_in(&h.sent[1]), 1);
}

#[test]
fn a_busy_worker_whose_note_the_host_refuses_sends_at_the_end_of_the_event() {
    let (mut e, _, mut h) = with_queue(BATCHED);
    had_company(&mut e, &mut h);
    h.queues.clear(); // the host no longer knows queue 1: every enqueue is refused
    send(&mut e, &mut h, 10, &user("a"));
    assert_eq!(h.sent.len(), 1);
}

#[test]
fn a_request_with_two_rules_makes_one_backend_request() {
    let second = r#"{"name":"per-path","key":["path"],"rate":10,"burst":20}"#;
    let (mut e, rec) = engine(BATCHED, &format!("{EXACT},{second}"));
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("a"));
    assert_eq!(h.sent.len(), 1, "one flight for both rules");
    assert_eq!(keys_in(&h.sent[0]), 2);
    let b = batch_answer(&[part(true, 19, 0), part(true, 3, 0)]);
    deliver(&mut e, &mut h, 1, 200, &b);
    assert_eq!(h.resumed, [10]);
    assert_eq!(rec.get(0, Counter::BackendCalls), 1);
    assert_eq!(rec.get(1, Counter::BackendCalls), 1);
}

#[test]
fn a_failed_flight_gives_each_check_its_failure_mode_and_the_breaker_one_failure() {
    let top = r#""failure_mode":"closed","backend":{"batch_max_keys":32,"breaker_failures":2},"#;
    let (mut e, rec, mut h) = two_in_flight_2(top);
    deliver(&mut e, &mut h, 2, 0, b"");
    assert_eq!(h.status_of(11), Some(503));
    assert_eq!(h.status_of(12), Some(503));
    assert_eq!(rec.get(0, Counter::BackendErrors), 2, "counted per check");
    assert!(!rec.breaker.get(), "one failed request is one failure");
    send(&mut e, &mut h, 13, &user("d"));
    deliver(&mut e, &mut h, 3, 0, b"");
    assert!(rec.breaker.get(), "the second opens it");
}

#[test]
fn one_keys_error_fails_only_its_check() {
    let (mut e, rec, mut h) = two_in_flight_2(CLOSED);
    let b = batch_answer(&["-1,13,0,0,0,0".to_string(), part(true, 7, 0)]);
    deliver(&mut e, &mut h, 2, 200, &b);
    assert_eq!(h.status_of(11), Some(503), "its own failure mode");
    assert_eq!(h.resumed, [10, 12]);
    assert_eq!(rec.get(0, Counter::BackendErrors), 1);
    assert!(!rec.breaker.get());
}

#[test]
fn a_flight_carries_at_most_batch_max_keys_calls() {
    let (mut e, _) = engine(r#""backend":{"batch_max_keys":4},"#, EXACT);
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("first"));
    let users: Vec<String> = (0..10).map(|i| format!("u{i}")).collect();
    let users: Vec<&str> = users.iter().map(String::as_str).collect();
    requests(&mut e, &mut h, 11, &users);
    // Two full batches left at once; two checks wait for an answer, any flight's.
    let sizes: Vec<usize> = h.sent.iter().map(|b| keys_in(b)).collect();
    assert_eq!(sizes, [1, 4, 4]);
    deliver(&mut e, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    let sizes: Vec<usize> = h.sent.iter().map(|b| keys_in(b)).collect();
    assert_eq!(sizes, [1, 4, 4, 2]);
}

#[test]
fn max_inflight_counts_flights() {
    let (mut e, rec) = engine(
        r#""failure_mode":"closed","backend":{"batch_max_keys":2,"max_inflight":2},"#,
        EXACT,
    );
    let mut h = Fake::default();
    requests(&mut e, &mut h, 10, &["a", "b", "c", "d", "e"]);
    // "a" leaves alone at the end of its callback; "b" and "c" fill the next flight; "d" and
    // "e" find two flights out.
    let sizes: Vec<usize> = h.sent.iter().map(|b| keys_in(b)).collect();
    assert_eq!(sizes, [1, 2]);
    assert_eq!(h.status_of(13), Some(503));
    assert_eq!(h.status_of(14), Some(503));
    assert_eq!(rec.get(0, Counter::InflightRejected), 2);
}

#[test]
fn noscript_resends_the_whole_flight_once_with_the_source() {
    let (mut e, _, mut h) = two_in_flight_2(BATCHED);
    deliver(&mut e, &mut h, 2, 200, NOSCRIPT);
    assert_eq!(h.sent.len(), 3);
    assert!(h.sent[2].starts_with("EVAL/"), "with the source");
    assert!(h.sent[2].contains("/2/") && h.sent[2].contains("/batch/"));
    let b = batch_answer(&[part(true, 19, 0), part(true, 18, 0)]);
    deliver(&mut e, &mut h, 3, 200, &b);
    assert_eq!(h.resumed, [10, 11, 12]);
}

#[test]
fn a_half_open_breaker_lets_exactly_one_flight_probe() {
    let (mut e, rec) = engine(
        r#""failure_mode":"closed","backend":{"batch_max_keys":32,"breaker_failures":1,
            "breaker_cooloff_ms":500},"#,
        EXACT,
    );
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("a"));
    deliver(&mut e, &mut h, 1, 0, b"");
    assert!(rec.breaker.get());
    requests(&mut e, &mut h, 11, &["b"]);
    assert_eq!(h.status_of(11), Some(503), "open: at once, no call");
    assert_eq!(h.sent.len(), 1);
    h.now = 500;
    requests(&mut e, &mut h, 12, &["c"]);
    assert_eq!(h.sent.len(), 2, "the probe");
    requests(&mut e, &mut h, 13, &["d"]);
    assert_eq!(h.sent.len(), 2, "no second call while the probe is out");
    assert_eq!(h.status_of(13), Some(503));
    deliver(&mut e, &mut h, 2, 200, &answer(true, 19, 0, 100, 1));
    assert!(!rec.breaker.get(), "closed by the probe");
    assert_eq!(h.resumed, [12]);
}

#[test]
fn a_settlement_waiting_in_the_open_batch_is_handed_to_the_next_engine() {
    let usage = r#"{"name":"per-user","key":["header:x-user"],"rate":10,"burst":20,
        "usage":{"header":"x-used","flush_ms":10}}"#;
    let (mut e, _) = engine(BATCHED, usage);
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    // A flight out keeps the next ones open.
    send(&mut e, &mut h, 11, &user("b"));
    assert_eq!(h.sent.len(), 2);
    e.response_headers(&mut h, 10.into(), &resp(&[("x-used", "5")]));
    e.done(&mut h, 10.into());
    h.now += 10;
    e.tick(&mut h);
    assert_eq!(h.sent.len(), 2, "the settlement waits in the open batch");
    let pending = e.hand_over(&mut h, true);
    assert!(!pending.is_empty());
    let (mut next, _) = engine(BATCHED, usage);
    next.adopt(&mut h, pending);
    assert_eq!(h.sent.len(), 3, "the next engine sends it");
    assert!(h.sent[2].ends_with("/0/0/0/4"), "{}", h.sent[2]);
}

#[test]
fn a_reservation_answering_a_handed_over_call_settles_its_charge_once() {
    // A check of a rule that reserves carries the key's pending charge; its flight is out when
    // the engine is replaced. The next engine gets the answer: a reservation, the script's
    // answer to what was sent. The charge was applied: it is not pending again.
    let usage = r#"{"name":"per-user","key":["header:x-user"],"rate":10,"burst":20,
        "max_wait_ms":500,"usage":{"header":"x-used","flush_ms":10}}"#;
    let (mut e, _) = engine(BATCHED, usage);
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    e.response_headers(&mut h, 10.into(), &resp(&[("x-used", "5")]));
    e.done(&mut h, 10.into());
    send(&mut e, &mut h, 11, &user("a"));
    assert_eq!(h.sent.len(), 2);
    assert!(
        h.sent[1].contains("/4%3A0%3A0%3A0"),
        "it carries the charge: {}",
        h.sent[1]
    );
    let pending = e.hand_over(&mut h, true);
    let (mut next, rec) = engine(BATCHED, usage);
    next.adopt(&mut h, pending);
    deliver(&mut next, &mut h, 2, 200, &answer(true, 0, 100, 1000, 1));
    assert_eq!(
        rec.get(0, Counter::BackendErrors),
        0,
        "the script's own answer"
    );
    h.now += 10;
    next.tick(&mut h);
    assert_eq!(h.sent.len(), 2, "the charge went once: {:?}", &h.sent[2..]);
}

#[test]
fn a_flight_of_tracked_calls_holds_at_most_max_batch_bytes() {
    // A flood of new keys of a usage rule, whose takes may be refunded: each call goes in the
    // tracked form, which it gets as it joins the open batch. Whatever the keys' length, no
    // flight carries more than MAX_BATCH_BYTES of groups: the room a call needs is the room it
    // takes.
    let rule = r#"{"name":"u","key":["header:x-user"],"rate":10,"burst":20,
        "usage":{"header":"x-used","flush_ms":10}}"#;
    let bound = crate::backend::MAX_BATCH_BYTES;
    let mut by_bytes = 0;
    for len in 1..=64 {
        let top = format!(
            r#""key_prefix":"{}","backend":{{"batch_max_keys":256}},"#,
            "p".repeat(len)
        );
        let (mut e, _) = engine(&top, rule);
        let mut h = Fake::default();
        send(&mut e, &mut h, 1, &user("u0000"));
        // What one call adds to a batched command, read off its single form
        // `EVALSHA/<sha>/1/<key>/<args>`: its key's and arguments' segments, and its count's.
        let segs: Vec<&str> = h.sent[0].split('/').collect();
        let count = segs.len() - 4;
        let group =
            segs[3..].iter().map(|s| 1 + s.len()).sum::<usize>() + 1 + count.to_string().len();
        for i in 1..400u32 {
            send(&mut e, &mut h, 1 + i, &user(&format!("u{i:04}")));
        }
        for body in &h.sent[1..] {
            let n = keys_in(body);
            assert!(
                n * group <= bound,
                "key_prefix of {len}: a flight of {n} calls of {group} bytes, {} in all",
                n * group
            );
            by_bytes += usize::from(n < 256);
        }
    }
    assert!(by_bytes > 0, "the bytes bound the flights");
}

const CROSSSLOT: &[u8] =
    br#"{"EVALSHA":[false,"CROSSSLOT Keys in request don't hash to the same slot"]}"#;

#[test]
fn a_cluster_refusing_a_flight_for_its_slots_is_learnt_and_the_checks_go_again_per_slot() {
    let (mut e, rec, mut h) = two_in_flight_2(BATCHED);
    deliver(&mut e, &mut h, 2, 200, CROSSSLOT);
    let again: Vec<usize> = h.sent[2..].iter().map(|b| keys_in(b)).collect();
    assert_eq!(again, [1, 1], "one slot per flight");
    assert_eq!(rec.get(0, Counter::BackendErrors), 0, "not an error");
    assert!(h.responded.is_empty());
    deliver(&mut e, &mut h, 3, 200, &answer(true, 19, 0, 100, 1));
    deliver(&mut e, &mut h, 4, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(h.resumed, [10, 11, 12]);
    // Another worker of the proxy knows it without a refusal of its own.
    let (mut other, _) = engine(BATCHED, EXACT);
    let mut h2 = Fake::sharing(h.store.clone());
    send(&mut other, &mut h2, 20, &user("x"));
    requests(&mut other, &mut h2, 21, &["y", "z"]);
    deliver(&mut other, &mut h2, 1, 200, &answer(true, 19, 0, 100, 1));
    let sizes: Vec<usize> = h2.sent.iter().map(|b| keys_in(b)).collect();
    assert_eq!(sizes, [1, 1, 1]);
}

#[test]
fn a_flight_failed_by_one_nodes_error_goes_again_key_by_key() {
    let (mut e, rec, mut h) = two_in_flight_2(CLOSED);
    deliver(
        &mut e,
        &mut h,
        2,
        200,
        br#"{"EVALSHA":[false,"no upstream host"]}"#,
    );
    assert_eq!(h.sent.len(), 4, "each alone");
    deliver(
        &mut e,
        &mut h,
        3,
        200,
        br#"{"EVALSHA":[false,"no upstream host"]}"#,
    );
    deliver(&mut e, &mut h, 4, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(h.status_of(11), Some(503), "its node is gone");
    assert_eq!(h.resumed, [10, 12], "the other key's node answered");
    assert_eq!(rec.get(0, Counter::BackendErrors), 1);
}

/// An engine whose breaker opened on flight 1 (`breaker_failures` 1, `failure_mode` closed) and
/// whose probe after the cool-off, flight 2, carries request 11's two rules (two keys, two
/// Redis Cluster slots).
pub(super) fn probe_of_two_rules() -> (Engine, Rc<Recorder>, Fake) {
    let top = r#""failure_mode":"closed","backend":{"batch_max_keys":32,"breaker_failures":1,
        "breaker_cooloff_ms":500},"#;
    let second = r#"{"name":"per-path","key":["path"],"rate":10,"burst":20}"#;
    let (mut e, rec) = engine(top, &format!("{EXACT},{second}"));
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("a"));
    deliver(&mut e, &mut h, 1, 0, b"");
    assert!(rec.breaker.get());
    h.now = 500;
    send(&mut e, &mut h, 11, &user("b"));
    assert_eq!(keys_in(&h.sent[1]), 2, "the probe carries both rules");
    (e, rec, h)
}

#[test]
fn a_probe_flight_with_one_keys_error_closes_the_breaker() {
    let (mut e, rec, mut h) = probe_of_two_rules();
    let b = batch_answer(&["-1,13,0,0,0,0".to_string(), part(true, 7, 0)]);
    deliver(&mut e, &mut h, 2, 200, &b);
    assert!(!rec.breaker.get(), "the backend answered: closed");
    assert_eq!(
        h.status_of(11),
        Some(503),
        "the key's own error: its failure mode"
    );
}

/// A flood of new keys: eight requests arrive while each flight is out and leave in the next, for
/// a profiler (see `profile_local_path`).
#[test]
#[ignore]
fn profile_flood_exact() {
    let top = r#""response_headers":"ietf","backend":{"batch_max_keys":32},"#;
    let (mut e, _rec) = engine(top, EXACT);
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("first"));
    let mut ctx = 11u32;
    let mut out: Vec<u32> = vec![10];
    let parts: Vec<String> = (0..8).map(|_| part(true, 19, 0)).collect();
    let b = batch_answer(&parts);
    let one = answer(true, 19, 0, 100, 1);
    for round in 0..40_000u32 {
        let mut batch = Vec::new();
        for _ in 0..8 {
            send(&mut e, &mut h, ctx, &user(&format!("user-{ctx}")));
            batch.push(ctx);
            ctx += 1;
        }
        let body = if out.len() == 1 { &one } else { &b };
        let token = h.tokens()[0];
        deliver(&mut e, &mut h, token, 200, body);
        for c in out.drain(..) {
            e.response_headers(&mut h, c.into(), &resp(&[]));
            e.done(&mut h, c.into());
        }
        out = batch;
        h.now = u64::from(round);
        h.resumed.clear();
        h.added.clear();
        h.sent.clear();
    }
}
