//! The batched form as RESP: one command whose argv, read back by a strict reader, is the keys
//! then each key's single-form arguments; the batched reply decoded whole or not at all.

use super::*;
use crate::backend::batch::sample_calls;
use crate::backend::{MAX_BATCH_KEYS, MAX_REPLY_BYTES};

/// A strict RESP reader of one command: `*N` then exactly N bulk strings, nothing after.
fn argv(cmd: &[u8]) -> Vec<Vec<u8>> {
    fn line<'a>(rest: &mut &'a [u8]) -> &'a [u8] {
        let end = rest.windows(2).position(|w| w == b"\r\n").expect("a line");
        let (l, tail) = rest.split_at(end);
        *rest = &tail[2..];
        l
    }
    let mut rest = cmd;
    let head = line(&mut rest);
    assert_eq!(head[0], b'*');
    let n: usize = std::str::from_utf8(&head[1..]).unwrap().parse().unwrap();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let h = line(&mut rest);
        assert_eq!(h[0], b'$');
        let len: usize = std::str::from_utf8(&h[1..]).unwrap().parse().unwrap();
        out.push(rest[..len].to_vec());
        assert_eq!(&rest[len..len + 2], b"\r\n");
        rest = &rest[len + 2..];
    }
    assert!(rest.is_empty(), "one command, nothing after it");
    out
}

fn s(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

#[test]
fn a_batch_is_one_command_of_the_keys_then_each_keys_single_arguments() {
    let calls = sample_calls();
    let refs: Vec<&ScriptCall> = calls.iter().collect();
    let args = argv(&batch_command(&refs, Invoke::Sha("deadbeef")));
    let n = calls.len();
    assert_eq!(s(&args[0]), "EVALSHA");
    assert_eq!(s(&args[1]), "deadbeef");
    assert_eq!(s(&args[2]), n.to_string());
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(args[3 + i], call.key.as_bytes(), "key {i}");
    }
    assert_eq!(s(&args[3 + n]), "batch");
    let mut at = 4 + n;
    let mut counts = Vec::new();
    for call in &calls {
        let single = argv(&command(call, Invoke::Sha("deadbeef")));
        let own = &single[4..];
        assert_eq!(s(&args[at]), own.len().to_string(), "{}", call.key);
        assert_eq!(&args[at + 1..at + 1 + own.len()], own, "{}", call.key);
        counts.push(own.len());
        at += 1 + own.len();
    }
    assert_eq!(at, args.len());
    // The single form's trailing zeros are left out in a group as in the single call.
    assert_eq!(counts, [5, 9, 7, 6, 5, 5]);
}

#[test]
fn a_batch_goes_out_as_evalsha_or_eval() {
    let calls = sample_calls();
    let refs: Vec<&ScriptCall> = calls.iter().take(3).collect();
    let Outgoing::Resp(cmd) = Resp::new().request_batch(&refs, false) else {
        panic!("not a RESP command")
    };
    let args = argv(&cmd);
    assert_eq!(s(&args[0]), "EVALSHA");
    assert_eq!(s(&args[1]), crate::backend::script::sha1_hex());
    let Outgoing::Resp(cmd) = Resp::new().request_batch(&refs, true) else {
        panic!("not a RESP command")
    };
    let args = argv(&cmd);
    assert_eq!(s(&args[0]), "EVAL");
    assert_eq!(args[1], crate::backend::script::SOURCE.as_bytes());
    assert_eq!(s(&args[2]), "3");
    assert_eq!(s(&args[6]), "batch");
}

#[test]
fn group_bytes_are_the_bytes_a_call_adds() {
    let calls = sample_calls();
    let refs: Vec<&ScriptCall> = calls.iter().collect();
    let cmd = batch_command(&refs, Invoke::Sha("abc"));
    // `*<count>\r\n`, the verb, the SHA, the key count and "batch".
    let count = argv(&cmd).len();
    let head = format!("*{count}\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n6\r\n$5\r\nbatch\r\n");
    let groups: usize = calls.iter().map(group_bytes).sum();
    assert_eq!(cmd.len(), head.len() + groups);
}

fn wire(ints: &[i64]) -> Vec<u8> {
    let mut w = format!("*{}\r\n", ints.len()).into_bytes();
    for i in ints {
        w.extend_from_slice(format!(":{i}\r\n").as_bytes());
    }
    w
}

#[test]
fn decodes_six_integers_per_key() {
    let ints = [
        1, 9, 0, 100, 1, 0, 0, 0, 250, 1000, 0, 1, -1, 13, 0, 0, 0, 0,
    ];
    let out = Resp::new()
        .decode_batch(&Answer::Redis(Payload::Read(wire(&ints))), 3, &[])
        .unwrap();
    assert_eq!(out, crate::backend::batch_replies(&ints, 3).unwrap());
    assert!(out[0].as_ref().is_ok_and(|r| r.allowed && r.remaining == 9));
    assert!(out[1]
        .as_ref()
        .is_ok_and(|r| r.penalized == crate::bucket::Penalized::Offence));
    assert_eq!(
        out[2],
        Err(BackendError::Redis("ERR tollgate: script error".into()))
    );
}

