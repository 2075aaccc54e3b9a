//! The documented path to a Redis that requires TLS and an ACL user, run end to end:
//! tollgate.wasm in Envoy → Webdis (envoy/redis-cluster/webdis.json) → Envoy `redis_proxy`
//! (envoy/redis-tls/envoy.yaml) → a real `redis-server` listening on TLS only. The certificates are
//! made in the test with `openssl`; the ACL user is created with the `ACL SETUSER` line of
//! docs/deploy/redis.md, read from the page. Right credentials and certificate: the script runs in
//! exact and lease mode, each key admits its burst then 429, the bucket is in Redis (read by the
//! operator), and the ACL user is refused any other command or key. A wrong password, a certificate from a CA the front does not
//! trust, or one the trusted CA issued for another name: nothing reaches Redis, the filter applies
//! its failure mode (`closed`: 503) and counts the class the docs give (`auth`; `unreachable` for
//! the handshake). Needs `make setup` and `make build`; `--nocapture` prints what each case saw.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::path::Path;

use common::envoy::brief_log;
use common::redis_cluster::webdis_post;
use common::redis_tls::{
    documented_acl, documented_cluster_acl, start_tls_cluster_front, start_webdis, Ca, FrontOpts,
    ServerCert, TlsChain, TlsCluster, TlsRedis,
};
use common::{scratch_dir, wait_until, Envoy};
use std::time::Duration;

/// The name the front uses for Redis: address, SNI and the name its certificate must carry. It
/// must resolve to 127.0.0.1 here; a deployment puts its Redis' DNS name.
const HOST: &str = "localhost";
const PASSWORD: &str = "tollgate-acl-s3cret";
const BURST: usize = 3;

/// Two rules, keyed on `x-user-id`, 1 token a minute (no refill during the test), burst 3: `/api/`
/// in exact mode, `/lease/` in lease mode (the script's lease path uses more commands). A backend
/// failure answers 503.
fn config() -> String {
    format!(
        r#"{{ "backend": {{ "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 2000 }},
             "failure_mode": "closed",
             "rules": [
               {{ "name": "per-user", "match": {{ "path_prefix": "/api/" }},
                  "key": ["header:x-user-id"], "mode": "exact",
                  "rate": 1, "period_ms": 60000, "burst": {BURST} }},
               {{ "name": "leased", "match": {{ "path_prefix": "/lease/" }},
                  "key": ["header:x-user-id"], "mode": "lease",
                  "rate": 1, "period_ms": 60000, "burst": {BURST} }} ] }}"#
    )
}

/// The bucket key of `user` under `rule` (both rules key on `x-user-id`).
fn key_of(rule: &str, user: &str) -> String {
    tollgate_core::rule::bucket_key(
        "tollgate",
        rule,
        &[tollgate_core::config::KeySource::Header("x-user-id".into())],
        &[user.as_bytes().to_vec()],
    )
}

/// A TLS Redis serving `cert`, with the documented ACL user; (Redis, user name).
fn redis_with_acl_user(dir: &Path, cert: &ServerCert, ca: &Ca) -> (TlsRedis, String) {
    let redis = TlsRedis::start(dir, cert, ca);
    let (user, acl) = documented_acl(PASSWORD);
    let acl: Vec<&str> = acl.iter().map(String::as_str).collect();
    let out = redis.admin(&acl);
    assert_eq!(out.trim(), "OK", "{acl:?}");
    (redis, user)
}

/// tollgate's Envoy on Webdis of `chain`.
fn tollgate(dir: &Path, chain: &TlsChain) -> Envoy {
    Envoy::start(dir, &config(), chain.webdis.port)
}

fn statuses(envoy: &Envoy, path: &str, user: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| envoy.get(path, &[("x-user-id", user)]).status)
        .collect()
}

fn burst_then_429(n: usize) -> Vec<u16> {
    (0..n).map(|i| if i < BURST { 200 } else { 429 }).collect()
}

