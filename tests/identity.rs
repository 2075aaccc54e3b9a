//! Identity-aware limits through a real Envoy 1.40: keys from a JWT checked by Envoy's `jwt_authn`
//! (dynamic metadata), from the mTLS peer certificate (attributes), host scoping with `match.hosts`,
//! and per-key overrides. Keys and certificates are made here with `openssl`; nothing leaves
//! loopback. Each bucket a test expects is also looked up in Redis under the digest computed here,
//! which pins the exact attribute path and value encoding Envoy gives.
//! Needs `make setup` (Envoy, Redis, Webdis, openssl, curl) and `make build`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::jwt::{openssl, Jwt};
use common::Stack;
use tollgate_core::config::Config;
use tollgate_core::rule::bucket_key;

/// The bucket key of rule `name` in `config` for `values`, as the filter computes it.
fn key_of(config: &str, name: &str, values: &[&str]) -> String {
    let cfg = Config::try_from(config.as_bytes()).unwrap();
    let rule = cfg.rules.iter().find(|r| r.name == name).unwrap();
    let values: Vec<Vec<u8>> = values.iter().map(|v| v.as_bytes().to_vec()).collect();
    bucket_key(&cfg.key_prefix, name, &rule.key, &values)
}

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn statuses(stack: &Stack, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<u16> {
    (0..n)
        .map(|_| stack.raw_get(LOCALHOST, path, headers).status)
        .collect()
}

/// Inserts `filter` (YAML at the http_filters item indentation) before the tollgate filter.
fn with_filter_first(yaml: &str, filter: &str) -> String {
    let anchor = "          http_filters:\n";
    assert_eq!(yaml.matches(anchor).count(), 1);
    yaml.replace(anchor, &format!("{anchor}{filter}"))
}

// ---- JWT ----

/// The issuer of the tests' tokens.
const ISSUER: &str = "tollgate-test";

/// Envoy's jwt_authn filter for tokens signed by the keys of `jwks`: under /strict/ a valid token
/// is required (else 401); elsewhere a missing or failed token lets the request through without
/// metadata.
fn jwt_filter(jwks: &str) -> String {
    format!(
        r#"          - name: envoy.filters.http.jwt_authn
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
              providers:
                test:
                  issuer: {ISSUER}
                  local_jwks:
                    inline_string: '{}'
                  payload_in_metadata: jwt_payload
              rules:
              - match: {{ prefix: "/strict/" }}
                requires: {{ provider_name: test }}
              - match: {{ prefix: "/" }}
                requires:
                  requires_any:
                    requirements:
                    - provider_name: test
                    - allow_missing_or_failed: {{}}
"#,
        jwks.trim()
    )
}

const JWT_CONFIG: &str = r#"{ "backend": { "timeout_ms": 2000 },
  "rules": [
    { "name": "per-sub", "key": ["metadata:envoy.filters.http.jwt_authn:jwt_payload.sub"],
      "rate": 1, "period_ms": 60000, "burst": 2 },
    { "name": "per-uid", "key": ["metadata:envoy.filters.http.jwt_authn:jwt_payload.uid"],
      "rate": 1, "period_ms": 60000, "burst": 100,
      "overrides": [ { "key": ["42"], "rate": 1, "burst": 1 } ] } ] }"#;

