//! `lua/token_bucket.lua` on its own, against a real redis-server (one per test), with the explicit-now
//! ARGV[8] so every result is deterministic. The batched form's tests are in lua_script/batch.rs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use common::script::SCRIPT;
use common::{scratch_dir, Redis};
use redis::Value;

const T0: u64 = 1_700_000_000_000_000; // a realistic µs clock
const KEY: &str = "tollgate:{test:abc}";

#[path = "lua_script/batch.rs"]
mod batch;

/// `{allowed, remaining, retry_after_ms, reset_after_ms, granted}`.
type Out = [i64; 5];

fn start(name: &str) -> (Redis, redis::Connection) {
    let redis = Redis::start(&scratch_dir(name));
    let conn = redis.conn();
    (redis, conn)
}

/// EVAL with string arguments; the reply must be a flat array of five integers.
fn eval_raw(conn: &mut redis::Connection, key: &str, args: &[&str]) -> redis::RedisResult<Out> {
    let v: Value = redis::cmd("EVAL")
        .arg(SCRIPT)
        .arg(1)
        .arg(key)
        .arg(args)
        .query(conn)?;
    Ok(flat_ints(v))
}

/// A lease call at `ms` after T0 on `KEY`, a bucket of burst 100 refilling `rate` a second, cost 1.
fn lease_at(c: &mut redis::Connection, rate: &str, lease: &str, ms: u64) -> Out {
    let now = (T0 + ms * 1000).to_string();
    let args = ["100", rate, "1000", "1", lease, "0", "0", now.as_str()];
    eval_raw(c, KEY, &args).unwrap()
}

/// A field of `KEY`'s hash, as a number.
fn hash_field(c: &mut redis::Connection, f: &str) -> Option<u64> {
    redis::cmd("HGET").arg(KEY).arg(f).query(c).unwrap()
}

fn flat_ints(v: Value) -> Out {
    let Value::Array(items) = v else {
        panic!("reply is not an array: {v:?}")
    };
    let ints: Vec<i64> = items
        .iter()
        .map(|x| match x {
            Value::Int(i) => *i,
            other => panic!("reply element is not an integer: {other:?} in {items:?}"),
        })
        .collect();
    ints.try_into()
        .unwrap_or_else(|v| panic!("reply has not 5 elements: {v:?}"))
}

/// One call: limits (burst, rate, period_ms), cost, lease_want, now (µs); no waiting.
fn call(conn: &mut redis::Connection, l: (u64, u64, u64), cost: u64, lease: u64, now: u64) -> Out {
    call_wait(conn, l, cost, lease, 0, now)
}

