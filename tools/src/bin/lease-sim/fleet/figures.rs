//! What a fleet run reports: admitted ÷ ideal (the ideal: what one perfect token bucket per key,
//! answering each request as it arrived and letting it through once its token refilled if that is
//! within the rules' `max_wait_ms`, admits of the same requests; both count what was let through
//! by the end of the run), the fullest window of each
//! length against burst + rate × W, the script calls per second and per 1000 admitted, how long a
//! quiet proxy (a sidecar) waits for its first token of the hot key, and the quiet proxies' share
//! of the hot key's admissions against their share of its demand.

use super::floor::{lease_floor, ProxyDemand};
use super::sim::FleetSim;
use crate::ideal::{self, perfect_waiting};

/// Window lengths checked, in ms: every window of each length that starts at an admission (the
/// most admissions any window of that length holds is among those).
pub const WINDOWS_MS: [u64; 8] = [10, 100, 200, 500, 1000, 2000, 5000, 10_000];
/// The windows the table shows one column each for (the rest only count in the worst).
pub const SHOWN_MS: [u64; 3] = [100, 1000, 10_000];

/// The figures of one run.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub hot_admitted: u64,
    pub hot_ideal: u64,
    pub hot_requests: u64,
    pub warm_admitted: u64,
    pub warm_ideal: u64,
    pub warm_requests: u64,
    /// The hot key's fullest window of each length in [`WINDOWS_MS`]: admitted − (burst + rate × W).
    pub hot_excess: Vec<(u64, f64)>,
    /// The most any warm key's window of any length passed its bound by.
    pub warm_excess: f64,
    /// Script calls sent while requests arrived, per kind of key.
    pub hot_calls: u64,
    pub warm_calls: u64,
    /// Of the hot key's calls, those the gateways sent (the sidecars sent the rest).
    pub hot_gateway_calls: u64,
    /// Of the hot key's admissions, the sidecars' (the gateways had the rest).
    pub hot_sidecar_admitted: u64,
    /// Of the hot key's calls: the tokens granted, and the calls denied and reserved.
    pub hot_granted: u64,
    pub hot_denied: u64,
    pub hot_reserved: u64,
    /// The fewest hot-key calls any lease-style scheme makes for these admissions (floor.rs).
    pub hot_floor: f64,
    pub seconds: f64,
    /// Quiet proxies (sidecars) that asked for the hot key: the time from each one's first
    /// request of it to its first admission, in ms (`None`: never admitted).
    pub first_token_ms: Vec<Option<f64>>,
    /// Sidecars' share of the hot key's admissions ÷ their share of its requests.
    pub fairness: f64,
    /// Of the sidecars that asked for the hot key, the lowest admitted ÷ requested, over its
    /// fleet-wide value, among those that asked at least 20 times.
    pub worst_sidecar: f64,
    pub wall_s: f64,
}

