//! The application behind every measured Envoy: answers each request with 200 "ok\n" on a kept-alive
//! connection, so each system pays for forwarding a request, not for opening a connection per request
//! (the e2e harness' upstream closes each one). It runs in this process: its CPU is not counted, and
//! it is the same for every system.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

const ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-type: text/plain\r\n\r\nok\n";
/// A request head longer than this closes its connection (Envoy sends a few hundred bytes).
const MAX_HEAD: usize = 64 * 1024;

/// Listens on a free loopback port; one thread per connection. The threads end with the process.
pub fn start() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind upstream: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("upstream address: {e}"))?
        .port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || serve(conn));
        }
    });
    Ok(port)
}

/// Answers every request head on `conn` (GETs: no bodies) until the peer closes it.
fn serve(mut conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        pending.extend_from_slice(buf.get(..n).unwrap_or_default());
        let heads = complete_heads(&mut pending);
        if pending.len() > MAX_HEAD {
            return;
        }
        for _ in 0..heads {
            if conn.write_all(ANSWER).is_err() {
                return;
            }
        }
    }
}

/// Removes every complete request head (up to its blank line) from the front of `pending`; returns
/// how many there were.
fn complete_heads(pending: &mut Vec<u8>) -> usize {
    let mut heads = 0;
    let mut start = 0;
    while let Some(end) = pending
        .get(start..)
        .and_then(|rest| rest.windows(4).position(|w| w == b"\r\n\r\n"))
    {
        heads += 1;
        start += end + 4;
    }
    pending.drain(..start);
    heads
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_whole_heads_and_keeps_a_partial_one() {
        let mut p = b"GET / HTTP/1.1\r\nhost: a\r\n\r\nGET /2 HTTP/1.1\r\n\r\nGET /3 HT".to_vec();
        assert_eq!(complete_heads(&mut p), 2);
        assert_eq!(p, b"GET /3 HT");
        p.extend_from_slice(b"TP/1.1\r\n\r\n");
        assert_eq!(complete_heads(&mut p), 1);
        assert!(p.is_empty());
        assert_eq!(complete_heads(&mut p), 0);
    }

    #[test]
    fn answers_requests_on_one_connection() {
        let port = start().unwrap_or_default();
        let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        for _ in 0..3 {
            c.write_all(b"GET /app/x HTTP/1.1\r\nhost: u\r\n\r\n")
                .expect("write");
            let mut got = vec![0u8; ANSWER.len()];
            c.read_exact(&mut got).expect("read");
            assert_eq!(got, ANSWER);
        }
    }
}
