//! A real Envoy (from `make setup`: `.venv/bin/envoy`, or `$ENVOY_BIN`) running `envoy/envoy.yaml` with
//! the tollgate filter (`make build`: target/wasm32-wasip1/release/tollgate.wasm, or `$TOLLGATE_WASM`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::http::{try_http, Resp};
use super::{eventually, free_port, repo_root, wait_until, Proc};

/// The filter under test: `$TOLLGATE_WASM`, else the release build in target/. Panics if it is missing.
pub fn wasm_path() -> PathBuf {
    build_path("TOLLGATE_WASM", "tollgate.wasm")
}

/// The Higress artifact (feature `higress`): `$TOLLGATE_HIGRESS_WASM`, else `make
/// build`'s copy beside tollgate.wasm. Panics if it is missing.
pub fn higress_wasm_path() -> PathBuf {
    build_path("TOLLGATE_HIGRESS_WASM", "tollgate-higress.wasm")
}

fn build_path(var: &str, file: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/wasm32-wasip1/release").join(file));
    assert!(
        path.is_file(),
        "{file} not found at {} (run `make build`, or set {var})",
        path.display()
    );
    path
}

/// The Envoy binary: `$ENVOY_BIN`, else `.venv/bin/envoy`. Panics if it is missing.
pub fn envoy_bin() -> PathBuf {
    let path = std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/envoy"));
    assert!(
        path.is_file(),
        "envoy not found at {} (run `make setup`, or set ENVOY_BIN)",
        path.display()
    );
    path
}

