//! RESP codec: `resp::decode_reply` never panics on any bytes and accepts exactly the canonical
//! five-integer array (re-encoding the decoded reply gives the input back byte for byte) or an error
//! line; `resp::command` for any call and script is an array of 9 to 11 bulk strings (the optional
//! trailing `max_wait_ms` and `settle` left out when 0) that a strict RESP reader splits back into
//! the inputs.
//!
//! Input: first byte selects the mode: even = decode the rest as a reply (a read reply, or with the
//! first byte 2 whether Redis replied in the second byte's low bit and the rest as the reply, as
//! the Higress callback reports it through `Answer::redis`); odd = build a command from the rest.
#![no_main]

use libfuzzer_sys::arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use tollgate_core::backend::resp::{command, decode_answer, decode_reply};
use tollgate_core::backend::webdis::Invoke;
use tollgate_core::backend::{Answer, BackendError, Payload, MAX_REPLY_BYTES};

#[path = "../common/script_call.rs"]
mod script_call;
use script_call::Input;

/// A strict reader of `*N` + N bulk strings, written independently of the codec.
fn split_command(mut b: &[u8]) -> Vec<Vec<u8>> {
    fn line<'a>(b: &mut &'a [u8]) -> &'a [u8] {
        let end = b.windows(2).position(|w| w == b"\r\n").expect("no CRLF");
        let (l, rest) = b.split_at(end);
        *b = &rest[2..];
        l
    }
    let head = line(&mut b);
    assert_eq!(head[0], b'*', "not an array");
    let n: usize = std::str::from_utf8(&head[1..]).unwrap().parse().unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let h = line(&mut b);
        assert_eq!(h[0], b'$', "not a bulk string");
        let len: usize = std::str::from_utf8(&h[1..]).unwrap().parse().unwrap();
        assert_eq!(&b[len..len + 2], b"\r\n", "bulk string not terminated");
        out.push(b[..len].to_vec());
        b = &b[len + 2..];
    }
    assert!(b.is_empty(), "{} trailing bytes", b.len());
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let (replied, reply) = match (mode, rest.split_first()) {
            (2, Some((&s, r))) => (s % 2 == 0, r),
            _ => (true, rest),
        };
        let answer = Answer::redis(replied, reply.len(), |n| Some(reply[..n].to_vec()));
        let got = decode_answer(&answer);
        match &answer {
            Answer::NoAnswer => {
                assert!(!replied);
                assert_eq!(got, Err(BackendError::Reset));
                return;
            }
            Answer::Redis(Payload::TooLarge(n)) => {
                assert!(*n == reply.len() && *n > MAX_REPLY_BYTES);
                assert!(matches!(got, Err(BackendError::Malformed(_))), "{got:?}");
                return;
            }
            Answer::Redis(Payload::Read(r)) => assert_eq!(r, reply),
            other => panic!("{other:?} from a Redis callback"),
        }
        assert_eq!(got, decode_reply(reply));
        if let Err(e) = &got {
            let _ = (e.trips_breaker(), e.class());
            let _ = e.to_string();
        }
        match &got {
            Ok(r) => {
                // Below -1 only on an allowed reply: a racer's paced grant, minus its next turn.
                assert!(r.retry_after_ms >= -1 || r.allowed, "{r:?}");
                let canonical = format!(
                    ":{}\r\n:{}\r\n:{}\r\n:{}\r\n:{}\r\n",
                    u8::from(r.allowed),
                    r.remaining,
                    r.retry_after_ms,
                    r.reset_after_ms,
                    r.granted
                );
                // Five integers, six with the penalty box's field (a penalty call's reply), or
                // eight with the spill epoch and the take's mark (a call in the tracked form).
                let five = format!("*5\r\n{canonical}");
                let six = format!("*6\r\n{canonical}:{}\r\n", r.penalized.code());
                let eight = r.epoch.map(|stamp| {
                    format!(
                        "*8\r\n{canonical}:{}\r\n:{}\r\n:{}\r\n",
                        r.penalized.code(),
                        stamp.epoch,
                        stamp.mark
                    )
                });
                assert!(
                    five.as_bytes() == reply
                        || six.as_bytes() == reply
                        || eight.is_some_and(|e| e.as_bytes() == reply),
                    "accepted a non-canonical reply"
                );
            }
            Err(BackendError::Redis(msg)) => {
                assert!(msg.len() <= 200, "{} bytes", msg.len());
                assert_eq!(
                    reply.first(),
                    Some(&b'-'),
                    "Redis error from a non-error reply"
                );
            }
            Err(BackendError::NoScript) => assert!(reply.starts_with(b"-NOSCRIPT")),
            Err(BackendError::Malformed(_)) => {}
            Err(other) => panic!("unexpected error kind {other:?}"),
        }
        if reply.len() > MAX_REPLY_BYTES {
            assert!(matches!(got, Err(BackendError::Malformed(_))));
        }
        return;
    }
    let Ok(input) = Input::arbitrary(&mut Unstructured::new(rest)) else {
        return;
    };
    let (call, lease) = input.call();
    let (invoke, verb): (Invoke<'_>, &[u8]) = if input.eval {
        (Invoke::Source(&input.script), b"EVAL")
    } else {
        (Invoke::Sha(&input.script), b"EVALSHA")
    };
    let args = split_command(&command(&call, invoke));
    let want_len = if input.settle != 0 {
        11
    } else if input.max_wait_ms != 0 {
        10
    } else {
        9
    };
    assert_eq!(args.len(), want_len);
    assert_eq!(args[0], verb);
    assert_eq!(args[1], input.script.as_bytes());
    assert_eq!(args[2], b"1");
    assert_eq!(args[3], input.key.as_bytes());
    let numbers = [
        input.burst.to_string(),
        input.rate.to_string(),
        input.period_ms.to_string(),
        input.cost.to_string(),
        lease,
        input.max_wait_ms.to_string(),
    ];
    for (arg, n) in args[4..].iter().zip(numbers) {
        assert_eq!(arg, n.as_bytes());
    }
    // Left out means 0, the script's default.
    let max_wait = args
        .get(9)
        .map_or("0".to_string(), |a| String::from_utf8_lossy(a).into_owned());
    assert_eq!(max_wait, input.max_wait_ms.to_string());
    let settle = args
        .get(10)
        .map_or("0".to_string(), |a| String::from_utf8_lossy(a).into_owned());
    assert_eq!(settle, input.settle.to_string());
});
