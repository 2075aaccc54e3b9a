//! `make peers`: what a rate limit costs the whole system per request, tollgate next to Envoy's global
//! rate limit filter calling Limitador, side by side on this machine. Each system is one Envoy with
//! one worker routing to the same upstream (systems.rs has the table); wrk loads it with every request
//! a new `x-user-id` (many keys, few requests each: the high-cardinality case), and the figure is the
//! CPU the system (Envoy + Limitador + Webdis + Redis) adds per request over plain routed Envoy, then
//! tollgate's ÷ Limitador's.
//!
//! The systems take turns within each round (forward on odd rounds, backward on even ones), each
//! started afresh for its load and stopped after it, so the median of each figure is over several
//! processes and every system meets the machine's other load alike. CPU comes from
//! /proc/<pid>/task/*/schedstat, read before the load and `SETTLE` after it.
//!
//! Without limitador-server (`--limitador`, `$LIMITADOR_SERVER`, or on the PATH) it prints SKIPPED and
//! why, and exits 0: Limitador is no dependency of tollgate (docs/benchmarks.md says how to get it).
//!
//! The files: args.rs (options), systems.rs (what each system runs and starting it), upstream.rs
//! (the application behind Envoy), wrk.rs (the load), figures.rs (per-request figures, added over
//! plain, ratios), report.rs (stdout). CPU readers, the machine's description, medians and the Envoy
//! configurations are the tools' library, shared with `make bench`.

// A tool run natively, never in the VM: a broken invariant here fails the run with its message.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod args;
mod figures;
mod report;
mod systems;
mod upstream;
mod wrk;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use tollgate_e2e::envoy::wasm_path;
use tollgate_e2e::webdis::{Webdis, WebdisOpts};
use tollgate_e2e::{scratch_dir, Redis};
use tollgate_tools::commandstats::redis_script_calls;
use tollgate_tools::cpu::cpu_ns_of;
use tollgate_tools::machine::Machine;

use figures::{Row, Sample};
use report::{version_of, Outcome};
use systems::{Shared, Started, System, PATH};

/// How long after a load (and after its warm-up) the CPU count waits: Limitador's `redis_cached`
/// writes its counters to Redis every second, so the writes a load caused land inside its window.
pub const SETTLE: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    let settings = match args::parse(std::env::args().skip(1)) {
        Ok(s) => s,
        Err(e) if e.is_empty() => {
            print!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("peers: {e}\n\n{}", args::USAGE);
            return ExitCode::FAILURE;
        }
    };
    let limitador = match systems::find_limitador(settings.limitador.as_deref()) {
        Ok(p) => p,
        Err(why) => {
            println!(
                "peers: SKIPPED: {why}. Set LIMITADOR_SERVER to the limitador-server binary, put it \
                 on the PATH or pass --limitador PATH; docs/benchmarks.md (\"Side by side with \
                 Limitador\") says how to get it."
            );
            return ExitCode::SUCCESS;
        }
    };
    match run(&settings, &limitador) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("peers: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(settings: &args::Settings, limitador: &Path) -> Result<(), String> {
    let machine = Machine::now();
    let tollgate_wasm = wasm_path();
    eprintln!("peers: building bench/wasm-floor");
    let floor_wasm = tollgate_e2e::build_wasm_floor()?;
    let dir = scratch_dir("peers");
    eprintln!(
        "peers: starting redis, webdis and the upstream (logs in {})",
        dir.display()
    );
    let redis = Redis::start(&dir);
    let webdis = Webdis::try_start_with(&dir, redis.port, &WebdisOpts::default())?;
    let upstream_port = upstream::start()?;
    let floor_script_sha = load_floor_script(&redis)?;
    let limits_file = dir.join("limits.yaml");
    std::fs::write(&limits_file, systems::limits_yaml())
        .map_err(|e| format!("write {}: {e}", limits_file.display()))?;
    let shared = Shared {
        dir: &dir,
        webdis_port: webdis.port,
        redis_port: redis.port,
        upstream_port,
        limitador: Some(limitador),
        limits_file: &limits_file,
        floor_script_sha: &floor_script_sha,
    };
    let backend_pids: Vec<u32> = [webdis.proc.pid(), redis.proc.pid()]
        .into_iter()
        .flatten()
        .collect();

    let systems = systems::all(
        &tollgate_wasm,
        &floor_wasm,
        settings.compare_wasm.as_deref(),
    );
    let mut samples: Vec<Vec<Sample>> = systems.iter().map(|_| Vec::new()).collect();
    for round in 1..=settings.rounds {
        eprint!("peers: round {round}/{}:", settings.rounds);
        let mut order: Vec<usize> = (0..systems.len()).collect();
        if round % 2 == 0 {
            order.reverse();
        }
        for i in order {
            let system = &systems[i];
            eprint!(" {}", system.name());
            let started = systems::start(&shared, system)?;
            let sample = measure(settings, &shared, system, &started, round, &backend_pids)?;
            drop(started);
            samples[i].push(sample);
        }
        eprintln!();
    }

    let rows: Vec<Row> = systems
        .iter()
        .zip(samples)
        .map(|(s, samples)| Row {
            name: s.name(),
            samples,
        })
        .collect();
    let outcome = Outcome {
        machine,
        wrk_version: version_of(Path::new("wrk"), "-v"),
        limitador: limitador.to_path_buf(),
        limitador_version: version_of(limitador, "--version"),
        tollgate_wasm,
        rows,
        dir: dir.clone(),
    };
    report::print(settings, &outcome);
    drop(webdis);
    drop(redis);
    Ok(())
}

