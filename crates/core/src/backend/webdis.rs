//! Webdis codec: a `ScriptCall` as an HTTP request, and Webdis' JSON answer as a `Reply`.
//!
//! Invariant: every command argument travels as one percent-encoded segment in which only
//! `[A-Za-z0-9_~-]` appear raw, so Webdis' traps (`/` splits arguments, `+` becomes a space, `?`
//! truncates, a trailing `.json`/`.txt` picks a format, `%` decodes) can never change the command.
//! The command goes in a POST body (Webdis parses it like a path) so the `EVAL` fallback, which
//! carries the whole script, is not limited by URL length.

use super::{Answer, BackendError, HttpRequest, Outgoing, Payload, Reply, ScriptCall, Tail};

/// How the script is named in the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invoke<'a> {
    /// `EVALSHA <sha1>`: the normal case.
    Sha(&'a str),
    /// `EVAL <script>`: after Redis answered NOSCRIPT; also caches the script in Redis.
    Source(&'a str),
}

/// Percent-encodes `bytes` as one Webdis argument.
pub fn encode_segment(bytes: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut rest = bytes;
    // Runs of bytes left as they are go out in one copy: digests, numbers and the script's SHA
    // are one run each.
    while !rest.is_empty() {
        let run = rest
            .iter()
            .position(|&b| !is_unreserved(b))
            .unwrap_or(rest.len());
        let (plain, tail) = rest.split_at(run);
        out.extend_from_slice(plain);
        let Some((&b, tail)) = tail.split_first() else {
            break;
        };
        let hex = |n: u8| HEX.get(usize::from(n)).copied().unwrap_or(b'0');
        out.extend_from_slice(&[b'%', hex(b >> 4), hex(b & 0x0f)]);
        rest = tail;
    }
}

/// A byte Webdis takes as it is in an argument (every other one is percent-encoded).
fn is_unreserved(b: u8) -> bool {
    let word = UNRESERVED.get(usize::from(b >> 6)).copied().unwrap_or(0);
    (word >> (b & 63)) & 1 == 1
}

/// The bytes [`is_unreserved`] takes, `[A-Za-z0-9_~-]`, one bit each, 64 bytes a word: every
/// byte of every key and argument is looked up, twice (the call's size, then its command).
const UNRESERVED: [u64; 4] = {
    let (mut low, mut high) = (0u64, 0u64);
    let mut b = 0u8;
    while b < 128 {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'~' {
            if b < 64 {
                low |= 1 << b;
            } else {
                high |= 1 << (b - 64);
            }
        }
        b += 1;
    }
    [low, high, 0, 0]
};

/// The Webdis command text for one script call:
/// `EVALSHA/<sha>/1/<key>/<burst>/<rate>/<period_ms>/<cost>/<lease>/<max_wait_ms>/<settle>`,
/// with a penalty `/time/<penalty>` after it. Built byte by byte (no `core::fmt`): one goes out
/// for every call.
pub fn command(call: &ScriptCall, invoke: Invoke<'_>) -> Vec<u8> {
    let script = script_of(invoke);
    let mut out = Vec::with_capacity(script.len() * 3 + call.key.len() * 3 + 160);
    push_head(&mut out, invoke, &[call]);
    push_args(call, &mut out);
    out
}

/// The Webdis command text for a batched call of n = `calls.len()` keys:
/// `EVALSHA/<sha>/<n>/<key1>/.../<keyn>/batch/<c1>/<args of key 1>/<c2>/<args of key 2>/...`,
/// each key's arguments exactly its single form's ([`command`]), `ci` of them, or `0` alone for a
/// key whose arguments are the previous key's.
pub fn batch_command(calls: &[&ScriptCall], invoke: Invoke<'_>) -> Vec<u8> {
    let script = script_of(invoke);
    // Room for the usual call (an encoded key and a dozen numbers); an unusual one grows it.
    let groups: usize = calls.iter().map(|c| c.key.len() * 3 + 128).sum();
    let mut out = Vec::with_capacity(script.len() * 3 + groups + 64);
    push_head(&mut out, invoke, calls);
    out.extend_from_slice(b"/batch");
    super::batch::each_group(calls, push_args, |group| {
        out.push(b'/');
        match group {
            Some((count, args)) => {
                crate::decimal::push_bytes(&mut out, count as u64);
                out.extend_from_slice(args);
            }
            None => out.push(b'0'),
        }
    });
    out
}

fn script_of(invoke: Invoke<'_>) -> &str {
    match invoke {
        Invoke::Sha(sha) => sha,
        Invoke::Source(src) => src,
    }
}

/// `EVALSHA/<sha>` (or `EVAL/<script>`), the number of keys and the keys, each one segment.
fn push_head(out: &mut Vec<u8>, invoke: Invoke<'_>, calls: &[&ScriptCall]) {
    let verb: &[u8] = match invoke {
        Invoke::Sha(_) => b"EVALSHA",
        Invoke::Source(_) => b"EVAL",
    };
    out.extend_from_slice(verb);
    out.push(b'/');
    encode_segment(script_of(invoke).as_bytes(), out);
    out.push(b'/');
    crate::decimal::push_bytes(out, calls.len() as u64);
    for call in calls {
        out.push(b'/');
        encode_segment(call.key.as_bytes(), out);
    }
}

/// The call's arguments after the key, each `/` and one encoded segment (numbers and a leading
/// `-` are left as they are by the encoding); how many.
fn push_args(call: &ScriptCall, out: &mut Vec<u8>) -> usize {
    call.push_args(Tail::Full, |arg| {
        out.push(b'/');
        encode_segment(arg, out);
    })
}

/// The bytes a call adds to a batched command: its key's segment, its count's and its
/// arguments'.
pub fn group_bytes(call: &ScriptCall) -> usize {
    let mut bytes = 1 + encoded_len(call.key.as_bytes());
    let count = call.push_args(Tail::Full, |arg| bytes += 1 + encoded_len(arg));
    bytes + 1 + decimal_len(count)
}

/// The length of `bytes` as [`encode_segment`] writes it.
fn encoded_len(bytes: &[u8]) -> usize {
    let reserved = bytes.iter().filter(|&&b| !is_unreserved(b)).count();
    bytes.len() + 2 * reserved
}

/// The number of decimal digits of `n`.
pub(crate) fn decimal_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// The callout for one script call: `POST /` to `authority` with the command as the body.
/// `auth_header` is a ready `Authorization` value (see `basic_auth_header`).
pub fn request(
    call: &ScriptCall,
    invoke: Invoke<'_>,
    authority: &str,
    auth_header: Option<&str>,
) -> HttpRequest {
    post(command(call, invoke), authority, auth_header)
}

/// `POST /` to `authority` carrying `body` (a command), with basic auth if configured.
fn post(body: Vec<u8>, authority: &str, auth_header: Option<&str>) -> HttpRequest {
    let mut headers = vec![
        (":method".to_string(), "POST".to_string()),
        (":path".to_string(), "/".to_string()),
        (":authority".to_string(), authority.to_string()),
        ("content-type".to_string(), "text/plain".to_string()),
    ];
    if let Some(auth) = auth_header {
        headers.push(("authorization".to_string(), auth.to_string()));
    }
    HttpRequest { headers, body }
}

/// `Basic <base64(user:pass)>` for Webdis' `http_basic_auth` ACL.
pub fn basic_auth_header(user_pass: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sym = |i: u32| -> char {
        ALPHABET
            .get((i & 63) as usize)
            .map(|&b| char::from(b))
            .unwrap_or('=')
    };
    let mut out = String::from("Basic ");
    for chunk in user_pass.as_bytes().chunks(3) {
        let b0 = u32::from(chunk.first().copied().unwrap_or(0));
        let b1 = u32::from(chunk.get(1).copied().unwrap_or(0));
        let b2 = u32::from(chunk.get(2).copied().unwrap_or(0));
        let n = (b0 << 16) | (b1 << 8) | b2;
        out.push(sym(n >> 18));
        out.push(sym(n >> 12));
        out.push(if chunk.len() > 1 { sym(n >> 6) } else { '=' });
        out.push(if chunk.len() > 2 { sym(n) } else { '=' });
    }
    out
}

/// The HTTP transport: script calls as Webdis requests to one authority, with optional basic auth.
pub struct Webdis {
    authority: String,
    auth_header: Option<String>,
    sha: String,
}

impl Webdis {
    pub fn new(authority: &str, basic_auth: Option<&str>) -> Webdis {
        Webdis {
            authority: authority.to_string(),
            auth_header: basic_auth.map(basic_auth_header),
            sha: super::script::sha1_hex(),
        }
    }
}

impl Webdis {
    fn invoke(&self, with_source: bool) -> Invoke<'_> {
        if with_source {
            Invoke::Source(super::script::SOURCE)
        } else {
            Invoke::Sha(&self.sha)
        }
    }
}

