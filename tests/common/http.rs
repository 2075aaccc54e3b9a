//! A small HTTP/1.1 client for tests: one request per call on a fresh connection (so requests spread over
//! Envoy's workers the way separate clients would), every status returned as a value, never as an error.

use std::time::Duration;

/// One HTTP response: status, headers in the order received (names lower-case), body as text.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name` (case-insensitive), in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_idle_connections(0)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// Sends `method path` to 127.0.0.1:`port` with `headers`; Err on a transport failure (refused, reset,
/// timeout, malformed response).
pub fn try_http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Resp, String> {
    let mut req = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://127.0.0.1:{port}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req
        .body(())
        .map_err(|e| format!("bad request {method} {path}: {e}"))?;
    let resp = agent()
        .run(req)
        .map_err(|e| format!("{method} 127.0.0.1:{port}{path}: {e}"))?;
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = resp
        .into_body()
        .read_to_string()
        .map_err(|e| format!("{method} 127.0.0.1:{port}{path}: reading body: {e}"))?;
    Ok(Resp {
        status,
        headers,
        body,
    })
}

/// Like [`try_http`], panicking on a transport failure.
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    try_http(port, method, path, headers).unwrap_or_else(|e| panic!("{e}"))
}

/// `GET path` with `headers`.
pub fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> Resp {
    http(port, "GET", path, headers)
}

/// Base64url without padding (RFC 4648 §5), as JWTs and JWKS use it.
pub fn base64url(input: &[u8]) -> String {
    base64(input)
        .trim_end_matches('=')
        .replace('+', "-")
        .replace('/', "_")
}

/// Standard base64 (with padding), for `Authorization: Basic`.
pub fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The `Authorization` header value for HTTP Basic auth with `user:pass`.
pub fn basic_auth_header(user_pass: &str) -> String {
    format!("Basic {}", base64(user_pass.as_bytes()))
}

/// Sends `method target` over HTTP/1.1 to `addr` exactly as written (no URL parsing or path clean-up,
/// so `//api/x` or `/x/../y` reach Envoy byte for byte), with `headers` in order (a name may repeat:
/// each pair is one header line; `host` defaults to `localhost`). Reads the head and `content-length` bytes of body (Envoy waits
/// for the client to close first, so reading to the end would cost its `delayed_close_timeout`).
pub fn raw_request(
    addr: std::net::SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Result<Resp, String> {
    raw_request_from(None, addr, method, target, headers)
}

/// Like [`raw_request`], from source address `source` when given (any 127.0.0.0/8 address works on
/// Linux loopback): one machine playing several clients, each with its own `client_ip`.
pub fn raw_request_from(
    source: Option<std::net::IpAddr>,
    addr: std::net::SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Result<Resp, String> {
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
    raw_request_bytes(source, addr, method, target, &headers)
}

/// Like [`raw_request_from`], with header values as bytes, sent as they are (a value need not be
/// UTF-8: `K\xa0`).
pub fn raw_request_bytes(
    source: Option<std::net::IpAddr>,
    addr: std::net::SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &[u8])],
) -> Result<Resp, String> {
    use std::io::{Read, Write};
    let mut head = format!("{method} {target} HTTP/1.1\r\n").into_bytes();
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        head.extend_from_slice(b"host: localhost\r\n");
    }
    for (name, value) in headers {
        head.extend_from_slice(format!("{name}: ").as_bytes());
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"connection: close\r\n\r\n");
    let what = || format!("{method} {addr}{target}");
    let mut conn = connect_from(source, addr).map_err(|e| format!("{}: connect: {e}", what()))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| format!("{}: {e}", what()))?;
    conn.write_all(&head)
        .map_err(|e| format!("{}: write: {e}", what()))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let mut head: Option<RawHead> = None;
    loop {
        if head.is_none() {
            if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let h = RawHead::parse(&String::from_utf8_lossy(&raw[..end]), end + 4)
                    .ok_or_else(|| format!("{}: bad response head in {raw:?}", what()))?;
                head = Some(h);
            }
        }
        if let Some(RawHead {
            body_start,
            length: Some(length),
            ..
        }) = &head
        {
            if raw.len() >= body_start + length {
                raw.truncate(body_start + length);
                break;
            }
        }
        let n = conn
            .read(&mut buf)
            .map_err(|e| format!("{}: read: {e}", what()))?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let head = head.ok_or_else(|| format!("{}: no response head in {raw:?}", what()))?;
    Ok(Resp {
        status: head.status,
        body: String::from_utf8_lossy(&raw[head.body_start..]).into_owned(),
        headers: head.headers,
    })
}

/// A connection to `addr`, from `source` if given.
fn connect_from(
    source: Option<std::net::IpAddr>,
    addr: std::net::SocketAddr,
) -> std::io::Result<std::net::TcpStream> {
    let timeout = Duration::from_secs(10);
    let Some(ip) = source else {
        return std::net::TcpStream::connect_timeout(&addr, timeout);
    };
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    socket.bind(&std::net::SocketAddr::new(ip, 0).into())?;
    socket.connect_timeout(&addr.into(), timeout)?;
    Ok(socket.into())
}

/// A response head read by [`raw_request`].
struct RawHead {
    status: u16,
    headers: Vec<(String, String)>,
    /// Where the body starts in the bytes read.
    body_start: usize,
    /// `content-length`, if given.
    length: Option<usize>,
}

impl RawHead {
    fn parse(text: &str, body_start: usize) -> Option<RawHead> {
        let mut lines = text.split("\r\n");
        let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let length = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok());
        Some(RawHead {
            status,
            headers,
            body_start,
            length,
        })
    }
}
