//! Flights under attack: a hostile or confused backend answering a flight, and the breaker's
//! probe, must not leave a check waiting forever, send more than one probe, or let one key's
//! answer decide another's.

use super::*;
use crate::shared::Store;

const BATCHED: &str = r#""failure_mode":"closed","backend":{"batch_max_keys":32},"#;

const CROSSSLOT: &[u8] =
    br#"{"EVALSHA":[false,"CROSSSLOT Keys in request don't hash to the same slot"]}"#;

/// How many script calls the backend request `body` carries (1 for the single form).
fn keys_in(body: &str) -> usize {
    body.split('/').nth(2).unwrap().parse().unwrap()
}

fn costly(u: &str, cost: &str) -> Req {
    req("/api/x", &[("x-user", u), ("x-cost", cost)])
}

/// Marks the proxy's backend as a Redis Cluster, as a worker that learnt it does.
fn cluster_known(e: &Engine, h: &Fake) {
    let key = [e.plugin().ns.as_str(), "|redis_cluster"].concat();
    h.store.set(&key, b"1", 0).unwrap();
}

#[test]
fn a_backend_refusing_one_slots_flight_for_its_slots_does_not_resend_it_forever() {
    // Two checks of one key that cannot share a call (cost 2) ride in one flight: one slot, which
    // a Redis Cluster never refuses with CROSSSLOT. A front that does anyway must not get the same
    // flight again and again while the requests wait.
    let (mut e, rec) = engine(BATCHED, EXACT);
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("z"));
    send(&mut e, &mut h, 11, &costly("a", "2"));
    send(&mut e, &mut h, 12, &costly("a", "2"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(keys_in(&h.sent[1]), 2);
    let mut rounds = 0;
    while let Some(token) = h.tokens().first().copied() {
        rounds += 1;
        if rounds > 10 {
            break;
        }
        deliver(&mut e, &mut h, token, 200, CROSSSLOT);
    }
    let sizes: Vec<usize> = h.sent.iter().map(|b| keys_in(b)).collect();
    assert!(
        h.out.is_empty(),
        "still resending after {rounds} refusals: flights {sizes:?}"
    );
    assert_eq!(sizes, [1, 2, 1, 1], "once more, each key alone");
    assert_eq!(h.status_of(11), Some(503), "the failure mode");
    assert_eq!(h.status_of(12), Some(503));
    assert_eq!(rec.get(0, Counter::BackendErrors), 2);
    assert_eq!(e.load().1, 0, "no flight left out");
}

#[test]
fn a_refusal_for_slots_after_the_cluster_is_known_sends_each_key_alone() {
    // The flag says Cluster already (another worker learnt it): the flight carries one slot, and a
    // refusal of it is not answered by the same flight again.
    let (mut e, _) = engine(BATCHED, EXACT);
    let mut h = Fake::default();
    cluster_known(&e, &h);
    send(&mut e, &mut h, 10, &user("z"));
    send(&mut e, &mut h, 11, &costly("a", "2"));
    send(&mut e, &mut h, 12, &costly("a", "3"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(keys_in(&h.sent[1]), 2, "one slot, one flight");
    deliver(&mut e, &mut h, 2, 200, CROSSSLOT);
    let sizes: Vec<usize> = h.sent.iter().map(|b| keys_in(b)).collect();
    assert_eq!(sizes, [1, 2, 1, 1]);
    deliver(&mut e, &mut h, 3, 200, &answer(true, 17, 0, 100, 2));
    deliver(&mut e, &mut h, 4, 200, &answer(true, 14, 0, 100, 3));
    assert_eq!(h.resumed, [10, 11, 12]);
}

#[test]
fn a_half_open_breaker_lets_one_flight_probe_before_a_cluster_too() {
    // Before a Redis Cluster the open batch leaves as one flight per slot; after the cool-off the
    // breaker lets exactly one call probe, so one flight goes and the others wait for its answer.
    let top = r#""failure_mode":"closed","backend":{"batch_max_keys":32,"breaker_failures":1,
        "breaker_cooloff_ms":500},"#;
    let second = r#"{"name":"per-path","key":["path"],"rate":10,"burst":20}"#;
    let (mut e, rec) = engine(top, &format!("{EXACT},{second}"));
    let mut h = Fake::default();
    cluster_known(&e, &h);
    // A request's two rules: two keys of two slots, two flights.
    send(&mut e, &mut h, 10, &user("a"));
    assert_eq!(h.tokens(), [1, 2]);
    deliver(&mut e, &mut h, 1, 0, b"");
    deliver(&mut e, &mut h, 2, 0, b"");
    assert!(rec.breaker.get());
    assert_eq!(h.status_of(10), Some(503));
    h.now = 500;
    send(&mut e, &mut h, 11, &user("b"));
    assert_eq!(
        h.out.len(),
        1,
        "one probe flight, not one per slot: {:?}",
        &h.sent[2..]
    );
    let probe = h.tokens()[0];
    deliver(&mut e, &mut h, probe, 200, &answer(true, 19, 0, 100, 1));
    assert!(!rec.breaker.get(), "closed by the probe");
    assert_eq!(
        h.out.len(),
        1,
        "the other slot's check goes after the probe's answer"
    );
    let next = h.tokens()[0];
    deliver(&mut e, &mut h, next, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(h.resumed, [11]);
    assert_eq!(e.load().1, 0, "no flight left out");
}

#[test]
fn a_box_claimed_for_a_group_without_a_penalty_fails_only_that_check() {
    // A penalty rule and a plain rule in one flight: the plain group's 6th integer says "boxed".
    // That is not its answer (it sent no penalty): its check gets the failure mode, and no box is
    // cached for its key; the penalty group is decided by its own part.
    let boxed = r#"{"name":"login","key":["header:x-user"],"rate":10,"burst":2,
        "penalty":{"ms":[120000,300000],"window_ms":3600000}}"#;
    let (mut e, rec) = engine(BATCHED, &format!("{EXACT},{boxed}"));
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &user("a"));
    assert_eq!(keys_in(&h.sent[0]), 2);
    let b = br#"{"EVALSHA":[0,0,120000,1000,0,1,1,1,0,1000,1,0]}"#;
    deliver(&mut e, &mut h, 1, 200, b);
    assert_eq!(h.status_of(10), Some(503), "closed: the failure mode");
    assert_eq!(rec.get(0, Counter::BackendErrors), 1);
    assert_eq!(rec.get(1, Counter::BackendErrors), 0);
    assert_eq!(
        rec.get(0, Counter::Penalized) + rec.get(0, Counter::PenaltyOffences),
        0
    );
    // The key was not boxed: its next request goes to the backend again.
    send(&mut e, &mut h, 11, &user("a"));
    assert_eq!(h.sent.len(), 2, "asked again, not answered from a box");
}

#[test]
fn a_flight_that_goes_again_apart_stays_home_while_the_breaker_is_open() {
    // Flight 2 ("b" and "c") is out when flight 1's failure opens the breaker; then a Redis
    // Cluster or its front answers flight 2 with an error that sends its calls again apart. The
    // breaker is open: no call goes out, each check gets its failure mode now.
    let top = r#""failure_mode":"closed","backend":{"batch_max_keys":2,"breaker_failures":1,
        "breaker_cooloff_ms":60000},"#;
    for error in [
        "MOVED 866 127.0.0.1:7001",
        "upstream failure",
        "CROSSSLOT Keys in request don't hash to the same slot",
    ] {
        let (mut e, rec) = engine(top, EXACT);
        let mut h = Fake::default();
        send(&mut e, &mut h, 10, &user("a"));
        send(&mut e, &mut h, 11, &user("b"));
        send(&mut e, &mut h, 12, &user("c"));
        assert_eq!(h.tokens(), [1, 2], "{error}");
        assert_eq!(keys_in(&h.sent[1]), 2);
        deliver(&mut e, &mut h, 1, 0, b"");
        assert!(rec.breaker.get(), "flight 1's failure opens it");
        let failed = format!(r#"{{"EVALSHA":[false,"{error}"]}}"#);
        deliver(&mut e, &mut h, 2, 200, failed.as_bytes());
        assert_eq!(
            h.sent.len(),
            2,
            "{error}: calls went out while the breaker is open: {:?}",
            &h.sent[2..]
        );
        assert_eq!(h.status_of(11), Some(503), "{error}");
        assert_eq!(h.status_of(12), Some(503), "{error}");
        assert_eq!(e.load().1, 0, "{error}: no flight out");
    }
}

#[test]
fn a_probe_refused_for_its_slots_is_still_the_only_flight_while_half_open() {
    // The probe after the cool-off carries a request's two rules, two slots, and a Redis Cluster
    // refuses it for them. The breaker is still half-open: its calls do not go out as a flight
    // per slot, all at once; they get their failure mode. The Cluster is learnt, so the next
    // probe carries one slot, and its answer closes the breaker.
    let (mut e, rec, mut h) = super::batch::probe_of_two_rules();
    deliver(&mut e, &mut h, 2, 200, CROSSSLOT);
    assert!(
        h.out.len() <= 1,
        "one probe flight at a time, not one per slot: {:?}",
        &h.sent[2..]
    );
    assert_eq!(h.status_of(11), Some(503));
    h.now = 1000;
    send(&mut e, &mut h, 12, &user("c"));
    assert_eq!(h.out.len(), 1, "the next probe carries one slot");
    let probe = h.tokens()[0];
    deliver(&mut e, &mut h, probe, 200, &answer(true, 19, 0, 100, 1));
    assert!(!rec.breaker.get(), "closed by the probe");
    let next = h.tokens()[0];
    deliver(&mut e, &mut h, next, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(h.resumed, [12]);
    assert_eq!(e.load().1, 0, "no flight left out");
}