impl super::Transport for Webdis {
    fn request(&self, call: &ScriptCall, with_source: bool) -> Outgoing {
        Outgoing::Http(request(
            call,
            self.invoke(with_source),
            &self.authority,
            self.auth_header.as_deref(),
        ))
    }

    fn decode(&self, answer: &Answer) -> Result<Reply, BackendError> {
        decode_answer(answer)
    }

    fn request_batch(&self, calls: &[&ScriptCall], with_source: bool) -> Outgoing {
        let body = batch_command(calls, self.invoke(with_source));
        Outgoing::Http(post(body, &self.authority, self.auth_header.as_deref()))
    }

    fn group_bytes(&self, call: &ScriptCall) -> usize {
        group_bytes(call)
    }

    fn decode_batch(
        &self,
        answer: &Answer,
        n: usize,
        asks: &[bool],
    ) -> Result<Vec<Result<Reply, BackendError>>, BackendError> {
        body_of(answer).and_then(|body| decode_batch_reply_asked(body, n, asks))
    }
}

/// Decodes the host's answer to a Webdis callout: no answer is `Reset`, an HTTP status other than
/// 200 is `Status` (whatever the body's size), a 200 body is Webdis' reply.
pub fn decode_answer(answer: &Answer) -> Result<Reply, BackendError> {
    body_of(answer).and_then(decode_reply)
}

