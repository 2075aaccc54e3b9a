//! Tiers through a real Envoy 1.40: a JWT's `plan` claim, verified by Envoy's `jwt_authn` and
//! written to dynamic metadata, picks the limits of the caller's bucket (keyed on `sub`), in
//! exact and in lease mode; a change of plan keeps the bucket's state; a tier source the client
//! writes is refused at load unless the configuration says it is trusted. The rates are a few
//! tokens an hour, so nothing refills while a test runs: every count is exact.
//! Needs `make setup` (Envoy, Redis, Webdis, openssl) and `make build`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::net::{IpAddr, Ipv4Addr};

use common::http::Resp;
use common::jwt::Jwt;
use common::{Envoy, Stack};
use tollgate_core::config::Config;
use tollgate_core::rule::bucket_key;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The issuer of the tests' tokens.
const ISSUER: &str = "tollgate-tiers-test";

/// One bucket per `sub`; the plan picks its limits: `free` 3 at once, `pro` 10 at once, any
/// other plan (or none) the rule's 1. Refills take 20 minutes a token or more. `{mode}` is
/// `exact` or `lease` (whose leases live 20 s here, so none expires while a test runs).
fn config(mode: &str) -> String {
    format!(
        r#"{{ "backend": {{ "timeout_ms": 2000 }},
  "rules": [
    {{ "name": "per-user", "key": ["metadata:envoy.filters.http.jwt_authn:payload.sub"],
      "rate": 1, "period_ms": 3600000, "burst": 1, "mode": "{mode}", "lease_horizon_ms": 10000,
      "tiers": {{ "from": "metadata:envoy.filters.http.jwt_authn:payload.plan",
                 "limits": {{ "free": {{ "rate": 3, "burst": 3 }},
                              "pro": {{ "rate": 10, "burst": 10 }} }} }} }} ] }}"#
    )
}

/// Envoy's `jwt_authn` filter for `jwt`'s tokens, writing the payload under `payload` (as Istio
/// does); a request without a valid token passes without claims.
fn jwt_filter(jwt: &Jwt) -> String {
    format!(
        r#"          - name: envoy.filters.http.jwt_authn
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
              providers:
                test:
                  issuer: {ISSUER}
                  local_jwks:
                    inline_string: '{}'
                  payload_in_metadata: payload
              rules:
              - match: {{ prefix: "/" }}
                requires:
                  requires_any:
                    requirements:
                    - provider_name: test
                    - allow_missing_or_failed: {{}}
"#,
        jwt.jwks
    )
}

/// Redis, Webdis and Envoy with `jwt_authn` before tollgate, and the key that signs the tokens.
fn start(name: &str, config: &str) -> (Stack, Jwt) {
    let dir = common::scratch_dir(&format!("{name}-jwt"));
    let jwt = Jwt::new(&dir, ISSUER);
    let filter = jwt_filter(&jwt);
    let stack = Stack::start_edited(name, config, |yaml, _| {
        let anchor = "          http_filters:\n";
        assert_eq!(yaml.matches(anchor).count(), 1);
        yaml.replace(anchor, &format!("{anchor}{filter}"))
    });
    (stack, jwt)
}

/// `n` requests with `token`'s bearer header: the answers.
fn send(stack: &Stack, token: &str, n: usize) -> Vec<Resp> {
    let bearer = format!("Bearer {token}");
    (0..n)
        .map(|_| stack.raw_get(LOCALHOST, "/api/x", &[("authorization", &bearer)]))
        .collect()
}

fn statuses(answers: &[Resp]) -> Vec<u16> {
    answers.iter().map(|r| r.status).collect()
}

/// `n` answers of 200 then one 429.
fn admits(n: usize) -> Vec<u16> {
    let mut v = vec![200; n];
    v.push(429);
    v
}

fn user_key(config: &str, sub: &str) -> String {
    let cfg = Config::try_from(config.as_bytes()).unwrap();
    bucket_key(
        &cfg.key_prefix,
        "per-user",
        &cfg.rules[0].key,
        &[sub.as_bytes().to_vec()],
    )
}