impl Figures {
    pub fn calls(&self) -> u64 {
        self.hot_calls + self.warm_calls
    }
    pub fn admitted(&self) -> u64 {
        self.hot_admitted + self.warm_admitted
    }
    pub fn calls_per_s(&self) -> f64 {
        self.calls() as f64 / self.seconds
    }
    pub fn per_1k(calls: u64, admitted: u64) -> f64 {
        calls as f64 * 1000.0 / admitted.max(1) as f64
    }
    pub fn hot_ratio(&self) -> f64 {
        self.hot_admitted as f64 / self.hot_ideal.max(1) as f64
    }
    pub fn warm_ratio(&self) -> f64 {
        self.warm_admitted as f64 / self.warm_ideal.max(1) as f64
    }
    /// The `q` quantile (0..=1) of the first-token waits; `None`: it falls among the proxies
    /// never admitted.
    pub fn first_token(&self, q: f64) -> Option<f64> {
        let mut v = self.first_token_ms.clone();
        v.sort_by(|a, b| match (a, b) {
            (Some(x), Some(y)) => x.total_cmp(y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        });
        if v.is_empty() {
            return Some(0.0);
        }
        let i = ((v.len() - 1) as f64 * q).round() as usize;
        v[i]
    }
    pub fn starved(&self) -> usize {
        self.first_token_ms.iter().filter(|w| w.is_none()).count()
    }
}

/// The fullest window of length `len_ms` among `admits` (sorted, µs), over burst + rate × W.
fn excess(admits: &[u64], len_ms: u64, burst: u64, rate: u64) -> f64 {
    let bound = burst as f64 + rate as f64 * len_ms as f64 / 1000.0;
    let most = ideal::fullest(admits, len_ms).map_or(0, |(_, held)| held);
    most as f64 - bound
}

impl FleetSim<'_> {
    pub fn figures(&self) -> Figures {
        let o = self.o;
        let end = o.duration_ms * 1000;
        let mut f = Figures {
            seconds: o.duration_ms as f64 / 1000.0,
            ..Figures::default()
        };
        let mut hot_arrivals = Vec::new();
        let mut hot_admits = Vec::new();
        let mut warm_arrivals = vec![Vec::new(); o.warm_keys];
        let mut warm_admits = vec![Vec::new(); o.warm_keys];
        let n = self.proxies.len();
        let (mut asked, mut got) = (vec![0u64; n], vec![0u64; n]);
        let mut got_by_end = vec![0u64; n];
        let mut first_ask = vec![None; n];
        let mut first_got = vec![None; n];
        // Every request arrived before the end (the arrivals stop there).
        for r in &self.reqs {
            let p = r.proxy as usize;
            match r.warm {
                None => {
                    f.hot_requests += 1;
                    hot_arrivals.push(r.arrived_us);
                    asked[p] += 1;
                    first_ask[p].get_or_insert(r.arrived_us);
                    if let Some(a) = r.admitted_us {
                        hot_admits.push(a);
                        // Admitted ÷ ideal counts what was let through by the end, as the ideal.
                        f.hot_admitted += u64::from(a <= end);
                        got_by_end[p] += u64::from(a <= end);
                        got[p] += 1;
                        first_got[p] = Some(first_got[p].map_or(a, |g: u64| g.min(a)));
                    }
                }
                Some(k) => {
                    f.warm_requests += 1;
                    warm_arrivals[k as usize].push(r.arrived_us);
                    if let Some(a) = r.admitted_us {
                        f.warm_admitted += u64::from(a <= end);
                        warm_admits[k as usize].push(a);
                    }
                }
            }
        }
        hot_admits.sort_unstable();
        let demand: Vec<ProxyDemand> = self
            .proxies
            .iter()
            .enumerate()
            .map(|(p, proxy)| ProxyDemand {
                requests: asked[p],
                admitted: got_by_end[p],
                alive_s: proxy.leave_us.min(end).saturating_sub(proxy.join_us) as f64 / 1e6,
            })
            .collect();
        // A request may wait for its token as long as its call's round trip and the rules' wait.
        let wait_s = (o.lat_max_us + o.max_wait_ms * 1000) as f64 / 1e6;
        f.hot_floor = lease_floor(&demand, o.hot_burst as f64, f.seconds, wait_s);
        f.hot_ideal = perfect_waiting(&hot_arrivals, o.hot_burst, o.hot_rate, o.max_wait_ms, end);
        f.hot_excess = WINDOWS_MS
            .iter()
            .map(|&w| (w, excess(&hot_admits, w, o.hot_burst, o.hot_rate)))
            .collect();
        f.warm_excess = f64::NEG_INFINITY;
        for (arrivals, admits) in warm_arrivals.iter().zip(warm_admits.iter_mut()) {
            f.warm_ideal +=
                perfect_waiting(arrivals, o.warm_burst, o.warm_rate, o.max_wait_ms, end);
            admits.sort_unstable();
            for w in WINDOWS_MS {
                f.warm_excess = f
                    .warm_excess
                    .max(excess(admits, w, o.warm_burst, o.warm_rate));
            }
        }
        for c in &self.calls {
            if c.sent_us >= end {
                continue;
            }
            if c.hot {
                f.hot_calls += 1;
                f.hot_gateway_calls += u64::from(self.proxies[c.proxy as usize].gateway);
                if let Some(r) = c.reply {
                    f.hot_granted += r.granted;
                    f.hot_denied += u64::from(!r.allowed);
                    f.hot_reserved += u64::from(r.allowed && r.retry_after_ms > 0);
                }
            } else {
                f.warm_calls += 1;
            }
        }
        let fleet = f.hot_admitted as f64 / f.hot_requests.max(1) as f64;
        let (mut side_asked, mut side_got) = (0, 0);
        f.worst_sidecar = f64::INFINITY;
        for (p, proxy) in self.proxies.iter().enumerate() {
            if proxy.gateway || asked[p] == 0 {
                continue;
            }
            side_asked += asked[p];
            side_got += got[p];
            f.first_token_ms.push(
                first_got[p]
                    .zip(first_ask[p])
                    .map(|(g, a): (u64, u64)| g.saturating_sub(a) as f64 / 1000.0),
            );
            if asked[p] >= 20 {
                let own = got[p] as f64 / asked[p] as f64;
                f.worst_sidecar = f.worst_sidecar.min(own / fleet.max(f64::MIN_POSITIVE));
            }
        }
        f.hot_sidecar_admitted = side_got;
        f.fairness = (side_got as f64 / f.hot_admitted.max(1) as f64)
            / (side_asked as f64 / f.hot_requests.max(1) as f64).max(f64::MIN_POSITIVE);
        f
    }
}
