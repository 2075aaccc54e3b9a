//! A lease waiter's patience bounds its wait for its key's lease call, and ends with that wait: a
//! waiter sent on to an exact call of its own (its proxy has no lease slot for the key, or shared
//! data is failing, or it is quiet on the key) is bounded by that call's timeout from then on, as
//! any exact check is, and its answer is the one the request gets. A waiter that first waited on
//! another worker's lease call is patient from the send of its own worker's call, whose answer or
//! timeout decides it; and however often its worker's call goes out, for twice its patience at
//! most.

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

#[test]
fn a_waiter_riding_its_own_workers_lease_call_is_not_failed_by_its_arrival_patience() {
    let closed = r#""failure_mode":"closed","backend":{"timeout_ms":100},"#;
    let ((mut w1, _), (mut w2, _)) = (engine(closed, LEASE), engine(closed, LEASE));
    let mut h = Fake::at(1000);
    // Worker 1's lease call for key a goes out at 1000; worker 2's request of a waits on it,
    // patient until 1200 (two timeouts).
    w1.request_headers(&mut h, 10.into(), &user("a"));
    w2.request_headers(&mut h, 20.into(), &user("a"));
    assert_eq!(h.sent.len(), 1, "one lease call per key per proxy");
    assert_eq!(w2.load().2, 1, "20 waits on worker 1's call");
    // Worker 1's call times out at 1100: its own waiter gets the failure mode, and its claim
    // is released.
    h.now = 1100;
    deliver(&mut w1, &mut h, 1, 0, b"");
    assert_eq!(h.status_of(10), Some(503), "worker 1's own waiter: closed");
    // Worker 2's tick finds the key free at 1101 and sends a lease call of its own, out until
    // 1201 at the latest.
    h.now = 1101;
    w2.tick(&mut h);
    assert_eq!(h.sent.len(), 2);
    assert!(is_lease_call(&h.sent[1], 1, asked(&h, 2)), "{}", h.sent[1]);
    assert_eq!(w2.load(), (1, 1, 1), "20 waits on worker 2's own call");
    // Past 20's first patience deadline, within its own worker's call's timeout: nothing fails
    // it; the call's answer or timeout will.
    h.now = 1200;
    w2.tick(&mut h);
    assert_eq!(
        h.status_of(20),
        None,
        "failed while its worker's call is out"
    );
    assert!(
        !h.resumed.contains(&20),
        "decided while its worker's call is out"
    );
    assert_eq!(w2.load(), (1, 1, 1));
    // The answer serves it.
    let n = grant_all(&mut w2, &mut h, 2);
    assert!(n >= 1);
    assert_eq!(h.resumed, [20]);
    assert_eq!(h.status_of(20), None);
    assert_eq!(w2.load(), (1, 0, 0));
}

#[test]
fn calls_its_worker_sends_again_and_again_never_keep_a_waiter_past_twice_its_patience() {
    let closed = r#""failure_mode":"closed","backend":{"timeout_ms":100},"#;
    let ((mut w1, _), (mut w2, _)) = (engine(closed, LEASE), engine(closed, LEASE));
    let mut h = Fake::at(1000);
    // Requests 20 to 24 of worker 2 wait on worker 1's call of 1000, patient until 1200; it
    // times out at 1100, and worker 2 sends its own at 1101.
    w1.request_headers(&mut h, 10.into(), &user("a"));
    for ctx in 20..=24 {
        w2.request_headers(&mut h, ctx.into(), &user("a"));
    }
    h.now = 1100;
    deliver(&mut w1, &mut h, 1, 0, b"");
    h.now = 1101;
    w2.tick(&mut h);
    assert_eq!(h.tokens(), [2], "worker 2's own call");
    // Each answer grants one token: it serves the first waiter, and the call goes again for the
    // others.
    let mut token = 2;
    for (at, served) in [(1150, 20), (1199, 21), (1250, 22), (1300, 23)] {
        h.now = at;
        deliver(&mut w2, &mut h, token, 200, &answer(true, 40, 0, 300, 1));
        assert_eq!(h.resumed.last(), Some(&served));
        token += 1;
        assert_eq!(h.tokens(), [token], "sent again at {at}: {:?}", h.sent);
        let sent = &h.sent[token as usize - 1];
        assert!(!is_exact_check(sent), "a lease call: {sent}");
    }
    assert_eq!(w2.load(), (5, 1, 1), "24 waits on the call of 1300");
    // A call sent within 24's first patience (until 1200) is waited for from its send: the call
    // of 1199 until 1399. The calls of 1250 and 1300 came after that patience and extend
    // nothing: at 1399 24 has waited (about) twice its patience, its bound, and gets the
    // failure mode although the call of 1300 is still out.
    h.now = 1398;
    w2.tick(&mut h);
    assert_eq!(h.status_of(24), None);
    h.now = 1399;
    w2.tick(&mut h);
    assert_eq!(h.status_of(24), Some(503), "failed at twice its patience");
    assert_eq!(w2.load(), (4, 1, 0), "24 answered");
}
