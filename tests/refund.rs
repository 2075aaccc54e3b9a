//! Refunds end to end: a quota and a cap per minute on one key, through real Envoy, Webdis and
//! Redis. A client hammers past the cap with concurrent requests; every request the cap refuses
//! gets back the quota's token it took, so the quota's bucket in Redis loses exactly what was
//! admitted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_e2e as common;

use common::{wait_until, Stack};

/// A prepaid quota of 1,000,000 that refills slowly (1000 per 30 days, counted in whole seconds:
/// no whole token comes back during the test, so every count below is exact), and a cap of 10 a
/// minute on `/api/`, both keyed on `x-api-key`.
const CONFIG: &str = r#"{
  "backend": { "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 2000 },
  "rules": [
    { "name": "quota", "key": ["header:x-api-key"],
      "rate": 1000, "period_ms": 2592000000, "burst": 1000000 },
    { "name": "per-minute", "match": { "path_prefix": "/api/" }, "key": ["header:x-api-key"],
      "rate": 10, "period_ms": 60000, "burst": 10 }
  ]
}"#;

const QUOTA: u64 = 1_000_000;

/// Whole tokens in rule `rule`'s one bucket in Redis (`u` over `p`).
fn stored_tokens(conn: &mut redis::Connection, rule: &str) -> Option<i64> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("tollgate:{{{rule}:*"))
        .query(conn)
        .unwrap();
    let key = keys.first()?;
    let (u, p): (i64, i64) = redis::cmd("HMGET")
        .arg(key)
        .arg(&["u", "p"])
        .query(conn)
        .unwrap();
    Some(u.div_euclid(p))
}

#[test]
fn hammering_past_the_cap_spends_only_what_was_admitted_of_the_quota() {
    let stack = Stack::start("refund-quota-cap", CONFIG);
    let (ok, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    // 8 clients at once, 25 requests each, as fast as the answers come.
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..25 {
                    let r = stack.get("/api/report", &[("x-api-key", "key-123")]);
                    match r.status {
                        200 => ok.fetch_add(1, Ordering::Relaxed),
                        429 => refused.fetch_add(1, Ordering::Relaxed),
                        other => panic!("{other}: {r:?}\n{}", stack.logs()),
                    };
                }
            });
        }
    });
    let (admitted, refused) = (ok.into_inner(), refused.into_inner());
    println!("hammer: {admitted} admitted, {refused} refused of 200");
    assert!(
        (10..=12).contains(&admitted),
        "the cap's 10, and its refill while the loop ran: {admitted}\n{}",
        stack.logs()
    );

    // Every quota admission of a request the cap refused comes back within a flush. At least
    // one: the cap's first denial came from Redis (the deny cache learns only from Redis), and the
    // quota's call for that request went out with it.
    let mut conn = stack.redis.conn();
    let want = QUOTA as i64 - admitted as i64;
    let settled = wait_until(Duration::from_secs(10), || {
        stored_tokens(&mut conn, "quota") == Some(want)
    });
    let envoy = &stack.envoy;
    let refunded = |v: Option<u64>| v.is_some_and(|n| n >= 1);
    let back = envoy.stat_eventually("wasmcustom.tollgate.quota.refunded_tokens", refunded);
    println!(
        "quota: {back:?} tokens refunded; left in Redis {:?}, want {want} (= 1,000,000 - admitted)",
        stored_tokens(&mut conn, "quota")
    );
    assert!(
        settled,
        "the quota lost only what was admitted: {:?} != {want}\n{}",
        stored_tokens(&mut conn, "quota"),
        stack.logs()
    );
    assert!(refunded(back), "{back:?}");
    assert_eq!(
        envoy.stat_value("wasmcustom.tollgate.per-minute.refunded_tokens"),
        Some(0),
        "the cap refused: it took nothing"
    );

    // The quota's own RateLimit header says the same: a request only the quota checks.
    let r = stack.get("/balance", &[("x-api-key", "key-123")]);
    assert_eq!(r.status, 200, "{r:?}\n{}", stack.logs());
    let left = QUOTA - admitted - 1;
    let ratelimit = r.header("ratelimit").unwrap();
    assert!(
        ratelimit.starts_with(&format!("\"quota\";r={left};")),
        "{ratelimit}"
    );
    assert_eq!(stored_tokens(&mut conn, "quota"), Some(left as i64));
}