/// One call with `max_wait_ms`.
fn call_wait(
    conn: &mut redis::Connection,
    l: (u64, u64, u64),
    cost: u64,
    lease: u64,
    max_wait: u64,
    now: u64,
) -> Out {
    let args = [l.0, l.1, l.2, cost, lease, max_wait, 0, now].map(|n| n.to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    eval_raw(conn, KEY, &args).unwrap()
}

fn stored(conn: &mut redis::Connection) -> (Option<String>, Option<String>, Option<String>) {
    redis::cmd("HMGET")
        .arg(KEY)
        .arg(&["u", "t", "p"])
        .query(conn)
        .unwrap()
}

fn exists(conn: &mut redis::Connection) -> bool {
    redis::cmd("EXISTS").arg(KEY).query::<i64>(conn).unwrap() == 1
}

fn pttl(conn: &mut redis::Connection) -> i64 {
    redis::cmd("PTTL").arg(KEY).query(conn).unwrap()
}

#[test]
fn first_call_sees_a_full_bucket() {
    let (_r, mut c) = start("lua-first");
    assert_eq!(call(&mut c, (10, 5, 1000), 1, 0, T0), [1, 9, 0, 200, 1]);
    let (u, t, p) = stored(&mut c);
    assert_eq!(u.as_deref(), Some("9000"));
    assert_eq!(t, Some(T0.to_string()));
    assert_eq!(p.as_deref(), Some("1000"));
}

#[test]
fn drain_then_deny_with_retry_after() {
    let (_r, mut c) = start("lua-drain");
    let l = (3, 1, 1000); // 1 token per second
    for left in [2, 1, 0] {
        let out = call(&mut c, l, 1, 0, T0);
        assert_eq!(out[0], 1);
        assert_eq!(out[1], left);
    }
    assert_eq!(call(&mut c, l, 1, 0, T0), [0, 0, 1000, 3000, 0]);
    assert_eq!(call(&mut c, l, 1, 0, T0 + 400_000), [0, 0, 600, 2600, 0]);
    assert_eq!(call(&mut c, l, 2, 0, T0 + 400_000), [0, 0, 1600, 2600, 0]);
}

#[test]
fn refill_with_explicit_now() {
    let (_r, mut c) = start("lua-refill");
    let l = (10, 2, 1000); // 2 tokens per second
    assert_eq!(call(&mut c, l, 10, 0, T0)[0], 1);
    // 1.5 s: 3 tokens.
    assert_eq!(call(&mut c, l, 1, 0, T0 + 1_500_000), [1, 2, 0, 4000, 1]);
    // 0.9999 ms later: not a whole millisecond since the refill point, nothing added.
    assert_eq!(call(&mut c, l, 1, 0, T0 + 1_500_999), [1, 1, 0, 4500, 1]);
    // The refill point moved by whole milliseconds only.
    assert_eq!(stored(&mut c).1, Some((T0 + 1_500_000).to_string()));
    // 1 ms later: 2 units (of 1000 per token) added.
    call(&mut c, l, 1, 0, T0 + 1_501_000);
    assert_eq!(stored(&mut c).0.as_deref(), Some("2"));
    assert_eq!(stored(&mut c).1, Some((T0 + 1_501_000).to_string()));
}

/// The script's PEXPIRE slack over reset_after_ms (see EXPIRE_SLACK_MS in the script).
const SLACK_MS: i64 = 1000;

#[test]
fn pexpire_is_the_time_to_full_plus_slack() {
    let (_r, mut c) = start("lua-pexpire");
    let l = (100, 1, 600); // 1 token per 600 ms: full after 60 s
    let out = call(&mut c, l, 100, 0, T0);
    assert_eq!(out, [1, 0, 0, 60_000, 100]);
    let ttl = pttl(&mut c);
    assert!(
        ttl > 59_000 + SLACK_MS && ttl <= 60_000 + SLACK_MS,
        "PTTL {ttl}"
    );
    let out = call(&mut c, l, 1, 0, T0 + 30_000_000);
    assert_eq!(out, [1, 49, 0, 30_600, 1]);
    let ttl = pttl(&mut c);
    assert!(
        ttl > 29_600 + SLACK_MS && ttl <= 30_600 + SLACK_MS,
        "PTTL {ttl}"
    );
    // A short time to full: the key lives for the slack, then goes (absence is a full bucket).
    let l = (5, 1_000_000, 1);
    assert_eq!(call(&mut c, l, 1, 0, T0), [1, 4, 0, 1, 1]);
    let ttl = pttl(&mut c);
    assert!(ttl > 1 && ttl <= 1 + SLACK_MS, "PTTL {ttl}");
    let gone = common::wait_until(std::time::Duration::from_secs(5), || !exists(&mut c));
    assert!(gone, "key did not expire");
    // Expiring late changes nothing: a stale key refills to full, exactly like an absent one.
    call(&mut c, l, 5, 0, T0);
    assert_eq!(call(&mut c, l, 1, 0, T0 + 1_000), [1, 4, 0, 1, 1]);
}

/// A bucket that is full again only in more than 2^53 ms keeps no expiry (PERSIST), and the ACL
/// user of docs/deploy/redis.md may run that too: Redis applies the caller's ACL to each command
/// a script calls, after the script has already written the bucket.
#[test]
fn a_bucket_full_only_past_2_53_ms_persists_as_the_documented_acl_user() {
    const PASSWORD: &str = "tollgate-acl-s3cret";
    let (redis, mut admin, user) =
        common::redis_tls::redis_with_documented_user(&scratch_dir("lua-persist"), PASSWORD);
    let mut c = redis::Client::open(format!(
        "redis://{user}:{PASSWORD}@127.0.0.1:{}/",
        redis.port
    ))
    .unwrap()
    .get_connection()
    .unwrap();
    // 300,000 tokens refilling one per 366 days: taking them all leaves a bucket full again in
    // 300,000 × 366 days, past 2^53 ms; the wait it reports saturates there.
    let l = (300_000, 1, 31_622_400_000);
    assert_eq!(call(&mut c, l, 300_000, 0, T0), [1, 0, 0, 1 << 53, 300_000]);
    assert_eq!(stored(&mut admin).0.as_deref(), Some("0"));
    assert_eq!(pttl(&mut admin), -1, "a key kept without an expiry");
}

#[test]
fn key_is_deleted_when_full_again() {
    let (_r, mut c) = start("lua-delete");
    let l = (5, 1, 100);
    call(&mut c, l, 5, 0, T0);
    assert!(exists(&mut c));
    // Refilled to full and nothing taken (cost > burst): the key goes.
    assert_eq!(call(&mut c, l, 6, 0, T0 + 500_000), [0, 5, -1, 0, 0]);
    assert!(!exists(&mut c));
    // A call that takes from a refilled bucket writes it back.
    assert_eq!(call(&mut c, l, 1, 0, T0 + 600_000), [1, 4, 0, 100, 1]);
    assert!(exists(&mut c));
    // Again: a refill that reaches full with nothing taken deletes it.
    assert_eq!(call(&mut c, l, 6, 0, T0 + 700_000), [0, 5, -1, 0, 0]);
    assert!(!exists(&mut c));
}

#[test]
fn burst_shrink_clamps_stored_tokens() {
    let (_r, mut c) = start("lua-shrink");
    assert_eq!(call(&mut c, (100, 1, 1000), 10, 0, T0)[1], 90);
    assert_eq!(call(&mut c, (20, 1, 1000), 1, 0, T0), [1, 19, 0, 1000, 1]);
    // Growing it back restores nothing.
    assert_eq!(call(&mut c, (100, 1, 1000), 1, 0, T0)[1], 18);
    // A period change rescales the units (7 tokens stay 7 tokens).
    assert_eq!(call(&mut c, (100, 1, 10), 11, 0, T0)[1], 7);
    assert_eq!(stored(&mut c).0.as_deref(), Some("70"));
    assert_eq!(stored(&mut c).2.as_deref(), Some("10"));
}

#[test]
fn cost_above_burst_is_minus_one_and_changes_nothing() {
    let (_r, mut c) = start("lua-toobig");
    let l = (10, 1, 1000);
    assert_eq!(call(&mut c, l, 11, 0, T0), [0, 10, -1, 0, 0]);
    assert!(!exists(&mut c));
    call(&mut c, l, 3, 0, T0);
    let before = stored(&mut c);
    assert_eq!(
        call(&mut c, l, 9_007_199_254_740_992, 5, T0),
        [0, 7, -1, 3000, 0]
    );
    assert_eq!(stored(&mut c), before);
    // Later: the same as if the call had not been made.
    assert_eq!(call(&mut c, l, 1, 0, T0 + 1_000_000), [1, 7, 0, 3000, 1]);
}

#[test]
fn bad_arguments_give_an_error_reply() {
    let (_r, mut c) = start("lua-badargs");
    let ok = ["10", "1", "1000", "1", "0"];
    let cases: &[(usize, &str, &str)] = &[
        (0, "0", "burst"),
        (0, "x", "burst"),
        (0, "1.5", "burst"),
        (0, "-3", "burst"),
        (0, "1e3", "burst"),
        (0, "", "burst"),
        (1, "0", "rate"),
        (1, "1000000001", "rate"),
        (2, "0", "period_ms"),
        (2, "99999999999999999999", "period_ms"),
        (3, "-1", "cost"),
        (3, "nan", "cost"),
        (4, "-1", "lease"),
        (4, "0.5", "lease"),
        // want:holder:seq:hold_ms[:back] and 1 to 8 steps, with a holder of at least 1 and a
        // hold of at most a day; an odd count of parts has a back, a number like the others.
        (4, "5:0:1:100:0:0", "lease"),
        (4, "5:1:1:86400001:0:0", "lease"),
        (4, "5:1:0:100:0:0", "lease"),
        (4, "5:1:1:100:0:86400001", "lease"),
        (4, "5:1:1:100:x:0", "lease"),
        (4, "5:1:1:100:0", "lease"),
        (4, "5:1:1:100:99999999999999999:7:0", "lease"),
        (4, &format!("5:1:1:100{}", ":0:0".repeat(9)), "lease"),
        (4, &format!("5:1:1:100:3{}", ":0:0".repeat(9)), "lease"),
        (4, "5:1:1:100::0", "lease"),
        (4, "5:1:1:100:0:0:", "lease"),
        (4, ":1:1:100:0:0", "lease"),
        // A demand after a slash: only with a holder, digits, at most 2^32.
        (4, "5/7", "lease"),
        (4, "5:1:1:100:0:0/", "lease"),
        (4, "5:1:1:100:0:0/-1", "lease"),
        (4, "5:1:1:100:0:0/1e3", "lease"),
        (4, "5:1:1:100:0:0/ 30", "lease"),
        (4, "5:1:1:100:0:0/4294967297", "lease"),
        (4, "5:1:1:100:0:0/9007199254740993", "lease"),
        (4, "5:1:1:100:0:0/1/2", "lease"),
        (4, "5:1:1:100:0/0:0", "lease"),
        (4, "/5:1:1:100:0:0", "lease"),
    ];
    for &(i, val, name) in cases {
        let mut args = ok;
        args[i] = val;
        let err = eval_raw(&mut c, KEY, &args).expect_err(&format!("{args:?} accepted"));
        let want = format!("tollgate: bad argument {name}");
        assert!(err.to_string().contains(&want), "{args:?}: {err}");
    }
    // burst * period_ms above 2^50.
    let err = eval_raw(&mut c, KEY, &["1125899906842625", "1", "1", "1", "0"]).unwrap_err();
    assert!(
        err.to_string().contains("bad argument burst*period_ms"),
        "{err}"
    );
    let max = ["1125899906842624", "1", "1", "1", "0"];
    assert!(eval_raw(&mut c, "tollgate:{max}", &max).is_ok());
    // Past 2^50 in ms, whole seconds or minutes that fit: 10^9 per 30 days (minutes) is fine,
    // 10^9 per 30 days and a second (neither ms nor minutes fit) is not.
    let month = ["1000000000", "1", "2592000000", "1", "0"];
    assert!(eval_raw(&mut c, "tollgate:{month}", &month).is_ok());
    let err = eval_raw(&mut c, KEY, &["1000000000", "1", "2592001000", "1", "0"]).unwrap_err();
    assert!(
        err.to_string().contains("bad argument burst*period_ms"),
        "{err}"
    );
    // Missing arguments.
    let err = eval_raw(&mut c, KEY, &["10", "1", "1000", "1"]).unwrap_err();
    assert!(err.to_string().contains("bad argument lease"), "{err}");
    let err = eval_raw(&mut c, KEY, &[]).unwrap_err();
    assert!(err.to_string().contains("bad argument burst"), "{err}");
    // A bad max_wait_ms, a bad explicit now.
    let err = eval_raw(&mut c, KEY, &["10", "1", "1000", "1", "0", "-1"]).unwrap_err();
    assert!(
        err.to_string().contains("bad argument max_wait_ms"),
        "{err}"
    );
    let err = eval_raw(&mut c, KEY, &["10", "1", "1000", "1", "0", "3600001"]).unwrap_err();
    assert!(
        err.to_string().contains("bad argument max_wait_ms"),
        "{err}"
    );
    // A settlement beyond four bursts, or not an integer.
    for settle in ["41", "-41", "--1", "1.5", "+1", ""] {
        let err = eval_raw(&mut c, KEY, &["10", "1", "1000", "1", "0", "0", settle]).unwrap_err();
        assert!(
            err.to_string().contains("bad argument settle"),
            "{settle}: {err}"
        );
    }
    let err = eval_raw(
        &mut c,
        KEY,
        &["10", "1", "1000", "1", "0", "0", "0", "soon"],
    )
    .unwrap_err();
    assert!(err.to_string().contains("bad argument now"), "{err}");
    // None of that touched the key.
    assert!(!exists(&mut c));
}

#[test]
fn replies_are_flat_integers_and_state_has_no_exponents() {
    let (_r, mut c) = start("lua-ints");
    // full = 2^40 * 1024 = 2^50 units: every stored number is ~1e15, where tostring would say "1e+15".
    let l = (1 << 40, 999_999_937, 1024);
    for (i, cost) in [1u64, 12_345, 1 << 39, 3, 1 << 40].into_iter().enumerate() {
        let out = call(&mut c, l, cost, 7, T0 + i as u64 * 1_234_567);
        assert!(out.iter().all(|&x| x >= -1), "{out:?}");
        let (u, t, p) = stored(&mut c);
        for f in [u, t, p].into_iter().flatten() {
            assert!(
                !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()),
                "stored {f:?}"
            );
        }
    }
    // Raw check of the reply shape for a deny and an allow.
    for args in [
        ["1", "1", "1", "1", "0", "0", "0", "5"],
        ["1", "1", "1", "1", "0", "0", "0", "5"],
        ["1", "1", "1", "2", "0", "0", "0", "5"],
    ] {
        let v: Value = redis::cmd("EVAL")
            .arg(SCRIPT)
            .arg(1)
            .arg("tollgate:{shape}")
            .arg(&args)
            .query(&mut c)
            .unwrap();
        match &v {
            Value::Array(items) => {
                assert_eq!(items.len(), 5, "{v:?}");
                assert!(items.iter().all(|x| matches!(x, Value::Int(_))), "{v:?}");
            }
            _ => panic!("not a flat array: {v:?}"),
        }
    }
}