/// Decodes the host's answer to a batched call of `n` keys, as [`decode_answer`] does a single
/// call's: one error for the whole call, or one outcome per key.
pub fn decode_batch_answer(
    answer: &Answer,
    n: usize,
) -> Result<Vec<Result<Reply, BackendError>>, BackendError> {
    body_of(answer).and_then(|body| decode_batch_reply(body, n))
}

/// The body of a 200 answer that was read, or the error the answer means.
fn body_of(answer: &Answer) -> Result<&[u8], BackendError> {
    match answer {
        Answer::NoAnswer => Err(BackendError::Reset),
        Answer::Http {
            status: 200,
            body: Payload::Read(body),
        } => Ok(body),
        Answer::Http {
            status: 200,
            body: Payload::TooLarge(size),
        } => Err(BackendError::Malformed(format!(
            "answer of {size} bytes exceeds {}",
            super::MAX_REPLY_BYTES
        ))),
        Answer::Http { status, .. } => Err(BackendError::Status(*status)),
        Answer::Redis(_) => Err(BackendError::Malformed(
            "a Redis reply to an HTTP callout".to_string(),
        )),
    }
}

/// Decodes Webdis' answer (HTTP 200) to a script call. Webdis wraps every reply as
/// `{"<COMMAND>": <value>}`; errors come back as `[false, "ERR ..."]`.
pub fn decode_reply(body: &[u8]) -> Result<Reply, BackendError> {
    if let Some((ints, n)) = small_integers(body) {
        return super::script_reply_of(ints.get(..n).unwrap_or_default());
    }
    let items = json_items(body)?;
    if !matches!(items.len(), 5 | 6 | 8) {
        return Err(BackendError::Malformed(format!(
            "expected 5, 6 or 8 integers, got {} items",
            items.len()
        )));
    }
    super::script_reply_of(&json_integers(&items)?)
}

/// Decodes Webdis' answer (HTTP 200) to a batched call of `n` keys: `{"<COMMAND>": [6n
/// integers]}`, or an error for the whole call (`CROSSSLOT` is [`BackendError::CrossSlot`]).
pub fn decode_batch_reply(
    body: &[u8],
    n: usize,
) -> Result<Vec<Result<Reply, BackendError>>, BackendError> {
    decode_batch_reply_asked(body, n, &[])
}

/// [`decode_batch_reply`] for keys that asked for their spill epoch or not (`asks`: 8 integers
/// for a key that did: [`super::reply_ints`]).
pub fn decode_batch_reply_asked(
    body: &[u8],
    n: usize,
    asks: &[bool],
) -> Result<Vec<Result<Reply, BackendError>>, BackendError> {
    let want = super::reply_ints(n, asks);
    if let Some(ints) = integers(body, want) {
        return super::batch_replies_asked(&ints, n, asks);
    }
    let items = json_items(body).map_err(super::batch::whole_error)?;
    if items.len() != want {
        return Err(BackendError::Malformed(format!(
            "expected {want} integers for {n} keys, got {} items",
            items.len()
        )));
    }
    super::batch_replies_asked(&json_integers(&items)?, n, asks)
}

