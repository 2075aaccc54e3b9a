//! From loads to figures: each system's CPU per request by process, and what each adds over plain
//! Envoy, round by round (a round's systems share its stretch of the machine's time, so a difference
//! or ratio taken within a round is steadier than one between two medians), then the median over
//! rounds. A figure needing answered requests is `None` without them.

use tollgate_tools::median::median;

use crate::wrk::Load;

/// One measured load of one system: what wrk saw and the CPU seconds each part used over it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub load: Load,
    pub envoy_s: f64,
    /// limitador-server's (0 for the others).
    pub limiter_s: f64,
    pub webdis_s: f64,
    pub redis_s: f64,
    /// Scripts and PINGs Redis was sent over the load (and `SETTLE` after it).
    pub redis_calls: u64,
    /// Connections Envoy opened to the upstream over its life (warm-up and load): a handful when
    /// they are kept alive, as they should be.
    pub upstream_cx: u64,
}

impl Sample {
    fn per_request(&self, cpu_s: f64) -> Option<f64> {
        (self.load.requests > 0).then(|| cpu_s * 1e6 / self.load.requests as f64)
    }

    pub fn envoy_us(&self) -> Option<f64> {
        self.per_request(self.envoy_s)
    }

    pub fn limiter_us(&self) -> Option<f64> {
        self.per_request(self.limiter_s)
    }

    pub fn webdis_us(&self) -> Option<f64> {
        self.per_request(self.webdis_s)
    }

    pub fn redis_us(&self) -> Option<f64> {
        self.per_request(self.redis_s)
    }

    /// Scripts and PINGs sent to Redis per request answered.
    pub fn redis_calls(&self) -> Option<f64> {
        (self.load.requests > 0).then(|| self.redis_calls as f64 / self.load.requests as f64)
    }

    /// Envoy + limiter + Webdis + Redis CPU per request: the whole system's.
    pub fn system_us(&self) -> Option<f64> {
        self.per_request(self.envoy_s + self.limiter_s + self.webdis_s + self.redis_s)
    }
}

/// A system's loads, one per round, in round order.
pub struct Row {
    pub name: &'static str,
    pub samples: Vec<Sample>,
}

impl Row {
    pub fn median(&self, f: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
        let mut v: Vec<f64> = self.samples.iter().filter_map(f).collect();
        median(&mut v)
    }
}

fn row<'a>(rows: &'a [Row], name: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.name == name)
}

/// Per round: whole-system µs/request of `name` less plain's in the same round.
fn added_per_round(rows: &[Row], name: &str) -> Vec<Option<f64>> {
    let (Some(r), Some(plain)) = (row(rows, name), row(rows, "plain")) else {
        return Vec::new();
    };
    r.samples
        .iter()
        .zip(&plain.samples)
        .map(|(s, p)| Some(s.system_us()? - p.system_us()?))
        .collect()
}

/// The median over rounds of what `name` adds to plain Envoy's whole-system CPU per request.
pub fn added(rows: &[Row], name: &str) -> Option<f64> {
    let mut v: Vec<f64> = added_per_round(rows, name).into_iter().flatten().collect();
    median(&mut v)
}

/// The median over rounds of `a`'s added CPU per request less `b`'s in the same round.
pub fn added_over(rows: &[Row], a: &str, b: &str) -> Option<f64> {
    let bs = added_per_round(rows, b);
    let mut v: Vec<f64> = added_per_round(rows, a)
        .into_iter()
        .zip(bs)
        .filter_map(|(x, y)| Some(x? - y?))
        .collect();
    median(&mut v)
}

/// The median over rounds of `a`'s added CPU per request ÷ the least any of `bs` added in the same
/// round (rounds where that least is not above zero are left out).
pub fn added_ratio(rows: &[Row], a: &str, bs: &[&str]) -> Option<f64> {
    let a = added_per_round(rows, a);
    let bs: Vec<Vec<Option<f64>>> = bs.iter().map(|b| added_per_round(rows, b)).collect();
    let mut v: Vec<f64> = (0..a.len())
        .filter_map(|i| {
            let least = bs
                .iter()
                .map(|b| b.get(i).copied().flatten())
                .collect::<Option<Vec<f64>>>()?
                .into_iter()
                .reduce(f64::min)?;
            let x = a.get(i).copied().flatten()?;
            (least > 0.0).then(|| x / least)
        })
        .collect();
    median(&mut v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(requests: u64, system_s: f64) -> Sample {
        Sample {
            load: Load {
                requests,
                ..Load::default()
            },
            envoy_s: system_s / 2.0,
            redis_s: system_s / 2.0,
            ..Sample::default()
        }
    }

    fn row_of(name: &'static str, us: &[f64]) -> Row {
        // 1000 requests: x µs per request is x ms of CPU.
        Row {
            name,
            samples: us.iter().map(|x| sample(1000, x / 1000.0)).collect(),
        }
    }

    #[test]
    fn added_and_ratios_are_taken_round_by_round() {
        let rows = [
            row_of("plain", &[20.0, 30.0, 25.0]),
            row_of("limitador-redis", &[90.0, 100.0, 85.0]),
            row_of("limitador-redis-cached", &[100.0, 95.0, 80.0]),
            row_of("tollgate-exact", &[50.0, 60.0, 55.0]),
            row_of("wasm-floor-hold", &[40.0, 38.0, 47.0]),
        ];
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        // Added per round: 30, 30, 30.
        assert!(close(added(&rows, "tollgate-exact"), 30.0));
        // Limitador: 70, 70, 60 and 80, 65, 55; the least per round: 70, 65, 55.
        assert!(close(
            added_ratio(&rows, "tollgate-exact", &["limitador-redis"]),
            30.0 / 70.0
        ));
        assert!(close(
            added_ratio(
                &rows,
                "tollgate-exact",
                &["limitador-redis", "limitador-redis-cached"]
            ),
            30.0 / 65.0
        ));
        // tollgate less the hold per round: 10, 22, 8 (the medians' difference would be 30 - 18).
        assert!(close(
            added_over(&rows, "tollgate-exact", "wasm-floor-hold"),
            10.0
        ));
        assert_eq!(added(&rows, "tollgate-exact-b"), None);
        assert_eq!(added_ratio(&rows, "tollgate-exact", &["nothing"]), None);
        // A round with no answer has no figure, rather than a zero.
        let silent = [
            row_of("plain", &[20.0]),
            Row {
                name: "tollgate-exact",
                samples: vec![sample(0, 1.0)],
            },
        ];
        assert_eq!(added(&silent, "tollgate-exact"), None);
    }
}
