//! Bucket keys: known digests, distinct tuples, no user text, one ambiguous bucket per rule, and
//! overrides that change limits but never keys.

use super::*;

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
        bucket_key::<&[u8]>("tollgate", "all", &[], &[]),
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
        bucket_key::<&[u8]>("tg", "r", &[], &[]),
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
        let key = key_of("tollgate", &r, &req).unwrap();
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
        &key_of("tollgate", &rq, &req).unwrap(),
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
        key_of("tg", &r, &full),
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
    assert_eq!(key_of("tg", &r, &other_path), None);
    // A source is missing.
    let no_ip = Req::new("GET", "/api/x").with("x-user-id", "alice");
    assert_eq!(key_of("tg", &r, &no_ip), None);
    // Empty key: one bucket for the rule.
    let global = rule(Match::default(), vec![]);
    assert_eq!(
        key_of("tg", &global, &Req::default()),
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
    let want = key_of("tg", &r, &Req::new("GET", "/api/x"));
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
        assert_eq!(key_of("tg", &r, &Req::new("GET", p)), want, "{p}");
    }
    // Irregular paths match every path rule (keyed by their clamped form).
    assert!(key_of("tg", &r, &Req::new("GET", "/../other")).is_some());
    assert!(key_of("tg", &r, &Req::new("GET", "/other/%zz")).is_some());
    assert_eq!(key_of("tg", &r, &Req::new("GET", "/other")), None);
    // Case-sensitive unless asked.
    assert_eq!(key_of("tg", &r, &Req::new("GET", "/API/x")), None);
    let ci = rule(
        Match {
            path_prefix: Some("/api/".into()),
            path_ignore_case: true,
            ..Match::default()
        },
        vec![],
    );
    assert!(key_of("tg", &ci, &Req::new("GET", "/API/x")).is_some());
    assert!(key_of("tg", &ci, &Req::new("GET", "//Api/x")).is_some());
    assert_eq!(key_of("tg", &ci, &Req::new("GET", "/APIX")), None);
}

#[test]
fn a_rule_that_ignores_the_paths_case_keys_each_path_once() {
    let folding = |key| {
        let mut r = rule(
            Match {
                path_prefix: Some("/api/".into()),
                path_ignore_case: true,
                ..Match::default()
            },
            vec![KeySource::Method, key],
        );
        r.overrides.insert(
            vec![b"GET".to_vec(), b"/api/health".to_vec()],
            Override::Unlimited,
        );
        r
    };
    for source in ["path", "request.url_path"] {
        let r = folding(match source {
            "path" => KeySource::Path,
            attribute => property(attribute),
        });
        let apply = |p: &str| {
            applies("tg", (0, &r), &Req::new("GET", p), &mut KeyCache::default()).unwrap()
        };
        let want = apply("/api/x").key;
        for p in ["/API/x", "/api/X", "//Api/%58", "/aPI/./x"] {
            assert_eq!(apply(p).key, want, "{source}: {p}");
        }
        assert_ne!(apply("/api/y").key, want, "{source}");
        assert!(apply("/API/Health").unlimited, "{source}");
        assert!(!apply("/API/x").unlimited, "{source}");
    }
    // A rule that minds case keys each case apart.
    let r = rule(Match::default(), vec![KeySource::Path]);
    assert_ne!(
        key_of("tg", &r, &Req::new("GET", "/API/x")),
        key_of("tg", &r, &Req::new("GET", "/api/x"))
    );
}

#[test]
fn the_path_attributes_key_on_the_path_however_it_is_spelled() {
    let key = |attribute: &str, p: &str| {
        // The host's attribute is the path as sent; the key reads through its spellings.
        let req = Req::new("GET", p).prop(attribute, p);
        key_of(
            "tg",
            &rule(Match::default(), vec![property(attribute)]),
            &req,
        )
        .unwrap()
    };
    for p in ["/api//x", "/api/./x", "/api/%78", "/api;v=1/x", "/api%2Fx"] {
        assert_eq!(
            key("request.url_path", p),
            key("request.url_path", "/api/x"),
            "{p}"
        );
        assert_eq!(
            key("request.url_path", &format!("{p}?a=1")),
            key("request.url_path", "/api/x")
        );
        assert_eq!(
            key("request.path", &format!("{p}?a=1")),
            key("request.path", "/api/x?a=1"),
            "{p}"
        );
    }
    // `request.path` keeps the query: another query is another bucket, as the user asked.
    assert_ne!(
        key("request.path", "/api/x?a=2"),
        key("request.path", "/api/x?a=1")
    );
    assert_ne!(
        key("request.path", "/api/x"),
        key("request.path", "/api/x?")
    );
}

