//! A lease waiter's patience bounds its wait for its key's lease call, and ends with that wait: a
//! waiter sent on to an exact call of its own (its proxy has no lease slot for the key, or shared
//! data is failing, or it is quiet on the key) is bounded by that call's timeout from then on, as
//! any exact check is, and its answer is the one the request gets.

use super::*;

#[test]
fn a_waiter_sent_on_to_an_exact_call_is_not_failed_by_its_old_patience() {
    let closed = r#""failure_mode":"closed","backend":{"timeout_ms":100},"#;
    let ((mut w1, _), (mut w2, _)) = (engine(closed, LEASE), engine(closed, LEASE));
    let mut h = Fake::at(1000);
    // Worker 1's lease call for key a goes out at 1000 (its claim holds the key until 1150);
    // worker 2's request of a waits on it, patient until 1200 (two timeouts).
    w1.request_headers(&mut h, 10.into(), &user("a"));
    assert_eq!(h.sent.len(), 1);
    w2.request_headers(&mut h, 20.into(), &user("a"));
    assert_eq!(h.sent.len(), 1, "one lease call per key per proxy");
    assert_eq!(w2.load().2, 1, "20 waits on worker 1's call");
    // Shared data starts failing; worker 1's call takes its whole timeout and times out, so its
    // claim cannot be released and stays until 1150.
    h.store.inject_conflicts.set(u32::MAX);
    h.now = 1100;
    deliver(&mut w1, &mut h, 1, 0, b"");
    assert_eq!(h.status_of(10), Some(503), "worker 1's own waiter: closed");
    h.now = 1149;
    w2.tick(&mut h);
    assert_eq!(h.sent.len(), 1, "the claim still holds the key");
    // At 1150 the claim is over: worker 2 cannot claim the key (shared data failing), so its
    // waiter goes to Redis in an exact call of its own, out until 1250 at the latest.
    h.now = 1150;
    w2.tick(&mut h);
    assert_eq!(h.sent.len(), 2);
    assert!(is_exact_check(&h.sent[1]), "{}", h.sent[1]);
    assert_eq!(
        w2.load(),
        (1, 1, 0),
        "20 waits on its exact call, not the lease"
    );
    assert_eq!(h.tick, 0, "no lease wait left to watch");
    // Past the old patience deadline, within the exact call's timeout: nothing fails the check.
    h.now = 1200;
    w2.tick(&mut h);
    assert_eq!(h.status_of(20), None, "failed while its exact call is out");
    assert!(
        !h.resumed.contains(&20),
        "decided while its exact call is out"
    );
    assert_eq!(w2.load(), (1, 1, 0));
    // The exact answer decides the request.
    h.now = 1240;
    deliver(&mut w2, &mut h, 2, 200, &answer(true, 30, 0, 100, 1));
    assert_eq!(h.resumed, [20]);
    assert_eq!(h.status_of(20), None);
}
