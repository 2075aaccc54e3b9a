//! Config parsing: `Config::try_from(bytes)` never panics, on any bytes.
//!
//! A `Config` that parses must hold the invariants config/ promises (limits in range, names safe for
//! a Redis key); an error must be one line, in the reference's words (never serde's). Both artifacts
//! read the same bytes: they may differ only on the other artifact's backend fields. Every parsed
//! rule is also run against one fixed request, so rules the fuzzer invents reach rule.rs too.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use tollgate_core::bucket::{Limits, MAX_FULL_UNITS};
use tollgate_core::config::{
    Artifact, Config, ConfigError, KeySource, MAX_KEY_PREFIX_LEN, MAX_KEY_SOURCES, MAX_PERIOD_MS,
    MAX_RULES, MAX_RULE_NAME_LEN, MAX_TOKENS,
};
use tollgate_core::rule::{applies, KeyCache, RequestView};

struct FixedRequest;

impl RequestView for FixedRequest {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let v: &'static [u8] = match name {
            ":path" => b"/api/v1/items?user=alice&a+b=%2F..%00#frag",
            ":method" => b"GET",
            ":authority" => b"Api.Example.COM:8443",
            "x-user-id" => b"alice",
            "x-tier" => b"free",
            "authorization" => b"Basic abc",
            _ => return None,
        };
        Some(Cow::Borrowed(v))
    }
    fn client_ip(&self) -> Option<Vec<u8>> {
        Some(b"10.0.0.7".to_vec())
    }
}

fn check_limits(l: &Limits, what: &str) {
    assert!((1..=MAX_TOKENS).contains(&l.rate), "{what}: rate {l:?}");
    assert!((1..=MAX_TOKENS).contains(&l.burst), "{what}: burst {l:?}");
    assert!(
        (1..=MAX_PERIOD_MS).contains(&l.period_ms),
        "{what}: period {l:?}"
    );
    assert!(
        l.burst
            .checked_mul(l.period_ms)
            .is_some_and(|p| p <= MAX_FULL_UNITS),
        "{what}: burst x period {l:?}"
    );
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn check_valid(c: &Config) {
    let p = &c.key_prefix;
    assert!(
        !p.is_empty() && p.len() <= MAX_KEY_PREFIX_LEN,
        "key_prefix {p:?}"
    );
    assert!(
        p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b)),
        "key_prefix {p:?}"
    );
    assert!(
        (400..=599).contains(&c.deny.status),
        "deny.status {}",
        c.deny.status
    );
    assert!(!c.rules.is_empty() && c.rules.len() <= MAX_RULES);
    for (i, r) in c.rules.iter().enumerate() {
        let n = &r.name;
        assert!(!n.is_empty() && n.len() <= MAX_RULE_NAME_LEN, "name {n:?}");
        assert!(
            n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "name {n:?}"
        );
        assert!(
            c.rules.iter().skip(i + 1).all(|o| o.name != *n),
            "duplicate name {n:?}"
        );
        check_limits(&r.limits, n);
        assert!(r.limits.is_valid(), "{n}: limits the script refuses");
        if let Some(f) = &r.fallback {
            check_limits(f, n);
            assert!(r.cost <= f.burst, "{n}: fallback burst below cost");
        }
        assert!(
            r.cost >= 1 && r.cost <= r.limits.burst,
            "{n}: cost {}",
            r.cost
        );
        assert!(
            r.lease_max >= 1 && r.lease_max <= r.limits.burst,
            "{n}: lease_max"
        );
        assert!(
            r.key.len() <= MAX_KEY_SOURCES,
            "{n}: {} key sources",
            r.key.len()
        );
        for k in &r.key {
            match k {
                KeySource::Header(h) => {
                    assert!(
                        is_token(h) && *h == h.to_ascii_lowercase(),
                        "{n}: header {h:?}"
                    )
                }
                KeySource::Query(q) => assert!(!q.is_empty(), "{n}: empty query name"),
                KeySource::Literal(t) => assert!(!t.is_empty(), "{n}: empty literal"),
                KeySource::ClientIp {
                    v4_prefix,
                    v6_prefix,
                } => assert!(
                    (8..=32).contains(v4_prefix) && (8..=128).contains(v6_prefix),
                    "{n}: client_ip prefixes"
                ),
                KeySource::Cookie(c) => assert!(is_token(c), "{n}: cookie {c:?}"),
                KeySource::Property { path, .. } => {
                    assert!(
                        !path.is_empty() && path.iter().all(|p| !p.is_empty()),
                        "{n}: property"
                    )
                }
                KeySource::Metadata { namespace, fields } => assert!(
                    !namespace.is_empty()
                        && !fields.is_empty()
                        && fields.iter().all(|f| !f.is_empty()),
                    "{n}: metadata"
                ),
                KeySource::Path | KeySource::Method | KeySource::Authority => {}
            }
        }
        if let Some(h) = &r.cost_header {
            assert!(
                is_token(h) && *h == h.to_ascii_lowercase(),
                "{n}: cost_header {h:?}"
            );
        }
        if let Some(pp) = &r.matcher.path_prefix {
            assert!(
                pp.starts_with('/') && !pp.contains(['?', '#']),
                "{n}: path_prefix {pp:?}"
            );
            let normal = tollgate_core::rule::path::normalize(
                pp.as_bytes(),
                tollgate_core::rule::path::Reading::STRICT,
            );
            assert!(
                !normal.irregular && normal.path == pp.as_bytes(),
                "{n}: path_prefix {pp:?} is not in normal form"
            );
        }
        for m in &r.matcher.methods {
            assert!(
                is_token(m) && *m == m.to_ascii_uppercase(),
                "{n}: method {m:?}"
            );
        }
        for h in &r.matcher.headers {
            assert!(is_token(&h.name) && h.name == h.name.to_ascii_lowercase());
        }
        for host in &r.matcher.hosts {
            assert!(
                !host.is_empty() && *host == host.to_ascii_lowercase() && !host.ends_with('.'),
                "{n}: host {host:?}"
            );
        }
        for (values, o) in &r.overrides {
            assert_eq!(values.len(), r.key.len(), "{n}: override key length");
            if let tollgate_core::config::Override::Limits(l) = o {
                check_limits(l, n);
                assert!(r.cost <= l.burst, "{n}: override burst below cost");
            }
        }
        if let Some(key) =
            applies(p, (i, r), &FixedRequest, &mut KeyCache::default()).map(|a| a.key)
        {
            let head = format!("{p}:{{{n}:");
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
    }
    let _ = c.summary();
}

