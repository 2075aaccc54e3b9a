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

/// The bytes the calls of the batched Webdis command `body` add up to, each as
/// [`group_bytes`](crate::backend::Transport::group_bytes) counts it: `/<key>`, `/<count>` and
/// `/<arg>` for each of its arguments (a count `0` stands for the previous call's arguments).
fn group_bytes_of(body: &str) -> usize {
    let segs: Vec<&str> = body.split('/').collect();
    let n: usize = segs[2].parse().unwrap();
    let (keys, rest) = segs[3..].split_at(n);
    assert_eq!(rest[0], "batch");
    let (mut at, mut args): (usize, &[&str]) = (1, &[]);
    let mut bytes = 0;
    for key in keys {
        if rest[at] != "0" {
            let count: usize = rest[at].parse().unwrap();
            args = &rest[at + 1..at + 1 + count];
            at += count;
        }
        at += 1;
        bytes += 1 + key.len() + args.iter().map(|a| 1 + a.len()).sum::<usize>();
        bytes += 1 + args.len().to_string().len();
    }
    bytes
}

#[test]
fn a_probe_on_a_cluster_leaves_the_open_batch_within_max_batch_bytes() {
    // The breaker's cool-off ends while this worker's flight is out (another worker opened it),
    // so checks gather in the open batch: one of a short rule, then many of one key of a long
    // rule (one slot; a cost above 1 shares no call). The check that finds no room sends the
    // batch out as the probe, which on a Redis Cluster carries one slot, the first: the other
    // slot's calls wait in the open batch. The check that found no room must find room next to
    // them, or the next flight of that slot passes MAX_BATCH_BYTES.
    let long = "l".repeat(64);
    let top = r#""failure_mode":"closed","backend":{"batch_max_keys":256,"breaker_failures":1,
        "breaker_cooloff_ms":500},"#;
    let rule = |name: &str, prefix: &str| {
        format!(
            r#"{{"name":"{name}","match":{{"path_prefix":"{prefix}"}},"key":["header:x-user"],
            "rate":10,"burst":100,"cost_header":"x-cost"}}"#
        )
    };
    let rules = format!("{},{}", rule("s", "/s/"), rule(&long, "/l/"));
    let hot = |cost: &str| req("/l/x", &[("x-user", "hot"), ("x-cost", cost)]);
    let bound = crate::backend::MAX_BATCH_BYTES;
    let mut past = Vec::new();
    // `wider`: how many of the hot key's calls carry a cost of two digits (a byte more each),
    // which moves where the open batch stops short of the bound.
    for wider in 0..150 {
        let (mut e, _) = engine(top, &rules);
        let mut h = Fake::default();
        cluster_known(&e, &h);
        send(&mut e, &mut h, 1, &req("/s/x", &[("x-user", "first")]));
        let (mut other, other_rec) = engine(top, &rules);
        let mut h2 = Fake::sharing(h.store.clone());
        send(&mut other, &mut h2, 1, &req("/s/x", &[("x-user", "other")]));
        deliver(&mut other, &mut h2, 1, 0, b"");
        assert!(other_rec.breaker.get());
        h.now = 500;
        send(&mut e, &mut h, 2, &req("/s/x", &[("x-user", "small")]));
        let mut ctx = 3;
        while h.sent.len() == 1 {
            let cost = if ctx - 3 < wider { "10" } else { "2" };
            send(&mut e, &mut h, ctx, &hot(cost));
            ctx += 1;
        }
        assert!(ctx < 3 + 200);
        let mut rounds = 0;
        while let Some(token) = h.tokens().first().copied() {
            rounds += 1;
            assert!(rounds < 100);
            let n = keys_in(&h.out[&token].body);
            let parts: Vec<String> = (0..n).map(|_| super::batch::part(true, 19, 0)).collect();
            let body = match n {
                1 => answer(true, 19, 0, 100, 1),
                _ => super::batch::batch_answer(&parts),
            };
            deliver(&mut e, &mut h, token, 200, &body);
        }
        let answered = h.resumed.len() + h.responded.len();
        assert_eq!(answered, ctx as usize - 1, "every request is answered");
        past.extend(
            h.sent
                .iter()
                .filter(|b| keys_in(b) > 1)
                .map(|b| group_bytes_of(b))
                .filter(|bytes| *bytes > bound)
                .map(|bytes| format!("{wider} wider: a flight of {bytes} bytes")),
        );
    }
    assert!(past.is_empty(), "flights past {bound} bytes: {past:?}");
}
