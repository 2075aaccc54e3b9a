//! Long periods end to end: a 30-day quota (1,000,000 tokens, which the script counts in whole
//! seconds) through real Envoy, Webdis and Redis. The test moves the bucket's clock by rewriting
//! the refill point `t` of its hash back in time (the state is tollgate's own; this is the test
//! clock at the Redis level), and the RateLimit header says how many tokens came back.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use common::Stack;

const DAY_US: u64 = 86_400_000_000;

/// `rules`, behind the usual backend.
fn config(rules: &str) -> String {
    format!(
        r#"{{ "backend": {{ "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 2000 }},
             "rules": [ {rules} ] }}"#
    )
}

/// 1,000,000 per 30 days for each `x-user-id`, a request costing `x-cost` tokens.
const MONTHLY: &str = r#"{ "name": "monthly", "key": ["header:x-user-id"], "cost_header": "x-cost",
    "rate": 1000000, "period_ms": 2592000000, "burst": 1000000 }"#;

/// The one bucket key of rule `rule` in Redis.
fn bucket_key(conn: &mut redis::Connection, rule: &str) -> String {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("tollgate:{{{rule}:*"))
        .query(conn)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys[0].clone()
}

/// Moves the bucket at `key` back in time by `us`: its refill point `t` becomes Redis' now less
/// `us`, as if its last call had been that long ago.
fn age(conn: &mut redis::Connection, key: &str, us: u64) {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
    let now = secs * 1_000_000 + micros;
    let () = redis::cmd("HSET")
        .arg(key)
        .arg("t")
        .arg((now - us).to_string())
        .query(conn)
        .unwrap();
}

/// Whole tokens in the bucket at `key` as last stored (`u` over `p`, the units per token).
fn stored_tokens(conn: &mut redis::Connection, key: &str) -> (i64, i64) {
    let (u, p): (i64, i64) = redis::cmd("HMGET")
        .arg(key)
        .arg(&["u", "p"])
        .query(conn)
        .unwrap();
    (u.div_euclid(p), p)
}

/// The month's million spent at once; three days later exactly 100,000 tokens are back
/// (3/30 of it), not one more.
#[test]
fn a_thirty_day_quota_refills_exactly_what_the_days_give() {
    let stack = Stack::start("periods-month", &config(MONTHLY));
    let spend = |cost: &str| stack.get("/api/x", &[("x-user-id", "ann"), ("x-cost", cost)]);
    let r = spend("1000000");
    assert_eq!(r.status, 200, "{r:?}\n{}", stack.logs());
    assert_eq!(r.header("ratelimit"), Some("\"monthly\";r=0;t=2592000"));
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"monthly\";q=1000000;w=2592000"),
        "30 days"
    );
    let mut conn = stack.redis.conn();
    let key = bucket_key(&mut conn, "monthly");
    // A second's step: a token is 2,592,000 units (30 days in seconds).
    assert_eq!(stored_tokens(&mut conn, &key), (0, 2_592_000));

    age(&mut conn, &key, 3 * DAY_US);
    let r = spend("1");
    assert_eq!(r.status, 200, "{r:?}\n{}", stack.logs());
    // 100,000 came back, one taken. Full again in 900,001 × 2.592 s, rounded up to whole
    // seconds (one second less if a second passed since the rewrite: a step's refill, 0.39 of
    // a token, changes no whole token).
    let ratelimit = r.header("ratelimit").unwrap();
    assert!(
        ratelimit == "\"monthly\";r=99999;t=2332803"
            || ratelimit == "\"monthly\";r=99999;t=2332802",
        "{ratelimit}"
    );
    assert_eq!(spend("100000").status, 429, "only 99,999 left");
    let r = spend("99999");
    assert_eq!(r.status, 200, "{r:?}\n{}", stack.logs());
    assert_eq!(
        r.header("ratelimit").map(|h| &h[..13]),
        Some("\"monthly\";r=0")
    );
}

/// Two rules on one key: a monthly quota and a cap per minute. The cap binds first; a minute
/// later it is whole again while the month's tokens keep counting down.
#[test]
fn a_monthly_quota_with_a_cap_per_minute() {
    let per_minute = r#"{ "name": "per-minute", "key": ["header:x-user-id"], "cost_header": "x-cost",
        "rate": 10000, "period_ms": 60000, "burst": 10000 }"#;
    let stack = Stack::start(
        "periods-month-minute",
        &config(&format!("{MONTHLY}, {per_minute}")),
    );
    let spend = |cost: &str| stack.get("/api/x", &[("x-user-id", "bo"), ("x-cost", cost)]);
    let r = spend("10000");
    assert_eq!(r.status, 200, "{r:?}\n{}", stack.logs());
    assert_eq!(
        r.header("ratelimit"),
        Some("\"per-minute\";r=0;t=60"),
        "the tighter rule's headers"
    );
    let r = spend("10000");
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("ratelimit"), Some("\"per-minute\";r=0;t=60"));
    let mut conn = stack.redis.conn();
    let month = bucket_key(&mut conn, "monthly");
    let minute = bucket_key(&mut conn, "per-minute");
    // The monthly rule admitted both; the second never went upstream (the cap refused it), so
    // its 10,000 come back, with a settle-only call within the flush time.
    let refunded = common::wait_until(std::time::Duration::from_secs(5), || {
        stored_tokens(&mut conn, &month).0 == 1_000_000 - 10_000
    });
    assert!(
        refunded,
        "{:?}\n{}",
        stored_tokens(&mut conn, &month),
        stack.logs()
    );

    // A minute later the cap is whole again. (A cost below the denied one: the proxy's deny
    // cache still answers costs of 10,000 for the rest of that minute.)
    age(&mut conn, &minute, 60_000_000);
    let r = spend("9999");
    assert_eq!(r.status, 200, "{r:?}\n{}", stack.logs());
    assert_eq!(r.header("ratelimit"), Some("\"per-minute\";r=1;t=60"));
    assert_eq!(stored_tokens(&mut conn, &month).0, 1_000_000 - 19_999);
    assert_eq!(stored_tokens(&mut conn, &minute).0, 1);
}
