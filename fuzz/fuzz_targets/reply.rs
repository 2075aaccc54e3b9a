//! Backend reply decoding: an HTTP callout's answer as the host reports it (`Answer::http`) decodes
//! (`webdis::decode_answer`) without a panic, and what it accepts is exactly a well-formed script
//! reply.
//!
//! Input: the body with status 200, or `!` + 4 bytes of status (little-endian) + the body, so seed
//! files can be plain Webdis JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::backend::webdis::{decode_answer, decode_reply};
use tollgate_core::backend::{Answer, BackendError, Payload, MAX_REPLY_BYTES};

fuzz_target!(|data: &[u8]| {
    let (status, body) = match data.split_first() {
        Some((b'!', rest)) if rest.len() >= 4 => {
            let (s, body) = rest.split_at(4);
            (u32::from_le_bytes([s[0], s[1], s[2], s[3]]), body)
        }
        _ => (200, data),
    };
    let answer = Answer::http(
        1,
        || Some(status.to_string().into_bytes()),
        body.len(),
        |n| Some(body[..n].to_vec()),
    );
    let read = match &answer {
        Answer::Http { status: s, body: b } => {
            assert_eq!(*s, status);
            match b {
                Payload::Read(b) => assert_eq!(b, body),
                Payload::TooLarge(n) => assert!(*n == body.len() && *n > MAX_REPLY_BYTES),
            }
            matches!(b, Payload::Read(_))
        }
        other => panic!("{other:?} for an answer with headers and a status"),
    };
    let got = decode_answer(&answer);
    // Never panics on any outcome's methods either.
    if let Err(e) = &got {
        let _ = e.class();
        let _ = e.to_string();
    }
    match (status, &got) {
        (200, r) if read => assert_eq!(*r, decode_reply(body)),
        (200, r) => assert!(matches!(r, Err(BackendError::Malformed(_))), "{r:?}"),
        (s, r) => assert_eq!(*r, Err(BackendError::Status(s))),
    }
    match &got {
        Ok(r) => {
            // Below -1 only on an allowed reply: a racer's paced grant, minus its next turn.
            assert!(r.retry_after_ms >= -1 || r.allowed, "{r:?}");
            // What was accepted is a one-key JSON object holding an array of five integers, six
            // with the penalty box's field, or eight with the spill epoch and the take's mark.
            let doc: serde_json::Value =
                serde_json::from_slice(body).expect("accepted a body that is not JSON");
            let obj = doc.as_object().expect("accepted a non-object");
            assert_eq!(obj.len(), 1, "accepted {} keys", obj.len());
            let items = obj
                .values()
                .next()
                .and_then(|v| v.as_array())
                .expect("accepted a non-array");
            let ints: Vec<i64> = items.iter().filter_map(|v| v.as_i64()).collect();
            assert!(matches!(ints.len(), 5 | 6 | 8), "accepted {items:?}");
            assert_eq!(items.len(), ints.len(), "accepted {items:?}");
            let mut want = vec![
                i64::from(r.allowed),
                r.remaining as i64,
                r.retry_after_ms,
                r.reset_after_ms as i64,
                r.granted as i64,
            ];
            if ints.len() >= 6 {
                want.push(r.penalized.code());
            }
            if let Some(stamp) = r.epoch {
                want.push(stamp.epoch as i64);
                want.push(stamp.mark as i64);
            }
            assert_eq!(ints, want, "decoded {r:?} from {items:?}");
            // And the canonical form of the same reply decodes to the same thing.
            let again = format!(
                r#"{{"EVALSHA":[{}]}}"#,
                want.iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            );
            assert_eq!(decode_reply(again.as_bytes()), got);
        }
        Err(BackendError::Redis(msg)) => assert!(msg.len() <= 200, "{} bytes", msg.len()),
        Err(_) => {}
    }
    // Pure: the same input decodes the same way.
    assert_eq!(decode_answer(&answer), got);
});
