//! The `tollgate` command as an operator runs it: the built binary against real redis-server
//! (standalone, the 3-master Cluster, an ACL user, TLS with certificates made here by openssl),
//! each command's output and each bad input's message.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::Path;
use std::process::Command;

use tollgate_core::backend::script;
use tollgate_core::config::KeySource;
use tollgate_core::rule::bucket_key;
use tollgate_e2e::redis_cluster::RedisCluster;
use tollgate_e2e::redis_tls::Ca;
use tollgate_e2e::{free_port, repo_root, scratch_dir, Redis};

/// Three rules: per-user (exact, 10 per minute), per-client (lease, client_ip /24), bulk (cost
/// header, waits up to 2 s).
const CONFIG: &str = r#"{
  "backend": {"cluster": "webdis", "timeout_ms": 25},
  "rules": [
    {"name": "per-user", "match": {"path_prefix": "/api/", "hosts": ["api.example.com"]},
     "key": ["metadata:envoy.filters.http.jwt_authn:payload.sub"],
     "rate": 10, "period_ms": 60000, "burst": 10},
    {"name": "per-client", "key": ["client_ip:v4=/24"], "rate": 100, "period_ms": 1000,
     "burst": 100, "mode": "lease"},
    {"name": "bulk", "match": {"methods": ["POST"]}, "key": ["header:x-tenant", "literal:bulk"],
     "rate": 5, "period_ms": 1000, "burst": 20, "cost_header": "x-cost", "max_wait_ms": 2000}
  ]
}"#;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn tollgate(args: &[&str]) -> Out {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .env_remove("TOLLGATE_REDIS")
        .output()
        .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `args` and returns stdout; the command must succeed.
fn ok(args: &[&str]) -> String {
    let out = tollgate(args);
    assert_eq!(out.code, 0, "{args:?}: {}{}", out.stdout, out.stderr);
    out.stdout
}

/// Runs `args`, which must fail with exit status 1 and `message` on stderr.
fn fails(args: &[&str], message: &str) {
    let out = tollgate(args);
    assert_eq!(out.code, 1, "{args:?}: {}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains(message),
        "{args:?}: want {message:?} in {}",
        out.stderr
    );
}

fn config_file(dir: &Path) -> String {
    let path = dir.join("tollgate.json");
    std::fs::write(&path, CONFIG).unwrap();
    path.to_str().unwrap().to_string()
}

/// The per-user bucket of `sub`, computed by the core itself.
fn user_key(sub: &str) -> String {
    let source = KeySource::Metadata {
        namespace: "envoy.filters.http.jwt_authn".into(),
        fields: vec!["payload".into(), "sub".into()],
    };
    bucket_key("tollgate", "per-user", &[source], &[sub])
}

/// One script call as the filter makes it (EVAL of the shipped script, Redis' clock).
fn script(conn: &mut dyn redis::ConnectionLike, key: &str, args: &[&str]) -> Vec<i64> {
    redis::cmd("EVAL")
        .arg(script::SOURCE)
        .arg(1)
        .arg(key)
        .arg(args)
        .query(conn)
        .unwrap()
}

#[test]
fn check_summarises_each_rule_and_refuses_with_the_filters_message() {
    let dir = scratch_dir("cli-check");
    let config = config_file(&dir);
    let out = ok(&["check", &config]);
    assert!(
        out.starts_with(&format!(
            "ok: {config} (JSON configuration), for tollgate.wasm\n"
        )),
        "{out}"
    );
    for line in [
        "  per-user: 10 per minute, burst 10, key: JWT sub (metadata:envoy.filters.http.jwt_authn:payload.sub), exact mode, applies to paths under /api/ on api.example.com",
        "  per-client: 100 per second, burst 100, key: client address (client_ip:v4=/24), lease mode, applies to every request",
        "  bulk: 5 per second, burst 20, key: header x-tenant + the fixed value \"bulk\" (one bucket for all), exact mode, applies to methods POST",
        "      cost raised by header x-cost; waits up to 2 s for tokens",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
    // The shipped manifests: Istio's pluginConfig, Higress' defaultConfig (for its own artifact).
    let root = repo_root();
    for (file, origin) in [
        (
            "envoy/istio/wasmplugin.yaml",
            "(Istio WasmPlugin, spec.pluginConfig), for tollgate.wasm",
        ),
        (
            "envoy/istio/trafficextension.yaml",
            "(Istio TrafficExtension, spec.wasm.pluginConfig), for tollgate.wasm",
        ),
        (
            "envoy/higress/wasmplugin.yaml",
            "(Higress WasmPlugin, spec.defaultConfig), for tollgate-higress.wasm",
        ),
    ] {
        let path = root.join(file);
        let out = ok(&["check", path.to_str().unwrap()]);
        assert!(out.lines().next().unwrap().ends_with(origin), "{out}");
    }
    // An Envoy bootstrap: its Wasm filter's configuration (tollgate's, by root_id, beside
    // another Wasm filter).
    let bootstrap = |filters: &str| {
        format!(
            "static_resources:
  listeners:
  - filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          http_filters:
{filters}          - name: envoy.filters.http.router
  clusters:
  - name: app
"
        )
    };
    let envoy_yaml = dir.join("envoy.yaml");
    let tollgate_json = r#"{"rules":[{"name":"all","key":[],"rate":5,"burst":5}]}"#;
    std::fs::write(
        &envoy_yaml,
        bootstrap(&[wasm("other", "{}"), wasm("tollgate", tollgate_json)].concat()),
    )
    .unwrap();
    let out = ok(&["check", envoy_yaml.to_str().unwrap()]);
    assert!(
        out.contains("(Envoy bootstrap, the Wasm filter's configuration), for tollgate.wasm\n")
            && out.contains("  all: 5 per second, burst 5, key: none (one bucket for all)"),
        "{out}"
    );
    // The backend cluster the configuration names is not in the bootstrap: said, not refused.
    assert!(
        out.contains(
            "warning: the bootstrap has no static cluster \"tollgate_backend\" (backend.cluster; \
             its clusters: app): unless CDS adds it, every check fails into the failure mode"
        ),
        "{out}"
    );
    let with_backend =
        std::fs::read_to_string(&envoy_yaml).unwrap() + "  - name: tollgate_backend\n";
    std::fs::write(&envoy_yaml, with_backend).unwrap();
    let out = ok(&["check", envoy_yaml.to_str().unwrap()]);
    assert!(!out.contains("warning"), "{out}");
    // The shipped bootstrap the docs send newcomers to.
    let compose = repo_root().join("deploy/compose/envoy.yaml");
    let out = ok(&["check", compose.to_str().unwrap()]);
    assert!(
        out.contains("(Envoy bootstrap, the Wasm filter's configuration)")
            && !out.contains("warning"),
        "{out}"
    );
    // The same filter on two listeners' chains (the same configuration) is one configuration.
    std::fs::write(
        &envoy_yaml,
        bootstrap(
            &[
                wasm("tollgate", tollgate_json),
                wasm("tollgate", tollgate_json),
            ]
            .concat(),
        ),
    )
    .unwrap();
    ok(&["check", envoy_yaml.to_str().unwrap()]);
    // A bootstrap in JSON.
    let envoy_json = dir.join("envoy.json");
    let doc: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&envoy_yaml).unwrap()).unwrap();
    std::fs::write(&envoy_json, doc.to_string()).unwrap();
    let out = ok(&["check", envoy_json.to_str().unwrap()]);
    assert!(
        out.contains("(Envoy bootstrap, the Wasm filter's configuration)"),
        "{out}"
    );
    std::fs::write(
        &envoy_yaml,
        bootstrap(&[wasm("a", "{}"), wasm("b", "{}")].concat()),
    )
    .unwrap();
    fails(
        &["check", envoy_yaml.to_str().unwrap()],
        "an Envoy bootstrap with 2 static Wasm filters, none with root_id \"tollgate\"",
    );
    // tollgate delivered by ECDS: the bootstrap does not hold its configuration, and another
    // plugin's static Wasm filter beside it is not taken for it.
    let by_ecds = "          - name: tollgate
            config_discovery:
              config_source: {ads: {}}
              type_urls: [type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm]
