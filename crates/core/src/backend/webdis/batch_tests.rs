//! The batched form on Webdis: each argument one segment that Webdis decodes back, each key's
//! arguments its single form's; the batched answer decoded whole or not at all, and its fast path
//! reading exactly what serde_json reads.

use super::*;
use crate::backend::batch::sample_calls;
use crate::backend::{Transport, MAX_BATCH_KEYS, MAX_REPLY_BYTES};

/// Webdis' own decoding of a POST body: split on `/`, each segment `%XX`-decoded (`+` a space).
fn argv(body: &[u8]) -> Vec<Vec<u8>> {
    body.split(|&b| b == b'/')
        .map(crate::rule::reading::percent_decode)
        .collect()
}

fn s(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

#[test]
fn a_batch_is_the_keys_then_each_keys_single_arguments() {
    let calls = sample_calls();
    let refs: Vec<&ScriptCall> = calls.iter().collect();
    let body = batch_command(&refs, Invoke::Sha("deadbeef"));
    assert!(
        body.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"/-_~%".contains(&b)),
        "{}",
        s(&body)
    );
    let args = argv(&body);
    let n = calls.len();
    assert_eq!(s(&args[0]), "EVALSHA");
    assert_eq!(s(&args[1]), "deadbeef");
    assert_eq!(s(&args[2]), n.to_string());
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(args[3 + i], call.key.as_bytes(), "key {i}");
    }
    assert_eq!(s(&args[3 + n]), "batch");
    // Then per key: its count and exactly what its single call sends after its key.
    let mut at = 4 + n;
    for call in &calls {
        let single = argv(&command(call, Invoke::Sha("deadbeef")));
        let own = &single[4..];
        assert_eq!(s(&args[at]), own.len().to_string(), "{}", call.key);
        assert_eq!(&args[at + 1..at + 1 + own.len()], own, "{}", call.key);
        at += 1 + own.len();
    }
    assert_eq!(at, args.len(), "nothing after the last group");
    // A penalty rule's group carries 9 arguments, the others 7.
    let counts: Vec<String> = {
        let mut at = 4 + n;
        calls
            .iter()
            .map(|_| {
                let c = s(&args[at]);
                at += 1 + c.parse::<usize>().unwrap();
                c
            })
            .collect()
    };
    assert_eq!(counts, ["7", "9", "7", "7", "7", "7"]);
}

#[test]
fn a_batch_goes_out_as_a_post_evalsha_or_eval() {
    let calls = sample_calls();
    let refs: Vec<&ScriptCall> = calls.iter().take(2).collect();
    let webdis = Webdis::new("webdis", Some("user:pass"));
    let Outgoing::Http(req) = webdis.request_batch(&refs, false) else {
        panic!("not an HTTP callout")
    };
    let Outgoing::Http(single) = webdis.request(&calls[0], false) else {
        panic!("not an HTTP callout")
    };
    assert_eq!(req.headers, single.headers);
    let args = argv(&req.body);
    assert_eq!(s(&args[0]), "EVALSHA");
    assert_eq!(s(&args[1]), crate::backend::script::sha1_hex());
    let Outgoing::Http(eval) = webdis.request_batch(&refs, true) else {
        panic!("not an HTTP callout")
    };
    let args = argv(&eval.body);
    assert_eq!(s(&args[0]), "EVAL");
    assert_eq!(args[1], crate::backend::script::SOURCE.as_bytes());
    assert_eq!(s(&args[2]), "2");
    assert_eq!(s(&args[5]), "batch");
}

