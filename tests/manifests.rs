//! The deployment files stay consistent with what the tests run, although Docker and Kubernetes are not
//! available here: docker-compose.yaml mounts files that exist and runs the demo's envoy/envoy.yaml
//! (rendered into deploy/compose/envoy.yaml, which Envoy accepts); the Redis Cluster front passes
//! `envoy --mode validate`; the Istio WasmPlugin's pluginConfig is a configuration tollgate accepts
//! and names the cluster Istio creates for the Webdis Service; the Dockerfile packages plugin.wasm.
//! Needs `make setup` (Envoy) and `make build` (the wasm).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use common::envoy::{brief_log, envoy_file, render_envoy_yaml, render_envoy_yaml_logging};
use common::redis_cluster::render_redis_proxy_yaml;
use common::{demo_config, envoy_bin, repo_root, scratch_dir, wasm_path};

/// What docker-compose.yaml runs: these ports on the host's loopback, the wasm mounted here.
const COMPOSE_ADMIN_PORT: u16 = 9901;
const COMPOSE_LISTEN_PORT: u16 = 10000;
const COMPOSE_WEBDIS_PORT: u16 = 7379;
const COMPOSE_APP_PORT: u16 = 8080;
const COMPOSE_WASM: &str = "/etc/tollgate/tollgate.wasm";
const COMPOSE_ENVOY_YAML: &str = "deploy/compose/envoy.yaml";

fn read(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every document of a YAML file, as JSON values (duplicate keys are an error).
fn yaml_file(rel: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `envoy --mode validate -c <file>`; Err(output) if Envoy rejects it.
fn envoy_validate(config: &Path) -> Result<(), String> {
    let out = Command::new(envoy_bin())
        .args(["--mode", "validate", "-l", "warning", "-c"])
        .arg(config)
        .output()
        .unwrap_or_else(|e| panic!("run envoy: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && text.contains(" OK") {
        Ok(())
    } else {
        Err(format!("{}\n{}", out.status, brief_log(&text)))
    }
}

/// Writes `yaml` to a scratch file and validates it with Envoy; panics with Envoy's output if rejected.
fn assert_envoy_accepts(name: &str, yaml: &str) {
    let path = scratch_dir("manifests").join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    if let Err(out) = envoy_validate(&path) {
        panic!(
            "envoy --mode validate rejected {name} ({}):\n{out}",
            path.display()
        );
    }
}

/// What deploy/compose/envoy.yaml must contain: envoy/envoy.yaml rendered with the demo config and
/// the compose ports, its placeholder notes replaced by a header saying where it comes from.
fn compose_envoy_yaml() -> String {
    let header = format!(
        "# GENERATED from envoy/envoy.yaml and envoy/demo-config.json by tests/manifests.rs; do not edit.\n\
         # Regenerate with: TOLLGATE_REGENERATE=1 cargo test --test manifests\n\
         # Used by docker-compose.yaml (network_mode: host): admin 127.0.0.1:{COMPOSE_ADMIN_PORT}, listener\n\
         # 127.0.0.1:{COMPOSE_LISTEN_PORT}, Webdis 127.0.0.1:{COMPOSE_WEBDIS_PORT}, the app 127.0.0.1:{COMPOSE_APP_PORT},\n\
         # the wasm mounted at {COMPOSE_WASM}.\n"
    );
    // The access log goes to Envoy's stdout: `docker compose logs envoy` shows it.
    let rendered = render_envoy_yaml_logging(
        &demo_config(),
        COMPOSE_WEBDIS_PORT,
        COMPOSE_LISTEN_PORT,
        COMPOSE_ADMIN_PORT,
        Path::new(COMPOSE_WASM),
        COMPOSE_APP_PORT,
        "/dev/stdout",
    );
    // The template's leading comment explains its placeholders; the rendered file has none left.
    let body: String = rendered
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    header + &body
}

fn compose() -> Value {
    let mut docs = yaml_file("docker-compose.yaml");
    assert_eq!(docs.len(), 1, "docker-compose.yaml is one document");
    docs.remove(0)
}

/// A service's `volumes` as (host path relative to the repository, container path).
fn mounts(service: &Value) -> Vec<(String, String)> {
    service["volumes"]
        .as_array()
        .map(|v| v.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|m| {
            let m = m.as_str().expect("short volume syntax");
            let mut parts = m.split(':');
            let src = parts.next().unwrap().to_string();
            let dst = parts
                .next()
                .unwrap_or_else(|| panic!("volume {m}"))
                .to_string();
            (src, dst)
        })
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected a list, got {v}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("expected a string, got {s}"))
                .to_string()
        })
        .collect()
}

/// The argument after `flag` in a command list.
fn arg_after(cmd: &[String], flag: &str) -> String {
    let i = cmd
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} in {cmd:?}"));
    cmd.get(i + 1)
        .unwrap_or_else(|| panic!("value of {flag} in {cmd:?}"))
        .clone()
}

/// The Makefile's ENVOY_VERSION (what `make setup` installs and the tests run).
fn envoy_version() -> String {
    read("Makefile")
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(":=")?;
            (name.trim() == "ENVOY_VERSION").then(|| value.trim().to_string())
        })
        .expect("ENVOY_VERSION in the Makefile")
}

