//! Key extraction: over any request (arbitrary header bytes, path, method, authority, client IP) and
//! a fixed valid configuration, `rule::applies` / `key_values` / `bucket_key` never panic, and every
//! key is `<prefix>:{<rule>:<32 lowercase hex>}` — no request byte reaches it. Also: `applies` is
//! exactly "match holds and every source is present", an ambiguous source (a query parameter or
//! cookie named twice) gets the rule's own limits, key values are the request's own bytes (the
//! path and client address in their normal forms), and a different user id (or a different split
//! of the same bytes between two values) gives a different bucket. Path normalisation is a fixed
//! point, and respelling a path (`/x/..` in front, a doubled slash, an escaped letter) never changes
//! its normal form, so never lets it out of a path rule.
#![no_main]

use std::borrow::Cow;
use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tollgate_core::config::{Config, KeySource, Override};
use tollgate_core::rule::path::{self, Reading};
use tollgate_core::rule::reading::{self, is_header_name};
use tollgate_core::rule::{
    applies, bucket_key, bucket_key_of, key_values, matches, KeyCache, Lines, Part, Read,
    RequestView,
};

const CONFIG: &str = r#"{
  "key_prefix": "tg.fuzz:1-x_",
  "rules": [
    { "name": "per-user",
      "match": { "path_prefix": "/api/", "methods": ["GET", "POST"],
                 "headers": [ { "name": "x-tier", "exact": "free" } ] },
      "key": ["header:x-user-id"], "rate": 100, "burst": 200 },
    { "name": "pair", "key": ["header:x-user-id", "header:x-api-key"], "rate": 10 },
    { "name": "per-ip-path", "match": { "methods": ["PUT"] },
      "key": ["client_ip:v4=/24,v6=/56", "path", "method"], "rate": 10 },
    { "name": "by_query", "match": { "path_prefix": "/q", "path_ignore_case": true },
      "key": ["query:user", "query:a b", "authority"], "rate": 10 },
    { "name": "ci-path", "match": { "path_prefix": "/API/", "path_ignore_case": true },
      "key": ["path", "property:request.url_path"], "rate": 10 },
    { "name": "authed", "match": { "headers": [ { "name": "authorization", "present": true } ] },
      "key": ["header:authorization", "literal:all"], "rate": 10 },
    { "name": "ident", "key": ["cookie:sid", "metadata:jwt:p.sub", "property:source.port"],
      "rate": 10 },
    { "name": "tenant",
      "match": { "hosts": ["api.example.com", "*.t.example.com"],
                 "headers": [ { "name": "x-api-key", "absent": true },
                              { "name": "authorization", "prefix": "Bearer " },
                              { "name": "x-tier", "regex": "(free|trial)-[0-9]{1,3}" } ] },
      "key": ["header:x-user-id"], "rate": 10,
      "overrides": [ { "key": ["acme"], "rate": 100, "burst": 300 },
                     { "key": ["free"], "unlimited": true } ] },
    { "name": "global", "rate": 1000 }
  ]
}"#;

fn config() -> &'static Config {
    static CONFIG_CELL: OnceLock<Config> = OnceLock::new();
    CONFIG_CELL.get_or_init(|| Config::try_from(CONFIG.as_bytes()).expect("fixed config parses"))
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq)]
enum Name {
    UserId,
    ApiKey,
    Tier,
    Authorization,
    Cookie,
}

impl Name {
    fn as_str(self) -> &'static str {
        match self {
            Name::UserId => "x-user-id",
            Name::ApiKey => "x-api-key",
            Name::Tier => "x-tier",
            Name::Authorization => "authorization",
            Name::Cookie => "cookie",
        }
    }
}

/// A header value: the one the config matches on, or any bytes.
#[derive(Arbitrary, Debug, Clone)]
enum Value {
    Free,
    Bytes(Vec<u8>),
}

