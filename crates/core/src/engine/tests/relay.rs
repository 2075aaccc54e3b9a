//! Batching across a proxy's workers: while one worker (the collector) has a flight of its open
//! batch out, another worker's exact checks ride the collector's next flight instead of a flight
//! of their own, and come back as answers on its queue; each is decided by its own worker (its
//! rule, its failure mode); one the collector never answers gets its failure mode after its
//! patience, never a second call.

use super::batch::{batch_answer, part, BATCHED, CLOSED};
use super::*;
use crate::shared::collect::Collector;

/// The bucket keys a backend request carries (its key segments, still encoded).
fn keys_of(body: &str) -> usize {
    body.split('/').nth(2).unwrap().parse().unwrap()
}

/// Two workers of one proxy (queues 1 and 2), configured by `top`.
fn two(top: &str) -> (Worker, Worker, Fake) {
    let (mut w1, mut w2) = (engine(top, EXACT), engine(top, EXACT));
    let mut h = Fake::default();
    for (q, w) in [(1, &mut w1.0), (2, &mut w2.0)] {
        h.queues.insert(q, Default::default());
        w.set_queue(q);
    }
    (w1, w2, h)
}

/// [`two`], where worker 1 has a flight out (token 1, user "a", context 10) and collects (as it
/// does once checks gathered behind its flights: see the first test).
fn collecting(top: &str) -> (Worker, Worker, Fake) {
    let (mut w1, w2, mut h) = two(top);
    w1.0.request_headers(&mut h, 10.into(), &user("a"));
    ready(&mut w1.0, &mut h, 1);
    assert_eq!(h.sent.len(), 1);
    assert_eq!(
        Collector::new(&*h.store, &w1.0.plugin.ns).claim(1),
        Ok(true)
    );
    w1.0.collecting = true;
    (w1, w2, h)
}

#[test]
fn a_worker_collects_once_checks_gather_behind_its_flight_not_for_a_lone_check() {
    let ((mut w1, _), _, mut h) = two(BATCHED);
    w1.request_headers(&mut h, 10.into(), &user("a"));
    ready(&mut w1, &mut h, 1);
    assert_eq!(
        collector(&w1, &h),
        None,
        "a lone check on an idle worker writes nothing"
    );
    assert_eq!(h.store.writes(), 0);
    w1.request_headers(&mut h, 11.into(), &user("b"));
    deliver(&mut w1, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(h.sent.len(), 2, "b gathered behind flight 1");
    assert_eq!(collector(&w1, &h), Some(1));
    deliver(&mut w1, &mut h, 2, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(collector(&w1, &h), None, "no flight out: nobody collects");
}

fn collector(e: &Engine, h: &Fake) -> Option<u32> {
    Collector::new(&*h.store, &e.plugin.ns).get()
}

#[test]
fn another_workers_checks_ride_the_collectors_next_flight_and_are_decided_at_home() {
    let ((mut w1, rec1), (mut w2, rec2), mut h) = collecting(BATCHED);
    w2.request_headers(&mut h, 20.into(), &user("b"));
    w2.request_headers(&mut h, 21.into(), &user("c"));
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.sent.len(), 1, "worker 2 sent no flight of its own");
    ready(&mut w1, &mut h, 1);
    assert_eq!(h.sent.len(), 1, "they wait for worker 1's flight out");
    deliver(&mut w1, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(h.resumed, [10]);
    assert_eq!(h.sent.len(), 2, "the answer sends what gathered");
    assert_eq!(keys_of(&h.sent[1]), 2, "{}", h.sent[1]);
    let b = batch_answer(&[part(true, 19, 0), part(false, 0, 300)]);
    deliver(&mut w1, &mut h, 2, 200, &b);
    assert_eq!(h.resumed, [10], "worker 2's checks are decided by worker 2");
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.resumed, [10, 20]);
    assert_eq!(h.status_of(21), Some(429));
    assert_eq!(rec2.get(0, Counter::Allowed), 1);
    assert_eq!(rec2.get(0, Counter::Denied), 1);
    assert_eq!(
        rec1.get(0, Counter::BackendCalls),
        3,
        "counted once, by the worker that sent them"
    );
    assert_eq!(rec2.get(0, Counter::BackendCalls), 0);
    assert_eq!(rec2.get(0, Counter::Relayed), 2);
    assert_eq!(collector(&w1, &h), None, "no flight out: nobody collects");
    // Idle now: worker 2's next check leaves at the end of the round, in a flight of its own.
    w2.request_headers(&mut h, 22.into(), &user("d"));
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.sent.len(), 3);
    assert_eq!(collector(&w2, &h), None, "a lone check names no collector");
}

