//! The bench's command line: every option has a default, and a value that makes no sense (a zero
//! count, a scenario that does not exist, a `--compare-wasm` file that is not there) is refused before
//! anything starts.

use std::path::PathBuf;
use std::time::Duration;

use crate::scenarios::SCENARIOS;

pub const USAGE: &str = "\
usage: cargo run --release -p tollgate-tools --bin bench -- [options]   (make bench BENCH_ARGS='[options]')

  --rounds N          interleaved rounds; each figure is the median over them    (default 5)
  --duration SECS     length of each measured load, closed loop and paced        (default 3)
  --requests N        closed-loop loads send N requests instead of a --duration
  --connections N     h2load connections, one request in flight on each          (default 16)
  --threads N         h2load threads for the closed-loop loads                   (default 1)
  --h2c               h2load speaks h2c (HTTP/2, prior knowledge), not HTTP/1.1
  --warmup SECS       unmeasured load on each fresh Envoy before its round; 0: none (default 1)
  --slices N          a round's single-key closed loops (plain … tollgate-lease) take turns in
                      N slices of their load, each 1/N of it                      (default 6)
  --limited-rate N    the hot key's rate, tokens per second                      (default 200)
  --limited-burst N   the hot key's burst                                        (default 200)
  --limited-load N    requests per second offered to the hot key, both proxies   (default 1000)
                      (the tenant scenarios offer it all to their one proxy)
  --only A,B,...      only these scenarios (plain always runs: it is the baseline)
  --compare-wasm PATH adds the B scenarios, each its A scenario with the filter built at
                      PATH, in the same rounds (and slices): tollgate-lease-b, tollgate-exact-b,
                      tollgate-flood-exact-b (each only when its A scenario runs); prints each
                      B's CPU ÷ its A's and checks the goals against the B scenarios (an A/B of
                      two builds; PATH = this build shows the run's A/A noise)
  --out PATH          the JSON report (default target/bench/bench-<timestamp>.json);
                      target/bench/latest.json is written too
";

#[derive(Debug, Clone)]
pub struct Settings {
    pub rounds: u32,
    /// The round's single-key closed loops take turns in this many slices of their load.
    pub slices: u32,
    pub duration: Duration,
    pub requests: Option<u64>,
    pub connections: u32,
    pub threads: u32,
    pub warmup: Duration,
    pub limited_rate: u64,
    pub limited_burst: u64,
    pub limited_load: u32,
    pub only: Option<Vec<String>>,
    pub out: Option<PathBuf>,
    /// The filter the `-b` scenarios run (they run only with it).
    pub compare_wasm: Option<PathBuf>,
    /// h2c (HTTP/2 prior knowledge) instead of HTTP/1.1.
    pub h2c: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            rounds: 5,
            slices: 6,
            duration: Duration::from_secs(3),
            requests: None,
            connections: 16,
            threads: 1,
            warmup: Duration::from_secs(1),
            limited_rate: 200,
            limited_burst: 200,
            limited_load: 1000,
            only: None,
            out: None,
            compare_wasm: None,
            h2c: false,
        }
    }
}

pub fn parse_args() -> Result<Settings, String> {
    let mut s = Settings::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        if flag == "--h2c" {
            s.h2c = true;
            continue;
        }
        const VALUE_FLAGS: [&str; 13] = [
            "--rounds",
            "--slices",
            "--duration",
            "--requests",
            "--connections",
            "--threads",
            "--warmup",
            "--limited-rate",
            "--limited-burst",
            "--limited-load",
            "--only",
            "--out",
            "--compare-wasm",
        ];
        if !VALUE_FLAGS.contains(&flag.as_str()) {
            return Err(format!("unknown option {flag}"));
        }
        let value = match inline {
            Some(v) => v,
            None => args.next().ok_or_else(|| format!("{flag} needs a value"))?,
        };
        let int = |v: &str| -> Result<u64, String> {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag}: expected a positive integer, got {v:?}"))
        };
        let zero_ok = flag == "--warmup";
        let secs = |v: &str| -> Result<Duration, String> {
            v.trim_end_matches('s')
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && (*x > 0.0 || (zero_ok && *x == 0.0)) && *x < 3600.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| format!("{flag}: expected seconds, got {v:?}"))
        };
        let small = |v: &str| -> Result<u32, String> {
            u32::try_from(int(v)?).map_err(|_| format!("{flag}: too large: {v}"))
        };
        match flag.as_str() {
            "--rounds" => s.rounds = small(&value)?,
            "--slices" => s.slices = small(&value)?,
            "--duration" => s.duration = secs(&value)?,
            "--requests" => s.requests = Some(int(&value)?),
            "--connections" => s.connections = small(&value)?,
            "--threads" => s.threads = small(&value)?,
            "--warmup" => s.warmup = secs(&value)?,
            "--limited-rate" => s.limited_rate = int(&value)?,
            "--limited-burst" => s.limited_burst = int(&value)?,
            "--limited-load" => s.limited_load = small(&value)?,
            "--only" => {
                let names: Vec<String> = value
                    .split(',')
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect();
                for n in &names {
                    if !SCENARIOS.iter().any(|d| d.name == n) {
                        return Err(format!(
                            "--only: unknown scenario {n:?} (known: {})",
                            SCENARIOS.map(|d| d.name).join(", ")
                        ));
                    }
                }
                s.only = Some(names);
            }
            "--out" => s.out = Some(PathBuf::from(value)),
            "--compare-wasm" => {
                let path = PathBuf::from(value);
                if !path.is_file() {
                    return Err(format!("--compare-wasm: no file at {}", path.display()));
                }
                s.compare_wasm = Some(path);
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if let Some(n) = s.requests {
        if n < u64::from(s.connections) * u64::from(s.slices) {
            return Err(format!(
                "--requests ({n}) must be at least --connections ({}) × --slices ({})",
                s.connections, s.slices
            ));
        }
    }
    Ok(s)
}
