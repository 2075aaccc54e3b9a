//! The script's batched form on both transports: its commands carry each call's arguments exactly
//! as the single form does, and its replies decode whole or not at all.
//!
//! Input: first byte odd = build a batch of 1 to 8 arbitrary calls from the rest and read the
//! Webdis and RESP commands back with independent readers; even = decode the rest as the answer to
//! a batch of `1 + (byte / 2) % 8` keys, as a Webdis body and as a RESP reply.
#![no_main]

use libfuzzer_sys::arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use tollgate_core::backend::webdis::Invoke;
use tollgate_core::backend::{
    batch_replies, resp, webdis, BackendError, ScriptCall, MAX_REPLY_BYTES,
};

#[path = "../common/script_call.rs"]
mod script_call;
use script_call::Input;

/// A strict reader of `*N` + N bulk strings, written independently of the codec.
fn split_resp(mut b: &[u8]) -> Vec<Vec<u8>> {
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

/// Webdis' reading of a body: split on `/`, each segment percent-decoded.
fn split_webdis(body: &[u8]) -> Vec<Vec<u8>> {
    assert!(
        body.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"/-_~%".contains(&b)),
        "a byte Webdis could read differently"
    );
    body.split(|&b| b == b'/')
        .map(|seg| {
            let mut out = Vec::new();
            let mut i = 0;
            while i < seg.len() {
                if seg[i] == b'%' {
                    let hex = std::str::from_utf8(&seg[i + 1..i + 3]).unwrap();
                    out.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 3;
                } else {
                    out.push(seg[i]);
                    i += 1;
                }
            }
            out
        })
        .collect()
}

/// `args` is the batched form of `calls`: verb, script, n, the keys, `batch`, then each call's
/// count and exactly the arguments its single command (`single`) sends after its key, or `0`
/// alone when they are the previous call's (and only then).
fn check_batch(
    args: &[Vec<u8>],
    calls: &[ScriptCall],
    verb: &[u8],
    script: &str,
    single: &dyn Fn(&ScriptCall) -> Vec<Vec<u8>>,
) {
    let n = calls.len();
    assert_eq!(args[0], verb);
    assert_eq!(args[1], script.as_bytes());
    assert_eq!(args[2], n.to_string().as_bytes());
    for (i, c) in calls.iter().enumerate() {
        assert_eq!(args[3 + i], c.key.as_bytes());
    }
    assert_eq!(args[3 + n], b"batch");
    let mut at = 4 + n;
    let mut previous: Option<Vec<Vec<u8>>> = None;
    for c in calls {
        let own = single(c).split_off(4);
        if previous.as_ref() == Some(&own) {
            assert_eq!(args[at], b"0");
            at += 1;
            continue;
        }
        assert_eq!(args[at], own.len().to_string().as_bytes());
        assert_eq!(&args[at + 1..at + 1 + own.len()], own.as_slice());
        at += 1 + own.len();
        previous = Some(own);
    }
    assert_eq!(at, args.len());
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 1 {
        let mut u = Unstructured::new(rest);
        let Ok(inputs) = Vec::<Input>::arbitrary(&mut u) else {
            return;
        };
        let calls: Vec<ScriptCall> = inputs.iter().take(8).map(|i| i.call().0).collect();
        if calls.is_empty() {
            return;
        }
        let refs: Vec<&ScriptCall> = calls.iter().collect();
        let first = &inputs[0];
        let (invoke, verb): (Invoke<'_>, &[u8]) = if first.eval {
            (Invoke::Source(&first.script), b"EVAL")
        } else {
            (Invoke::Sha(&first.script), b"EVALSHA")
        };
        let body = webdis::batch_command(&refs, invoke);
        let args = split_webdis(&body);
        check_batch(&args, &calls, verb, &first.script, &|c| {
            split_webdis(&webdis::command(c, invoke))
        });
        let cmd = resp::batch_command(&refs, invoke);
        let args = split_resp(&cmd);
        check_batch(&args, &calls, verb, &first.script, &|c| {
            split_resp(&resp::command(c, invoke))
        });
        // Each transport's groups' bytes are all of its command but the verb, the script, n and
        // "batch".
        let webdis_groups: usize = calls.iter().map(webdis::group_bytes).sum();
        let resp_groups: usize = calls.iter().map(resp::group_bytes).sum();
        let script = first.script.len();
        assert!(body.len() <= verb.len() + 3 * script + 16 + webdis_groups);
        assert!(cmd.len() <= verb.len() + script + 128 + resp_groups);
        return;
    }
    let n = 1 + usize::from(mode / 2) % 8;
    // Webdis: whatever it accepts is a one-key object of exactly 6n integers, decoded per key.
    let got = webdis::decode_batch_reply(rest, n);
    if let Err(e) = &got {
        let _ = (e.class(), e.trips_breaker(), e.to_string());
    }
    if let Ok(groups) = &got {
        assert_eq!(groups.len(), n);
        let doc: serde_json::Value = serde_json::from_slice(rest).expect("accepted non-JSON");
        let obj = doc.as_object().expect("accepted a non-object");
        assert_eq!(obj.len(), 1);
        let items = obj
            .values()
            .next()
            .unwrap()
            .as_array()
            .expect("accepted a non-array");
        let ints: Vec<i64> = items
            .iter()
            .map(|v| v.as_i64().expect("a non-integer"))
            .collect();
        assert_eq!(batch_replies(&ints, n).as_ref(), Ok(groups));
    }
    if let Err(BackendError::CrossSlot) = &got {
        assert!(std::str::from_utf8(rest).is_ok_and(|s| s.contains("CROSSSLOT")));
    }
    assert_eq!(webdis::decode_batch_reply(rest, n), got, "deterministic");
    // RESP: whatever it accepts is `*6n` and 6n canonical integers, nothing after them.
    let got = resp::decode_batch_reply(rest, n);
    if let Err(e) = &got {
        let _ = (e.class(), e.trips_breaker(), e.to_string());
    }
    if let Ok(groups) = &got {
        assert_eq!(groups.len(), n);
        assert!(rest.len() <= MAX_REPLY_BYTES);
        let text = std::str::from_utf8(rest).expect("accepted non-UTF-8");
        let mut lines = text.split("\r\n");
        assert_eq!(lines.next(), Some(format!("*{}", 6 * n).as_str()));
        let ints: Vec<i64> = lines
            .by_ref()
            .take(6 * n)
            .map(|l| {
                let v: i64 = l.strip_prefix(':').expect("a non-integer").parse().unwrap();
                assert_eq!(l, format!(":{v}"), "a non-canonical integer");
                v
            })
            .collect();
        assert_eq!(lines.collect::<Vec<_>>(), [""], "bytes after the array");
        assert_eq!(batch_replies(&ints, n).as_ref(), Ok(groups));
    }
    if let Err(BackendError::CrossSlot) = &got {
        assert!(rest.starts_with(b"-CROSSSLOT"));
    }
});
