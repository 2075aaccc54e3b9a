//! One measured load of one scenario and the figures derived from it. A figure that depends on
//! answered requests is `None` when none was answered, so a silent round cannot pass for a fast one.

use std::collections::BTreeMap;

/// The proxy-wide counter of backend requests (one per Webdis request or Redis callout, whatever
/// number of checks it carries), as the bench's stats map names it.
/// The requests Envoy sent to Webdis (the cluster tollgate calls).
pub const WEBDIS_REQUESTS: &str = "cluster.tollgate_backend.upstream_rq_total";

/// One measured load of one scenario.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Requests answered (any status), across every proxy and load of the scenario (the tenant's and
    /// the flood's alike).
    pub requests: u64,
    /// Of those, the flood's in tollgate-tenant-flood (its latency and 200s are left out of p50/p99
    /// and admitted ÷ ideal, which are the tenant's).
    pub background_requests: u64,
    /// 200s of the load admitted ÷ ideal is about (the hot key's).
    pub admitted: u64,
    /// Flood requests whose key had been sent before (h2load came round its URI list again).
    pub repeated_keys: u64,
    /// Requests h2load counted as done (a cross-check of `requests`).
    pub h2load_done: u64,
    /// Requests started and never answered before the load ended (h2load: started − done). h2load
    /// leaves one in flight on each connection when a timed load ends: only more than that is odd.
    pub unfinished: u64,
    /// `unfinished` beyond one per connection: requests that hung.
    pub hung: u64,
    pub ok: u64,
    pub limited: u64,
    pub server_errors: u64,
    pub other_status: u64,
    pub failed: u64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The primary load's request latencies, µs (p50/p99 come from them).
    pub latencies_us: Vec<u64>,
    /// First request start to last completion.
    pub wall_s: f64,
    pub envoy_cpu_s: f64,
    pub webdis_cpu_s: f64,
    pub redis_cpu_s: f64,
    pub cpu_us_per_req: f64,
    /// Webdis + Redis CPU per request (the backend's side of the bill), and each on its own.
    pub backend_cpu_us_per_req: f64,
    pub webdis_cpu_us_per_req: f64,
    pub redis_cpu_us_per_req: f64,
    pub redis_calls: u64,
    pub redis_failed_calls: u64,
    /// EVALSHA calls alone and the µs Redis spent running them (INFO commandstats' `usec`).
    pub evalsha_calls: u64,
    pub evalsha_usec: u64,
    /// burst + rate × wall_s (limited scenarios).
    pub ideal: Option<f64>,
    pub stats: BTreeMap<String, i64>,
    /// Envoy CPU µs/request of each slice this sample merges, in the order they ran (the
    /// single-key closed loops; empty for a sample of one load).
    pub slices_cpu_us: Vec<f64>,
    /// The scenario's Envoy processes (for a profile of the run: bench/perf-split.py).
    pub envoy_pids: Vec<u32>,
}

impl Sample {
    /// Whether any request was answered: the per-request figures mean nothing otherwise.
    pub fn answered(&self) -> bool {
        self.requests > 0
    }

    pub fn cpu(&self) -> Option<f64> {
        self.answered().then_some(self.cpu_us_per_req)
    }

    pub fn p50(&self) -> Option<f64> {
        self.answered().then_some(self.p50_ms)
    }

    pub fn p99(&self) -> Option<f64> {
        self.answered().then_some(self.p99_ms)
    }