/// Two tokens with different `sub` get separate buckets; a numeric claim (`uid: 42`) is keyed as
/// "42" (its override applies); no token or a bad one: the rules do not apply, or jwt_authn
/// itself refuses where it requires a token.
#[test]
fn jwt_claims_key_the_buckets() {
    let dir = common::scratch_dir("identity-jwt-keys");
    let jwt = Jwt::new(&dir, ISSUER);
    let alice = jwt.token(serde_json::json!({ "sub": "alice", "uid": 42 }));
    let bob = jwt.token(serde_json::json!({ "sub": "bob", "uid": 7 }));
    let filter = jwt_filter(&jwt.jwks);
    let stack = Stack::start_edited("identity-jwt", JWT_CONFIG, |yaml, _| {
        with_filter_first(&yaml, &filter)
    });
    let bearer = |t: &str| format!("Bearer {t}");
    let (a, b) = (bearer(&alice), bearer(&bob));

    // alice: uid 42's override (burst 1) denies her second request.
    assert_eq!(
        statuses(&stack, 2, "/x", &[("authorization", &a)]),
        [200, 429],
        "{}",
        stack.logs()
    );
    // bob: per-sub's burst 2.
    assert_eq!(
        statuses(&stack, 3, "/x", &[("authorization", &b)]),
        [200, 200, 429]
    );
    // A claim nested deeper than the filter reads values, beside `sub`: only the configured path
    // is read, so it does not hide carol's `sub` (she would otherwise escape both rules).
    let mut deep = serde_json::json!("x");
    for _ in 0..34 {
        deep = serde_json::json!([deep]);
    }
    let carol = jwt.token(serde_json::json!({ "sub": "carol", "uid": 8, "profile": deep }));
    assert_eq!(
        statuses(&stack, 3, "/x", &[("authorization", &bearer(&carol))]),
        [200, 200, 429],
        "{}",
        stack.logs()
    );
    for (rule, value) in [
        ("per-sub", "alice"),
        ("per-sub", "bob"),
        ("per-uid", "42"),
        ("per-uid", "7"),
    ] {
        let key = key_of(JWT_CONFIG, rule, &[value]);
        assert!(stack.redis.exists(&key), "{rule} {value}: {key} in Redis");
    }
    // No token, or a bad one: no claims, the rules do not apply.
    let calls = stack.redis.script_calls();
    assert_eq!(statuses(&stack, 5, "/x", &[]), [200; 5]);
    // alice's claims under bob's signature.
    let (alice_signed, _) = alice.rsplit_once('.').unwrap();
    let (_, bob_sig) = bob.rsplit_once('.').unwrap();
    let forged = format!("{alice_signed}.{bob_sig}");
    assert_eq!(
        statuses(&stack, 5, "/x", &[("authorization", &bearer(&forged))]),
        [200; 5]
    );
    assert_eq!(stack.redis.script_calls(), calls, "no rule applied");
    // Where jwt_authn requires a token it answers 401 itself.
    let r = stack.raw_get(
        LOCALHOST,
        "/strict/x",
        &[("authorization", &bearer(&forged))],
    );
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(stack.raw_get(LOCALHOST, "/strict/x", &[]).status, 401);
    assert_eq!(
        stack
            .raw_get(LOCALHOST, "/strict/x", &[("authorization", &b)])
            .status,
        429,
        "bob is still limited"
    );
}

/// deploy/jwt/test-token.sh, which docs/recipes.md offers for trying a per-user limit without an
/// identity provider: its JWKS verifies its tokens in Envoy's jwt_authn, each subject gets its
/// own bucket, and a token it did not sign is refused.
#[test]
fn the_test_token_script_makes_tokens_envoy_verifies() {
    let dir = common::scratch_dir("identity-test-token");
    let script = common::repo_root().join("deploy/jwt/test-token.sh");
    let token = |sub: &str| {
        let out = Command::new(&script)
            .args([dir.to_str().unwrap(), sub, ISSUER])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        format!("Bearer {}", String::from_utf8(out.stdout).unwrap().trim())
    };
    let (alice, bob) = (token("alice"), token("bob"));
    let jwks = std::fs::read_to_string(dir.join("jwks.json")).unwrap();
    let filter = jwt_filter(&jwks);
    let stack = Stack::start_edited("identity-test-token", JWT_CONFIG, |yaml, _| {
        with_filter_first(&yaml, &filter)
    });
    for bearer in [&alice, &bob] {
        assert_eq!(
            statuses(&stack, 3, "/strict/x", &[("authorization", bearer)]),
            [200, 200, 429],
            "{}",
            stack.logs()
        );
    }
    for sub in ["alice", "bob"] {
        assert!(stack.redis.exists(&key_of(JWT_CONFIG, "per-sub", &[sub])));
    }
    // Another key's token: jwt_authn refuses it where a token is required.
    let other = Jwt::new(&common::scratch_dir("identity-test-token-other"), ISSUER);
    let forged = format!(
        "Bearer {}",
        other.token(serde_json::json!({ "sub": "alice" }))
    );
    assert_eq!(
        statuses(&stack, 1, "/strict/x", &[("authorization", &forged)]),
        [401]
    );
}

// ---- mTLS ----