/// Every healthcheck of docker-compose.yaml runs under podman-compose as written: it joins a `CMD`
/// list into one shell string with `' '` between the quoted arguments, so an argument holding a space,
/// a quote or another character the shell reads breaks the check (it never passes). And the local
/// override `make compose-test` adds (deploy/compose/local/compose.local.yaml) swaps only `image:`.
#[test]
fn compose_healthchecks_survive_podman_compose_and_the_override_swaps_only_images() {
    let doc = compose();
    let services = doc["services"].as_object().expect("services");
    let mut checked = 0;
    for (name, service) in services {
        let Some(check) = service.get("healthcheck") else {
            continue;
        };
        let test = strings(&check["test"]);
        assert_eq!(test[0], "CMD", "{name}: healthcheck test is a CMD list");
        for arg in &test[1..] {
            assert!(
                arg.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/._-:=".contains(c)),
                "{name}: healthcheck argument {arg:?} holds a character podman-compose re-quotes; \
                 put the check in deploy/compose/healthcheck.sh"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 3, "redis, webdis and envoy have healthchecks");

    let mut docs = yaml_file("deploy/compose/local/compose.local.yaml");
    assert_eq!(docs.len(), 1, "the override is one document");
    let over = docs.remove(0);
    let keys: Vec<&String> = over.as_object().expect("a mapping").keys().collect();
    assert_eq!(keys, ["services"], "the override holds only services");
    for (name, service) in over["services"].as_object().expect("services") {
        assert!(
            services.contains_key(name),
            "override of unknown service {name}"
        );
        let fields: Vec<&String> = service.as_object().expect("a mapping").keys().collect();
        assert_eq!(fields, ["image"], "{name}: the override swaps only image:");
    }
}

/// Every host path docker-compose.yaml mounts or builds from exists, and the services agree with each
/// other on ports, paths and versions.
#[test]
fn compose_mounts_exist_and_services_agree() {
    wasm_path(); // a clear "run make build" if the module is missing
    let doc = compose();
    let services = doc["services"].as_object().expect("services");
    for name in ["redis", "webdis", "envoy", "app"] {
        assert!(services.contains_key(name), "service {name}");
    }
    for (name, service) in services {
        assert_eq!(
            service["network_mode"], "host",
            "{name}: envoy/envoy.yaml talks over 127.0.0.1, so every service shares the host network"
        );
        for (src, dst) in mounts(service) {
            let rel = src
                .strip_prefix("./")
                .unwrap_or_else(|| panic!("{name}: mount {src} is not relative to the repository"));
            assert!(
                repo_root().join(rel).is_file(),
                "{name}: mounted file {src} (-> {dst}) does not exist (run `make build` for the wasm)"
            );
        }
        if let Some(build) = service.get("build") {
            let ctx = build.as_str().expect("build: <context dir>");
            let dockerfile = repo_root()
                .join(ctx.trim_start_matches("./"))
                .join("Dockerfile");
            assert!(
                dockerfile.is_file(),
                "{name}: {} missing",
                dockerfile.display()
            );
        }
    }

    // Envoy: the pinned version, the generated config and the wasm where that config expects it.
    let envoy = &services["envoy"];
    assert_eq!(
        envoy["image"].as_str(),
        Some(format!("envoyproxy/envoy:v{}", envoy_version()).as_str()),
        "the compose Envoy is the version the tests run"
    );
    let envoy_mounts = mounts(envoy);
    let config_in_container = arg_after(&strings(&envoy["command"]), "-c");
    assert!(
        envoy_mounts.contains(&(
            format!("./{COMPOSE_ENVOY_YAML}"),
            config_in_container.clone()
        )),
        "envoy runs {config_in_container}, which must be ./{COMPOSE_ENVOY_YAML}: {envoy_mounts:?}"
    );
    assert!(
        envoy_mounts.contains(&(
            "./target/wasm32-wasip1/release/tollgate.wasm".to_string(),
            COMPOSE_WASM.to_string()
        )),
        "the wasm is mounted at {COMPOSE_WASM}: {envoy_mounts:?}"
    );

    // The app listens where envoy/envoy.yaml's "app" cluster was rendered for compose.
    let app_cmd = strings(&services["app"]["command"]);
    assert!(
        app_cmd.contains(&format!("-listen=127.0.0.1:{COMPOSE_APP_PORT}")),
        "the app listens on the port the compose render uses: {app_cmd:?}"
    );

    // Webdis: its config is mounted where its command reads it, and it points at the Redis service.
    let webdis = &services["webdis"];
    let webdis_config_path = strings(&webdis["command"])
        .last()
        .cloned()
        .expect("webdis config path");
    let (src, _) = mounts(webdis)
        .into_iter()
        .find(|(_, dst)| *dst == webdis_config_path)
        .unwrap_or_else(|| panic!("webdis reads {webdis_config_path}, which is not mounted"));
    let cfg: Value =
        serde_json::from_str(&read(src.trim_start_matches("./"))).expect("webdis JSON");
    let redis_cmd = strings(&services["redis"]["command"]);
    assert_eq!(cfg["redis_host"], "127.0.0.1");
    assert_eq!(
        cfg["redis_port"].to_string(),
        arg_after(&redis_cmd, "--port"),
        "webdis talks to the redis service's port"
    );
    assert_eq!(arg_after(&redis_cmd, "--bind"), "127.0.0.1");
    assert_eq!(cfg["http_host"], "127.0.0.1");
    assert_eq!(
        cfg["http_port"],
        json!(COMPOSE_WEBDIS_PORT),
        "envoy's tollgate_backend is Webdis' port"
    );
    assert_eq!(
        cfg["daemonize"], false,
        "a container's process stays in the foreground"
    );
}

/// deploy/compose/envoy.yaml is envoy/envoy.yaml rendered for compose, nothing else (one source of
/// truth); with TOLLGATE_REGENERATE=1 the test rewrites it.
#[test]
fn compose_envoy_config_is_the_rendered_demo_template() {
    let want = compose_envoy_yaml();
    let path = repo_root().join(COMPOSE_ENVOY_YAML);
    if std::env::var_os("TOLLGATE_REGENERATE").is_some() {
        std::fs::write(&path, &want).unwrap();
        eprintln!("wrote {}", path.display());
    }
    let got = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        got == want,
        "{COMPOSE_ENVOY_YAML} is not the render of envoy/envoy.yaml + envoy/demo-config.json; \
         regenerate it with `TOLLGATE_REGENERATE=1 cargo test --test manifests`"
    );
}

/// The compose Envoy configuration, with the real wasm in place of the mounted path, passes
/// `envoy --mode validate` (which also runs the filter's on_configure on the demo config).
#[test]
fn compose_envoy_config_passes_envoy_validate() {
    let yaml = compose_envoy_yaml();
    let real = wasm_path().to_string_lossy().replace('\'', "''");
    assert!(yaml.contains(&format!("'{COMPOSE_WASM}'")));
    assert_envoy_accepts(
        "compose-envoy",
        &yaml.replace(&format!("'{COMPOSE_WASM}'"), &format!("'{real}'")),
    );
}

/// envoy/redis-cluster/envoy.yaml passes `envoy --mode validate`, and its Webdis config is JSON that
/// points at the redis_proxy listener.
#[test]
fn redis_cluster_front_passes_envoy_validate() {
    assert_envoy_accepts(
        "redis-cluster-front",
        &render_redis_proxy_yaml(6380, 9902, &[7001, 7002, 7003]),
    );
    let cfg: Value = serde_json::from_str(&envoy_file("redis-cluster/webdis.json"))
        .expect("webdis.json is JSON");
    assert_eq!(cfg["redis_host"], "127.0.0.1");
    assert_eq!(cfg["daemonize"], false);
    assert_eq!(
        cfg["acl"],
        json!([{ "disabled": ["*"] }, { "enabled": ["EVALSHA", "EVAL"] }]),
        "Webdis runs the filter's two commands only"
    );
}

/// The kind/name/namespace-indexed objects of a multi-document manifest.
fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// Example values for the `${VARIABLES}` of the Istio manifests (what `envsubst` fills in).
const ISTIO_VARS: &[(&str, &str)] = &[
    ("REGISTRY", "registry.example.com/platform"),
    ("VERSION", "0.1.0"),
    (
        "DIGEST",
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    ),
    ("GATEWAY_NAMESPACE", "istio-ingress"),
    ("GATEWAY_NAME", "public"),
    ("GATEWAY_SERVICE_ACCOUNT", "istio-ingressgateway"),
    ("APP_NAMESPACE", "shop"),
    ("APP", "orders"),
    ("TRUST_DOMAIN", "cluster.local"),
    ("JWT_ISSUER", "https://issuer.example.com"),
    (
        "JWKS_URI",
        "https://issuer.example.com/.well-known/jwks.json",
    ),
];

/// The Istio manifests under envoy/istio/, and which of them run the filter.
const ISTIO_FILES: &[&str] = &[
    "backend.yaml",
    "gateway-api.yaml",
    "gateway-clusters.yaml",
    "request-authentication.yaml",
    "sidecar.yaml",
    "stats-tags.yaml",
    "trafficextension.yaml",
    "wasmplugin.yaml",
];
const ISTIO_PLUGINS: &[&str] = &[
    "gateway-api.yaml",
    "sidecar.yaml",
    "trafficextension.yaml",
    "wasmplugin.yaml",
];

/// The documents of envoy/istio/`name` with ISTIO_VARS substituted; panics on a `${VAR}` it does not
/// know, so a new variable cannot slip past the checks.
fn istio_file(name: &str) -> Vec<Value> {
    let rel = format!("envoy/istio/{name}");
    let mut text = read(&rel);
    for (var, value) in ISTIO_VARS {
        text = text.replace(&format!("${{{var}}}"), value);
    }
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        assert!(!line.contains("${"), "{rel}: unknown variable in {line:?}");
    }
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The `spec` of the one WasmPlugin or TrafficExtension in `name`, and its Wasm settings (the spec
/// itself for a WasmPlugin, `spec.wasm` for a TrafficExtension).
fn plugin_spec(name: &str) -> (Value, Value) {
    let docs = istio_file(name);
    assert_eq!(docs.len(), 1, "{name}: one document");
    let doc = &docs[0];
    assert_eq!(doc["apiVersion"], "extensions.istio.io/v1alpha1", "{name}");
    let spec = doc["spec"].clone();
    let wasm = match doc["kind"].as_str() {
        Some("WasmPlugin") => spec.clone(),
        Some("TrafficExtension") => spec["wasm"].clone(),
        other => panic!("{name}: kind {other:?}"),
    };
    (spec, wasm)
}

/// Every plugin manifest (WasmPlugin, TrafficExtension for a gateway by label, by Gateway-API
/// targetRefs, and for a sidecar) carries the same pluginConfig, which tollgate accepts
/// (Config::try_from, then Envoy running the filter's on_configure); its backend.cluster is the
/// cluster Istio creates for the Webdis Service in backend.yaml, whose ConfigMap points Webdis at the
/// Redis Service; the placement rules of a production mesh hold (not the root namespace, SERVER only in
/// a sidecar, targetRefs for Gateway API, a priority, the gateway clusters EnvoyFilter).
#[test]
fn istio_manifests_fit_together_and_plugin_config_is_accepted() {
    let (_, reference) = plugin_spec("wasmplugin.yaml");
    for name in ISTIO_PLUGINS {
        let (spec, wasm) = plugin_spec(name);
        assert_eq!(
            wasm["pluginConfig"], reference["pluginConfig"],
            "{name}: pluginConfig differs from wasmplugin.yaml's"
        );
        assert!(
            wasm["url"].as_str().unwrap().starts_with("oci://"),
            "{name}: url"
        );
        assert!(wasm["sha256"].is_string(), "{name}: sha256");
        assert_eq!(wasm["pluginName"], "tollgate", "{name}");
        assert_eq!(spec["phase"], "AUTHZ", "{name}");
        assert!(spec["priority"].is_i64(), "{name}: priority");
        assert!(
            ["FAIL_CLOSE", "FAIL_OPEN", "FAIL_RELOAD"]
                .contains(&wasm["failStrategy"].as_str().unwrap()),
            "{name}: failStrategy"
        );
        assert_eq!(
            spec["selector"].is_object() as u8 + spec["targetRefs"].is_array() as u8,
            1,
            "{name}: exactly one of selector and targetRefs"
        );
        let namespace = istio_file(name)[0]["metadata"]["namespace"].clone();
        assert_ne!(
            namespace, "istio-system",
            "{name}: in the root namespace a selector applies to the whole mesh"
        );
    }
    let (sidecar, _) = plugin_spec("sidecar.yaml");
    assert_eq!(
        sidecar["match"],
        json!([{ "mode": "SERVER" }]),
        "sidecar.yaml: inbound only, or a mesh-internal request is counted on both sides"
    );
    let (gateway_api, _) = plugin_spec("gateway-api.yaml");
    assert_eq!(
        gateway_api["targetRefs"][0]["group"],
        "gateway.networking.k8s.io"
    );
    assert_eq!(gateway_api["targetRefs"][0]["kind"], "Gateway");

    // The shipped limits are what a platform engineer asks for: 100 per minute per verified user,
    // with an explicit burst, in exact mode, and a per-client-address catch-all. The user is the
    // `sub` that Istio's jwt_authn wrote under "payload" (Istio 1.24+: pilot/pkg/security/authn/
    // policy_applier.go sets PayloadInMetadata to filters.EnvoyJwtFilterPayload, "payload").
    let rules = reference["pluginConfig"]["rules"].as_array().unwrap();
    let per_user = &rules[0];
    assert_eq!(
        per_user["key"],
        json!(["metadata:envoy.filters.http.jwt_authn:payload.sub"])
    );
    assert_eq!(
        (&per_user["rate"], &per_user["period_ms"], &per_user["mode"]),
        (&json!(100), &json!(60000), &json!("exact")),
        "per-user: 100 per minute, exact"
    );
    assert!(per_user["burst"].is_u64(), "per-user: an explicit burst");
    let catch_all = rules.last().unwrap();
    assert_eq!(catch_all["key"], json!(["client_ip:v6=/56"]));
    assert!(
        catch_all.get("match").is_none(),
        "the catch-all applies to every request"
    );
    // Its RequestAuthentication runs on the same proxies as the plugin.
    let authn = istio_file("request-authentication.yaml");
    assert_eq!(
        find(&authn, "RequestAuthentication", "tollgate-jwt")["spec"]["selector"],
        plugin_spec("wasmplugin.yaml").0["selector"],
        "the JWT is verified where the plugin runs"
    );

    let json_config = serde_json::to_string(&reference["pluginConfig"]).unwrap();
    let config = tollgate_core::config::Config::try_from(json_config.as_bytes())
        .unwrap_or_else(|e| panic!("pluginConfig rejected: {e:?}\n{json_config}"));
    eprintln!("pluginConfig accepted: {}", config.summary());
    assert_envoy_accepts(
        "istio-plugin-config",
        &render_envoy_yaml(
            &json_config,
            7379,
            10000,
            9901,
            &wasm_path(),
            common::envoy::NO_UPSTREAM,
        ),
    );

    // backend.cluster = outbound|<port>||<service>.<namespace>.svc.cluster.local
    let cluster = reference["pluginConfig"]["backend"]["cluster"]
        .as_str()
        .unwrap();
    let parts: Vec<&str> = cluster.split('|').collect();
    assert_eq!(parts.len(), 4, "{cluster}");
    assert_eq!(parts[0], "outbound", "{cluster}");
    let port: u64 = parts[1].parse().unwrap();
    let webdis_host = parts[3];
    let (svc, ns) = webdis_host
        .strip_suffix(".svc.cluster.local")
        .and_then(|h| h.split_once('.'))
        .unwrap_or_else(|| panic!("{cluster}: not <svc>.<ns>.svc.cluster.local"));
    let backend = istio_file("backend.yaml");
    let service = find(&backend, "Service", svc);
    assert_eq!(service["metadata"]["namespace"], ns);
    let svc_port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == json!(port))
        .unwrap_or_else(|| panic!("Service {svc} has no port {port}"));
    assert!(
        svc_port["appProtocol"] == "http" || svc_port["name"].as_str().unwrap().starts_with("http"),
        "Istio must see the Webdis port as HTTP: {svc_port}"
    );
    let ns_doc = find(&backend, "Namespace", ns);
    assert_eq!(ns_doc["metadata"]["labels"]["istio-injection"], "enabled");

    // Gateways that filter their clusters get Webdis' through the EnvoyFilter's annotation.
    let clusters = istio_file("gateway-clusters.yaml");
    let ef = find(&clusters, "EnvoyFilter", "tollgate-webdis-cluster");
    assert_eq!(
        ef["metadata"]["annotations"]["envoyfilter.istio.io/referenced-services"],
        json!(format!("{ns}/{webdis_host}")),
        "the EnvoyFilter names the Service behind backend.cluster"
    );
    assert_eq!(
        ef["spec"]["workloadSelector"]["labels"],
        plugin_spec("wasmplugin.yaml").0["selector"]["matchLabels"],
        "the EnvoyFilter applies to the gateways the plugin runs on"
    );

    // The Webdis Deployment serves the Service's target port with the ConfigMap's config, which
    // points at the Redis Service.
    let deployment = find(&backend, "Deployment", svc);
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "Service {svc} selects the Deployment's pods");
    }
    let cm_name = deployment["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
        .as_str()
        .unwrap();
    let cm = find(&backend, "ConfigMap", cm_name);
    let webdis: Value = serde_json::from_str(cm["data"]["webdis.json"].as_str().unwrap())
        .expect("the ConfigMap's webdis.json is JSON");
    assert_eq!(webdis["http_port"], svc_port["targetPort"]);
    assert_eq!(webdis["http_host"], "0.0.0.0");
    assert_eq!(
        webdis["acl"],
        json!([{ "disabled": ["*"] }, { "enabled": ["EVALSHA", "EVAL"] }]),
        "Webdis runs the filter's two commands only"
    );
    let redis_host = webdis["redis_host"].as_str().unwrap();
    let redis_svc = redis_host
        .strip_suffix(&format!(".{ns}.svc.cluster.local"))
        .unwrap_or_else(|| panic!("redis_host {redis_host}"));
    let redis = find(&backend, "Service", redis_svc);
    assert!(
        redis["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["port"] == webdis["redis_port"]),
        "webdis' redis_port is a port of Service {redis_svc}"
    );
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        strings(&container["args"]),
        vec![format!(
            "{}/webdis.json",
            container["volumeMounts"][0]["mountPath"].as_str().unwrap()
        )],
        "webdis reads the mounted ConfigMap"
    );

    // Only the plugin's proxies may call Webdis, only Webdis may call Redis; no principal is written
    // for one trust domain or one gateway (they are the documented variables).
    let principals = |name: &str| {
        strings(
            &find(&backend, "AuthorizationPolicy", name)["spec"]["rules"][0]["from"][0]["source"]
                ["principals"],
        )
    };
    assert_eq!(
        principals("webdis-callers"),
        ["cluster.local/ns/istio-ingress/sa/istio-ingressgateway"]
    );
    assert_eq!(
        principals("redis-callers"),
        [format!("cluster.local/ns/{ns}/sa/webdis")]
    );
    let raw = read("envoy/istio/backend.yaml");
    assert!(
        raw.contains("- ${TRUST_DOMAIN}/ns/${GATEWAY_NAMESPACE}/sa/${GATEWAY_SERVICE_ACCOUNT}"),
        "webdis-callers is written with the documented variables"
    );
}

