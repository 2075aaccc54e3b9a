//! The engine's `Metrics` as Envoy stats: every rule's counters and latency histogram, and the
//! breaker gauge, defined once per worker at configure time (workers defining the same name share
//! one stat).
//!
//! Invariant: a stat the host refused to define is logged once, at configure time, and its counts
//! are dropped; counting never fails a request.

use tollgate_abi::{self as abi, MetricType};
use tollgate_core::config::Config;
use tollgate_core::engine::RuleId;
use tollgate_core::metrics::{self, Counter, Metrics};

pub struct HostMetrics {
    /// Per rule, one id per `Counter::ALL` entry (None if the host refused the name).
    counters: Vec<Vec<Option<u32>>>,
    latency: Vec<Option<u32>>,
    breaker: Option<u32>,
}

fn define(kind: MetricType, name: &str) -> Option<u32> {
    match abi::define_metric(kind, name) {
        Ok(id) => Some(id),
        Err(s) => {
            log::error!("tollgate: cannot define metric {name}: {s}");
            None
        }
    }
}

impl HostMetrics {
    pub fn define(config: &Config) -> HostMetrics {
        HostMetrics {
            counters: config
                .rules
                .iter()
                .map(|r| {
                    Counter::ALL
                        .iter()
                        .map(|c| define(MetricType::Counter, &metrics::name(&r.name, &c.suffix())))
                        .collect()
                })
                .collect(),
            latency: config
                .rules
                .iter()
                .map(|r| {
                    define(
                        MetricType::Histogram,
                        &metrics::name(&r.name, metrics::LATENCY_SUFFIX),
                    )
                })
                .collect(),
            breaker: define(MetricType::Gauge, metrics::BREAKER_GAUGE),
        }
    }
}

impl Metrics for HostMetrics {
    fn count(&self, rule: RuleId, counter: Counter, n: u64) {
        let id = self
            .counters
            .get(rule.index())
            .and_then(|ids| ids.get(counter.index()).copied().flatten());
        if let (Some(id), Ok(n @ 1..)) = (id, i64::try_from(n)) {
            let _ = abi::increment_metric(id, n);
        }
    }

    fn latency(&self, rule: RuleId, ms: u64) {
        if let Some(id) = self.latency.get(rule.index()).copied().flatten() {
            let _ = abi::record_metric(id, ms);
        }
    }

    fn breaker_open(&self, open: bool) {
        if let Some(id) = self.breaker {
            let _ = abi::record_metric(id, u64::from(open));
        }
    }
}
