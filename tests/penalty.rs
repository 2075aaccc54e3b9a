//! The penalty box end to end: two real Envoys sharing one Webdis and Redis. A client that goes
//! over at proxy A is refused at proxy B too, for the penalty's time and not the bucket's, with a
//! Retry-After that says so; a second offence within the window gets the longer duration.
//! No timing assertions: what is asserted is Retry-After values (exact where the script gives the
//! duration itself) and denials; waits are polls.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::time::Duration;

use common::{Envoy, Resp, Stack};

/// Two rules of the same shape (burst 2, a token a second) on two paths, keyed by the same
/// header: `login` with a penalty of 4 s, then 8 s within a minute; `plain` without one, the
/// control that shows when a bucket of that shape admits again.
const CONFIG: &str = r#"{
  "backend": { "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 2000 },
  "rules": [
    { "name": "login", "match": { "path_prefix": "/login" }, "key": ["header:x-user"],
      "rate": 1, "period_ms": 1000, "burst": 2,
      "penalty": { "ms": [4000, 8000], "window_ms": 60000 } },
    { "name": "plain", "match": { "path_prefix": "/plain" }, "key": ["header:x-user"],
      "rate": 1, "period_ms": 1000, "burst": 2 }
  ]
}"#;

fn retry_after(r: &Resp) -> u64 {
    r.header("retry-after")
        .unwrap_or_else(|| panic!("no retry-after: {r:?}"))
        .parse()
        .unwrap()
}

/// Sends `path` for `user` at `port` until one is refused; returns that answer and how many were
/// admitted before it.
fn until_refused(port: u16, path: &str, user: &str) -> (Resp, usize) {
    for admitted in 0..10 {
        let r = common::get(port, path, &[("x-user", user)]);
        if r.status != 200 {
            return (r, admitted);
        }
    }
    panic!("{path} for {user}: never refused");
}

#[test]
fn a_client_over_at_one_proxy_is_boxed_at_every_proxy_longer_when_it_offends_again() {
    let stack = Stack::start("penalty-a", CONFIG);
    let dir_b = common::scratch_dir("penalty-b");
    let b = Envoy::start(&dir_b, CONFIG, stack.webdis.port);
    let (pa, pb) = (stack.port(), b.listen_port);
    let logs = || format!("{}\n{}", stack.logs(), b.log_text());

    // The first offence at A: the bucket's two tokens, then a denial that boxes the key for 4 s.
    // Its Retry-After is the box's (the bucket alone would say 1 s: a token a second).
    let (plain, _) = until_refused(pa, "/plain", "eve");
    assert_eq!(retry_after(&plain), 1, "the bucket alone: {plain:?}");
    let (r, admitted) = until_refused(pa, "/login", "eve");
    assert_eq!(admitted, 2, "the burst first\n{}", logs());
    assert_eq!(r.status, 429, "{r:?}\n{}", logs());
    assert_eq!(retry_after(&r), 4, "{r:?}");
    assert_eq!(r.header("ratelimit"), Some("\"login\";r=0;t=4"), "{r:?}");

    // At B, once a bucket of the same shape admits again (the control rule, drained at the same
    // time, polled), the boxed client is still refused, and told so: more than a bucket's 1 s.
    assert!(
        common::wait_until(Duration::from_secs(3), || {
            common::get(pb, "/plain", &[("x-user", "eve")]).status == 200
        }),
        "the control bucket never admitted again\n{}",
        logs()
    );
    let r = common::get(pb, "/login", &[("x-user", "eve")]);
    assert_eq!(r.status, 429, "boxed at B too: {r:?}\n{}", logs());
    let left = retry_after(&r);
    eprintln!(
        "offence 1 at A: 429, retry-after 4; at B once the control refilled: {} retry-after {left}",
        r.status
    );
    assert!(
        (2..=4).contains(&left),
        "the box's time left, not the bucket's: {r:?}"
    );
    // B learned the box from Redis: its next refusal is its deny cache's, counted as penalized.
    let r = common::get(pb, "/login", &[("x-user", "eve")]);
    assert_eq!(r.status, 429, "{r:?}");
    let penalized = b.stat_eventually("wasmcustom.tollgate.login.penalized", |v| v >= Some(2));
    assert!(penalized >= Some(2), "{penalized:?}\n{}", b.stats());
    // Another client of the same rule is not boxed.
    assert_eq!(common::get(pb, "/login", &[("x-user", "bob")]).status, 200);

    // Polling through the box is no new offence (a boxed denial never extends it): A admits
    // again once the box has ended.
    assert!(
        common::wait_until(Duration::from_secs(12), || {
            common::get(pa, "/login", &[("x-user", "eve")]).status == 200
        }),
        "the box never ended\n{}",
        logs()
    );
    // The second offence within the window: 8 s.
    let (r, _) = until_refused(pa, "/login", "eve");
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(retry_after(&r), 8, "the longer duration: {r:?}");
    let r = common::get(pb, "/login", &[("x-user", "eve")]);
    assert_eq!(r.status, 429, "{r:?}");
    let left = retry_after(&r);
    eprintln!(
        "offence 2 at A: 429, retry-after 8; at B: {} retry-after {left}",
        r.status
    );
    assert!(
        (5..=8).contains(&left),
        "boxed at B for the longer time: {r:?}"
    );

    // Redis holds the box for every proxy: two offences on record.
    let mut conn = stack.redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tollgate:{login:*")
        .query(&mut conn)
        .unwrap();
    let counts: Vec<Option<u64>> = keys
        .iter()
        .map(|k| redis::cmd("HGET").arg(k).arg("c").query(&mut conn).unwrap())
        .collect();
    assert!(counts.contains(&Some(2)), "{keys:?}: {counts:?}");
    let offences = stack
        .envoy
        .stat_eventually("wasmcustom.tollgate.login.penalty_offences", |v| {
            v >= Some(2)
        });
    assert_eq!(offences, Some(2), "{}", stack.envoy.stats());
    eprintln!("redis c = {counts:?}; A penalty_offences {offences:?}; B penalized {penalized:?}");
}