#[test]
fn a_relayed_check_whose_flight_fails_gets_its_own_workers_failure_mode() {
    let ((mut w1, _), (mut w2, rec2), mut h) = collecting(CLOSED);
    w2.request_headers(&mut h, 20.into(), &user("b"));
    ready(&mut w2, &mut h, 2);
    ready(&mut w1, &mut h, 1);
    deliver(&mut w1, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    deliver(&mut w1, &mut h, 2, 503, b"");
    assert!(h.responded.is_empty(), "decided at home");
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.status_of(20), Some(503), "failure_mode closed");
    assert_eq!(rec2.get(0, Counter::Allowed), 0);
}

#[test]
fn a_check_relayed_to_a_silent_collector_gets_its_failure_mode_and_the_collector_is_forgotten() {
    let ((_w1, _), (mut w2, _), mut h) = collecting(CLOSED);
    w2.request_headers(&mut h, 20.into(), &user("b"));
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.sent.len(), 1);
    // The collector's flight out and its own, each with a NOSCRIPT and two Cluster resends.
    let patience = 8 * w2.plugin.config.backend.timeout_ms;
    assert_eq!(h.tick, patience, "the tick watches the collector's answer");
    h.now += patience;
    w2.tick(&mut h);
    assert_eq!(
        h.status_of(20),
        Some(503),
        "its failure mode, not a second call"
    );
    assert_eq!(h.sent.len(), 1);
    assert_eq!(collector(&w2, &h), None, "the collector is forgotten");
    w2.request_headers(&mut h, 21.into(), &user("c"));
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.sent.len(), 2, "worker 2 sends its own flight");
}

#[test]
fn a_key_whose_relayed_call_is_out_queues_its_next_check_until_the_answer() {
    let ((mut w1, _), (mut w2, _), mut h) = collecting(BATCHED);
    w2.request_headers(&mut h, 20.into(), &user("b"));
    w2.request_headers(&mut h, 21.into(), &user("b"));
    ready(&mut w2, &mut h, 2);
    ready(&mut w1, &mut h, 1);
    deliver(&mut w1, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(keys_of(&h.sent[1]), 1, "one call for b: 21 waits behind it");
    deliver(&mut w1, &mut h, 2, 200, &answer(true, 18, 0, 100, 1));
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.resumed, [10, 20]);
    // 21 goes with the answer (the key's chain goes on): worker 1 collects no more, so in
    // worker 2's own flight.
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.sent.len(), 3);
    deliver(&mut w2, &mut h, 3, 200, &answer(true, 17, 0, 100, 1));
    assert_eq!(h.resumed, [10, 20, 21]);
}

