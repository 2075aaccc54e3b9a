//! Higress' Redis callouts, the host side: one client per worker and cluster, like Higress' Envoy
//! (higress-group/envoy source/common/redis/async_client_impl.cc and
//! source/extensions/filters/network/common/redis/raw_client_impl.cc):
//! - one TCP connection, opened on the first command after none is open, with `AUTH` (username and
//!   password, or password) and `SELECT <db>` sent first and their replies discarded;
//! - commands are written as the module gave them and replies matched in order (pipelining);
//! - a refused or failed connect, a closed connection, a protocol error or no reply within the op
//!   timeout closes the connection and fails every command on it: callback status 1
//!   (`RedisStatus::NetworkError`), size 0;
//! - a reply (including a Redis error reply) is delivered raw: status 0 and its bytes.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use crate::worker::Event;

/// `RedisStatus::Ok` and `RedisStatus::NetworkError` (higress-group/proxy-wasm-cpp-sdk proxy_wasm_enums.h).
pub const STATUS_OK: u32 = 0;
pub const STATUS_NETWORK_ERROR: u32 = 1;

/// What `proxy_redis_init` configured for one cluster on one worker.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    pub addr: SocketAddr,
    pub username: Vec<u8>,
    pub password: Vec<u8>,
    pub op_timeout: Duration,
    pub db: Option<String>,
    pub connect_timeout: Duration,
}

/// A handle on the connection thread; dropping it closes the connection and fails what is pending
/// on it (Envoy's `initialize` closes the client's connections).
pub struct RedisClient {
    tx: mpsc::Sender<(u32, Vec<u8>)>,
}

impl RedisClient {
    pub fn start(config: RedisConfig, events: mpsc::Sender<Event>) -> RedisClient {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || run(config, rx, events));
        RedisClient { tx }
    }

    /// Queues one command; false if the connection thread is gone.
    pub fn send(&self, token: u32, query: Vec<u8>) -> bool {
        self.tx.send((token, query)).is_ok()
    }
}

fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Replies still to discard (AUTH, SELECT).
    discard: usize,
}

fn connect(config: &RedisConfig) -> std::io::Result<Conn> {
    let mut stream = TcpStream::connect_timeout(&config.addr, config.connect_timeout)?;
    stream.set_read_timeout(Some(config.op_timeout.max(Duration::from_millis(1))))?;
    stream.set_nodelay(true)?;
    let mut prelude = Vec::new();
    let mut discard = 0;
    if !config.username.is_empty() {
        prelude.extend(command(&[b"AUTH", &config.username, &config.password]));
        discard += 1;
    } else if !config.password.is_empty() {
        prelude.extend(command(&[b"AUTH", &config.password]));
        discard += 1;
    }
    if let Some(db) = &config.db {
        prelude.extend(command(&[b"SELECT", db.as_bytes()]));
        discard += 1;
    }
    stream.write_all(&prelude)?;
    Ok(Conn {
        stream,
        buf: Vec::new(),
        discard,
    })
}

fn run(config: RedisConfig, rx: mpsc::Receiver<(u32, Vec<u8>)>, events: mpsc::Sender<Event>) {
    let mut conn: Option<Conn> = None;
    let mut pending: VecDeque<u32> = VecDeque::new();
    let fail = |tokens: &mut VecDeque<u32>| {
        for token in tokens.drain(..) {
            let _ = events.send(Event::RedisDone {
                token,
                status: STATUS_NETWORK_ERROR,
                reply: Vec::new(),
            });
        }
    };
    loop {
        let mut batch = Vec::new();
        let mut closed = false;
        if pending.is_empty() {
            match rx.recv() {
                Ok(c) => batch.push(c),
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if closed {
            pending.extend(batch.iter().map(|(t, _)| *t));
            fail(&mut pending);
            return;
        }
        if !batch.is_empty() {
            if conn.is_none() {
                match connect(&config) {
                    Ok(c) => conn = Some(c),
                    Err(_) => {
                        pending.extend(batch.iter().map(|(t, _)| *t));
                        fail(&mut pending);
                        continue;
                    }
                }
            }
            let mut bytes = Vec::new();
            for (token, query) in batch {
                bytes.extend_from_slice(&query);
                pending.push_back(token);
            }
            let written = conn
                .as_mut()
                .map(|c| c.stream.write_all(&bytes).is_ok())
                .unwrap_or(false);
            if !written {
                conn = None;
                fail(&mut pending);
                continue;
            }
        }
        if pending.is_empty() {
            continue;
        }
        let Some(c) = conn.as_mut() else {
            fail(&mut pending);
            continue;
        };
        match read_reply(c) {
            Ok(reply) => {
                if let Some(token) = pending.pop_front() {
                    let _ = events.send(Event::RedisDone {
                        token,
                        status: STATUS_OK,
                        reply,
                    });
                }
            }
            Err(()) => {
                conn = None;
                fail(&mut pending);
            }
        }
    }
}

/// The next reply meant for a command (prelude replies skipped); Err on timeout, close or a
/// protocol error.
fn read_reply(c: &mut Conn) -> Result<Vec<u8>, ()> {
    loop {
        match frame_len(&c.buf, 0)? {
            Some(n) => {
                let reply: Vec<u8> = c.buf.drain(..n).collect();
                if c.discard > 0 {
                    c.discard -= 1;
                    continue;
                }
                return Ok(reply);
            }
            None => {
                let mut chunk = [0u8; 4096];
                match c.stream.read(&mut chunk) {
                    Ok(0) | Err(_) => return Err(()),
                    Ok(n) => c.buf.extend_from_slice(&chunk[..n]),
                }
            }
        }
    }
}

/// The length of the one RESP value at the start of `buf`: Ok(None) if incomplete, Err if it is not
/// RESP.
#[allow(clippy::result_unit_err)]
pub fn frame_len(buf: &[u8], depth: usize) -> Result<Option<usize>, ()> {
    if depth > 64 {
        return Err(());
    }
    let Some(&kind) = buf.first() else {
        return Ok(None);
    };
    let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = std::str::from_utf8(&buf[1..eol]).map_err(|_| ())?;
    let head = eol + 2;
    match kind {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Ok(Some(head)),
        b'$' | b'!' | b'=' => {
            let n: i64 = line.parse().map_err(|_| ())?;
            if n < 0 {
                return Ok(Some(head));
            }
            let end = head + usize::try_from(n).map_err(|_| ())? + 2;
            Ok((buf.len() >= end).then_some(end))
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n: i64 = line.parse().map_err(|_| ())?;
            if n < 0 {
                return Ok(Some(head));
            }
            let items = usize::try_from(n).map_err(|_| ())?
                * if matches!(kind, b'%' | b'|') { 2 } else { 1 };
            let mut at = head;
            for _ in 0..items {
                match frame_len(&buf[at..], depth + 1)? {
                    Some(n) => at += n,
                    None => return Ok(None),
                }
            }
            Ok(Some(at))
        }
        _ => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::frame_len;

    #[test]
    fn frames() {
        assert_eq!(frame_len(b"+OK\r\n", 0), Ok(Some(5)));
        assert_eq!(frame_len(b"+OK\r", 0), Ok(None));
        assert_eq!(frame_len(b"*2\r\n:1\r\n$3\r\nabc\r\n:9", 0), Ok(Some(17)));
        assert_eq!(frame_len(b"*2\r\n:1\r\n$3\r\nab", 0), Ok(None));
        assert_eq!(frame_len(b"$-1\r\n", 0), Ok(Some(5)));
        assert_eq!(frame_len(b"x\r\n", 0), Err(()));
    }
}