#[test]
fn the_ambiguous_marker_has_known_digests() {
    // Computed independently (Python hashlib): sha256(be32(16) "header:x-api-key"
    // be32(0xffffffff)).hexdigest()[:32].
    assert_eq!(
        bucket_key_of("tg", "r", &[hdr("x-api-key")], &[Part::Ambiguous]),
        "tg:{r:a71304c0f8c5d973c510877a10c04dac}"
    );
    assert_eq!(
        bucket_key_of(
            "tg",
            "r",
            &[hdr("x-tenant"), KeySource::Cookie("session".into())],
            &[Part::Value(b"acme"), Part::Ambiguous]
        ),
        "tg:{r:2aed9ccc0e1ef000c9c5b16d9c3bef11}"
    );
    // All values: what `bucket_key` gives.
    assert_eq!(
        bucket_key_of("tg", "r", &[hdr("x")], &[Part::Value(b"a")]),
        bucket_key("tg", "r", &[hdr("x")], &[b"a".to_vec()])
    );
}

/// The attack: after `VALID` spent its burst, copies of the key source's name with junk values
/// must not each get a bucket. Every source reads a repeated name as ambiguous: one bucket per
/// rule, never a value's, never an override's.
#[test]
fn a_repeated_key_source_is_one_ambiguous_bucket_per_rule() {
    type Twice = fn(&str, &str) -> Req;
    let cases: [(KeySource, Twice); 4] = [
        (KeySource::Cookie("session".into()), |a, b| {
            Req::new("GET", "/").line("cookie", format!("session={a}; session={b}"))
        }),
        (KeySource::Query("key".into()), |a, b| {
            Req::new("GET", &format!("/?key={a}&key={b}"))
        }),
        (hdr("x-api-key"), |a, b| {
            Req::new("GET", "/")
                .line("x-api-key", a)
                .line("x-api-key", b)
        }),
        (property("request.headers.x-api-key"), |a, b| {
            Req::new("GET", "/")
                .line("x-api-key", a)
                .line("X_Api_Key", b)
        }),
    ];
    for (source, twice) in cases {
        let mut r = rule(Match::default(), vec![source.clone()]);
        r.overrides
            .insert(vec![b"internal".to_vec()], Override::Unlimited);
        let apply = |req: &Req| applies("tg", (3, &r), req, &mut KeyCache::default()).unwrap();
        let shared = apply(&twice("R1", "VALID"));
        assert!(shared.ambiguous, "{source}");
        assert_eq!(
            shared.key,
            bucket_key_of("tg", &r.name, &r.key, &[Part::Ambiguous])
        );
        assert_eq!(
            (shared.limits, shared.unlimited),
            (r.limits.limits(), false)
        );
        for (a, b) in [
            ("R2", "VALID"),
            ("VALID", "R3"),
            ("VALID", "VALID"),
            ("internal", "internal"),
        ] {
            assert_eq!(apply(&twice(a, b)), shared, "{source} {a} {b}");
        }
        // No value names the ambiguous bucket, whatever its bytes.
        for value in [&b""[..], b"VALID", &u32::MAX.to_be_bytes()] {
            assert_ne!(shared.key, bucket_key("tg", &r.name, &r.key, &[value]));
        }
        // Another rule's ambiguous bucket is another bucket.
        let mut other = r.clone();
        other.name = "other".into();
        assert_ne!(
            applies(
                "tg",
                (4, &other),
                &twice("R1", "VALID"),
                &mut KeyCache::default()
            )
            .unwrap()
            .key,
            shared.key
        );
    }
}