#[test]
fn without_explicit_now_uses_redis_time() {
    let (_r, mut c) = start("lua-time");
    let l = ["2", "1", "60000", "1", "0"];
    assert_eq!(eval_raw(&mut c, KEY, &l).unwrap(), [1, 1, 0, 60_000, 1]);
    let (_, t, _) = stored(&mut c);
    let t: u64 = t.unwrap().parse().unwrap();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        t.abs_diff(now_us) < 60_000_000,
        "TIME {t} vs clock {now_us}"
    );
    assert_eq!(eval_raw(&mut c, KEY, &l).unwrap()[..3], [1, 0, 0]);
    let out = eval_raw(&mut c, KEY, &l).unwrap();
    assert_eq!(out[0], 0);
    assert!(out[2] > 0 && out[2] <= 60_000, "{out:?}");
}

#[test]
fn script_load_sha1_matches_and_evalsha_works() {
    use sha1::{Digest, Sha1};
    let (_r, mut c) = start("lua-sha");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT)
        .query(&mut c)
        .unwrap();
    let ours: String = Sha1::digest(SCRIPT.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(sha, ours);
    let v: Value = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg(KEY)
        .arg(&["3", "1", "1000", "1", "0", "0", "0", &T0.to_string()])
        .query(&mut c)
        .unwrap();
    assert_eq!(flat_ints(v), [1, 2, 0, 1000, 1]);
}

/// Reservations (max_wait_ms): queued in order, each one emission interval (period / rate) after
/// the last, none past the horizon; the debt is stored and paid back by refill.
#[test]
fn reservations_queue_in_order_up_to_the_horizon() {
    let (_r, mut c) = start("lua-reserve");
    let l = (2, 10, 1000); // burst 2, one token every 100 ms
    let mut got = Vec::new();
    for _ in 0..14 {
        let [allowed, _remaining, retry, _reset, granted] = call_wait(&mut c, l, 1, 0, 1000, T0);
        got.push((allowed, retry, granted));
    }
    let mut want = vec![(1, 0, 1), (1, 0, 1)];
    want.extend((1..=10).map(|i| (1, 100 * i, 1)));
    want.extend([(0, 100, 0), (0, 100, 0)]);
    assert_eq!(got, want);
    let (u, _, _) = stored(&mut c);
    assert_eq!(
        u.as_deref(),
        Some("-10000"),
        "ten tokens of debt, none past the horizon"
    );
    // Without max_wait the same bucket just denies until the debt is paid and a token is back.
    let [allowed, _, retry, _, _] = call(&mut c, l, 1, 0, T0 + 500_000);
    assert_eq!((allowed, retry), (0, 600));
    let [allowed, ..] = call(&mut c, l, 1, 0, T0 + 1_100_000);
    assert_eq!(allowed, 1);
}

