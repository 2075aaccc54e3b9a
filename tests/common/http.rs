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