";
    std::fs::write(&envoy_yaml, bootstrap(by_ecds)).unwrap();
    fails(
        &["check", envoy_yaml.to_str().unwrap()],
        "the Envoy bootstrap's Wasm filter comes by ECDS (an http_filters entry's \
         config_discovery), so the bootstrap does not hold its configuration",
    );
    std::fs::write(
        &envoy_yaml,
        bootstrap(&[wasm("other", tollgate_json).as_str(), by_ecds].concat()),
    )
    .unwrap();
    fails(
        &["check", envoy_yaml.to_str().unwrap()],
        "an Envoy bootstrap with 1 static Wasm filter and a Wasm filter delivered by ECDS \
         (config_discovery), none with root_id \"tollgate\"",
    );
    std::fs::write(
        &envoy_yaml,
        bootstrap(&[wasm("tollgate", tollgate_json).as_str(), by_ecds].concat()),
    )
    .unwrap();
    ok(&["check", envoy_yaml.to_str().unwrap()]);
    // A reader that stops early gets no panic: `tollgate check … | head -1`.
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", &config])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A rule without key says so.
    let keyless = dir.join("keyless.json");
    std::fs::write(
        &keyless,
        r#"{"backend":{"cluster":"w"},"rules":[{"name":"all","key":[],"rate":5,"period_ms":1000,"burst":5}]}"#,
    )
    .unwrap();
    let out = ok(&["check", keyless.to_str().unwrap()]);
    assert!(
        out.contains("  all: 5 per second, burst 5, key: none (one bucket for all), exact mode,"),
        "{out}"
    );
    // Refusals carry the filter's own line (what on_configure logs).
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"backend":{"cluster":"w"},"rules":[{"name":"a","key":["client_ip"],"rate":0,"period_ms":1000,"burst":1}]}"#).unwrap();
    fails(
        &["check", bad.to_str().unwrap()],
        "tollgate: bad configuration: rules[0].rate: ",
    );
    let err = tollgate_core::config::Config::parse(
        &std::fs::read(&bad).unwrap(),
        tollgate_core::config::Artifact::Envoy,
    )
    .unwrap_err();
    fails(
        &["check", bad.to_str().unwrap()],
        &format!("tollgate: bad configuration: {err}\n"),
    );
    // A Webdis backend field is refused for the Higress build, with the filter's message.
    let webdis = dir.join("webdis.json");
    let text = CONFIG.replace(
        r#""timeout_ms": 25"#,
        r#""timeout_ms": 25, "authority": "webdis""#,
    );
    std::fs::write(&webdis, &text).unwrap();
    let err = tollgate_core::config::Config::parse(
        text.as_bytes(),
        tollgate_core::config::Artifact::Higress,
    )
    .unwrap_err();
    fails(
        &["check", webdis.to_str().unwrap(), "--artifact", "higress"],
        &format!("tollgate: bad configuration: {err}\n"),
    );
    let other = dir.join("deployment.yaml");
    std::fs::write(&other, "apiVersion: apps/v1\nkind: Deployment\nspec: {}\n").unwrap();
    fails(
        &["check", other.to_str().unwrap()],
        "not a tollgate configuration: a YAML document of kind \"Deployment\"",
    );
    fails(
        &["check", dir.join("missing.json").to_str().unwrap()],
        "cannot read the configuration",
    );
}

/// An Envoy bootstrap: listener `ingress` whose HTTP connection manager has `http_filters` (each
/// entry indented by 10 spaces, the router added last), and static clusters of these names.
fn bootstrap_yaml(http_filters: &str, clusters: &[&str]) -> String {
    let clusters: String = clusters
        .iter()
        .map(|c| format!("  - name: {c}\n"))
        .collect();
    format!(
        "static_resources:
  listeners:
  - name: ingress
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          http_filters:
{http_filters}          - name: envoy.filters.http.router
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
{clusters}"
    )
}

/// A Wasm filter wrapped in a TypedStruct (`wrapper`), as Istio EnvoyFilters write it, whose
/// plugin configuration is `value` in a google.protobuf.StringValue.
fn typed_struct_wasm(wrapper: &str, root_id: &str, value: &str) -> String {
    format!(
        "          - name: envoy.filters.http.wasm
            typed_config:
              \"@type\": type.googleapis.com/{wrapper}
              type_url: type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              value:
                config:
                  root_id: {root_id}
                  vm_config:
                    runtime: envoy.wasm.runtime.v8
                    code: {{local: {{filename: /etc/tollgate/tollgate.wasm}}}}
                  configuration:
                    \"@type\": type.googleapis.com/google.protobuf.StringValue
                    value: '{value}'
"
    )
}

#[test]
fn check_reads_a_wasm_filter_wrapped_in_a_typed_struct() {
    let dir = scratch_dir("cli-typed-struct");
    let file = dir.join("envoy.yaml");
    let path = file.to_str().unwrap();
    let tollgate_json =
        r#"{"backend":{"cluster":"webdis"},"rules":[{"name":"all","key":[],"rate":5,"burst":5}]}"#;
    // Istio's metadata_exchange: a TypedStruct Wasm filter without root_id, whose configuration
    // is `{}` (a gateway's http_filters as istiod wrote them).
    let metadata_exchange = typed_struct_wasm("udpa.type.v1.TypedStruct", "''", "{}");
    // A TypedStruct of another filter.
    let local_ratelimit = "          - name: envoy.filters.http.local_ratelimit
            typed_config:
              \"@type\": type.googleapis.com/udpa.type.v1.TypedStruct
              type_url: type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              value:
                stat_prefix: http_local_rate_limiter
";
    for wrapper in ["udpa.type.v1.TypedStruct", "xds.type.v3.TypedStruct"] {
        let ours = typed_struct_wasm(wrapper, "tollgate", tollgate_json);
        for filters in [
            ours.clone(),
            [metadata_exchange.as_str(), local_ratelimit, &ours].concat(),
        ] {
            std::fs::write(&file, bootstrap_yaml(&filters, &["webdis"])).unwrap();
            let out = ok(&["check", path]);
            assert!(
                out.contains(
                    "(Envoy bootstrap, the Wasm filter's configuration), for tollgate.wasm\n"
                ) && out.contains("  all: 5 per second, burst 5, key: none (one bucket for all)")
                    && !out.contains("warning"),
                "{wrapper}: {out}"
            );
        }
        // What the filter refuses inside the TypedStruct gets the filter's message.
        let refused = typed_struct_wasm(wrapper, "tollgate", &tollgate_json.replace("5,", "0,"));
        std::fs::write(&file, bootstrap_yaml(&refused, &["webdis"])).unwrap();
        fails(
            &["check", path],
            "tollgate: bad configuration: rules[0].rate: ",
        );
    }
    // A TypedStruct of another filter is not a Wasm filter; broken TypedStructs are not either,
    // and give a message, not a panic.
    let no_wasm = "the Envoy bootstrap has no Wasm HTTP filter";
    for filters in [
        local_ratelimit.to_string(),
        metadata_exchange.replace(
            "type_url: type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "type_url: [1]",
        ),
        // The Wasm message a list.
        metadata_exchange.replace(
            "value:\n                config:",
            "value:\n              - config:",
        ),
        metadata_exchange.replace("              value:\n", "              values:\n"),
    ] {
        assert_ne!(filters, metadata_exchange);
        std::fs::write(&file, bootstrap_yaml(&filters, &["webdis"])).unwrap();
        fails(&["check", path], no_wasm);
    }
    let no_string = typed_struct_wasm("xds.type.v3.TypedStruct", "tollgate", "{}")
        .replace("value: '{}'", "value: 7");
    std::fs::write(&file, bootstrap_yaml(&no_string, &["webdis"])).unwrap();
    fails(
        &["check", path],
        "the Envoy bootstrap's Wasm filter has no configuration.value string",
    );
}

