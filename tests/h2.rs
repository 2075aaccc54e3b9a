//! What an HTTP/2 client can send that an HTTP/1.1 client cannot, through a real Envoy 1.40 with
//! the shipped edge settings (envoy/envoy.yaml, `codec_type: AUTO`: h2c with prior knowledge):
//! spaces or tabs around a header value, which Envoy passes on as sent (its HTTP/1.1 codec trims
//! them) and an HTTP/1.1 application reads without, and a lower-case method, which Django and
//! Werkzeug upper-case. Neither may name a bucket of its own or step out of a rule.
//!
//! Each test spends a key's burst of 2, then sends its other spellings, and counts what reached
//! the application. Against the build before they were read as the application reads them, 7 of
//! 7 padded values, 5 of 5 method spellings and 1 of 1 padded `authorization` reached it.
//! Needs `make setup` and `make build`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::upstream::Upstream;
use common::{scratch_dir, Envoy, Redis, Webdis};

/// An HPACK integer with an `bits`-bit prefix, its first byte's other bits `first`.
fn hpack_int(out: &mut Vec<u8>, mut v: usize, bits: u8, first: u8) {
    let max = (1usize << bits) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v & 127) as u8 | 128);
        v >>= 7;
    }
    out.push(v as u8);
}

/// An HTTP/2 frame: type `kind`, `flags`, on stream `stream`.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// Sends one request of `headers` only (literal fields, no Huffman) on a fresh h2c connection,
/// and returns once its stream has ended (the whole answer came, or it was reset).
fn h2_request(port: u16, headers: &[(&str, &str)]) {
    const DATA: u8 = 0;
    const HEADERS: u8 = 1;
    const RST_STREAM: u8 = 3;
    const SETTINGS: u8 = 4;
    const GOAWAY: u8 = 7;
    const END_STREAM: u8 = 1;
    let mut block = Vec::new();
    for (name, value) in headers {
        block.push(0);
        hpack_int(&mut block, name.len(), 7, 0);
        block.extend(name.as_bytes());
        hpack_int(&mut block, value.len(), 7, 0);
        block.extend(value.as_bytes());
    }
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    // END_HEADERS | END_STREAM.
    out.extend(frame(HEADERS, 0x5, 1, &block));
    s.write_all(&out).unwrap();
    let mut buf = Vec::new();
    loop {
        while buf.len() >= 9 {
            let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
            if buf.len() < 9 + len {
                break;
            }
            let (kind, flags) = (buf[3], buf[4]);
            let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
            buf.drain(..9 + len);
            if kind == SETTINGS && flags & 1 == 0 {
                s.write_all(&frame(SETTINGS, 1, 0, &[])).unwrap();
            }
            let ended = (kind == DATA || kind == HEADERS) && flags & END_STREAM != 0;
            if kind == GOAWAY || (stream == 1 && (kind == RST_STREAM || ended)) {
                return;
            }
        }
        let mut chunk = [0u8; 16384];
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend(&chunk[..n]),
        }
    }
}

/// Redis, Webdis, an application that answers 200 and counts what reaches it, and Envoy with
/// `rule` in front of it.
struct Rig {
    envoy: Envoy,
    app: Upstream,
    _webdis: Webdis,
    _redis: Redis,
}

impl Rig {
    fn start(name: &str, rule: &str) -> Rig {
        let dir = scratch_dir(name);
        let redis = Redis::start(&dir);
        let webdis = Webdis::start(&dir, redis.port);
        let app = Upstream::start_with(|_| {
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n".to_vec()]
        });
        let config = format!(r#"{{ "backend": {{ "timeout_ms": 2000 }}, "rules": [ {rule} ] }}"#);
        let envoy = Envoy::try_start_with_upstream(&dir, &config, webdis.port, app.port)
            .unwrap_or_else(|log| panic!("envoy did not start:\n{log}"));
        Rig {
            envoy,
            app,
            _webdis: webdis,
            _redis: redis,
        }
    }

    /// Whether a request of `method` with `headers` on `/app/x` reached the application (the
    /// application counts it before it answers, and the request has ended here).
    fn reaches(&self, method: &str, headers: &[(&str, &str)]) -> bool {
        let before = self.app.hits();
        let mut all = vec![
            (":method", method),
            (":scheme", "http"),
            (":authority", "api.example.com"),
            (":path", "/app/x"),
        ];
        all.extend_from_slice(headers);
        h2_request(self.envoy.listen_port, &all);
        self.app.hits() > before
    }

    /// Spends the burst of 2 with `method` and `headers`, and checks that a third is refused.
    fn spend(&self, method: &str, headers: &[(&str, &str)]) {
        for _ in 0..2 {
            assert!(self.reaches(method, headers), "{}", self.envoy.log_text());
        }
        assert!(!self.reaches(method, headers), "the burst is spent");
    }

    /// How many of `attempts` reached the application, printed under `what`.
    fn admitted(&self, what: &str, attempts: &[(&str, Vec<(&str, &str)>)]) -> usize {
        let n = attempts
            .iter()
            .filter(|(method, headers)| self.reaches(method, headers))
            .count();
        eprintln!("h2: {what}: admitted {n} of {}", attempts.len());
        n
    }
}

const ONE_A_MINUTE: &str = r#""rate": 1, "period_ms": 60000, "burst": 2"#;

/// A `header:` key: once `W` has spent its burst, its values with spaces or tabs around them are
/// `W` to the application, and are refused in `W`'s bucket.
#[test]
fn a_padded_header_value_is_its_value() {
    let rig = Rig::start(
        "h2-pad",
        &format!(r#"{{ "name": "h", "key": ["header:x-user"], {ONE_A_MINUTE} }}"#),
    );
    rig.spend("GET", &[("x-user", "W")]);
    let pads = ["W ", "W  ", "W\t", " W", " W ", "\tW", "W \t "];
    let attempts: Vec<_> = pads.iter().map(|p| ("GET", vec![("x-user", *p)])).collect();
    assert_eq!(rig.admitted("padded values of a spent key", &attempts), 0);
}

/// A `methods: ["DELETE"]` rule holds for a lower-case `delete` and for an override header
/// with spaces or tabs around its method.
#[test]
fn a_methods_match_holds_for_every_spelling_of_the_method() {
    let rig = Rig::start(
        "h2-method",
        &format!(
            r#"{{ "name": "del", "match": {{ "methods": ["DELETE"] }}, "key": ["client_ip"],
                 {ONE_A_MINUTE} }}"#
        ),
    );
    rig.spend("DELETE", &[]);
    let attempts = [
        ("delete", vec![]),
        ("Delete", vec![]),
        ("POST", vec![("x-http-method-override", "DELETE ")]),
        ("POST", vec![("x-http-method-override", " DELETE")]),
        ("POST", vec![("x-http-method", "delete\t")]),
    ];
    assert_eq!(rig.admitted("spellings of a spent DELETE", &attempts), 0);
}

/// A header condition (`authorization` starting `Bearer `) holds for the value with a space
/// before it.
#[test]
fn a_header_condition_holds_for_a_padded_value() {
    let rig = Rig::start(
        "h2-condition",
        &format!(
            r#"{{ "name": "auth", "key": ["client_ip"],
                 "match": {{ "headers": [ {{ "name": "authorization", "prefix": "Bearer " }} ] }},
                 {ONE_A_MINUTE} }}"#
        ),
    );
    rig.spend("GET", &[("authorization", "Bearer t")]);
    let attempts = [("GET", vec![("authorization", " Bearer t")])];
    assert_eq!(rig.admitted("a padded authorization", &attempts), 0);
}
