//! A stand-in application behind Envoy (cluster "app", paths under /app/): it answers every request
//! with 200 "app\n" and counts what reached it, so a test can tell what the filter let through.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A reply piece that sends nothing and holds the connection open until Envoy closes it (a stream
/// that never ends unless its client goes away); counted in [`Upstream::held_closed`].
pub const HOLD: &[u8] = b"";

pub struct Upstream {
    pub port: u16,
    hits: Arc<AtomicU64>,
    held_closed: Arc<AtomicU64>,
}

impl Upstream {
    /// Listens on a free loopback port; one thread serves each connection, one request at a time,
    /// with `Connection: close`. The threads end with the test process.
    pub fn start() -> Upstream {
        Self::start_answering(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\napp\n".to_vec(),
        ])
    }

    /// Like [`Upstream::start`], answering every request with `reply`: the raw response, written
    /// piece by piece (each piece flushed on its own, e.g. the chunks of a stream).
    pub fn start_answering(reply: Vec<Vec<u8>>) -> Upstream {
        Self::start_with(move |_| reply.clone())
    }

    /// Like [`Upstream::start_answering`], with the reply made from the request head (request line
    /// and headers).
    pub fn start_with(reply: impl Fn(&str) -> Vec<Vec<u8>> + Send + Sync + 'static) -> Upstream {
        let reply = Arc::new(reply);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let port = listener.local_addr().expect("upstream addr").port();
        let hits = Arc::new(AtomicU64::new(0));
        let held_closed = Arc::new(AtomicU64::new(0));
        let counter = hits.clone();
        let closed = held_closed.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let counter = counter.clone();
                let closed = closed.clone();
                let reply = reply.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(&conn);
                    let mut line = String::new();
                    let mut head = String::new();
                    // Read the request head up to the blank line (the tests send no bodies).
                    loop {
                        line.clear();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => head.push_str(&line),
                        }
                    }
                    counter.fetch_add(1, Ordering::SeqCst);
                    let mut out = &conn;
                    for piece in reply(&head) {
                        if piece.is_empty() {
                            // HOLD: until Envoy closes the connection (or resets it).
                            let mut sink = [0u8; 1024];
                            while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
                            closed.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        if out.write_all(&piece).and_then(|()| out.flush()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Upstream {
            port,
            hits,
            held_closed,
        }
    }

    /// Requests that reached the application so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }

    /// Connections held open by a [`HOLD`] piece that Envoy has closed since.
    pub fn held_closed(&self) -> u64 {
        self.held_closed.load(Ordering::SeqCst)
    }
}
