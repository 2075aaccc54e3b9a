//! What travels between the engine and the host for one backend call: the call going out, typed by
//! the transport that encoded it, and the answer coming back, typed by what the host delivered.
//!
//! Invariant: no status is packed into an integer. A host's way of saying "no answer" (an HTTP
//! callout with no headers, a Redis callback with a network error) is `Answer::NoAnswer`; an
//! answer longer than [`MAX_REPLY_BYTES`] is never read into the VM (`Payload::TooLarge`), and
//! nothing in it reaches a decoder. The host is asked only for what the answer needs: no
//! `:status` of an answer without headers, no body over the bound, no read of an empty one.

use super::HttpRequest;

/// Most bytes of a backend answer read into the VM, for both transports: 4096 bytes (a single
/// reply, at most 150 bytes, or a Redis error message) and 132 bytes a key for a full batched
/// reply of [`MAX_BATCH_KEYS`](super::MAX_BATCH_KEYS) keys (6 integers of at most 20 characters
/// and a separator: 21 bytes each as JSON, 23 as RESP, whose extra 6 a key the 4096 cover). A
/// larger answer is garbage, refused unread.
pub const MAX_REPLY_BYTES: usize = 4096 + 132 * super::MAX_BATCH_KEYS;

/// A call for the host to send, as a transport encoded it: the host picks the ABI call from its
/// kind (an HTTP callout, or a command on Higress' Redis client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    /// An HTTP callout (`proxy_http_call`) to the backend cluster.
    Http(HttpRequest),
    /// One RESP command (`proxy_redis_call`) on the worker's Redis client for the backend
    /// cluster; its timeout was given to the client when it was set up.
    Resp(Vec<u8>),
}

impl Outgoing {
    /// The bytes the backend acts on: the HTTP body (Webdis' command) or the RESP command.
    pub fn payload(&self) -> &[u8] {
        match self {
            Outgoing::Http(req) => &req.body,
            Outgoing::Resp(command) => command,
        }
    }
}

/// The answer to a call, as the host delivered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP callout's answer: its `:status` and its body.
    Http { status: u32, body: Payload },
    /// A Redis reply, raw RESP (an error reply too: Redis answered).
    Redis(Payload),
    /// No answer: the stream was reset or timed out (Envoy reports both as a call response
    /// without headers), or the Redis connection failed, was closed or timed out.
    NoAnswer,
}

/// An answer's bytes, read only when they are few enough to be a script reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// At most [`MAX_REPLY_BYTES`] bytes, as the host handed them over.
    Read(Vec<u8>),
    /// This many bytes, more than [`MAX_REPLY_BYTES`]: left unread in the host.
    TooLarge(usize),
}

impl Payload {
    /// `size` bytes the host holds: read by `read` when within the bound (a read the host
    /// refuses is an empty payload, which no decoder accepts); an empty one is not asked for.
    fn of(size: usize, read: impl FnOnce(usize) -> Option<Vec<u8>>) -> Payload {
        if size > MAX_REPLY_BYTES {
            return Payload::TooLarge(size);
        }
        if size == 0 {
            return Payload::Read(Vec::new());
        }
        Payload::Read(read(size).unwrap_or_default())
    }
}

