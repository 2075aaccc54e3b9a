//! The options of `lease-sim --scale` (`make sim-scale SIM_SCALE_ARGS='…'`).

use super::{FleetOpts, OVERLOADS, SIZES};

pub const USAGE: &str = "\
usage: lease-sim --scale [options]   (make sim-scale SIM_SCALE_ARGS='[options]')
  --sizes N,N,...      proxies per fleet                                  (default 10,100,1000)
  --overloads X,X,...  the hot key's demand / its rate                    (default 1,5,50)
  --seconds S          simulated time per run                             (default 10)
  --hot RATE:BURST     the hot key's limits                               (default 1000:1000)
  --warm N             warm keys                                          (default 10000)
  --warm-limits RATE:BURST:LOAD  each warm key's limits and its requests per second (default 5:10:1)
  --mode lease|exact   the rules' mode                                    (default lease)
  --horizon MS         lease_horizon_ms                                   (default: config default)
  --max-waits MS,MS,...  the rules' max_wait_ms, one table part each     (default lease 0,1000; exact 0)
  --no-churn           no proxy joins or leaves
  --seed N                                                                (default 1)";

pub struct ScaleArgs {
    pub base: FleetOpts,
    pub sizes: Vec<usize>,
    pub overloads: Vec<f64>,
    /// The rules' `max_wait_ms` of each part of the table (None: the mode's default).
    pub max_waits: Option<Vec<u64>>,
}

impl ScaleArgs {
    /// Lease mode holds requests only when asked: the table shows it without and with a wait of
    /// a second. Exact mode's reservations are another feature: without, unless asked.
    pub fn max_waits(&self) -> Vec<u64> {
        match (&self.max_waits, self.base.mode) {
            (Some(w), _) => w.clone(),
            (None, "lease") => vec![0, 1000],
            (None, _) => vec![0],
        }
    }
}

pub fn parse(args: impl Iterator<Item = String>) -> Result<ScaleArgs, String> {
    let mut a = ScaleArgs {
        base: FleetOpts::default(),
        sizes: SIZES.to_vec(),
        overloads: OVERLOADS.to_vec(),
        max_waits: None,
    };
    let mut args = args;
    let list = |v: String| -> Result<Vec<f64>, String> {
        v.split(',')
            .map(|x| x.parse::<f64>().map_err(|e| format!("{x}: {e}")))
            .collect()
    };
    let pair = |v: &str| -> Result<Vec<u64>, String> {
        v.split(':')
            .map(|x| x.parse::<u64>().map_err(|e| format!("{x}: {e}")))
            .collect()
    };
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--sizes" => a.sizes = list(value()?)?.into_iter().map(|x| x as usize).collect(),
            "--overloads" => a.overloads = list(value()?)?,
            "--seconds" => {
                let s: f64 = value()?.parse().map_err(|e| format!("--seconds: {e}"))?;
                a.base.duration_ms = (s * 1000.0) as u64;
            }
            "--hot" => match pair(&value()?)?.as_slice() {
                [r, b] => (a.base.hot_rate, a.base.hot_burst) = (*r, *b),
                _ => return Err("--hot RATE:BURST".into()),
            },
            "--warm" => a.base.warm_keys = value()?.parse().map_err(|e| format!("--warm: {e}"))?,
            "--warm-limits" => match pair(&value()?)?.as_slice() {
                [r, b, l] => {
                    (a.base.warm_rate, a.base.warm_burst) = (*r, *b);
                    a.base.warm_load = *l as f64;
                }
                _ => return Err("--warm-limits RATE:BURST:LOAD".into()),
            },
            "--mode" => {
                a.base.mode = match value()?.as_str() {
                    "lease" => "lease",
                    "exact" => "exact",
                    m => return Err(format!("--mode {m}: lease or exact")),
                }
            }
            "--horizon" => {
                a.base.horizon_ms = Some(value()?.parse().map_err(|e| format!("--horizon: {e}"))?)
            }
            "--max-waits" => {
                a.max_waits = Some(list(value()?)?.into_iter().map(|x| x as u64).collect())
            }
            "--no-churn" => a.base.churn = false,
            "--seed" => a.base.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if a.sizes.contains(&0) || a.base.hot_rate == 0 || a.base.hot_burst == 0 {
        return Err("sizes, the hot key's rate and burst must be at least 1".into());
    }
    if a.base.warm_keys > 0 && (a.base.warm_rate == 0 || a.base.warm_burst == 0) {
        return Err("a warm key's rate and burst must be at least 1".into());
    }
    Ok(a)
}
