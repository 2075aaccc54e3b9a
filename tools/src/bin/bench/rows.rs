//! From samples to figures: each scenario's medians over the rounds, and its ratios to plain's,
//! taken round by round (a round's scenarios share its stretch of the machine's time, so their
//! ratio is steadier than the ratio of two medians).

use crate::sample::Sample;
use crate::scenarios::Def;
use tollgate_tools::median::median;
use tollgate_tools::median::quartiles;

pub fn median_of(samples: &[Sample], f: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
    let mut v: Vec<f64> = samples.iter().filter_map(f).collect();
    median(&mut v)
}

/// Median over rounds of the round's value divided by `base`'s value in the same round (rounds where
/// either has no value, or the base is 0, are left out).
pub fn paired_ratio(
    samples: &[Sample],
    base: &[Sample],
    f: impl Fn(&Sample) -> Option<f64>,
) -> Option<f64> {
    let mut v: Vec<f64> = samples
        .iter()
        .zip(base)
        .filter_map(|(s, b)| Some((f(s)?, f(b).filter(|x| *x > 0.0)?)))
        .map(|(s, b)| s / b)
        .collect();
    median(&mut v)
}

pub struct Row {
    pub def: Def,
    pub samples: Vec<Sample>,
    pub cpu: Option<f64>,
    pub cpu_x: Option<f64>,
    pub backend_cpu: Option<f64>,
    pub rps: Option<f64>,
    pub rps_x: Option<f64>,
    pub p50: Option<f64>,
    pub p50_x: Option<f64>,
    pub p99: Option<f64>,
    pub p99_x: Option<f64>,
    pub redis_per_1k: Option<f64>,
    pub redis_per_1k_admitted: Option<f64>,
    pub admitted_ratio: Option<f64>,
}

pub fn summarize(def: Def, samples: Vec<Sample>, plain: &[Sample]) -> Row {
    let tollgate = def.tollgate_mode().is_some();
    let closed = !def.paced();
    Row {
        def,
        cpu: median_of(&samples, Sample::cpu),
        cpu_x: paired_ratio(&samples, plain, Sample::cpu),
        backend_cpu: median_of(&samples, |s| {
            s.answered().then_some(s.backend_cpu_us_per_req)
        }),
        rps: median_of(&samples, |s| Some(s.rps)),
        rps_x: closed
            .then(|| paired_ratio(&samples, plain, |s| Some(s.rps)))
            .flatten(),
        p50: median_of(&samples, Sample::p50),
        p50_x: closed
            .then(|| paired_ratio(&samples, plain, Sample::p50))
            .flatten(),
        p99: median_of(&samples, Sample::p99),
        p99_x: closed
            .then(|| paired_ratio(&samples, plain, Sample::p99))
            .flatten(),
        redis_per_1k: tollgate
            .then(|| median_of(&samples, Sample::redis_per_1k_requests))
            .flatten(),
        redis_per_1k_admitted: tollgate
            .then(|| median_of(&samples, Sample::redis_per_1k_admitted))
            .flatten(),
        admitted_ratio: median_of(&samples, Sample::admitted_ratio),
        samples,
    }
}

/// The row of scenario `name`, if the run had it.
pub fn row_named<'a>(rows: &'a [Row], name: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.def.name == name)
}

/// The median over rounds of `f` of the same round's samples of scenarios `names` (in that
/// order); rounds where `f` has no value are left out, and a scenario the run did not have
/// leaves no value at all.
pub fn per_round(
    rows: &[Row],
    names: &[&str],
    f: impl Fn(&[&Sample]) -> Option<f64>,
) -> Option<f64> {
    let rows: Vec<&Row> = names
        .iter()
        .map(|n| row_named(rows, n))
        .collect::<Option<_>>()?;
    let rounds = rows.iter().map(|r| r.samples.len()).min()?;
    let mut v: Vec<f64> = (0..rounds)
        .filter_map(|i| {
            let round: Vec<&Sample> = rows
                .iter()
                .map(|r| r.samples.get(i))
                .collect::<Option<_>>()?;
            f(&round)
        })
        .collect();
    median(&mut v)
}

/// The median over rounds of scenario `a`'s Envoy CPU/request less `b`'s in the same round.
pub fn cpu_difference(rows: &[Row], a: &str, b: &str) -> Option<f64> {
    per_round(rows, &[a, b], |s| match s {
        [a, b] => Some(a.cpu()? - b.cpu()?),
        _ => None,
    })
}

/// Scenario `a`'s Envoy CPU/request ÷ `b`'s over every slice of every round, each slice next to
/// the same slice of the other (at most a few slices apart in time): (median, lower quartile,
/// upper quartile, pairs). A check on the per-round figure the goals use, finer grained in time.
pub fn slice_ratios(rows: &[Row], a: &str, b: &str) -> Option<(f64, f64, f64, usize)> {
    let (a, b) = (row_named(rows, a)?, row_named(rows, b)?);
    let mut v: Vec<f64> = a
        .samples
        .iter()
        .zip(&b.samples)
        .flat_map(|(x, y)| x.slices_cpu_us.iter().zip(&y.slices_cpu_us))
        .filter(|(_, y)| **y > 0.0)
        .map(|(x, y)| x / y)
        .collect();
    let n = v.len();
    let mid = median(&mut v)?;
    let (low, high) = quartiles(&v)?;
    Some((mid, low, high, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::SCENARIOS;

    fn cpu(us: f64) -> Sample {
        Sample {
            requests: 1,
            cpu_us_per_req: us,
            slices_cpu_us: vec![us, us],
            ..Sample::default()
        }
    }

    fn row(name: &str, cpus: &[f64]) -> Row {
        let def = *SCENARIOS.iter().find(|d| d.name == name).unwrap();
        summarize(def, cpus.iter().map(|x| cpu(*x)).collect(), &[])
    }

    #[test]
    fn medians_and_round_by_round_figures() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        let rows = [
            row("wasm-floor", &[50.0, 40.0, 60.0]),
            row("tollgate-lease", &[55.0, 42.0, 60.0]),
        ];
        // Round by round: 1.10, 1.05, 1.00; the ratio of the medians would say 1.05 too, but the
        // differences are 5, 2 and 0: their median is 2, not 55 − 50.
        let ratio = paired_ratio(&rows[1].samples, &rows[0].samples, Sample::cpu);
        assert!((ratio.unwrap() - 1.05).abs() < 1e-9);
        assert_eq!(
            cpu_difference(&rows, "tollgate-lease", "wasm-floor"),
            Some(2.0)
        );
        assert_eq!(cpu_difference(&rows, "tollgate-lease", "plain"), None);
        let (mid, _, _, pairs) = slice_ratios(&rows, "tollgate-lease", "wasm-floor").unwrap();
        assert_eq!((mid, pairs), (1.05, 6));
    }
}
