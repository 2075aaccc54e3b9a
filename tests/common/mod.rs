//! Shared harness for the integration tests and the demo: real processes on free loopback ports,
//! readiness by polling (never by sleeping a fixed time), stopped by pid when dropped.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The repository root (where Cargo.toml is).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh scratch directory under target/ for one test's config files and logs.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = repo_root().join("target").join("it").join(format!(
        "{name}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// A TCP port that was free on 127.0.0.1 a moment ago, taken from below the kernel's ephemeral range
/// when it leaves room: a port `bind(0)` hands out is in that range, where every outgoing connection
/// on the machine (a test's clients, Envoy's upstream connections) may take it as its source port
/// before our server binds it. Each call in a process starts from a new candidate, so two threads
/// never get the same port; the start differs per process.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    const SPAN: u32 = 10_000;
    const STRIDE: u32 = 7_919; // prime, so the candidates go round all of SPAN
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if ephemeral_low >= 1_024 + SPAN {
        static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        let start = *START.get_or_init(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            (std::process::id().wrapping_mul(2_654_435_761) ^ nanos) % SPAN
        });
        for _ in 0..200 {
            let n = CALLS.fetch_add(1, Ordering::Relaxed) % SPAN;
            let offset = (start + n * STRIDE) % SPAN;
            let port = (ephemeral_low - SPAN + offset) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// Polls `ready` every 20 ms until it returns true or `timeout` passes; returns whether it became ready.
pub fn wait_until(timeout: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long a test waits for tollgate's counters to show in a proxy's stats: each worker pushes
/// its counts at most `METRICS_FLUSH_MS` (1 s) after counting them; the rest is margin for a
/// loaded machine.
pub const STATS_WAIT: Duration =
    Duration::from_millis(10 * tollgate_core::metrics::METRICS_FLUSH_MS);

/// Reads with `read` every 20 ms until `ready` holds for what it read, for at most [`STATS_WAIT`];
/// returns the last value read either way, so the caller's assertion fails with it.
pub fn eventually<T>(mut read: impl FnMut() -> T, ready: impl Fn(&T) -> bool) -> T {
    let deadline = Instant::now() + STATS_WAIT;
    loop {
        let value = read();
        if ready(&value) || Instant::now() >= deadline {
            return value;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The checks rule `rule` decided, by a proxy's stats (`stat` reads one by its full name): each
/// counts once in exactly one of `allowed`, `denied` and `shadow_denied`.
pub fn decided(stat: impl Fn(&str) -> Option<u64>, rule: &str) -> u64 {
    ["allowed", "denied", "shadow_denied"]
        .iter()
        .map(|c| stat(&format!("wasmcustom.tollgate.{rule}.{c}")).unwrap_or(0))
        .sum()
}

pub fn port_open(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// A child process that is killed (by its pid, via `Child::kill`) and reaped when dropped.
pub struct Proc {
    pub name: String,
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let out = std::fs::File::create(log).expect("create log file");
        let err = out.try_clone().expect("clone log handle");
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e} (run `make setup` first)"));
        Proc {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    /// Runs `cmd` to its end, or for at most `timeout` (a tool that waits on something that never
    /// happens is stopped, not waited on forever): its exit status, if it ended, and its log.
    pub fn run_bounded(
        name: &str,
        cmd: Command,
        log: &Path,
        timeout: Duration,
    ) -> (Option<std::process::ExitStatus>, String) {
        let mut proc = Proc::spawn(name, cmd, log);
        let mut status = None;
        wait_until(timeout, || {
            status = proc
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            status.is_some()
        });
        proc.stop();
        (status, proc.log_text())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The process's log so far (for failure messages).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills and reaps the process now.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Panics with the process log if it already exited.
    pub fn assert_running(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                panic!(
                    "{} exited early ({status}); log:\n{}",
                    self.name,
                    self.log_text()
                );
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A real `redis-server` on a free loopback port, with persistence off.
pub struct Redis {
    pub port: u16,
    pub proc: Proc,
}

impl Redis {
    pub fn start(dir: &Path) -> Redis {
        Self::start_with(dir, &[])
    }

    /// Starts redis-server with extra command-line arguments (e.g. `["--requirepass", "s3cret"]`).
    /// Retries on a fresh port when another process took the port in the meantime.
    pub fn start_with(dir: &Path, extra: &[&str]) -> Redis {
        let mut last_log = String::new();
        for _attempt in 0..3 {
            match Self::try_start_on(dir, free_port(), extra) {
                Ok(redis) => return redis,
                Err(log) if log.contains("Address already in use") => last_log = log,
                Err(log) => panic!("redis-server did not start; log:\n{log}"),
            }
        }
        panic!("redis-server found no free port; last log:\n{last_log}");
    }

    /// Starts redis-server on `port` (e.g. again on the port of one that was stopped).
    pub fn start_on(dir: &Path, port: u16, extra: &[&str]) -> Redis {
        Self::try_start_on(dir, port, extra)
            .unwrap_or_else(|log| panic!("redis-server did not start; log:\n{log}"))
    }

    /// Starts redis-server on `port` and waits until it answers PING; Err(log) if it exits first or
    /// is not ready in 10 s.
    fn try_start_on(dir: &Path, port: u16, extra: &[&str]) -> Result<Redis, String> {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir", dir.to_str().expect("utf-8 dir")])
            .args(extra);
        let mut proc = Proc::spawn("redis-server", cmd, &dir.join(format!("redis-{port}.log")));
        // Ready when it answers PING (a bare connect can succeed against ourselves on loopback).
        let url = format!("redis://127.0.0.1:{port}/");
        let mut exited = false;
        let ready = wait_until(Duration::from_secs(10), || {
            if let Some(Ok(Some(_))) = proc.child.as_mut().map(|c| c.try_wait()) {
                exited = true;
                return true;
            }
            redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .map_or_else(|e| e.code() == Some("NOAUTH"), |_| true)
        });
        if ready && !exited {
            return Ok(Redis { port, proc });
        }
        proc.stop();
        let mut log = proc.log_text();
        if !exited {
            log.push_str("\n(redis-server was not ready in 10 s)");
        }
        Err(log)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Script calls this Redis has run so far: (EVALSHA, EVAL).
    pub fn script_calls(&self) -> (u64, u64) {
        script_calls(&mut self.conn())
    }

    /// Whether Redis holds `key` (a bucket exists only while it is not full).
    pub fn exists(&self, key: &str) -> bool {
        redis::cmd("EXISTS")
            .arg(key)
            .query::<i64>(&mut self.conn())
            .expect("EXISTS")
            == 1
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("redis url")
            .get_connection()
            .expect("connect to redis")
    }
}

// Webdis, Envoy, the HTTP client and the whole stack (used by the tests and the tools).
pub mod envoy;
pub mod hosted;
pub mod http;
pub mod jwt;
pub mod stack;
pub mod webdis;

#[allow(unused_imports)]
pub use envoy::{demo_config, envoy_bin, render_envoy_yaml, wasm_path, Envoy};
#[allow(unused_imports)]
pub use http::{get, http, try_http, Resp};
#[allow(unused_imports)]
pub use stack::Stack;
#[allow(unused_imports)]
pub use webdis::{Webdis, WebdisOpts};
pub mod redis_cluster;
pub mod redis_tls;
pub mod script;
pub mod upstream;

/// Script calls a Redis node has run so far, (EVALSHA, EVAL), from `INFO commandstats`.
pub fn script_calls(conn: &mut redis::Connection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    let calls = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse::<u64>().expect("a call count"))
    };
    (calls("evalsha"), calls("eval"))
}

/// Drives `threads` clients per port, each sending `GET /api/x` as `x-user-id: user` one after the
/// other for `secs`; returns (admitted, limited, other) over all of them.
pub fn drive(ports: &[u16], threads: usize, user: &'static str, secs: f64) -> (u64, u64, u64) {
    let handles: Vec<_> = ports
        .iter()
        .flat_map(|&port| (0..threads).map(move |_| port))
        .map(|port| {
            std::thread::spawn(move || {
                let (mut ok, mut limited, mut other) = (0u64, 0u64, 0u64);
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_secs_f64(secs) {
                    match get(port, "/api/x", &[("x-user-id", user)]).status {
                        200 => ok += 1,
                        429 => limited += 1,
                        _ => other += 1,
                    }
                }
                (ok, limited, other)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
}

/// One request of [`drive_timed`]: when it was sent and its answer came, from the load's start.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    pub sent: Duration,
    pub answered: Duration,
    pub status: u16,
}

/// Like [`drive`], in phases: `threads` clients per port send one request after another while a
/// phase is on (`true`), and wait out a phase that is off; every request with its times.
pub fn drive_timed(
    ports: &[u16],
    threads: usize,
    user: &'static str,
    phases: &[(bool, Duration)],
) -> Vec<Timed> {
    let t0 = Instant::now();
    let phases: Vec<(bool, Duration)> = phases
        .iter()
        .scan(Duration::ZERO, |end, &(on, len)| {
            *end += len;
            Some((on, *end))
        })
        .collect();
    let handles: Vec<_> = ports
        .iter()
        .flat_map(|&port| (0..threads).map(move |_| port))
        .map(|port| {
            let phases = phases.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for (on, end) in phases {
                    if !on {
                        // The load pauses: no request until the phase ends.
                        std::thread::sleep(end.saturating_sub(t0.elapsed()));
                        continue;
                    }
                    while t0.elapsed() < end {
                        let sent = t0.elapsed();
                        let status = get(port, "/api/x", &[("x-user-id", user)]).status;
                        out.push(Timed {
                            sent,
                            answered: t0.elapsed(),
                            status,
                        });
                    }
                }
                out
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("client thread"))
        .collect()
}

/// The fullest window of `len`: the most admissions (200s) sent and answered within one window
/// of that length (each surely admitted inside it, whenever the proxy decided), and where it
/// starts.
pub fn fullest_window(timed: &[Timed], len: Duration) -> (u64, Duration) {
    let mut admitted: Vec<&Timed> = timed.iter().filter(|t| t.status == 200).collect();
    admitted.sort_by_key(|t| t.sent);
    let mut best = (0, Duration::ZERO);
    for (i, start) in admitted.iter().enumerate() {
        let end = start.sent + len;
        let n = admitted
            .get(i..)
            .unwrap_or_default()
            .iter()
            .take_while(|t| t.sent < end)
            .filter(|t| t.answered <= end)
            .count() as u64;
        if n > best.0 {
            best = (n, start.sent);
        }
    }
    best
}

/// Asserts the token bucket's bound in every window of the lengths checked: at most burst +
/// rate × W admissions (rate per second), plus `slack`; returns the fullest window's excess.
pub fn assert_windows(timed: &[Timed], burst: u64, rate: u64, slack: u64, logs: &str) -> f64 {
    let mut worst = f64::NEG_INFINITY;
    for ms in [50, 100, 200, 500, 1000, 2000] {
        let (n, at) = fullest_window(timed, Duration::from_millis(ms));
        let bound = burst as f64 + rate as f64 * ms as f64 / 1000.0;
        eprintln!(
            "fullest {ms} ms window: {n} admitted from {:.3} s (bound {bound:.0})",
            at.as_secs_f64()
        );
        assert!(
            n as f64 <= bound + slack as f64,
            "{n} admitted in {ms} ms from {:.3} s: more than burst + rate x W = {bound:.0}\n{logs}",
            at.as_secs_f64()
        );
        worst = worst.max(n as f64 - bound);
    }
    worst
}

/// A loopback port that accepts connections and never answers (nor closes them) while the test runs.
pub fn silent_backend() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("local addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn); // accept, read nothing, answer nothing
        }
    });
    port
}

/// Builds bench/wasm-floor and returns the path of its .wasm.
pub fn build_wasm_floor() -> Result<PathBuf, String> {
    let root = repo_root();
    build_wasm(
        &root.join("bench/wasm-floor/Cargo.toml"),
        &root.join("target/wasm-floor"),
        "wasm_floor",
    )
}

/// Builds the crate of `manifest` for wasm32-wasip1 (release) into `target_dir` and returns the
/// path of its `<name>.wasm`.
pub fn build_wasm(manifest: &Path, target_dir: &Path, name: &str) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(repo_root())
        .args([
            "build",
            "--quiet",
            "--release",
            "--target",
            "wasm32-wasip1",
            "--manifest-path",
        ])
        .arg(manifest)
        .arg("--target-dir")
        .arg(target_dir)
        .status()
        .map_err(|e| format!("run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("building {} failed ({status})", manifest.display()));
    }
    let wasm = target_dir.join(format!("wasm32-wasip1/release/{name}.wasm"));
    if wasm.is_file() {
        Ok(wasm)
    } else {
        Err(format!("{} missing after the build", wasm.display()))
    }
}