/// Envoy's `jwt_authn` filter (its entry in `http_filters`, indented by 10 spaces) with one
/// provider per item of `fields`, each writing the payload under that field (`None`: no
/// `payload_in_metadata`).
fn jwt_authn(fields: &[Option<&str>]) -> String {
    let providers: String = fields
        .iter()
        .enumerate()
        .map(|(i, field)| {
            let written = field
                .map(|f| format!("                  payload_in_metadata: {f}\n"))
                .unwrap_or_default();
            format!(
                "                p{i}:
                  issuer: https://auth{i}.example.com
                  local_jwks: {{filename: /etc/envoy/jwks.json}}
{written}"
            )
        })
        .collect();
    format!(
        "          - name: envoy.filters.http.jwt_authn
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
              providers:
{providers}"
    )
}

/// A Wasm filter whose plugin configuration is `value` (compacted, in YAML single quotes).
fn wasm(root_id: &str, value: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(value).unwrap();
    format!(
        "          - name: envoy.filters.http.wasm
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                root_id: {root_id}
                configuration:
                  \"@type\": type.googleapis.com/google.protobuf.StringValue
                  value: '{}'
",
        value.to_string().replace('\'', "''")
    )
}

/// The lines of `out` that are warnings.
fn warnings(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("warning:")).collect()
}

#[test]
fn check_warns_when_no_jwt_authn_before_tollgate_writes_what_a_key_reads() {
    let dir = scratch_dir("cli-jwt-order");
    let file = dir.join("envoy.yaml");
    let path = file.to_str().unwrap();
    // Keyed on the JWT's sub, its tiers from the plan claim; a per-client rule beside.
    let config = r#"{"backend": {"cluster": "webdis"}, "rules": [
        {"name": "per-user", "key": ["metadata:envoy.filters.http.jwt_authn:payload.sub"],
         "rate": 5, "burst": 5,
         "tiers": {"from": "metadata:envoy.filters.http.jwt_authn:payload.plan",
                   "limits": {"pro": {"rate": 50, "burst": 50}}}},
        {"name": "per-client", "key": ["client_ip"], "rate": 5, "burst": 5}]}"#;
    let ours = wasm("tollgate", config);
    let check = |filters: &str| {
        std::fs::write(&file, bootstrap_yaml(filters, &["webdis"])).unwrap();
        ok(&["check", path])
    };
    let key =
        "warning: rule \"per-user\" keys on metadata:envoy.filters.http.jwt_authn:payload.sub, but";
    let tiers = "warning: rule \"per-user\" takes its tiers from \
                 metadata:envoy.filters.http.jwt_authn:payload.plan, but";
    let never = "(until then the rule never applies)";
    let own_limits = "(until then every key gets the rule's own limits)";

    // jwt_authn before tollgate, a provider writing `payload` (beside one writing another field,
    // and one writing nothing): nothing to say.
    let payload = jwt_authn(&[Some("jwt_payload"), Some("payload"), None]);
    let out = check(&[payload.as_str(), &ours].concat());
    assert!(warnings(&out).is_empty(), "{out}");
    // The same in TypedStructs (both filters).
    let wrapped = |filter: &str, ty: &str| {
        filter.replace(
            &format!("              \"@type\": type.googleapis.com/{ty}\n"),
            &format!(
                "              \"@type\": type.googleapis.com/xds.type.v3.TypedStruct
              type_url: type.googleapis.com/{ty}
              value:\n"
            ),
        )
    };
    let jwt_ty = "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication";
    let wasm_ty = "envoy.extensions.filters.http.wasm.v3.Wasm";
    let (payload_ts, ours_ts) = (wrapped(&payload, jwt_ty), wrapped(&ours, wasm_ty));
    assert!(payload_ts != payload && ours_ts != ours);
    // (The wrapped message is one level deeper: indent what follows `value:`.)
    let deeper = |text: String| {
        let (head, tail) = text.split_once("value:\n").unwrap();
        let tail: String = tail.lines().map(|l| format!("  {l}\n")).collect();
        format!("{head}value:\n{tail}")
    };
    let out = check(&[deeper(payload_ts), deeper(ours_ts)].concat());
    assert!(
        warnings(&out).is_empty() && out.contains("  per-user: 5 per second"),
        "{out}"
    );

    // No jwt_authn at all.
    let out = check(&ours);
    assert_eq!(
        warnings(&out),
        [
            format!(
                "{key} the http_filters of listener \"ingress\" have no jwt_authn filter: add \
                 envoy.filters.http.jwt_authn before tollgate's Wasm filter, with \
                 payload_in_metadata: payload on its providers {never}"
            ),
            format!(
                "{tiers} the http_filters of listener \"ingress\" have no jwt_authn filter: add \
                 envoy.filters.http.jwt_authn before tollgate's Wasm filter, with \
                 payload_in_metadata: payload on its providers {own_limits}"
            ),
        ],
        "{out}"
    );
    // jwt_authn after tollgate.
    let out = check(&[ours.as_str(), &payload].concat());
    assert_eq!(
        warnings(&out),
        [
            format!(
                "{key} jwt_authn comes after tollgate in the http_filters of listener \
                 \"ingress\": move it before tollgate's Wasm filter {never}"
            ),
            format!(
                "{tiers} jwt_authn comes after tollgate in the http_filters of listener \
                 \"ingress\": move it before tollgate's Wasm filter {own_limits}"
            ),
        ],
        "{out}"
    );
    // docs/cli.md shows this warning as it is.
    let cli_md = std::fs::read_to_string(repo_root().join("docs/cli.md")).unwrap();
    let shown = cli_md
        .lines()
        .find(|l| l.starts_with("warning: rule"))
        .expect("docs/cli.md shows a jwt_authn warning");
    assert!(
        out.lines().any(|l| l == shown),
        "docs/cli.md: {shown}\n{out}"
    );
    // Before tollgate, but its providers write another field, or none.
    let out = check(&[jwt_authn(&[Some("jwt_payload")]).as_str(), &ours, &payload].concat());
    assert_eq!(
        warnings(&out)[0],
        format!(
            "{key} no jwt_authn provider before tollgate in the http_filters of listener \
             \"ingress\" writes \"payload\" (they write jwt_payload): set payload_in_metadata: \
             payload on the provider that verifies these tokens {never}"
        ),
        "{out}"
    );
    assert_eq!(warnings(&out).len(), 2, "{out}");
    let out = check(&[jwt_authn(&[None]).as_str(), &ours].concat());
    assert_eq!(
        warnings(&out)[1],
        format!(
            "{tiers} no jwt_authn provider before tollgate in the http_filters of listener \
             \"ingress\" writes \"payload\" (none writes its payload to metadata): set \
             payload_in_metadata: payload on the provider that verifies these tokens {own_limits}"
        ),
        "{out}"
    );
    // A warning, not a refusal: the rules are still described, and the status is 0 (`ok`).
    assert!(out.contains("  per-user: 5 per second"), "{out}");

    // Only a bootstrap shows what is around the filter: the same configuration as JSON, or in
    // an Istio WasmPlugin (where RequestAuthentication writes `payload`), gets no warning.
    let json = dir.join("tollgate.json");
    std::fs::write(&json, config).unwrap();
    let out = ok(&["check", json.to_str().unwrap()]);
    assert!(warnings(&out).is_empty(), "{out}");

    // A rule not keyed on jwt_authn's metadata needs no jwt_authn; other namespaces are not
    // looked at.
    let other = r#"{"backend": {"cluster": "webdis"}, "rules": [
        {"name": "by-tenant", "key": ["metadata:example.auth:payload.tenant"], "rate": 5, "burst": 5},
        {"name": "per-client", "key": ["client_ip"], "rate": 5, "burst": 5}]}"#;
    let out = check(&wasm("tollgate", other));
    assert!(warnings(&out).is_empty(), "{out}");
}

