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
