//! Printing a shape's runs: medians and means over the seeded runs, and the fullest window of
//! any run against the bound.

use crate::opts::Opts;
use crate::run::{Run, WINDOWS_MS};
use crate::sim::Sim;

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0u64), |(s, n), x| (s + x, n + 1));
    s / n.max(1) as f64
}

pub fn run_shape(o: &Opts) -> Vec<Run> {
    (0..o.runs)
        .map(|i| Sim::new(o, o.seed + i).run(o.trace && i == 0))
        .collect()
}

pub fn report(o: &Opts, runs: &[Run]) {
    let ratio = median(runs.iter().map(Run::ratio).collect());
    let per_1k = median(runs.iter().map(Run::per_1k).collect());
    let m = |f: fn(&Run) -> f64| mean(runs.iter().map(f));
    println!(
        "shape: rate {}/s burst {} load {}/s over {} proxies x {} workers, {} clients per proxy, \
         {} ms (± {}), latency {}-{} ms, horizon {}, lease_max {}, {} runs from seed {}",
        o.rate,
        o.burst,
        o.load,
        o.proxies,
        o.workers,
        o.clients,
        o.duration_ms,
        o.jitter_ms,
        o.lat_min_us as f64 / 1000.0,
        o.lat_max_us as f64 / 1000.0,
        o.horizon_ms.map_or("default".into(), |h| h.to_string()),
        o.lease_max.map_or("default".into(), |h| h.to_string()),
        o.runs,
        o.seed
    );
    println!(
        "admitted / ideal: median {ratio:.3} (mean {:.3}, min {:.3}, max {:.3})",
        m(Run::ratio),
        runs.iter().map(Run::ratio).fold(f64::INFINITY, f64::min),
        runs.iter().map(Run::ratio).fold(0.0, f64::max)
    );
    println!(
        "admitted / what one perfect token bucket admits of the same requests: median {:.3} (min {:.3})",
        median(runs.iter().map(|r| r.admitted as f64 / r.perfect.max(1) as f64).collect()),
        runs.iter().map(|r| r.admitted as f64 / r.perfect.max(1) as f64).fold(f64::INFINITY, f64::min)
    );
    println!(
        "calls per 1000 admitted: median {per_1k:.1} (mean {:.1}, max {:.1})",
        m(Run::per_1k),
        runs.iter().map(Run::per_1k).fold(0.0, f64::max)
    );
    println!(
        "per load (means): admitted {:.1}, limited {:.1}, ideal {:.1}, calls {:.1}",
        m(|r| r.admitted as f64),
        m(|r| r.limited as f64),
        m(|r| r.ideal),
        m(|r| r.calls as f64),
    );
    println!(
        "where the ideal's tokens went (means): admitted {:.1} | overflowed the full bucket {:.1} | \
         in the bucket at the end {:.1} (negative: reserved ahead of the refill) | leased and \
         dropped (expired/evicted) {:.1} | held in pools/stashes at the end, refilled already \
         {:.1} | admitted after the load's end {:.1}",
        m(|r| r.admitted as f64),
        m(|r| r.overflow),
        m(|r| r.in_bucket_end),
        m(|r| r.dropped as f64),
        m(|r| r.held_end_refilled),
        m(|r| r.spent_after as f64),
    );
    println!(
        "calls by kind (means): lease granted in full {:.1}, in part {:.1}, reserved {:.1}, denied {:.1}, exact {:.1}; \
         sent from a tick {:.1}; found the bucket full {:.1}",
        m(|r| r.lease_full as f64),
        m(|r| r.lease_partial as f64),
        m(|r| r.lease_reserved as f64),
        m(|r| r.lease_denied as f64),
        m(|r| r.exact as f64),
        m(|r| r.from_root as f64),
        m(|r| r.at_full as f64),
    );
    let worst = runs
        .iter()
        .map(|r| r.worst)
        .max_by(|a, b| a.excess().total_cmp(&b.excess()))
        .unwrap_or_default();
    println!(
        "windows: the fullest, against burst + rate x W, over every window of {WINDOWS_MS:?} ms \
         starting at an admission, in every run: {} admitted in {} ms from {:.1} ms where the \
         bound is {:.0} (excess {:+.0}; allowed: at most one request per proxy, {})",
        worst.admitted,
        worst.len_ms,
        worst.start_ms,
        worst.bound,
        worst.excess(),
        o.proxies
    );
    let share = |r: &Run| {
        let total: u64 = r.per_proxy.iter().sum();
        let min = r.per_proxy.iter().copied().min().unwrap_or(0);
        min as f64 * r.per_proxy.len() as f64 / total.max(1) as f64
    };
    println!(
        "mean tokens in the global bucket {:.1}, in pools and stashes {:.1}; 429s while it held a token {:.1}; local 429s {:.1}; \
         smallest proxy share x proxies {:.3}; last tick {:.1} ms after the load (max {:.1})",
        m(|r| r.mean_bucket),
        m(|r| r.mean_held),
        m(|r| r.limited_with_tokens as f64),
        m(|r| r.local_denied as f64),
        m(share),
        m(|r| r.ticks_after_ms),
        runs.iter().map(|r| r.ticks_after_ms).fold(0.0, f64::max),
    );
}