impl Value {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Value::Free => b"free".to_vec(),
            Value::Bytes(b) => b.clone(),
        }
    }
    fn bytes_mut(&mut self) -> &mut Vec<u8> {
        if let Value::Free = self {
            *self = Value::Bytes(b"free".to_vec());
        }
        match self {
            Value::Bytes(b) => b,
            Value::Free => unreachable!("just replaced"),
        }
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum Method {
    Get,
    Post,
    Put,
    Other(Vec<u8>),
}

/// How `:path` starts: the configured prefixes, or nothing special.
#[derive(Arbitrary, Debug, Clone)]
enum PathStart {
    Api,
    Q,
    Raw,
}

/// A query parameter name: the configured ones (in several spellings) or any bytes.
#[derive(Arbitrary, Debug, Clone)]
enum QueryName {
    User,
    UserEscaped,
    SpacePlus,
    SpaceEscaped,
    Other(Vec<u8>),
}

/// `:path` = start ++ rest ++ (`?` ++ name[=value] joined by `&`) ++ (`#` ++ fragment). Every part
/// is raw fuzz bytes, so `?`, `#`, `&`, `=`, `%`, `+`, NUL, CR/LF and invalid UTF-8 all occur.
#[derive(Arbitrary, Debug, Clone)]
struct Path {
    start: PathStart,
    rest: Vec<u8>,
    query: Option<Vec<(QueryName, Option<Vec<u8>>)>>,
    fragment: Option<Vec<u8>>,
}

impl Path {
    fn bytes(&self) -> Vec<u8> {
        let mut out = match self.start {
            PathStart::Api => b"/api/".to_vec(),
            PathStart::Q => b"/q".to_vec(),
            PathStart::Raw => Vec::new(),
        };
        out.extend_from_slice(&self.rest);
        if let Some(query) = &self.query {
            out.push(b'?');
            for (i, (name, value)) in query.iter().enumerate() {
                if i > 0 {
                    out.push(b'&');
                }
                out.extend_from_slice(match name {
                    QueryName::User => b"user",
                    QueryName::UserEscaped => b"%75ser",
                    QueryName::SpacePlus => b"a+b",
                    QueryName::SpaceEscaped => b"a%20b",
                    QueryName::Other(raw) => raw,
                });
                if let Some(v) = value {
                    out.push(b'=');
                    out.extend_from_slice(v);
                }
            }
        }
        if let Some(f) = &self.fragment {
            out.push(b'#');
            out.extend_from_slice(f);
        }
        out
    }
}

#[derive(Arbitrary, Debug, Clone)]
struct Input {
    path: Option<Path>,
    method: Option<Method>,
    authority: Option<Vec<u8>>,
    ip: Option<Vec<u8>>,
    /// Known names, so the fuzzer reaches the rules' sources; a name may repeat (then a header
    /// source is ambiguous).
    headers: Vec<(Name, Value)>,
    /// Any other headers, by arbitrary name.
    others: Vec<(String, Vec<u8>)>,
    /// The `metadata` attribute (a serialised Metadata message, or any bytes).
    metadata: Option<Vec<u8>>,
    /// Every other attribute.
    property: Option<Vec<u8>>,
}

struct Req(Input);

impl Req {
    fn owned_header(&self, name: &str) -> Option<Vec<u8>> {
        let r = &self.0;
        match name {
            ":path" => return r.path.as_ref().map(Path::bytes),
            ":method" => {
                return r.method.as_ref().map(|m| match m {
                    Method::Get => b"GET".to_vec(),
                    Method::Post => b"POST".to_vec(),
                    Method::Put => b"PUT".to_vec(),
                    Method::Other(v) => v.clone(),
                })
            }
            ":authority" => return r.authority.clone(),
            _ => {}
        }
        // Every line of the name joined with `,`, as Envoy's `request.headers` attribute joins them.
        let lines = self.lines(|n| n.eq_ignore_ascii_case(name.as_bytes()));
        (!lines.is_empty()).then(|| lines.join(&b','))
    }

    /// The known headers, then the others, whose name `wanted` accepts.
    fn lines(&self, wanted: impl Fn(&[u8]) -> bool) -> Vec<Vec<u8>> {
        let r = &self.0;
        let known = r
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().as_bytes(), v.bytes()));
        let others = r.others.iter().map(|(n, v)| (n.as_bytes(), v.clone()));
        known
            .chain(others)
            .filter(|(n, _)| wanted(n))
            .map(|(_, v)| v)
            .collect()
    }
}

impl RequestView for Req {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.owned_header(name).map(Cow::Owned)
    }
    fn header_lines(&self, name: &str) -> Lines<'_> {
        let mut lines = Lines::None;
        for line in self.lines(|n| is_header_name(n, name)) {
            lines.push(Cow::Owned(line));
        }
        lines
    }
    fn client_ip(&self) -> Option<Vec<u8>> {
        self.0.ip.clone()
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        if path == ["metadata"] {
            self.0.metadata.clone()
        } else {
            self.0.property.clone()
        }
    }
}

