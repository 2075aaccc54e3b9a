//! Webdis encoding: for any key, script and numbers, `webdis::command` gives exactly 10 '/'-separated
//! segments of `[A-Za-z0-9_~%-]`, and decoding each segment gives back the inputs, so no input can
//! add, drop or change a Webdis argument. `request` carries that command unchanged, and
//! `basic_auth_header` is base64 that decodes back to its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::backend::webdis::{basic_auth_header, command, request, Invoke};

#[path = "../common/script_call.rs"]
mod script_call;
use script_call::Input;

/// Strict percent-decoding: `%XX` (either case of hex) is a byte, any other byte stands for itself.
fn decode(seg: &str) -> Vec<u8> {
    let b = seg.as_bytes();
    let hex = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hi = b.get(i + 1).copied().and_then(hex);
            let lo = b.get(i + 2).copied().and_then(hex);
            let (Some(hi), Some(lo)) = (hi, lo) else {
                panic!("bad escape at {i} in {seg:?}");
            };
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn base64_decode(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    assert!(s.len().is_multiple_of(4), "base64 length {}", s.len());
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        assert!(pad <= 2, "{s:?}");
        let mut n = 0u32;
        for &c in chunk {
            let v = if c == b'=' {
                0
            } else {
                ALPHABET
                    .iter()
                    .position(|&a| a == c)
                    .unwrap_or_else(|| panic!("not base64: {c:#x} in {s:?}")) as u32
            };
            n = n << 6 | v;
        }
        out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    out
}

fuzz_target!(|input: Input| {
    let (call, lease) = input.call();
    let (invoke, verb) = if input.eval {
        (Invoke::Source(&input.script), "EVAL")
    } else {
        (Invoke::Sha(&input.script), "EVALSHA")
    };
    let cmd = String::from_utf8(command(&call, invoke)).expect("ASCII only");
    assert!(
        cmd.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_~%-/".contains(&b)),
        "unsafe byte in {cmd:?}"
    );
    let segs: Vec<&str> = cmd.split('/').collect();
    // verb / script / 1 / key / burst / rate / period_ms / cost / lease / max_wait_ms / settle
    assert_eq!(segs.len(), 11, "{cmd:?}");
    assert_eq!(segs[0], verb);
    assert_eq!(
        decode(segs[1]),
        input.script.as_bytes(),
        "script in {cmd:?}"
    );
    assert_eq!(segs[2], "1");
    assert_eq!(decode(segs[3]), input.key.as_bytes(), "key in {cmd:?}");
    let numbers = [
        input.burst.to_string(),
        input.rate.to_string(),
        input.period_ms.to_string(),
        input.cost.to_string(),
        lease,
        input.max_wait_ms.to_string(),
    ];
    assert_eq!(segs[4..10].len(), numbers.len(), "{cmd:?}");
    for (seg, n) in segs[4..10].iter().zip(numbers) {
        assert_eq!(decode(seg), n.as_bytes(), "{cmd:?}");
    }
    assert_eq!(
        decode(segs[10]),
        input.settle.to_string().as_bytes(),
        "{cmd:?}"
    );

    let req = request(&call, invoke, "webdis", Some("Basic x"));
    assert_eq!(req.body, cmd.as_bytes());

    let auth = basic_auth_header(&input.key);
    let b64 = auth.strip_prefix("Basic ").expect("no Basic prefix");
    assert_eq!(base64_decode(b64), input.key.as_bytes(), "{auth:?}");
});