/// stats-tags.yaml's custom bootstrap carries the same stats_tags as every Envoy configuration here.
#[test]
fn istio_stats_bootstrap_has_the_envoy_stats_tags() {
    let docs = istio_file("stats-tags.yaml");
    let cm = find(&docs, "ConfigMap", "tollgate-stats-tags");
    let bootstrap: Value =
        serde_json::from_str(cm["data"]["custom_bootstrap.json"].as_str().unwrap())
            .expect("custom_bootstrap.json is JSON");
    // The template parses as YAML, stats_config is plain data: compare as JSON values.
    assert_eq!(
        bootstrap["stats_config"]["stats_tags"],
        envoy_template("envoy/envoy.yaml")["stats_config"]["stats_tags"]
    );
}

/// The CRDs of Istio 1.30.3 under tests/schemas/ (see its README), by kind and version: the
/// `openAPIV3Schema`, made strict the way `kubectl apply --validate=strict` is (an object without
/// `x-kubernetes-preserve-unknown-fields` takes no field its schema does not list), and with the
/// object's apiVersion, kind and metadata added.
fn istio_crd_schema(kind: &str, version: &str) -> Value {
    fn strict(v: &mut Value) {
        match v {
            Value::Object(map) => {
                let preserve =
                    map.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
                let is_object =
                    map.contains_key("properties") || map.get("type") == Some(&json!("object"));
                if is_object && !preserve && !map.contains_key("additionalProperties") {
                    map.insert("additionalProperties".into(), json!(false));
                }
                map.values_mut().for_each(strict);
            }
            Value::Array(items) => items.iter_mut().for_each(strict),
            _ => {}
        }
    }
    let dir = repo_root().join("tests/schemas/istio-1.30.3");
    let mut found = None;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if crd["spec"]["names"]["kind"] != kind {
            continue;
        }
        let v = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == version)
            .unwrap_or_else(|| panic!("{kind} has no version {version}"));
        found = Some(v["schema"]["openAPIV3Schema"].clone());
    }
    let mut schema = found.unwrap_or_else(|| panic!("no CRD for {kind} in {}", dir.display()));
    let props = schema["properties"].as_object_mut().unwrap();
    props.insert("apiVersion".into(), json!({ "type": "string" }));
    props.insert("kind".into(), json!({ "type": "string" }));
    let string_map = json!({ "type": "object", "additionalProperties": { "type": "string" } });
    props.insert(
        "metadata".into(),
        json!({ "type": "object", "required": ["name"], "properties": {
            "name": { "type": "string" }, "namespace": { "type": "string" },
            "labels": string_map, "annotations": string_map } }),
    );
    schema["required"] = json!(["apiVersion", "kind", "metadata", "spec"]);
    strict(&mut schema);
    schema
}

