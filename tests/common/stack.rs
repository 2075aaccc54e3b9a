//! The whole path in one value: Redis, Webdis in front of it, and Envoy with the tollgate filter calling
//! Webdis. Dropping it stops Envoy, then Webdis, then Redis (fields drop in declaration order).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use super::envoy::{brief_log, render_envoy_yaml, wasm_path, Envoy, NO_UPSTREAM};
use super::http::{raw_request, Resp};
use super::webdis::{Webdis, WebdisOpts};
use super::{scratch_dir, Redis};

pub struct Stack {
    pub envoy: Envoy,
    pub webdis: Webdis,
    pub redis: Redis,
    /// Scratch directory with every config file and log.
    pub dir: PathBuf,
}

impl Stack {
    /// Redis + open Webdis + Envoy with `plugin_config_json`, in a fresh scratch dir named after `name`.
    pub fn start(name: &str, plugin_config_json: &str) -> Stack {
        Self::start_with(name, plugin_config_json, &[], &WebdisOpts::default())
    }

    /// Like [`Stack::start`], with extra redis-server arguments (e.g. `["--requirepass", "pw"]`) and
    /// Webdis options (Redis password, Basic auth).
    pub fn start_with(
        name: &str,
        plugin_config_json: &str,
        redis_args: &[&str],
        webdis_opts: &WebdisOpts,
    ) -> Stack {
        let dir = scratch_dir(name);
        let redis = Redis::start_with(&dir, redis_args);
        let webdis = Webdis::start_with(&dir, redis.port, webdis_opts);
        let envoy = Envoy::start(&dir, plugin_config_json, webdis.port);
        Stack {
            envoy,
            webdis,
            redis,
            dir,
        }
    }

    /// Like [`Stack::start`], with the rendered Envoy bootstrap passed through `edit(yaml,
    /// listen_port)` first (e.g. to drop a setting, or to listen on another address).
    pub fn start_edited(
        name: &str,
        plugin_config_json: &str,
        edit: impl Fn(String, u16) -> String,
    ) -> Stack {
        let dir = scratch_dir(name);
        let redis = Redis::start(&dir);
        let webdis = Webdis::start(&dir, redis.port);
        let wasm = wasm_path();
        let envoy = Envoy::try_start_yaml(&dir, |listen_port, admin_port| {
            let yaml = render_envoy_yaml(
                plugin_config_json,
                webdis.port,
                listen_port,
                admin_port,
                &wasm,
                NO_UPSTREAM,
            );
            edit(yaml, listen_port)
        })
        .unwrap_or_else(|log| panic!("envoy did not start; log:\n{}", brief_log(&log)));
        Stack {
            envoy,
            webdis,
            redis,
            dir,
        }
    }

    /// The Envoy listener port clients talk to.
    pub fn port(&self) -> u16 {
        self.envoy.listen_port
    }

    /// A request through Envoy.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
        self.envoy.request(method, path, headers)
    }

    /// `GET path` through Envoy.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        self.envoy.get(path, headers)
    }

    /// `GET target` to Envoy's listener at `ip` (127.0.0.1, or `::1` where it listens there), sent
    /// byte for byte as given: repeated header lines and unnormalised paths reach Envoy as written.
    /// Panics with every process log when the request fails.
    pub fn raw_get(&self, ip: IpAddr, target: &str, headers: &[(&str, &str)]) -> Resp {
        raw_request(SocketAddr::new(ip, self.port()), "GET", target, headers)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.logs()))
    }

    /// Every process log (for a failure message).
    pub fn logs(&self) -> String {
        format!(
            "--- envoy ---\n{}\n--- webdis ---\n{}\n--- redis ---\n{}",
            brief_log(&self.envoy.log_text()),
            self.webdis.log_text(),
            self.redis.proc.log_text()
        )
    }
}