/// The text of a file under envoy/ (e.g. `demo-config.json`).
pub fn envoy_file(name: &str) -> String {
    let path = repo_root().join("envoy").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The demo's plugin configuration (envoy/demo-config.json).
pub fn demo_config() -> String {
    envoy_file("demo-config.json")
}

/// The upstream port of tests that never send to `/app/`: the discard port, where nothing listens
/// here, so such a request would get Envoy's 503 rather than reach something unexpected.
pub const NO_UPSTREAM: u16 = 9;

/// Escapes text for the inside of a YAML single-quoted scalar.
fn yaml_single_quoted(text: &str) -> String {
    text.replace('\'', "''")
}

/// Where the access log of envoy/envoy.yaml goes unless a test reads it: nowhere (a test that sends
/// many requests would fill its Envoy's log with them).
pub const NO_ACCESS_LOG: &str = "/dev/null";

/// Renders envoy/envoy.yaml, its access log discarded. `plugin_config_json` is compacted to one line
/// when it is valid JSON; text that is not JSON goes in as it is (newlines become spaces), so tests
/// can feed Envoy a broken config.
pub fn render_envoy_yaml(
    plugin_config_json: &str,
    backend_port: u16,
    listen_port: u16,
    admin_port: u16,
    wasm_path: &Path,
    upstream_port: u16,
) -> String {
    render_envoy_yaml_logging(
        plugin_config_json,
        backend_port,
        listen_port,
        admin_port,
        wasm_path,
        upstream_port,
        NO_ACCESS_LOG,
    )
}

/// [`render_envoy_yaml`] with the access log written to `access_log` (a file, `/dev/stdout`).
pub fn render_envoy_yaml_logging(
    plugin_config_json: &str,
    backend_port: u16,
    listen_port: u16,
    admin_port: u16,
    wasm_path: &Path,
    upstream_port: u16,
    access_log: &str,
) -> String {
    let config = match serde_json::from_str::<serde_json::Value>(plugin_config_json) {
        Ok(v) => v.to_string(),
        Err(_) => plugin_config_json.replace(['\r', '\n'], " "),
    };
    envoy_file("envoy.yaml")
        .replace("{{ADMIN_PORT}}", &admin_port.to_string())
        .replace("{{LISTEN_PORT}}", &listen_port.to_string())
        .replace("{{BACKEND_PORT}}", &backend_port.to_string())
        .replace("{{UPSTREAM_PORT}}", &upstream_port.to_string())
        .replace(
            "{{WASM_PATH}}",
            &yaml_single_quoted(&wasm_path.to_string_lossy()),
        )
        .replace("{{ACCESS_LOG}}", &yaml_single_quoted(access_log))
        // Last, so nothing inside the plugin config is taken for a placeholder.
        .replace("{{PLUGIN_CONFIG}}", &yaml_single_quoted(&config))
}

pub struct Envoy {
    pub listen_port: u16,
    pub admin_port: u16,
    pub proc: Proc,
    /// The rendered bootstrap file.
    pub config_path: PathBuf,
}

impl Envoy {
    /// Starts Envoy with envoy/envoy.yaml, this plugin config and Webdis on `backend_port`; panics with
    /// the log if it does not become ready.
    pub fn start(dir: &Path, plugin_config_json: &str, backend_port: u16) -> Envoy {
        Self::try_start(dir, plugin_config_json, backend_port).unwrap_or_else(|log| {
            panic!("envoy did not start; log:\n{}", brief_log(&log));
        })
    }

    /// Like [`Envoy::start`], but Err(log) when Envoy exits before it is ready (a config the filter
    /// rejects makes Envoy refuse to start) or is not ready in 30 s.
    pub fn try_start(
        dir: &Path,
        plugin_config_json: &str,
        backend_port: u16,
    ) -> Result<Envoy, String> {
        Self::try_start_with_upstream(dir, plugin_config_json, backend_port, NO_UPSTREAM)
    }

    /// Like [`Envoy::try_start`], with the application (`/app/`) on `upstream_port`.
    pub fn try_start_with_upstream(
        dir: &Path,
        plugin_config_json: &str,
        backend_port: u16,
        upstream_port: u16,
    ) -> Result<Envoy, String> {
        let wasm = wasm_path();
        Self::try_start_wasm(
            dir,
            &wasm,
            plugin_config_json,
            (backend_port, upstream_port),
        )
    }

    /// Like [`Envoy::try_start_with_upstream`], with the filter built at `wasm`.
    pub fn try_start_wasm(
        dir: &Path,
        wasm: &Path,
        plugin_config_json: &str,
        (backend_port, upstream_port): (u16, u16),
    ) -> Result<Envoy, String> {
        Self::try_start_yaml(dir, |listen_port, admin_port| {
            render_envoy_yaml(
                plugin_config_json,
                backend_port,
                listen_port,
                admin_port,
                wasm,
                upstream_port,
            )
        })
    }

    /// Starts Envoy with the bootstrap YAML that `render(listen_port, admin_port)` returns (for tests
    /// that need a different template). Retries on fresh ports when a port was taken meanwhile.
    pub fn try_start_yaml(
        dir: &Path,
        render: impl Fn(u16, u16) -> String,
    ) -> Result<Envoy, String> {
        Self::try_start_yaml_with(dir, &[], &[], render)
    }

    /// Like [`Envoy::try_start_yaml`], with more command-line arguments for Envoy (e.g.
    /// `--file-flush-interval-msec 100` for a test that reads the access log).
    pub fn try_start_yaml_args(
        dir: &Path,
        args: &[&str],
        render: impl Fn(u16, u16) -> String,
    ) -> Result<Envoy, String> {
        Self::try_start_yaml_with(dir, args, &[], render)
    }

    /// Like [`Envoy::try_start_yaml`], with these variables set in Envoy's environment (where a
    /// template's `environment_variable` data sources read secrets).
    pub fn try_start_yaml_env(
        dir: &Path,
        env: &[(&str, &str)],
        render: impl Fn(u16, u16) -> String,
    ) -> Result<Envoy, String> {
        Self::try_start_yaml_with(dir, &[], env, render)
    }

    /// [`Envoy::try_start_yaml`] with more command-line arguments and environment variables.
    pub fn try_start_yaml_with(
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        render: impl Fn(u16, u16) -> String,
    ) -> Result<Envoy, String> {
        Self::try_start_yaml_workers(dir, 2, args, env, render)
    }

    /// [`Envoy::try_start_yaml_with`] with `workers` worker threads (`--concurrency`) instead of 2
    /// (`make peers` measures one worker).
    pub fn try_start_yaml_workers(
        dir: &Path,
        workers: u32,
        args: &[&str],
        env: &[(&str, &str)],
        render: impl Fn(u16, u16) -> String,
    ) -> Result<Envoy, String> {
        let bin = envoy_bin();
        let workers = workers.to_string();
        let mut last_log = String::new();
        for _attempt in 0..3 {
            let listen_port = free_port();
            let admin_port = free_port();
            let config_path = dir.join(format!("envoy-{listen_port}.yaml"));
            std::fs::write(&config_path, render(listen_port, admin_port))
                .map_err(|e| format!("write {}: {e}", config_path.display()))?;
            let mut cmd = Command::new(&bin);
            cmd.envs(env.iter().copied());
            cmd.arg("-c").arg(&config_path).args([
                "--concurrency",
                &workers,
                "--disable-hot-restart",
                "-l",
                "info",
            ]);
            cmd.args(args);
            let proc = Proc::spawn("envoy", cmd, &dir.join(format!("envoy-{listen_port}.log")));
            let mut envoy = Envoy {
                listen_port,
                admin_port,
                proc,
                config_path,
            };
            let mut exited = false;
            let ready = wait_until(Duration::from_secs(30), || {
                if let Some(Ok(Some(_))) = envoy.proc.child.as_mut().map(|c| c.try_wait()) {
                    exited = true;
                    return true;
                }
                matches!(try_http(admin_port, "GET", "/ready", &[]), Ok(r) if r.status == 200)
            });
            if ready && !exited {
                return Ok(envoy);
            }
            envoy.proc.stop();
            last_log = envoy.proc.log_text();
            if !exited {
                last_log.push_str("\n(envoy was not ready in 30 s)");
                break;
            }
            if !last_log.contains("Address already in use") {
                break;
            }
        }
        Err(last_log)
    }

    /// Envoy's log so far.
    pub fn log_text(&self) -> String {
        self.proc.log_text()
    }

    /// A request to the listener.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
        try_http(self.listen_port, method, path, headers).unwrap_or_else(|e| {
            panic!("{e}; envoy log:\n{}", brief_log(&self.log_text()));
        })
    }

    /// `GET path` on the listener.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        self.request("GET", path, headers)
    }

    /// A `GET` on the admin port (e.g. `/stats?format=prometheus`).
    pub fn admin(&self, path: &str) -> Resp {
        try_http(self.admin_port, "GET", path, &[]).unwrap_or_else(|e| {
            panic!(
                "admin {path}: {e}; envoy log:\n{}",
                brief_log(&self.log_text())
            )
        })
    }

    /// The admin `/stats` text (`name: value` lines).
    pub fn stats(&self) -> String {
        self.admin("/stats").body
    }

    /// The value of the counter or gauge `name` (e.g. `tollgate.per-user.allowed`); None when Envoy has
    /// no such stat (or it is a histogram).
    pub fn stat_value(&self, name: &str) -> Option<u64> {
        stat_in(&self.stats(), name)
    }

    /// `/stats` once `ready` holds for it: tollgate's counters reach Envoy up to a second after
    /// they are counted (polled, see [`eventually`]; the last text read if it never does).
    pub fn stats_when(&self, ready: impl Fn(&str) -> bool) -> String {
        eventually(|| self.stats(), |s| ready(s))
    }

    /// Stat `name` once `ready` holds for its value (polled as [`Envoy::stats_when`]); the last
    /// value read if it never does.
    pub fn stat_eventually(&self, name: &str, ready: impl Fn(Option<u64>) -> bool) -> Option<u64> {
        eventually(|| self.stat_value(name), |v| ready(*v))
    }
}

/// The checks rule `rule` decided, by an admin `/stats` text (see [`super::decided`]).
pub fn decided_in(stats: &str, rule: &str) -> u64 {
    super::decided(|name| stat_in(stats, name), rule)
}

/// An Envoy log without the long list of statically linked extensions it prints at start.
pub fn brief_log(log: &str) -> String {
    let mut out = String::with_capacity(log.len().min(64 * 1024));
    let mut skipped = 0usize;
    for line in log.lines() {
        // `[source/server/server.cc:467]   envoy.filters.http: envoy.bandwidth_limit, ...`
        if line.contains("source/server/server.cc:") && line.contains("]   ") {
            skipped += 1;
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    if skipped > 0 {
        out.push_str(&format!(
            "({skipped} lines listing linked extensions left out)\n"
        ));
    }
    out
}

/// The value of stat `name` in an admin `/stats` text.
pub fn stat_in(stats: &str, name: &str) -> Option<u64> {
    stats.lines().find_map(|line| {
        let (n, v) = line.split_once(": ")?;
        if n == name {
            v.trim().parse().ok()
        } else {
            None
        }
    })
}