#[test]
fn tls_and_acl_user_burst_then_429_and_bucket_in_redis() {
    let dir = scratch_dir("redis-tls");
    let ca = Ca::new(&dir, "ca");
    let cert = ca.issue("redis", HOST);
    let (redis, user) = redis_with_acl_user(&dir, &cert, &ca);
    let chain = TlsChain::start(
        &dir,
        &FrontOpts {
            host: HOST,
            redis_port: redis.port,
            ca_file: &ca.cert,
            username: &user,
            password: PASSWORD,
        },
    );
    // The chain answers a one-key script as the ACL user before the proxy starts.
    let through = wait_until(Duration::from_secs(10), || {
        matches!(webdis_post(chain.webdis.port, "EVAL/return 1/1/tollgate:{ready}"),
                 Ok((200, body)) if body.contains(":1}"))
    });
    assert!(through, "chain not answering\n{}", chain.logs());
    // The page's check of the chain.
    let check = chain
        .webdis
        .try_get("/EVAL/return%201/1/tollgate:check")
        .unwrap();
    assert_eq!(
        (check.status, check.body.as_str()),
        (200, r#"{"EVAL":1}"#),
        "docs/deploy/redis.md's check"
    );
    let envoy = tollgate(&dir, &chain);
    let logs = || {
        format!(
            "{}\n--- tollgate envoy ---\n{}\n--- redis ---\n{}",
            chain.logs(),
            brief_log(&envoy.log_text()),
            redis.log_text()
        )
    };

    let exact = statuses(&envoy, "/api/x", "alice", 2 * BURST);
    let lease = statuses(&envoy, "/lease/x", "alice", 2 * BURST);
    let other = statuses(&envoy, "/api/x", "bob", 2 * BURST);
    eprintln!("exact alice {exact:?}, lease alice {lease:?}, exact bob {other:?}");
    assert_eq!(exact, burst_then_429(2 * BURST), "{}", logs());
    assert_eq!(lease, burst_then_429(2 * BURST), "{}", logs());
    assert_eq!(other, burst_then_429(2 * BURST), "{}", logs());

    // The buckets are in Redis, read by the operator over TLS.
    for (rule, who) in [
        ("per-user", "alice"),
        ("leased", "alice"),
        ("per-user", "bob"),
    ] {
        let key = key_of(rule, who);
        let hash = redis.admin(&["HGETALL", &key]);
        eprintln!(
            "{key}: {}",
            hash.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        assert!(
            hash.lines().any(|l| l == "u") && hash.lines().any(|l| l == "t"),
            "bucket {key} not in Redis: {hash:?}\n{}",
            logs()
        );
    }
    // The ACL user runs only the script's commands, on keys under `tollgate:` only.
    let key = key_of("per-user", "alice");
    for refused in [
        vec!["GET", key.as_str()],
        vec!["HGETALL", "other:{per-user:x}"],
        vec!["KEYS", "*"],
        vec!["FLUSHALL"],
        vec![
            "EVAL",
            "return redis.call('SET', KEYS[1], 1)",
            "1",
            key.as_str(),
        ],
    ] {
        let out = redis.cli_as(&user, PASSWORD, &refused);
        eprintln!("as {user}: {refused:?} -> {}", out.trim());
        assert!(
            out.contains("NOPERM") || out.contains("can't run this command"),
            "{refused:?}: {out}"
        );
    }
    // The front's connections are the ACL user's.
    let clients = redis.admin(&["CLIENT", "LIST"]);
    assert!(
        clients
            .lines()
            .any(|l| l.contains(&format!(" user={user} "))),
        "no connection as {user}: {clients}"
    );
    // TLS only: a plain-text client gets no answer from the port.
    let plain = redis::Client::open(format!("redis://127.0.0.1:{}/", redis.port))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    assert!(plain.is_err(), "plain text answered: {plain:?}");
    assert_eq!(
        envoy.stat_value("wasmcustom.tollgate.per-user.backend_errors"),
        Some(0),
        "{}",
        logs()
    );
}

/// One failing chain: what tollgate's proxy answered, its error counters by class, its log.
struct Failure {
    statuses: Vec<u16>,
    auth: u64,
    unreachable: u64,
    log: String,
}

/// Six requests of one user through a chain started with `opts`; the filter's view of them, once
/// its counters show a failed call.
fn fail_through(dir: &Path, opts: &FrontOpts) -> (Failure, TlsChain) {
    let chain = TlsChain::start(dir, opts);
    let envoy = tollgate(dir, &chain);
    let statuses = statuses(&envoy, "/api/x", "mallory", 6);
    // The counters reach the stats up to a second later (polled); none come if nothing failed.
    envoy.stat_eventually("wasmcustom.tollgate.per-user.backend_errors", |v| {
        v.unwrap_or(0) >= 1
    });
    let class = |c: &str| {
        envoy
            .stat_value(&format!("wasmcustom.tollgate.per-user.backend_error.{c}"))
            .unwrap_or(0)
    };
    let failure = Failure {
        statuses,
        auth: class("auth"),
        unreachable: class("unreachable"),
        log: envoy.log_text(),
    };
    (failure, chain)
}

/// The log lines of tollgate's backend errors and its breaker.
fn backend_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("tollgate: backend"))
        .collect()
}