/// Usage settled after admissions: a charge takes the bucket into debt (later calls wait for the
/// refill to repay it), a refund never fills past full, and cost 0 only settles.
#[test]
fn settle_charges_into_debt_and_refunds_up_to_full() {
    let (_r, mut c) = start("lua-settle");
    let run = |c: &mut redis::Connection, cost: &str, settle: &str| -> Out {
        let args = ["100", "1", "60000", cost, "0", "0", settle, &T0.to_string()];
        eval_raw(c, KEY, &args).unwrap()
    };
    assert_eq!(run(&mut c, "1", "0"), [1, 99, 0, 60000, 1]);
    assert_eq!(run(&mut c, "1", "39"), [1, 59, 0, 41 * 60000, 1]);
    assert_eq!(run(&mut c, "1", "39"), [1, 19, 0, 81 * 60000, 1]);
    assert_eq!(run(&mut c, "1", "39"), [0, 0, 21 * 60000, 120 * 60000, 0]);
    // A refund without an epoch gives back nothing (refunds go in the tracked form: see
    // `a_refund_after_the_bucket_refilled_gives_nothing_back`).
    assert_eq!(run(&mut c, "0", "-400"), [1, 0, 0, 120 * 60000, 0]);
    assert!(exists(&mut c), "still in debt");
}

/// A usage charge never lifts a bucket out of reservation debt: after 105 reservations on burst 10
/// at 10/s (95 tokens of debt, 10.5 s to full), a charge of 2 deepens nothing it must not and lifts
/// nothing (before the fix it clamped the debt to four bursts: reset 10500 → 5000 ms).
#[test]
fn a_charge_never_lifts_a_bucket_out_of_debt() {
    let (_r, mut c) = start("lua-charge-debt");
    let now = T0.to_string();
    let mut last = [0; 5];
    for _ in 0..105 {
        let args = ["10", "10", "1000", "1", "0", "10000", "0", now.as_str()];
        last = eval_raw(&mut c, KEY, &args).unwrap();
        assert_eq!(last[0], 1);
    }
    assert_eq!(last[3], 10_500, "95 tokens of debt: 10.5 s to full");
    let args = ["10", "10", "1000", "0", "0", "0", "2", now.as_str()];
    let [_, _, _, reset, _] = eval_raw(&mut c, KEY, &args).unwrap();
    eprintln!(
        "reset_after_ms before the charge of 2: {}, after: {reset}",
        last[3]
    );
    assert!(
        reset >= 10_500,
        "a charge lifted the bucket: reset {reset} ms"
    );
}

/// Tokens out on lease count against the bucket's capacity: a holder that took 60 of 100 leaves a
/// bucket that refills to 40, not 100, however long it waits; once it reports it holds nothing,
/// the bucket refills to 100. A second holder gets at most its share (half), and the record
/// expires after the hold.
#[test]
fn leased_tokens_count_against_the_capacity() {
    let (_r, mut c) = start("lua-holders");
    let at = |ms: u64| (T0 + ms * 1000).to_string();
    let run = |c: &mut redis::Connection, cost: &str, lease: &str, now: &str| -> Out {
        let wait = if lease.contains(':') { "2000" } else { "0" };
        let args = ["100", "100", "1000", cost, lease, wait, "0", now];
        eval_raw(c, KEY, &args).unwrap()
    };
    // Holder 7 takes 60 and may hold them 5 s.
    assert_eq!(
        run(&mut c, "1", "60:7:1:5000:0:0", &at(0)),
        [1, 40, 0, 0, 60]
    );
    // 2 s later an exact caller finds 40, not 100: the bucket plus the lease never exceed burst.
    assert_eq!(run(&mut c, "40", "0", &at(2000)), [1, 0, 0, 400, 40]);
    assert_eq!(run(&mut c, "1", "0", &at(2000))[0], 0);
    // Holder 8 asks for 100: it gets its share of the room (two holders: 50 each), 40 held by 7
    // leave room for 40, all reserved from the refill (none is there).
    let [allowed, _, wait, _, granted] = run(&mut c, "1", "100:8:1:5000:0:0", &at(2000));
    assert_eq!((allowed, granted), (1, 40));
    assert_eq!(wait, 400, "reserved: 40 tokens refill in 400 ms");
    // Holder 7 reports it holds nothing now: its 60 leave the count.
    let [allowed, ..] = run(&mut c, "1", "0:7:2:5000:0:0", &at(3000));
    assert_eq!(allowed, 1);
    // After every hold expired (7: 5 s from its last call; 8: 5.4 s), nothing is held; the
    // bucket refills to full and the key goes away.
    let out = run(&mut c, "0", "0", &at(60_000));
    assert_eq!(out[1], 100);
    assert!(!exists(&mut c), "full and no holders: no key");
}

/// A holder counts until its record expires, not only until the call that finds it expired: P1
/// takes the whole burst (100, at 20/s) and may hold it 4 s; P2 asking at 4.01 s finds only what
/// refilled since P1's expiry (0.2 tokens), not 80 (what refilled since P1's grant, which P1
/// could have spent at 3.99 s: 180 admitted in 2 s where 140 is the bound).
#[test]
fn an_expired_holder_counts_until_its_expiry() {
    let (_r, mut c) = start("lua-holder-expiry");
    let run = |c: &mut redis::Connection, lease: &str, ms: u64| lease_at(c, "20", lease, ms);
    assert_eq!(run(&mut c, "100:1:1:4000:0:0", 0)[4], 100);
    let [allowed, .., granted] = run(&mut c, "100:2:1:4000:0:0", 4010);
    assert_eq!((allowed, granted), (0, 0), "P1's tokens counted until 4 s");
    // At 4.05 s one token has refilled since P1's expiry.
    assert_eq!(run(&mut c, "100:2:2:4000:0:0", 4050)[4], 1);
}

/// A lease call that runs after a later call of the same holder reports nothing: its report may
/// not count a grant the proxy deposited since. Holder 7 takes 30 (seq 1), then 30 more while
/// reporting it still holds the first 30 (seq 3); a late call sent in between (seq 2) that says it
/// holds nothing must not lower the count: the bucket keeps room for 40, not 70.
#[test]
fn a_late_call_of_a_holder_reports_nothing() {
    let (_r, mut c) = start("lua-holder-seq");
    let run = |c: &mut redis::Connection, cost: &str, lease: &str, ms: u64| -> Out {
        let now = (T0 + ms * 1000).to_string();
        let args = ["100", "100", "1000", cost, lease, "0", "0", now.as_str()];
        eval_raw(c, KEY, &args).unwrap()
    };
    assert_eq!(run(&mut c, "1", "30:7:1:5000:0:0", 0)[4], 30);
    assert_eq!(run(&mut c, "1", "30:7:3:5000:30:0", 0)[4], 30);
    assert_eq!(run(&mut c, "0", "0:7:2:5000:0:0", 0)[0], 1);
    // Two seconds of refill later the bucket holds what 60 held tokens leave room for.
    let [allowed, remaining, ..] = run(&mut c, "41", "0", 2000);
    assert_eq!((allowed, remaining), (0, 40), "60 still counted as held");
}