/// The recipes keyed on what jwt_authn verified, each in the shipped compose bootstrap with its
/// jwt_authn filter (the recipe's own, or the per-user recipe's it links to) before tollgate,
/// check clean; after tollgate, they are warned about.
#[test]
fn the_jwt_recipes_in_the_compose_bootstrap_check_clean() {
    let dir = scratch_dir("cli-jwt-recipes");
    let file = dir.join("envoy.yaml");
    let path = file.to_str().unwrap();
    let page = std::fs::read_to_string(repo_root().join("docs/recipes.md")).unwrap();
    let compose = std::fs::read_to_string(repo_root().join("deploy/compose/envoy.yaml")).unwrap();
    // The fenced blocks of one `## ` section, as (language, text).
    let blocks = |section: &str| -> Vec<(String, String)> {
        section
            .split("```")
            .skip(1)
            .step_by(2)
            .filter_map(|b| {
                let (lang, text) = b.split_once('\n')?;
                Some((lang.trim().to_string(), text.to_string()))
            })
            .collect()
    };
    let sections: Vec<&str> = page.split("\n## ").skip(1).collect();
    let jwt_filter = |section: &str| {
        blocks(section)
            .into_iter()
            .find(|(lang, text)| lang == "yaml" && text.contains("envoy.filters.http.jwt_authn"))
            .map(|(_, text)| text)
    };
    let per_user = sections
        .iter()
        .find(|s| s.starts_with("Per user: "))
        .and_then(|s| jwt_filter(s))
        .expect("docs/recipes.md: the per-user recipe's jwt_authn filter");
    let wasm_at = "          - name: envoy.filters.http.wasm\n";
    let router_at = "          - name: envoy.filters.http.router\n";
    assert_eq!(compose.matches(wasm_at).count(), 1);
    let mut checked = Vec::new();
    for section in &sections {
        let Some((_, config)) = blocks(section).into_iter().find(|(lang, text)| {
            lang == "json" && text.contains("metadata:envoy.filters.http.jwt_authn:")
        }) else {
            continue;
        };
        let heading = section.lines().next().unwrap();
        let filter = jwt_filter(section).unwrap_or_else(|| per_user.clone());
        let filter: String = filter.lines().map(|l| format!("          {l}\n")).collect();
        let config: serde_json::Value = serde_json::from_str(&config).unwrap();
        let value_at = compose
            .lines()
            .find(|l| l.trim_start().starts_with("value: '{"))
            .unwrap();
        let bootstrap = compose.replace(
            value_at,
            &format!(
                "                  value: '{}'",
                config.to_string().replace('\'', "''")
            ),
        );
        std::fs::write(
            &file,
            bootstrap.replace(wasm_at, &format!("{filter}{wasm_at}")),
        )
        .unwrap();
        let out = ok(&["check", path]);
        assert!(
            !out.contains("warning: rule"),
            "{heading}, jwt_authn before tollgate:\n{out}"
        );
        std::fs::write(
            &file,
            bootstrap.replace(router_at, &format!("{filter}{router_at}")),
        )
        .unwrap();
        let out = ok(&["check", path]);
        assert!(
            out.contains(
                "jwt_authn comes after tollgate in the http_filters of listener \"ingress\""
            ),
            "{heading}, jwt_authn after tollgate:\n{out}"
        );
        checked.push(heading.to_string());
    }
    assert!(
        checked.len() >= 3,
        "recipes keyed on jwt_authn: {checked:?}"
    );
}

