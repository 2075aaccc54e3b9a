//! What `make peers` prints: the machine and load, the table of medians, and the side-by-side ratios
//! of added CPU per request (tollgate's ÷ Limitador's), with the target as met / NOT met: a
//! target, not an assertion (a shared machine's noise would make a timed test flaky).

use std::path::{Path, PathBuf};

use tollgate_tools::machine::Machine;

use crate::args::Settings;
use crate::figures::{added, added_over, added_ratio, Row, Sample};
use crate::systems::{PATH, WORKERS};
use crate::SETTLE;

/// tollgate exact's added whole-system CPU per new key, at most this share of the better
/// Limitador's (issue 33: "at most half of Limitador's").
pub const PEER_LIMIT_X: f64 = 0.5;
const LIMITADORS: [&str; 2] = ["limitador-redis", "limitador-redis-cached"];
/// The system that holds each request for a shared callout and checks nothing.
const HOLD: &str = "wasm-floor-hold";
/// The same with the least a shared token bucket per key does in that callout.
const SCRIPT: &str = "wasm-floor-script";
/// The same script, with tollgate's promise kept: a request waits for no more than the callout
/// out and its own.
const KEPT: &str = "wasm-floor-kept";

/// What a run measured, for the report.
pub struct Outcome {
    pub machine: Machine,
    pub wrk_version: String,
    pub limitador: PathBuf,
    pub limitador_version: String,
    pub tollgate_wasm: PathBuf,
    pub rows: Vec<Row>,
    pub dir: PathBuf,
}

fn fmt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "—".to_string(), |x| format!("{x:.decimals$}"))
}

pub fn print(settings: &Settings, run: &Outcome) {
    let m = &run.machine;
    println!("# tollgate peers — {}", m.date);
    println!();
    println!(
        "machine: {} CPUs ({}); {}; {}",
        m.nproc, m.model, m.envoy_version, run.wrk_version
    );
    println!(
        "load: wrk, 1 thread, {} connections, one request in flight on each (HTTP/1.1), {:.1} s \
         per load after {:.1} s of warm-up, to 127.0.0.1{PATH} (routed to an upstream that answers \
         200); {}",
        settings.connections,
        settings.duration.as_secs_f64(),
        settings.warmup.as_secs_f64(),
        if settings.one_key {
            "every request the same x-user-id"
        } else {
            "every request a new x-user-id"
        }
    );
    println!(
        "Envoy: one worker (--concurrency {WORKERS}) per system; Redis and Webdis shared; \
         Limitador: {} ({}); tollgate: {}{}",
        run.limitador.display(),
        run.limitador_version,
        run.tollgate_wasm.display(),
        settings
            .compare_wasm
            .as_ref()
            .map_or(String::new(), |p| format!(
                "; tollgate-exact-b: {}",
                p.display()
            ))
    );
    println!(
        "{} interleaved rounds (backward on even rounds), each system started afresh for each \
         load; CPU = every thread's run time from /proc/<pid>/task/*/schedstat over the load and \
         the {:.0} s after it (Limitador's redis_cached writes its counters to Redis every second), \
         ÷ requests answered; every figure is the median over the rounds, differences and ratios \
         taken round by round",
        settings.rounds,
        SETTLE.as_secs_f64()
    );
    println!();
    print!("{}", table(&run.rows));
    println!();
    println!(
        "Side by side: added whole-system CPU per request over plain Envoy, ÷ the other's in the \
         same round (median over rounds):"
    );
    let mut lines = Vec::new();
    for a in ["tollgate-exact", "tollgate-exact-b"] {
        if !run.rows.iter().any(|r| r.name == a) {
            continue;
        }
        for b in LIMITADORS {
            lines.push(format!(
                "- {a} ÷ {b}: {}",
                fmt(added_ratio(&run.rows, a, &[b]), 3)
            ));
        }
        let best = added_ratio(&run.rows, a, &LIMITADORS);
        let verdict = match best {
            Some(x) if x <= PEER_LIMIT_X => "met",
            Some(_) => "NOT met",
            None => "not measured",
        };
        lines.push(format!(
            "- {a} ÷ the better Limitador of each round ≤ {PEER_LIMIT_X:.2}: {} — {verdict} \
             ({a} +{} µs; limitador-redis +{} µs, limitador-redis-cached +{} µs)",
            fmt(best, 3),
            fmt(added(&run.rows, a), 1),
            fmt(added(&run.rows, LIMITADORS[0]), 1),
            fmt(added(&run.rows, LIMITADORS[1]), 1),
        ));
    }
    if run.rows.iter().any(|r| r.name == HOLD) && run.rows.iter().any(|r| r.name == SCRIPT) {
        lines.push(format!(
            "- where tollgate-exact's added CPU goes: holding each request for a callout its worker \
             shares, with no check ({HOLD}) +{} µs, ÷ the better Limitador of each round {}; with \
             the least a shared token bucket per key does in that callout ({SCRIPT}) +{} µs, ÷ the \
             better Limitador {}; tollgate's own beyond that +{} µs (its wasm code and host calls, \
             its script's work beyond the least, its larger Webdis requests, its callouts' count: \
             Redis calls/req)",
            fmt(added(&run.rows, HOLD), 1),
            fmt(added_ratio(&run.rows, HOLD, &LIMITADORS), 3),
            fmt(added(&run.rows, SCRIPT), 1),
            fmt(added_ratio(&run.rows, SCRIPT, &LIMITADORS), 3),
            fmt(added_over(&run.rows, "tollgate-exact", SCRIPT), 1),
        ));
    }
    if run.rows.iter().any(|r| r.name == KEPT) {
        lines.push(format!(
            "- the same script with tollgate's promise kept, a request waiting for no more than \
             the callout out and its own ({KEPT}): +{} µs, ÷ the better Limitador of each round \
             {}; tollgate's own beyond that +{} µs",
            fmt(added(&run.rows, KEPT), 1),
            fmt(added_ratio(&run.rows, KEPT, &LIMITADORS), 3),
            fmt(added_over(&run.rows, "tollgate-exact", KEPT), 1),
        ));
    }
    if run.rows.iter().any(|r| r.name == "tollgate-exact-b") {
        lines.push(format!(
            "- tollgate-exact ÷ tollgate-exact-b: {}",
            fmt(
                added_ratio(&run.rows, "tollgate-exact", &["tollgate-exact-b"]),
                3
            )
        ));
    }
    for l in lines {
        println!("{l}");
    }
    println!();
    println!("Notes:");
    println!(
        "- added over plain = the system's Envoy + Limitador + Webdis + Redis CPU per request less \
         plain Envoy's (with the same idle Redis and Webdis) in the same round: what the rate limit \
         costs the whole system per request."
    );
    println!(
        "- Redis calls/req = scripts (EVALSHA, EVAL) and PINGs sent to Redis per request: for \
         tollgate and the floors, their callouts (a callout carries the checks of every request \
         its worker held meanwhile); a script's own commands are not counted."
    );
    for r in &run.rows {
        let sum = |f: fn(&Sample) -> u64| r.samples.iter().map(f).sum::<u64>();
        let (refused, failed) = (sum(|s| s.load.non_2xx), sum(|s| s.load.failed));
        if refused + failed > 0 {
            println!(
                "- {}: {refused} answers ≥ 400 and {failed} failed requests over all rounds: its \
                 figures include them",
                r.name
            );
        }
        let cx = r.samples.iter().map(|s| s.upstream_cx).max().unwrap_or(0);
        if cx > 4 * u64::from(settings.connections) {
            println!(
                "- {}: up to {cx} connections to the upstream in one Envoy's life: they were not \
                 kept alive, and its figures include opening them",
                r.name
            );
        }
        if r.samples.iter().any(|s| s.load.requests == 0) {
            println!(
                "- {}: a round with no answer: its figures leave it out",
                r.name
            );
        }
    }
    println!("- logs and configs: {}", run.dir.display());
}