/// What a holder gives back (`back`, the fifth of an odd count of lease parts) is bounded on
/// real Redis: at most what its record counts before the call's report, never past what the
/// bucket can hold, nothing on a stale call or for another holder's record (a restarted proxy's
/// new id), and a hostile value is a 'lease' error that writes nothing.
#[test]
fn a_give_back_is_bounded_by_the_record_and_refused_when_hostile() {
    let (_r, mut c) = start("lua-give-back");
    let now = T0.to_string();
    let run = |c: &mut redis::Connection, cost: &str, lease: &str| {
        let args = ["100", "1", "1000000", cost, lease, "0", "0", now.as_str()];
        eval_raw(c, KEY, &args)
    };
    // Holder 7 takes 30; an exact caller the other 70.
    assert_eq!(run(&mut c, "1", "30:7:1:5000:0:0").unwrap()[4], 30);
    assert_eq!(run(&mut c, "70", "0").unwrap()[0], 1);
    let before = stored(&mut c);
    for bad in [
        "0:7:2:5000:-1:0:0",
        "0:7:2:5000:9007199254740993:0:0",
        "0:7:2:5000:1e3:0:0",
        "0:7:2:5000: 30:0:0",
        "0:7:2:5000:30",
        // A back and nine steps: one too many.
        &format!("0:7:2:5000:30{}", ":0:0".repeat(9)),
    ] {
        let err = run(&mut c, "0", bad).expect_err(bad).to_string();
        assert!(err.contains("bad argument lease"), "{bad}: {err}");
    }
    assert_eq!(stored(&mut c), before, "a refused call writes nothing");
    // A restarted proxy (holder 8) gives back what holder 7 holds: nothing comes back.
    assert_eq!(run(&mut c, "0", "0:8:1:5000:30:0:0").unwrap()[1], 0);
    // Holder 7 gives back 2^53: the bucket gets the 30 its record counts, no more.
    let out = run(&mut c, "0", "0:7:2:5000:9007199254740992:0:0").unwrap();
    assert_eq!(out[1], 30);
    // Again, with nothing left on record: nothing.
    assert_eq!(run(&mut c, "0", "0:7:3:5000:30:0:0").unwrap()[1], 30);
    // It takes 20 (seq 5); a stale call (seq 4) giving them back is ignored.
    assert_eq!(run(&mut c, "1", "20:7:5:5000:0:0").unwrap()[4], 20);
    assert_eq!(run(&mut c, "0", "0:7:4:5000:20:0:0").unwrap()[1], 10);
    // The old format (no back) still parses.
    assert_eq!(run(&mut c, "0", "0:7:6:5000:20:0").unwrap()[1], 10);
    // Never past what the bucket can hold: credited to its ceiling (burst less the 20 on
    // record), a back of 20 whose report still counts them adds nothing; once the report
    // leaves them out, they fill the bucket.
    assert_eq!(run(&mut c, "0", "credit:70").unwrap()[1], 80);
    assert_eq!(run(&mut c, "0", "0:7:7:5000:20:20:0").unwrap()[1], 80);
    assert_eq!(run(&mut c, "0", "0:7:8:5000:20:0:0").unwrap()[1], 100);
}

/// A holder's share is weighed by the demand it reports (`/<demand>` after the lease's steps):
/// among twenty quiet holders a busy one gets its part; a holder that reports none (the
/// old format) gets the equal share; a report weighs until its holder's record expires.
#[test]
fn a_share_is_weighed_by_the_demand_holders_report() {
    let (_r, mut c) = start("lua-demand");
    let run = |c: &mut redis::Connection, lease: &str, ms: u64| lease_at(c, "100", lease, ms);
    let field = hash_field;
    for id in 1..=20 {
        assert_eq!(run(&mut c, &format!("1:{id}:1:5000:0:0/200"), 0)[4], 1);
    }
    // 16 a second among 20 at 0.2: 80 of the 100 by demand, where the equal share is 4 (racers:
    // at most what the others leave of the burst, 80): the 40 asked for.
    assert_eq!(run(&mut c, "40:99:1:5000:0:0/16000", 0)[4], 40);
    assert_eq!(field(&mut c, "s"), Some(20 * 200 + 16_000));
    assert_eq!(field(&mut c, "d99"), Some(16_000));
    // No demand reported: the equal share, 100 / 22.
    assert_eq!(run(&mut c, "40:98:1:5000:0:0", 0)[4], 4);
    assert_eq!(field(&mut c, "d98"), None);
    // Every record expires 5 s on: only the latest caller's report weighs.
    assert_eq!(run(&mut c, "1:1:2:5000:0:0/300", 6000)[4], 1);
    assert_eq!(
        (field(&mut c, "s"), field(&mut c, "k")),
        (Some(300), Some(1))
    );
    assert_eq!((field(&mut c, "d99"), field(&mut c, "d2")), (None, None));
}

/// Racers (an equal share under RACE_SHARE) on a key short of tokens get their part by demand
/// and take turns at its pace: a grant's retry_after_ms, negative, is the holder's next turn,
/// the refill of its tokens times the total demand over its own. As the model's test
/// (`bucket::tests::racers_on_a_key_short_of_tokens_take_turns_by_demand`).
#[test]
fn racers_on_a_key_short_of_tokens_take_turns_by_demand() {
    let (_r, mut c) = start("lua-race-turns");
    let run = |c: &mut redis::Connection, lease: &str, ms: u64| lease_at(c, "100", lease, ms);
    for id in 1..=20 {
        assert_eq!(run(&mut c, &format!("1:{id}:1:5000:0:0/200"), 0)[4], 1);
    }
    // An exact check takes 41 of the 80: 39 left, under half of what the bucket can hold.
    let now = T0.to_string();
    let args = ["100", "100", "1000", "41", "0", "0", "0", now.as_str()];
    assert_eq!(eval_raw(&mut c, KEY, &args).unwrap()[..2], [1, 39]);
    // The busy one takes the 39 (its part is 80) and comes back once 39 × 20 000 / 16 000
    // (floored) tokens have refilled: 390 ms.
    let out = run(&mut c, "40:99:1:5000:0:0/16000", 0);
    assert_eq!((out[0], out[4], out[2], out[1]), (1, 39, -390, 0));
    // 20 ms on, a quiet one (0.2 of 20 a second) takes one of the 2 there: 100 tokens' refill.
    let out = run(&mut c, "1:1:2:5000:0:0/200", 20);
    assert_eq!((out[0], out[4], out[2]), (1, 1, -1000));
}

