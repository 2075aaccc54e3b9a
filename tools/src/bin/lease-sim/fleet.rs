//! The simulator at fleet scale: `make sim-scale` (`lease-sim --scale`). Each proxy runs two
//! workers of the real engine (one in-memory shared-data store per proxy), every bucket is the
//! model of the Lua script, and the clock is simulated, as in the single-key simulator; here the
//! fleet has one hot key and many warm keys, demand skewed across proxies (demand.rs), proxies
//! joining and leaving mid-run, and requests arriving per proxy as a Poisson process (many
//! independent clients) rather than paced. The same options give the same requests; the figures
//! move by a few thousandths between runs, because each proxy's engine draws its holder id (and
//! its tables' seeds) at random, as a real proxy does.
//!
//! The files: demand.rs (who asks for what, and when each proxy is in the fleet), sim.rs (the
//! event loop), figures.rs (what a run reports). The table's columns are explained by
//! [`LEGEND`].

pub mod args;
pub mod demand;
pub mod figures;
pub mod floor;
pub mod sim;

use figures::{Figures, SHOWN_MS};
use sim::FleetSim;

/// One fleet run's shape.
#[derive(Clone, Debug)]
pub struct FleetOpts {
    pub proxies: usize,
    pub workers: usize,
    /// The hot key's demand ÷ its rate.
    pub overload: f64,
    pub hot_rate: u64,
    pub hot_burst: u64,
    pub warm_keys: usize,
    pub warm_rate: u64,
    pub warm_burst: u64,
    /// Requests per second each warm key gets, fleet-wide.
    pub warm_load: f64,
    pub duration_ms: u64,
    /// Some proxies join a third of the way in and some leave two thirds of the way in.
    pub churn: bool,
    pub lat_min_us: u64,
    pub lat_max_us: u64,
    /// The rules' `mode`: "lease" or "exact".
    pub mode: &'static str,
    pub horizon_ms: Option<u64>,
    /// The rules' `max_wait_ms`: how long a request may wait for a token (0: refused at once).
    pub max_wait_ms: u64,
    pub seed: u64,
}

impl Default for FleetOpts {
    fn default() -> FleetOpts {
        FleetOpts {
            proxies: 10,
            workers: 2,
            overload: 5.0,
            hot_rate: 1000,
            hot_burst: 1000,
            warm_keys: 10_000,
            warm_rate: 5,
            warm_burst: 10,
            warm_load: 1.0,
            duration_ms: 10_000,
            churn: true,
            lat_min_us: 1000,
            lat_max_us: 2000,
            mode: "lease",
            horizon_ms: None,
            max_wait_ms: 0,
            seed: 1,
        }
    }
}

/// Runs one fleet and returns its figures.
pub fn run(o: &FleetOpts) -> Figures {
    let started = std::time::Instant::now();
    let sim = FleetSim::new(o).run();
    let mut f = sim.figures();
    f.wall_s = started.elapsed().as_secs_f64();
    f
}

/// The sizes `make sim-scale` runs: proxies × overload.
pub const SIZES: [usize; 3] = [10, 100, 1000];
pub const OVERLOADS: [f64; 3] = [1.0, 5.0, 50.0];

pub fn describe(o: &FleetOpts) -> String {
    format!(
        "{} mode; hot key: rate {}/s, burst {}; {} warm keys: rate {}/s, burst {}, {} req/s each \
         (fleet-wide); {} workers per proxy; {} s simulated per run; call round trip {}-{} ms; \
         5% of the proxies (at least one) are gateways with 80% of every key's demand, the other \
         95% sidecars share 20%; {}; seed {}",
        o.mode,
        o.hot_rate,
        o.hot_burst,
        o.warm_keys,
        o.warm_rate,
        o.warm_burst,
        o.warm_load,
        o.workers,
        o.duration_ms as f64 / 1000.0,
        o.lat_min_us as f64 / 1000.0,
        o.lat_max_us as f64 / 1000.0,
        if o.churn {
            "proxies with index 3 mod 10 join at 1/3 of the run, those with 7 mod 10 leave at 2/3"
        } else {
            "no churn"
        },
        o.seed
    )
}

pub fn header() -> String {
    let shown: Vec<String> = SHOWN_MS
        .iter()
        .map(|w| format!("{:>7}", format!("+W{}", *w as f64 / 1000.0)))
        .collect();
    format!(
        "{:>7} {:>5} {:>6} {:>7} {:>7} {} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7} {:>6} {:>6} {:>6}",
        "proxies",
        "load",
        "wait",
        "hot a/i",
        "warm a/i",
        shown.join(" "),
        "warm+W",
        "calls/s",
        "hot c/s",
        "/1k adm",
        "hot /1k",
        "floor/1k",
        "c/floor",
        "gw /1k",
        "side/1k",
        "warm/1k",
        "1st p50",
        "1st p99",
        "starved",
        "fair",
        "worst",
        "wall s"
    )
}