fn assert_key_shape(key: &str, prefix: &str, rule: &str) {
    let head = format!("{prefix}:{{{rule}:");
    let digest = key
        .strip_prefix(&head)
        .and_then(|rest| rest.strip_suffix('}'))
        .unwrap_or_else(|| panic!("key {key:?} is not {head}<digest>}}"));
    assert!(
        digest.len() == 32
            && digest
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "key {key:?}"
    );
}

/// The normalisation invariants for one path (without query).
fn check_normal_forms(p: &[u8]) {
    for r in Reading::ALL {
        let n = path::normalize(p, r);
        assert!(n.path.starts_with(b"/"), "{p:?} {r:?}: {:?}", n.path);
        let again = path::normalize(&n.path, r);
        assert_eq!(again.path, n.path, "{p:?} {r:?}: not a fixed point");
        if p.first() == Some(&b'/') {
            let mut dotted = b"/x/..".to_vec();
            dotted.extend_from_slice(p);
            assert_eq!(
                path::normalize(&dotted, r),
                n,
                "{p:?} {r:?}: /x/.. in front"
            );
            let mut doubled = b"/".to_vec();
            doubled.extend_from_slice(p);
            assert_eq!(path::normalize(&doubled, r), n, "{p:?} {r:?}: // in front");
        }
        if !p.contains(&b'%') {
            let escaped: Vec<u8> = p
                .iter()
                .flat_map(|&b| {
                    if b.is_ascii_alphabetic() {
                        format!("%{b:02x}").into_bytes()
                    } else {
                        vec![b]
                    }
                })
                .collect();
            assert_eq!(
                path::normalize(&escaped, r),
                n,
                "{p:?} {r:?}: escaped letters"
            );
        }
    }
}

thread_local! {
    static KEYS: std::cell::RefCell<KeyCache> = std::cell::RefCell::new(KeyCache::default());
}

