//! The bound in every window, for the shapes of the sweep and the on/off load that broke it: the
//! simulator's tests, run by `cargo test --workspace` (deterministic: no Envoy, no clock).

use crate::opts::{shapes, Opts};
use crate::report::run_shape;
use crate::run::Window;

/// Every window of every run of `o` admits at most burst + rate × W, plus one request per
/// proxy; returns the fullest.
fn assert_windows(name: &str, o: &Opts) -> Window {
    let runs = run_shape(o);
    assert!(
        runs.iter().all(|r| r.admitted > 0),
        "{name}: nothing admitted"
    );
    let worst = runs
        .iter()
        .map(|r| r.worst)
        .max_by(|a, b| a.excess().total_cmp(&b.excess()))
        .unwrap();
    assert!(
        worst.excess() <= o.proxies as f64,
        "{name}: {} admitted in {} ms from {:.1} ms, where burst + rate x W is {}",
        worst.admitted,
        worst.len_ms,
        worst.start_ms,
        worst.bound
    );
    worst
}

/// Two proxies of two workers, one key at 100/s with a burst of 100, loaded 0.6 s then idle
/// 1.2 s, four times, with lease horizons of 10 s and 1 s: tokens the proxies leased or
/// reserved before a pause used to be spent on top of a bucket that refilled meanwhile (322
/// admitted in 2 s where 300 is the bound).
#[test]
fn pauses_never_let_the_fleet_over_the_bound() {
    for horizon in [10_000, 1000] {
        let o = Opts {
            rate: 100,
            burst: 100,
            pause: Some((600, 1200)),
            duration_ms: 6600,
            horizon_ms: Some(horizon),
            runs: 5,
            ..Opts::default()
        };
        let worst = assert_windows(&format!("horizon {horizon}"), &o);
        // The load came back at full strength after each pause: the bound was reached.
        assert!(worst.excess() > -2.0, "{worst:?}");
    }
}

#[test]
fn every_shape_of_the_sweep_keeps_the_bound_in_every_window() {
    for (name, o) in shapes(&Opts::default()) {
        let o = Opts {
            runs: 3,
            duration_ms: o.duration_ms.min(6600),
            ..o
        };
        assert_windows(name, &o);
    }
}

/// Ten proxies of two workers (one busy gateway with 80% of the demand, nine quiet sidecars, one
/// joining and one leaving mid-run), one hot key at 1x, 5x and 50x its rate and 1000 warm keys:
/// never over burst + rate x W in any window of any key, at least 0.97 of what one perfect token
/// bucket admits, and the sidecars admitted at no less than half their share of the demand; with
/// lease mode's default (a request its proxy cannot serve yet is refused) and with requests held
/// up to a second. At 5x the sidecars' leases were sized on everything denied since their last
/// call, more than they could spend before expiry: 0.83 of the ideal. Ten seconds: a run falls
/// short of the ideal by 100 to 150 tokens however long it is, and the holder ids and table
/// seeds each proxy draws at random move it; in 4 s runs that was 0.9716 to 0.9892 over 40
/// draws at 5x without a wait, and one draw in CI gave 0.967 (10 s: 0.9845 to 0.9951).
#[test]
fn a_fleet_of_ten_keeps_the_bound_admits_the_ideal_and_serves_quiet_proxies() {
    for max_wait_ms in [0, 1000] {
        for overload in [1.0, 5.0, 50.0] {
            assert_fleet(10, overload, max_wait_ms, 10_000);
        }
    }
}

/// A hundred proxies at 5x, requests held up to a second: every admission is a reservation. The
/// request that made one got a 429 and its tokens served only requests arriving after they had
/// refilled, so the quiet proxies dropped much of what they reserved: 0.80 of the ideal. Ten
/// seconds: the fleet takes a moment to spread a full bucket's burst when the surge starts (about
/// 0.15 s of refill), which weighs too much in a shorter run.
#[test]
fn a_fleet_of_a_hundred_holding_requests_admits_the_ideal_at_5x() {
    assert_fleet(100, 5.0, 1000, 10_000);
}

/// A hundred proxies at 5x, the default max_wait_ms of 0: the sidecars' leases expire with
/// tokens unspent (0.957 of the ideal when those were lost to the fleet); they go back to the
/// bucket with the proxy's next lease call.
#[test]
fn a_fleet_of_a_hundred_without_a_wait_admits_the_ideal_at_5x() {
    assert_fleet(100, 5.0, 0, 10_000);
}