/// The single form is byte for byte what it was before the batched form shared its writer.
#[test]
fn the_single_form_is_unchanged() {
    let calls = sample_calls();
    let bodies: Vec<String> = calls
        .iter()
        .map(|c| s(&command(c, Invoke::Sha("abc"))))
        .collect();
    assert_eq!(
        bodies,
        [
            "EVALSHA/abc/1/tollgate%3A%7Bper-user%3Aab12%7D/200/100/1000/1/0/0/0",
            "EVALSHA/abc/1/tollgate%3A%7Blogin%3Acd34%7D/200/100/1000/3/0/250/0/time/3600000%3A120000%3A300000",
            "EVALSHA/abc/1/tollgate%3A%7Btokens%3Aef56%7D/200/100/1000/0/0/0/-17",
            "EVALSHA/abc/1/tollgate%3A%7Blease%3A0a%7D/200/100/1000/1/50%3A7%3A3%3A1450%3A40%3A30/2000/0",
            "EVALSHA/abc/1/a%2Fb%2Bc%3Fd%252F%2Ejson%0D%0A%243%0D%0A%2A1%20%7Bx%7D%C3%A9/200/100/1000/2/0/0/0",
            "EVALSHA/abc/1/tollgate%3A%7Bper-user%3Aab12%7D/200/100/1000/1/0/0/0",
        ]
    );
}

/// `group_bytes` is what each call adds to the command: the bound the engine keeps is real.
#[test]
fn group_bytes_are_the_bytes_a_call_adds() {
    let calls = sample_calls();
    let head = b"EVALSHA/abc/6/batch".len();
    let refs: Vec<&ScriptCall> = calls.iter().collect();
    let body = batch_command(&refs, Invoke::Sha("abc"));
    let groups: usize = calls.iter().map(group_bytes).sum();
    assert_eq!(body.len(), head + groups);
}