/// Each plan gets its tier's burst, and its admitted answers show the tier's policy; an unknown
/// plan, none, or a list of plans gets the rule's own limits (the list counted as ambiguous).
fn each_plan_gets_its_own_limits(mode: &str) {
    let config = config(mode);
    let (stack, jwt) = start(&format!("tiers-plans-{mode}"), &config);
    let token = |sub: &str, plan: Option<serde_json::Value>| {
        let mut claims = serde_json::json!({ "sub": sub });
        if let Some(p) = plan {
            claims["plan"] = p;
        }
        jwt.token(claims)
    };
    let free = send(&stack, &token("alice", Some("free".into())), 4);
    assert_eq!(statuses(&free), admits(3), "free\n{}", stack.logs());
    let pro = send(&stack, &token("bob", Some("pro".into())), 11);
    assert_eq!(statuses(&pro), admits(10), "pro\n{}", stack.logs());
    // The policy is the tier's: q = its burst, w = the seconds a whole burst takes to refill.
    assert_eq!(
        free[0].header("ratelimit-policy"),
        Some("\"per-user\";q=3;w=3600")
    );
    assert_eq!(
        pro[0].header("ratelimit-policy"),
        Some("\"per-user\";q=10;w=3600")
    );
    assert_eq!(
        pro[10].header("ratelimit-policy"),
        Some("\"per-user\";q=10;w=3600"),
        "the denial too"
    );
    for (sub, plan) in [
        ("carol", Some(serde_json::json!("enterprise"))),
        ("dave", None),
        ("erin", Some(serde_json::json!(["pro"]))),
        ("frank", Some(serde_json::json!("PRO"))),
    ] {
        let answers = send(&stack, &token(sub, plan.clone()), 2);
        assert_eq!(statuses(&answers), admits(1), "{sub} {plan:?}");
        assert_eq!(
            answers[0].header("ratelimit-policy"),
            Some("\"per-user\";q=1;w=3600")
        );
    }
    // A client that sends a plan header of its own changes nothing.
    let bearer = format!("Bearer {}", token("gina", Some("free".into())));
    let answers: Vec<u16> = (0..4)
        .map(|_| {
            stack
                .raw_get(
                    LOCALHOST,
                    "/api/x",
                    &[("authorization", &bearer), ("x-plan", "pro")],
                )
                .status
        })
        .collect();
    assert_eq!(answers, admits(3));
    for sub in ["alice", "bob", "carol", "dave", "erin", "frank", "gina"] {
        assert!(
            stack.redis.exists(&user_key(&config, sub)),
            "{sub}'s bucket, keyed on sub alone"
        );
    }
    let ambiguous = stack
        .envoy
        .stat_eventually("wasmcustom.tollgate.per-user.ambiguous", |v| v == Some(2));
    assert_eq!(ambiguous, Some(2), "erin's list of plans, twice");
}

#[test]
fn each_plan_gets_its_own_limits_exact() {
    each_plan_gets_its_own_limits("exact");
}

#[test]
fn each_plan_gets_its_own_limits_lease() {
    each_plan_gets_its_own_limits("lease");
}

/// A new token with another plan for the same `sub` is the same bucket under new limits: an
/// upgrade gets what the bucket holds (not a fresh burst) and refills to the new burst; a
/// downgrade holds at most the new burst at once.
#[test]
fn a_change_of_plan_keeps_the_bucket() {
    let config = config("exact");
    let (stack, jwt) = start("tiers-plan-change", &config);
    let token = |sub: &str, plan: &str| jwt.token(serde_json::json!({ "sub": sub, "plan": plan }));
    // Upgrade: 2 of free's 3 spent; the pro token gets the 1 left, then 429.
    assert_eq!(
        statuses(&send(&stack, &token("hana", "free"), 2)),
        [200, 200]
    );
    let upgraded = send(&stack, &token("hana", "pro"), 2);
    assert_eq!(statuses(&upgraded), admits(1), "{}", stack.logs());
    assert_eq!(
        upgraded[0].header("ratelimit-policy"),
        Some("\"per-user\";q=10;w=3600")
    );
    // Nothing left: what the free plan left was all it got.
    let left = upgraded[0].header("ratelimit").unwrap_or_default();
    assert!(left.starts_with("\"per-user\";r=0;"), "{left}");
    // Downgrade: 4 of pro's 10 spent, 6 left; free holds at most 3.
    assert_eq!(statuses(&send(&stack, &token("ivan", "pro"), 4)), [200; 4]);
    let downgraded = send(&stack, &token("ivan", "free"), 4);
    assert_eq!(statuses(&downgraded), admits(3), "{}", stack.logs());
    // Back to pro: what free left (nothing), not 6.
    assert_eq!(statuses(&send(&stack, &token("ivan", "pro"), 1)), [429]);
    for sub in ["hana", "ivan"] {
        assert!(stack.redis.exists(&user_key(&config, sub)));
    }
}