#[test]
fn wrong_password_gives_the_failure_mode_and_the_auth_class() {
    let dir = scratch_dir("redis-tls-auth");
    let ca = Ca::new(&dir, "ca");
    let cert = ca.issue("redis", HOST);
    let (redis, user) = redis_with_acl_user(&dir, &cert, &ca);
    let (failure, chain) = fail_through(
        &dir,
        &FrontOpts {
            host: HOST,
            redis_port: redis.port,
            ca_file: &ca.cert,
            username: &user,
            password: "not-the-password",
        },
    );
    let lines = backend_lines(&failure.log);
    eprintln!(
        "wrong password: statuses {:?}, backend_error.auth {}, backend_error.unreachable {}\n{}",
        failure.statuses,
        failure.auth,
        failure.unreachable,
        lines.join("\n")
    );
    assert_eq!(failure.statuses, vec![503; 6], "{}", chain.logs());
    assert!(failure.auth >= 1, "{}", failure.log);
    assert_eq!(failure.unreachable, 0);
    // NOAUTH, or, for a call of more than 10 arguments, Redis' `ERR Protocol error: unauthenticated
    // multibulk length` (and it closes the connection): both are the auth class.
    assert!(
        lines
            .iter()
            .any(|l| l.contains("backend error (auth): Redis error: ")),
        "{lines:#?}"
    );
    let acl_log = redis.admin(&["ACL", "LOG"]);
    assert!(
        acl_log.contains("auth") && acl_log.contains(&user),
        "Redis' ACL LOG records the failed AUTH: {acl_log}"
    );
    // An auth error says the backend cannot serve: the breaker opens after 5 (the default).
    assert!(
        lines
            .iter()
            .any(|l| l.contains("circuit open after 5 consecutive failures")),
        "{lines:#?}"
    );
    assert_eq!(
        redis.admin(&["DBSIZE"]).trim(),
        "0",
        "nothing reached Redis"
    );
}

