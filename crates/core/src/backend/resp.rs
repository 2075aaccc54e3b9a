//! RESP codec for the Redis-callout transport (Higress' `proxy_redis_call`): a `ScriptCall` (or a
//! batch of them) as one RESP command, and Redis' raw RESP answer as a `Reply` (or one per key).
//!
//! Invariant: every argument travels as one length-prefixed bulk string, so no byte of a key or of
//! the script can add, drop or change an argument (no escaping at all); a call is always ONE
//! command (Higress hands each decoded reply to the next callback waiting). The decoder accepts
//! exactly one RESP2 value, no trailing bytes, at most `MAX_REPLY_BYTES`: either an integer array
//! of the expected length (5 or 6; 6 per key for a batch) in its canonical form (what Redis
//! writes), or an error line; anything else is `Malformed`. It never panics and never allocates
//! more than twice the input's size.

use super::webdis::Invoke;
use super::{
    script_reply_of, Answer, BackendError, Outgoing, Payload, Reply, ScriptCall, Tail, Transport,
    MAX_REPLY_BYTES,
};

/// What `proxy_redis_init` is given as the cluster: the backend cluster with Higress' parameters,
/// `buffer_flush_timeout=0` (send each command at once instead of batching it for 3 ms) and, for a
/// database other than 0, `db=N` (`SELECT N` on each connection). Higress looks the cluster up by
/// what comes before `?` and ignores parameters it does not know.
pub fn redis_target(cluster: &str, database: u64) -> String {
    let mut target = format!("{cluster}?buffer_flush_timeout=0");
    if database != 0 {
        target.push_str("&db=");
        crate::decimal::push(&mut target, database);
    }
    target
}

/// The RESP command for one script call: `[EVALSHA|EVAL, <sha|script>, "1", <key>, burst, rate,
/// period_ms, cost, lease, max_wait_ms, settle]` as an array of bulk strings, without the
/// optional trailing arguments that are 0 (`settle`, then `max_wait_ms`: the script's defaults).
///
/// Why shorter: Redis answers a command of more than 10 arguments from a connection that is not
/// authenticated with `-ERR Protocol error: unauthenticated multibulk length` and closes it. With a
/// wrong password (Higress sends `AUTH` itself and drops its reply) the usual call of 9 arguments
/// gets the clear `-NOAUTH Authentication required.` instead. A penalty rule's call has 13
/// arguments (`max_wait_ms`, `settle`, `time` and the penalty): with a wrong password it gets the
/// protocol error.
pub fn command(call: &ScriptCall, invoke: Invoke<'_>) -> Vec<u8> {
    let mut args = Vec::with_capacity(160);
    let count = push_args(call, &mut args);
    let mut out = Vec::with_capacity(script_of(invoke).len() + call.key.len() + args.len() + 64);
    push_head(&mut out, 4 + count, invoke, &[call]);
    out.extend_from_slice(&args);
    out
}

/// The RESP command for a batched call of n = `calls.len()` keys: `[EVALSHA|EVAL, <sha|script>,
/// n, key1..keyn, "batch", c1, <args of key 1>, c2, <args of key 2>, ...]`, each key's
/// arguments exactly its single form's ([`command`]), `ci` of them, or `0` alone for a key whose
/// arguments are the previous key's. One command (one reply): a Higress callout must never carry
/// two.
pub fn batch_command(calls: &[&ScriptCall], invoke: Invoke<'_>) -> Vec<u8> {
    let mut groups = Vec::with_capacity(calls.len() * 96);
    let mut count = 3 + calls.len() + 1;
    let mut number = Vec::with_capacity(4);
    super::batch::each_group(calls, push_args, |group| match group {
        Some((c, args)) => {
            number.clear();
            crate::decimal::push_bytes(&mut number, c as u64);
            bulk(&number, &mut groups);
            groups.extend_from_slice(args);
            count += 1 + c;
        }
        None => {
            bulk(b"0", &mut groups);
            count += 1;
        }
    });
    let keys: usize = calls.iter().map(|c| c.key.len() + 16).sum();
    let mut out = Vec::with_capacity(script_of(invoke).len() + keys + groups.len() + 64);
    push_head(&mut out, count, invoke, calls);
    bulk(b"batch", &mut out);
    out.extend_from_slice(&groups);
    out
}