#[test]
fn an_ambiguous_source_keeps_the_other_sources_values() {
    let r = rule(
        Match::default(),
        vec![hdr("x-tenant"), KeySource::Cookie("session".into())],
    );
    let req = |tenant: &str, cookie: &str| {
        Req::new("GET", "/")
            .with("x-tenant", tenant)
            .line("cookie", cookie)
    };
    let a = applies(
        "tg",
        (0, &r),
        &req("acme", "session=1; session=2"),
        &mut KeyCache::default(),
    )
    .unwrap();
    assert!(a.ambiguous);
    assert_eq!(a.key, "tg:{per-user:2aed9ccc0e1ef000c9c5b16d9c3bef11}");
    assert_eq!(
        a.key,
        bucket_key_of(
            "tg",
            "per-user",
            &r.key,
            &[Part::Value(b"acme"), Part::Ambiguous]
        )
    );
    let b = applies(
        "tg",
        (0, &r),
        &req("other", "session=1; session=2"),
        &mut KeyCache::default(),
    )
    .unwrap();
    assert_ne!(a.key, b.key, "one ambiguous bucket per tenant");
    // A missing source still means the rule does not apply.
    let no_tenant = Req::new("GET", "/").line("cookie", "session=1; session=2");
    assert_eq!(
        applies("tg", (0, &r), &no_tenant, &mut KeyCache::default()),
        None
    );
    // Once: the value, not ambiguous.
    let one = applies(
        "tg",
        (0, &r),
        &req("acme", "session=1"),
        &mut KeyCache::default(),
    )
    .unwrap();
    assert!(!one.ambiguous);
    assert_eq!(
        one.key,
        bucket_key("tg", "per-user", &r.key, &[b"acme".to_vec(), b"1".to_vec()])
    );
}

#[test]
fn a_header_key_reads_one_line_by_any_spelling_of_its_name() {
    let r = rule(Match::default(), vec![hdr("x-api-key")]);
    let key = |req: &Req| applies("tg", (0, &r), req, &mut KeyCache::default()).unwrap();
    let plain = key(&Req::new("GET", "/").line("x-api-key", "VALID"));
    assert!(!plain.ambiguous);
    // CGI, WSGI and PHP read `x_api_key` as `x-api-key`.
    assert_eq!(key(&Req::new("GET", "/").line("X_API_KEY", "VALID")), plain);
    // One line with a comma is one value, as every server reads one line.
    assert!(!key(&Req::new("GET", "/").line("x-api-key", "R1,VALID")).ambiguous);
    assert!(
        key(&Req::new("GET", "/")
            .line("x-api-key", "VALID")
            .line("x_api_key", "R1"))
        .ambiguous
    );
}

/// The override attack: `/health` unlimited on a `path`-keyed rule is reached only by a path
/// every reading calls `/health`; other spellings stay in `/health`'s bucket under the rule's
/// limits.
#[test]
fn a_path_override_applies_only_where_every_reading_agrees() {
    let mut r = rule(Match::default(), vec![KeySource::Path]);
    r.overrides
        .insert(vec![b"/health".to_vec()], Override::Unlimited);
    let apply =
        |p: &str| applies("tg", (0, &r), &Req::new("GET", p), &mut KeyCache::default()).unwrap();
    let health = apply("/health");
    assert!(health.unlimited);
    assert!(apply("/health?probe=1").unlimited);
    for p in [
        "/api/search/..;/..;/health",
        "/x/..;/health",
        "/health;v=1",
        "//health",
        "/x/../health",
        "/%68ealth",
        "/x%2F..%2Fhealth",
        "/../health",
    ] {
        let a = apply(p);
        assert!(!a.unlimited, "{p}");
        assert_eq!(a.limits, r.limits, "{p}");
        assert_eq!(
            a.key, health.key,
            "{p}: /health's bucket, under the rule's limits"
        );
    }
    // With other sources too, and for limit overrides as for `unlimited`.
    let mut two = rule(Match::default(), vec![KeySource::Method, KeySource::Path]);
    let wide = Limits {
        burst: 99,
        rate: 99,
        period_ms: 1000,
    };
    two.overrides.insert(
        vec![b"GET".to_vec(), b"/health".to_vec()],
        Override::Limits(Quota::try_from(wide).unwrap()),
    );
    let limits = |p: &str| {
        applies(
            "tg",
            (0, &two),
            &Req::new("GET", p),
            &mut KeyCache::default(),
        )
        .unwrap()
        .limits
    };
    assert_eq!(limits("/health"), wide);
    assert_eq!(limits("/x/..;/health"), two.limits);
    // An attribute that is the path as sent: its override too only where readings agree.
    let mut raw = rule(Match::default(), vec![property("request.url_path")]);
    raw.overrides
        .insert(vec![b"/a;v=1/x".to_vec()], Override::Unlimited);
    raw.overrides
        .insert(vec![b"/health".to_vec()], Override::Unlimited);
    let unlimited = |p: &str| {
        let req = Req::new("GET", p).prop("request.url_path", p);
        applies("tg", (0, &raw), &req, &mut KeyCache::default())
            .unwrap()
            .unlimited
    };
    assert!(unlimited("/health"));
    assert!(
        !unlimited("/a;v=1/x"),
        "a server that cuts ;params reads /a/x"
    );
}