/// A test CA, a server certificate for `tollgate.test` / 127.0.0.1, and client certificates whose
/// URI SAN is a SPIFFE ID, as a mesh gives its workloads.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let run = |args: &[&str]| openssl(dir, args, None);
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=tollgate test CA",
        ]);
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=DNS:tollgate.test,IP:127.0.0.1\n",
        )
        .unwrap();
        Self::issue(dir, "server", "/CN=tollgate.test", "server.ext");
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    fn issue(dir: &Path, name: &str, subject: &str, ext: &str) {
        let run = |args: &[&str]| openssl(dir, args, None);
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        run(&[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject,
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            ext,
        ]);
    }

    /// A client certificate for workload `sa`: URI SAN `spiffe://tollgate.test/ns/default/sa/<sa>`,
    /// DNS SAN `<sa>.client.test`, subject `O=tollgate, CN=<sa>`.
    fn client(&self, sa: &str) {
        let ext = format!("{sa}.ext");
        std::fs::write(
            self.dir.join(&ext),
            format!(
                "subjectAltName=URI:spiffe://tollgate.test/ns/default/sa/{sa},DNS:{sa}.client.test\n\
                 extendedKeyUsage=clientAuth\n"
            ),
        )
        .unwrap();
        Self::issue(&self.dir, sa, &format!("/O=tollgate/CN={sa}"), &ext);
    }

    /// The lower-case hex SHA-256 of certificate `name`.pem (its DER).
    fn sha256(&self, name: &str) -> String {
        let out = openssl(
            &self.dir,
            &[
                "x509",
                "-in",
                &format!("{name}.pem"),
                "-noout",
                "-fingerprint",
                "-sha256",
            ],
            None,
        );
        let text = String::from_utf8(out).unwrap();
        text.trim()
            .split_once('=')
            .unwrap()
            .1
            .replace(':', "")
            .to_ascii_lowercase()
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).to_string_lossy().into_owned()
    }

    /// The listener made TLS (client certificate optional, verified against the CA when sent),
    /// with the TLS inspector that records SNI.
    fn tls_listener(&self, yaml: &str) -> String {
        let chains = "    filter_chains:\n    - filters:\n";
        assert_eq!(yaml.matches(chains).count(), 1);
        yaml.replace(
            chains,
            &format!(
                r#"    listener_filters:
    - name: envoy.filters.listener.tls_inspector
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: false
          common_tls_context:
            tls_certificates:
            - certificate_chain: {{ filename: '{}' }}
              private_key: {{ filename: '{}' }}
            validation_context:
              trusted_ca: {{ filename: '{}' }}
      filters:
"#,
                self.path("server.pem"),
                self.path("server.key"),
                self.path("ca.pem")
            ),
        )
    }

    /// `GET https://tollgate.test:<port>/x` with curl, as client `who` (None: no certificate);
    /// the HTTP status.
    fn get(&self, port: u16, who: Option<&str>) -> u16 {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ])
        .args(["--cacert", &self.path("ca.pem")])
        .args(["--resolve", &format!("tollgate.test:{port}:127.0.0.1")]);
        if let Some(sa) = who {
            cmd.args(["--cert", &self.path(&format!("{sa}.pem"))])
                .args(["--key", &self.path(&format!("{sa}.key"))]);
        }
        let out = cmd
            .arg(format!("https://tollgate.test:{port}/x"))
            .output()
            .unwrap_or_else(|e| panic!("run curl (make setup installs it): {e}"));
        String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0)
    }
}

const MTLS_CONFIG: &str = r#"{ "backend": { "timeout_ms": 2000 },
  "rules": [
    { "name": "per-peer", "key": ["property:source.principal"], "rate": 1, "period_ms": 60000,
      "burst": 2 },
    { "name": "by-uri-san", "key": ["property:connection.uri_san_peer_certificate"], "rate": 100, "period_ms": 3600000 },
    { "name": "by-subject", "key": ["property:connection.subject_peer_certificate"], "rate": 100, "period_ms": 3600000 },
    { "name": "by-dns-san", "key": ["property:connection.dns_san_peer_certificate"], "rate": 100, "period_ms": 3600000 },
    { "name": "by-cert", "key": ["property:connection.mtls",
                                 "property:connection.sha256_peer_certificate_digest"], "rate": 100, "period_ms": 3600000 },
    { "name": "by-sni", "key": ["property:connection.requested_server_name"], "rate": 100, "period_ms": 3600000 } ] }"#;

/// Two client identities get separate buckets through `property:source.principal` (the peer
/// certificate's URI SAN); every peer-certificate attribute is found in Redis under the value
/// Envoy 1.40 gives; a client without a certificate is not limited by the identity rules.
#[test]
fn mtls_identities_key_the_buckets() {
    let dir = common::scratch_dir("identity-mtls-pki");
    let pki = Pki::new(&dir);
    pki.client("alice");
    pki.client("bob");
    let stack = Stack::start_edited("identity-mtls", MTLS_CONFIG, |yaml, _| {
        pki.tls_listener(&yaml)
    });
    let port = stack.port();
    let get =
        |who: Option<&str>, n: usize| -> Vec<u16> { (0..n).map(|_| pki.get(port, who)).collect() };

    assert_eq!(get(Some("alice"), 3), [200, 200, 429], "{}", stack.logs());
    assert_eq!(get(Some("bob"), 3), [200, 200, 429]);
    let alice_id = "spiffe://tollgate.test/ns/default/sa/alice";
    let alice_digest = pki.sha256("alice");
    for (rule, values) in [
        ("per-peer", vec![alice_id]),
        ("by-uri-san", vec![alice_id]),
        ("by-subject", vec!["CN=alice,O=tollgate"]),
        ("by-dns-san", vec!["alice.client.test"]),
        ("by-cert", vec!["true", alice_digest.as_str()]),
        ("by-sni", vec!["tollgate.test"]),
    ] {
        let key = key_of(MTLS_CONFIG, rule, &values);
        assert!(
            stack.redis.exists(&key),
            "{rule} {values:?}: {key} in Redis\n{}",
            stack.logs()
        );
    }
    // Without a client certificate the peer attributes are absent: only by-sni applies.
    assert_eq!(get(None, 4), [200; 4]);
    assert!(stack
        .redis
        .exists(&key_of(MTLS_CONFIG, "by-sni", &["tollgate.test"])));
}