#[test]
fn one_call_per_flight_relays_nothing() {
    let ((_w1, _), (mut w2, _), mut h) = collecting(r#""backend":{"batch_max_keys":1},"#);
    w2.request_headers(&mut h, 20.into(), &user("b"));
    assert_eq!(h.sent.len(), 2, "worker 2 sends its own call");
}

#[test]
fn an_engine_replaced_while_it_collects_is_forgotten_as_the_collector() {
    let ((mut w1, _), (_w2, _), mut h) = collecting(BATCHED);
    let pending = w1.hand_over(&mut h, true);
    let (mut next, _) = engine(BATCHED, EXACT);
    next.adopt(&mut h, pending);
    assert_eq!(collector(&next, &h), None);
}

// ----- found by review: a relayed check is handled as its own worker would handle it -----

#[test]
fn a_collector_at_max_inflight_does_not_take_a_relayed_check_and_its_worker_sends_it() {
    let top = r#""failure_mode":"closed","backend":{"batch_max_keys":32,"max_inflight":1},"#;
    let ((mut w1, _), (mut w2, rec2), mut h) = collecting(top);
    w2.request_headers(&mut h, 20.into(), &user("b"));
    ready(&mut w2, &mut h, 2);
    ready(&mut w1, &mut h, 1);
    ready(&mut w2, &mut h, 2);
    assert_eq!(
        h.status_of(20),
        None,
        "not the failure mode: worker 2 had room"
    );
    assert_eq!(h.sent.len(), 2, "worker 2 sent it in a flight of its own");
    deliver(&mut w2, &mut h, 2, 200, &answer(true, 5, 0, 100, 1));
    assert_eq!(h.resumed, [20]);
    assert_eq!(rec2.get(0, Counter::InflightRejected), 0);
}

#[test]
fn a_relayed_check_waits_out_the_collectors_slow_but_healthy_path() {
    // failure_mode open: giving up early would admit what Redis denies.
    let top = r#""failure_mode":"open","backend":{"batch_max_keys":32},"#;
    let ((mut w1, _), (mut w2, _), mut h) = collecting(top);
    let t = w1.plugin.config.backend.timeout_ms;
    w2.request_headers(&mut h, 20.into(), &user("b"));
    ready(&mut w2, &mut h, 2);
    ready(&mut w1, &mut h, 1);
    h.now = t - 1;
    deliver(&mut w1, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    h.now = 2 * t - 2;
    deliver(&mut w1, &mut h, 2, 200, NOSCRIPT);
    assert_eq!(h.sent.len(), 3, "sent again with the script");
    h.now = 3 * t - 3;
    w2.tick(&mut h);
    assert_eq!(h.resumed, [10], "20 still waits");
    assert_eq!(h.status_of(20), None);
    deliver(&mut w1, &mut h, 3, 200, &answer(false, 0, 300, 1000, 0));
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.status_of(20), Some(429), "Redis' denial");
}

#[test]
fn an_answer_meant_for_a_replaced_engine_decides_nothing_of_the_new_one() {
    let ((mut w1, _), (mut old, _), mut h) = collecting(BATCHED);
    old.request_headers(&mut h, 20.into(), &user("b"));
    ready(&mut old, &mut h, 2);
    let pending = old.hand_over(&mut h, true);
    // The root is configured again: a new engine with a new queue, numbering its asks afresh.
    let (mut new, _) = engine(BATCHED, EXACT);
    h.queues.insert(3, Default::default());
    new.set_queue(3);
    new.adopt(&mut h, pending);
    new.request_headers(&mut h, 30.into(), &user("c"));
    ready(&mut new, &mut h, 3);
    ready(&mut w1, &mut h, 1);
    deliver(&mut w1, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    let b = batch_answer(&[part(true, 19, 0), part(false, 0, 300)]);
    deliver(&mut w1, &mut h, 2, 200, &b);
    // Both queues come to the root, so to the new engine: b's answer (old queue) is dropped.
    ready(&mut new, &mut h, 2);
    ready(&mut new, &mut h, 3);
    assert_eq!(
        h.status_of(30),
        Some(429),
        "c's own answer: {:?}",
        h.resumed
    );
}

#[test]
fn a_relayed_check_of_a_rule_the_collector_lacks_is_sent_by_its_worker() {
    // A rollout: the relaying worker has a rule the collector's configuration has not.
    let two =
        format!(r#"{EXACT},{{"name":"per-user-2","key":["header:x-user"],"rate":5,"burst":5}}"#);
    let ((mut w1, _), _, mut h) = collecting(CLOSED);
    let (mut w2, _) = engine(CLOSED, &two);
    w2.set_queue(2);
    h.queues.insert(2, Default::default());
    w2.request_headers(&mut h, 20.into(), &user("b"));
    ready(&mut w2, &mut h, 2);
    ready(&mut w1, &mut h, 1);
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.status_of(20), None, "not the failure mode");
    let own = h.sent.last().unwrap();
    assert_eq!(
        keys_of(own),
        1,
        "its second rule's check, in worker 2's own flight: {own}"
    );
}

/// A collector replaced on its root: a relayed check in its flight is answered by the next engine
/// (the answer comes to the same root), one waiting in its open batch goes back to its worker. A
/// collector whose root is gone: the check in its flight may have run, and fails into its mode.
#[test]
fn relayed_checks_in_a_replaced_collector_are_answered_sent_by_their_workers_or_failed() {
    for same_root in [true, false] {
        let ((mut w1, _), (mut w2, _), mut h) = collecting(CLOSED);
        w2.request_headers(&mut h, 20.into(), &user("b"));
        ready(&mut w2, &mut h, 2);
        ready(&mut w1, &mut h, 1);
        deliver(&mut w1, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
        assert_eq!(h.sent.len(), 2, "b's call is out in worker 1's flight");
        w2.request_headers(&mut h, 21.into(), &user("c"));
        ready(&mut w2, &mut h, 2);
        ready(&mut w1, &mut h, 1);
        let pending = w1.hand_over(&mut h, same_root);
        let (mut next, _) = engine(CLOSED, EXACT);
        next.set_queue(1);
        next.adopt(&mut h, pending);
        ready(&mut w2, &mut h, 2);
        assert_eq!(h.status_of(21), None, "c never went out: worker 2 sends it");
        assert_eq!(h.sent.len(), 3);
        assert!(h.sent[2].contains(&keys_in_body(&w2, "c")), "{}", h.sent[2]);
        if same_root {
            assert_eq!(h.status_of(20), None, "its answer is still to come");
            deliver(&mut next, &mut h, 2, 200, &answer(true, 18, 0, 100, 1));
            ready(&mut w2, &mut h, 2);
            assert!(h.resumed.contains(&20), "admitted by Redis' answer");
        } else {
            assert_eq!(
                h.status_of(20),
                Some(503),
                "out when its root went: it may have run"
            );
        }
    }
}

/// The encoded bucket key of user `u` (as a backend request carries it).
fn keys_in_body(e: &Engine, u: &str) -> String {
    let mut out = Vec::new();
    crate::backend::webdis::encode_segment(lease_key(e, u).as_bytes(), &mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn answered_relays_leave_no_deadline_behind_for_their_patience() {
    // A long timeout: each relayed check's patience is eight of them.
    let ((mut w1, _), (mut w2, _), mut h) =
        collecting(r#""backend":{"batch_max_keys":32,"timeout_ms":60000},"#);
    for i in 0..2000u32 {
        w2.request_headers(&mut h, (1000 + i).into(), &user(&format!("u{i}")));
        ready(&mut w2, &mut h, 2);
        ready(&mut w1, &mut h, 1);
        let token = h.tokens()[0];
        let keys = keys_of(&h.out[&token].body);
        let reply = if keys > 1 {
            batch_answer(&vec![part(true, 19, 0); keys])
        } else {
            answer(true, 19, 0, 100, 1)
        };
        deliver(&mut w1, &mut h, token, 200, &reply);
        ready(&mut w2, &mut h, 2);
        ready(&mut w1, &mut h, 1);
    }
    let (waiting, deadlines) = w2.chains.sizes();
    assert!(waiting <= 2, "{waiting} relayed checks still waiting");
    assert!(deadlines <= 2 * waiting + 65, "{deadlines} deadlines kept");
}
