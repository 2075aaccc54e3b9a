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

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use common::envoy::{brief_log, envoy_file, render_envoy_yaml};
use common::redis_cluster::render_redis_proxy_yaml;
use common::yaml;
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

fn yaml_file(rel: &str) -> Vec<Value> {
    yaml::parse_documents(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
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
    let rendered = render_envoy_yaml(
        &demo_config(),
        COMPOSE_WEBDIS_PORT,
        COMPOSE_LISTEN_PORT,
        COMPOSE_ADMIN_PORT,
        Path::new(COMPOSE_WASM),
        COMPOSE_APP_PORT,
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

#[test]
fn yaml_subset_parser() {
    let text = r#"
# comment
a: 1
b: "two # not a comment"   # comment
c: 'it''s'
d:
- x
- y: 1
  z: [1, "2", {k: v}]
e:
  f: true
  g: ~
  h: |
    line 1
      line 2
  i: {"json": {"n": 1.5},
      "more": [true]}
j: http://host:80/path
k: "outbound|7379||webdis"
---
- 1
"#;
    let docs = yaml::parse_documents(text).unwrap();
    assert_eq!(
        docs[0],
        json!({"a": 1, "b": "two # not a comment", "c": "it's",
               "d": ["x", {"y": 1, "z": [1, "2", {"k": "v"}]}],
               "e": {"f": true, "g": null, "h": "line 1\n  line 2\n",
                     "i": {"json": {"n": 1.5}, "more": [true]}},
               "j": "http://host:80/path", "k": "outbound|7379||webdis"})
    );
    assert_eq!(docs[1], json!([1]));
    for text in [
        "a: &x 1",
        "a: >\n  folded",
        "a: b\n  c",
        "a:\n\t- 1",
        "a: 1\na: 2",
        "a: \"open",
    ] {
        assert!(yaml::parse(text).is_err(), "{text:?} should be rejected");
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

/// The WasmPlugin's pluginConfig, turned into JSON the way Istio hands it to the filter, is accepted by
/// tollgate (Config::try_from, then Envoy running the filter's on_configure); its backend.cluster is
/// the cluster Istio creates for the Webdis Service in backend.yaml, whose ConfigMap points Webdis at
/// the Redis Service.
#[test]
fn istio_manifests_fit_together_and_plugin_config_is_accepted() {
    let plugin_docs = yaml_file("envoy/istio/wasmplugin.yaml");
    let plugin = find(&plugin_docs, "WasmPlugin", "tollgate");
    assert_eq!(plugin["apiVersion"], "extensions.istio.io/v1alpha1");
    let spec = &plugin["spec"];
    assert!(spec["url"].as_str().unwrap().starts_with("oci://"), "url");
    assert!(spec["sha256"].is_string(), "sha256");
    assert!(
        ["AUTHN", "AUTHZ", "STATS", "UNSPECIFIED_PHASE"].contains(&spec["phase"].as_str().unwrap()),
        "phase"
    );
    assert!(
        ["FAIL_CLOSE", "FAIL_OPEN", "FAIL_RELOAD"]
            .contains(&spec["failStrategy"].as_str().unwrap()),
        "failStrategy"
    );
    assert!(
        spec["selector"]["matchLabels"]
            .as_object()
            .is_some_and(|m| !m.is_empty()),
        "selector.matchLabels"
    );

    let json_config = serde_json::to_string(&spec["pluginConfig"]).unwrap();
    let config = tollgate::config::Config::try_from(json_config.as_bytes())
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
    let cluster = spec["pluginConfig"]["backend"]["cluster"].as_str().unwrap();
    let parts: Vec<&str> = cluster.split('|').collect();
    assert_eq!(parts.len(), 4, "{cluster}");
    assert_eq!(parts[0], "outbound", "{cluster}");
    let port: u64 = parts[1].parse().unwrap();
    let (svc, ns) = parts[3]
        .strip_suffix(".svc.cluster.local")
        .and_then(|h| h.split_once('.'))
        .unwrap_or_else(|| panic!("{cluster}: not <svc>.<ns>.svc.cluster.local"));
    let backend = yaml_file("envoy/istio/backend.yaml");
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
        ["FROM scratch", "COPY tollgate.wasm ./plugin.wasm"]
    );
    let context: PathBuf = repo_root().join("target/wasm32-wasip1/release");
    assert!(
        text.contains("-f Dockerfile target/wasm32-wasip1/release"),
        "the documented build context"
    );
    assert!(
        context.join("tollgate.wasm").is_file(),
        "tollgate.wasm in the build context (run `make build`)"
    );
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
        let doc = yaml::parse(&plain).unwrap_or_else(|e| panic!("{rel}: {e}"));
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
        "envoy/redis-cluster/envoy.yaml: 0",
    ] {
        assert!(checked.iter().any(|c| c == want), "{want} in {checked:?}");
    }
}