/// Schema errors of one Istio object, or none for a kind that is not Istio's.
fn istio_schema_errors(doc: &Value) -> Option<Vec<String>> {
    let (group, version) = doc["apiVersion"].as_str()?.split_once('/')?;
    if !group.ends_with(".istio.io") {
        return None;
    }
    let schema = istio_crd_schema(doc["kind"].as_str()?, version);
    let validator = jsonschema::draft4::new(&schema).expect("CRD schema compiles");
    Some(
        validator
            .iter_errors(doc)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect(),
    )
}

/// Every Istio object in envoy/istio/ is valid against Istio 1.30.3's CRD schema with unknown fields
/// rejected, and the CEL rules of those CRDs that our manifests touch hold. Kubernetes' own kinds
/// (Namespace, Deployment, Service, ConfigMap, ServiceAccount) are not schema-checked here.
#[test]
fn istio_manifests_match_the_istio_crd_schemas() {
    let mut checked = Vec::new();
    for name in ISTIO_FILES {
        for doc in istio_file(name) {
            let what = format!("{name}: {} {}", doc["kind"], doc["metadata"]["name"]);
            let Some(errors) = istio_schema_errors(&doc) else {
                continue;
            };
            assert!(errors.is_empty(), "{what}:\n{}", errors.join("\n"));
            // CEL rules (x-kubernetes-validations) the validator does not run.
            let spec = &doc["spec"];
            let has = |k: &str| spec.get(k).is_some() as u8;
            assert!(
                has("selector") + has("targetRefs") + has("workloadSelector") <= 1,
                "{what}"
            );
            if doc["kind"] == "TrafficExtension" {
                assert_eq!(
                    has("wasm") + has("lua"),
                    1,
                    "{what}: exactly one of wasm, lua"
                );
            }
            for r in spec["targetRefs"].as_array().into_iter().flatten() {
                assert!(
                    r.get("namespace").is_none(),
                    "{what}: no cross-namespace targetRefs"
                );
            }
            checked.push(what);
        }
    }
    eprintln!("valid against Istio 1.30.3 CRDs: {checked:#?}");
    for kind in [
        "WasmPlugin",
        "TrafficExtension",
        "EnvoyFilter",
        "AuthorizationPolicy",
        "PeerAuthentication",
        "RequestAuthentication",
    ] {
        assert!(
            checked.iter().any(|c| c.contains(&format!("\"{kind}\""))),
            "no {kind} checked: {checked:?}"
        );
    }

    // The check has teeth: a misspelt or misplaced field, a wrong enum value, a bad digest.
    let base = istio_file("trafficextension.yaml").remove(0);
    type Break = fn(&mut Value);
    let broken: [(&str, Break); 5] = [
        ("spec.priorty", |d| d["spec"]["priorty"] = json!(1)),
        ("url under spec", |d| {
            d["spec"]["url"] = json!("oci://x/y:1")
        }),
        ("spec.wasm.failStrategy", |d| {
            d["spec"]["wasm"]["failStrategy"] = json!("FAIL_SOMETIMES")
        }),
        ("spec.wasm.sha256", |d| {
            d["spec"]["wasm"]["sha256"] = json!("sha256:abc")
        }),
        ("spec.match[0].mode", |d| {
            d["spec"]["match"] = json!([{ "mode": "INBOUND" }])
        }),
    ];
    for (what, breaks) in broken {
        let mut doc = base.clone();
        breaks(&mut doc);
        assert!(
            !istio_schema_errors(&doc).unwrap().is_empty(),
            "{what}: the schema check must reject it"
        );
    }
}

