//! Each key source's reading of a request: present, missing, or ambiguous.

use super::*;

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
        Some(b"api.example.com".to_vec())
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
        Some(vec![
            Read::Value(Cow::Borrowed(&b"PATCH"[..])),
            Read::Value(Cow::Borrowed(&b"Alice"[..]))
        ])
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
        key_of("tg", &r, &Req::new("GET", p))
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
    // A name that appears twice is ambiguous, however it is spelled (more in `reading`).
    let q = |p: &str| read(KeySource::Query("a".into()), &Req::new("GET", p));
    assert_eq!(q("/?a=1&a=2"), Read::Ambiguous);
    assert_eq!(q("/?a=1&%61=2"), Read::Ambiguous);
    assert_eq!(q("/?%61=2&a=1"), Read::Ambiguous);
    assert_eq!(q("/?a=1;a=2"), Read::Ambiguous);
    assert_eq!(q("/?a=1&A=2"), Read::Ambiguous);
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
    // Names match after decoding, as the most lenient server folds them.
    assert_eq!(query("a", "/?A=1"), Some(b"1".to_vec()));
    assert_eq!(query("a", "/?a[]=1"), Some(b"1".to_vec()));
    assert_eq!(query("a", "/?ab=1"), None);
    assert_eq!(query("a", "/a"), None);
    assert_eq!(query("a", "/?"), None);
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
        key_of("tg", &r, &Req::default().ip("2001:db8:0:1::1")),
        key_of("tg", &r, &Req::default().ip("2001:db8:0:1:ffff::2"))
    );
    assert_ne!(
        key_of("tg", &r, &Req::default().ip("2001:db8:0:1::1")),
        key_of("tg", &r, &Req::default().ip("2001:db8:0:2::1"))
    );
}

#[test]
fn cookies() {
    let c = |lines: &[&str], name: &str| {
        let mut req = Req::new("GET", "/");
        for line in lines {
            req = req.line("cookie", line);
        }
        read(KeySource::Cookie(name.into()), &req)
    };
    let v = |s: &'static str| Read::Value(Cow::Borrowed(s.as_bytes()));
    assert_eq!(c(&["sid=abc"], "sid"), v("abc"));
    assert_eq!(c(&["a=1; sid=abc; b=2"], "sid"), v("abc"));
    // Several cookie lines.
    assert_eq!(c(&["a=1", "sid=abc"], "sid"), v("abc"));
    assert_eq!(c(&["sid=1", "sid=2"], "sid"), Read::Ambiguous);
    assert_eq!(c(&["sid=1; sid=2"], "sid"), Read::Ambiguous);
    assert_eq!(c(&["sid=1; SID=2"], "sid"), Read::Ambiguous);
    // Values as servers decode them: unquoted, percent-decoded.
    assert_eq!(c(&["sid=\"q v\""], "sid"), v("q v"));
    assert_eq!(c(&["sid=a%20b"], "sid"), v("a b"));
    assert_eq!(c(&["sid="], "sid"), v(""));
    assert_eq!(c(&["sid=a=b"], "sid"), v("a=b"));
    assert_eq!(c(&["sidx=1; xsid=2"], "sid"), Read::Missing);
    assert_eq!(c(&[], "sid"), Read::Missing);
}

#[test]
fn property_sources() {
    let req = Req::new("GET", "/")
        .prop(
            "connection.uri_san_peer_certificate",
            "spiffe://td/ns/a/sa/alice",
        )
        .prop("source.port", 40000i64.to_le_bytes())
        .prop("connection.mtls", [1])
        .prop("connection.requested_server_name", "");
    let v = |p: &str| one(property(p), &req).map(|v| String::from_utf8(v).unwrap());
    assert_eq!(
        v("source.principal").as_deref(),
        Some("spiffe://td/ns/a/sa/alice")
    );
    assert_eq!(
        v("connection.uri_san_peer_certificate").as_deref(),
        Some("spiffe://td/ns/a/sa/alice")
    );
    assert_eq!(v("source.port").as_deref(), Some("40000"));
    assert_eq!(v("connection.mtls").as_deref(), Some("true"));
    // An empty value is a value; a missing one is not.
    assert_eq!(v("connection.requested_server_name").as_deref(), Some(""));
    assert_eq!(v("connection.dns_san_peer_certificate"), None);
    // The alias and the attribute it names are different sources (different buckets).
    assert_ne!(
        property("source.principal").to_string(),
        property("connection.uri_san_peer_certificate").to_string()
    );
}