/// The array Webdis wrapped in `{"<COMMAND>": [...]}`, or the error it stands for: Redis' error
/// (`[false, "msg"]`: NOSCRIPT is `NoScript`) or `Malformed`.
fn json_items(body: &[u8]) -> Result<Vec<serde_json::Value>, BackendError> {
    // Read member by member: a `Value::Object` keeps only the last of two members of one name,
    // so `{"EVALSHA":[0,..],"EVALSHA":[1,..]}` would read as one member, the admission.
    let OneMember(value) = serde_json::from_slice(body)
        .map_err(|e| BackendError::Malformed(format!("not JSON ({e})")))?;
    let value =
        value.ok_or_else(|| BackendError::Malformed("expected one-key JSON object".to_string()))?;
    let serde_json::Value::Array(items) = value else {
        return Err(BackendError::Malformed(format!(
            "expected an array, got {}",
            kind(&value)
        )));
    };
    if let [serde_json::Value::Bool(false), msg] = items.as_slice() {
        let msg = msg.as_str().unwrap_or("(no message)");
        return Err(if msg.starts_with("NOSCRIPT") {
            BackendError::NoScript
        } else {
            BackendError::Redis(truncate(msg, 200))
        });
    }
    Ok(items)
}

/// The value of a JSON object's only member; None for an object of any other number of members
/// (two of the same name included). Anything but an object is a deserialization error.
struct OneMember(Option<serde_json::Value>);

impl<'de> serde::Deserialize<'de> for OneMember {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OneMember, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = OneMember;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<OneMember, A::Error> {
                use serde::de::IgnoredAny;
                let first = map.next_entry::<IgnoredAny, serde_json::Value>()?;
                let mut more = false;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
                    more = true;
                }
                Ok(OneMember(first.filter(|_| !more).map(|(_, v)| v)))
            }
        }
        d.deserialize_map(Members)
    }
}

/// Every item as an integer, or `Malformed`.
fn json_integers(items: &[serde_json::Value]) -> Result<Vec<i64>, BackendError> {
    items
        .iter()
        .map(|v| {
            v.as_i64()
                .ok_or_else(|| BackendError::Malformed("non-integer item".to_string()))
        })
        .collect()
}

/// The script's normal answer as Webdis writes it, `{"EVALSHA":[1,199,0,1000,5]}` (any upper-case
/// command name, no spaces, five integers, six with a penalty, seven with an epoch), read without building a JSON
/// tree: one comes back for every call. Anything else is None and goes through serde_json, which
/// decides what it means. Returns the integers and how many there are.
fn small_integers(body: &[u8]) -> Option<([i64; 8], usize)> {
    let mut out = [0i64; 8];
    let count = int_array(body, out.len(), |i, n| {
        if let Some(slot) = out.get_mut(i) {
            *slot = n;
        }
    })?;
    (count >= 5).then_some((out, count))
}

/// A batched call's normal answer, `{"EVALSHA":[...]}` with exactly `want` integers, read as
/// [`small_integers`] reads a single one (one comes back for every batch). Anything else is None
/// and goes through serde_json.
fn integers(body: &[u8], want: usize) -> Option<Vec<i64>> {
    // Each integer takes at least 2 bytes (a digit and a separator): a body too short for `want`
    // of them is not read, so a hostile `n` allocates nothing.
    if body.len() < want.checked_mul(2)? {
        return None;
    }
    let mut out = Vec::with_capacity(want);
    let count = int_array(body, want, |_, n| out.push(n))?;
    (count == want).then_some(out)
}