#[test]
fn explain_says_which_rules_apply_and_why_not() {
    let dir = scratch_dir("cli-explain");
    let config = config_file(&dir);
    let out = ok(&[
        "explain",
        &config,
        "--path",
        "/api/orders?id=7",
        "--host",
        "API.example.com:443",
        "--client-ip",
        "198.51.100.23",
        "--metadata",
        r#"envoy.filters.http.jwt_authn={"payload":{"sub":"alice","admin":true}}"#,
    ]);
    let want = format!(
        "per-user: applies\n\
         \x20 key metadata:envoy.filters.http.jwt_authn:payload.sub = \"alice\"\n\
         \x20 bucket: {}\n\
         \x20 limits: 10 per minute, burst 10 (the rule's)\n\
         \x20 cost: 1 token\n\
         \x20 mode: exact: one call to Redis per request (shared by concurrent requests of the key)\n\
         per-client: applies\n\
         \x20 key client_ip:v4=/24 = \"198.51.100.0/24\"\n",
        user_key("alice")
    );
    assert!(out.starts_with(&want), "want\n{want}\ngot\n{out}");
    assert!(
        out.contains("bulk: does not apply: method \"GET\" is not one of POST\n"),
        "{out}"
    );
    assert!(
        out.ends_with("2 rules apply: the request is denied if any enforced one denies it\n"),
        "{out}"
    );
    // Why not: the host, a missing key, the path.
    let out = ok(&[
        "explain",
        &config,
        "--path",
        "/api/x",
        "--host",
        "other.example.com",
    ]);
    assert!(
        out.contains(
            "per-user: does not apply: host \"other.example.com\" is not one of api.example.com\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("per-client: does not apply: the request has no value for key source client_ip:v4=/24\n"),
        "{out}"
    );
    let out = ok(&[
        "explain",
        &config,
        "--path",
        "/web",
        "--host",
        "api.example.com",
    ]);
    assert!(
        out.contains("per-user: does not apply: path \"/web\" is not under /api/\n"),
        "{out}"
    );
    let out = ok(&[
        "explain",
        &config,
        "--path",
        "/api/x",
        "--host",
        "api.example.com",
    ]);
    assert!(out.contains("per-user: does not apply: the request has no value for key source metadata:envoy.filters.http.jwt_authn:payload.sub\n"), "{out}");
    // A cost header raises the cost; one above the burst is answered 400; a repeated key header
    // goes to the rule's bucket for ambiguous requests.
    let out = ok(&[
        "explain",
        &config,
        "--method",
        "POST",
        "-H",
        "x-tenant: acme",
        "-H",
        "x-cost: 4",
    ]);
    assert!(
        out.contains("  cost: 4 tokens (from header x-cost, never below the rule's cost 1)\n"),
        "{out}"
    );
    assert!(
        out.contains("  mode: exact: one call to Redis; waits up to 2 s for tokens\n"),
        "{out}"
    );
    let out = ok(&[
        "explain",
        &config,
        "--method",
        "POST",
        "-H",
        "x-tenant: acme",
        "-H",
        "x-cost: 21",
    ]);
    assert!(
        out.contains(
            "  cost: above the burst (20): it can never be admitted, the request is answered 400\n"
        ),
        "{out}"
    );
    let out = ok(&[
        "explain",
        &config,
        "--method",
        "POST",
        "-H",
        "x-tenant: acme",
        "-H",
        "X-Tenant: evil",
    ]);
    assert!(out.contains("  key header:x-tenant = AMBIGUOUS"), "{out}");
    assert!(
        out.contains("  bucket (the rule's one bucket for ambiguous requests): tollgate:{bulk:"),
        "{out}"
    );
    fails(
        &["explain", &config, "--metadata", "x={"],
        "--metadata x: not JSON",
    );
    fails(
        &["explain", &config, "-H", "novalue"],
        "--header \"novalue\": expected NAME: VALUE",
    );
    // An attribute the filter reads from a header is given as that header, never ignored.
    fails(
        &["explain", &config, "--property", "request.useragent=curl"],
        "--property request.useragent: the filter reads it from the request itself: give -H 'user-agent: VALUE'",
    );
    fails(
        &[
            "explain",
            &config,
            "--property",
            "request.headers.X-Tenant=a",
        ],
        "give -H 'x-tenant: VALUE'",
    );
    fails(
        &["explain", &config, "--property", "request.url_path=/a"],
        "give --path",
    );
    fails(
        &["explain", &config, "--property", "request.method=POST"],
        "give --method",
    );
}

/// Inspect, credit and reset on one Redis, then the bad inputs; `url` reaches it.
fn operate_against(url: &str, extra: &[&str], conn: &mut dyn redis::ConnectionLike, dir: &Path) {
    let config = config_file(dir);
    let key = user_key("alice");
    let with = |args: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.extend(["--redis".to_string(), url.to_string()]);
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run = |args: &[&str]| {
        let v = with(args);
        let refs: Vec<&str> = v.iter().map(String::as_str).collect();
        ok(&refs)
    };
    let user = ["--rule", "per-user", "--key", "alice"];
    let inspect: Vec<&str> = ["inspect", config.as_str()]
        .into_iter()
        .chain(user)
        .collect();
    let out = run(&inspect);
    assert!(out.contains(&format!("bucket: {key}\n")), "{out}");
    assert!(
        out.contains("no state in Redis: the bucket is full (10 tokens)\n"),
        "{out}"
    );
    // The filter takes 7, then the clock of Redis is what inspect reads.
    assert_eq!(script(conn, &key, &["10", "10", "60000", "7", "0"])[0], 1);
    let out = run(&inspect);
    assert!(out.contains("tokens now: 3 of 10\n"), "{out}");
    assert!(out.contains("debt: none\non lease: none\n"), "{out}");
    assert!(
        out.contains("full again in: 4"),
        "7 tokens at 10 per minute: 42 s, {out}"
    );
    // A credit adds, never past burst.
    let credit: Vec<&str> = ["credit", "4", config.as_str()]
        .into_iter()
        .chain(user)
        .collect();
    let out = run(&credit);
    assert!(
        out.contains("credited 4 tokens (up to what the bucket can hold): 7 tokens now\n"),
        "{out}"
    );
    let credit: Vec<&str> = ["credit", "1000", config.as_str()]
        .into_iter()
        .chain(user)
        .collect();
    let out = run(&credit);
    assert!(out.contains(": 10 tokens now\n"), "{out}");
    assert!(
        out.contains("no state in Redis: the bucket is full (10 tokens)\n"),
        "{out}"
    );
    // A lease of 60 on the per-client bucket of 198.51.100.0/24, then the rest taken: a reset
    // gives back what is not on lease, and keeps the lease counted.
    let client = bucket_key(
        "tollgate",
        "per-client",
        &[KeySource::ClientIp {
            v4_prefix: 24,
            v6_prefix: 64,
        }],
        &["198.51.100.0/24"],
    );
    assert_eq!(
        script(
            conn,
            &client,
            &["100", "100", "1000", "1", "60:7:1:600000:0:0"]
        )[4],
        60
    );
    assert_eq!(
        script(conn, &client, &["100", "100", "1000", "40", "0"])[0],
        1
    );
    let reset = [
        "reset",
        config.as_str(),
        "--rule",
        "per-client",
        "--key",
        "198.51.100.77",
    ];
    let out = run(&reset);
    assert!(
        out.contains(&format!("reset: 40 tokens now\nbucket: {client}\n")),
        "{out}"
    );
    assert!(
        out.contains("on lease: up to 60 tokens held by 1 proxy"),
        "{out}"
    );
    assert_eq!(
        script(conn, &client, &["100", "100", "1000", "41", "0"])[0],
        0,
        "60 stay out"
    );
    // The same bucket named by its key, as `explain` prints it.
    let out = run(&["inspect", &config, "--bucket", &client]);
    assert!(
        out.contains(&format!(
            "bucket: {client}\nrule per-client: named by its bucket key"
        )),
        "{out}"
    );
    assert!(
        out.contains("on lease: up to 60 tokens held by 1 proxy"),
        "{out}"
    );
    // Bad inputs.
    let bad = |args: &[&str], message: &str| {
        let v = with(args);
        let refs: Vec<&str> = v.iter().map(String::as_str).collect();
        fails(&refs, message);
    };
    bad(
        &["inspect", &config, "--rule", "nope", "--key", "a"],
        "unknown rule \"nope\": the configuration has per-user, per-client, bulk",
    );
    bad(
        &[
            "reset",
            &config,
            "--bucket",
            &client.replacen("per-client", "per-cl1ent", 1),
        ],
        "is no bucket of this configuration: a bucket key reads tollgate:{<rule>:<32 hex digits>}",
    );
    bad(&["reset", &config, "--rule", "per-user", "--key", "a", "b"], "rule \"per-user\" needs 1 key value (--key), one for each of: metadata:envoy.filters.http.jwt_authn:payload.sub; got 2");
    bad(
        &["inspect", &config, "--rule", "per-client", "--key", "198.51.100.777"],
        "the value \"198.51.100.777\" is not one the filter can read for key source client_ip:v4=/24",
    );
    bad(
        &[
            "inspect",
            &config,
            "--rule",
            "per-client",
            "--key",
            "198.51.100.0/16",
        ],
        "for key source client_ip:v4=/24",
    );
    // The network names the same bucket as any address in it.
    let out = run(&[
        "inspect",
        &config,
        "--rule",
        "per-client",
        "--key",
        "198.51.100.0/24",
    ]);
    assert!(out.contains(&format!("bucket: {client}\n")), "{out}");
    let out = tollgate(
        &with(&["reset", &config, "--key", "a"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("the following required arguments were not provided:\n  --rule <RULE>"),
        "{}",
        out.stderr
    );
}

#[test]
fn standalone_redis() {
    let dir = scratch_dir("cli-standalone");
    let redis = Redis::start(&dir);
    let mut conn = redis.conn();
    operate_against(&redis.url(), &[], &mut conn, &dir);
    let out = ok(&[
        "inspect",
        &config_file(&dir),
        "--rule",
        "per-user",
        "--key",
        "bob",
        "--redis",
        &redis.url(),
    ]);
    assert!(
        out.starts_with(&format!("redis: {} (standalone)\n", redis.url())),
        "{out}"
    );
    // A rule without key, and one keyed only on a literal, have one bucket each: --rule alone
    // names it.
    let one_bucket = dir.join("one-bucket.json");
    std::fs::write(
        &one_bucket,
        r#"{"backend":{"cluster":"w"},"rules":[
          {"name":"all","key":[],"rate":5,"period_ms":1000,"burst":5},
          {"name":"fixed","key":["literal:x"],"rate":5,"period_ms":1000,"burst":5}]}"#,
    )
    .unwrap();
    for rule in ["all", "fixed"] {
        let out = ok(&[
            "inspect",
            one_bucket.to_str().unwrap(),
            "--rule",
            rule,
            "--redis",
            &redis.url(),
        ]);
        assert!(
            out.contains(&format!("bucket: tollgate:{{{rule}:")),
            "{out}"
        );
    }
    // A bad URL, an unreachable Redis.
    let config = config_file(&dir);
    let args = |url: &'static str| {
        [
            "inspect", "CONFIG", "--rule", "per-user", "--key", "a", "--redis", url,
        ]
    };
    let run = |url: &'static str, message: &str| {
        let mut a = args(url);
        a[1] = &config;
        fails(&a, message);
    };
    run("http://127.0.0.1:6379", "bad Redis URL");
    run("redis://", "bad Redis URL");
    let closed = free_port();
    let url: &'static str = Box::leak(format!("redis://127.0.0.1:{closed}").into_boxed_str());
    run(
        url,
        &format!("cannot reach Redis at redis://127.0.0.1:{closed}"),
    );
}