#[test]
fn metadata_sources() {
    // `sub: "alice"` and `uid: 42` in namespace `jwt`, field `p` (a struct), serialised as
    // Envoy's Metadata (filter_metadata entry -> Struct -> Value.struct_value -> fields).
    fn field(n: u8, b: &[u8]) -> Vec<u8> {
        let mut out = vec![n << 3 | 2, u8::try_from(b.len()).unwrap()];
        out.extend_from_slice(b);
        out
    }
    fn entry(k: &str, v: &[u8]) -> Vec<u8> {
        [field(1, k.as_bytes()), field(2, v)].concat()
    }
    let sub = field(3, b"alice");
    let mut uid = vec![2 << 3 | 1];
    uid.extend_from_slice(&42f64.to_bits().to_le_bytes());
    let payload = [field(1, &entry("sub", &sub)), field(1, &entry("uid", &uid))].concat();
    let ns = field(1, &entry("p", &field(5, &payload)));
    let md = field(1, &entry("jwt", &ns));
    let req = Req::new("GET", "/").prop("metadata", md);
    let src = |f: &str| KeySource::Metadata {
        namespace: "jwt".into(),
        fields: f.split('.').map(str::to_owned).collect(),
    };
    assert_eq!(one(src("p.sub"), &req), Some(b"alice".to_vec()));
    assert_eq!(one(src("p.uid"), &req), Some(b"42".to_vec()));
    assert_eq!(one(src("p.gone"), &req), None);
    assert_eq!(one(src("p.sub"), &Req::new("GET", "/")), None);
    // The rule does not apply without the claim.
    let r = rule(Match::default(), vec![src("p.sub")]);
    assert!(applies("tg", (0, &r), &req, &mut KeyCache::default()).is_some());
    assert_eq!(
        applies(
            "tg",
            (0, &r),
            &Req::new("GET", "/").prop("metadata", ""),
            &mut KeyCache::default()
        ),
        None
    );
}

/// The cost header is read as a `header:` key is: an application that reads `x_cost` as
/// `x-cost` (CGI, WSGI, PHP) is charged for it, and two lines of it, however spelled, are
/// refused rather than one of them chosen.
#[test]
fn the_cost_header_is_read_as_header_keys_are() {
    use crate::engine::{cost_of, CostError};
    let mut r = rule(Match::default(), vec![]);
    r.cost_header = Some("x-cost".into());
    let limits = Limits {
        burst: 10,
        rate: 10,
        period_ms: 1000,
    };
    let cost = |req: &Req| cost_of(&r, &limits, req);
    assert_eq!(cost(&Req::new("GET", "/")), Ok(1));
    assert_eq!(cost(&Req::new("GET", "/").with("x-cost", "4")), Ok(4));
    assert_eq!(cost(&Req::new("GET", "/").with("X_Cost", "7")), Ok(7));
    assert_eq!(
        cost(&Req::new("GET", "/").line("x-cost", "1").line("x_cost", "9")),
        Err(CostError::Invalid)
    );
}