fn script_of(invoke: Invoke<'_>) -> &str {
    match invoke {
        Invoke::Sha(sha) => sha,
        Invoke::Source(src) => src,
    }
}

/// `*<count>`, the verb, the script or its SHA, the number of keys and the keys.
fn push_head(out: &mut Vec<u8>, count: usize, invoke: Invoke<'_>, calls: &[&ScriptCall]) {
    let verb: &[u8] = match invoke {
        Invoke::Sha(_) => b"EVALSHA",
        Invoke::Source(_) => b"EVAL",
    };
    out.push(b'*');
    crate::decimal::push_bytes(out, count as u64);
    out.extend_from_slice(b"\r\n");
    bulk(verb, out);
    bulk(script_of(invoke).as_bytes(), out);
    let mut keys = Vec::with_capacity(4);
    crate::decimal::push_bytes(&mut keys, calls.len() as u64);
    bulk(&keys, out);
    for call in calls {
        bulk(call.key.as_bytes(), out);
    }
}

/// The call's arguments after the key as bulk strings, the trailing zero ones left out; how many.
fn push_args(call: &ScriptCall, out: &mut Vec<u8>) -> usize {
    call.push_args(Tail::Trimmed, |arg| bulk(arg, out))
}

/// The bytes a call adds to a batched command: its key's bulk string, its count's and its
/// arguments'.
pub fn group_bytes(call: &ScriptCall) -> usize {
    let mut bytes = bulk_len(call.key.len());
    let count = call.push_args(Tail::Trimmed, |arg| bytes += bulk_len(arg.len()));
    bytes + bulk_len(super::webdis::decimal_len(count))
}

/// The length of a bulk string of `len` bytes: `$<len>\r\n<bytes>\r\n`.
fn bulk_len(len: usize) -> usize {
    1 + super::webdis::decimal_len(len) + 2 + len + 2
}

/// The Redis-callout transport: script calls as RESP commands (the request's body; no headers),
/// answers as raw RESP.
pub struct Resp {
    sha: String,
}

impl Resp {
    pub fn new() -> Resp {
        Resp {
            sha: super::script::sha1_hex(),
        }
    }
}

impl Default for Resp {
    fn default() -> Resp {
        Resp::new()
    }
}

impl Resp {
    fn invoke(&self, with_source: bool) -> Invoke<'_> {
        if with_source {
            Invoke::Source(super::script::SOURCE)
        } else {
            Invoke::Sha(&self.sha)
        }
    }
}

impl Transport for Resp {
    fn request(&self, call: &ScriptCall, with_source: bool) -> Outgoing {
        Outgoing::Resp(command(call, self.invoke(with_source)))
    }

    fn decode(&self, answer: &Answer) -> Result<Reply, BackendError> {
        decode_answer(answer)
    }

    fn request_batch(&self, calls: &[&ScriptCall], with_source: bool) -> Outgoing {
        Outgoing::Resp(batch_command(calls, self.invoke(with_source)))
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
        reply_of(answer).and_then(|reply| decode_batch_reply_asked(reply, n, asks))
    }
}

