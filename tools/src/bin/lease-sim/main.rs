//! A deterministic simulator of lease mode: `make sim SIM_ARGS='[options]'`.
//!
//! It runs the real engine (`tollgate_core::engine::Engine`, one per worker, the proxy's shared data an
//! in-memory store shared by the workers of one proxy) against a simulated clock, paced clients like
//! `make bench`'s (h2load `--rps`, one request in flight per connection, every client's timer firing
//! once per period from its connection), and the global bucket as `tollgate_core::bucket` (the model of
//! the Lua script) answering each call after a random latency. No Envoy, no Redis, no wall clock:
//! the same options and seed give the same figures.
//!
//! What the host does is modelled on Envoy, on the host the engine's tests use: a callout belongs
//! to the worker's root context (as proxy-wasm-cpp-host's `http_call` does), so its answer comes
//! there even after the request whose callback sent it is done; a resumed request completes at
//! once (the bench's route is a direct response); the tick fires only when asked for, at the
//! period asked.
//!
//! It prints admitted ÷ ideal (ideal = burst + rate × T, T = first request start to last
//! completion, as the bench), script calls per 1000 admitted, and where the tokens went: refill
//! that overflowed the full global bucket, tokens still in the global bucket at the end, leased
//! tokens dropped (expired or evicted) or still held in pools and stashes at the end; and the calls
//! by kind. `--sweep` runs a set of shapes. `--scale` (first) runs fleets instead: 10 to 1000
//! proxies, one hot key and many warm keys, skewed demand (fleet.rs; `make sim-scale`).
//!
//! The files: opts.rs (options and the sweep's shapes), worker.rs (a worker: its engine on the
//! engine tests' fake host, `tollgate_core::engine::testkit`, the configuration around each
//! simulator's rules, the callbacks run on it and what each asked of the host), webdis.rs (a
//! script call, single or batched, and its reply as Webdis carries them), ideal.rs (what one
//! perfect token bucket admits; the fullest window), sim.rs (the event loop and
//! the clients), sim/calls.rs (script calls to the bucket model and back), sim/account.rs (the
//! ledger), run.rs (a load's figures), report.rs (printing), fleet.rs and fleet/ (the fleet
//! runs), tests.rs. Both simulators share worker.rs, webdis.rs and ideal.rs.

// A tool run natively, never in the VM: a broken invariant here fails the run with its message.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod fleet;
mod ideal;
mod opts;
mod report;
mod run;
mod sim;
#[cfg(test)]
mod tests;
mod webdis;
mod worker;

use opts::{parse_args, shapes};
use report::{mean, median, report, run_shape};
use run::Run;

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--scale") {
        match fleet::args::parse(std::env::args().skip(2)) {
            Ok(a) => fleet::table(&a.base, &a.sizes, &a.overloads, &a.max_waits()),
            Err(e) if e == fleet::args::USAGE => println!("{e}"),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        }
        return;
    }
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) if e == opts::USAGE => {
            println!("{e}");
            return;
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if !o.sweep {
        let runs = run_shape(&o);
        report(&o, &runs);
        return;
    }
    println!(
        "{:<44} {:>7} {:>7} {:>7} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7}",
        "shape",
        "adm/req",
        "adm/id",
        "min",
        "calls/1k",
        "max",
        "ovfl",
        "bucket",
        "drop",
        "held",
        "share",
        "window"
    );
    for (name, s) in shapes(&o) {
        let runs = run_shape(&s);
        let m = |f: fn(&Run) -> f64| mean(runs.iter().map(f));
        let share = |r: &Run| {
            let total: u64 = r.per_proxy.iter().sum();
            let min = r.per_proxy.iter().copied().min().unwrap_or(0);
            min as f64 * r.per_proxy.len() as f64 / total.max(1) as f64
        };
        println!(
            "{:<44} {:>7.3} {:>7.3} {:>7.3} {:>8.1} {:>8.1} {:>6.1} {:>6.1} {:>6.1} {:>6.1} {:>6.3} {:>+7.0}",
            name,
            m(|r| r.admitted as f64 / (r.admitted + r.limited + r.other).max(1) as f64),
            median(runs.iter().map(Run::ratio).collect()),
            runs.iter().map(Run::ratio).fold(f64::INFINITY, f64::min),
            median(runs.iter().map(Run::per_1k).collect()),
            runs.iter().map(Run::per_1k).fold(0.0, f64::max),
            m(|r| r.overflow),
            m(|r| r.in_bucket_end),
            m(|r| r.dropped as f64),
            m(|r| r.held_end_refilled),
            m(share),
            runs.iter()
                .map(|r| r.worst.excess())
                .fold(f64::NEG_INFINITY, f64::max),
        );
    }
    println!(
        "adm/req: admitted / requests (mean); adm/id: admitted / ideal, median and min over runs; calls/1k: median and max; then means per \
         load, in tokens: refill that overflowed the full bucket, left in the bucket (negative: \
         reserved ahead), leased and dropped, held in pools/stashes at the end (refilled already); \
         share: the smallest \
         proxy's admitted x proxies / all admitted; window: the most any window of any run \
         admitted over burst + rate x W (at most one request per proxy is allowed)"
    );
}
