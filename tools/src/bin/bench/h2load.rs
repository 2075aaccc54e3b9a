//! The load generator: one h2load process per load (or per flood connection), its output and
//! per-request log read back into counts, statuses and latencies. h2load's own req/s is kept for the
//! report; every other figure comes from its per-request log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::scenarios::USER_HEADER;

/// How one h2load process sends.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// Closed loop for this long.
    For(Duration),
    /// Closed loop, this many requests.
    Count(u64),
    /// Each client sends this many requests per second, for this long.
    Paced(u32, Duration),
}

pub struct H2load {
    pub clients: u32,
    pub child: std::process::Child,
    pub out: PathBuf,
    pub log: PathBuf,
    /// The `-i` URI list and how many URIs it holds (removed once h2load is done).
    pub uris: Option<(PathBuf, u64)>,
}

/// What one h2load process requests.
#[derive(Debug, Clone)]
pub enum Target {
    /// One path (with its query), every request.
    Path(String),
    /// A `-i` file of URIs holding this many lines, each client going through it from the top.
    File(PathBuf, u64),
}

/// One h2load process's load: connections, threads and pace.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub clients: u32,
    pub threads: u32,
    pub pace: Pace,
}

pub fn spawn_h2load(
    dir: &Path,
    h2c: bool,
    tag: &str,
    port: u16,
    user: &str,
    target: Target,
    load: Load,
) -> Result<H2load, String> {
    let Load {
        clients,
        threads,
        pace,
    } = load;
    let out = dir.join(format!("h2load-{tag}.out"));
    let log = dir.join(format!("h2load-{tag}.tsv"));
    let mut cmd = Command::new("h2load");
    if !h2c {
        // h2load speaks h2c (prior knowledge) to http:// URIs unless told otherwise.
        cmd.arg("--h1");
    }
    // One request in flight per connection (HTTP/1.1 without pipelining; one stream with h2c).
    cmd.args([
        "-m",
        "1",
        "-c",
        &clients.to_string(),
        "-t",
        &threads.to_string(),
    ]);
    match pace {
        Pace::For(d) => {
            cmd.args(["-D", &format!("{}ms", d.as_millis())]);
        }
        Pace::Count(n) => {
            cmd.args(["-n", &n.to_string()]);
        }
        Pace::Paced(rps, d) => {
            cmd.args(["--rps", &rps.to_string()]);
            cmd.args(["-D", &format!("{}ms", d.as_millis())]);
        }
    }
    cmd.arg("--log-file")
        .arg(&log)
        .args(["-H", &format!("{USER_HEADER}: {user}")]);
    let uris = match target {
        Target::Path(path) => {
            cmd.arg(format!("http://127.0.0.1:{port}{path}"));
            None
        }
        Target::File(file, lines) => {
            cmd.arg("-i").arg(&file);
            Some((file, lines))
        }
    };
    let file = std::fs::File::create(&out).map_err(|e| format!("create {}: {e}", out.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null()).stdout(file).stderr(err);
    let child = cmd
        .spawn()
        .map_err(|e| format!("start h2load: {e} (run `make setup`: package nghttp2-client)"))?;
    Ok(H2load {
        clients,
        child,
        out,
        log,
        uris,
    })
}

/// What h2load printed and logged for one process.
#[derive(Debug, Default)]
pub struct H2Result {
    /// h2load's own requests/s.
    pub rps: f64,
    /// Its clients (connections).
    pub clients: u32,
    /// Requests h2load counted as started and as done.
    pub started: u64,
    pub done: u64,
    /// Per-request log: HTTP status (-1: failed stream) -> count.
    pub statuses: BTreeMap<i64, u64>,
    /// Microseconds each completed request took.
    pub latencies_us: Vec<u64>,
    /// Earliest request start and latest completion, microseconds since the epoch.
    pub first_start_us: u64,
    pub last_end_us: u64,
    /// Requests started beyond the length of the `-i` URI list: keys that came round again.
    pub repeated: u64,
}

pub fn wait_h2load(mut h: H2load) -> Result<H2Result, String> {
    let status = h
        .child
        .wait()
        .map_err(|e| format!("wait for h2load: {e}"))?;
    let out = std::fs::read_to_string(&h.out).unwrap_or_default();
    if let Some((file, _)) = &h.uris {
        let _ = std::fs::remove_file(file);
    }
    if !status.success() {
        return Err(format!("h2load failed ({status}):\n{out}"));
    }
    let mut r = H2Result {
        clients: h.clients,
        first_start_us: u64::MAX,
        ..H2Result::default()
    };
    r.read_summary(&out);
    if let Some((_, lines)) = h.uris {
        r.repeated = r.started.saturating_sub(lines);
    }
    let log =
        std::fs::read_to_string(&h.log).map_err(|e| format!("read {}: {e}", h.log.display()))?;
    r.read_log(&log);
    Ok(r)
}

impl H2Result {
    /// h2load's summary on stdout: its req/s and the requests it started and finished.
    fn read_summary(&mut self, out: &str) {
        for line in out.lines() {
            if let Some(rest) = line.strip_prefix("finished in ") {
                // finished in 3.00s, 26941.50 req/s, 3.06MB/s
                self.rps = rest
                    .split(", ")
                    .find_map(|p| p.strip_suffix(" req/s"))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0);
            } else if let Some(rest) = line.strip_prefix("requests: ") {
                // requests: 53883 total, 53899 started, 53883 done, 53883 succeeded, 0 failed, ...
                let count = |what: &str| -> u64 {
                    rest.split(", ")
                        .find_map(|p| p.strip_suffix(what))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0)
                };
                self.started = count(" started");
                self.done = count(" done");
            }
        }
    }

    /// h2load's `--log-file`: one line per request, `start µs \t status \t took µs` (status -1:
    /// the stream failed, and its time is not a latency).
    fn read_log(&mut self, log: &str) {
        for line in log.lines() {
            let mut cols = line.split('\t');
            let (Some(start), Some(status), Some(took)) = (cols.next(), cols.next(), cols.next())
            else {
                continue;
            };
            let (Ok(start), Ok(status), Ok(took)) = (
                start.parse::<u64>(),
                status.parse::<i64>(),
                took.parse::<u64>(),
            ) else {
                continue;
            };
            *self.statuses.entry(status).or_default() += 1;
            self.first_start_us = self.first_start_us.min(start);
            if status > 0 {
                self.latencies_us.push(took);
                self.last_end_us = self.last_end_us.max(start + took);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_summary_and_the_log() {
        let mut r = H2Result {
            first_start_us: u64::MAX,
            ..H2Result::default()
        };
        r.read_summary(
            "starting benchmark...\n\
             finished in 3.00s, 26941.50 req/s, 3.06MB/s\n\
             requests: 53883 total, 53899 started, 53883 done, 53883 succeeded, 0 failed\n",
        );
        assert_eq!((r.rps, r.started, r.done), (26941.5, 53899, 53883));
        r.read_log("1000\t200\t50\n1010\t429\t70\n1005\t-1\t900\nnot a line\n");
        assert_eq!(r.statuses, BTreeMap::from([(-1, 1), (200, 1), (429, 1)]));
        // A failed stream counts as a status, not as a latency.
        assert_eq!(r.latencies_us, [50, 70]);
        assert_eq!((r.first_start_us, r.last_end_us), (1000, 1080));
    }
}