fuzz_target!(|input: Input| {
    if let Some(p) = input.path.as_ref().map(Path::bytes) {
        check_normal_forms(path::path_only(&p));
    }
    let cfg = config();
    let prefix = cfg.key_prefix.as_str();
    let req = Req(input.clone());
    for (idx, rule) in cfg.rules.iter().enumerate() {
        // One cache across inputs, like a worker's across requests: a cached key must be exactly
        // the digest of these values.
        let applied = KEYS.with(|k| applies(prefix, (idx, rule), &req, &mut k.borrow_mut()));
        let key = applied.as_ref().map(|a| a.key.clone());
        let reads = key_values(&rule.key, &req);
        // A source that reads the path, in a rule whose path match ignores case: lower-cased.
        let folds = |source: &KeySource| {
            rule.matcher.path_ignore_case && tollgate_core::rule::reads_the_path(source).is_some()
        };
        let folded: Option<Vec<Vec<u8>>> = reads.as_ref().map(|r| {
            r.iter()
                .zip(&rule.key)
                .map(|(read, source)| match read {
                    Read::Value(v) if folds(source) => v.to_ascii_lowercase(),
                    Read::Value(v) => v.to_vec(),
                    _ => Vec::new(),
                })
                .collect()
        });
        let parts: Option<Vec<Part<'_>>> = reads.as_ref().zip(folded.as_ref()).map(|(r, f)| {
            r.iter()
                .zip(f)
                .filter_map(|(read, v)| {
                    read.part().map(|p| match p {
                        Part::Value(_) => Part::Value(v),
                        ambiguous => ambiguous,
                    })
                })
                .collect()
        });
        let want = if matches(&rule.matcher, &req) {
            parts
                .as_ref()
                .map(|p| bucket_key_of(prefix, &rule.name, &rule.key, p))
        } else {
            None
        };
        assert_eq!(key, want, "rule {}", rule.name);
        if let Some(k) = &key {
            assert_key_shape(k, prefix, &rule.name);
        }
        let Some(parts) = parts else { continue };
        assert_eq!(parts.len(), rule.key.len());
        // An ambiguous source: the rule's limits, never an override's.
        if parts.contains(&Part::Ambiguous) {
            if let Some(a) = &applied {
                assert!(a.ambiguous && a.limits == rule.limits && !a.unlimited);
            }
            continue;
        }
        let values: Vec<Vec<u8>> = parts
            .iter()
            .map(|p| match p {
                Part::Value(v) => v.to_vec(),
                Part::Ambiguous => unreachable!("no ambiguous part here"),
            })
            .collect();
        // The limits are the override's for these values, else the rule's; the key is the same.
        // (No rule here keys on `path`, whose overrides also need every reading to agree.)
        if let Some(a) = &applied {
            assert!(!a.ambiguous);
            match rule.overrides.get(&values) {
                None => assert!(a.limits == rule.limits && !a.unlimited),
                Some(Override::Unlimited) => assert!(a.unlimited),
                Some(Override::Limits(l)) => assert!(a.limits == *l && !a.unlimited),
            }
        }
        assert_key_shape(
            &bucket_key(prefix, &rule.name, &rule.key, &values),
            prefix,
            &rule.name,
        );
        // The path as the rule keys it: its loosest decoded form, lower-cased if the rule ignores
        // case, and the same for the path lower-cased as sent.
        let path_key = |source: &KeySource| {
            let full = req.header(":path")?;
            let v = path::key_value(&full);
            Some(if folds(source) {
                v.to_ascii_lowercase()
            } else {
                v
            })
        };
        if rule.matcher.path_ignore_case && rule.key.iter().any(folds) {
            let mut lower = input.clone();
            if let Some(p) = lower.path.as_mut() {
                p.rest.make_ascii_lowercase();
            }
            let again =
                KEYS.with(|k| applies(prefix, (idx, rule), &Req(lower), &mut k.borrow_mut()));
            assert_eq!(
                again.map(|a| a.key),
                key,
                "rule {}: the path lower-cased",
                rule.name
            );
        }
        for (source, v) in rule.key.iter().zip(&values) {
            match source {
                KeySource::Header(h) => assert_eq!(
                    reading::header_key(req.header_lines(h)),
                    Read::Value(Cow::Borrowed(v.as_slice()))
                ),
                KeySource::Literal(t) => assert_eq!(v, t.as_bytes()),
                KeySource::ClientIp {
                    v4_prefix,
                    v6_prefix,
                } => assert_eq!(
                    Some(v),
                    input
                        .ip
                        .as_ref()
                        .map(|ip| tollgate_core::rule::ip::key_value(ip, *v4_prefix, *v6_prefix))
                        .as_ref()
                ),
                KeySource::Method => {
                    assert_eq!(
                        Some(v.as_slice()),
                        req.header(":method")
                            .as_deref()
                            .map(tollgate_core::rule::as_routed)
                            .as_deref()
                    )
                }
                KeySource::Path => assert_eq!(Some(v), path_key(source).as_ref()),
                KeySource::Authority => assert_eq!(
                    Some(v),
                    input
                        .authority
                        .as_ref()
                        .map(|a| tollgate_core::rule::host::of_authority(a))
                        .as_ref()
                ),
                KeySource::Query(_) | KeySource::Cookie(_) | KeySource::Metadata { .. } => {}
                KeySource::Property { .. }
                    if tollgate_core::rule::reads_the_path(source).is_some() =>
                {
                    assert_eq!(Some(v), path_key(source).as_ref())
                }
                KeySource::Property { path, .. } => assert_eq!(
                    Some(v),
                    input
                        .property
                        .clone()
                        .map(|raw| tollgate_core::rule::value::attribute_text(path, raw))
                        .as_ref()
                ),
            }
        }
        // Another tuple of values is another bucket: change the last byte split between the first
        // two values, or append a byte to the first.
        let mut other = values.clone();
        match other.as_mut_slice() {
            [a, b, ..] if !a.is_empty() => {
                let last = a.pop().unwrap_or_default();
                b.insert(0, last);
            }
            [a, ..] => a.push(0),
            [] => continue,
        }
        assert_ne!(
            bucket_key(prefix, &rule.name, &rule.key, &values),
            bucket_key(prefix, &rule.name, &rule.key, &other),
            "{values:?} and {other:?} share a bucket"
        );
    }
    // One user's id never lands in another user's bucket (an id sent once: twice, it is the
    // rule's ambiguous bucket whatever the values).
    let per_user = &cfg.rules[0];
    let fresh = KeyCache::default;
    let applied = applies(prefix, (0, per_user), &req, &mut fresh());
    if let Some(k) = applied.filter(|a| !a.ambiguous).map(|a| a.key) {
        let mut changed = input.clone();
        let uid = match changed.headers.iter_mut().find(|(n, _)| *n == Name::UserId) {
            Some((_, v)) => v.bytes_mut(),
            None => changed
                .others
                .iter_mut()
                .find(|(n, _)| is_header_name(n.as_bytes(), "x-user-id"))
                .map(|(_, v)| v)
                .expect("per-user applied without x-user-id"),
        };
        uid.push(b'!');
        let k2 = applies(prefix, (0, per_user), &Req(changed), &mut fresh())
            .expect("per-user still applies")
            .key;
        assert_ne!(k, k2);
    }
});