/// Warms `system` up, then measures one load: wrk's figures and each part's CPU over the load and
/// `SETTLE` after it.
fn measure(
    settings: &args::Settings,
    shared: &Shared,
    system: &System,
    started: &Started,
    round: u32,
    backend_pids: &[u32],
) -> Result<Sample, String> {
    let port = started.envoy.listen_port;
    let name = system.name();
    let load = |tag: &str, d: Duration| {
        let prefix = format!("r{round}-{name}-{tag}");
        wrk::run(
            shared.dir,
            &prefix,
            (port, PATH),
            settings.connections,
            d,
            (&prefix, settings.one_key),
        )
    };
    if !settings.warmup.is_zero() {
        load("warmup", settings.warmup)?;
        std::thread::sleep(SETTLE);
    }
    let (envoy, limiter) = started.pids();
    let envoy: Vec<u32> = envoy.into_iter().collect();
    let limiter: Vec<u32> = limiter.into_iter().collect();
    let (webdis, redis) = match backend_pids {
        [w, r] => (vec![*w], vec![*r]),
        _ => (Vec::new(), Vec::new()),
    };
    let read = || [&envoy, &limiter, &webdis, &redis].map(|pids| cpu_ns_of(pids) as f64 / 1e9);
    let calls_before = redis_calls(shared.redis_port)?;
    let before = read();
    let measured = load("load", settings.duration)?;
    std::thread::sleep(SETTLE);
    let after = read();
    let calls_after = redis_calls(shared.redis_port)?;
    let used = |i: usize| (after[i] - before[i]).max(0.0);
    let upstream_cx = started
        .envoy
        .stat_value("cluster.app.upstream_cx_total")
        .unwrap_or(0);
    Ok(Sample {
        load: measured,
        envoy_s: used(0),
        limiter_s: used(1),
        webdis_s: used(2),
        redis_s: used(3),
        redis_calls: calls_after.saturating_sub(calls_before),
        upstream_cx,
    })
}

/// Loads bench/wasm-floor/minimal_bucket.lua into Redis; its SHA configures wasm-floor-script.
fn load_floor_script(redis: &Redis) -> Result<String, String> {
    let path = tollgate_e2e::repo_root().join("bench/wasm-floor/minimal_bucket.lua");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(text)
        .query::<String>(&mut redis.conn())
        .map_err(|e| format!("SCRIPT LOAD {}: {e}", path.display()))
}

/// The scripts (EVALSHA, EVAL) and PINGs Redis has been sent so far: the calls a check or a
/// held request's callout makes (a script's own commands are not counted).
fn redis_calls(port: u16) -> Result<u64, String> {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection())
        .map_err(|e| format!("connect to redis: {e}"))?;
    let calls = redis_script_calls(&mut conn);
    Ok(calls.calls + calls.pings)
}