/// A configuration error as the reference words it: one line, and a reason that is not serde's
/// (whose messages start like these; user text inside ours may say anything).
fn check_error(e: &ConfigError) {
    let line = e.to_string();
    assert!(
        !line.contains(['\n', '\r']),
        "error is not one line: {line:?}"
    );
    for serde_start in [
        "invalid type",
        "invalid value",
        "invalid length",
        "unknown variant",
        "unknown field `",
        "missing field",
        "duplicate field",
    ] {
        assert!(
            !e.reason.starts_with(serde_start),
            "serde's words: {line:?}"
        );
    }
}

/// The Higress artifact reads the same document but for `backend`: both load it the same, or one
/// of them refuses a field only the other's transport has.
fn check_artifacts_agree(envoy: &Result<Config, String>, higress: &Result<Config, String>) {
    let foreign = |e: &String| e.starts_with("backend.") && e.contains(": only in ");
    match (envoy, higress) {
        (Ok(e), Ok(h)) => {
            // The same but for how calls travel.
            let mut h = h.clone();
            h.backend.protocol = e.backend.protocol;
            assert_eq!(*e, h, "the artifacts read the same bytes differently");
        }
        (Err(e), Err(h)) => assert!(e == h || foreign(e) || foreign(h), "{e} / {h}"),
        (Err(e), Ok(_)) => assert!(foreign(e), "refused by the Envoy artifact only: {e}"),
        (Ok(_), Err(h)) => assert!(foreign(h), "refused by the Higress artifact only: {h}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let read = |artifact| {
        let parsed = Config::parse(data, artifact);
        match &parsed {
            Ok(c) => check_valid(c),
            Err(e) => check_error(e),
        }
        parsed.map_err(|e| e.to_string())
    };
    let envoy = read(Artifact::Envoy);
    let higress = read(Artifact::Higress);
    assert_eq!(
        envoy.as_ref().ok(),
        Config::try_from(data).ok().as_ref(),
        "try_from is the Envoy artifact's parse"
    );
    check_artifacts_agree(&envoy, &higress);
});