/// A tier from a header the client writes is refused when Envoy loads the filter; with
/// `"trusted": true` it loads, and the header picks the tier.
#[test]
fn a_client_controlled_tier_source_needs_trusted() {
    let tiered = |trusted: &str| {
        format!(
            r#"{{ "backend": {{ "timeout_ms": 2000 }},
  "rules": [ {{ "name": "per-key", "key": ["header:x-api-key"],
    "rate": 1, "period_ms": 3600000, "burst": 1,
    "tiers": {{ "from": "header:x-plan", {trusted}
               "limits": {{ "pro": {{ "rate": 10, "burst": 5 }} }} }} }} ] }}"#
        )
    };
    let dir = common::scratch_dir("tiers-untrusted");
    let log = match Envoy::try_start(&dir, &tiered(""), common::free_port()) {
        Ok(_) => panic!("Envoy loaded a tier source the client writes"),
        Err(log) => log,
    };
    assert!(
        log.contains(
            "tollgate: bad configuration: rules[0].tiers.from: \"header:x-plan\" cannot pick a \
             tier: a request header is written by the client, so a client could pick its own."
        ),
        "{}",
        common::envoy::brief_log(&log)
    );
    let stack = Stack::start("tiers-trusted-header", &tiered(r#""trusted": true,"#));
    let get = |key: &str, plan: &[(&str, &str)]| -> u16 {
        let mut headers = vec![("x-api-key", key)];
        headers.extend_from_slice(plan);
        stack.raw_get(LOCALHOST, "/api/x", &headers).status
    };
    let pro: Vec<u16> = (0..6).map(|_| get("k1", &[("x-plan", "pro")])).collect();
    assert_eq!(pro, admits(5), "{}", stack.logs());
    // Named twice: the rule's limits, never a higher tier.
    let twice: Vec<u16> = (0..2)
        .map(|_| get("k2", &[("x-plan", "pro"), ("x-plan", "pro")]))
        .collect();
    assert_eq!(twice, admits(1));
}

/// Usage settled under one tier reaches the bucket through a call of another: a `pro` request
/// reports 150 tokens of usage (149 above its up-front cost, pending on this proxy), then a `free`
/// request of the same `sub` carries that charge. Redis refuses a settlement above 4 bursts of the
/// call's limits, so the `free` call may carry only 12 of it: it does, and is refused (the charge
/// put the bucket in debt), instead of failing and being admitted by the failure mode.
#[test]
fn a_pro_charge_carried_by_a_free_call_is_applied_not_refused_by_redis() {
    let config = r#"{ "backend": { "timeout_ms": 2000 },
  "rules": [
    { "name": "per-user", "match": { "path_prefix": "/app/" },
      "key": ["metadata:envoy.filters.http.jwt_authn:payload.sub"],
      "rate": 1, "period_ms": 3600000, "burst": 1,
      "usage": { "header": "x-usage-tokens", "flush_ms": 10000 },
      "tiers": { "from": "metadata:envoy.filters.http.jwt_authn:payload.plan",
                 "limits": { "free": { "rate": 3, "burst": 3 },
                             "pro": { "rate": 200, "burst": 200 } } } } ] }"#;
    // The application reports the usage the request asks for (`x-use: N`), else 1.
    let app = common::upstream::Upstream::start_with(|head| {
        let head = head.to_ascii_lowercase();
        let used = head
            .split("\r\n")
            .find_map(|l| l.strip_prefix("x-use: "))
            .unwrap_or("1")
            .trim()
            .to_string();
        vec![format!(
            "HTTP/1.1 200 OK\r\nx-usage-tokens: {used}\r\ncontent-length: 4\r\nconnection: close\r\n\r\napp\n"
        )
        .into_bytes()]
    });
    let dir = common::scratch_dir("tiers-settle-jwt");
    let jwt = Jwt::new(&dir, ISSUER);
    let filter = jwt_filter(&jwt);
    let app_port = app.port;
    let stack = Stack::start_edited("tiers-settle", config, |yaml, _| {
        let anchor = "          http_filters:\n";
        let upstream = format!("port_value: {}\n", common::envoy::NO_UPSTREAM);
        assert_eq!(yaml.matches(&upstream).count(), 1);
        yaml.replace(anchor, &format!("{anchor}{filter}"))
            .replace(&upstream, &format!("port_value: {app_port}\n"))
    });
    let token = |plan: &str| jwt.token(serde_json::json!({ "sub": "ivan", "plan": plan }));
    let get = |plan: &str, used: &str| {
        let bearer = format!("Bearer {}", token(plan));
        stack
            .raw_get(
                LOCALHOST,
                "/app/x",
                &[("authorization", &bearer), ("x-use", used)],
            )
            .status
    };
    assert_eq!(get("pro", "150"), 200, "{}", stack.logs());
    assert_eq!(app.hits(), 1);
    let charged = stack
        .envoy
        .stat_eventually("wasmcustom.tollgate.per-user.usage_charged", |v| {
            v == Some(149)
        });
    assert_eq!(charged, Some(149));
    let free = get("free", "1");
    eprintln!("after a pro request that used 150, a free request: {free}");
    assert_eq!(
        free,
        429,
        "the free call carries 12 of the charge and is refused\n{}",
        stack.logs()
    );
    assert_eq!(
        app.hits(),
        1,
        "the free request never reached the application"
    );
    assert!(
        !stack.envoy.log_text().contains("bad argument settle"),
        "{}",
        stack.logs()
    );
}
