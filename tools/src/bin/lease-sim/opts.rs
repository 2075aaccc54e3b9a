//! The simulator's options: the shape of one load (limits, offered rate, proxies, workers,
//! clients, latency, pauses) and how many seeded runs of it; `--sweep` runs the standard shapes.

pub const USAGE: &str = "\
usage: cargo run --release -p tollgate-tools --bin lease-sim -- [options]   (make sim SIM_ARGS='[options]')
  --rate N           tokens per second of the hot key                       (default 200)
  --burst N          its burst                                              (default 200)
  --load N           requests per second offered in total                   (default 1000)
  --duration MS      length of one load                                     (default 3000)
  --pause ON:OFF     within the load, clients send for ON ms, then pause for OFF ms, in turn
                     (default: no pause)
  --jitter MS        each load lasts duration ± up to this, uniformly: averages over where in
                     the key's rhythm the load stops                          (default 0)
  --proxies N        proxies (Envoys), the load split evenly                (default 2)
  --workers N        workers per proxy                                      (default 2)
  --clients N        paced clients per proxy                                (default 10)
  --latency A[-B]    script call round trip in ms, uniform in [A, B]        (default 1-2)
  --horizon MS       the rule's lease_horizon_ms                            (default: config default)
  --lease-max N      the rule's lease_max                                   (default: config default)
  --assign random|rr connections to workers: random (SO_REUSEPORT) or round robin (default random)
  --runs N           loads (fresh key, fresh proxies), seeds seed..seed+N   (default 20)
  --seed N           first seed                                             (default 1)
  --trace            print every script call of the first run
  --sweep            run the standard shapes (bench, burst 10x, 2x and 20x overload, 4 proxies,
                     latency 5 ms, one proxy, a light key) and print one line each
  --scale [options]  (first) fleets of 10 to 1000 proxies instead: lease-sim --scale --help";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
/// How connections are spread over a proxy's workers.
pub enum Assign {
    Random,
    RoundRobin,
}

#[derive(Clone, Debug)]
/// One shape and how to run it.
pub struct Opts {
    pub rate: u64,
    pub burst: u64,
    pub load: f64,
    pub duration_ms: u64,
    pub pause: Option<(u64, u64)>,
    pub jitter_ms: u64,
    pub proxies: usize,
    pub workers: usize,
    pub clients: usize,
    pub lat_min_us: u64,
    pub lat_max_us: u64,
    pub horizon_ms: Option<u64>,
    pub lease_max: Option<u64>,
    pub assign: Assign,
    pub runs: u64,
    pub seed: u64,
    pub trace: bool,
    pub sweep: bool,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            rate: 200,
            burst: 200,
            load: 1000.0,
            duration_ms: 3000,
            pause: None,
            jitter_ms: 0,
            proxies: 2,
            workers: 2,
            clients: 10,
            lat_min_us: 1000,
            lat_max_us: 2000,
            horizon_ms: None,
            lease_max: None,
            assign: Assign::Random,
            runs: 20,
            seed: 1,
            trace: false,
            sweep: false,
        }
    }
}

pub fn parse_args() -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let int = |v: String| v.parse::<u64>().map_err(|e| format!("{v}: {e}"));
        match flag.as_str() {
            "--rate" => o.rate = int(value()?)?,
            "--burst" => o.burst = int(value()?)?,
            "--load" => o.load = value()?.parse().map_err(|e| format!("--load: {e}"))?,
            "--duration" => o.duration_ms = int(value()?)?,
            "--jitter" => o.jitter_ms = int(value()?)?,
            "--pause" => {
                let v = value()?;
                let (on, off) = v.split_once(':').ok_or("--pause ON:OFF")?;
                o.pause = Some((int(on.to_string())?, int(off.to_string())?));
            }
            "--proxies" => o.proxies = int(value()?)? as usize,
            "--workers" => o.workers = int(value()?)? as usize,
            "--clients" => o.clients = int(value()?)? as usize,
            "--latency" => {
                let v = value()?;
                let ms = |s: &str| {
                    s.parse::<f64>()
                        .map(|x| (x * 1000.0) as u64)
                        .map_err(|e| format!("--latency {s}: {e}"))
                };
                let (a, b) = v.split_once('-').unwrap_or((&v, &v));
                (o.lat_min_us, o.lat_max_us) = (ms(a)?, ms(b)?);
            }
            "--horizon" => o.horizon_ms = Some(int(value()?)?),
            "--lease-max" => o.lease_max = Some(int(value()?)?),
            "--assign" => {
                o.assign = match value()?.as_str() {
                    "random" => Assign::Random,
                    "rr" => Assign::RoundRobin,
                    v => return Err(format!("--assign {v}: random or rr")),
                }
            }
            "--runs" => o.runs = int(value()?)?.max(1),
            "--seed" => o.seed = int(value()?)?,
            "--trace" => o.trace = true,
            "--sweep" => o.sweep = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if o.proxies == 0 || o.workers == 0 || o.clients == 0 || o.rate == 0 || o.burst == 0 {
        return Err("proxies, workers, clients, rate and burst must be at least 1".into());
    }
    Ok(o)
}

pub fn shapes(base: &Opts) -> Vec<(&'static str, Opts)> {
    let b = base.clone();
    vec![
        ("bench (rate 200, burst 200, 5x, 2 proxies)", b.clone()),
        (
            "burst 10x rate (2000)",
            Opts {
                burst: 2000,
                ..b.clone()
            },
        ),
        (
            "2x overload (400/s)",
            Opts {
                load: 400.0,
                ..b.clone()
            },
        ),
        (
            "20x overload (4000/s)",
            Opts {
                load: 4000.0,
                ..b.clone()
            },
        ),
        (
            "4 proxies",
            Opts {
                proxies: 4,
                ..b.clone()
            },
        ),
        (
            "latency 5 ms",
            Opts {
                lat_min_us: 5000,
                lat_max_us: 5000,
                ..b.clone()
            },
        ),
        (
            "1 proxy (tenant-quiet)",
            Opts {
                proxies: 1,
                ..b.clone()
            },
        ),
        (
            "light key (20/s, 0.1x)",
            Opts {
                load: 20.0,
                ..b.clone()
            },
        ),
        (
            "on 0.6 s, off 1.2 s (rate 100, burst 100)",
            Opts {
                rate: 100,
                burst: 100,
                pause: Some((600, 1200)),
                duration_ms: 6600,
                ..b.clone()
            },
        ),
        (
            "bench over 30 s",
            Opts {
                duration_ms: 30_000,
                runs: b.runs.min(5),
                ..b
            },
        ),
    ]
}