/// The operator's operations (`tollgate reset`, `tollgate credit`): a reset fills the bucket to
/// burst less what is out (tokens on lease, tokens reserved by held requests), a credit adds
/// tokens up to the same ceiling; neither ever lowers the bucket, and their arguments are checked.
#[test]
fn reset_and_credit_never_hand_out_what_is_out() {
    let (_r, mut c) = start("lua-operations");
    let run = |c: &mut redis::Connection, cost: &str, lease: &str, wait: &str, ms: u64| {
        let now = (T0 + ms * 1000).to_string();
        let args = ["100", "10", "1000", cost, lease, wait, "0", now.as_str()];
        eval_raw(c, KEY, &args)
    };
    // Exact callers drain the bucket and reserve 20 more (2 s wait); then holder 7 reserves 30
    // behind them (a 5 s wait), to hold them for 60 s. (No exact caller reserves while a holder
    // holds tokens.)
    assert_eq!(run(&mut c, "100", "0", "0", 0).unwrap()[0], 1);
    assert_eq!(
        run(&mut c, "20", "0", "2000", 0).unwrap(),
        [1, 0, 2000, 12000, 20]
    );
    assert_eq!(
        run(&mut c, "1", "30:7:1:60000:0:0", "5000", 0).unwrap(),
        [1, 0, 5000, 12000, 30]
    );
    // A reset keeps the 30 on lease and the 20 reserved out: 50 in the bucket, not 100.
    assert_eq!(
        run(&mut c, "0", "reset", "2000", 0).unwrap(),
        [1, 50, 0, 2000, 0]
    );
    assert_eq!(stored(&mut c).0.as_deref(), Some("50000"));
    // A credit adds, up to the same ceiling (70 = 100 less the 30 on lease).
    assert_eq!(
        run(&mut c, "0", "credit:5", "0", 0).unwrap(),
        [1, 55, 0, 1500, 0]
    );
    assert_eq!(
        run(&mut c, "0", "credit:9007199254740992", "0", 0).unwrap(),
        [1, 70, 0, 0, 0]
    );
    // The holder is still on record: once its lease expired (60 s after its reservation
    // refilled at 5 s), the bucket refills to full and the key goes away.
    assert!(exists(&mut c));
    assert_eq!(run(&mut c, "0", "reset", "0", 61_000).unwrap()[1], 70);
    assert_eq!(run(&mut c, "0", "reset", "0", 66_000).unwrap()[1], 100);
    assert!(!exists(&mut c), "full and no holders: no key");
    // Bad operations touch nothing.
    for (cost, lease, settle, name) in [
        ("1", "reset", "0", "cost"),
        ("0", "reset", "3", "settle"),
        ("0", "credit:0", "0", "credit"),
        ("0", "credit:", "0", "credit"),
        ("0", "credit:-1", "0", "credit"),
        ("0", "credit:9007199254740994", "0", "credit"),
        ("0", "resets", "0", "lease"),
    ] {
        let args = ["100", "10", "1000", cost, lease, "0", settle];
        let err = eval_raw(&mut c, KEY, &args).expect_err(&format!("{args:?} accepted"));
        let want = format!("tollgate: bad argument {name}");
        assert!(err.to_string().contains(&want), "{args:?}: {err}");
    }
    assert!(!exists(&mut c));
}

/// The penalty argument (ARGV[9]) is parsed and bounded like the others; `time` for ARGV[8] is
/// Redis' clock; `0` or no ARGV[9] is no penalty (five integers), a penalty six.
#[test]
fn penalty_argument_is_bounded_and_time_is_redis_clock() {
    let (_redis, mut conn) = start("lua-penalty-args");
    let run = |conn: &mut redis::Connection, penalty: &str| -> redis::RedisResult<Value> {
        redis::cmd("EVAL")
            .arg(SCRIPT)
            .arg(1)
            .arg("tollgate:{pen:args}")
            .arg(&["5", "1", "1000", "1", "0", "0", "0", "time", penalty])
            .query(conn)
    };
    for bad in [
        "",
        "100",
        "0:100",
        "100:0",
        "100:5:3",
        "100:86400001",
        "604800001:5",
        "100::5",
        "100:5:",
        "a:5",
        "100:5 ",
        "-1:5",
        "100:1:1:1:1:1:1:1:1:1",
        "1e3:5",
    ] {
        let err = run(&mut conn, bad).unwrap_err();
        assert!(
            err.to_string().contains("bad argument penalty"),
            "{bad:?}: {err}"
        );
    }
    let ints = |v: Value| match v {
        Value::Array(items) => items.len(),
        other => panic!("{other:?}"),
    };
    assert_eq!(ints(run(&mut conn, "0").unwrap()), 5, "0: no penalty");
    assert_eq!(ints(run(&mut conn, "604800000:1:86400000").unwrap()), 6);
    assert_eq!(
        ints(run(&mut conn, "100:1:1:1:1:1:1:1:1").unwrap()),
        6,
        "eight durations"
    );
    // `time` reads Redis' clock: the stored refill point is now, not 0.
    let t: String = redis::cmd("HGET")
        .arg("tollgate:{pen:args}")
        .arg("t")
        .query(&mut conn)
        .unwrap();
    assert!(t.parse::<u64>().unwrap() > T0, "{t}");
    let err = redis::cmd("EVAL")
        .arg(SCRIPT)
        .arg(1)
        .arg("tollgate:{pen:args}")
        .arg(&["5", "1", "1000", "1", "0", "0", "0", "tim"])
        .query::<Value>(&mut conn)
        .unwrap_err();
    assert!(err.to_string().contains("bad argument now"), "{err}");
}

/// A version before demand reports keeps neither `s` nor `d<id>`: when its call lets the last
/// holder go it deletes `o`, `k`, `n`, `m` and leaves `s` behind (and the `d<id>` of holders it
/// dropped). A sum with no holder on record weighs nothing: the next holders' sum is theirs alone,
/// or a busy holder among quiet ones would get the equal share for as long as none of them
/// expires.
#[test]
fn a_sum_left_behind_by_an_older_version_weighs_nothing() {
    let (_r, mut c) = start("lua-demand-upgrade");
    let run = |c: &mut redis::Connection, lease: &str, ms: u64| lease_at(c, "100", lease, ms);
    let field = hash_field;
    // A new proxy reports the most there is; its record expires, and an older version's call
    // lets it go as that version does.
    assert_eq!(run(&mut c, "1:7:1:1000:0:0/4294967296", 0)[4], 1);
    assert_eq!(field(&mut c, "s"), Some(1 << 32));
    let _: () = redis::cmd("HDEL")
        .arg(KEY)
        .arg(&["e7", "h7", "q7", "o", "k", "n", "m"])
        .query(&mut c)
        .unwrap();
    for id in 1..=20 {
        assert_eq!(run(&mut c, &format!("1:{id}:1:5000:0:0/200"), 2000)[4], 1);
    }
    // 16 a second among 20 at 0.2: the 40 asked for, as on a key that never saw the older
    // version.
    assert_eq!(run(&mut c, "40:99:1:5000:0:0/16000", 2000)[4], 40);
    assert_eq!(field(&mut c, "s"), Some(20 * 200 + 16_000));
}

