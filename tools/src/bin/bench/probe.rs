//! What the bench reads off its processes, never changing them: an Envoy's counters from its admin
//! /stats (CPU time, Redis' script calls and the machine's description are the tools' shared
//! readers, `tollgate_tools::cpu`, `::commandstats` and `::machine`). A reading that fails counts
//! as zero (the figure shows it), never as an error that would lose a run.

use std::collections::BTreeMap;

use tollgate_e2e as common;

use common::envoy::Envoy;
use common::http::try_http;

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
