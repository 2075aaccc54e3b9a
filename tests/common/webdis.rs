//! A real `webdis` (the HTTP front of Redis that the filter calls) on a free loopback port.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::http::{basic_auth_header, try_http, Resp};
use super::{free_port, wait_until, Proc};

/// Options for [`Webdis::start_with`]. The default is an open Webdis talking to a Redis without a password.
#[derive(Debug, Clone, Default)]
pub struct WebdisOpts {
    /// The password Webdis sends to Redis (`redis_auth`); a wrong one still starts, and every command
    /// then answers `[false,"NOAUTH …"]` / `[false,"WRONGPASS …"]` with HTTP 200.
    pub redis_auth: Option<String>,
    /// `user:pass`: anonymous clients may run no command, clients with this HTTP Basic auth may run all.
    pub basic_auth: Option<String>,
    /// A verbatim `acl` array for the config; replaces the one `basic_auth` would write.
    pub acl: Option<serde_json::Value>,
}

pub struct Webdis {
    pub port: u16,
    pub proc: Proc,
    /// The `user:pass` clients must present, if any.
    pub basic_auth: Option<String>,
}

impl Webdis {
    /// An open Webdis in front of the Redis on `redis_port`; panics with the log if it does not come up.
    pub fn start(dir: &Path, redis_port: u16) -> Webdis {
        Self::start_with(dir, redis_port, &WebdisOpts::default())
    }

    /// Like [`Webdis::start`], with a Redis password and/or an ACL.
    pub fn start_with(dir: &Path, redis_port: u16, opts: &WebdisOpts) -> Webdis {
        Self::try_start_with(dir, redis_port, opts).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts Webdis and waits until it answers `GET /PING` with 200 (with the Basic auth, if set; with a
    /// custom `acl`, any HTTP answer counts). Err carries the log. Retries on a fresh port if the process
    /// exits at once (another process took the port in the meantime).
    pub fn try_start_with(
        dir: &Path,
        redis_port: u16,
        opts: &WebdisOpts,
    ) -> Result<Webdis, String> {
        let mut last_err = String::new();
        for _attempt in 0..3 {
            match Self::spawn_once(dir, redis_port, opts) {
                Ok(webdis) => return Ok(webdis),
                Err((exited, log)) => {
                    last_err = log;
                    if !exited {
                        break;
                    }
                }
            }
        }
        Err(last_err)
    }

    /// One try on one free port; Err((exited early, message with the log)).
    fn spawn_once(
        dir: &Path,
        redis_port: u16,
        opts: &WebdisOpts,
    ) -> Result<Webdis, (bool, String)> {
        let port = free_port();
        let config_path = dir.join(format!("webdis-{port}.json"));
        std::fs::write(
            &config_path,
            config_json(redis_port, port, dir, opts).to_string(),
        )
        .map_err(|e| (false, format!("write {}: {e}", config_path.display())))?;
        let mut cmd = Command::new("webdis");
        cmd.arg(&config_path);
        let proc = Proc::spawn("webdis", cmd, &dir.join(format!("webdis-{port}.out")));
        let mut webdis = Webdis {
            port,
            proc,
            basic_auth: opts.basic_auth.clone(),
        };
        let any_answer = opts.acl.is_some();
        let mut exited = false;
        let ready = wait_until(Duration::from_secs(10), || {
            if let Some(Ok(Some(_))) = webdis.proc.child.as_mut().map(|c| c.try_wait()) {
                exited = true;
                return true;
            }
            match webdis.try_get("/PING") {
                Ok(r) => any_answer || r.status == 200,
                Err(_) => false,
            }
        });
        if ready && !exited {
            return Ok(webdis);
        }
        webdis.proc.stop();
        let why = if exited {
            "exited early"
        } else {
            "not ready in 10 s"
        };
        Err((
            exited,
            format!("webdis on port {port} {why}; log:\n{}", webdis.log_text()),
        ))
    }

    /// `GET path` against Webdis (with its Basic auth, if any).
    pub fn try_get(&self, path: &str) -> Result<Resp, String> {
        let auth = self.basic_auth.as_deref().map(basic_auth_header);
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("authorization", a)])
            .unwrap_or_default();
        try_http(self.port, "GET", path, &headers)
    }

    /// Webdis' stdout/stderr and its own log file.
    pub fn log_text(&self) -> String {
        let own = std::fs::read_to_string(
            self.proc
                .log
                .with_file_name(format!("webdis-{}.log", self.port)),
        )
        .unwrap_or_default();
        format!("{}{own}", self.proc.log_text())
    }
}

fn config_json(redis_port: u16, port: u16, dir: &Path, opts: &WebdisOpts) -> serde_json::Value {
    let mut cfg = serde_json::json!({
        "redis_host": "127.0.0.1",
        "redis_port": redis_port,
        "http_host": "127.0.0.1",
        "http_port": port,
        "threads": 2,
        "daemonize": false,
        "database": 0,
        "verbosity": 3,
        "logfile": dir.join(format!("webdis-{port}.log")).to_string_lossy(),
    });
    if let Some(pass) = &opts.redis_auth {
        cfg["redis_auth"] = serde_json::Value::String(pass.clone());
    }
    if let Some(acl) = &opts.acl {
        cfg["acl"] = acl.clone();
    } else if let Some(user_pass) = &opts.basic_auth {
        cfg["acl"] = serde_json::json!([
            { "disabled": ["*"] },
            { "http_basic_auth": user_pass, "enabled": ["*"] },
        ]);
    }
    cfg
}