/// One fleet run with 1000 warm keys: the bound in every window, >= 0.97 of the ideal, the
/// sidecars served.
fn assert_fleet(proxies: usize, overload: f64, max_wait_ms: u64, duration_ms: u64) {
    use crate::fleet::{self, FleetOpts};
    let o = FleetOpts {
        proxies,
        overload,
        max_wait_ms,
        warm_keys: 1000,
        duration_ms,
        ..FleetOpts::default()
    };
    let f = fleet::run(&o);
    let row = fleet::row(&o, &f);
    let at = format!("{proxies} proxies, {overload}x, max_wait_ms {max_wait_ms}");
    assert!(f.hot_admitted > 0 && f.warm_admitted > 0, "{row}");
    for &(w, e) in &f.hot_excess {
        assert!(
            e <= 0.0,
            "{at}: the hot key's {w} ms window is {e} over\n{row}"
        );
    }
    assert!(f.warm_excess <= 0.0, "{at}: a warm key is over\n{row}");
    assert!(f.hot_ratio() >= 0.97, "{at}: hot key\n{row}");
    assert!(f.warm_ratio() >= 0.97, "{at}: warm keys\n{row}");
    assert!(f.fairness >= 0.5, "{at}: sidecars\n{row}");
    assert_eq!(f.starved(), 0, "{at}\n{row}");
}

/// `n` equal proxies, each sent `rate` requests a second for `seconds`, all admitted.
fn equal_proxies(n: usize, rate: f64, seconds: f64) -> Vec<crate::fleet::floor::ProxyDemand> {
    let each = (rate * seconds) as u64;
    vec![
        crate::fleet::floor::ProxyDemand {
            requests: each,
            admitted: each,
            alive_s: seconds,
        };
        n
    ]
}

#[test]
fn the_floor_of_equal_proxies_grants_one_plus_twice_the_burst_over_the_proxies() {
    use crate::fleet::floor::lease_floor;
    // Each proxy holds (g - 1) / 2 tokens on average whatever its rate: 10 of them within a
    // burst of 20 get g = 1 + 2 x 20 / 10 = 5 tokens a call, 10,000 admissions take 2,000 calls.
    for rate in [10.0, 100.0, 1000.0] {
        let floor = lease_floor(&equal_proxies(10, rate, 10.0), 20.0, 10.0, 0.0);
        let want = 10.0 * rate * 10.0 / 5.0;
        assert!(
            (floor - want).abs() < 1e-6 * want,
            "rate {rate}: {floor} != {want}"
        );
    }
}

#[test]
fn the_floor_is_a_call_per_admission_without_a_burst_and_a_call_per_proxy_with_a_huge_one() {
    use crate::fleet::floor::lease_floor;
    let ps = equal_proxies(10, 100.0, 10.0);
    let none = lease_floor(&ps, 0.0, 10.0, 0.0);
    assert!((none - 10_000.0).abs() < 1e-6, "{none}");
    let huge = lease_floor(&ps, 1e9, 10.0, 0.0);
    assert!((huge - 10.0).abs() < 1e-9, "{huge}");
    // A proxy that admitted nothing needs no call.
    let mut idle = ps.clone();
    idle[0].admitted = 0;
    assert!((lease_floor(&idle, 1e9, 10.0, 0.0) - 9.0).abs() < 1e-9);
}

#[test]
fn the_floor_shares_a_call_among_the_requests_that_may_wait_for_it() {
    use crate::fleet::floor::lease_floor;
    // No burst to hold: a call serves the request that made it and the 100/s x 0.05 s = 5 that
    // arrive while they may wait.
    let ps = equal_proxies(10, 100.0, 10.0);
    let floor = lease_floor(&ps, 0.0, 10.0, 0.05);
    assert!((floor - 10_000.0 / 6.0).abs() < 1e-6, "{floor}");
    // With a burst as well, waiting only lowers it.
    assert!(lease_floor(&ps, 20.0, 10.0, 0.05) < lease_floor(&ps, 20.0, 10.0, 0.0));
}

#[test]
fn the_floor_of_a_skewed_fleet_matches_its_closed_form() {
    use crate::fleet::floor::{lease_floor, ProxyDemand};
    // The fleet of `make sim-scale` at 1000 proxies and 1x: 50 gateways at 16/s, 950 sidecars
    // at 0.2105/s, burst 1000; over 100 s so that no grant reaches a proxy's admissions. With
    // every grant g_p = c sqrt(D_p) > 1, holding sum a_p (g_p - 1) / (2 D_p) = B T gives
    // c = (2B + N) / sum sqrt(D_p) and calls = T (sum sqrt(D_p))^2 / (2B + N).
    let t = 100.0;
    let (gw, side): (f64, f64) = (16.0, 200.0 / 950.0);
    let mut ps = Vec::new();
    for (n, d) in [(50, gw), (950, side)] {
        for _ in 0..n {
            let a = (d * t).round() as u64;
            ps.push(ProxyDemand {
                requests: a,
                admitted: a,
                alive_s: t,
            });
        }
    }
    let sum_sqrt: f64 = ps
        .iter()
        .map(|p| (p.requests as f64 / p.alive_s).sqrt())
        .sum();
    let want = t * sum_sqrt * sum_sqrt / (2.0 * 1000.0 + 1000.0);
    let floor = lease_floor(&ps, 1000.0, t, 0.0);
    assert!((floor - want).abs() < 1e-6 * want, "{floor} != {want}");
    // About 135 calls a second for about 1000 admissions a second.
    assert!((floor / t - 134.8).abs() < 0.5, "{}", floor / t);
}
