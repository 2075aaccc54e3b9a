//! Rule matching and keys against a request view that keeps header lines apart, as Envoy does; a
//! file per area, the fake request and helpers here.

mod keys;
mod matching;
mod sources;
mod tiers;

use std::collections::HashMap;

use super::source::key_value;
use super::*;
use crate::bucket::Limits;
use crate::config::{HeaderMatch, HeaderValueMatch, KeySource, Match, Mode, Override, Quota, Rule};

#[derive(Default)]
struct Req {
    headers: HashMap<String, Vec<u8>>,
    /// Header lines as sent (name as sent, value), for `header_lines`; `headers` holds each
    /// name's lines joined with `,`.
    lines: Vec<(String, Vec<u8>)>,
    ip: Option<Vec<u8>>,
    /// Attributes by dot-joined path.
    props: HashMap<String, Vec<u8>>,
}

impl Req {
    fn new(method: &str, path: &str) -> Self {
        Req::default().with(":method", method).with(":path", path)
    }
    fn with(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers
            .insert(name.to_owned(), value.as_ref().to_vec());
        self.lines.retain(|(n, _)| n != name);
        self.lines.push((name.to_owned(), value.as_ref().to_vec()));
        self
    }
    /// Adds a header line (another line of a header already there is joined with `,` for
    /// `header`, as Envoy's attribute joins them).
    fn line(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        let key = name.to_ascii_lowercase();
        let joined = match self.headers.remove(&key) {
            Some(mut v) => {
                v.push(b',');
                v.extend_from_slice(value.as_ref());
                v
            }
            None => value.as_ref().to_vec(),
        };
        self.headers.insert(key, joined);
        self.lines.push((name.to_owned(), value.as_ref().to_vec()));
        self
    }
    fn ip(mut self, ip: &str) -> Self {
        self.ip = Some(ip.as_bytes().to_vec());
        self
    }
}

impl RequestView for Req {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.headers.get(name).map(|v| Cow::Borrowed(v.as_slice()))
    }
    fn header_lines(&self, name: &str) -> Lines<'_> {
        let mut lines = Lines::None;
        for (n, v) in &self.lines {
            if reading::is_header_name(n.as_bytes(), name) {
                lines.push(Cow::Borrowed(v));
            }
        }
        lines
    }
    fn client_ip(&self) -> Option<Vec<u8>> {
        self.ip.clone()
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.props.get(&path.join(".")).cloned()
    }
}

impl Req {
    fn prop(mut self, path: &str, value: impl AsRef<[u8]>) -> Self {
        self.props.insert(path.to_owned(), value.as_ref().to_vec());
        self
    }
}

/// The bucket key `applies` gives, if the rule applies.
fn key_of(prefix: &str, rule: &Rule, req: &Req) -> Option<String> {
    applies(prefix, (0, rule), req, &mut KeyCache::default()).map(|a| a.key)
}

/// The value of `source`, None when missing (panics when ambiguous).
fn one(source: KeySource, req: &Req) -> Option<Vec<u8>> {
    match key_values(&[source], req)?.remove(0) {
        Read::Value(v) => Some(v.into_owned()),
        other => panic!("{other:?}"),
    }
}

fn read(source: KeySource, req: &Req) -> Read<'static> {
    match key_value(&source, req) {
        Read::Value(v) => Read::Value(Cow::Owned(v.into_owned())),
        Read::Missing => Read::Missing,
        Read::Ambiguous => Read::Ambiguous,
    }
}

fn query(name: &str, path: &str) -> Option<Vec<u8>> {
    one(KeySource::Query(name.into()), &Req::new("GET", path))
}

fn rule(matcher: Match, key: Vec<KeySource>) -> Rule {
    Rule {
        name: "per-user".into(),
        matcher,
        key,
        limits: Quota::try_from(Limits {
            burst: 10,
            rate: 10,
            period_ms: 1000,
        })
        .unwrap(),
        cost: 1,
        cost_header: None,
        mode: Mode::Exact,
        max_wait_ms: 0,
        lease_max: 10,
        lease_horizon_ms: 200,
        shadow: false,
        fallback: None,
        usage: None,
        overrides: Default::default(),
        tiers: None,
        penalty: None,
    }
}

/// `prefix:{rule:` + 32 lowercase hex + `}`.
fn assert_safe_key(key: &str, prefix: &str, rule: &str) {
    let head = format!("{prefix}:{{{rule}:");
    assert!(key.starts_with(&head), "{key}");
    assert!(key.ends_with('}'), "{key}");
    let digest = &key[head.len()..key.len() - 1];
    assert_eq!(digest.len(), 32, "{key}");
    assert!(
        digest
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "{key}"
    );
}

/// Spellings of the host `api.example.com` in `:authority` that a server routes to it: case, a
/// port, a trailing dot, userinfo.
const SPELLINGS_OF_API_EXAMPLE_COM: [&str; 7] = [
    "API.example.com",
    "api.EXAMPLE.com",
    "api.example.com:1",
    "api.example.com:443",
    "api.example.com.",
    "api.example.com.:8443",
    "user@api.example.com:2",
];

fn hdr(name: &str) -> KeySource {
    KeySource::Header(name.into())
}

fn header_rule(name: &str, value: HeaderValueMatch) -> Match {
    Match {
        headers: vec![HeaderMatch {
            name: name.into(),
            value,
        }],
        ..Match::default()
    }
}

fn property(path: &str) -> KeySource {
    let (spelled, resolved) = match path {
        "source.principal" => (path, "connection.uri_san_peer_certificate"),
        p => (p, p),
    };
    KeySource::Property {
        spelled: spelled.into(),
        path: resolved.split('.').map(str::to_owned).collect(),
    }
}
