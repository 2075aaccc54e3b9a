//! The script call as Webdis carries it, both ways: the engine's request read back into the bucket
//! key, the limits and what it asks of the bucket (`tollgate_core::bucket`'s terms), and the
//! bucket's reply written as Webdis answers an `EVALSHA` (a flat array of integers). Both
//! simulators speak it, so the engine parses what a real Webdis would send.

use tollgate_core::bucket::{self, Ask, Holder, Limits};

/// Undoes the Webdis percent-encoding of one argument.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// A script call as the engine sent it (the Webdis request's body): its bucket key, the limits and
/// what it asks of the bucket.
pub fn parse_call(text: &str) -> (String, Limits, Ask) {
    let parts: Vec<&str> = text.split('/').collect();
    let num = |i: usize| parts[i].parse::<u64>().unwrap();
    let key = unescape(parts[3]);
    let lease: Vec<u64> = unescape(parts[8])
        .split(':')
        .map(|n| n.parse().unwrap())
        .collect();
    let limits = Limits {
        burst: num(4),
        rate: num(5),
        period_ms: num(6),
    };
    let ask = Ask {
        cost: num(7),
        lease_want: lease[0],
        holder: (lease.len() > 1).then(|| {
            let steps: Vec<(u64, u64)> = lease[4..].chunks(2).map(|c| (c[0], c[1])).collect();
            Holder::new(lease[1], lease[2], lease[3], &steps)
        }),
        max_wait_ms: num(9),
        settle: parts[10].parse().unwrap(),
    };
    (key, limits, ask)
}

/// The bucket's reply as Webdis answers the call: `{"EVALSHA":[allowed,remaining,retry_after_ms,
/// reset_after_ms,granted]}`.
pub fn reply_body(reply: &bucket::Reply) -> String {
    format!(
        r#"{{"EVALSHA":[{},{},{},{},{}]}}"#,
        u8::from(reply.allowed),
        reply.remaining,
        reply.retry_after_ms,
        reply.reset_after_ms,
        reply.granted
    )
}