/// The Dockerfile is the single-layer Wasm image Istio pulls: `FROM scratch`, `plugin.wasm`, built from
/// the directory that holds tollgate.wasm.
#[test]
fn dockerfile_packages_plugin_wasm() {
    let text = read("Dockerfile");
    let instructions: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        instructions,
        [
            "FROM scratch",
            "ARG WASM=tollgate.wasm",
            "COPY ${WASM} ./plugin.wasm"
        ]
    );
    // The documented build context holds only the module, copied from where `make build` puts it.
    assert!(
        text.contains("cp target/wasm32-wasip1/release/tollgate.wasm target/oci/")
            && text.contains("-f Dockerfile target/oci\n"),
        "the documented build context"
    );
    assert!(
        repo_root()
            .join("target/wasm32-wasip1/release/tollgate.wasm")
            .is_file(),
        "tollgate.wasm, copied into the build context (run `make build`)"
    );
}

/// An Envoy template as YAML: its `{{PLACEHOLDER}}`s (ports, paths) replaced by 0 so it parses.
fn envoy_template(rel: &str) -> Value {
    let text = read(rel);
    let re = regex::Regex::new(r"\{\{[A-Z0-9_]+\}\}").unwrap();
    let mut docs: Vec<Value> = serde_saphyr::from_multiple(&re.replace_all(&text, "0"))
        .unwrap_or_else(|e| panic!("{rel}: {e}"));
    assert_eq!(docs.len(), 1, "{rel} is one document");
    docs.remove(0)
}

