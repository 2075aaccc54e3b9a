//! Lease mode on a key the proxy is quiet on: it holds none of the key and has had no other
//! request of it within about a lease's life, so a request is checked exactly (one call for its
//! cost, no holder named) instead of leasing; a second request soon after leases again, and so
//! does every request while the key was short of tokens lately (its holders are served in turns
//! there). The first request of a key leases: the proxy knows nothing of the key yet.

use super::*;

/// A proxy that leased `a` at 1000 (one token, spent at once; the bucket holds `remaining`),
/// and whose lease has long expired by `later`.
fn leased_once(remaining: u64) -> (Engine, Fake) {
    let (mut e, _) = engine("", LEASE);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    assert!(is_lease_call(&h.sent[0], 1, 1), "{}", h.sent[0]);
    deliver(&mut e, &mut h, 1, 200, &answer(true, remaining, 0, 100, 1));
    assert_eq!(h.resumed, [10]);
    (e, h)
}

#[test]
fn a_quiet_proxy_checks_exactly_then_leases_when_its_requests_come_closer() {
    let (mut e, mut h) = leased_once(40);
    // Five seconds later: the lease expired, and no other request came since.
    h.now = 6000;
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(h.sent.len(), 2);
    assert!(is_exact_check(&h.sent[1]), "exact: {}", h.sent[1]);
    deliver(&mut e, &mut h, 2, 200, &answer(true, 39, 0, 100, 1));
    assert_eq!(h.resumed, [10, 11]);
    // A second request within a lease's life: the proxy leases again.
    h.now = 6100;
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(h.sent.len(), 3);
    assert!(!is_exact_check(&h.sent[2]), "a lease call: {}", h.sent[2]);
    let lease = h.sent[2].rsplit('/').nth(2).unwrap().to_string();
    assert!(lease.split("%3A").count() >= 6, "names a holder: {lease}");
}

#[test]
fn a_key_short_of_tokens_lately_is_leased_not_checked_exactly() {
    // The lease call's answer left the bucket empty: the proxy keeps leasing the key.
    let (mut e, mut h) = leased_once(0);
    h.now = 6000;
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert!(is_lease_call(&h.sent[1], 1, 1), "{}", h.sent[1]);
    deliver(&mut e, &mut h, 2, 200, &answer(true, 30, 0, 100, 1));
    // Quiet again (the last answer left plenty), but an exact check that emptied the bucket
    // sends the next request, long after, to a lease call again.
    h.now = 12_000;
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert!(is_exact_check(&h.sent[2]), "{}", h.sent[2]);
    deliver(&mut e, &mut h, 3, 200, &answer(true, 0, 0, 100, 1));
    h.now = 14_000;
    e.request_headers(&mut h, 13.into(), &user("a"));
    assert!(is_lease_call(&h.sent[3], 1, 1), "{}", h.sent[3]);
}
