//! The load: one wrk process per load (one thread, `--connections` connections, one request in flight
//! on each), whose Lua script gives every request a new `x-user-id` (or the same one, `--one-key`)
//! and prints one summary line that is read back here.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The header every system keys on (tollgate's rule, the ratelimit filter's descriptor).
pub const USER_HEADER: &str = "x-user-id";
/// The summary line's first word.
const SUMMARY: &str = "peers-summary";

/// The script: keys `<prefix>-<thread>-<n>`, never the same twice within a load; `prefix` differs
/// from load to load, so no key repeats in a run either.
pub fn script(prefix: &str, one_key: bool) -> String {
    format!(
        r#"-- make peers (tools/src/bin/peers/wrk.rs): every request a new {USER_HEADER}.
local prefix = "{prefix}"
local one_key = {one_key}
local counter = 0
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
function request()
  counter = counter + 1
  local user = prefix
  if not one_key then user = prefix .. "-" .. tid .. "-" .. counter end
  return wrk.format("GET", nil, {{["{USER_HEADER}"] = user}})
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("{SUMMARY} requests=%.0f duration_us=%.0f connect=%.0f read=%.0f write=%.0f status=%.0f timeout=%.0f p50_us=%.0f p99_us=%.0f\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"#
    )
}

/// What one load did, from wrk's summary line.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Load {
    /// Responses received.
    pub requests: u64,
    pub duration_s: f64,
    /// Responses with a status ≥ 400 (wrk's `status` errors).
    pub non_2xx: u64,
    /// Connect, read, write errors and timeouts.
    pub failed: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl Load {
    pub fn rps(&self) -> f64 {
        if self.duration_s > 0.0 {
            self.requests as f64 / self.duration_s
        } else {
            0.0
        }
    }

    /// Reads the summary line out of wrk's output.
    pub fn parse(out: &str) -> Result<Load, String> {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix(SUMMARY))
            .ok_or_else(|| format!("no {SUMMARY} line in wrk's output:\n{out}"))?;
        let field = |name: &str| -> Result<f64, String> {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("wrk summary without {name}: {line}"))
        };
        let count = |name: &str| field(name).map(|v| v as u64);
        Ok(Load {
            requests: count("requests")?,
            duration_s: field("duration_us")? / 1e6,
            non_2xx: count("status")?,
            failed: count("connect")? + count("read")? + count("write")? + count("timeout")?,
            p50_ms: field("p50_us")? / 1000.0,
            p99_ms: field("p99_us")? / 1000.0,
        })
    }
}

/// Runs wrk against `http://127.0.0.1:<port><path>` for `d` (whole seconds, at least one: wrk's
/// `-d` has no smaller unit) with `connections` connections and
/// keys from `prefix`; the script and wrk's output go to `dir` under `tag`.
pub fn run(
    dir: &Path,
    tag: &str,
    (port, path): (u16, &str),
    connections: u32,
    d: Duration,
    (prefix, one_key): (&str, bool),
) -> Result<Load, String> {
    let script_path = dir.join(format!("wrk-{tag}.lua"));
    std::fs::write(&script_path, script(prefix, one_key))
        .map_err(|e| format!("write {}: {e}", script_path.display()))?;
    let out = Command::new("wrk")
        .args(["-t", "1", "-c", &connections.to_string()])
        .args(["-d", &format!("{}s", d.as_secs().max(1))])
        .args(["--timeout", "2s", "-s"])
        .arg(&script_path)
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .map_err(|e| format!("start wrk: {e} (run `make setup`: package wrk)"))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let _ = std::fs::write(dir.join(format!("wrk-{tag}.out")), &text);
    if !out.status.success() {
        return Err(format!(
            "wrk failed ({}):\n{text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Load::parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_summary_line() {
        let out =
            "Running 5s test @ http://127.0.0.1:1/app/peers\n  1 threads and 16 connections\n\
                   peers-summary requests=50000 duration_us=5000000 connect=0 read=1 write=0 \
                   status=7 timeout=2 p50_us=310 p99_us=1200\n";
        let l = Load::parse(out).expect("parsed");
        assert_eq!((l.requests, l.non_2xx, l.failed), (50000, 7, 3));
        assert_eq!((l.p50_ms, l.p99_ms), (0.31, 1.2));
        assert_eq!(l.rps(), 10000.0);
        assert!(Load::parse("no summary").is_err());
        assert!(Load::parse("peers-summary requests=1").is_err());
    }

    #[test]
    fn the_script_keys_each_request_anew_unless_told_otherwise() {
        let s = script("r1-plain", false);
        assert!(s.contains(r#"local prefix = "r1-plain""#), "{s}");
        assert!(s.contains("local one_key = false"), "{s}");
        assert!(s.contains(r#"{["x-user-id"] = user}"#), "{s}");
        assert!(script("k", true).contains("local one_key = true"));
    }

    /// The script as wrk runs it: every request of a load a key of its own, and the summary line
    /// read back. Against a server of our own on loopback (the upstream of this bin).
    #[test]
    fn wrk_sends_a_new_key_per_request() {
        if Command::new("wrk").arg("-v").output().is_err() {
            eprintln!("wrk not installed: skipped");
            return;
        }
        use std::io::{BufRead, BufReader, Write};
        use std::sync::{Arc, Mutex};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let keys = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let keys = keys.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(&conn);
                    let mut out = &conn;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => {
                                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                                if out.write_all(answer).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {
                                if let Some(v) = line.strip_prefix("x-user-id: ") {
                                    keys.lock().expect("lock").push(v.trim().to_string());
                                }
                            }
                        }
                    }
                });
            }
        });
        let dir = tollgate_e2e::scratch_dir("peers-wrk");
        let load = run(
            &dir,
            "t",
            (port, "/app/peers"),
            4,
            Duration::from_secs(1),
            ("t", false),
        )
        .expect("wrk ran");
        let keys = seen.lock().expect("lock").clone();
        assert!(load.requests > 10, "{load:?}");
        assert_eq!(load.non_2xx + load.failed, 0, "{load:?}");
        // wrk may have sent a last request per connection whose answer it did not wait for.
        assert!(
            keys.len() as u64 >= load.requests,
            "{} < {load:?}",
            keys.len()
        );
        let unique: std::collections::BTreeSet<&String> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len(), "a key repeated");
        assert!(keys.iter().all(|k| k.starts_with("t-0-")), "{keys:?}");
    }
}