impl Answer {
    /// An HTTP callout's answer as the host reports it (`proxy_on_http_call_response`): the
    /// number of its headers (0: reset or timed out), `status` reads its `:status` header,
    /// `body_size` is its body's length and `read` reads that many bytes of it. An answer whose
    /// `:status` is missing or not a number has no status to judge by: no answer either.
    pub fn http(
        headers: usize,
        status: impl FnOnce() -> Option<Vec<u8>>,
        body_size: usize,
        read: impl FnOnce(usize) -> Option<Vec<u8>>,
    ) -> Answer {
        if headers == 0 {
            return Answer::NoAnswer;
        }
        let Some(status) = status().and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok()) else {
            return Answer::NoAnswer;
        };
        Answer::Http {
            status,
            body: Payload::of(body_size, read),
        }
    }

    /// A Redis callout's answer as Higress reports it (`proxy_on_redis_call_response`): whether
    /// Redis replied (its `RedisStatus::Ok`; any other status is a network error, with no reply),
    /// the reply's length, and `read` that reads that many bytes of it.
    pub fn redis(
        replied: bool,
        size: usize,
        read: impl FnOnce(usize) -> Option<Vec<u8>>,
    ) -> Answer {
        if !replied {
            return Answer::NoAnswer;
        }
        Answer::Redis(Payload::of(size, read))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A host holding `bytes`, counting the reads it is asked for.
    fn host<'a>(
        bytes: &[u8],
        reads: &'a Cell<usize>,
    ) -> impl FnOnce(usize) -> Option<Vec<u8>> + 'a {
        let bytes = bytes.to_vec();
        move |n| {
            reads.set(reads.get() + 1);
            Some(bytes.get(..n).unwrap_or(&bytes).to_vec())
        }
    }

    fn status(s: &str) -> impl FnOnce() -> Option<Vec<u8>> + '_ {
        move || Some(s.as_bytes().to_vec())
    }

    #[test]
    fn an_http_answer_carries_its_status_and_body() {
        let reads = Cell::new(0);
        let a = Answer::http(3, status("200"), 5, host(b"hello", &reads));
        assert_eq!(
            a,
            Answer::Http {
                status: 200,
                body: Payload::Read(b"hello".to_vec())
            }
        );
        let a = Answer::http(3, status("503"), 2, host(b"no", &reads));
        assert_eq!(
            a,
            Answer::Http {
                status: 503,
                body: Payload::Read(b"no".to_vec())
            }
        );
        assert_eq!(reads.get(), 2);
    }

    #[test]
    fn no_headers_or_no_status_is_no_answer_and_nothing_is_read() {
        let reads = Cell::new(0);
        let asked = Cell::new(false);
        let a = Answer::http(
            0,
            || {
                asked.set(true);
                Some(b"200".to_vec())
            },
            5,
            host(b"hello", &reads),
        );
        assert_eq!(a, Answer::NoAnswer);
        assert!(!asked.get(), ":status read without headers");
        for bad in [
            None,
            Some(&b""[..]),
            Some(b"2OO"),
            Some(b"-1"),
            Some(b"\xff"),
        ] {
            let a = Answer::http(1, || bad.map(<[u8]>::to_vec), 5, host(b"hello", &reads));
            assert_eq!(a, Answer::NoAnswer, "{bad:?}");
        }
        assert_eq!(reads.get(), 0);
    }

    #[test]
    fn an_answer_over_the_bound_is_not_read() {
        let reads = Cell::new(0);
        let big = vec![b'x'; MAX_REPLY_BYTES + 1];
        let a = Answer::http(1, status("200"), big.len(), host(&big, &reads));
        assert_eq!(
            a,
            Answer::Http {
                status: 200,
                body: Payload::TooLarge(MAX_REPLY_BYTES + 1)
            }
        );
        let a = Answer::redis(true, usize::MAX, host(&big, &reads));
        assert_eq!(a, Answer::Redis(Payload::TooLarge(usize::MAX)));
        assert_eq!(reads.get(), 0);
        // Exactly at the bound is read.
        let a = Answer::redis(true, MAX_REPLY_BYTES, host(&big, &reads));
        assert_eq!(a, Answer::Redis(Payload::Read(vec![b'x'; MAX_REPLY_BYTES])));
        assert_eq!(reads.get(), 1);
    }

    #[test]
    fn a_redis_callback_without_a_reply_is_no_answer() {
        let reads = Cell::new(0);
        assert_eq!(Answer::redis(false, 0, host(b"", &reads)), Answer::NoAnswer);
        // A network error reports no reply, whatever size comes with it.
        assert_eq!(
            Answer::redis(false, 5, host(b"+OK\r\n", &reads)),
            Answer::NoAnswer
        );
        // A reply of 0 bytes is an (undecodable) empty reply; the host is not asked for it.
        assert_eq!(
            Answer::redis(true, 0, host(b"", &reads)),
            Answer::Redis(Payload::Read(Vec::new()))
        );
        assert_eq!(reads.get(), 0);
    }

    #[test]
    fn a_refused_read_is_an_empty_payload() {
        let a = Answer::redis(true, 10, |_| None);
        assert_eq!(a, Answer::Redis(Payload::Read(Vec::new())));
    }

    #[test]
    fn the_payload_of_each_kind_of_call() {
        let http = Outgoing::Http(HttpRequest {
            headers: vec![(":method".into(), "POST".into())],
            body: b"EVALSHA/x".to_vec(),
        });
        assert_eq!(http.payload(), b"EVALSHA/x");
        assert_eq!(Outgoing::Resp(b"*1\r\n".to_vec()).payload(), b"*1\r\n");
    }
}