// ---- hosts ----

const HOSTS_CONFIG: &str = r#"{ "backend": { "timeout_ms": 2000 },
  "rules": [
    { "name": "api", "match": { "hosts": ["api.example.com"] },
      "rate": 1, "period_ms": 60000, "burst": 2 },
    { "name": "tenants", "match": { "hosts": ["*.tenant.example.com"] },
      "rate": 1, "period_ms": 60000, "burst": 1 },
    { "name": "loopback-v6", "match": { "hosts": ["[::1]"] },
      "rate": 1, "period_ms": 60000, "burst": 3 } ] }"#;

/// `match.hosts` compares `:authority` without its port, case-insensitively; `*.` matches any
/// subdomain but not the domain itself.
#[test]
fn hosts_scope_rules() {
    let stack = Stack::start("identity-hosts", HOSTS_CONFIG);
    let host = |h: &str| stack.raw_get(LOCALHOST, "/x", &[("host", h)]).status;
    assert_eq!(host("api.example.com"), 200, "{}", stack.logs());
    assert_eq!(host("API.Example.COM:8080"), 200);
    assert_eq!(
        host("api.example.com:443"),
        429,
        "one bucket, with or without port"
    );
    assert_eq!(host("a.tenant.example.com"), 200);
    assert_eq!(host("B.x.tenant.example.com:8443"), 429);
    // An IPv6 literal in any spelling is the one host: three tokens, then denied.
    let v6: Vec<u16> = ["[::1]:80", "[0:0::1]", "[::0001]:8080", "[0:0:0:0:0:0:0:1]"]
        .iter()
        .map(|h| host(h))
        .collect();
    assert_eq!(v6, [200, 200, 200, 429], "{}", stack.logs());
    for other in [
        "tenant.example.com",
        "example.com",
        "api.example.com.evil.test",
        "xapi.example.com",
    ] {
        assert_eq!(
            (0..3).map(|_| host(other)).collect::<Vec<_>>(),
            [200; 3],
            "{other} is in no rule"
        );
    }
}

// ---- overrides ----

const TENANT_CONFIG: &str = r#"{ "backend": { "timeout_ms": 2000 },
  "rules": [
    { "name": "per-tenant", "key": ["header:x-tenant"], "rate": 1, "period_ms": 60000, "burst": 2,
      "overrides": [ { "key": ["acme"], "rate": 1, "burst": 5 },
                     { "key": ["internal"], "unlimited": true } ] } ] }"#;

/// A default tenant, a tenant with higher limits and an unlimited one, side by side: each gets its
/// own limits; the unlimited one makes no backend call but is still counted as allowed.
#[test]
fn overrides_and_unlimited_next_to_the_default() {
    let stack = Stack::start("identity-overrides", TENANT_CONFIG);
    let tenant = |t: &str, n: usize| statuses(&stack, n, "/x", &[("x-tenant", t)]);
    assert_eq!(tenant("t1", 3), [200, 200, 429], "{}", stack.logs());
    assert_eq!(tenant("acme", 6), [200, 200, 200, 200, 200, 429]);
    let calls = stack.redis.script_calls();
    assert_eq!(tenant("internal", 20), [200; 20]);
    assert_eq!(
        stack.redis.script_calls(),
        calls,
        "unlimited: no backend call"
    );
    assert!(!stack
        .redis
        .exists(&key_of(TENANT_CONFIG, "per-tenant", &["internal"])));
    // The override changed acme's limits, not its bucket: the key is the plain digest.
    assert!(stack
        .redis
        .exists(&key_of(TENANT_CONFIG, "per-tenant", &["acme"])));
    let stat = |stats: &str, m: &str| {
        common::envoy::stat_in(stats, &format!("wasmcustom.tollgate.per-tenant.{m}"))
    };
    let want = (Some(2 + 5 + 20), Some(2));
    let stats = stack
        .envoy
        .stats_when(|s| (stat(s, "allowed"), stat(s, "denied")) == want);
    assert_eq!(stat(&stats, "allowed"), want.0);
    assert_eq!(stat(&stats, "denied"), want.1);
}
