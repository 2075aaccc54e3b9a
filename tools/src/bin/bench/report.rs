//! What `make bench` prints: the machine and load, the table of medians, the goals as met / NOT
//! met, then the notes (notes.rs). The JSON report (json.rs) holds the same figures and every round.

use std::path::PathBuf;
use std::time::Instant;

use crate::args::Settings;
use crate::builds::Builds;
use crate::goals::Goal;
use crate::measure::{paced_rps_per_client, tenant_rps_per_client, Idle};
use crate::rows::Row;
use crate::sample::Sample;
use crate::scenarios::{PACED_CLIENTS, PATH, QUERY_KEY};
use tollgate_tools::machine::Machine;

/// What one run measured, for the report and the JSON.
pub struct Outcome {
    pub machine: Machine,
    pub began: Instant,
    /// The tollgate.wasm the tollgate scenarios ran (but the `-b` scenarios, the baseline and the copy without the body callback).
    pub tollgate_wasm: PathBuf,
    pub builds: Builds,
    pub rows: Vec<Row>,
    pub goals: Vec<Goal>,
    pub idle: Vec<Idle>,
    /// Warnings about envoy/bench/ templates that drifted from envoy/envoy.yaml.
    pub drift: Vec<String>,
    /// The run's scratch directory: configs and logs.
    pub dir: PathBuf,
    /// Clock ticks per second (the idle figures' unit).
    pub ticks_per_s: f64,
}

/// The paced loads' request rates: per client and offered in total, for the limited scenarios
/// (two proxies) and the tenant scenarios (one).
pub struct Offered {
    pub paced: u32,
    pub offered: u32,
    pub tenant_paced: u32,
    pub tenant_offered: u32,
}

impl Offered {
    pub fn of(settings: &Settings) -> Offered {
        let paced = paced_rps_per_client(settings.limited_load);
        let tenant_paced = tenant_rps_per_client(settings.limited_load);
        Offered {
            paced,
            offered: paced * PACED_CLIENTS * 2,
            tenant_paced,
            tenant_offered: tenant_paced * PACED_CLIENTS,
        }
    }
}

/// The load generator and protocol, as the report names them.
pub fn protocol(settings: &Settings) -> &'static str {
    if settings.h2c {
        "h2load, h2c (HTTP/2 prior knowledge, -m 1)"
    } else {
        "h2load --h1 (HTTP/1.1)"
    }
}

/// Prints the report's header, table and goals, then its notes.
pub fn print(settings: &Settings, run: &Outcome) {
    let Offered {
        paced,
        offered,
        tenant_paced,
        tenant_offered,
    } = Offered::of(settings);
    let load = match settings.requests {
        Some(n) => format!("{n} requests"),
        None => format!("{:.1} s", settings.duration.as_secs_f64()),
    };
    let protocol = protocol(settings);
    let Machine {
        date,
        nproc,
        model,
        envoy_version,
        h2load_version,
        ..
    } = &run.machine;
    println!("# tollgate bench — {date}");
    println!();
    println!("machine: {nproc} CPUs ({model}); {envoy_version}; {h2load_version}");
    println!(
        "load: {protocol}, one request in flight per connection, to 127.0.0.1{PATH}; closed \
         loop: {} connections, {} thread(s), {load} per run; limited: {offered} req/s offered in total \
         ({PACED_CLIENTS} clients × {paced} req/s per proxy, 2 proxies) for {:.1} s per run to one key \
         limited to {} per second, burst {} ({:.1}× its rate)",
        settings.connections,
        settings.threads,
        settings.duration.as_secs_f64(),
        settings.limited_rate,
        settings.limited_burst,
        f64::from(offered) / settings.limited_rate as f64,
    );
    println!(
        "flood: {} h2load processes of one connection each (closed loop, {load} per run), each request \
         a new key (`?{QUERY_KEY}=…` from its own -i list); tenant: {tenant_offered} req/s ({PACED_CLIENTS} \
         clients × {tenant_paced} req/s) to one key on one proxy with the same limit, alone (quiet) and \
         under that flood",
        settings.connections,
    );
    println!(
        "{} interleaved rounds, each on fresh Envoys warmed up for {:.1} s; within a round, the \
         single-key closed loops (plain … tollgate-lease) take turns in {} slices of their \
         load, and the others run one after the other (backward on even rounds); every figure is the median over the rounds; × plain is the median of per-round \
         ratios to plain",
        settings.rounds,
        settings.warmup.as_secs_f64(),
        settings.slices
    );
    println!();
    print!("{}", table(&run.rows));
    println!();
    println!("Goals (targets, not assertions):");
    for g in &run.goals {
        let verdict = match g.met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not measured",
        };
        let detail = if g.detail.is_empty() {
            String::new()
        } else {
            format!(" ({})", g.detail)
        };
        println!("- {}: {} — {verdict}{detail}", g.what, fmt(g.value, 3));
    }
    crate::notes::print(settings, run);
}

pub fn fmt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "—".to_string(), |x| format!("{x:.decimals$}"))
}

pub fn fmt_x(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_string(), |x| format!("{x:.2}×"))
}

pub fn non_200(samples: &[Sample]) -> String {
    let sum = |f: fn(&Sample) -> u64| samples.iter().map(f).sum::<u64>();
    let parts: Vec<String> = [
        ("429", sum(|s| s.limited)),
        ("5xx", sum(|s| s.server_errors)),
        ("other", sum(|s| s.other_status)),
        ("failed", sum(|s| s.failed)),
        ("hung", sum(|s| s.hung)),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(k, n)| format!("{k}: {n}"))
    .collect();
    if parts.is_empty() {
        "0".to_string()
    } else {
        parts.join(", ")
    }
}

pub fn table(rows: &[Row]) -> String {
    let mut t = String::new();
    t.push_str(
        "| scenario | Envoy CPU µs/req | × plain | req/s | × plain | p50 ms | × plain | p99 ms | × plain \
         | Webdis+Redis CPU µs/req | Redis calls /1k req | /1k admitted | admitted ÷ ideal | non-200 (all rounds) |\n",
    );
    t.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for r in rows {
        let tollgate = r.def.tollgate_mode().is_some();
        let ratio = match r.admitted_ratio {
            Some(x) if x > 1.0 => format!("**{x:.3} (over the limit)**"),
            v => fmt(v, 3),
        };
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.def.name,
            fmt(r.cpu, 1),
            fmt_x(r.cpu_x),
            fmt(r.rps, 0),
            fmt_x(r.rps_x),
            fmt(r.p50, 2),
            fmt_x(r.p50_x),
            fmt(r.p99, 2),
            fmt_x(r.p99_x),
            if tollgate {
                fmt(r.backend_cpu, 1)
            } else {
                "—".to_string()
            },
            fmt(r.redis_per_1k, 1),
            fmt(r.redis_per_1k_admitted, 1),
            ratio,
            non_200(&r.samples),
        ));
    }
    t
}