#[test]
fn any_count_but_six_per_key_is_malformed_as_a_whole() {
    let one = [1i64, 9, 0, 100, 1, 0];
    for n in 1..=3usize {
        for len in [6 * n - 1, 6 * n + 1, 0] {
            let ints: Vec<i64> = one.iter().copied().cycle().take(len).collect();
            let got = decode_batch_reply(&wire(&ints), n);
            assert!(
                matches!(got, Err(BackendError::Malformed(_))),
                "n {n}, {len} integers: {got:?}"
            );
        }
    }
    for bad in [
        &b"*6\r\n:1\r\n:9\r\n:0\r\n:100\r\n:1\r\n"[..],
        b"*6\r\n:1\r\n:9\r\n:0\r\n:100\r\n:1\r\n:0\r\n:0\r\n",
        b"*6\r\n:1\r\n:9\r\n:0\r\n:100\r\n:1\r\n$1\r\n0\r\n",
        b"*6\r\n:1\r\n:9\r\n:0\r\n:100\r\n:1\r\n:00\r\n",
        b"*6\r\n:1\r\n:9\r\n:0\r\n:100\r\n:1\r\n*0\r\n",
        b"*1\r\n*6\r\n:1\r\n:9\r\n:0\r\n:100\r\n:1\r\n:0\r\n",
        b"*-1\r\n",
        b"*99999999\r\n:1\r\n",
        b"+OK\r\n",
        b"",
    ] {
        assert!(
            matches!(decode_batch_reply(bad, 1), Err(BackendError::Malformed(_))),
            "{}",
            s(bad)
        );
    }
}

#[test]
fn whole_errors_of_a_batch() {
    let cases = [
        (
            &b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"[..],
            BackendError::CrossSlot,
        ),
        (
            b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
            BackendError::NoScript,
        ),
        (
            b"-ERR tollgate: bad argument batch\r\n",
            BackendError::Redis("ERR tollgate: bad argument batch".into()),
        ),
        (
            b"-ERR Protocol error: unauthenticated multibulk length\r\n",
            BackendError::Redis("ERR Protocol error: unauthenticated multibulk length".into()),
        ),
    ];
    for (reply, want) in cases {
        assert_eq!(decode_batch_reply(reply, 2), Err(want), "{}", s(reply));
    }
    assert_eq!(
        decode_batch_answer(&Answer::NoAnswer, 2),
        Err(BackendError::Reset)
    );
    let big = Answer::Redis(Payload::TooLarge(MAX_REPLY_BYTES + 1));
    assert!(matches!(
        decode_batch_answer(&big, 2),
        Err(BackendError::Malformed(_))
    ));
    let http = Answer::Http {
        status: 200,
        body: Payload::Read(br#"{"EVALSHA":[1,9,0,100,1,0]}"#.to_vec()),
    };
    assert!(matches!(
        decode_batch_answer(&http, 1),
        Err(BackendError::Malformed(_))
    ));
    // A single call has one key: CROSSSLOT is not about slots it could be split by.
    assert_eq!(
        decode_reply(b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"),
        Err(BackendError::Redis(
            "CROSSSLOT Keys in request don't hash to the same slot".into()
        ))
    );
}

/// The longest reply a full batch can get (every integer 20 characters) fits the bound.
#[test]
fn a_full_batchs_longest_reply_is_read() {
    let ints = vec![i64::MIN; 6 * MAX_BATCH_KEYS];
    let reply = wire(&ints);
    assert!(reply.len() <= MAX_REPLY_BYTES, "{}", reply.len());
    let out = decode_batch_reply(&reply, MAX_BATCH_KEYS).unwrap();
    assert_eq!(out.len(), MAX_BATCH_KEYS);
    assert!(out
        .iter()
        .all(|r| matches!(r, Err(BackendError::Malformed(_)))));
}

/// A key whose arguments are the previous key's goes as the count 0 alone; one whose arguments
/// differ (another cost) is written out again.
#[test]
fn a_key_with_the_previous_keys_arguments_is_sent_as_zero() {
    let calls = crate::backend::batch::repeating_calls();
    let refs: Vec<&ScriptCall> = calls.iter().collect();
    let args = argv(&batch_command(&refs, Invoke::Sha("ab")));
    assert_eq!(args[8], b"batch");
    let groups: Vec<String> = args[9..]
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let written = |cost: &str| ["5", "200", "100", "1000", cost, "0"].map(String::from);
    let repeat = || vec!["0".to_string()];
    let want = [
        written("1").to_vec(),
        repeat(),
        repeat(),
        written("2").to_vec(),
        repeat(),
    ]
    .concat();
    assert_eq!(groups, want, "{args:?}");
}