pub fn row(o: &FleetOpts, f: &Figures) -> String {
    let shown: Vec<String> = SHOWN_MS
        .iter()
        .map(|w| {
            let e = f
                .hot_excess
                .iter()
                .find(|(l, _)| l == w)
                .map_or(f64::NAN, |&(_, e)| e);
            format!("{e:>+7.0}")
        })
        .collect();
    let ms = |q: f64| match f.first_token(q) {
        Some(v) => format!("{v:.0} ms"),
        None => "never".to_string(),
    };
    format!(
        "{:>7} {:>4}x {:>6} {:>7.3} {:>7.3} {} {:>+7.0} {:>8.0} {:>8.0} {:>8.1} {:>8.1} {:>8.1} {:>8.2} {:>8.1} {:>8.1} {:>8.1} {:>9} {:>9} {:>7} {:>6.2} {:>6} {:>6.1}",
        o.proxies,
        o.overload,
        o.max_wait_ms,
        f.hot_ratio(),
        f.warm_ratio(),
        shown.join(" "),
        f.warm_excess,
        f.calls_per_s(),
        f.hot_calls as f64 / f.seconds,
        Figures::per_1k(f.calls(), f.admitted()),
        Figures::per_1k(f.hot_calls, f.hot_admitted),
        f.hot_floor * 1000.0 / f.hot_admitted.max(1) as f64,
        f.hot_calls as f64 / f.hot_floor.max(f64::MIN_POSITIVE),
        Figures::per_1k(
            f.hot_gateway_calls,
            f.hot_admitted.saturating_sub(f.hot_sidecar_admitted)
        ),
        Figures::per_1k(
            f.hot_calls.saturating_sub(f.hot_gateway_calls),
            f.hot_sidecar_admitted
        ),
        Figures::per_1k(f.warm_calls, f.warm_admitted),
        ms(0.5),
        ms(0.99),
        f.starved(),
        f.fairness,
        // No sidecar asked 20 times (a large fleet at 1x): no figure, rather than NaN.
        if f.worst_sidecar.is_finite() {
            format!("{:.2}", f.worst_sidecar)
        } else {
            "—".to_string()
        },
        f.wall_s,
    )
}

pub const LEGEND: &str = "\
wait: the rules' max_wait_ms (lease mode: how long a request may wait for the tokens its proxy's
  reservation refills; 0: refused at once); hot a/i, warm a/i: admitted / ideal, the ideal being
  what one perfect token bucket per key admits of the same requests as they arrive, each let
  through once its token refilled if that is within the wait; both count what was let through by
  the end of the run; +W0.1 +W1 +W10: the hot key's fullest window of 0.1, 1 and 10 s,
  admitted - (burst + rate x W) (never over: <= 0); warm+W: the most any warm key's window (10 ms to
  10 s) passed its bound by; calls/s: script calls per simulated second, hot c/s those of the hot
  key; /1k adm: calls per 1000
  admitted (all keys), hot /1k and warm/1k the same per kind of key; floor/1k: the fewest hot-key
  calls per 1000 admitted any scheme needs whose proxies admit only with tokens a call granted and
  hold no more than the burst idle on average, for the same requests and admissions, each request
  waiting at most a round trip plus max_wait_ms (fleet/floor.rs; a lower bound under those
  assumptions; exact mode meets them, so it holds there too); c/floor: hot-key calls / that floor
  (>= 1; how far from what any such scheme could do); gw /1k and side/1k: the hot
  key's calls the gateways sent per 1000 of the gateways' admissions of it, and the sidecars' per
  1000 of theirs (how each kind of proxy scales); 1st p50/p99: from a sidecar's
  first request of the hot key to its first admission (median and 99th percentile over sidecars;
  never: not admitted in the run); starved: sidecars never admitted; fair: the sidecars' share of
  the hot key's admissions / their share of its requests (1 = admitted in proportion to demand);
  worst: the lowest sidecar's admitted/requested over the fleet's (sidecars with 20+ requests; —:
  none had);
  wall s: the run's real time";

/// `--scale`: every rules' wait, size and overload, one line each.
pub fn table(base: &FleetOpts, sizes: &[usize], overloads: &[f64], max_waits: &[u64]) {
    println!("{}", describe(base));
    println!("{}", header());
    for &max_wait_ms in max_waits {
        for &proxies in sizes {
            for &overload in overloads {
                let o = FleetOpts {
                    proxies,
                    overload,
                    max_wait_ms,
                    ..base.clone()
                };
                let f = run(&o);
                println!("{}", row(&o, &f));
            }
        }
    }
    println!("{LEGEND}");
}