/// One call in the tracked form (ARGV[7] `<charge>:<refund>:<epoch>:<mark>`) on `KEY`: burst, a
/// token every `token_ms`, at `ms` after T0; its eight integers (the 7th: the bucket's epoch,
/// the 8th: the take's mark).
fn tracked(
    c: &mut redis::Connection,
    burst: u64,
    token_ms: u64,
    cost: u64,
    settle: &str,
    ms: u64,
) -> Vec<i64> {
    tracked_waiting(c, (burst, token_ms), cost, 0, settle, ms)
}

/// [`tracked`] with a max_wait_ms: a take may reserve.
fn tracked_waiting(
    c: &mut redis::Connection,
    (burst, token_ms): (u64, u64),
    cost: u64,
    max_wait_ms: u64,
    settle: &str,
    ms: u64,
) -> Vec<i64> {
    let (burst, period, cost) = (burst.to_string(), token_ms.to_string(), cost.to_string());
    let wait = max_wait_ms.to_string();
    let now = (T0 + ms * 1000).to_string();
    let args = [
        burst.as_str(),
        "1",
        period.as_str(),
        cost.as_str(),
        "0",
        wait.as_str(),
        settle,
        now.as_str(),
    ];
    let ints: Vec<i64> = redis::cmd("EVAL")
        .arg(SCRIPT)
        .arg(1)
        .arg(KEY)
        .arg(&args)
        .query(c)
        .unwrap();
    assert_eq!(
        ints.len(),
        8,
        "the tracked form answers eight integers: {ints:?}"
    );
    ints
}

/// The refund of `tokens` of the take answered with `reply` (its epoch and mark).
fn refund_of(tokens: u64, reply: &[i64]) -> String {
    format!("0:{tokens}:{}:{}", reply[6], reply[7])
}

/// The window bound's case: burst 1, a token a second. A's token is taken at 0 ms (A is then
/// refused by another rule); B is admitted at 1000 ms, the bucket having refilled; A's refund
/// reaches Redis at 1100 ms. Given back, it would let C in at 1100 ms: two admissions in 100 ms
/// where the bound is 1.1. The bucket spilled refill at its cap since A's take (its epoch moved
/// on): nothing comes back, C is denied.
#[test]
fn a_refund_after_the_bucket_refilled_gives_nothing_back() {
    let (_r, mut c) = start("lua-spill");
    let a = tracked(&mut c, 1, 1000, 1, "0:0:0:0", 0);
    assert_eq!(
        (a[0], a[6], a[7]),
        (1, T0 as i64, 1000),
        "A: a new bucket's stretch begins now; A took 1000 units of it"
    );
    let b = tracked(&mut c, 1, 1000, 1, "0:0:0:0", 1000);
    assert_eq!(
        (b[0], b[6]),
        (1, (T0 + 1_000_000) as i64),
        "B: refilled to full, a spill"
    );
    let r = tracked(&mut c, 1, 1000, 0, &refund_of(1, &a), 1100);
    assert_eq!(r[1], 0, "nothing came back");
    let cc = tracked(&mut c, 1, 1000, 1, "0:0:0:0", 1100);
    assert_eq!(cc[0], 0, "C is denied");
}

/// A refund soon after its take from a drained bucket comes back whole; from a bucket at its cap
/// (a login rule's usual case), it gives back what the cap leaves; refunds of several takes from
/// a full bucket (a quota's) each come back.
#[test]
fn a_refund_gives_back_what_the_bucket_stayed_short_of_its_cap() {
    let (_r, mut c) = start("lua-spill-back");
    // Burst 5, a token a second: drained by 4, then the refunded take of 1.
    let _ = tracked(&mut c, 5, 1000, 4, "0:0:0:0", 0);
    let t = tracked(&mut c, 5, 1000, 1, "0:0:0:0", 0);
    assert_eq!(t[1], 0);
    let r = tracked(&mut c, 5, 1000, 0, &refund_of(1, &t), 10);
    assert_eq!(r[1], 1, "its whole token (and 0.01 refilled)");
    assert_eq!(hash_field(&mut c, "u"), Some(1010), "in units: 1.01 tokens");

    // A full bucket: 3 taken, refunded 100 ms later. 0.1 token refilled meanwhile, so 2.9 come
    // back: full again (the key goes), not past it.
    let _: () = redis::cmd("DEL").arg(KEY).query(&mut c).unwrap();
    let t = tracked(&mut c, 5, 1000, 3, "0:0:0:0", 0);
    let r = tracked(&mut c, 5, 1000, 0, &refund_of(3, &t), 100);
    assert_eq!(r[1], 5, "full");
    assert!(!exists(&mut c), "full: no key");
    let five = tracked(&mut c, 5, 1000, 5, "0:0:0:0", 100);
    assert_eq!(five[0], 1);
    let six = tracked(&mut c, 5, 1000, 1, "0:0:0:0", 100);
    assert_eq!(six[0], 0, "never more than the cap");

    // A quota: burst 10, six takes of 1 from full; the last three are refunded, in order, 10 ms
    // later: each comes back whole (the bucket never came within 3 tokens of full since they
    // were taken): 4 tokens, 0.01 refilled, 3 back.
    let _: () = redis::cmd("DEL").arg(KEY).query(&mut c).unwrap();
    let takes: Vec<Vec<i64>> = (0..6)
        .map(|_| tracked(&mut c, 10, 1000, 1, "0:0:0:0", 0))
        .collect();
    assert_eq!(takes[5][7], 6000, "the marks count the units taken");
    for t in &takes[3..] {
        let _ = tracked(&mut c, 10, 1000, 0, &refund_of(1, t), 10);
    }
    assert_eq!(hash_field(&mut c, "u"), Some(7010));
}

/// A bucket another version of the script refilled (t is not the one this version wrote, T)
/// starts a new stretch: nothing taken before comes back. So does a change of the units per
/// token. (A refund without an epoch gives back nothing: `settle_charges_into_debt_and_refunds_up_to_full`.)
#[test]
fn a_refund_comes_back_only_while_its_stretch_is_known() {
    let (_r, mut c) = start("lua-spill-foreign");
    let _ = tracked(&mut c, 5, 1000, 4, "0:0:0:0", 0);
    let t = tracked(&mut c, 5, 1000, 1, "0:0:0:0", 0);
    // Another version refilled 5 ms of it.
    let _: () = redis::cmd("HSET")
        .arg(KEY)
        .arg("t")
        .arg((T0 + 5000).to_string())
        .query(&mut c)
        .unwrap();
    let r = tracked(&mut c, 5, 1000, 0, &refund_of(1, &t), 10);
    assert_eq!(r[1], 0, "nothing back");
    assert!(r[6] > t[6], "a new stretch: {} after {}", r[6], t[6]);
    // The units per token change (period 1000 -> 2000 ms): nothing back.
    let t = tracked(&mut c, 5, 1000, 1, "0:0:0:0", 10);
    let refund = refund_of(1, &t);
    let args = [
        "5",
        "1",
        "2000",
        "0",
        "0",
        "0",
        &refund,
        &(T0 + 20_000).to_string(),
    ];
    let v: Vec<i64> = redis::cmd("EVAL")
        .arg(SCRIPT)
        .arg(1)
        .arg(KEY)
        .arg(&args)
        .query(&mut c)
        .unwrap();
    assert_eq!(v[1], 0, "nothing back after a rescale");
}