pub fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| system | Envoy µs/req | Limitador µs/req | Webdis µs/req | Redis µs/req | whole system \
         µs/req | added over plain | Redis calls/req | req/s | p50 ms | p99 ms |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let added = if r.name == "plain" {
            "—".to_string()
        } else {
            added(rows, r.name).map_or("—".into(), |x| format!("{x:+.1}"))
        };
        let limiter = if r.samples.iter().any(|s| s.limiter_s > 0.0) {
            fmt(r.median(Sample::limiter_us), 1)
        } else {
            "—".into()
        };
        t.push_str(&format!(
            "| {} | {} | {limiter} | {} | {} | {} | {added} | {} | {} | {} | {} |\n",
            r.name,
            fmt(r.median(Sample::envoy_us), 1),
            fmt(r.median(Sample::webdis_us), 1),
            fmt(r.median(Sample::redis_us), 1),
            fmt(r.median(Sample::system_us), 1),
            fmt(r.median(Sample::redis_calls), 3),
            fmt(r.median(|s| Some(s.load.rps())), 0),
            fmt(r.median(|s| Some(s.load.p50_ms)), 2),
            fmt(r.median(|s| Some(s.load.p99_ms)), 2),
        ));
    }
    t
}

/// The first line a program prints for `--version` (or `-v`), else "version unknown".
pub fn version_of(bin: &Path, flag: &str) -> String {
    let line = tollgate_tools::machine::command_line(&bin.to_string_lossy(), &[flag]);
    line.lines()
        .next()
        .filter(|l| !l.is_empty())
        .unwrap_or("version unknown")
        .to_string()
}