    pub fn redis_per_1k_requests(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.redis_calls as f64 * 1000.0 / self.requests as f64)
    }

    pub fn redis_per_1k_admitted(&self) -> Option<f64> {
        (self.ok > 0).then(|| self.redis_calls as f64 * 1000.0 / self.ok as f64)
    }

    /// Redis' µs per EVALSHA call over the load: the script's time per backend request.
    pub fn evalsha_usec_per_call(&self) -> Option<f64> {
        (self.evalsha_calls > 0).then(|| self.evalsha_usec as f64 / self.evalsha_calls as f64)
    }

    /// Checks per HTTP request Envoy sent to Webdis: tollgate's `backend_calls` summed over its
    /// rules (one per check a script call carried) ÷ its cluster's `upstream_rq_total`.
    pub fn keys_per_webdis_request(&self) -> Option<f64> {
        self.backend_calls_per(WEBDIS_REQUESTS)
    }

    /// tollgate's `backend_calls` summed over its rules ÷ the counter `per` (`None` without it).
    fn backend_calls_per(&self, per: &str) -> Option<f64> {
        let sum = |f: &dyn Fn(&str) -> bool| -> i64 {
            self.stats
                .iter()
                .filter(|(k, _)| f(k))
                .map(|(_, v)| *v)
                .sum()
        };
        let requests = sum(&|k| k == per);
        let calls = sum(&|k| {
            k.strip_prefix("tollgate.")
                .and_then(|rest| rest.split_once('.'))
                .is_some_and(|(rule, counter)| !rule.is_empty() && counter == "backend_calls")
        });
        (requests > 0).then(|| calls as f64 / requests as f64)
    }

    pub fn admitted_ratio(&self) -> Option<f64> {
        self.ideal
            .filter(|i| *i > 0.0)
            .map(|i| self.admitted as f64 / i)
    }

    /// Envoy + Webdis + Redis CPU per request.
    pub fn system_cpu(&self) -> Option<f64> {
        self.answered()
            .then_some(self.cpu_us_per_req + self.backend_cpu_us_per_req)
    }

    /// Fills in the figures computed from the counts: per-request CPU and latency percentiles.
    pub fn derive(&mut self) {
        self.latencies_us.sort_unstable();
        self.p50_ms = percentile(&self.latencies_us, 50.0) as f64 / 1000.0;
        self.p99_ms = percentile(&self.latencies_us, 99.0) as f64 / 1000.0;
        if self.requests > 0 {
            let per_req = |cpu_s: f64| cpu_s * 1e6 / self.requests as f64;
            self.cpu_us_per_req = per_req(self.envoy_cpu_s);
            self.webdis_cpu_us_per_req = per_req(self.webdis_cpu_s);
            self.redis_cpu_us_per_req = per_req(self.redis_cpu_s);
            self.backend_cpu_us_per_req = self.webdis_cpu_us_per_req + self.redis_cpu_us_per_req;
        }
    }

    /// One closed-loop sample from the slices of one scenario's load in a round: counts, CPU and
    /// wall time add up, latencies pool, req/s is requests over the slices' wall time.
    pub fn merge(parts: Vec<Sample>) -> Sample {
        let mut m = Sample::default();
        for p in parts {
            m.requests += p.requests;
            m.background_requests += p.background_requests;
            m.admitted += p.admitted;
            m.repeated_keys += p.repeated_keys;
            m.h2load_done += p.h2load_done;
            m.unfinished += p.unfinished;
            m.hung += p.hung;
            m.ok += p.ok;
            m.limited += p.limited;
            m.server_errors += p.server_errors;
            m.other_status += p.other_status;
            m.failed += p.failed;
            m.wall_s += p.wall_s;
            m.envoy_cpu_s += p.envoy_cpu_s;
            m.webdis_cpu_s += p.webdis_cpu_s;
            m.redis_cpu_s += p.redis_cpu_s;
            m.redis_calls += p.redis_calls;
            m.redis_failed_calls += p.redis_failed_calls;
            m.evalsha_calls += p.evalsha_calls;
            m.evalsha_usec += p.evalsha_usec;
            m.latencies_us.extend(p.latencies_us);
            m.slices_cpu_us.push(p.cpu_us_per_req);
            for pid in p.envoy_pids {
                if !m.envoy_pids.contains(&pid) {
                    m.envoy_pids.push(pid);
                }
            }
            for (k, v) in p.stats {
                *m.stats.entry(k).or_insert(0) += v;
            }
        }
        if m.wall_s > 0.0 {
            m.rps = m.requests as f64 / m.wall_s;
        }
        m.derive();
        m
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn slices_merge_into_one_sample() {
        let slice = |requests: u64, cpu_s: f64, wall_s: f64| {
            let mut s = Sample {
                requests,
                wall_s,
                envoy_cpu_s: cpu_s,
                latencies_us: vec![100; requests as usize],
                ..Sample::default()
            };
            s.derive();
            s
        };
        let m = Sample::merge(vec![slice(1000, 0.05, 0.5), slice(3000, 0.09, 0.5)]);
        assert_eq!(m.requests, 4000);
        assert!(
            (m.cpu_us_per_req - 35.0).abs() < 1e-9,
            "{}",
            m.cpu_us_per_req
        );
        assert!((m.rps - 4000.0).abs() < 1e-9);
        assert_eq!(m.slices_cpu_us.len(), 2);
        assert!(Sample::default().cpu().is_none(), "no answer, no figure");
    }

    #[test]
    fn keys_per_webdis_request_sums_every_rule_and_needs_the_cluster_counter() {
        let with = |pairs: &[(&str, i64)]| Sample {
            stats: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..Sample::default()
        };
        let s = with(&[
            ("tollgate.per-user.backend_calls", 600),
            ("tollgate.other.backend_calls", 300),
            ("tollgate.per-user.backend_errors", 50),
            ("cluster.tollgate_backend.upstream_rq_total", 300),
        ]);
        assert_eq!(s.keys_per_webdis_request(), Some(3.0));
        // No request counted: no figure, not "infinitely many".
        let old = with(&[("tollgate.per-user.backend_calls", 600)]);
        assert_eq!(old.keys_per_webdis_request(), None);
        let timed = Sample {
            evalsha_calls: 4,
            evalsha_usec: 100,
            ..Sample::default()
        };
        assert_eq!(timed.evalsha_usec_per_call(), Some(25.0));
        assert_eq!(Sample::default().evalsha_usec_per_call(), None);
    }
}