/// The batched form answers a 7th and an 8th integer, the epoch and the mark, for a key in the
/// tracked form only, also when its arguments are bad (0, 0), so the reply's length follows from
/// the arguments.
#[test]
fn the_batched_form_answers_the_epoch_to_a_key_that_asked() {
    let (_r, mut c) = start("lua-spill-batch");
    let now = T0.to_string();
    let mut v = redis::cmd("EVAL");
    v.arg(SCRIPT)
        .arg(3)
        .arg(&["tollgate:{b:1}", "tollgate:{b:2}", "tollgate:{b:3}"])
        .arg("batch");
    // Each key's arguments: limits, cost 1, no lease, no wait, `settle`, the clock.
    let group = |settle: &'static str| ["8", "5", "1", "1000", "1", "0", "0", settle];
    let v: Vec<i64> = v
        .arg(&group("0:0:0:0"))
        .arg(&now)
        .arg(&group("0"))
        .arg(&now)
        .arg(&group("99:0:0:0"))
        .arg(&now)
        .query(&mut c)
        .unwrap();
    assert_eq!(
        v,
        [
            1, 4, 0, 1000, 1, 0, T0 as i64, 1000, // tracked
            1, 4, 0, 1000, 1, 0, // not
            -1, 10, 0, 0, 0, 0, 0, 0, // a bad settle, tracked form: 8
        ]
    );
}

/// A refund while reservations wait for their tokens: burst 1, a token a second. X takes the
/// token at 0 ms; A and B reserve (released at 1000 and 2000 ms); A's client leaves, and its
/// refund reaches Redis at 500 ms. Given back, it would let C reserve the slot B already holds:
/// B and C both released at 2000 ms, two at one instant where the bound is 1. The refund gives
/// nothing until the last reservation is released (W); after it, the spill epoch's rule applies.
#[test]
fn a_refund_never_hands_out_a_slot_a_reservation_holds() {
    let (_r, mut c) = start("lua-spill-reserved");
    let l = (1, 1000);
    let x = tracked_waiting(&mut c, l, 1, 5000, "0:0:0:0", 0);
    assert_eq!((x[0], x[2]), (1, 0), "X: the full bucket's token");
    let a = tracked_waiting(&mut c, l, 1, 5000, "0:0:0:0", 0);
    assert_eq!((a[0], a[2]), (1, 1000), "A reserves the token of 1000 ms");
    let b = tracked_waiting(&mut c, l, 1, 5000, "0:0:0:0", 0);
    assert_eq!((b[0], b[2]), (1, 2000), "B reserves the token of 2000 ms");
    let _ = tracked_waiting(&mut c, l, 0, 5000, &refund_of(1, &a), 500);
    let cc = tracked_waiting(&mut c, l, 1, 5000, "0:0:0:0", 500);
    assert_eq!(cc[0], 1);
    let (b_at, c_at) = (2000, 500 + cc[2]);
    assert!(
        c_at >= b_at + 1000,
        "C released at {c_at} ms, B at {b_at} ms: a token a second"
    );
    assert_eq!(
        hash_field(&mut c, "W"),
        Some(T0 + 3_000_000),
        "W: C's release"
    );
}

/// A take without a holder record reserves nothing while holders hold tokens: burst 2, a token a
/// second, holder 7 leases both tokens at 0; X (cost 2, a wait of 3 s) would have reserved the
/// tokens of 2 s and gone through at 2 s as holder 7 spent its two, four at one instant. X is
/// denied until its tokens are there; once the holder reports holding nothing, X reserves again.
#[test]
fn a_take_reserves_nothing_beside_held_tokens() {
    let (_r, mut c) = start("lua-beside-held");
    let at = |ms: u64| (T0 + ms * 1000).to_string();
    let t0 = at(0);
    let h = eval_raw(
        &mut c,
        KEY,
        &["2", "1", "1000", "1", "2:7:1:5000:0:0", "0", "0", &t0],
    )
    .unwrap();
    assert_eq!((h[0], h[4]), (1, 2), "holder 7 leases both tokens");
    let x = eval_raw(&mut c, KEY, &["2", "1", "1000", "2", "0", "3000", "0", &t0]).unwrap();
    assert_eq!((x[0], x[2]), (0, 2000), "X reserves nothing beside them");
    // At 100 ms holder 7 says it has held nothing for the last 100 ms: nothing is held.
    let t100 = at(100);
    let h = eval_raw(
        &mut c,
        KEY,
        &["2", "1", "1000", "0", "1:7:2:5000:0:100", "0", "0", &t100],
    )
    .unwrap();
    assert_eq!(h[0], 1);
    assert_eq!(hash_field(&mut c, "o"), Some(0), "no token held");
    let x = eval_raw(
        &mut c,
        KEY,
        &["2", "1", "1000", "2", "0", "3000", "0", &t100],
    )
    .unwrap();
    assert_eq!(x[0], 1, "X reserves when nothing is held: {x:?}");
}

/// After the last reservation was released, a refund comes back as the spill epoch allows: a
/// reservation whose request used nothing, refunded at its release, gives its token back to a
/// bucket that never came close to full since (burst 2, drained).
#[test]
fn a_refund_after_the_last_release_comes_back() {
    let (_r, mut c) = start("lua-spill-released");
    let l = (2, 1000);
    let _ = tracked_waiting(&mut c, l, 2, 5000, "0:0:0:0", 0);
    let a = tracked_waiting(&mut c, l, 2, 5000, "0:0:0:0", 0);
    assert_eq!(
        (a[0], a[2]),
        (1, 2000),
        "A reserves two tokens, released at 2000 ms"
    );
    let _ = tracked_waiting(&mut c, l, 0, 5000, &refund_of(1, &a), 1999);
    let u: i64 = redis::cmd("HGET").arg(KEY).arg("u").query(&mut c).unwrap();
    assert_eq!(
        u, -1,
        "before A's release: nothing comes back (1 ms of refill short of 0)"
    );
    let r = tracked_waiting(&mut c, l, 0, 5000, &refund_of(1, &a), 2000);
    assert_eq!(r[1], 1, "at its release: its token comes back");
}
