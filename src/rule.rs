//! Rule matching and bucket-key extraction over a `RequestView` (no host calls here).
//!
//! Invariant: the bucket key is `<key_prefix>:{<rule>:<digest>}` where the digest is a SHA-256 of the
//! rule's key sources (their canonical spelling) and key values, each length-prefixed, so no user
//! text reaches Redis or a URL, two different value tuples never share a key, and changing a rule's
//! key sources starts fresh buckets. A request cannot escape a rule by how it spells its path
//! (see `path`) or its address (see `ip`).

pub mod ip;
pub mod path;

use sha2::{Digest, Sha256};

use crate::config::{HeaderValueMatch, KeySource, Match, Rule};

/// What rule matching needs from a request. Names are lower-case; pseudo-headers `:path`, `:method`,
/// `:authority` are asked for through `header` too.
pub trait RequestView {
    /// The value of request header `name`: when the request has several lines of it, all of them
    /// joined with `,` in the order received (what Envoy's `request.headers` attribute gives, and
    /// how Envoy itself folds the headers it combines). None when the request has no such line; an
    /// empty line is an empty value.
    fn header(&self, name: &str) -> Option<Vec<u8>>;
    /// downstream peer IP without port (Envoy's source.address)
    fn client_ip(&self) -> Option<Vec<u8>>;
}

/// Bytes of the digest that go into the key (hex-encoded: twice as many characters).
const DIGEST_BYTES: usize = 16;

/// The query string of `:path`: after the first `?` (if it comes before any `#`), up to `#`.
fn query_of(full: &[u8]) -> Option<&[u8]> {
    let start = full.iter().position(|&b| b == b'?' || b == b'#')?;
    if full.get(start) != Some(&b'?') {
        return None;
    }
    let rest = full.get(start + 1..)?;
    let end = rest.iter().position(|&b| b == b'#').unwrap_or(rest.len());
    rest.get(..end)
}

