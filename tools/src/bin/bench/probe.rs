//! What the bench reads off its processes, never changing them: Redis' script calls from INFO and an
//! Envoy's counters from its admin /stats (CPU time and the machine's description are the tools'
//! shared readers, `tollgate_tools::cpu` and `::machine`). A reading that fails counts as zero (the
//! figure shows it), never as an error that would lose a run.

use std::collections::BTreeMap;

use tollgate_e2e as common;

use common::envoy::Envoy;
use common::http::try_http;

/// Redis' script calls, from INFO commandstats: counters since Redis started, or (`since`) over a
/// load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScriptCalls {
    /// evalsha + eval calls, and their failed_calls.
    pub calls: u64,
    pub failed: u64,
    /// evalsha calls alone, and the µs Redis spent running them (`usec`): µs per call is the
    /// script's time per backend request, whatever number of keys each carried.
    pub evalsha_calls: u64,
    pub evalsha_usec: u64,
}

impl ScriptCalls {
    /// The calls made between `before` and `self`.
    pub fn since(self, before: ScriptCalls) -> ScriptCalls {
        ScriptCalls {
            calls: self.calls.saturating_sub(before.calls),
            failed: self.failed.saturating_sub(before.failed),
            evalsha_calls: self.evalsha_calls.saturating_sub(before.evalsha_calls),
            evalsha_usec: self.evalsha_usec.saturating_sub(before.evalsha_usec),
        }
    }

    /// Reads INFO commandstats' text.
    pub fn parse(info: &str) -> ScriptCalls {
        let mut s = ScriptCalls::default();
        for line in info.lines() {
            let Some((name, fields)) = line.trim().split_once(':') else {
                continue;
            };
            let evalsha = name == "cmdstat_evalsha";
            if !evalsha && name != "cmdstat_eval" {
                continue;
            }
            for kv in fields.split(',') {
                let Some((k, v)) = kv.split_once('=') else {
                    continue;
                };
                let n = v.parse::<u64>().unwrap_or(0);
                match k {
                    "calls" => {
                        s.calls += n;
                        if evalsha {
                            s.evalsha_calls += n;
                        }
                    }
                    "failed_calls" => s.failed += n,
                    "usec" if evalsha => s.evalsha_usec += n,
                    _ => {}
                }
            }
        }
        s
    }
}

/// Redis' script calls so far.
pub fn redis_script_calls(conn: &mut redis::Connection) -> ScriptCalls {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .unwrap_or_default();
    ScriptCalls::parse(&info)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_script_calls_and_evalsha_time_from_commandstats() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=10,usec=250,usec_per_call=25.00,rejected_calls=0,failed_calls=2\r\n\
            cmdstat_eval:calls=3,usec=900,usec_per_call=300.00,rejected_calls=0,failed_calls=1\r\n\
            cmdstat_info:calls=7,usec=70,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n";
        let now = ScriptCalls::parse(info);
        assert_eq!(
            now,
            ScriptCalls {
                calls: 13,
                failed: 3,
                evalsha_calls: 10,
                evalsha_usec: 250,
            }
        );
        let before = ScriptCalls {
            calls: 3,
            failed: 3,
            evalsha_calls: 2,
            evalsha_usec: 50,
        };
        assert_eq!(
            now.since(before),
            ScriptCalls {
                calls: 10,
                failed: 0,
                evalsha_calls: 8,
                evalsha_usec: 200,
            }
        );
        assert_eq!(ScriptCalls::parse(""), ScriptCalls::default());
    }
}