fn ok_body(ints: &[i64]) -> Vec<u8> {
    let list: Vec<String> = ints.iter().map(i64::to_string).collect();
    format!(r#"{{"EVALSHA":[{}]}}"#, list.join(",")).into_bytes()
}

fn http(body: Vec<u8>) -> Answer {
    Answer::Http {
        status: 200,
        body: Payload::Read(body),
    }
}

#[test]
fn decodes_six_integers_per_key() {
    let ints = [1, 9, 0, 100, 1, 0, 0, 0, 250, 1000, 0, 0, -1, 6, 0, 0, 0, 0];
    let webdis = Webdis::new("webdis", None);
    let out = webdis.decode_batch(&http(ok_body(&ints)), 3, &[]).unwrap();
    assert_eq!(out, crate::backend::batch_replies(&ints, 3).unwrap());
    assert!(out[0].as_ref().is_ok_and(|r| r.allowed && r.remaining == 9));
    assert!(out[1]
        .as_ref()
        .is_ok_and(|r| !r.allowed && r.retry_after_ms == 250));
    assert_eq!(
        out[2],
        Err(BackendError::Redis(
            "ERR tollgate: bad argument cost".into()
        ))
    );
    // The fast path read it: serde_json reads the same.
    assert_eq!(integers(&ok_body(&ints), 18), Some(ints.to_vec()));
}

#[test]
fn any_count_but_six_per_key_is_malformed_as_a_whole() {
    let one = [1i64, 9, 0, 100, 1, 0];
    for n in 1..=3usize {
        for len in [6 * n - 1, 6 * n + 1, 6 * n + 6, 0] {
            let ints: Vec<i64> = one.iter().copied().cycle().take(len).collect();
            let got = decode_batch_reply(&ok_body(&ints), n);
            assert!(
                matches!(got, Err(BackendError::Malformed(_))),
                "n {n}, {len} integers: {got:?}"
            );
        }
    }
    // The single form's reply to a batch, and a batch's to a single call.
    assert!(matches!(
        decode_batch_reply(br#"{"EVALSHA":[1,9,0,100,1]}"#, 1),
        Err(BackendError::Malformed(_))
    ));
    assert!(matches!(
        decode_reply(&ok_body(&[1, 9, 0, 100, 1, 0, 1, 9, 0, 100, 1, 0])),
        Err(BackendError::Malformed(_))
    ));
    for bad in [
        &br#"{"EVALSHA":[1,9,0,100,1,"0"]}"#[..],
        br#"{"EVALSHA":[1,9,0,100,1,null]}"#,
        br#"{"EVALSHA":[1,9,0,100,1,0.5]}"#,
        br#"{"EVALSHA":[[1,9,0,100,1,0]]}"#,
        br#"{"EVALSHA":[1,9,0,100,1,0],"EVAL":[1,9,0,100,1,0]}"#,
        br#"{"EVALSHA":null}"#,
        br#"[1,9,0,100,1,0]"#,
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
            &br#"{"EVALSHA":[false,"CROSSSLOT Keys in request don't hash to the same slot"]}"#[..],
            BackendError::CrossSlot,
        ),
        (
            br#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#,
            BackendError::NoScript,
        ),
        (
            br#"{"EVALSHA":[false,"ERR tollgate: bad argument batch"]}"#,
            BackendError::Redis("ERR tollgate: bad argument batch".into()),
        ),
        (
            br#"{"EVALSHA":[false,"ERR no upstream host"]}"#,
            BackendError::Redis("ERR no upstream host".into()),
        ),
    ];
    for (body, want) in cases {
        assert_eq!(decode_batch_reply(body, 2), Err(want), "{}", s(body));
    }
    assert_eq!(
        decode_batch_answer(&Answer::NoAnswer, 2),
        Err(BackendError::Reset)
    );
    let status = Answer::Http {
        status: 503,
        body: Payload::Read(Vec::new()),
    };
    assert_eq!(
        decode_batch_answer(&status, 2),
        Err(BackendError::Status(503))
    );
    let big = Answer::Http {
        status: 200,
        body: Payload::TooLarge(MAX_REPLY_BYTES + 1),
    };
    assert!(matches!(
        decode_batch_answer(&big, 2),
        Err(BackendError::Malformed(_))
    ));
    let resp = Answer::Redis(Payload::Read(
        b"*6\r\n:1\r\n:9\r\n:0\r\n:1\r\n:1\r\n:0\r\n".to_vec(),
    ));
    assert!(matches!(
        decode_batch_answer(&resp, 1),
        Err(BackendError::Malformed(_))
    ));
    // A single call has one key: CROSSSLOT is not about slots it could be split by.
    assert_eq!(
        decode_reply(
            br#"{"EVALSHA":[false,"CROSSSLOT Keys in request don't hash to the same slot"]}"#
        ),
        Err(BackendError::Redis(
            "CROSSSLOT Keys in request don't hash to the same slot".into()
        ))
    );
}

/// The largest reply a full batch can get fits the bound, so it is read.
#[test]
fn a_full_batchs_longest_reply_is_read() {
    let ints = vec![-999_999_999_999_999_999i64; 6 * MAX_BATCH_KEYS];
    let body = ok_body(&ints);
    assert!(body.len() <= MAX_REPLY_BYTES, "{}", body.len());
    let out = decode_batch_reply(&body, MAX_BATCH_KEYS).unwrap();
    assert_eq!(out.len(), MAX_BATCH_KEYS);
    // And serde_json's longest integers, which the fast path leaves to it.
    let list = vec![i64::MIN.to_string(); 6 * MAX_BATCH_KEYS].join(",");
    let body = format!(r#"{{"EVALSHA":[{list}]}}"#);
    assert!(body.len() <= MAX_REPLY_BYTES, "{}", body.len());
    assert_eq!(
        decode_batch_reply(body.as_bytes(), MAX_BATCH_KEYS).map(|v| v.len()),
        Ok(MAX_BATCH_KEYS)
    );
}

/// A small deterministic generator (xorshift64*), so the random bodies are the same every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One item of a JSON array as Webdis could write it, or as a hostile front might.
fn item(rng: &mut Rng) -> String {
    match rng.below(16) {
        0 => "0".into(),
        1 => "1".into(),
        2 => "-1".into(),
        3 => (rng.next() >> rng.below(64)).to_string(),
        4 => (-((rng.next() >> 1) as i64 >> rng.below(63))).to_string(),
        5 => "999999999999999999".into(),
        6 => "9999999999999999999".into(),
        7 => "-9223372036854775808".into(),
        8 => "01".into(),
        9 => "-0".into(),
        10 => "1.5".into(),
        11 => "1e3".into(),
        12 => " 2".into(),
        13 => "\"3\"".into(),
        14 => "null".into(),
        _ => rng.below(1000).to_string(),
    }
}

/// The batched reply as serde_json alone reads it (no fast path).
fn serde_only(body: &[u8], n: usize) -> Result<Vec<Result<Reply, BackendError>>, BackendError> {
    let items = json_items(body).map_err(crate::backend::batch::whole_error)?;
    if items.len() != n * 6 {
        return Err(BackendError::Malformed("count".into()));
    }
    crate::backend::batch_replies(&json_integers(&items)?, n)
}

/// The fast paths read exactly what serde_json reads, or leave the body to it: on random bodies
/// near the usual answer (odd items, other counts, other names, cut short, trailing bytes).
#[test]
fn the_fast_paths_agree_with_serde_on_random_bodies() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut fast = 0;
    for round in 0..20_000 {
        let n = 1 + rng.below(4) as usize;
        let len = match rng.below(4) {
            0 => 6 * n + rng.below(3) as usize,
            1 => (6 * n).saturating_sub(rng.below(3) as usize),
            2 => 5 + rng.below(2) as usize,
            _ => 6 * n,
        };
        let plain = rng.below(3) != 0;
        let items: Vec<String> = (0..len)
            .map(|_| {
                if plain {
                    rng.below(1000).to_string()
                } else {
                    item(&mut rng)
                }
            })
            .collect();
        let name = ["EVALSHA", "EVAL", "evalsha", "", "EVAL SHA"][rng.below(5) as usize];
        let mut body = format!(r#"{{"{name}":[{}]}}"#, items.join(",")).into_bytes();
        match rng.below(8) {
            0 => body.truncate(rng.below(body.len() as u64 + 1) as usize),
            1 => body.push(b' '),
            2 => body.insert(1 + rng.below(body.len() as u64 - 1) as usize, b' '),
            _ => {}
        }
        // The batched decoder against serde_json alone, whole results compared.
        let want = serde_only(&body, n);
        let got = decode_batch_reply(&body, n);
        match (&got, &want) {
            (Err(BackendError::Malformed(_)), Err(BackendError::Malformed(_))) => {}
            _ => assert_eq!(got, want, "round {round}: {}", s(&body)),
        }
        if let Some(ints) = integers(&body, 6 * n) {
            fast += 1;
            let items = json_items(&body).expect("serde_json reads what the fast path read");
            assert_eq!(
                json_integers(&items),
                Ok(ints),
                "round {round}: {}",
                s(&body)
            );
        }
        // The single form's fast path likewise.
        if let Some((ints, count)) = small_integers(&body) {
            let items = json_items(&body).expect("serde_json reads what the fast path read");
            assert_eq!(
                json_integers(&items),
                Ok(ints[..count].to_vec()),
                "round {round}: {}",
                s(&body)
            );
        }
    }
    assert!(fast > 1000, "the fast path read only {fast} bodies");
}

/// A key whose arguments are the previous key's goes as the count 0 alone; one whose arguments
/// differ (another cost) is written out again.
#[test]
fn a_key_with_the_previous_keys_arguments_is_sent_as_zero() {
    let calls = crate::backend::batch::repeating_calls();
    let refs: Vec<&ScriptCall> = calls.iter().collect();
    let body = s(&batch_command(&refs, Invoke::Sha("ab")));
    let groups = body.split_once("/batch/").unwrap().1;
    assert_eq!(
        groups, "7/200/100/1000/1/0/0/0/0/0/7/200/100/1000/2/0/0/0/0",
        "{body}"
    );
}
