//! What the bench reads off the machine and its processes, never changing them: CPU time from /proc,
//! Redis' script calls from INFO, an Envoy's counters from its admin /stats, and the machine's
//! description for the report. A reading that fails counts as zero (the figure shows it), never
//! as an error that would lose a run.

use std::collections::BTreeMap;
use std::process::Command;

use tollgate_e2e as common;

use common::envoy::{envoy_bin, Envoy};
use common::http::try_http;

/// utime + stime of a process (all its threads), in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> u64 { fields.get(i).and_then(|f| f.parse().ok()).unwrap_or(0) };
    // fields[0] is field 3 (state); utime is field 14, stime field 15.
    field(11) + field(12)
}

/// CPU time of a process (every thread), in nanoseconds, from /proc/<pid>/task/*/schedstat: exact,
/// where utime+stime come in clock ticks (a tick is charged to whoever runs when it fires).
pub fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|text| text.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

pub fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// Redis' script calls so far: (evalsha + eval calls, their failed_calls).
pub fn redis_script_calls(conn: &mut redis::Connection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .unwrap_or_default();
    let mut calls = 0;
    let mut failed = 0;
    for line in info.lines() {
        let Some((name, fields)) = line.trim().split_once(':') else {
            continue;
        };
        if name != "cmdstat_evalsha" && name != "cmdstat_eval" {
            continue;
        }
        for kv in fields.split(',') {
            match kv.split_once('=') {
                Some(("calls", v)) => calls += v.parse::<u64>().unwrap_or(0),
                Some(("failed_calls", v)) => failed += v.parse::<u64>().unwrap_or(0),
                _ => {}
            }
        }
    }
    (calls, failed)
}

/// The counters of interest in an Envoy's admin /stats: tollgate's own and its backend cluster's.
pub fn filter_stats(envoy: &Envoy) -> BTreeMap<String, i64> {
    let Ok(resp) = try_http(envoy.admin_port, "GET", "/stats?filter=tollgate", &[]) else {
        return BTreeMap::new();
    };
    resp.body
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(": ")?;
            // Envoy 1.40 puts the filter's metrics under `wasmcustom.`.
            let name = name.strip_prefix("wasmcustom.").unwrap_or(name);
            let keep = name.starts_with("tollgate.")
                || name.starts_with("cluster.tollgate_backend.upstream_rq")
                || name == "cluster.tollgate_backend.upstream_cx_total";
            if !keep {
                return None;
            }
            Some((name.to_string(), value.trim().parse::<i64>().ok()?))
        })
        .collect()
}

/// The checks decided in a `filter_stats` map: each counts once in `allowed`, `denied` or
/// `shadow_denied`.
pub fn decided(stats: &BTreeMap<String, i64>) -> i64 {
    stats
        .iter()
        .filter(|(k, _)| k.starts_with("tollgate."))
        .filter(|(k, _)| {
            [".allowed", ".denied", ".shadow_denied"]
                .iter()
                .any(|c| k.ends_with(c))
        })
        .map(|(_, v)| *v)
        .sum()
}

pub fn stats_delta(
    before: &BTreeMap<String, i64>,
    after: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, d)| *d != 0)
        .collect()
}
fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text).trim().to_string()
        })
        .unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == "model name").then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The machine and tools a run measured on, and when.
pub struct Machine {
    /// `2026-11-25 22:49:35 UTC`, and `20261125T224935Z` for file names.
    pub date: String,
    pub stamp: String,
    pub nproc: String,
    pub model: String,
    pub envoy_version: String,
    pub h2load_version: String,
}

impl Machine {
    pub fn now() -> Machine {
        let now = jiff::Timestamp::now();
        Machine {
            date: now.strftime("%Y-%m-%d %H:%M:%S UTC").to_string(),
            stamp: now.strftime("%Y%m%dT%H%M%SZ").to_string(),
            nproc: command_line("nproc", &[]),
            model: cpu_model(),
            envoy_version: command_line(&envoy_bin().to_string_lossy(), &["--version"]),
            h2load_version: command_line("h2load", &["--version"]),
        }
    }
}