/// An override on a header names only the header's own spelling: a filter in front that sets or
/// strips `x-tenant` leaves a client's `x_tenant` line, which some servers read as the same
/// header, in place.
#[test]
fn a_header_override_needs_the_headers_own_spelling() {
    let mut r = rule(Match::default(), vec![KeySource::Header("x-tenant".into())]);
    r.overrides
        .insert(vec![b"internal".to_vec()], Override::Unlimited);
    let apply = |name: &str| {
        let req = Req::new("GET", "/").line(name, "internal");
        applies("tg", (0, &r), &req, &mut KeyCache::default()).unwrap()
    };
    assert!(apply("x-tenant").unlimited);
    assert!(apply("X-Tenant").unlimited);
    let spoofed = apply("x_tenant");
    assert!(!spoofed.unlimited, "the rule's own limits");
    assert_eq!(spoofed.key, apply("x-tenant").key, "the same bucket");
}

#[test]
fn overrides_change_limits_not_keys() {
    let mut r = rule(Match::default(), vec![KeySource::Header("x-tenant".into())]);
    let acme = Limits {
        burst: 2000,
        rate: 1000,
        period_ms: 1000,
    };
    r.overrides.insert(
        vec![b"acme".to_vec()],
        Override::Limits(Quota::try_from(acme).unwrap()),
    );
    r.overrides
        .insert(vec![b"internal".to_vec()], Override::Unlimited);
    let tenant = |t: &str| {
        applies(
            "tg",
            (0, &r),
            &Req::new("GET", "/").with("x-tenant", t),
            &mut KeyCache::default(),
        )
        .unwrap()
    };
    let plain = rule(Match::default(), vec![KeySource::Header("x-tenant".into())]);
    let plain_key =
        |t: &str| key_of("tg", &plain, &Req::new("GET", "/").with("x-tenant", t)).unwrap();

    let a = tenant("acme");
    assert_eq!(a.limits, acme);
    assert!(!a.unlimited);
    assert_eq!(a.key, plain_key("acme"), "an override keeps the bucket");
    let i = tenant("internal");
    assert!(i.unlimited);
    assert_eq!(i.limits, r.limits);
    assert_eq!(i.key, plain_key("internal"));
    let d = tenant("other");
    assert_eq!((d.limits, d.unlimited), (r.limits.limits(), false));
    // Matched on the value as requests give it: "ACME" is another tenant.
    assert_eq!(tenant("ACME").limits, r.limits);
}

/// A server routes every spelling of one host to the same site (frameworks read the host
/// without its port): each is the same bucket of an `authority` key, so a client cannot mint
/// fresh buckets by changing the port, the case, a trailing dot or an IP literal's spelling.
#[test]
fn every_spelling_of_one_host_is_one_authority_bucket() {
    let r = rule(Match::default(), vec![KeySource::Authority]);
    let key = |authority: &str| {
        applies(
            "tg",
            (0, &r),
            &Req::default().with(":authority", authority),
            &mut KeyCache::default(),
        )
    };
    let host = key("api.example.com");
    assert!(host.is_some());
    for spelling in SPELLINGS_OF_API_EXAMPLE_COM {
        assert_eq!(key(spelling), host, "{spelling}");
    }
    assert_ne!(key("www.example.com"), host);
    let ip = key("[::1]");
    assert!(ip.is_some());
    for spelling in ["[0:0::1]:80", "[::0001]", "[0:0:0:0:0:0:0:1]:1"] {
        assert_eq!(key(spelling), ip, "{spelling}");
    }
    assert_eq!(key("[::ffff:10.0.0.1]:9"), key("10.0.0.1"));
}