fn bulk(arg: &[u8], out: &mut Vec<u8>) {
    out.push(b'$');
    crate::decimal::push_bytes(out, arg.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

/// Decodes the host's answer to a Redis callout: no answer (a network error) is `Reset`, a reply
/// that was read is decoded, one too large to read is `Malformed`.
pub fn decode_answer(answer: &Answer) -> Result<Reply, BackendError> {
    reply_of(answer).and_then(decode_reply)
}

/// Decodes the host's answer to a batched call of `n` keys, as [`decode_answer`] does a single
/// call's: one error for the whole call, or one outcome per key.
pub fn decode_batch_answer(
    answer: &Answer,
    n: usize,
) -> Result<Vec<Result<Reply, BackendError>>, BackendError> {
    reply_of(answer).and_then(|reply| decode_batch_reply(reply, n))
}

/// The reply that was read, or the error the answer means.
fn reply_of(answer: &Answer) -> Result<&[u8], BackendError> {
    match answer {
        Answer::NoAnswer => Err(BackendError::Reset),
        Answer::Redis(Payload::Read(reply)) => Ok(reply),
        Answer::Redis(Payload::TooLarge(size)) => Err(malformed(format!(
            "reply of {size} bytes exceeds {MAX_REPLY_BYTES}: not read"
        ))),
        Answer::Http { .. } => Err(malformed("an HTTP answer to a Redis callout".to_string())),
    }
}

/// Decodes one raw RESP reply to a script call.
pub fn decode_reply(reply: &[u8]) -> Result<Reply, BackendError> {
    let ints = decode_integers(reply, 5..=8)?;
    script_reply_of(&ints)
}

/// Decodes one raw RESP reply to a batched call of `n` keys: an array of exactly 6n integers, or
/// an error for the whole call (`CROSSSLOT` is [`BackendError::CrossSlot`]).
pub fn decode_batch_reply(
    reply: &[u8],
    n: usize,
) -> Result<Vec<Result<Reply, BackendError>>, BackendError> {
    decode_batch_reply_asked(reply, n, &[])
}

/// [`decode_batch_reply`] for keys that asked for their spill epoch or not (`asks`: 8 integers
/// for a key that did: [`super::reply_ints`]).
pub fn decode_batch_reply_asked(
    reply: &[u8],
    n: usize,
    asks: &[bool],
) -> Result<Vec<Result<Reply, BackendError>>, BackendError> {
    let want = super::reply_ints(n, asks);
    let ints = decode_integers(reply, want..=want).map_err(super::batch::whole_error)?;
    super::batch_replies_asked(&ints, n, asks)
}

/// One RESP value, nothing after it, within `MAX_REPLY_BYTES`: an array of integers, as many as
/// `len` allows, in canonical form; or an error line (Redis' error). Anything else is
/// `Malformed`.
fn decode_integers(
    reply: &[u8],
    len: std::ops::RangeInclusive<usize>,
) -> Result<Vec<i64>, BackendError> {
    if reply.len() > MAX_REPLY_BYTES {
        return Err(malformed(format!(
            "reply of {} bytes exceeds {MAX_REPLY_BYTES}",
            reply.len()
        )));
    }
    let mut r = Reader { rest: reply };
    let (kind, line) = r.line()?;
    let out = match kind {
        b'-' => Err(redis_error(line)),
        b'*' => {
            let n = parse_int(line).ok_or_else(|| malformed("bad array length".to_string()))?;
            let n = usize::try_from(n)
                .ok()
                .filter(|n| len.contains(n))
                .ok_or_else(|| {
                    malformed(format!(
                        "expected {} to {} integers, got {n} items",
                        len.start(),
                        len.end()
                    ))
                })?;
            // Each item takes at least 4 bytes (`:0\r\n`): the length is checked against what is
            // there before anything is allocated for it.
            if r.rest.len() / 4 < n {
                return Err(malformed("truncated reply".to_string()));
            }
            let mut ints = Vec::with_capacity(n);
            for _ in 0..n {
                let (kind, line) = r.line()?;
                if kind != b':' {
                    return Err(malformed(format!("non-integer item ({})", type_name(kind))));
                }
                ints.push(parse_int(line).ok_or_else(|| malformed("bad integer".to_string()))?);
            }
            Ok(ints)
        }
        other => Err(malformed(format!(
            "expected an array, got {}",
            type_name(other)
        ))),
    };
    if !r.rest.is_empty() {
        return Err(malformed(format!("{} trailing bytes", r.rest.len())));
    }
    out
}

fn malformed(why: String) -> BackendError {
    BackendError::Malformed(why)
}

fn redis_error(line: &[u8]) -> BackendError {
    if line.starts_with(b"NOSCRIPT") {
        return BackendError::NoScript;
    }
    let msg = String::from_utf8_lossy(line);
    let mut end = msg.len().min(200);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    BackendError::Redis(msg.get(..end).unwrap_or_default().to_string())
}

fn type_name(kind: u8) -> &'static str {
    match kind {
        b'+' => "a status",
        b'-' => "an error",
        b':' => "an integer",
        b'$' => "a bulk string",
        b'*' => "an array",
        b'_' | b',' | b'#' | b'!' | b'=' | b'(' | b'%' | b'~' | b'>' | b'|' => "a RESP3 value",
        _ => "no RESP type",
    }
}

/// RESP2 canonical integer: `0`, or an optional `-` then a non-zero digit then digits; fits i64.
fn parse_int(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    match digits {
        [] => return None,
        [b'0'] if !neg => return Some(0),
        [b'0', ..] => return None,
        _ => {}
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let d = i64::from(d - b'0');
        v = v.checked_mul(10).and_then(|v| {
            if neg {
                v.checked_sub(d)
            } else {
                v.checked_add(d)
            }
        })?;
    }
    Some(v)
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// One `<type byte><line>\r\n`; the line holds neither `\r` nor `\n`.
    fn line(&mut self) -> Result<(u8, &'a [u8]), BackendError> {
        let (&kind, body) = self
            .rest
            .split_first()
            .ok_or_else(|| malformed("truncated reply".to_string()))?;
        let end = body
            .iter()
            .position(|&b| b == b'\r' || b == b'\n')
            .ok_or_else(|| malformed("truncated reply".to_string()))?;
        let (line, tail) = body.split_at(end);
        self.rest = tail
            .strip_prefix(b"\r\n")
            .ok_or_else(|| malformed("bare CR or LF in a line".to_string()))?;
        Ok((kind, line))
    }
}

/// Whether a reply is Redis refusing the connection's client itself (`NOAUTH`, `WRONGPASS`,
/// `NOPERM`) rather than answering the command: on Higress, a cluster xDS defined anew comes with
/// a client of Higress' defaults that never authenticated, which the filter sets up again.
pub fn refuses_the_client(reply: &[u8]) -> bool {
    [&b"-NOAUTH"[..], b"-WRONGPASS", b"-NOPERM"]
        .iter()
        .any(|e| reply.starts_with(e))
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_refused_client_is_told_from_a_refused_command() {
        assert!(refuses_the_client(b"-NOAUTH Authentication required.\r\n"));
        assert!(refuses_the_client(
            b"-WRONGPASS invalid username-password pair\r\n"
        ));
        assert!(refuses_the_client(b"-NOPERM User x has no permissions\r\n"));
        assert!(!refuses_the_client(b"-NOSCRIPT No matching script.\r\n"));
        assert!(
            !refuses_the_client(b"*1\r\n-NOAUTH x\r\n"),
            "one key's error, not the client's"
        );
    }

    use super::*;
    use crate::backend::script_reply;

    fn call(key: &str) -> ScriptCall {
        ScriptCall {
            key: key.to_string(),
            burst: 200,
            rate: 100,
            period_ms: 1000,
            cost: 1,
            lease_want: 0,
            max_wait_ms: 0,
            settle: -3,
            holder: None,
            penalty: None,
            track: None,
        }
    }

    fn ok(allowed: bool, remaining: u64, retry: i64, reset: u64, granted: u64) -> Reply {
        Reply {
            allowed,
            remaining,
            retry_after_ms: retry,
            reset_after_ms: reset,
            granted,
            penalized: crate::bucket::Penalized::No,
            epoch: None,
        }
    }

    #[test]
    fn evalsha_is_an_array_of_bulk_strings() {
        let cmd = command(&call("tollgate:{per-user:ab12}"), Invoke::Sha("deadbeef"));
        assert_eq!(
            cmd,
            b"*11\r\n$7\r\nEVALSHA\r\n$8\r\ndeadbeef\r\n$1\r\n1\r\n$24\r\ntollgate:{per-user:ab12}\r\n\
              $3\r\n200\r\n$3\r\n100\r\n$4\r\n1000\r\n$1\r\n1\r\n$1\r\n0\r\n$1\r\n0\r\n$2\r\n-3\r\n"
        );
    }

    #[test]
    fn eval_carries_the_script_raw_whatever_its_bytes() {
        let src = "local x = redis.call('TIME')\r\n-- $5\r\n*3\r\nreturn {1}";
        let cmd = command(&call("k\r\n$1"), Invoke::Source(src));
        let mut want = b"*11\r\n$4\r\nEVAL\r\n".to_vec();
        want.extend_from_slice(format!("${}\r\n{src}\r\n", src.len()).as_bytes());
        want.extend_from_slice(b"$1\r\n1\r\n$5\r\nk\r\n$1\r\n");
        assert!(cmd.starts_with(&want), "{}", String::from_utf8_lossy(&cmd));
    }

    #[test]
    fn optional_zero_arguments_are_left_out() {
        let mut c = call("k");
        c.settle = 0;
        let cmd = command(&c, Invoke::Sha("s"));
        assert!(
            cmd.starts_with(b"*9\r\n"),
            "{}",
            String::from_utf8_lossy(&cmd)
        );
        assert!(cmd.ends_with(b"$1\r\n0\r\n"), "lease_want is last");
        c.max_wait_ms = 250;
        let cmd = command(&c, Invoke::Sha("s"));
        assert!(cmd.starts_with(b"*10\r\n") && cmd.ends_with(b"$3\r\n250\r\n"));
        c.max_wait_ms = 0;
        c.settle = 7;
        let cmd = command(&c, Invoke::Sha("s"));
        assert!(cmd.starts_with(b"*11\r\n") && cmd.ends_with(b"$1\r\n0\r\n$1\r\n7\r\n"));
    }

    #[test]
    fn encodes_extreme_numbers() {
        let mut c = call("");
        c.burst = u64::MAX;
        let cmd = command(&c, Invoke::Sha("s"));
        assert!(cmd
            .windows(26)
            .any(|w| w == b"$20\r\n18446744073709551615\r"));
        assert!(cmd.windows(10).any(|w| w == b"$0\r\n\r\n$20\r"));
    }

    #[test]
    fn decodes_the_script_reply() {
        assert_eq!(
            decode_reply(b"*5\r\n:1\r\n:99\r\n:0\r\n:10\r\n:1\r\n"),
            Ok(ok(true, 99, 0, 10, 1))
        );
        assert_eq!(
            decode_reply(b"*5\r\n:0\r\n:0\r\n:-1\r\n:0\r\n:0\r\n"),
            Ok(ok(false, 0, -1, 0, 0))
        );
        assert_eq!(
            decode_answer(&Answer::Redis(Payload::Read(
                b"*5\r\n:0\r\n:0\r\n:250\r\n:9223372036854775807\r\n:0\r\n".to_vec()
            ))),
            Ok(ok(false, 0, 250, i64::MAX as u64, 0))
        );
    }

    #[test]
    fn decodes_errors() {
        assert_eq!(
            decode_reply(b"-NOSCRIPT No matching script. Please use EVAL.\r\n"),
            Err(BackendError::NoScript)
        );
        assert_eq!(
            decode_reply(b"-ERR tollgate: bad argument burst\r\n"),
            Err(BackendError::Redis(
                "ERR tollgate: bad argument burst".into()
            ))
        );
        assert_eq!(
            decode_reply(b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"),
            Err(BackendError::Redis(
                "WRONGPASS invalid username-password pair or user is disabled.".into()
            ))
        );
        assert_eq!(
            decode_reply(b"-NOAUTH Authentication required.\r\n"),
            Err(BackendError::Redis(
                "NOAUTH Authentication required.".into()
            ))
        );
        // Higress' NetworkError: connection refused, closed, or timed out.
        assert_eq!(decode_answer(&Answer::NoAnswer), Err(BackendError::Reset));
        // A reply over the limit is not read, and does not decode.
        let big = Answer::Redis(Payload::TooLarge(MAX_REPLY_BYTES + 1));
        match decode_answer(&big) {
            Err(BackendError::Malformed(m)) => assert!(m.contains("not read"), "{m}"),
            other => panic!("{other:?}"),
        }
        // An empty reply (Ok with 0 bytes) is not a reply.
        assert!(matches!(
            decode_answer(&Answer::Redis(Payload::Read(Vec::new()))),
            Err(BackendError::Malformed(_))
        ));
        // An HTTP answer never answers a Redis callout, even a body that would decode as RESP.
        let http = Answer::Http {
            status: 200,
            body: Payload::Read(b"*5\r\n:1\r\n:1\r\n:0\r\n:0\r\n:1\r\n".to_vec()),
        };
        assert!(matches!(
            decode_answer(&http),
            Err(BackendError::Malformed(_))
        ));
    }

    #[test]
    fn the_redis_target_carries_higress_parameters() {
        assert_eq!(
            redis_target("outbound|6379||redis.default.svc.cluster.local", 0),
            "outbound|6379||redis.default.svc.cluster.local?buffer_flush_timeout=0"
        );
        assert_eq!(
            redis_target("redis", 12),
            "redis?buffer_flush_timeout=0&db=12"
        );
        assert_eq!(
            redis_target("r", u64::from(u32::MAX)),
            "r?buffer_flush_timeout=0&db=4294967295"
        );
    }

    #[test]
    fn a_call_goes_out_as_a_resp_command() {
        let out = Resp::new().request(&call("k"), false);
        let Outgoing::Resp(cmd) = &out else {
            panic!("{out:?}")
        };
        assert!(
            cmd.starts_with(b"*11\r\n$7\r\nEVALSHA\r\n$40\r\n"),
            "{out:?}"
        );
        let Outgoing::Resp(eval) = Resp::new().request(&call("k"), true) else {
            panic!()
        };
        assert!(eval.starts_with(b"*11\r\n$4\r\nEVAL\r\n"));
    }

    #[test]
    fn long_and_binary_error_messages_are_cut_safely() {
        let mut line = b"-ERR ".to_vec();
        line.extend_from_slice("é".repeat(300).as_bytes());
        line.extend_from_slice(b"\r\n");
        match decode_reply(&line) {
            Err(BackendError::Redis(m)) => assert!(m.len() <= 200 && m.starts_with("ERR ")),
            other => panic!("{other:?}"),
        }
        match decode_reply(b"-ERR \xff\xfe\r\n") {
            Err(BackendError::Redis(m)) => assert!(m.starts_with("ERR ")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_everything_else() {
        let bad: &[&[u8]] = &[
            b"",
            b"*",
            b"*5",
            b"*5\r",
            b"*5\n:1\n:1\n:0\n:0\n:1\n",
            b"*5\r\n:1\r\n:99\r\n:0\r\n:10\r\n",
            b"*5\r\n:1\r\n:99\r\n:0\r\n:10\r\n:1",
            b"*5\r\n:1\r\n:99\r\n:0\r\n:10\r\n:1\r\n+OK\r\n",
            b"*4\r\n:1\r\n:99\r\n:0\r\n:10\r\n",
            b"*6\r\n:1\r\n:99\r\n:0\r\n:10\r\n:1\r\n:1\r\n",
            b"*-1\r\n",
            b"$-1\r\n",
            b"_\r\n",
            b"+OK\r\n",
            b":1\r\n",
            b"$5\r\nhello\r\n",
            b"*05\r\n:1\r\n:99\r\n:0\r\n:10\r\n:1\r\n",
            b"*5\r\n:01\r\n:99\r\n:0\r\n:10\r\n:1\r\n",
            b"*5\r\n:+1\r\n:99\r\n:0\r\n:10\r\n:1\r\n",
            b"*5\r\n:-0\r\n:99\r\n:0\r\n:10\r\n:1\r\n",
            b"*5\r\n:1\r\n: 99\r\n:0\r\n:10\r\n:1\r\n",
            b"*5\r\n:2\r\n:99\r\n:0\r\n:10\r\n:1\r\n",
            b"*5\r\n:1\r\n:-2\r\n:0\r\n:10\r\n:1\r\n",
            b"*5\r\n:0\r\n:2\r\n:-3\r\n:10\r\n:1\r\n",
            b"*5\r\n:1\r\n:99999999999999999999\r\n:0\r\n:10\r\n:1\r\n",
            b"*5\r\n:1\r\n:-9223372036854775809\r\n:0\r\n:10\r\n:1\r\n",
            b"*5\r\n:1\r\n$2\r\n99\r\n:0\r\n:10\r\n:1\r\n",
            b"*5\r\n:1\r\n*-1\r\n:0\r\n:10\r\n:1\r\n",
            b"*5\r\n:1\r\n_\r\n:0\r\n:10\r\n:1\r\n",
            b"*99999999999999999999999\r\n",
            b"-ERR x\r\ntrailing",
            b"-ERR x\rmore\r\n",
        ];
        for b in bad {
            match decode_reply(b) {
                Err(BackendError::Malformed(_)) => {}
                other => panic!("{:?} -> {other:?}", String::from_utf8_lossy(b)),
            }
        }
    }

    #[test]
    fn replies_over_the_limit_are_refused_before_parsing() {
        let mut big = b"-ERR ".to_vec();
        big.resize(MAX_REPLY_BYTES - 2, b'x');
        big.extend_from_slice(b"\r\n");
        assert!(matches!(decode_reply(&big), Err(BackendError::Redis(_))));
        big.insert(1, b'x');
        match decode_reply(&big) {
            Err(BackendError::Malformed(m)) => assert!(m.contains("exceeds"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn encoding_of_a_reply_round_trips() {
        for ints in [
            [1, 0, 0, 0, 1],
            [0, 5, -1, 3, 0],
            [1, i64::MAX, 7, i64::MAX, 9],
        ] {
            let mut wire = b"*5\r\n".to_vec();
            for i in ints {
                wire.extend_from_slice(format!(":{i}\r\n").as_bytes());
            }
            assert_eq!(decode_reply(&wire), script_reply(ints));
        }
    }

    #[test]
    fn a_penalty_call_sends_the_clock_and_the_penalty_last() {
        let c = ScriptCall {
            settle: 0,
            penalty: crate::bucket::Penalty::new(60_000, &[1500, 3000]),
            ..call("k")
        };
        let cmd = command(&c, Invoke::Sha("abc"));
        let text = String::from_utf8(cmd).unwrap();
        assert!(text.starts_with("*13\r\n"), "{text}");
        assert!(
            text.ends_with("$1\r\n0\r\n$1\r\n0\r\n$4\r\ntime\r\n$15\r\n60000:1500:3000\r\n"),
            "{text}"
        );
    }

    #[test]
    fn a_sixth_field_is_the_penalty_box_and_is_checked() {
        use crate::bucket::Penalized;
        let wire = |ints: &[i64]| {
            let mut w = format!("*{}\r\n", ints.len()).into_bytes();
            for i in ints {
                w.extend_from_slice(format!(":{i}\r\n").as_bytes());
            }
            w
        };
        let r = decode_reply(&wire(&[0, 0, 300_000, 9, 0, 1])).unwrap();
        assert_eq!(
            (r.retry_after_ms, r.penalized),
            (300_000, Penalized::Offence)
        );
        let r = decode_reply(&wire(&[0, 0, 12, 9, 0, 2])).unwrap();
        assert_eq!(r.penalized, Penalized::Boxed);
        for bad in [
            &[0, 0, 12, 9, 0, 3][..],
            &[1, 3, 0, 9, 1, 2],
            &[0, 0, 0, 9, 0, 1],
            &[0, 0, 12, 9, 0, 0, 0],
            &[0, 0, 12, 9, 0, 0, 0, 0, 0],
            &[1, 3, 0, 9, 1, 0, -1, 0],
            &[1, 3, 0, 9, 1, 0, 1, -1],
        ] {
            assert!(
                matches!(decode_reply(&wire(bad)), Err(BackendError::Malformed(_))),
                "{bad:?}"
            );
        }
    }
}

#[cfg(test)]
mod batch_tests;
