//! What each measured system runs. Every one is one Envoy with one worker, routing `/app/` to the same
//! upstream; they differ in the rate limiter in front of the route:
//!
//! | system | Envoy | rate limiter |
//! |---|---|---|
//! | plain | envoy/bench/plain.yaml (router only) | none: the figure every other one is added over |
//! | wasm-floor-hold | envoy/bench/wasm-floor-hold.yaml: bench/wasm-floor holding each request for a Webdis `PING` its worker shares (no check) | Webdis → Redis |
//! | wasm-floor-script | the same, each callout one run of bench/wasm-floor/minimal_bucket.lua for the keys of its requests (the least a shared token bucket per key does) | Webdis → Redis |
//! | wasm-floor-kept | the same script, with tollgate's promise kept: a request waits for no more than the callout out and its own | Webdis → Redis |
//! | limitador-redis | envoy/bench/ratelimit.yaml (envoy.filters.http.ratelimit, gRPC) | limitador-server, storage `redis` |
//! | limitador-redis-cached | the same | limitador-server, storage `redis_cached` (its defaults) |
//! | tollgate-exact | envoy/envoy.yaml, tollgate exact (this build), one rule on `header:x-user-id` | Webdis → Redis |
//! | tollgate-exact-b | the same, with the filter at `--compare-wasm` | Webdis → Redis |
//!
//! Redis and Webdis are shared and run throughout; each system's Envoy (and Limitador) is started
//! fresh for each of its loads and stopped after it. No limit is ever reached (a billion per second
//! in Limitador, a million per second in tollgate), and a failed check answers 500 / 503, never an
//! admission: `failure_mode_deny` and tollgate's `failure_mode: closed`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tollgate_e2e as common;

use common::envoy::{brief_log, envoy_file, render_envoy_yaml, Envoy};
use common::http::try_http;
use common::{free_port, wait_until, Proc};
use tollgate_tools::configs::{render_bench_template, tollgate_config, Ports};

use crate::wrk::USER_HEADER;

/// The path every load requests: routed to the upstream, and matched by tollgate's rule.
pub const PATH: &str = "/app/peers";
const RULE_PREFIX: &str = "/app/";
/// tollgate's limit: far above anything this machine can send.
const HUGE_RATE: u64 = 1_000_000;
/// Limitador's limit per second, likewise.
const LIMITADOR_MAX: u64 = 1_000_000_000;
/// Envoy's worker threads in every system.
pub const WORKERS: u32 = 1;

/// Limitador's two storages measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// Every check a Redis round trip.
    Redis,
    /// Counters cached in Limitador and written to Redis in batches (`redis_cached`, its defaults:
    /// flushed every second).
    RedisCached,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum System {
    Plain,
    /// bench/wasm-floor in `hold` mode: each request held for a callout to Webdis (a `PING`) that
    /// the requests arriving meanwhile share, as tollgate's exact mode holds a new key's request,
    /// with no check at all: what the stock-Envoy architecture costs before any rate limiting.
    Hold(PathBuf),
    /// The same, each callout an `EVALSHA` of bench/wasm-floor/minimal_bucket.lua for the keys of
    /// the requests it is for: the stock-Envoy architecture with the least a shared token bucket
    /// per key does, without tollgate's own work.
    Script(PathBuf),
    /// The same script, its callouts sent from the root context: a request waits for no more
    /// than the callout out and its own, as tollgate's exact mode promises (the script floor's
    /// request that sent a callout waits for the next one too).
    Kept(PathBuf),
    Limitador(Storage),
    /// tollgate exact on this filter build.
    Tollgate(PathBuf),
    /// tollgate exact on the `--compare-wasm` build.
    TollgateB(PathBuf),
}

impl System {
    pub fn name(&self) -> &'static str {
        match self {
            System::Plain => "plain",
            System::Hold(_) => "wasm-floor-hold",
            System::Script(_) => "wasm-floor-script",
            System::Kept(_) => "wasm-floor-kept",
            System::Limitador(Storage::Redis) => "limitador-redis",
            System::Limitador(Storage::RedisCached) => "limitador-redis-cached",
            System::Tollgate(_) => "tollgate-exact",
            System::TollgateB(_) => "tollgate-exact-b",
        }
    }
}

/// The systems of a run, in the order they take turns (`floor`: bench/wasm-floor's build).
pub fn all(tollgate: &Path, floor: &Path, compare: Option<&Path>) -> Vec<System> {
    let mut v = vec![
        System::Plain,
        System::Hold(floor.to_path_buf()),
        System::Script(floor.to_path_buf()),
        System::Kept(floor.to_path_buf()),
        System::Limitador(Storage::Redis),
        System::Limitador(Storage::RedisCached),
        System::Tollgate(tollgate.to_path_buf()),
    ];
    v.extend(compare.map(|p| System::TollgateB(p.to_path_buf())));
    v
}