#[test]
fn untrusted_certificate_gives_the_failure_mode_and_the_unreachable_class() {
    let dir = scratch_dir("redis-tls-cert");
    let ca = Ca::new(&dir, "ca");
    let other_ca = Ca::new(&dir, "other-ca");
    // Two Redis: one whose certificate another CA signed, one whose certificate the trusted CA
    // signed for another name. The front trusts `ca` and expects HOST in either case.
    let foreign = other_ca.issue("redis-foreign", HOST);
    let misnamed = ca.issue("redis-misnamed", "redis.elsewhere.internal");
    for (case, cert, stat) in [
        (
            "untrusted CA",
            &foreign,
            "cluster.redis.ssl.fail_verify_error",
        ),
        (
            "another name",
            &misnamed,
            "cluster.redis.ssl.fail_verify_san",
        ),
    ] {
        let signer = if case == "untrusted CA" {
            &other_ca
        } else {
            &ca
        };
        let case_dir = dir.join(stat);
        std::fs::create_dir_all(&case_dir).unwrap();
        let (redis, user) = redis_with_acl_user(&case_dir, cert, signer);
        let (failure, chain) = fail_through(
            &case_dir,
            &FrontOpts {
                host: HOST,
                redis_port: redis.port,
                ca_file: &ca.cert,
                username: &user,
                password: PASSWORD,
            },
        );
        let refused = chain.front_stat(stat);
        let lines = backend_lines(&failure.log);
        eprintln!(
            "{case}: statuses {:?}, backend_error.unreachable {}, backend_error.auth {}, \
             front {stat} {refused}\n{}",
            failure.statuses,
            failure.unreachable,
            failure.auth,
            lines.join("\n")
        );
        assert_eq!(failure.statuses, vec![503; 6], "{case}\n{}", chain.logs());
        assert!(failure.unreachable >= 1, "{case}\n{}", failure.log);
        assert_eq!(failure.auth, 0, "{case}");
        assert!(refused >= 1, "{case}: {stat} = {refused}\n{}", chain.logs());
        assert!(
            lines
                .iter()
                .any(|l| l.contains("backend error (unreachable): Redis error: upstream failure")),
            "{case}: {lines:#?}"
        );
        // The front answers each call with an error at once: an error reply, which does not count
        // toward the breaker (the calls go on, each refused the same way).
        assert!(
            !lines.iter().any(|l| l.contains("circuit open")),
            "{case}: {lines:#?}"
        );
        assert_eq!(
            redis.admin(&["DBSIZE"]).trim(),
            "0",
            "{case}: nothing reached Redis"
        );
    }
}

/// The same blocks on envoy/redis-cluster/envoy.yaml in front of a 3-master Redis Cluster over TLS,
/// the ACL user made with both lines of docs/deploy/redis.md (the front asks `CLUSTER SLOTS` as that
/// user): each key admits its burst then 429, and the keys spread over the masters.
#[test]
fn redis_cluster_over_tls_with_the_documented_acl() {
    let dir = scratch_dir("redis-tls-cluster");
    let ca = Ca::new(&dir, "ca");
    let cert = ca.issue("redis", HOST);
    let cluster = TlsCluster::start(&dir, 3, &cert, &ca);
    let (user, acl) = documented_acl(PASSWORD);
    let extra = documented_cluster_acl();
    for node in &cluster.nodes {
        for line in std::iter::once(&acl).chain(&extra) {
            let line: Vec<&str> = line.iter().map(String::as_str).collect();
            assert_eq!(node.admin(&line).trim(), "OK", "{line:?}");
        }
    }
    let front = start_tls_cluster_front(&dir, &cluster, HOST, &ca.cert, (&user, PASSWORD));
    let webdis = start_webdis(&dir, front.listen_port);
    let envoy = Envoy::start(&dir, &config(), webdis.port);
    let logs = || {
        format!(
            "--- webdis ---\n{}\n--- front ---\n{}\n--- tollgate envoy ---\n{}\n{}",
            webdis.log_text(),
            brief_log(&front.log_text()),
            brief_log(&envoy.log_text()),
            cluster.logs()
        )
    };
    let users: Vec<String> = (0..12).map(|i| format!("user-{i:02}")).collect();
    for u in &users {
        let got = statuses(&envoy, "/api/x", u, 2 * BURST);
        assert_eq!(got, burst_then_429(2 * BURST), "{u}\n{}", logs());
    }
    let per_node: Vec<usize> = cluster
        .nodes
        .iter()
        .map(|n| {
            n.admin(&["KEYS", "tollgate:{per-user:*"])
                .lines()
                .filter(|l| !l.trim().is_empty())
                .count()
        })
        .collect();
    eprintln!(
        "TLS cluster {:?}: 12 users each [200, 200, 200, 429, 429, 429]; keys per master {per_node:?}; \
         front ssl.handshake {}",
        cluster.ports(),
        front.stat_value("cluster.redis_cluster.ssl.handshake").unwrap_or(0)
    );
    assert_eq!(per_node.iter().sum::<usize>(), users.len(), "{}", logs());
    assert!(
        per_node.iter().filter(|&&k| k > 0).count() >= 2,
        "keys on one master only: {per_node:?}"
    );
}