#[test]
fn redis_cluster_follows_the_key_to_its_master() {
    let dir = scratch_dir("cli-cluster");
    let cluster = RedisCluster::start(&dir, 3);
    let key = user_key("alice");
    let owner = cluster.owner_of_key(&key);
    // Enter through a master that does not own the key: the command must follow MOVED.
    let seed = cluster.ports().into_iter().find(|&p| p != owner).unwrap();
    let url = format!("redis://127.0.0.1:{seed}");
    let out = ok(&[
        "inspect",
        &config_file(&dir),
        "--rule",
        "per-user",
        "--key",
        "alice",
        "--redis",
        &url,
    ]);
    assert!(
        out.starts_with(&format!("redis: {url} (Redis Cluster)\n")),
        "{out}"
    );
    let mut client = redis::cluster::ClusterClient::new(vec![url.clone()])
        .unwrap()
        .get_connection()
        .unwrap();
    operate_against(&url, &[], &mut client, &dir);
    // The reset's lease bucket lives on the master that owns its slot, and on no other.
    let client = bucket_key(
        "tollgate",
        "per-client",
        &[KeySource::ClientIp {
            v4_prefix: 24,
            v6_prefix: 64,
        }],
        &["198.51.100.0/24"],
    );
    for port in cluster.ports() {
        let here = cluster.keys_on(port, "tollgate:*").contains(&client);
        assert_eq!(here, port == cluster.owner_of_key(&client), "node {port}");
    }
}

#[test]
fn acl_user_and_password_in_the_url() {
    let dir = scratch_dir("cli-acl");
    // The operator's user may run the scripts and INFO on tollgate's keys, nothing else.
    let redis = Redis::start_with(
        &dir,
        &[
            "--user",
            "default",
            "off",
            "--user",
            "operator",
            "on",
            ">s3cret",
            "~tollgate:*",
            "+eval",
            "+evalsha",
            "+info",
            "+ping",
            "+client",
            "+hmget",
            "+hgetall",
            "+hset",
            "+hdel",
            "+del",
            "+pexpire",
            "+persist",
            "+time",
        ],
    );
    let mut conn =
        redis::Client::open(format!("redis://operator:s3cret@127.0.0.1:{}/", redis.port))
            .unwrap()
            .get_connection()
            .unwrap();
    let url = format!("redis://operator:s3cret@127.0.0.1:{}", redis.port);
    operate_against(&url, &[], &mut conn, &dir);
    let config = config_file(&dir);
    let wrong = format!("redis://operator:nope@127.0.0.1:{}", redis.port);
    let out = tollgate(&[
        "inspect", &config, "--rule", "per-user", "--key", "a", "--redis", &wrong,
    ]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "Redis at redis://operator:***@127.0.0.1:{}",
            redis.port
        )),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("refused the credentials"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("nope"),
        "the password is never printed: {}",
        out.stderr
    );
}

#[test]
fn tls_with_a_ca_made_here() {
    let dir = scratch_dir("cli-tls");
    let ca = Ca::new(&dir, "cli-test-ca");
    let server = ca.issue("server", "localhost");
    let tls_port = free_port().to_string();
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let redis = Redis::start_with(
        &dir,
        &[
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &path(&server.cert),
            "--tls-key-file",
            &path(&server.key),
            "--tls-ca-cert-file",
            &path(&ca.cert),
            "--tls-auth-clients",
            "no",
        ],
    );
    let mut conn = redis.conn();
    // The certificate names localhost, as a client connecting by that name checks it.
    let url = format!("rediss://localhost:{tls_port}");
    let ca = path(&ca.cert);
    operate_against(&url, &["--tls-ca", &ca], &mut conn, &dir);
    // Without the CA the server's certificate is not trusted; a plain URL with --tls-ca is refused.
    let config = config_file(&dir);
    let out = tollgate(&[
        "inspect", &config, "--rule", "per-user", "--key", "a", "--redis", &url,
    ]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("cannot reach Redis at {url}")),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.to_lowercase().contains("certificate"),
        "{}",
        out.stderr
    );
    fails(
        &[
            "inspect",
            &config,
            "--rule",
            "per-user",
            "--key",
            "a",
            "--redis",
            &redis.url(),
            "--tls-ca",
            &ca,
        ],
        "need a rediss:// URL",
    );
}

