//! `make bench`: what tollgate costs Envoy, next to plain Envoy, Envoy's native local_ratelimit and an
//! empty proxy-wasm filter; what a flood of new keys costs; how close a hot key gets to its global limit
//! across two proxies; and whether a tenant at its limit keeps its share while new keys flood its proxy.
//!
//! One run starts Redis and Webdis once, then runs the scenarios in turn, round after round
//! (interleaved, so drift on a shared machine hits them all alike). Each round starts a fresh Envoy
//! per scenario (two for the limited ones; each `--concurrency 2 --disable-hot-restart`), warms it
//! up and measures it, so the median of each figure over the rounds is over several Envoy processes.
//! The closed-loop single-key scenarios (plain … tollgate-lease), whose CPU per request is compared
//! with the wasm floor's, take turns within a round in `--slices` slices of their load, so that they
//! share the same seconds of a machine whose other load comes and goes. The others run one after
//! the other, in backward order on even rounds:
//!
//! | scenario | Envoy's filters | load (h2load; HTTP/1.1 unless `--h2c`) |
//! |---|---|---|
//! | plain | router only (envoy/bench/plain.yaml) | closed loop, `--connections` |
//! | native | local_ratelimit, bucket never empties (envoy/bench/native.yaml) | closed loop |
//! | wasm-floor | bench/wasm-floor: reads one header, continues (envoy/bench/wasm-floor.yaml) | closed loop |
//! | wasm-floor-calls | bench/wasm-floor making tollgate-lease's host calls and nothing else (envoy/bench/wasm-floor-calls.yaml) | closed loop |
//! | wasm-floor-hold | bench/wasm-floor holding each request for a Webdis PING shared by the requests that came while the one before was out (envoy/bench/wasm-floor-hold.yaml) | closed loop |
//! | tollgate-exact / -lease | envoy/envoy.yaml, one rule on `header:x-user-id`, one key, limit never reached | closed loop |
//! | tollgate-exact-baseline | tollgate-exact with the filter at `BASELINE_COMMIT` (issue 17's baseline), built from the clone's history | closed loop |
//! | tollgate-lease-b, tollgate-exact-b | tollgate-lease / tollgate-exact with the filter built at `--compare-wasm` (only with it): an A/B of two builds in the same slices | closed loop |
//! | tollgate-lease-no-body-export | tollgate-lease with tollgate.wasm's `proxy_on_response_body` export renamed (exports.rs), so Envoy never calls it: what reading bodies costs | closed loop |
//! | tollgate-flood-exact / -lease | one rule on `query:k`, every request a new key, limit never reached | closed loop, one h2load per connection, unique URIs (`-i`) |
//! | tollgate-flood-exact-b | tollgate-flood-exact with the filter built at `--compare-wasm` (only with it), in the same rounds | as tollgate-flood-exact |
//! | tollgate-limited-exact / -lease | two Envoys, one hot key far over its limit (5x by default) | paced, split across both |
//! | tollgate-tenant-quiet | one Envoy, lease, rule on `query:k`: one hot key (the tenant) 5x over its limit | paced |
//! | tollgate-tenant-flood | the same, while new keys flood the same Envoy | paced tenant + closed-loop flood |
//!
//! Figures: Envoy CPU time per request (from /proc/<pid>/task/*/schedstat over the load), Webdis and
//! Redis CPU likewise, requests/s and p50/p99 latency (h2load's summary and per-request log), Redis
//! script calls (INFO commandstats: evalsha + eval), for the paced scenarios admitted ÷ (burst + rate ×
//! T), and, once after the last round's load, the CPU ticks the lease-mode Envoys use over 3 idle seconds.
//!
//! h2load's `-i FILE` starts every client of a process at the top of the list and cycles through it, so
//! clients of one process would repeat each other's keys: a flood runs one h2load process per
//! connection, each with its own list of URIs, fresh for every load and long enough for the load
//! (a key that repeats anyway is counted and reported).
//!
//! The files: args.rs (options), scenarios.rs (what each scenario runs), builds.rs and exports.rs
//! (the filters besides tollgate.wasm), h2load.rs (the load), probe.rs (Redis and Envoy
//! counters), measure.rs (loads, slices, idle), sample.rs and rows.rs (figures and medians),
//! goals.rs (the targets), report.rs and notes.rs (stdout), json.rs (the JSON report), chart.rs
//! (the table as a chart, target/bench/bench.svg). CPU readers, the machine's description, medians
//! and the Envoy configurations are the tools' library (tools/src/lib.rs), shared with `make peers`.
//!
//! Run with `make bench` (setup + build first), or
//! `cargo run --release -p tollgate-tools --bin bench -- --help`.

// A tool run natively, never in the VM: a broken invariant here fails the run with its message.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod args;
mod builds;
mod chart;
mod exports;
mod goals;
mod h2load;
mod json;
mod measure;
mod notes;
mod probe;
mod report;
mod rows;
mod sample;
mod scenarios;

use std::process::ExitCode;
use std::time::Instant;

use tollgate_e2e::envoy::wasm_path;
use tollgate_e2e::webdis::{Webdis, WebdisOpts};
use tollgate_e2e::{scratch_dir, Redis};
use tollgate_tools::cpu::clock_ticks_per_second;
use tollgate_tools::machine::Machine;