/// The wasm-floor-hold template with the floor's configuration `hold` replaced by `<word> <sha>`
/// (`hold-script` or `kept-script`).
fn with_floor_script(template: &str, word: &str, sha: &str) -> Result<String, String> {
    const HOLD: &str = "value: 'hold'";
    if template.matches(HOLD).count() != 1 {
        return Err(format!(
            "envoy/bench/wasm-floor-hold.yaml: expected one `{HOLD}`, the floor's configuration"
        ));
    }
    Ok(template.replace(HOLD, &format!("value: '{word} {sha}'")))
}

/// The limits file: one limit in namespace `bench` (the filter's domain), counted per `user`.
pub fn limits_yaml() -> String {
    format!(
        "# make peers: one limit per user, never reached.\n\
         - namespace: bench\n  max_value: {LIMITADOR_MAX}\n  seconds: 1\n  conditions: []\n  \
         variables: [\"descriptors[0].user\"]\n"
    )
}

/// Where `make peers` finds limitador-server: `explicit` (--limitador), else $LIMITADOR_SERVER, else
/// the PATH; Err says what was looked at.
pub fn find_limitador(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("LIMITADOR_SERVER") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "LIMITADOR_SERVER={} is not a file",
                p.to_string_lossy()
            ))
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("limitador-server"))
        .find(|p| p.is_file())
        .ok_or_else(|| "limitador-server not found (not in LIMITADOR_SERVER, not on PATH)".into())
}

/// What the run shares: the backends and the files every system reads.
pub struct Shared<'a> {
    pub dir: &'a Path,
    pub webdis_port: u16,
    pub redis_port: u16,
    pub upstream_port: u16,
    pub limitador: Option<&'a Path>,
    pub limits_file: &'a Path,
    /// The SHA Redis gave bench/wasm-floor/minimal_bucket.lua (loaded before any system starts).
    pub floor_script_sha: &'a str,
}

/// One started system: its Envoy and, for Limitador, the service.
pub struct Started {
    pub envoy: Envoy,
    pub limitador: Option<Proc>,
}

impl Started {
    /// The pids whose CPU is the system's own (shared Redis and Webdis are added by the caller).
    pub fn pids(&self) -> (Option<u32>, Option<u32>) {
        (
            self.envoy.proc.pid(),
            self.limitador.as_ref().and_then(Proc::pid),
        )
    }

    fn logs(&self) -> String {
        let mut text = brief_log(&self.envoy.log_text());
        if let Some(l) = &self.limitador {
            text.push_str("\nlimitador:\n");
            text.push_str(&brief_log(&l.log_text()));
        }
        text
    }
}

/// Starts `system`, and checks that one request through it is answered 200 (so a configuration that
/// refuses every request fails the run instead of measuring refusals).
pub fn start(shared: &Shared, system: &System) -> Result<Started, String> {
    let limitador = match system {
        System::Limitador(storage) => Some(start_limitador(shared, *storage)?),
        _ => None,
    };
    let upstream = shared.upstream_port;
    let dir = shared.dir;
    let envoy = match system {
        System::Plain
        | System::Hold(_)
        | System::Script(_)
        | System::Kept(_)
        | System::Limitador(_) => {
            let (file, backend) = match (&limitador, system) {
                (Some((_, rls_port)), _) => ("ratelimit.yaml", *rls_port),
                (None, System::Hold(_) | System::Script(_) | System::Kept(_)) => {
                    ("wasm-floor-hold.yaml", shared.webdis_port)
                }
                (None, _) => ("plain.yaml", shared.webdis_port),
            };
            let wasm = match system {
                System::Hold(floor) | System::Script(floor) | System::Kept(floor) => {
                    floor.as_path()
                }
                _ => Path::new(""),
            };
            let mut text = envoy_file(&format!("bench/{file}"));
            match system {
                System::Script(_) => {
                    text = with_floor_script(&text, "hold-script", shared.floor_script_sha)?
                }
                System::Kept(_) => {
                    text = with_floor_script(&text, "kept-script", shared.floor_script_sha)?
                }
                _ => {}
            }
            Envoy::try_start_yaml_workers(dir, WORKERS, &[], &[], |listen, admin| {
                let ports = Ports {
                    backend,
                    listen,
                    admin,
                    upstream,
                };
                render_bench_template(&text, ports, wasm)
            })
        }
        System::Tollgate(wasm) | System::TollgateB(wasm) => {
            let config = tollgate_config(
                system.name(),
                "exact",
                &format!("header:{USER_HEADER}"),
                (HUGE_RATE, HUGE_RATE),
                RULE_PREFIX,
            );
            Envoy::try_start_yaml_workers(dir, WORKERS, &[], &[], |listen, admin| {
                render_envoy_yaml(&config, shared.webdis_port, listen, admin, wasm, upstream)
            })
        }
    }
    .map_err(|log| {
        format!(
            "envoy for {} did not start:\n{}",
            system.name(),
            brief_log(&log)
        )
    })?;
    let started = Started {
        envoy,
        limitador: limitador.map(|(p, _)| p),
    };
    let probe = try_http(
        started.envoy.listen_port,
        "GET",
        PATH,
        &[(USER_HEADER, "peers-probe")],
    );
    match probe {
        Ok(r) if r.status == 200 => Ok(started),
        other => Err(format!(
            "{}: a request through it was not answered 200 ({}):\n{}",
            system.name(),
            other.map_or_else(|e| e, |r| format!("status {}: {}", r.status, r.body)),
            started.logs()
        )),
    }
}