/// Form-decoding of one query component: `+` is a space, `%XX` is a byte, an invalid escape is
/// kept literally.
pub(crate) fn percent_decode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while let Some(&b) = s.get(i) {
        match b {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let hi = s.get(i + 1).copied().and_then(path::hex_value);
                let lo = s.get(i + 2).copied().and_then(path::hex_value);
                if let (Some(hi), Some(lo)) = (hi, lo) {
                    out.push(hi << 4 | lo);
                    i += 3;
                } else {
                    out.push(b'%');
                    i += 1;
                }
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// The decoded value of the first query parameter whose decoded name is `name`; `?a` gives `a` an
/// empty value.
fn query_param(full_path: &[u8], name: &str) -> Option<Vec<u8>> {
    let query = query_of(full_path)?;
    query
        .split(|&b| b == b'&')
        .filter(|pair| !pair.is_empty())
        .find_map(|pair| {
            let (raw_name, raw_value) = match pair.iter().position(|&b| b == b'=') {
                Some(eq) => (pair.get(..eq)?, pair.get(eq + 1..)?),
                None => (pair, &[][..]),
            };
            (percent_decode(raw_name) == name.as_bytes()).then(|| percent_decode(raw_value))
        })
}

/// Whether the request satisfies every condition of `m` (an empty `Match` matches everything).
pub fn matches(m: &Match, req: &dyn RequestView) -> bool {
    if let Some(prefix) = &m.path_prefix {
        match req.header(":path") {
            Some(full) if path::prefix_matches(&full, prefix.as_bytes(), m.path_ignore_case) => {}
            _ => return false,
        }
    }
    if !m.methods.is_empty() {
        match req.header(":method") {
            Some(method) if m.methods.iter().any(|x| x.as_bytes() == method.as_slice()) => {}
            _ => return false,
        }
    }
    m.headers
        .iter()
        .all(|h| match (&h.value, req.header(&h.name)) {
            (_, None) => false,
            (HeaderValueMatch::Present, Some(_)) => true,
            (HeaderValueMatch::Exact(want), Some(got)) => want.as_bytes() == got.as_slice(),
        })
}

fn key_value(source: &KeySource, req: &dyn RequestView) -> Option<Vec<u8>> {
    match source {
        KeySource::Header(name) => req.header(name),
        KeySource::Query(name) => query_param(&req.header(":path")?, name),
        KeySource::ClientIp {
            v4_prefix,
            v6_prefix,
        } => Some(ip::key_value(&req.client_ip()?, *v4_prefix, *v6_prefix)),
        KeySource::Path => req.header(":path").map(|p| path::key_value(&p)),
        KeySource::Method => req.header(":method"),
        KeySource::Authority => req.header(":authority").map(|mut a| {
            a.make_ascii_lowercase();
            a
        }),
        KeySource::Literal(text) => Some(text.as_bytes().to_vec()),
    }
}

/// The rule's key values in order, or None if any source is missing (then the rule does not apply).
pub fn key_values(sources: &[KeySource], req: &dyn RequestView) -> Option<Vec<Vec<u8>>> {
    sources.iter().map(|s| key_value(s, req)).collect()
}

/// `<prefix>:{<rule>:<digest>}`, digest = lowercase hex of the first 16 bytes of SHA-256 over, for
/// each key source in order, (u32 big-endian length ++ the source's canonical spelling ++ u32
/// big-endian length ++ its value). `values` has one value per source.
///
/// A value longer than `u32::MAX` bytes (impossible for a request header) has its length saturated.
pub fn bucket_key(prefix: &str, rule: &str, sources: &[KeySource], values: &[Vec<u8>]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hasher = Sha256::new();
    let mut field = |bytes: &[u8]| {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        hasher.update(len.to_be_bytes());
        hasher.update(bytes);
    };
    for (source, value) in sources.iter().zip(values) {
        field(source.to_string().as_bytes());
        field(value);
    }
    let digest = hasher.finalize();
    let mut hex = String::with_capacity(DIGEST_BYTES * 2);
    for &b in digest.iter().take(DIGEST_BYTES) {
        for nibble in [b >> 4, b & 0x0f] {
            if let Some(&c) = HEX.get(usize::from(nibble)) {
                hex.push(char::from(c));
            }
        }
    }
    format!("{prefix}:{{{rule}:{hex}}}")
}

/// The bucket key if the rule's match holds and all key sources are present.
pub fn applies(prefix: &str, rule: &Rule, req: &dyn RequestView) -> Option<String> {
    if !matches(&rule.matcher, req) {
        return None;
    }
    let values = key_values(&rule.key, req)?;
    Some(bucket_key(prefix, &rule.name, &rule.key, &values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::Limits;
    use crate::config::{HeaderMatch, Mode};
    use std::collections::HashMap;

    #[derive(Default)]
    struct Req {
        headers: HashMap<String, Vec<u8>>,
        ip: Option<Vec<u8>>,
    }

    impl Req {
        fn new(method: &str, path: &str) -> Self {
            Req::default().with(":method", method).with(":path", path)
        }
        fn with(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
            self.headers
                .insert(name.to_owned(), value.as_ref().to_vec());
            self
        }
        fn ip(mut self, ip: &str) -> Self {
            self.ip = Some(ip.as_bytes().to_vec());
            self
        }
    }

    impl RequestView for Req {
        fn header(&self, name: &str) -> Option<Vec<u8>> {
            self.headers.get(name).cloned()
        }
        fn client_ip(&self) -> Option<Vec<u8>> {
            self.ip.clone()
        }
    }

    fn one(source: KeySource, req: &Req) -> Option<Vec<u8>> {
        key_values(&[source], req).map(|mut v| v.remove(0))
    }

    fn query(name: &str, path: &str) -> Option<Vec<u8>> {
        one(KeySource::Query(name.into()), &Req::new("GET", path))
    }

    fn rule(matcher: Match, key: Vec<KeySource>) -> Rule {
        Rule {
            name: "per-user".into(),
            matcher,
            key,
            limits: Limits {
                burst: 10,
                rate: 10,
                period_ms: 1000,
            },
            cost: 1,
            cost_header: None,
            mode: Mode::Exact,
            max_wait_ms: 0,
            lease_max: 10,
            lease_horizon_ms: 200,
            shadow: false,
            fallback: None,
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

    // ---- matching ----

    #[test]
    fn empty_match_matches_everything() {
        assert!(matches(&Match::default(), &Req::default()));
    }

    #[test]
    fn path_prefix() {
        let m = Match {
            path_prefix: Some("/api/".into()),
            ..Match::default()
        };
        assert!(matches(&m, &Req::new("GET", "/api/users")));
        assert!(matches(&m, &Req::new("GET", "/api/")));
        assert!(!matches(&m, &Req::new("GET", "/api")));
        assert!(!matches(&m, &Req::new("GET", "/other/api/")));
        // Only the path counts, not the query or fragment.
        assert!(!matches(&m, &Req::new("GET", "/x?next=/api/")));
        assert!(!matches(&m, &Req::new("GET", "/x#/api/")));
        assert!(matches(&m, &Req::new("GET", "/api/?q=1")));
        // Byte prefix: case-sensitive.
        assert!(!matches(&m, &Req::new("GET", "/API/users")));
        // No :path, no match.
        assert!(!matches(&m, &Req::default()));
    }

    #[test]
    fn methods() {
        let m = Match {
            methods: vec!["GET".into(), "POST".into()],
            ..Match::default()
        };
        assert!(matches(&m, &Req::new("GET", "/")));
        assert!(matches(&m, &Req::new("POST", "/")));
        assert!(!matches(&m, &Req::new("PUT", "/")));
        assert!(!matches(&m, &Req::new("get", "/")));
        assert!(!matches(&m, &Req::default().with(":path", "/")));
        // Empty list = any method.
        assert!(matches(&Match::default(), &Req::new("DELETE", "/")));
    }

    #[test]
    fn header_exact() {
        let m = Match {
            headers: vec![HeaderMatch {
                name: "x-tier".into(),
                value: HeaderValueMatch::Exact("free".into()),
            }],
            ..Match::default()
        };
        assert!(matches(&m, &Req::new("GET", "/").with("x-tier", "free")));
        assert!(!matches(&m, &Req::new("GET", "/").with("x-tier", "Free")));
        assert!(!matches(&m, &Req::new("GET", "/").with("x-tier", "free ")));
        assert!(!matches(&m, &Req::new("GET", "/").with("x-tier", "")));
        assert!(!matches(&m, &Req::new("GET", "/")));
    }

    #[test]
    fn header_present() {
        let m = Match {
            headers: vec![HeaderMatch {
                name: "authorization".into(),
                value: HeaderValueMatch::Present,
            }],
            ..Match::default()
        };
        assert!(matches(
            &m,
            &Req::new("GET", "/").with("authorization", "x")
        ));
        assert!(matches(&m, &Req::new("GET", "/").with("authorization", "")));
        assert!(!matches(&m, &Req::new("GET", "/")));
    }

    #[test]
    fn all_conditions_must_hold() {
        let m = Match {
            path_prefix: Some("/api/".into()),
            path_ignore_case: false,
            methods: vec!["GET".into()],
            headers: vec![
                HeaderMatch {
                    name: "x-a".into(),
                    value: HeaderValueMatch::Present,
                },
                HeaderMatch {
                    name: "x-b".into(),
                    value: HeaderValueMatch::Exact("1".into()),
                },
            ],
        };
        let ok = Req::new("GET", "/api/x").with("x-a", "").with("x-b", "1");
        assert!(matches(&m, &ok));
        assert!(!matches(&m, &Req::new("GET", "/api/x").with("x-a", "")));
        assert!(!matches(
            &m,
            &Req::new("POST", "/api/x").with("x-a", "").with("x-b", "1")
        ));
        assert!(!matches(
            &m,
            &Req::new("GET", "/x").with("x-a", "").with("x-b", "1")
        ));
    }

    // ---- key sources ----

    #[test]
    fn each_key_source() {
        let req = Req::new("PATCH", "/a/b?x=1#frag")
            .with(":authority", "Api.Example.COM:8443")
            .with("x-user-id", "Alice")
            .ip("10.0.0.7");
        assert_eq!(
            one(KeySource::Header("x-user-id".into()), &req),
            Some(b"Alice".to_vec())
        );
        assert_eq!(one(KeySource::Query("x".into()), &req), Some(b"1".to_vec()));
        assert_eq!(one(KeySource::CLIENT_IP, &req), Some(b"10.0.0.7".to_vec()));
        assert_eq!(one(KeySource::Path, &req), Some(b"/a/b".to_vec()));
        assert_eq!(one(KeySource::Method, &req), Some(b"PATCH".to_vec()));
        assert_eq!(
            one(KeySource::Authority, &req),
            Some(b"api.example.com:8443".to_vec())
        );
        assert_eq!(
            one(KeySource::Literal("all".into()), &req),
            Some(b"all".to_vec())
        );
        assert_eq!(
            key_values(
                &[KeySource::Method, KeySource::Header("x-user-id".into())],
                &req
            ),
            Some(vec![b"PATCH".to_vec(), b"Alice".to_vec()])
        );
        assert_eq!(key_values(&[], &req), Some(vec![]));
    }

    #[test]
    fn missing_source_gives_none() {
        let req = Req::new("GET", "/a?x=1");
        assert_eq!(one(KeySource::Header("x-user-id".into()), &req), None);
        assert_eq!(one(KeySource::Query("y".into()), &req), None);
        assert_eq!(one(KeySource::CLIENT_IP, &req), None);
        assert_eq!(one(KeySource::Authority, &req), None);
        assert_eq!(one(KeySource::Path, &Req::default()), None);
        assert_eq!(one(KeySource::Method, &Req::default()), None);
        assert_eq!(one(KeySource::Query("x".into()), &Req::default()), None);
        // One missing source among present ones: the whole tuple is missing.
        assert_eq!(
            key_values(
                &[KeySource::Path, KeySource::Header("x-user-id".into())],
                &req
            ),
            None
        );
    }

    #[test]
    fn empty_header_value_is_present() {
        let req = Req::new("GET", "/").with("x-user-id", "");
        assert_eq!(
            one(KeySource::Header("x-user-id".into()), &req),
            Some(vec![])
        );
    }

    // ---- query decoding ----

    #[test]
    fn query_percent_decoding() {
        assert_eq!(query("user", "/?user=%61lice"), Some(b"alice".to_vec()));
        assert_eq!(query("user", "/?%75ser=alice"), Some(b"alice".to_vec()));
        assert_eq!(query("p", "/?p=a%2Fb"), Some(b"a/b".to_vec()));
        assert_eq!(query("p", "/?p=a%2fb"), Some(b"a/b".to_vec()));
        assert_eq!(query("p", "/?p=a+b"), Some(b"a b".to_vec()));
        assert_eq!(query("p", "/?p=a%2Bb"), Some(b"a+b".to_vec()));
        assert_eq!(query("a b", "/?a+b=1"), Some(b"1".to_vec()));
        assert_eq!(query("p", "/?p=%00%FF"), Some(vec![0, 0xff]));
        // `%61` and `a` are the same user.
        let k = |p: &str| {
            let r = rule(Match::default(), vec![KeySource::Query("u".into())]);
            applies("tg", &r, &Req::new("GET", p))
        };
        assert_eq!(k("/?u=a"), k("/?u=%61"));
        assert_eq!(k("/?u=a%20b"), k("/?u=a+b"));
        assert_ne!(k("/?u=a"), k("/?u=b"));
    }

    #[test]
    fn query_bad_escapes_kept_literally() {
        assert_eq!(query("p", "/?p=%"), Some(b"%".to_vec()));
        assert_eq!(query("p", "/?p=%4"), Some(b"%4".to_vec()));
        assert_eq!(query("p", "/?p=%zz"), Some(b"%zz".to_vec()));
        assert_eq!(query("p", "/?p=%4g1"), Some(b"%4g1".to_vec()));
        assert_eq!(query("p", "/?p=100%"), Some(b"100%".to_vec()));
        assert_eq!(query("p", "/?p=%%41"), Some(b"%A".to_vec()));
    }

    #[test]
    fn query_structure() {
        // First occurrence wins.
        assert_eq!(query("a", "/?a=1&a=2"), Some(b"1".to_vec()));
        assert_eq!(query("a", "/?a=1&%61=2"), Some(b"1".to_vec()));
        assert_eq!(query("a", "/?%61=2&a=1"), Some(b"2".to_vec()));
        // A name alone has an empty value; so does `a=`.
        assert_eq!(query("a", "/?a"), Some(vec![]));
        assert_eq!(query("a", "/?a="), Some(vec![]));
        assert_eq!(query("a", "/?b=1&a&c=2"), Some(vec![]));
        // Only the first '=' splits.
        assert_eq!(query("a", "/?a=1=2"), Some(b"1=2".to_vec()));
        // Empty pairs are skipped.
        assert_eq!(query("a", "/?&&a=1&"), Some(b"1".to_vec()));
        // The fragment is not part of the query.
        assert_eq!(query("a", "/?a=1#x"), Some(b"1".to_vec()));
        assert_eq!(query("a", "/?b=1#&a=2"), None);
        assert_eq!(query("a", "/#?a=1"), None);
        // A second '?' is part of the query.
        assert_eq!(query("a", "/?b=?&a=?1"), Some(b"?1".to_vec()));
        // Names must match exactly after decoding.
        assert_eq!(query("a", "/?A=1"), None);
        assert_eq!(query("a", "/?ab=1"), None);
        assert_eq!(query("a", "/a"), None);
        assert_eq!(query("a", "/?"), None);
    }

    // ---- keys ----

    fn hdr(name: &str) -> KeySource {
        KeySource::Header(name.into())
    }

    #[test]
    fn known_digest_vectors() {
        // Computed independently (Python hashlib): sha256(be32(16) "header:x-user-id" be32(5)
        // "alice").hexdigest()[:32].
        assert_eq!(
            bucket_key(
                "tollgate",
                "per-user",
                &[hdr("x-user-id")],
                &[b"alice".to_vec()]
            ),
            "tollgate:{per-user:1ff5268a9b87e2b51262db40cbb6e203}"
        );
        // No sources: SHA-256 of the empty string.
        assert_eq!(
            bucket_key("tollgate", "all", &[], &[]),
            "tollgate:{all:e3b0c44298fc1c149afbf4c8996fb924}"
        );
        assert_eq!(
            bucket_key(
                "tg",
                "r",
                &[KeySource::Query("u".into()), KeySource::Method],
                &[b"alice".to_vec(), b"GET".to_vec()]
            ),
            "tg:{r:9b0e09c30ea49b9245d57227f92d75bc}"
        );
    }

    #[test]
    fn distinct_tuples_give_distinct_keys() {
        let ab = [hdr("a"), hdr("b")];
        let ab_c = bucket_key("tg", "r", &ab, &[b"ab".to_vec(), b"c".to_vec()]);
        let a_bc = bucket_key("tg", "r", &ab, &[b"a".to_vec(), b"bc".to_vec()]);
        let abc = bucket_key("tg", "r", &[hdr("a")], &[b"abc".to_vec()]);
        assert_eq!(ab_c, "tg:{r:69963a5f864f080ac1f77e30ea4c8de3}");
        assert_eq!(a_bc, "tg:{r:d3e0f5e3d3c0ea94d01719c28cc1b4dc}");
        assert_ne!(ab_c, a_bc);
        assert_ne!(ab_c, abc);
        assert_ne!(a_bc, abc);
        // An empty value is a value.
        assert_ne!(
            bucket_key("tg", "r", &[], &[]),
            bucket_key("tg", "r", &[hdr("a")], &[Vec::new()])
        );
        // The rule name separates buckets too.
        assert_ne!(
            bucket_key("tg", "r1", &[hdr("a")], &[b"a".to_vec()]),
            bucket_key("tg", "r2", &[hdr("a")], &[b"a".to_vec()])
        );
    }

    #[test]
    fn changing_a_source_starts_fresh_buckets() {
        let v = [b"alice".to_vec()];
        let header = bucket_key("tg", "r", &[hdr("x-user-id")], &v);
        let query = bucket_key("tg", "r", &[KeySource::Query("x-user-id".into())], &v);
        assert_eq!(query, "tg:{r:edb0ebb3ea7077b9aabd4f21cb174575}");
        assert_ne!(header, query);
        assert_ne!(header, bucket_key("tg", "r", &[hdr("x-user")], &v));
        assert_ne!(
            header,
            bucket_key("tg", "r", &[KeySource::Literal("x".into())], &v)
        );
        // Another IPv6 prefix is another source (and its values differ anyway).
        let v6 = [b"::/64".to_vec()];
        assert_ne!(
            bucket_key("tg", "r", &[KeySource::CLIENT_IP], &v6),
            bucket_key(
                "tg",
                "r",
                &[KeySource::ClientIp {
                    v4_prefix: 32,
                    v6_prefix: 56
                }],
                &v6
            )
        );
        // Spelling a default explicitly is the same source.
        assert_eq!(
            KeySource::ClientIp {
                v4_prefix: 32,
                v6_prefix: 64
            }
            .to_string(),
            "client_ip"
        );
    }

    #[test]
    fn hostile_values_never_reach_the_key() {
        let r = rule(
            Match::default(),
            vec![KeySource::Header("x-user-id".into())],
        );
        let hostile: Vec<Vec<u8>> = vec![
            b"/".to_vec(),
            b"a/b/../../FLUSHALL".to_vec(),
            b"+".to_vec(),
            b"?x=1".to_vec(),
            b"%".to_vec(),
            b"%2F".to_vec(),
            b"user.json".to_vec(),
            b"..".to_vec(),
            b"a\0b".to_vec(),
            b"a\r\nSET x 1\r\n".to_vec(),
            b"{tag}".to_vec(),
            b"}:{".to_vec(),
            vec![0xff, 0xfe, 0x80],
            vec![b'x'; 64 * 1024],
            Vec::new(),
        ];
        let mut keys = Vec::new();
        for v in &hostile {
            let req = Req::new("GET", "/").with("x-user-id", v);
            let key = applies("tollgate", &r, &req).unwrap();
            assert_safe_key(&key, "tollgate", "per-user");
            keys.push(key);
        }
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "hostile values collided");

        // Through a query parameter and the path too.
        let rq = rule(
            Match::default(),
            vec![KeySource::Query("u".into()), KeySource::Path],
        );
        let req = Req::new("GET", "/../x.json?u=%00%0D%0A%2F..%3F%25");
        assert_safe_key(
            &applies("tollgate", &rq, &req).unwrap(),
            "tollgate",
            "per-user",
        );
    }

    #[test]
    fn applies_needs_match_and_all_sources() {
        let r = rule(
            Match {
                path_prefix: Some("/api/".into()),
                ..Match::default()
            },
            vec![KeySource::Header("x-user-id".into()), KeySource::CLIENT_IP],
        );
        let full = Req::new("GET", "/api/x")
            .with("x-user-id", "alice")
            .ip("10.0.0.1");
        assert_eq!(
            applies("tg", &r, &full),
            Some(bucket_key(
                "tg",
                "per-user",
                &r.key,
                &[b"alice".to_vec(), b"10.0.0.1".to_vec()]
            ))
        );
        // Match fails.
        let other_path = Req::new("GET", "/x")
            .with("x-user-id", "alice")
            .ip("10.0.0.1");
        assert_eq!(applies("tg", &r, &other_path), None);
        // A source is missing.
        let no_ip = Req::new("GET", "/api/x").with("x-user-id", "alice");
        assert_eq!(applies("tg", &r, &no_ip), None);
        // Empty key: one bucket for the rule.
        let global = rule(Match::default(), vec![]);
        assert_eq!(
            applies("tg", &global, &Req::default()),
            Some("tg:{per-user:e3b0c44298fc1c149afbf4c8996fb924}".to_owned())
        );
    }

    #[test]
    fn path_rules_see_through_spellings() {
        let r = rule(
            Match {
                path_prefix: Some("/api/".into()),
                ..Match::default()
            },
            vec![KeySource::Path],
        );
        let want = applies("tg", &r, &Req::new("GET", "/api/x"));
        assert!(want.is_some());
        // The hardening issue's spellings: all match, all share /api/x's bucket.
        for p in [
            "//api/x",
            "/./api/x",
            "/%61pi/x",
            "/x/../api/x",
            "/api%2Fx",
            "/api;a=1/x",
        ] {
            assert_eq!(applies("tg", &r, &Req::new("GET", p)), want, "{p}");
        }
        // Irregular paths match every path rule (keyed by their clamped form).
        assert!(applies("tg", &r, &Req::new("GET", "/../other")).is_some());
        assert!(applies("tg", &r, &Req::new("GET", "/other/%zz")).is_some());
        assert_eq!(applies("tg", &r, &Req::new("GET", "/other")), None);
        // Case-sensitive unless asked.
        assert_eq!(applies("tg", &r, &Req::new("GET", "/API/x")), None);
        let ci = rule(
            Match {
                path_prefix: Some("/api/".into()),
                path_ignore_case: true,
                ..Match::default()
            },
            vec![],
        );
        assert!(applies("tg", &ci, &Req::new("GET", "/API/x")).is_some());
        assert!(applies("tg", &ci, &Req::new("GET", "//Api/x")).is_some());
        assert_eq!(applies("tg", &ci, &Req::new("GET", "/APIX")), None);
    }

    #[test]
    fn client_ip_keys_by_address_or_network() {
        let v6_56 = KeySource::ClientIp {
            v4_prefix: 32,
            v6_prefix: 56,
        };
        let ip = |a: &str, s: &KeySource| one(s.clone(), &Req::default().ip(a));
        let d = &KeySource::CLIENT_IP;
        assert_eq!(ip("10.0.0.7", d), Some(b"10.0.0.7".to_vec()));
        assert_eq!(ip("::ffff:10.0.0.7", d), Some(b"10.0.0.7".to_vec()));
        assert_eq!(
            ip("2001:db8:0:1::7", d),
            Some(b"2001:db8:0:1::/64".to_vec())
        );
        assert_eq!(
            ip("2001:db8:0:1::7", &v6_56),
            Some(b"2001:db8::/56".to_vec())
        );
        assert_eq!(ip("::1", d), Some(b"::/64".to_vec()));
        // Two addresses of one /64 share a bucket.
        let r = rule(Match::default(), vec![KeySource::CLIENT_IP]);
        assert_eq!(
            applies("tg", &r, &Req::default().ip("2001:db8:0:1::1")),
            applies("tg", &r, &Req::default().ip("2001:db8:0:1:ffff::2"))
        );
        assert_ne!(
            applies("tg", &r, &Req::default().ip("2001:db8:0:1::1")),
            applies("tg", &r, &Req::default().ip("2001:db8:0:2::1"))
        );
    }

    #[test]
    fn authority_is_case_insensitive() {
        let r = rule(Match::default(), vec![KeySource::Authority]);
        let a = applies(
            "tg",
            &r,
            &Req::default().with(":authority", "API.example.com"),
        );
        let b = applies(
            "tg",
            &r,
            &Req::default().with(":authority", "api.EXAMPLE.com"),
        );
        assert!(a.is_some());
        assert_eq!(a, b);
    }
}
