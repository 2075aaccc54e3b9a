//! The machine and tools a run measured on, and when: the header of every report, so a figure is
//! never read without the machine it came from.

use std::process::Command;

use tollgate_e2e::envoy::envoy_bin;

/// A command's output (stdout, else stderr), trimmed; empty if it cannot run.
pub fn command_line(cmd: &str, args: &[&str]) -> String {
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