/// Starts limitador-server on loopback ports with `storage` on the shared Redis; ready when its HTTP
/// API answers `/status`. Returns it and its gRPC (RLS) port.
fn start_limitador(shared: &Shared, storage: Storage) -> Result<(Proc, u16), String> {
    let bin = shared
        .limitador
        .ok_or("limitador-server is needed for the Limitador systems")?;
    let mut last_log = String::new();
    for _attempt in 0..3 {
        let (rls_port, http_port) = (free_port(), free_port());
        let mut cmd = Command::new(bin);
        cmd.args(["--rls-ip", "127.0.0.1", "--rls-port", &rls_port.to_string()])
            .args([
                "--http-ip",
                "127.0.0.1",
                "--http-port",
                &http_port.to_string(),
            ])
            .arg(shared.limits_file)
            .arg(match storage {
                Storage::Redis => "redis",
                Storage::RedisCached => "redis_cached",
            })
            .arg(format!("redis://127.0.0.1:{}", shared.redis_port));
        let log = shared.dir.join(format!("limitador-{rls_port}.log"));
        let mut proc = Proc::spawn("limitador-server", cmd, &log);
        let mut exited = false;
        let ready = wait_until(Duration::from_secs(30), || {
            if let Some(Ok(Some(_))) = proc.child.as_mut().map(|c| c.try_wait()) {
                exited = true;
                return true;
            }
            matches!(try_http(http_port, "GET", "/status", &[]), Ok(r) if r.status == 200)
        });
        if ready && !exited {
            return Ok((proc, rls_port));
        }
        proc.stop();
        last_log = proc.log_text();
        if !exited {
            last_log.push_str("\n(limitador-server was not ready in 30 s)");
            break;
        }
        if !last_log.to_lowercase().contains("address already in use") {
            break;
        }
    }
    Err(format!(
        "limitador-server did not start:\n{}",
        brief_log(&last_log)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_systems_and_their_names() {
        let names = |c: Option<&Path>| -> Vec<&str> {
            all(Path::new("/a.wasm"), Path::new("/floor.wasm"), c)
                .iter()
                .map(System::name)
                .collect()
        };
        assert_eq!(
            names(None),
            [
                "plain",
                "wasm-floor-hold",
                "wasm-floor-script",
                "wasm-floor-kept",
                "limitador-redis",
                "limitador-redis-cached",
                "tollgate-exact"
            ]
        );
        assert_eq!(
            names(Some(Path::new("/b.wasm"))).last(),
            Some(&"tollgate-exact-b")
        );
        let limits = limits_yaml();
        assert!(limits.contains("namespace: bench"), "{limits}");
        assert!(
            limits.contains(r#"variables: ["descriptors[0].user"]"#),
            "{limits}"
        );
    }

    #[test]
    fn the_script_floor_is_the_hold_floor_configured_with_the_sha() {
        let template = envoy_file("bench/wasm-floor-hold.yaml");
        let sha = "0123456789abcdef0123456789abcdef01234567";
        for word in ["hold-script", "kept-script"] {
            let text = with_floor_script(&template, word, sha).unwrap();
            assert!(text.contains(&format!("value: '{word} {sha}'")));
            assert_eq!(text.replace(&format!("{word} {sha}"), "hold"), template);
        }
        assert!(with_floor_script("no floor here", "hold-script", sha).is_err());
    }

    #[test]
    fn limitador_comes_from_the_flag_first() {
        let flag = Path::new("/opt/limitador-server");
        assert_eq!(find_limitador(Some(flag)), Ok(flag.to_path_buf()));
    }
}
