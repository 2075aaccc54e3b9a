//! The script's batched form on the wire, end to end without Envoy: the codecs' batched commands
//! (`backend::webdis::batch_command` through a real Webdis, `backend::resp::batch_command` straight
//! to a real Redis) run the real script, and their decoded replies are what the same calls answer
//! one by one, key by key. A cluster-enabled Redis refuses a batch of two slots (CROSSSLOT, decoded
//! as `CrossSlot` on both transports, nothing written) and runs one of one slot; a Redis without
//! the script answers a batch NOSCRIPT. Needs `make setup` (redis-server, webdis).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{scratch_dir, wait_until, Redis, Webdis};
use tollgate_core::backend::webdis::Invoke;
use tollgate_core::backend::{
    reply_to, resp, script, slot, webdis, BackendError, Reply, ScriptCall,
};
use tollgate_core::bucket::{Holder, Limits, Penalty, Tracked, MAX_RATE};

/// Limits that refill nothing during the test (1 token a minute): every figure is exact.
const LIMITS: Limits = Limits {
    burst: 10,
    rate: 1,
    period_ms: 60_000,
};

/// Calls of every shape a batch carries, in an order where later ones see earlier ones: the same
/// key three times (the third asks more than is left), a penalty rule's call with a reservation,
/// a refund, a lease with a holder, a key of hostile bytes, and a key whose limits the script
/// refuses (its own error; the others go on).
fn calls() -> Vec<ScriptCall> {
    let user = "tollgate:{per-user:ab12}";
    let bad_rate = Limits {
        rate: MAX_RATE + 1,
        ..LIMITS
    };
    vec![
        // A take that may be refunded: the tracked form, its reply with the bucket's epoch.
        ScriptCall {
            track: Some(Tracked::default()),
            ..ScriptCall::new(user.into(), &LIMITS, 4)
        },
        ScriptCall {
            max_wait_ms: 250,
            penalty: Penalty::new(3_600_000, &[120_000]),
            ..ScriptCall::new("tollgate:{login:cd34}".into(), &LIMITS, 3)
        },
        ScriptCall::new(user.into(), &LIMITS, 4),
        // A refund in the tracked form whose epoch (0) is not the bucket's (Redis' clock made
        // it): it gives back nothing (tests/lua_script.rs covers what comes back).
        ScriptCall {
            track: Some(Tracked {
                refund: 2,
                epoch: 0,
                mark: 0,
            }),
            ..ScriptCall::new(user.into(), &LIMITS, 0)
        },
        ScriptCall {
            lease_want: 5,
            // Its demand travels after a slash: one segment through Webdis too.
            holder: Some(Box::new(
                Holder::new(7, 3, 1450, &[(4, 30)]).demanding(16_000),
            )),
            ..ScriptCall::new("tollgate:{lease:0a}".into(), &LIMITS, 1)
        },
        ScriptCall::new("a/b+c?d%2F.json\r\n$3\r\n*1 {x}é".into(), &LIMITS, 2),
        ScriptCall::new("tollgate:{bad:1}".into(), &bad_rate, 1),
        ScriptCall::new(user.into(), &LIMITS, 4),
    ]
}

/// A reply without its clock-dependent figures (retry and reset move with the ms between calls):
/// allowed, remaining, granted, penalized, and whether it says to retry later; or the error.
fn fields(r: &Result<Reply, BackendError>) -> String {
    match r {
        Ok(r) => format!(
            "allowed {} remaining {} granted {} penalized {:?} retry {}",
            r.allowed,
            r.remaining,
            r.granted,
            r.penalized,
            r.retry_after_ms > 0
        ),
        Err(e) => format!("{e:?}"),
    }
}

/// Sends `command` to Redis as is and reads one reply: an error line, or an array of `items`
/// integers.
fn redis_raw(port: u16, command: &[u8], items: usize) -> Vec<u8> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(command).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&out));
        out.extend_from_slice(&buf[..n]);
        let lines = out.windows(2).filter(|w| w == b"\r\n").count();
        if out.ends_with(b"\r\n") && (out.first() == Some(&b'-') || lines == 1 + items) {
            return out;
        }
    }
}

/// POSTs `body` to Webdis and reads the answer's body (by its content-length: Webdis does not
/// answer a large POST sent with `connection: close`).
fn webdis_post(port: u16, body: &[u8]) -> Vec<u8> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "POST / HTTP/1.1\r\nhost: webdis\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&out));
        out.extend_from_slice(&buf[..n]);
        let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .expect("a content-length")
            .trim()
            .parse()
            .unwrap();
        if out.len() >= end + 4 + len {
            return out[end + 4..end + 4 + len].to_vec();
        }
    }
}

fn flushall(redis: &Redis) {
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
}

/// Each call's outcome (checked against its call, as the engine does) as `fields`.
fn checked(out: Vec<Result<Reply, BackendError>>, calls: &[ScriptCall]) -> Vec<String> {
    out.into_iter()
        .zip(calls)
        .map(|(r, c)| fields(&r.and_then(|r| reply_to(c, r))))
        .collect()
}