/// Reads `{"<UPPER-CASE NAME>":[i1,i2,...]}` (no spaces, JSON integers of at most 18 digits, at
/// least one, at most `max`, nothing after the `}`), giving each integer to `each` with its
/// index; how many there were. None for anything else.
fn int_array(body: &[u8], max: usize, mut each: impl FnMut(usize, i64)) -> Option<usize> {
    let rest = body.strip_prefix(b"{\"")?;
    let name_len = rest.iter().take_while(|b| b.is_ascii_uppercase()).count();
    if name_len == 0 {
        return None;
    }
    let mut rest = rest.get(name_len..)?.strip_prefix(b"\":[")?;
    for i in 0..max {
        let (negative, digits_at) = match rest.first() {
            Some(b'-') => (true, 1),
            _ => (false, 0),
        };
        let digits = rest
            .get(digits_at..)?
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        // JSON has no leading zeros ("0" alone, or a first digit 1-9), and serde_json reads
        // "-0" as a float: both are left to it.
        let leading_zero = rest.get(digits_at) == Some(&b'0') && (digits > 1 || negative);
        if digits == 0 || digits > 18 || leading_zero {
            return None;
        }
        let mut n: i64 = 0;
        for &d in rest.get(digits_at..digits_at + digits)? {
            n = n * 10 + i64::from(d - b'0');
        }
        each(i, if negative { -n } else { n });
        rest = rest.get(digits_at + digits..)?;
        if let Some(end) = rest.strip_prefix(b"]}") {
            return end.is_empty().then_some(i + 1);
        }
        rest = rest.strip_prefix(b",")?;
    }
    None
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// At most `max` bytes of `s`, cut at a char boundary (Redis messages go into logs).
fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lookup takes exactly `[A-Za-z0-9_~-]`, of all 256 bytes.
    #[test]
    fn exactly_the_unreserved_bytes_go_as_they_are() {
        for b in 0..=u8::MAX {
            let spec = b.is_ascii_alphanumeric() || b"-_~".contains(&b);
            assert_eq!(is_unreserved(b), spec, "byte {b}");
            let mut out = Vec::new();
            encode_segment(&[b], &mut out);
            assert_eq!(out.len(), encoded_len(&[b]), "byte {b}");
            assert_eq!(out.len() == 1, spec, "byte {b}");
        }
    }

    fn call(key: &str) -> ScriptCall {
        ScriptCall {
            key: key.to_string(),
            burst: 200,
            rate: 100,
            period_ms: 1000,
            cost: 1,
            lease_want: 0,
            max_wait_ms: 0,
            settle: 0,
            holder: None,
            penalty: None,
            track: None,
        }
    }

    /// A penalty rule's call ends with "time" (ARGV[8]: Redis' clock) and the penalty (ARGV[9]).
    #[test]
    fn a_penalty_travels_after_the_clock() {
        let c = ScriptCall {
            penalty: crate::bucket::Penalty::new(3_600_000, &[120_000, 300_000]),
            ..call("k")
        };
        let body = String::from_utf8(command(&c, Invoke::Sha("abc"))).unwrap();
        let segs: Vec<&str> = body.split('/').collect();
        assert_eq!(
            &segs[9..],
            ["0", "0", "time", "3600000%3A120000%3A300000"],
            "{body}"
        );
        assert_eq!(webdis_decode(segs[12]), b"3600000:120000:300000");
    }

    /// Webdis' own decoding of one segment: `%XX` -> byte, `+` -> space (the same rules as a
    /// query string's, which `rule` already implements).
    fn webdis_decode(seg: &str) -> Vec<u8> {
        crate::rule::reading::percent_decode(seg.as_bytes())
    }

    /// A lease call's lease argument: the want, the holder, its hold and its steps, as one
    /// segment that Webdis decodes back to digits and colons.
    #[test]
    fn a_holder_travels_as_one_encoded_segment() {
        let c = ScriptCall {
            lease_want: 50,
            max_wait_ms: 2000,
            holder: Some(Box::new(crate::bucket::Holder::new(
                7,
                3,
                1450,
                &[(40, 30), (5, 2)],
            ))),
            ..call("k")
        };
        let body = String::from_utf8(command(&c, Invoke::Sha("abc"))).unwrap();
        let segs: Vec<&str> = body.split('/').collect();
        assert_eq!(segs.len(), 11, "{body}");
        assert_eq!(webdis_decode(segs[8]), b"50:7:3:1450:40:30:5:2");
        assert_eq!(&segs[9..], ["2000", "0"]);
        // Tokens it gives back go after its hold: the odd count of parts tells the script.
        let holder = c.holder.as_deref().map(|h| Box::new(h.giving_back(9)));
        let back = ScriptCall { holder, ..c };
        let body = String::from_utf8(command(&back, Invoke::Sha("abc"))).unwrap();
        let segs: Vec<&str> = body.split('/').collect();
        assert_eq!(webdis_decode(segs[8]), b"50:7:3:1450:9:40:30:5:2");
    }

    #[test]
    fn evalsha_command_layout() {
        let cmd = String::from_utf8(command(
            &call("tollgate:{per-user:ab12}"),
            Invoke::Sha("deadbeef"),
        ))
        .unwrap();
        assert_eq!(
            cmd,
            "EVALSHA/deadbeef/1/tollgate%3A%7Bper-user%3Aab12%7D/200/100/1000/1/0/0/0"
        );
    }

    #[test]
    fn hostile_segments_round_trip_as_one_argument() {
        let hostile: Vec<&[u8]> = vec![
            b"a/b",
            b"a+b",
            b"a?b=c",
            b"100%",
            b"%2F",
            b"x.json",
            b"x.txt",
            b"..",
            b"a\0b",
            b"a\r\nSET x y",
            b"\xff\xfe",
            b"{tag}",
            b" ",
        ];
        for h in hostile {
            let mut seg = Vec::new();
            encode_segment(h, &mut seg);
            let seg = String::from_utf8(seg).unwrap();
            assert!(
                seg.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_~%".contains(&c)),
                "{seg}"
            );
            assert!(!seg.ends_with(".json") && !seg.contains('/') && !seg.contains('+'));
            assert_eq!(webdis_decode(&seg), h, "{seg}");
        }
    }

    #[test]
    fn eval_carries_the_script_encoded() {
        let src = "local x = redis.call('TIME') -- a/b+c?d\nreturn {1}";
        let cmd = String::from_utf8(command(&call("k"), Invoke::Source(src))).unwrap();
        let parts: Vec<&str> = cmd.split('/').collect();
        assert_eq!(parts[0], "EVAL");
        assert_eq!(webdis_decode(parts[1]), src.as_bytes());
        assert_eq!(
            &parts[2..],
            ["1", "k", "200", "100", "1000", "1", "0", "0", "0"]
        );
    }

    #[test]
    fn request_is_a_post_with_auth() {
        let req = request(
            &call("k"),
            Invoke::Sha("abc"),
            "webdis",
            Some("Basic dXNlcjpwYXNz"),
        );
        assert_eq!(req.headers[0], (":method".into(), "POST".into()));
        assert_eq!(req.headers[1], (":path".into(), "/".into()));
        assert_eq!(req.headers[2], (":authority".into(), "webdis".into()));
        assert!(req
            .headers
            .contains(&("authorization".into(), "Basic dXNlcjpwYXNz".into())));
        assert_eq!(req.body, b"EVALSHA/abc/1/k/200/100/1000/1/0/0/0");
    }

    #[test]
    fn basic_auth_is_base64() {
        assert_eq!(basic_auth_header("user:pass"), "Basic dXNlcjpwYXNz");
        assert_eq!(basic_auth_header("a:b"), "Basic YTpi");
        assert_eq!(basic_auth_header("ab:c"), "Basic YWI6Yw==");
        assert_eq!(basic_auth_header("ab:cd"), "Basic YWI6Y2Q=");
    }

    #[test]
    fn decodes_int_array() {
        let r = decode_reply(br#"{"EVALSHA":[1,99,0,10,1]}"#).unwrap();
        assert_eq!(
            r,
            Reply {
                allowed: true,
                remaining: 99,
                retry_after_ms: 0,
                reset_after_ms: 10,
                granted: 1,
                penalized: crate::bucket::Penalized::No,
                epoch: None,
            }
        );
        let r = decode_reply(br#"{"EVAL":[0,0,-1,0,0]}"#).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.retry_after_ms, -1);
    }

    #[test]
    fn decodes_errors() {
        assert_eq!(
            decode_reply(br#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#),
            Err(BackendError::NoScript)
        );
        assert_eq!(
            decode_reply(br#"{"EVALSHA":[false,"ERR tollgate: bad argument burst"]}"#),
            Err(BackendError::Redis(
                "ERR tollgate: bad argument burst".into()
            ))
        );
        assert_eq!(
            decode_reply(br#"{"EVALSHA":[false,"WRONGPASS invalid username-password pair"]}"#),
            Err(BackendError::Redis(
                "WRONGPASS invalid username-password pair".into()
            ))
        );
    }

    fn http(status: u32, body: &[u8]) -> Answer {
        Answer::Http {
            status,
            body: Payload::Read(body.to_vec()),
        }
    }

    #[test]
    fn decodes_what_the_host_delivered() {
        assert_eq!(
            decode_answer(&http(200, br#"{"EVALSHA":[1,99,0,10,1]}"#)),
            decode_reply(br#"{"EVALSHA":[1,99,0,10,1]}"#)
        );
        assert_eq!(decode_answer(&Answer::NoAnswer), Err(BackendError::Reset));
        assert_eq!(
            decode_answer(&http(403, b"forbidden")),
            Err(BackendError::Status(403))
        );
        assert_eq!(
            decode_answer(&http(503, b"")),
            Err(BackendError::Status(503))
        );
        // Too large to read: its status still says what went wrong; a 200 is not a reply.
        let big = |status| Answer::Http {
            status,
            body: Payload::TooLarge(super::super::MAX_REPLY_BYTES + 1),
        };
        assert_eq!(decode_answer(&big(503)), Err(BackendError::Status(503)));
        match decode_answer(&big(200)) {
            Err(BackendError::Malformed(m)) => assert!(m.contains("exceeds"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A Redis reply never answers an HTTP callout, even one that would decode.
        let resp = Answer::Redis(Payload::Read(
            b"*5\r\n:1\r\n:1\r\n:0\r\n:0\r\n:1\r\n".to_vec(),
        ));
        assert!(matches!(
            decode_answer(&resp),
            Err(BackendError::Malformed(_))
        ));
    }

    #[test]
    fn rejects_garbage() {
        let bad: &[&[u8]] = &[
            br#"{"EVALSHA":null}"#,
            br#"{"EVALSHA":[1,2,3,4]}"#,
            br#"{"EVALSHA":[1,2,3,4,5,6]}"#,
            br#"{"EVALSHA":[1,2,3,4,"5"]}"#,
            br#"{"EVALSHA":[1,2.5,3,4,5]}"#,
            br#"{"EVALSHA":[2,2,3,4,5]}"#,
            br#"{"EVALSHA":[1,-2,3,4,5]}"#,
            br#"{"EVALSHA":[0,2,-3,4,5]}"#,
            br#"{"EVALSHA":[1,2,null,4,5]}"#,
            br#"{"EVALSHA":"OK"}"#,
            br#"{"EVALSHA":[true,"OK"]}"#,
            br#"{"A":[1,1,0,0,1],"B":[1,1,0,0,1]}"#,
            br#"[1,1,0,0,1]"#,
            b"",
            b"\xff\xfe",
            b"<html>",
            br#"{"EVALSHA":[1,99999999999999999999999,0,0,1]}"#,
            // Cut after a sixth integer (found by the fuzz target): six integers are the most
            // there are, so the array must close there.
            br#"{"EVALSHA":[0,0,990,0,90,0,"#,
            br#"{"EVALSHA":[0,0,5,50,0,2"#,
            br#"{"EVALSHA":[1,4,0,50,1,0,7]}"#,
            br#"{"EVALSHA":[1,4,0,50,1,0,7,8,9]}"#,
            br#"{"EVALSHA":[1,4,0,50,1,0,-7,8]}"#,
        ];
        for b in bad {
            match decode_reply(b) {
                Err(BackendError::Malformed(_)) => {}
                other => panic!("{:?} -> {other:?}", String::from_utf8_lossy(b)),
            }
        }
    }

    /// Webdis wraps a reply in an object of ONE member: an object naming the command twice is
    /// not its answer, whichever member serde_json would keep (it keeps the last), single or
    /// batched, and a denial followed by an admission must not read as the admission.
    #[test]
    fn an_object_naming_its_command_twice_is_malformed() {
        for body in [
            &br#"{"EVALSHA":[0,0,100,1000,0],"EVALSHA":[1,9,0,1000,1]}"#[..],
            br#"{"EVALSHA":[false,"ERR x"],"EVALSHA":[1,9,0,1000,1]}"#,
            br#"{"EVALSHA":[1,9,0,1000,1],"EVALSHA":[1,9,0,1000,1]}"#,
        ] {
            match decode_reply(body) {
                Err(BackendError::Malformed(_)) => {}
                other => panic!("{:?} -> {other:?}", String::from_utf8_lossy(body)),
            }
        }
        let batch =
            br#"{"EVALSHA":[0,0,5,50,0,0,0,0,5,50,0,0],"EVALSHA":[1,9,0,50,1,0,1,8,0,50,1,0]}"#;
        assert!(
            matches!(
                decode_batch_reply(batch, 2),
                Err(BackendError::Malformed(_))
            ),
            "{:?}",
            decode_batch_reply(batch, 2)
        );
    }

    #[test]
    fn a_sixth_field_says_whether_the_denial_is_the_penalty_box() {
        use crate::bucket::Penalized;
        for (body, want) in [
            (
                &br#"{"EVALSHA":[0,0,120000,50,0,1]}"#[..],
                Penalized::Offence,
            ),
            (br#"{"EVALSHA":[0,0,1,50,0,2]}"#, Penalized::Boxed),
            (br#"{"EVALSHA":[1,4,0,50,1,0]}"#, Penalized::No),
            (br#"{"EVALSHA": [0,0,7,50,0,2]}"#, Penalized::Boxed),
        ] {
            let r = decode_reply(body).unwrap();
            assert_eq!(r.penalized, want, "{}", String::from_utf8_lossy(body));
        }
        // A hostile or broken 6th field: out of range, or a penalty on an admission or on a
        // denial with no time to wait.
        for body in [
            &br#"{"EVALSHA":[0,0,5,50,0,3]}"#[..],
            br#"{"EVALSHA":[0,0,5,50,0,-1]}"#,
            br#"{"EVALSHA":[1,4,0,50,1,1]}"#,
            br#"{"EVALSHA":[0,0,0,50,0,2]}"#,
            br#"{"EVALSHA":[0,0,-1,50,0,1]}"#,
            br#"{"EVALSHA":[0,0,5,50,0,"2"]}"#,
            br#"{"EVALSHA": [1,4,0,50,1,2]}"#,
        ] {
            match decode_reply(body) {
                Err(BackendError::Malformed(_)) => {}
                other => panic!("{:?} -> {other:?}", String::from_utf8_lossy(body)),
            }
        }
    }

    #[test]
    fn long_redis_errors_are_truncated_on_a_char_boundary() {
        let msg = format!("ERR {}", "é".repeat(300));
        let body = serde_json::json!({ "EVAL": [false, msg] }).to_string();
        match decode_reply(body.as_bytes()) {
            Err(BackendError::Redis(m)) => assert!(m.len() <= 200 && m.starts_with("ERR ")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_usual_answer_is_read_without_json_and_agrees_with_it() {
        let usual = br#"{"EVALSHA":[1,199,-1,1000,5]}"#;
        assert_eq!(
            small_integers(usual),
            Some(([1, 199, -1, 1000, 5, 0, 0, 0], 5))
        );
        let penalized = br#"{"EVALSHA":[0,3,120000,1000,0,1]}"#;
        assert_eq!(
            small_integers(penalized),
            Some(([0, 3, 120_000, 1000, 0, 1, 0, 0], 6))
        );
        let tracked = br#"{"EVALSHA":[1,3,0,1000,1,0,1700000000123456,7000]}"#;
        assert_eq!(
            small_integers(tracked),
            Some(([1, 3, 0, 1000, 1, 0, 1_700_000_000_123_456, 7000], 8))
        );
        assert_eq!(
            decode_reply(tracked).map(|r| r.epoch),
            Ok(Some(crate::bucket::Stamp {
                epoch: 1_700_000_000_123_456,
                mark: 7000
            }))
        );
        // Anything unusual is left to serde_json, which reads the same numbers or refuses.
        for body in [
            &br#"{"EVALSHA": [1,199,0,1000,5]}"#[..],
            br#"{"EVALSHA":[1,199,0,1000]}"#,
            br#"{"EVALSHA":[1,199,0,1000,5,0,7,8,9]}"#,
            br#"{"EVALSHA":[1,199,0,1000,5]} "#,
            br#"{"evalsha":[1,199,0,1000,5]}"#,
            br#"{"":[1,199,0,1000,5]}"#,
            br#"{"EVALSHA":[1,199,0,1000,99999999999999999999]}"#,
            br#"{"EVALSHA":[1,+199,0,1000,5]}"#,
            br#"{"EVALSHA":[1,0199,0,1000,5]}"#,
            br#"{"EVALSHA":[1,-0199,0,1000,5]}"#,
            br#"{"EVALSHA":[1,-0,0,1000,5]}"#,
            br#"{"EVALSHA":[1,1.5,0,1000,5]}"#,
            br#"{"EVALSHA":[false,"NOSCRIPT No matching script."]}"#,
        ] {
            assert_eq!(
                small_integers(body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(
            decode_reply(br#"{"EVALSHA": [1,199,0,1000,5]}"#).unwrap(),
            decode_reply(br#"{"EVALSHA":[1,199,0,1000,5]}"#).unwrap()
        );
    }
}

#[cfg(test)]
mod batch_tests;