/// HEAD runs the GET handler: the `method` key reads it as GET, so asking for the headers only is
/// no bucket of its own.
#[test]
fn the_method_key_reads_head_as_get() {
    let key = |m: &str| one(KeySource::Method, &Req::new(m, "/"));
    assert_eq!(key("HEAD"), Some(b"GET".to_vec()));
    assert_eq!(key("GET"), Some(b"GET".to_vec()));
    assert_eq!(key("POST"), Some(b"POST".to_vec()));
    // Nor is the case of the method (HTTP/2 lets a client send it lower-case).
    for spelled in ["delete", "Delete", "dELETE"] {
        assert_eq!(key(spelled), Some(b"DELETE".to_vec()), "{spelled}");
    }
    assert_eq!(key("head"), Some(b"GET".to_vec()));
}

/// A POST that asks to be routed as another method is ambiguous under the `method` key (one
/// bucket per rule), so asking for a method per request mints no bucket; asking for POST (or
/// nothing) keeps POST's.
#[test]
fn the_method_key_of_a_request_that_asks_for_another_method_is_ambiguous() {
    let post = |path: &str| Req::new("POST", path);
    for req in [
        post("/").line("x-http-method-override", "DELETE"),
        post("/?_method=PATCH"),
        post("/?_method=POST;_method=PUT"),
        post("/")
            .line("x-method-override", "POST")
            .line("x-method-override", "PUT"),
        post("/").line("x-http-method-override", "POST, PUT"),
        Req::new("GET", "/").line("x-http-method-override", "DELETE"),
    ] {
        assert_eq!(
            read(KeySource::Method, &req),
            Read::Ambiguous,
            "{:?}",
            req.lines
        );
    }
    for req in [
        post("/").line("x-http-method-override", "post"),
        post("/?_method=POST"),
        Req::new("GET", "/?_method=DELETE"),
        Req::new("HEAD", "/").line("x-http-method-override", "GET"),
    ] {
        assert!(
            matches!(read(KeySource::Method, &req), Read::Value(_)),
            "{:?}",
            req.lines
        );
    }
}

/// The attributes that are the method or the path are read as the `method` and `path` keys read
/// them, whatever the host's attribute holds: the bytes as sent would be a bucket per spelling.
#[test]
fn attributes_of_the_request_line_read_as_its_keys() {
    for attribute in ["request.method", "request.headers.:method"] {
        let source = || property(attribute);
        let head = Req::new("HEAD", "/").prop(attribute, "HEAD");
        assert_eq!(one(source(), &head), Some(b"GET".to_vec()), "{attribute}");
        let asks = Req::new("POST", "/?_method=DELETE").prop(attribute, "POST");
        assert_eq!(read(source(), &asks), Read::Ambiguous, "{attribute}");
    }
    let path = |p: &str| one(property("request.headers.:path"), &Req::new("GET", p));
    assert_eq!(path("/api//x?a=1"), path("/api/%78?a=1"));
    assert_eq!(path("/api//x?a=1"), Some(b"/api/x?a=1".to_vec()));
}

/// The attributes Envoy takes from one request header read from that header's lines, as
/// `header:` reads them (Envoy's attribute would keep a padding and join repeated lines), not
/// from the attribute.
#[test]
fn attributes_of_one_header_read_as_that_header() {
    for (attribute, header) in [
        ("request.useragent", "user-agent"),
        ("request.referer", "referer"),
        ("request.id", "x-request-id"),
        ("request.host", ":authority"),
        ("request.scheme", ":scheme"),
    ] {
        let req = Req::new("GET", "/")
            .with(header, "v")
            .prop(attribute, "attribute");
        assert_eq!(
            one(property(attribute), &req),
            Some(b"v".to_vec()),
            "{attribute}"
        );
        let twice = Req::new("GET", "/").line(header, "v").line(header, "w");
        assert_eq!(
            read(property(attribute), &twice),
            Read::Ambiguous,
            "{attribute}"
        );
    }
    // Other attributes are Envoy's.
    let req = Req::new("GET", "/").prop("request.time", "t");
    assert_eq!(one(property("request.time"), &req), Some(b"t".to_vec()));
}