#[test]
fn a_batch_answers_as_its_calls_one_by_one_on_both_transports() {
    let dir = scratch_dir("batch-wire");
    let redis = Redis::start(&dir);
    let webdis_proc = Webdis::start(&dir, redis.port);
    let calls = calls();
    let refs: Vec<&ScriptCall> = calls.iter().collect();
    let n = calls.len();
    let src = Invoke::Source(script::SOURCE);

    // The reference: each call alone, in order, on an empty Redis.
    flushall(&redis);
    let singles: Vec<String> = calls
        .iter()
        .map(|c| {
            let items = match (c.tracked(), c.penalty.is_some()) {
                (true, _) => 8,
                (false, penalty) => 5 + usize::from(penalty),
            };
            let reply = redis_raw(redis.port, &resp::command(c, src), items);
            fields(&resp::decode_reply(&reply).and_then(|r| reply_to(c, r)))
        })
        .collect();
    // What the calls do to one another, so the comparison below means something.
    assert!(
        singles[0].starts_with("allowed true remaining 6 "),
        "{singles:?}"
    );
    assert!(
        singles[2].starts_with("allowed true remaining 2 "),
        "{singles:?}"
    );
    assert!(
        singles[3].starts_with("allowed true remaining 2 "),
        "{singles:?}"
    );
    assert!(
        singles[7].starts_with("allowed false remaining 2 "),
        "{singles:?}"
    );
    assert_eq!(
        singles[6], r#"Redis("ERR tollgate: bad argument rate")"#,
        "{singles:?}"
    );
    // The lease call (with its demand) is granted what it asked for.
    assert!(
        singles[4].starts_with("allowed true") && singles[4].contains(" granted 5 "),
        "{singles:?}"
    );

    flushall(&redis);
    let asks: Vec<bool> = calls.iter().map(ScriptCall::tracked).collect();
    let ints = tollgate_core::backend::reply_ints(n, &asks);
    let reply = redis_raw(redis.port, &resp::batch_command(&refs, src), ints);
    let got = resp::decode_batch_reply_asked(&reply, n, &asks).unwrap();
    assert_eq!(checked(got, &calls), singles, "RESP");

    flushall(&redis);
    let body = webdis_post(webdis_proc.port, &webdis::batch_command(&refs, src));
    let got = webdis::decode_batch_reply_asked(&body, n, &asks).unwrap();
    assert_eq!(checked(got, &calls), singles, "Webdis");

    // EVALSHA now that Redis has the script; after SCRIPT FLUSH, NOSCRIPT for the whole batch.
    let sha = script::sha1_hex();
    flushall(&redis);
    let body = webdis_post(
        webdis_proc.port,
        &webdis::batch_command(&refs, Invoke::Sha(&sha)),
    );
    let got = webdis::decode_batch_reply_asked(&body, n, &asks).unwrap();
    assert_eq!(checked(got, &calls), singles, "Webdis EVALSHA");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut redis.conn())
        .unwrap();
    let body = webdis_post(
        webdis_proc.port,
        &webdis::batch_command(&refs, Invoke::Sha(&sha)),
    );
    assert_eq!(
        webdis::decode_batch_reply(&body, n),
        Err(BackendError::NoScript)
    );
    let reply = redis_raw(
        redis.port,
        &resp::batch_command(&refs, Invoke::Sha(&sha)),
        0,
    );
    assert_eq!(
        resp::decode_batch_reply(&reply, n),
        Err(BackendError::NoScript)
    );

    // A key that is not a hash: that key's script error; the others are applied.
    flushall(&redis);
    let _: () = redis::cmd("SET")
        .arg(&calls[1].key)
        .arg("x")
        .query(&mut redis.conn())
        .unwrap();
    let reply = redis_raw(redis.port, &resp::batch_command(&refs[..3], src), 20);
    let got = resp::decode_batch_reply_asked(&reply, 3, &asks[..3]).unwrap();
    let got = checked(got, &calls[..3]);
    assert_eq!(got[1], r#"Redis("ERR tollgate: script error")"#, "{got:?}");
    assert_eq!([&got[0], &got[2]], [&singles[0], &singles[2]]);
}

#[test]
fn a_cluster_refuses_a_batch_of_two_slots_and_runs_one_of_one_slot() {
    let dir = scratch_dir("batch-wire-cluster");
    let node = Redis::start_with(&dir, &["--cluster-enabled", "yes"]);
    let mut conn = node.conn();
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query(&mut conn)
        .unwrap();
    let ok = wait_until(Duration::from_secs(20), || {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut conn)
            .unwrap_or_default();
        info.contains("cluster_state:ok")
    });
    assert!(
        ok,
        "the one-node cluster is not ok\n{}",
        node.proc.log_text()
    );
    let webdis_proc = Webdis::start(&dir, node.port);
    let src = Invoke::Source(script::SOURCE);
    let a = ScriptCall::new("tollgate:{per-user:ab12}".into(), &LIMITS, 1);
    let b = ScriptCall::new("tollgate:{per-user:cd34}".into(), &LIMITS, 1);
    // The same hash tag under another prefix: the same slot.
    let a2 = ScriptCall::new("other:{per-user:ab12}".into(), &LIMITS, 1);
    assert_ne!(slot(&a.key), slot(&b.key));
    assert_eq!(slot(&a.key), slot(&a2.key));

    let reply = redis_raw(node.port, &resp::batch_command(&[&a, &b], src), 0);
    assert_eq!(
        resp::decode_batch_reply(&reply, 2),
        Err(BackendError::CrossSlot)
    );
    let body = webdis_post(webdis_proc.port, &webdis::batch_command(&[&a, &b], src));
    assert_eq!(
        webdis::decode_batch_reply(&body, 2),
        Err(BackendError::CrossSlot)
    );
    // Refused before the script ran: nothing was written.
    let keys: u64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    assert_eq!(keys, 0);

    let body = webdis_post(
        webdis_proc.port,
        &webdis::batch_command(&[&a, &a2, &a], src),
    );
    let got: Vec<String> = webdis::decode_batch_reply(&body, 3)
        .unwrap()
        .iter()
        .map(fields)
        .collect();
    assert_eq!(
        got,
        [
            "allowed true remaining 9 granted 1 penalized No retry false",
            "allowed true remaining 9 granted 1 penalized No retry false",
            "allowed true remaining 8 granted 1 penalized No retry false",
        ]
    );
}