/// Every Envoy bootstrap the repository ships (a YAML file under envoy/ or deploy/ with a top-level
/// `static_resources:`, as deploy/validate-envoy.sh finds them), relative to the repository.
fn envoy_bootstraps() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for dir in ["envoy", "deploy"] {
        walk(&repo_root().join(dir), &mut files);
    }
    let mut rels: Vec<String> = files
        .iter()
        .filter(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .any(|l| l == "static_resources:")
        })
        .map(|p| {
            p.strip_prefix(repo_root())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    rels.sort();
    rels
}

/// The `stats_tags` of envoy/envoy.yaml as (tag name, regex).
fn stats_tags() -> Vec<(String, regex::Regex)> {
    envoy_template("envoy/envoy.yaml")["stats_config"]["stats_tags"]
        .as_array()
        .expect("envoy/envoy.yaml: stats_config.stats_tags")
        .iter()
        .map(|t| {
            (
                t["tag_name"].as_str().unwrap().to_string(),
                regex::Regex::new(t["regex"].as_str().unwrap()).unwrap(),
            )
        })
        .collect()
}

/// Envoy's tag extraction (source/common/stats/tag_producer_impl.cc): every extractor matches the
/// original name; the first capture group is cut from the name, the second (else the first) is the
/// tag's value. Returns the tag-extracted name and the tags.
fn extract_tags(tags: &[(String, regex::Regex)], name: &str) -> (String, Vec<(String, String)>) {
    let mut cut = vec![false; name.len()];
    let mut found = Vec::new();
    for (tag, re) in tags {
        let Some(caps) = re.captures(name) else {
            continue;
        };
        let Some(removed) = caps.get(1) else { continue };
        let value = caps.get(2).unwrap_or(removed);
        found.push((tag.clone(), value.as_str().to_string()));
        cut[removed.range()].iter_mut().for_each(|c| *c = true);
    }
    let kept = name
        .char_indices()
        .filter(|(i, _)| !cut[*i])
        .map(|(_, c)| c)
        .collect();
    (kept, found)
}

/// Every Envoy configuration shipped carries envoy/envoy.yaml's stats_config, so the rule is a
/// Prometheus label wherever tollgate runs (and the bench templates stay in step with the demo).
#[test]
fn every_envoy_config_tags_the_rule() {
    let files = envoy_bootstraps();
    for want in [
        "deploy/compose/envoy.yaml",
        "envoy/bench/native.yaml",
        "envoy/envoy.yaml",
        "envoy/redis-cluster/envoy.yaml",
    ] {
        assert!(
            files.iter().any(|f| f == want),
            "{want} not found: {files:?}"
        );
    }
    let reference = &envoy_template("envoy/envoy.yaml")["stats_config"];
    assert!(reference["stats_tags"].is_array(), "envoy/envoy.yaml");
    for file in &files {
        assert_eq!(
            &envoy_template(file)["stats_config"],
            reference,
            "{file}: stats_config differs from envoy/envoy.yaml's"
        );
    }
}

/// The tag regexes are right for every rule name the configuration accepts: the rule (and a backend
/// error's class) become tags, the rest of the name is the same for every rule, and the proxy-wide
/// breaker gauge gets no tag. Names at the edges of the rule charset ([A-Za-z0-9_-], 1 to 64) and
/// names equal to metric names are included; a name with a dot is rejected by the configuration,
/// which is what makes "the first segment is the rule" hold.
#[test]
fn stats_tag_regexes_extract_rule_and_class() {
    let tags = stats_tags();
    let long = "a-".repeat(32);
    let rules = [
        "a",
        "Z",
        "0",
        "-",
        "_",
        "per-user",
        "A-b_9",
        "tollgate",
        "breaker_open",
        "backend_error",
        "allowed",
        "shadow_denied",
        "rbac",
        "cache",
        long.as_str(),
    ];
    let accepted = |name: &str| {
        let cfg = json!({ "rules": [ { "name": name, "rate": 1 } ] }).to_string();
        tollgate_core::config::Config::try_from(cfg.as_bytes()).is_ok()
    };
    for bad in ["a.b", "", "ä", &"a".repeat(65)] {
        assert!(!accepted(bad), "rule name {bad:?} must be rejected");
    }
    let per_rule = [
        "allowed",
        "denied",
        "shadow_denied",
        "local_allowed",
        "local_denied",
        "backend_calls",
        "backend_errors",
        "failure_mode_allowed",
        "lease_granted",
        "lease_dropped",
        "delayed",
        "delay_ms_total",
        "inflight_rejected",
        "lease_evicted",
        "ambiguous",
        "usage_readers_full",
        "backend_latency_ms",
    ];
    let classes = ["unreachable", "overloaded", "auth", "script", "malformed"];
    let s = |a: &str, b: &str| (a.to_string(), b.to_string());
    for rule in rules {
        assert!(accepted(rule), "rule name {rule:?} is valid");
        for metric in per_rule {
            assert_eq!(
                extract_tags(&tags, &format!("wasmcustom.tollgate.{rule}.{metric}")),
                (
                    format!("wasmcustom.tollgate.{metric}"),
                    vec![s("rule", rule)]
                ),
                "rule {rule:?}, metric {metric}"
            );
        }
        for class in classes {
            let (name, mut got) = extract_tags(
                &tags,
                &format!("wasmcustom.tollgate.{rule}.backend_error.{class}"),
            );
            got.sort();
            assert_eq!(
                (name, got),
                (
                    "wasmcustom.tollgate.backend_error".to_string(),
                    vec![s("class", class), s("rule", rule)]
                ),
                "rule {rule:?}, class {class}"
            );
        }
    }
    assert_eq!(
        extract_tags(&tags, "wasmcustom.tollgate.breaker_open"),
        ("wasmcustom.tollgate.breaker_open".to_string(), vec![])
    );
    // Envoy's own stats are left alone.
    assert_eq!(
        extract_tags(&tags, "cluster.tollgate_backend.upstream_rq_total").1,
        vec![]
    );
}

/// docker-compose.yaml starts in the order the tests do (each process ready before the next starts)
/// and restarts what stops: every service restarts unless stopped, Webdis waits for a healthy Redis,
/// Envoy for a healthy Webdis.
#[test]
fn compose_starts_in_readiness_order_and_restarts() {
    let doc = compose();
    let services = doc["services"].as_object().unwrap();
    for (name, service) in services {
        assert_eq!(service["restart"], "unless-stopped", "{name}: restart");
    }
    let condition = |svc: &str, dep: &str| services[svc]["depends_on"][dep]["condition"].clone();
    assert_eq!(condition("webdis", "redis"), "service_healthy");
    assert_eq!(condition("envoy", "webdis"), "service_healthy");
    assert_eq!(condition("envoy", "app"), "service_started");
    for name in ["redis", "webdis", "envoy"] {
        let test = strings(&services[name]["healthcheck"]["test"]);
        assert_eq!(
            test[0], "CMD",
            "{name}: exec form, no shell needed but the probe's own"
        );
    }
}

/// The compose health probes work against the real processes the tests run (the same Redis, Webdis
/// with the compose ACL, and Envoy with the demo configuration), with the ports swapped for the test's,
/// and fail when nothing answers.
#[test]
fn compose_healthchecks_probe_real_processes() {
    let doc = compose();
    let dir = scratch_dir("compose-health");
    // The check as the container runs it, on this host: an argument naming a file the service mounts
    // (deploy/compose/healthcheck.sh) becomes a copy of that file, and the port becomes `to`.
    let probe = |service: &str, from: u16, to: u16| -> bool {
        let test = strings(&doc["services"][service]["healthcheck"]["test"]);
        let mounted = mounts(&doc["services"][service]);
        let args: Vec<String> = test[1..]
            .iter()
            .map(|a| match mounted.iter().find(|(_, dst)| dst == a) {
                Some((src, _)) => {
                    let copy = dir.join(format!("{service}-{to}.sh"));
                    let text = read(src.trim_start_matches("./"));
                    std::fs::write(&copy, text.replace(&from.to_string(), &to.to_string()))
                        .unwrap_or_else(|e| panic!("write {}: {e}", copy.display()));
                    copy.display().to_string()
                }
                None => a.replace(&from.to_string(), &to.to_string()),
            })
            .collect();
        Command::new(&args[0])
            .args(&args[1..])
            .output()
            .unwrap_or_else(|e| panic!("{service} probe {args:?}: {e}"))
            .status
            .success()
    };
    let acl = json!([{ "disabled": ["*"] }, { "enabled": ["EVALSHA", "EVAL"] }]);
    let redis = common::Redis::start(&dir);
    let webdis = common::Webdis::start_with(
        &dir,
        redis.port,
        &common::WebdisOpts {
            acl: Some(acl),
            ..Default::default()
        },
    );
    let envoy = common::Envoy::start(&dir, &demo_config(), webdis.port);
    assert!(probe("redis", 6379, redis.port), "redis probe");
    assert!(
        probe("webdis", 7379, webdis.port),
        "webdis probe (EVAL through the ACL)"
    );
    assert!(
        probe("envoy", 9901, envoy.admin_port),
        "envoy probe (/ready)"
    );
    let nothing = common::free_port();
    for (service, port) in [("redis", 6379), ("webdis", 7379), ("envoy", 9901)] {
        assert!(
            !probe(service, port, nothing),
            "{service} probe with nothing listening"
        );
    }
}

/// Every Envoy bootstrap the repository ships (templates under envoy/ and deploy/) is edge-safe: each
/// HTTP connection manager takes the client address from the TCP peer (`use_remote_address`), and
/// normalises paths before filters and routes see them (README: "Edge settings"). A configuration
/// without an HTTP connection manager (the Redis Cluster front) has nothing to set.
#[test]
fn shipped_envoy_configs_are_edge_safe() {
    fn hcms<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
        match v {
            Value::Object(m) => {
                if m.get("@type").and_then(Value::as_str).is_some_and(|t| {
                    t.ends_with("http_connection_manager.v3.HttpConnectionManager")
                }) {
                    out.push(v);
                }
                m.values().for_each(|x| hcms(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| hcms(x, out)),
            _ => {}
        }
    }
    let mut files = Vec::new();
    let mut dirs = vec![repo_root().join("envoy"), repo_root().join("deploy")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut checked = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        if !text.lines().any(|l| l == "static_resources:") {
            continue;
        }
        let rel = path
            .strip_prefix(repo_root())
            .unwrap()
            .display()
            .to_string();
        // Placeholders ({{PORT}}) would read as flow mappings: give them a plain value.
        let mut plain = String::new();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("{{") {
            let end = rest[start..].find("}}").unwrap() + start;
            plain.push_str(&rest[..start]);
            plain.push('1');
            rest = &rest[end + 2..];
        }
        plain.push_str(rest);
        let doc: Value = serde_saphyr::from_str(&plain).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let mut found = Vec::new();
        hcms(&doc, &mut found);
        for hcm in &found {
            for (field, want) in [
                ("use_remote_address", json!(true)),
                ("normalize_path", json!(true)),
                ("merge_slashes", json!(true)),
                ("path_with_escaped_slashes_action", json!("REJECT_REQUEST")),
            ] {
                assert_eq!(hcm[field], want, "{rel}: {field}");
            }
        }
        checked.push(format!("{rel}: {}", found.len()));
    }
    eprintln!("HTTP connection managers checked: {checked:?}");
    for want in [
        "envoy/envoy.yaml: 1",
        "deploy/compose/envoy.yaml: 1",
        "envoy/bench/plain.yaml: 1",
        "envoy/bench/native.yaml: 1",
        "envoy/bench/wasm-floor.yaml: 1",
        "envoy/bench/wasm-floor-calls.yaml: 1",
        "envoy/bench/wasm-floor-hold.yaml: 1",
        "envoy/redis-cluster/envoy.yaml: 0",
    ] {
        assert!(checked.iter().any(|c| c == want), "{want} in {checked:?}");
    }
}

/// The text of every fenced block of `info` (the words after the opening fence) in `markdown`.
fn fenced(markdown: &str, info: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<(bool, String)> = None;
    for line in markdown.lines() {
        let fence = line.trim();
        match open.take() {
            None => {
                if let Some(lang) = fence.strip_prefix("```") {
                    open = Some((lang.trim() == info, String::new()));
                }
            }
            Some((wanted, mut text)) => {
                if fence == "```" {
                    if wanted {
                        blocks.push(text);
                    }
                } else {
                    text.push_str(line);
                    text.push('\n');
                    open = Some((wanted, text));
                }
            }
        }
    }
    blocks
}

/// The configurations the deploy guides show are the ones the manifests ship: docs/deploy/istio.md's
/// ```json block is the Istio plugins' pluginConfig, docs/deploy/higress.md's ```json higress block
/// the Higress WasmPlugin's defaultConfig (its password variable filled in as the page fills it).
#[test]
fn deploy_guides_show_the_shipped_configurations() {
    let istio = fenced(&read("docs/deploy/istio.md"), "json");
    assert_eq!(istio.len(), 1, "docs/deploy/istio.md: one ```json block");
    let shown: Value = serde_json::from_str(&istio[0]).unwrap();
    assert_eq!(
        shown,
        plugin_spec("wasmplugin.yaml").1["pluginConfig"],
        "docs/deploy/istio.md shows the manifests' pluginConfig"
    );

    let higress = fenced(&read("docs/deploy/higress.md"), "json higress");
    assert_eq!(
        higress.len(),
        1,
        "docs/deploy/higress.md: one ```json higress block"
    );
    let shown: Value = serde_json::from_str(&higress[0]).unwrap();
    let manifest = read("envoy/higress/wasmplugin.yaml").replace("${REDIS_PASSWORD}", "secret");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&manifest).unwrap();
    assert_eq!(
        shown, docs[0]["spec"]["defaultConfig"],
        "docs/deploy/higress.md shows the WasmPlugin's defaultConfig"
    );
}

/// The per-client catch-all keys on the address the gateway sees. Behind Istio's default gateway
/// Service (type LoadBalancer, externalTrafficPolicy: Cluster) kube-proxy source-NATs it to a node's
/// address, and numTrustedProxies only helps behind an HTTP balancer that appends x-forwarded-for
/// (behind a TCP one it would trust the entry the client wrote). The guide and every plugin manifest
/// say which fix fits which balancer.
#[test]
fn istio_guide_keeps_the_client_address() {
    let guide = read("docs/deploy/istio.md");
    let edge = &guide[guide
        .find("## Edge settings on Istio")
        .expect("docs/deploy/istio.md: Edge settings on Istio")..];
    for want in [
        "externalTrafficPolicy: Local",
        "numTrustedProxies",
        "TCP",
        "HTTP load balancer",
    ] {
        assert!(
            edge.contains(want),
            "docs/deploy/istio.md, edge settings: no {want:?}"
        );
    }
    for name in ISTIO_PLUGINS {
        let raw = read(&format!("envoy/istio/{name}"));
        assert!(
            raw.contains("externalTrafficPolicy: Local"),
            "envoy/istio/{name}: the per-client rule's comment must say how the gateway keeps the client address"
        );
    }
    let envoy = read("docs/deploy/envoy.md");
    assert!(
        envoy.contains("Never\n  behind a TCP balancer"),
        "docs/deploy/envoy.md: xff_num_trusted_hops only behind an HTTP balancer"
    );
}

/// Istio builds sidecar-inbound and waypoint connection managers with use_remote_address: false
/// (istio/istio pilot/pkg/networking/core/listener_inbound.go, listener_waypoint.go): there Envoy takes
/// the client address from the last x-forwarded-for entry (tests/edge.rs shows a client picking its
/// bucket that way), which a caller inside the mesh writes. The manifests that can run there, and the
/// guide, say so.
#[test]
fn sidecar_and_waypoint_manifests_warn_that_client_ip_is_x_forwarded_for() {
    for name in ["sidecar.yaml", "gateway-api.yaml"] {
        let raw = read(&format!("envoy/istio/{name}"));
        assert!(
            raw.contains("use_remote_address: false") && raw.contains("property:source.principal"),
            "envoy/istio/{name}: client_ip there is the last x-forwarded-for entry; say so and name the verified alternative"
        );
    }
    let guide = read("docs/deploy/istio.md");
    let edge = &guide[guide.find("## Edge settings on Istio").unwrap()..];
    assert!(
        edge.contains("use_remote_address: false") && edge.contains("Sidecars and waypoints"),
        "docs/deploy/istio.md, edge settings: sidecars and waypoints read x-forwarded-for"
    );
}

/// Istio starts its proxies at log level warning (istio/istio pilot/cmd/pilot-agent/app/cmd.go,
/// --proxyLogLevel), so the filter's info line `tollgate: configured` is not in a gateway's log: the
/// guide's check must not rely on it without saying how to raise the wasm logger.
#[test]
fn istio_guide_check_does_not_rely_on_an_info_log_line() {
    let guide = read("docs/deploy/istio.md");
    let check = &guide[guide.find("## Check that it works").unwrap()..];
    let check = &check[..check.find("## When it does not work").unwrap()];
    for block in fenced(check, "sh") {
        assert!(
            !block.contains("tollgate: configured") || check.contains("wasm:info"),
            "docs/deploy/istio.md: the check greps an info line Istio's default log level hides:\n{block}"
        );
    }
    assert!(
        check.contains("grep -c wasmcustom.tollgate"),
        "docs/deploy/istio.md: the check reads the filter's stats"
    );
}

/// request-authentication.yaml selects the gateway; a sidecar's per-user rule needs a
/// RequestAuthentication selecting the workload, or it finds no `sub` and limits nothing.
#[test]
fn sidecar_manifest_says_where_its_jwt_is_verified() {
    let raw = read("envoy/istio/sidecar.yaml");
    assert!(
        raw.contains("RequestAuthentication selecting this workload"),
        "envoy/istio/sidecar.yaml: per-user needs a RequestAuthentication on the workload"
    );
}

/// The Higress guide and manifest: the client address survives the gateway's Service only with
/// externalTrafficPolicy: Local (Higress' chart leaves it empty, Kubernetes' Cluster), and the
/// `tollgate: configured` info line is hidden by Higress' default proxy log level (warning).
#[test]
fn higress_guide_keeps_the_client_address_and_checks_by_stats() {
    let guide = read("docs/deploy/higress.md");
    let manifest = read("envoy/higress/wasmplugin.yaml");
    assert!(
        guide.contains("externalTrafficPolicy"),
        "docs/deploy/higress.md"
    );
    assert!(
        manifest.contains("externalTrafficPolicy: Local"),
        "envoy/higress/wasmplugin.yaml"
    );
    assert!(
        !guide.contains("The gateway's log has one line per worker"),
        "docs/deploy/higress.md: the configured line is info, hidden at Higress' default log level"
    );
}