use args::Settings;
use builds::Builds;
use goals::goals;
use measure::{idle_after_load, Bench, Idle};
use report::Outcome;
use rows::{summarize, Row};
use sample::Sample;
use scenarios::{start_scenario, template_drift, Running};

fn main() -> ExitCode {
    let settings = match args::parse_args() {
        Ok(s) => s,
        Err(e) if e.is_empty() => {
            print!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("bench: {e}\n\n{}", args::USAGE);
            return ExitCode::FAILURE;
        }
    };
    match run(&settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(settings: &Settings) -> Result<(), String> {
    let began = Instant::now();
    let machine = Machine::now();
    let tollgate_wasm = wasm_path();

    let mut defs = scenarios::selected(settings);
    let drift = template_drift();
    for w in &drift {
        eprintln!("bench: warning: {w}");
    }
    let builds = Builds::prepare(&mut defs, &tollgate_wasm)?;

    let dir = scratch_dir("bench");
    eprintln!(
        "bench: starting redis, webdis and envoys (logs in {})",
        dir.display()
    );
    let redis = Redis::start(&dir);
    let webdis = Webdis::try_start_with(&dir, redis.port, &WebdisOpts::default())?;
    let mut running: Vec<Running> = defs
        .iter()
        .map(|d| Running {
            def: *d,
            envoys: Vec::new(),
        })
        .collect();
    let conn = redis.conn();
    let mut bench = Bench {
        settings,
        dir: dir.clone(),
        redis: &redis,
        webdis: &webdis,
        conn,
        ticks_per_s: clock_ticks_per_second(),
        runs: 0,
    };

    let mut idle: Vec<Idle> = Vec::new();
    let mut samples: Vec<Vec<Sample>> = running.iter().map(|_| Vec::new()).collect();
    for round in 1..=settings.rounds {
        eprint!("bench: round {round}/{}:", settings.rounds);
        let (sliced, mut alone): (Vec<usize>, Vec<usize>) =
            (0..running.len()).partition(|&i| running[i].def.sliced());
        // The others run one after the other: forward on odd rounds, backward on even ones, so
        // that no scenario always runs right after the same one.
        if round % 2 == 0 {
            alone.reverse();
        }
        // A fresh Envoy for each round: one Envoy process measures a few µs/request above or below
        // the next for the same filter (seen: tollgate-lease at 69–74 µs in every round of one run
        // and 60–66 in the next, the floor at 61–66 in both), so the median over rounds must be over
        // several processes, not the rounds of one.
        for &i in &sliced {
            running[i].envoys =
                start_scenario(&dir, webdis.port, &builds, settings, running[i].def)?;
            bench.warm_up(&running[i])?;
        }
        if !sliced.is_empty() {
            eprint!(
                " {} in {} slices",
                sliced
                    .iter()
                    .map(|&i| running[i].def.name)
                    .collect::<Vec<_>>()
                    .join(" "),
                settings.slices
            );
        }
        for (i, sample) in bench.measure_sliced(&running, &sliced)? {
            samples[i].push(sample);
        }
        if round == settings.rounds {
            idle.extend(sliced.iter().filter_map(|&i| idle_after_load(&running, i)));
        }
        for &i in &alone {
            eprint!(" {}", running[i].def.name);
            running[i].envoys =
                start_scenario(&dir, webdis.port, &builds, settings, running[i].def)?;
            let sc = &running[i];
            bench.warm_up(sc)?;
            // A fresh hot key each round, so each paced load starts on a full bucket.
            let user = if sc.def.paced() {
                format!("hot-r{round}")
            } else {
                "bench-user".to_string()
            };
            samples[i].push(bench.measure(sc, &user, settings.duration, settings.requests)?);
            if round == settings.rounds {
                idle.extend(idle_after_load(&running, i));
            }
        }
        eprintln!();
    }

    let plain_idx = running
        .iter()
        .position(|r| r.def.name == "plain")
        .ok_or("plain scenario missing")?;
    let plain = samples[plain_idx].clone();
    let rows: Vec<Row> = running
        .iter()
        .zip(samples)
        .map(|(sc, s)| summarize(sc.def, s, &plain))
        .collect();
    let goals = goals(&rows, &idle);
    let outcome = Outcome {
        machine,
        began,
        tollgate_wasm,
        builds,
        rows,
        goals,
        idle,
        drift,
        dir,
        ticks_per_s: bench.ticks_per_s,
    };
    report::print(settings, &outcome);
    let out = json::write(settings, &outcome)?;
    println!("- JSON: {} (and target/bench/latest.json)", out.display());
    let svg = tollgate_e2e::repo_root().join("target/bench/bench.svg");
    chart::write(&svg, &outcome, settings.rounds)?;
    println!("- chart: {}", svg.display());
    println!("- took {:.0} s", began.elapsed().as_secs_f64());

    // Stop every Envoy, then Webdis, then Redis (each killed by its pid when dropped).
    drop(bench);
    drop(running);
    drop(webdis);
    drop(redis);
    Ok(())
}
