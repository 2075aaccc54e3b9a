//! The Envoy configurations the tools render: tollgate's plugin configuration for a measured rule,
//! and the templates under envoy/bench/ (the same placeholders as envoy/envoy.yaml). Every tollgate
//! configuration here keeps `failure_mode: closed`, so a backend failure shows as a 503, never as a
//! silent admission that would flatter the figures.

use std::path::Path;

use tollgate_e2e::envoy::NO_ACCESS_LOG;

/// tollgate's plugin configuration: one rule named `per-user` on requests under `path_prefix`,
/// keyed on `key`, in `mode`, Webdis as the backend (cluster `tollgate_backend`, 100 ms timeout), its
/// Redis keys under `bench-<name>`.
pub fn tollgate_config(
    name: &str,
    mode: &str,
    key: &str,
    (rate, burst): (u64, u64),
    path_prefix: &str,
) -> String {
    serde_json::json!({
        "backend": { "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 100 },
        "key_prefix": format!("bench-{name}"),
        "failure_mode": "closed",
        "response_headers": "ietf",
        "rules": [{
            "name": "per-user",
            "match": { "path_prefix": path_prefix },
            "key": [key],
            "rate": rate,
            "period_ms": 1000,
            "burst": burst,
            "mode": mode,
        }],
    })
    .to_string()
}

/// The ports a template under envoy/bench/ is rendered with.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// `{{BACKEND_PORT}}`: Webdis (cluster `tollgate_backend`), or the rate-limit service of a
    /// template that has one.
    pub backend: u16,
    /// `{{LISTEN_PORT}}` and `{{ADMIN_PORT}}`.
    pub listen: u16,
    pub admin: u16,
    /// `{{UPSTREAM_PORT}}`: the application under `/app/`.
    pub upstream: u16,
}

/// Renders a template under envoy/bench/ (the same placeholders as envoy/envoy.yaml, no plugin
/// config), its access log discarded.
pub fn render_bench_template(text: &str, ports: Ports, wasm: &Path) -> String {
    text.replace("{{ADMIN_PORT}}", &ports.admin.to_string())
        .replace("{{LISTEN_PORT}}", &ports.listen.to_string())
        .replace("{{BACKEND_PORT}}", &ports.backend.to_string())
        .replace("{{UPSTREAM_PORT}}", &ports.upstream.to_string())
        .replace("{{WASM_PATH}}", &wasm.to_string_lossy().replace('\'', "''"))
        .replace("{{ACCESS_LOG}}", NO_ACCESS_LOG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendered_template_keeps_no_placeholder() {
        let ports = Ports {
            backend: 1,
            listen: 2,
            admin: 3,
            upstream: 4,
        };
        let text = "{{ADMIN_PORT}} {{LISTEN_PORT}} {{BACKEND_PORT}} {{UPSTREAM_PORT}} \
                    '{{WASM_PATH}}' {{ACCESS_LOG}}";
        let out = render_bench_template(text, ports, Path::new("/tmp/it's.wasm"));
        assert_eq!(out, "3 2 1 4 '/tmp/it''s.wasm' /dev/null");
    }

    #[test]
    fn the_config_names_its_rule_key_and_limits() {
        let c: serde_json::Value = serde_json::from_str(&tollgate_config(
            "s",
            "exact",
            "header:x-user-id",
            (5, 7),
            "/app/",
        ))
        .unwrap_or_default();
        assert_eq!(c["key_prefix"], "bench-s");
        assert_eq!(c["failure_mode"], "closed");
        let rule = &c["rules"][0];
        assert_eq!(rule["match"]["path_prefix"], "/app/");
        assert_eq!(rule["key"][0], "header:x-user-id");
        assert_eq!((&rule["rate"], &rule["burst"]), (&5.into(), &7.into()));
        assert_eq!(rule["mode"], "exact");
    }
}