/// A tiered rule: `check` lists its tiers, `explain` says whose limits a request gets.
#[test]
fn tiers_are_described_and_explained() {
    let dir = scratch_dir("cli-tiers");
    let path = dir.join("tiers.json");
    std::fs::write(
        &path,
        r#"{"rules":[{"name":"per-user","key":["metadata:envoy.filters.http.jwt_authn:payload.sub"],
            "rate":100,"period_ms":60000,"burst":20,
            "tiers":{"from":"metadata:envoy.filters.http.jwt_authn:payload.plan",
                     "limits":{"pro":{"rate":1000,"burst":200},"staff":{"unlimited":true}}}}]}"#,
    )
    .unwrap();
    let config = path.to_str().unwrap();
    let out = ok(&["check", config]);
    assert!(
        out.contains(r#"tiers by JWT plan (metadata:envoy.filters.http.jwt_authn:payload.plan): "pro" 1000 per minute, burst 200, "staff" unlimited (other values: the rule's limits)"#),
        "{out}"
    );
    let explain = |plan: &str| {
        ok(&[
            "explain",
            config,
            "--path",
            "/x",
            "--metadata",
            &format!(
                r#"envoy.filters.http.jwt_authn={{"payload":{{"sub":"alice","plan":{plan}}}}}"#
            ),
        ])
    };
    let out = explain(r#""pro""#);
    assert!(
        out.contains("  limits: 1000 per minute, burst 200 (its tier's)\n"),
        "{out}"
    );
    let out = explain(r#""free""#);
    assert!(
        out.contains("  limits: 100 per minute, burst 20 (the rule's)\n"),
        "{out}"
    );
    let out = explain(r#"["pro"]"#);
    assert!(
        out.contains(
            "  limits: 100 per minute, burst 20 (the rule's: the tier source is AMBIGUOUS)\n"
        ),
        "{out}"
    );
    let out = explain(r#""staff""#);
    assert!(
        out.contains(
            "  limits: unlimited by its tier: admitted without a call to Redis (still counted)\n"
        ),
        "{out}"
    );
}

/// A penalty rule: `inspect` shows the box, `credit` leaves it (even when it fills the bucket,
/// which would otherwise delete the key), `reset` empties it and forgets the offences.
#[test]
fn inspect_shows_the_penalty_box_credit_keeps_it_reset_empties_it() {
    let dir = scratch_dir("cli-penalty");
    let redis = Redis::start(&dir);
    let mut conn = redis.conn();
    let path = dir.join("penalty.json");
    std::fs::write(
        &path,
        r#"{"rules": [{"name": "login", "key": ["header:x-user"], "rate": 1, "period_ms": 1000,
            "burst": 1, "penalty": {"ms": [600000, 1200000]}}]}"#,
    )
    .unwrap();
    let config = path.to_str().unwrap();
    let summary = ok(&["check", config]);
    assert!(
        summary.contains(
            "after a denial refuses the key for 10 min 0 s, then 20 min 0 s (repeat offences within 1 h 0 min)"
        ),
        "{summary}"
    );
    let key = bucket_key(
        "tollgate",
        "login",
        &[KeySource::Header("x-user".into())],
        &["eve"],
    );
    // The filter's calls: one admitted, then the offence (boxed for 10 minutes).
    let args = [
        "1",
        "1",
        "1000",
        "1",
        "0",
        "0",
        "0",
        "time",
        "7200000:600000:1200000",
    ];
    assert_eq!(script(&mut conn, &key, &args)[0], 1);
    let denied = script(&mut conn, &key, &args);
    assert_eq!(
        (denied[0], denied[2], denied[5]),
        (0, 600_000, 1),
        "{denied:?}"
    );
    let run = |verb: &[&str]| {
        let mut a = verb.to_vec();
        a.extend([config, "--rule", "login", "--key", "eve", "--redis"]);
        let url = redis.url();
        a.push(&url);
        ok(&a)
    };
    let out = run(&["inspect"]);
    assert!(
        out.contains("penalty box: boxed for 10 min 0 s more (offence 1 within the window")
            || out.contains("penalty box: boxed for 9 min 59 s more (offence 1 within the window"),
        "{out}"
    );
    // A credit fills the bucket: the boxed key stays.
    let out = run(&["credit", "5"]);
    assert!(out.contains("penalty box: boxed for"), "{out}");
    assert_eq!(script(&mut conn, &key, &args)[5], 2, "still boxed");
    // The reset fills the bucket and forgets the box: nothing is left to keep in Redis.
    let out = run(&["reset"]);
    assert!(
        out.contains("no state in Redis: the bucket is full"),
        "{out}"
    );
    let after = script(&mut conn, &key, &args);
    assert_eq!((after[0], after[5]), (1, 0), "let in again: {after:?}");
}

/// `doc` with every object key that has a `_` in its JSON name (lowerCamelCase), as protobuf's
/// JSON mapping writes it and Envoy reads it: `static_resources` is `staticResources`.
fn json_names(doc: serde_json::Value) -> serde_json::Value {
    match doc {
        serde_json::Value::Object(map) => map
            .into_iter()
            .map(|(key, v)| {
                let mut name = String::new();
                let mut upper = false;
                for c in key.chars() {
                    match c {
                        '_' => upper = true,
                        c if upper => {
                            name.push(c.to_ascii_uppercase());
                            upper = false;
                        }
                        c => name.push(c),
                    }
                }
                (name, json_names(v))
            })
            .collect(),
        serde_json::Value::Array(items) => items.into_iter().map(json_names).collect(),
        other => other,
    }
}

/// Envoy reads a field under its proto name or its JSON name; so does `check`: a bootstrap
/// written with JSON names (`staticResources`, `httpFilters`, `typedConfig`, `rootId`,
/// `typeUrl`, `payloadInMetadata`) gives what the same bootstrap with proto names gives, its
/// warnings included, whether the file is JSON or YAML.
#[test]
fn check_reads_a_bootstrap_written_with_json_names() {
    let dir = scratch_dir("cli-json-names");
    let config = r#"{"backend": {"cluster": "webdis"}, "rules": [
        {"name": "per-user", "key": ["metadata:envoy.filters.http.jwt_authn:payload.sub"],
         "rate": 5, "burst": 5}]}"#;
    let ours = wasm("tollgate", config);
    let wrapped = typed_struct_wasm(
        "udpa.type.v1.TypedStruct",
        "tollgate",
        &serde_json::from_str::<serde_json::Value>(config)
            .unwrap()
            .to_string(),
    );
    let payload = jwt_authn(&[Some("payload")]);
    for (what, filters, clusters) in [
        (
            "no warning",
            [payload.as_str(), &ours].concat(),
            &["webdis"][..],
        ),
        (
            "jwt_authn after tollgate",
            [ours.as_str(), &payload].concat(),
            &["webdis"],
        ),
        (
            "a TypedStruct, no backend cluster",
            [payload.as_str(), &wrapped].concat(),
            &["app"],
        ),
    ] {
        let snake = dir.join("snake.yaml");
        std::fs::write(&snake, bootstrap_yaml(&filters, clusters)).unwrap();
        let want = ok(&["check", snake.to_str().unwrap()]).replace(snake.to_str().unwrap(), "F");
        let doc: serde_json::Value =
            serde_saphyr::from_str(&std::fs::read_to_string(&snake).unwrap()).unwrap();
        let camel = json_names(doc);
        assert!(camel.get("staticResources").is_some(), "{camel}");
        let text = camel.to_string();
        assert!(!text.contains("http_filters") && text.contains("payloadInMetadata"));
        for (file, body) in [
            ("camel.json", text.clone()),
            ("camel.yaml", format!("# a YAML file\n{text}\n")),
        ] {
            let path = dir.join(file);
            std::fs::write(&path, body).unwrap();
            let got = ok(&["check", path.to_str().unwrap()]).replace(path.to_str().unwrap(), "F");
            assert_eq!(got, want, "{what}, {file}");
        }
        if what != "no warning" {
            assert!(!warnings(&want).is_empty(), "{what}: {want}");
        }
    }
}