/// The attributes that are `:authority` (`request.host`, `request.headers.:authority`) name the
/// host a server routes by, as the `authority` key reads it: read as the header is (the bytes as
/// sent), each spelling of one host (`API.example.com`, `api.example.com:1`,
/// `api.example.com.`) would be a bucket of its own, and a client that cycles through the case of
/// its host's letters or through ports gets a fresh bucket per request while every server routes
/// it to the one site.
#[test]
fn attributes_of_the_authority_read_as_the_authority_key() {
    for attribute in ["request.host", "request.headers.:authority"] {
        let key = |authority: &str| {
            let r = rule(Match::default(), vec![property(attribute)]);
            key_of(
                "tg",
                &r,
                &Req::new("GET", "/").with(":authority", authority),
            )
        };
        let host = key("api.example.com");
        assert!(host.is_some(), "{attribute}");
        for spelling in SPELLINGS_OF_API_EXAMPLE_COM {
            assert_eq!(key(spelling), host, "{attribute}: {spelling}");
        }
        assert_ne!(key("www.example.com"), host, "{attribute}");
        let twice = Req::new("GET", "/")
            .line(":authority", "a.example.com")
            .line(":authority", "b.example.com");
        assert_eq!(read(property(attribute), &twice), Read::Ambiguous);
    }
}

/// A header key is read as the most lenient server reads the header: gunicorn up to 21 decodes it
/// as Latin-1 and strips it as Python's `str.strip()` does, so `K\xa0` (or `K\x85`, `K\x1f`) is
/// `K` to the application. Read as sent, each such spelling of a valid API key would be a bucket
/// of its own.
#[test]
fn a_header_key_with_bytes_a_server_strips_at_its_ends_is_the_keys_bucket() {
    for source in [hdr("x-api-key"), property("request.headers.x-api-key")] {
        let key = |value: &[u8]| {
            let r = rule(Match::default(), vec![source.clone()]);
            key_of("tg", &r, &Req::new("GET", "/").with("x-api-key", value))
        };
        let plain = key(b"K");
        assert!(plain.is_some());
        for spelling in [&b"K\xa0"[..], b"K\x85", b"\xa0K\x1f", b"K\xa0\xa0\x0b"] {
            assert_eq!(key(spelling), plain, "{source:?}: {spelling:?}");
        }
        assert_ne!(key(b"K\xa0L"), plain, "{source:?}");
    }
}

/// A CONNECT (`CONNECT api.example.com:443 HTTP/1.1`, or HTTP/2's `:method CONNECT` with
/// `:authority` alone) has no `:path`: Envoy's codecs set none (`handlePath` sets `:authority`
/// only for a CONNECT), and a listener with `upgrade_configs: CONNECT` runs the HTTP filters for
/// it. The `path` key is documented as never missing, so a rule keyed on it (alone or with
/// `client_ip`) must not let a tunnel through unlimited: it reads as the empty path's bucket, `/`,
/// and never as a path of its own that could be an override's.
#[test]
fn a_connect_without_a_path_is_keyed_not_let_through() {
    let connect = Req::default()
        .with(":method", "CONNECT")
        .with(":authority", "api.example.com:443")
        .ip("10.0.0.7");
    assert_eq!(one(KeySource::Path, &connect), Some(b"/".to_vec()));
    assert!(
        key_values(&[KeySource::CLIENT_IP, KeySource::Path], &connect).is_some(),
        "a rule keyed on client_ip and path applies to a CONNECT"
    );
    for attribute in ["request.url_path", "request.path"] {
        let source = KeySource::Property {
            path: attribute.split('.').map(String::from).collect(),
            spelled: attribute.to_string(),
        };
        assert_eq!(one(source, &connect), Some(b"/".to_vec()), "{attribute}");
    }
    // A request that is no CONNECT and has no path stays missing (Envoy refuses such a request).
    assert_eq!(one(KeySource::Path, &Req::default()), None);
}
