//! The wire: the downstream HTTP/1.1 listener side (one thread per connection, keep-alive), and the
//! HTTP/1.1 client that carries callouts to a cluster.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use crate::worker::{Event, Request, Response};

/// Reads requests from `conn` and hands each to the worker; writes each answer back. Ends when the
/// client closes, sends `connection: close`, or the worker is gone.
pub fn serve_connection(conn: TcpStream, worker: mpsc::Sender<Event>) {
    let Ok(peer) = conn.peer_addr() else { return };
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = conn;
    loop {
        let Some((headers, body, close)) = read_request(&mut reader) else {
            return;
        };
        let (tx, rx) = mpsc::channel();
        if worker
            .send(Event::Request(Request {
                headers,
                body,
                peer,
                reply: tx,
            }))
            .is_err()
        {
            return;
        }
        match rx.recv() {
            Ok(Response::Reply {
                status,
                headers,
                body,
            }) => {
                let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status));
                for (k, v) in &headers {
                    if k.starts_with(':') || k == "content-length" || k == "connection" {
                        continue;
                    }
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str(&format!("content-length: {}\r\n", body.len()));
                if close {
                    out.push_str("connection: close\r\n");
                }
                out.push_str("\r\n");
                let mut bytes = out.into_bytes();
                bytes.extend_from_slice(&body);
                if writer.write_all(&bytes).is_err() || close {
                    return;
                }
            }
            // The stream was reset (close_stream) or the worker stopped: drop the connection.
            Ok(Response::Reset) | Err(_) => {
                let _ = writer.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// A downstream request: headers, body, and whether the client asked to close.
type Incoming = (Vec<(String, String)>, Vec<u8>, bool);

/// One request as Envoy's HTTP connection manager hands it to filters: pseudo-headers `:method`,
/// `:path`, `:authority` (from Host), `:scheme`, then the client's headers with lower-case names, then
/// what Envoy adds (`x-forwarded-proto`, `x-request-id`). Returns the headers, the body and whether
/// the client asked to close.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Incoming> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.trim_end().splitn(3, ' ');
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let version = parts.next().unwrap_or("HTTP/1.1").to_string();
    let mut client = Vec::new();
    let mut authority = String::new();
    let mut length = 0usize;
    let mut close = version == "HTTP/1.0";
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        let k = k.trim().to_ascii_lowercase();
        let v = v.trim().to_string();
        match k.as_str() {
            "host" => authority = v,
            "content-length" => length = v.parse().ok()?,
            "connection" => close = v.eq_ignore_ascii_case("close"),
            _ => client.push((k, v)),
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let mut headers = vec![
        (":authority".to_string(), authority),
        (":path".to_string(), path),
        (":method".to_string(), method),
        (":scheme".to_string(), "http".to_string()),
    ];
    headers.extend(client);
    headers.push(("x-forwarded-proto".to_string(), "http".to_string()));
    headers.push(("x-request-id".to_string(), request_id()));
    Some((headers, body, close))
}

fn request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    format!(
        "00000000-0000-4000-8000-{:012x}",
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// How a callout ended without an HTTP response.
#[derive(Debug)]
pub enum CalloutFailure {
    /// TCP connect refused or timed out.
    Connect(String),
    /// The connection closed or broke before a whole response arrived.
    Reset(#[allow(dead_code)] String),
}

/// An HTTP response to a callout: headers (`:status` first) and body.
pub type CalloutResponse = (Vec<(String, String)>, Vec<u8>);

/// Sends one HTTP/1.1 request to `addr` on a fresh connection and reads the whole response. The
/// caller enforces the callout's timeout (`rq_timeout`, None: none); the socket's own timeout only
/// frees this thread eventually. Like Envoy's pool the request is keep-alive (no `connection:
/// close`; Webdis 0.1.x never answers a large POST that asks to close), and like Envoy's router it
/// carries `x-envoy-expected-rq-timeout-ms` when there is a timeout.
pub fn http_callout(
    addr: SocketAddr,
    headers: &[(String, String)],
    body: &[u8],
    connect_timeout: Duration,
    rq_timeout: Option<Duration>,
) -> Result<CalloutResponse, CalloutFailure> {
    let io_timeout = rq_timeout
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_secs(5));
    let mut conn = TcpStream::connect_timeout(&addr, connect_timeout)
        .map_err(|e| CalloutFailure::Connect(e.to_string()))?;
    let _ = conn.set_read_timeout(Some(io_timeout));
    let _ = conn.set_write_timeout(Some(io_timeout));
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    let mut out = format!(
        "{} {} HTTP/1.1\r\nhost: {}\r\n",
        get(":method"),
        get(":path"),
        get(":authority")
    );
    for (k, v) in headers {
        if k.starts_with(':') || k.eq_ignore_ascii_case("content-length") {
            continue;
        }
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(t) = rq_timeout {
        out.push_str(&format!(
            "x-envoy-expected-rq-timeout-ms: {}\r\n",
            t.as_millis()
        ));
    }
    out.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    conn.write_all(&bytes)
        .map_err(|e| CalloutFailure::Reset(e.to_string()))?;
    let mut reader = BufReader::new(conn);
    let reset = |e: &str| CalloutFailure::Reset(e.to_string());
    let mut status_line = String::new();
    if reader
        .read_line(&mut status_line)
        .map_err(|e| reset(&e.to_string()))?
        == 0
    {
        return Err(reset("connection closed before the response"));
    }
    let status = status_line
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| reset("bad status line"))?
        .to_string();
    let mut resp_headers = vec![(":status".to_string(), status)];
    let mut length: Option<usize> = None;
    let mut chunked = false;
    loop {
        let mut h = String::new();
        if reader
            .read_line(&mut h)
            .map_err(|e| reset(&e.to_string()))?
            == 0
        {
            return Err(reset("connection closed in the headers"));
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        let Some((k, v)) = h.split_once(':') else {
            return Err(reset("bad header line"));
        };
        let k = k.trim().to_ascii_lowercase();
        let v = v.trim().to_string();
        if k == "content-length" {
            length = v.parse().ok();
        }
        if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        }
        resp_headers.push((k, v));
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            reader
                .read_line(&mut size)
                .map_err(|e| reset(&e.to_string()))?;
            let n = usize::from_str_radix(size.trim(), 16).map_err(|_| reset("bad chunk"))?;
            let mut chunk = vec![0; n + 2];
            reader
                .read_exact(&mut chunk)
                .map_err(|e| reset(&e.to_string()))?;
            if n == 0 {
                break;
            }
            chunk.truncate(n);
            body.extend_from_slice(&chunk);
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        reader
            .read_exact(&mut body)
            .map_err(|e| reset(&e.to_string()))?;
    } else {
        reader
            .read_to_end(&mut body)
            .map_err(|e| reset(&e.to_string()))?;
    }
    Ok((resp_headers, body))
}