/// Tollgate's filter under a matcher (an `ExtensionWithMatcher`, which may skip it for the
/// requests it matches) is still found in its `http_filters`, `jwt_authn` around it is judged as
/// for a bare filter, and `check` says that the requests the matcher skips go unlimited.
#[test]
fn check_reads_a_wasm_filter_under_a_matcher_and_warns_of_it() {
    let dir = scratch_dir("cli-matcher");
    let file = dir.join("envoy.yaml");
    let path = file.to_str().unwrap();
    let config = r#"{"backend": {"cluster": "webdis"}, "rules": [
        {"name": "per-user", "key": ["metadata:envoy.filters.http.jwt_authn:payload.sub"],
         "rate": 5, "burst": 5}]}"#;
    // The bare entry's typed_config, one level deeper under extension_config.
    let bare = wasm("tollgate", config);
    let (head, tail) = bare.split_once("            typed_config:\n").unwrap();
    let inner: String = tail.lines().map(|l| format!("    {l}\n")).collect();
    let matched = format!(
        "{head}            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher
              xds_matcher:
                matcher_list:
                  matchers:
                  - predicate:
                      single_predicate:
                        input:
                          name: request-headers
                          typed_config:
                            \"@type\": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                            header_name: x-skip
                        value_match: {{exact: \"1\"}}
                    on_match:
                      action:
                        name: skip
                        typed_config:
                          \"@type\": type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter
              extension_config:
                name: envoy.filters.http.wasm
                typed_config:
{inner}"
    );
    let payload = jwt_authn(&[Some("payload")]);
    let check = |filters: &str| {
        std::fs::write(&file, bootstrap_yaml(filters, &["webdis"])).unwrap();
        ok(&["check", path])
    };
    let skipped = "warning: tollgate's Wasm filter in the http_filters of listener \"ingress\" is \
                   wrapped in an ExtensionWithMatcher: the requests its matcher skips the filter \
                   for reach the upstream with no limit";
    let out = check(&[payload.as_str(), &matched].concat());
    assert!(out.contains("  per-user: 5 per second"), "{out}");
    assert_eq!(warnings(&out), [skipped], "{out}");
    // jwt_authn after the wrapped filter is seen there.
    let out = check(&[matched.as_str(), &payload].concat());
    assert_eq!(warnings(&out).len(), 2, "{out}");
    assert!(
        warnings(&out)[1]
            .contains("jwt_authn comes after tollgate in the http_filters of listener"),
        "{out}"
    );
    // The bare filter: no matcher to warn of.
    let out = check(&[payload.as_str(), &bare].concat());
    assert!(warnings(&out).is_empty(), "{out}");
}

/// The Higress build keeps its buckets in `backend.database` (Higress' client runs `SELECT` on
/// each connection): a command run with a URL that names no database must reach that database,
/// not database 0, and one whose URL names another database must refuse rather than show or
/// change buckets the filter never reads.
#[test]
fn a_higress_configurations_database_is_where_the_command_acts() {
    let dir = scratch_dir("cli-database");
    let redis = Redis::start_with(&dir, &["--requirepass", "s3cret"]);
    let path = dir.join("higress.json");
    std::fs::write(
        &path,
        r#"{"backend": {"service_name": "redis.static", "password": "s3cret", "database": 3},
            "rules": [{"name": "r", "key": ["header:x-user"], "rate": 1, "period_ms": 60000,
                       "burst": 10}]}"#,
    )
    .unwrap();
    let config = path.to_str().unwrap();
    let key = bucket_key(
        "tollgate",
        "r",
        &[KeySource::Header("x-user".into())],
        &["alice"],
    );
    let db = |n: u8| {
        redis::Client::open(format!("redis://:s3cret@127.0.0.1:{}/{n}", redis.port))
            .unwrap()
            .get_connection()
            .unwrap()
    };
    // The filter's calls, in database 3: alice spent 8 of her 10 tokens.
    let mut three = db(3);
    let spent = script(&mut three, &key, &["10", "1", "60000", "8", "0"]);
    assert_eq!(&spent[..2], &[1, 2], "{spent:?}");
    let url = format!("redis://:s3cret@127.0.0.1:{}", redis.port);
    let run = |verb: &str, url: &str| {
        tollgate(&[
            verb,
            "--artifact",
            "higress",
            config,
            "--rule",
            "r",
            "--key",
            "alice",
            "--redis",
            url,
        ])
    };
    let out = run("inspect", &url);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("tokens now: 2 of 10"), "{}", out.stdout);
    let out = run("reset", &url);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let fields: Vec<(String, String)> = redis::cmd("HGETALL").arg(&key).query(&mut three).unwrap();
    let after = script(&mut three, &key, &["10", "1", "60000", "0", "0"]);
    assert_eq!(
        after[1], 10,
        "the filter's bucket was reset: {fields:?} {}",
        out.stdout
    );
    let zero: i64 = redis::cmd("DBSIZE").query(&mut db(0)).unwrap();
    assert_eq!(zero, 0, "nothing written to database 0");
    // A URL naming another database than the configuration's is refused.
    let other = run("inspect", &format!("{url}/5"));
    assert_eq!(other.code, 1, "{}{}", other.stdout, other.stderr);
    assert!(other.stderr.contains("database"), "{}", other.stderr);
    assert!(!other.stderr.contains("s3cret"), "{}", other.stderr);
    // The configuration's own database, named in the URL, is fine.
    assert_eq!(run("inspect", &format!("{url}/3")).code, 0);
}

/// Envoy keeps a request's `Host` header as `:authority` (the filter never sees a `host` line):
/// `-H 'Host: …'` describes the same request as `--host …`, so a rule on the host applies, with
/// the same bucket, and a match.headers condition on `host` (read as `:authority`) holds.
#[test]
fn explain_reads_a_host_header_as_the_authority() {
    let dir = scratch_dir("cli-host-header");
    let path = dir.join("host.json");
    std::fs::write(
        &path,
        r#"{"rules": [{"name": "per-host", "key": ["authority"], "rate": 5,
            "match": {"hosts": ["api.example.com"],
                      "headers": [{"name": "host", "prefix": "api."}]}}]}"#,
    )
    .unwrap();
    let config = path.to_str().unwrap();
    let by_host = ok(&["explain", config, "--host", "api.example.com"]);
    assert!(by_host.contains("per-host: applies"), "{by_host}");
    for header in ["Host: api.example.com", "host:api.example.com"] {
        let by_header = ok(&["explain", config, "-H", header]);
        assert_eq!(by_header, by_host, "-H {header:?}");
    }
}

/// A shadow rule never holds a request (the filter sends its calls with no wait), so nothing of
/// its bucket's debt is reserved by held requests: `explain` says no wait, and a reset fills the
/// bucket to its burst, as for a rule without `max_wait_ms`, instead of keeping the debt a wait
/// would cover.
#[test]
fn a_shadow_rule_holds_no_request_and_its_reset_keeps_no_reservation() {
    let dir = scratch_dir("cli-shadow-wait");
    let redis = Redis::start(&dir);
    let mut conn = redis.conn();
    let path = dir.join("shadow.json");
    std::fs::write(
        &path,
        r#"{"rules": [{"name": "s", "shadow": true, "max_wait_ms": 2000, "key": ["header:x-user"],
            "rate": 10, "period_ms": 1000, "burst": 10}]}"#,
    )
    .unwrap();
    let config = path.to_str().unwrap();
    let explained = ok(&["explain", config, "-H", "x-user: a"]);
    assert!(!explained.contains("waits"), "{explained}");
    let key = bucket_key(
        "tollgate",
        "s",
        &[KeySource::Header("x-user".into())],
        &["a"],
    );
    // Usage charged after the fact took the bucket 10 tokens into debt (no request is held).
    let charged = script(&mut conn, &key, &["10", "10", "1000", "0", "0", "0", "20"]);
    assert_eq!(charged[1], 0, "{charged:?}");
    let url = redis.url();
    let out = ok(&[
        "reset", config, "--rule", "s", "--key", "a", "--redis", &url,
    ]);
    assert!(out.contains("reset: 10 tokens now"), "{out}");
    assert!(!out.contains("reservations outstanding"), "{out}");
}

/// Messages never print the password: not one in a Unix socket URL's `?pass=` (which the client
/// library accepts as it accepts a redis:// URL's user info).
#[test]
fn a_unix_socket_urls_password_is_never_printed() {
    let dir = scratch_dir("cli-unix-pass");
    let config = config_file(&dir);
    for scheme in ["unix", "redis+unix"] {
        let url = format!(
            "{scheme}://{}/none.sock?user=ops&pass=s3cretpw",
            dir.display()
        );
        let out = tollgate(&[
            "inspect", &config, "--rule", "per-user", "--key", "a", "--redis", &url,
        ]);
        assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
        assert!(out.stderr.contains("cannot reach Redis"), "{}", out.stderr);
        assert!(!out.stderr.contains("s3cretpw"), "{}", out.stderr);
    }
}

/// `--key` takes the values `explain` prints, and a command line carries only UTF-8: a value the
/// filter reads that is not UTF-8 (a header ending in a UTF-8 NO-BREAK SPACE, whose last byte
/// the filter trims as the most lenient server does; a percent-encoded `%ff`) cannot be given
/// back as printed, where the printed text would name another bucket. `explain` says so, and
/// points at the bucket key, which names it.
#[test]
fn explain_says_when_a_key_value_cannot_be_given_back() {
    let dir = scratch_dir("cli-not-utf8");
    let path = dir.join("user.json");
    std::fs::write(
        &path,
        r#"{"rules": [{"name": "u", "key": ["header:x-user"], "rate": 5},
                      {"name": "q", "key": ["query:k"], "rate": 5}]}"#,
    )
    .unwrap();
    let config = path.to_str().unwrap();
    let out = ok(&[
        "explain",
        config,
        "-H",
        "x-user: K\u{a0}",
        "--path",
        "/?k=%ff",
    ]);
    let printed: Vec<&str> = out.lines().filter(|l| l.contains("  key ")).collect();
    assert_eq!(printed.len(), 2, "{out}");
    for line in printed {
        assert!(line.contains("not UTF-8"), "{line}");
    }
    // A value that is UTF-8 gets no such note.
    let plain = ok(&["explain", config, "-H", "x-user: K\u{a0}L"]);
    assert!(!plain.contains("not UTF-8"), "{plain}");
}
