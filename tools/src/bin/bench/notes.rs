//! The report's notes: where tollgate-lease's cost over the floor goes, ratios slice by slice,
//! what each kind of scenario runs, each tollgate scenario's Envoy counters over all rounds, and
//! anything odd in the run (rounds with no answer, keys that repeated, counts that disagree).

use std::collections::BTreeMap;

use crate::args::Settings;
use crate::builds::BODY_CALLBACK;
use crate::goals::{flood_cost_split, flood_detail, lease_cost_split};
use crate::report::{fmt, Outcome};
use crate::rows::{paired_ratio, row_named, slice_ratios};
use crate::sample::Sample;
use crate::scenarios::{Setup, HUGE_RATE, QUERY_KEY, USER_HEADER};

/// Prints the notes, after the goals.
pub fn print(settings: &Settings, run: &Outcome) {
    let rows = &run.rows;
    println!();
    println!("Notes:");
    if let Some((calls, wasm)) = lease_cost_split(rows) {
        println!(
            "- where tollgate-lease's Envoy CPU over wasm-floor goes (medians of per-round \
             differences): its host calls {calls:.1} µs/request (wasm-floor-calls − wasm-floor), \
             the rest {wasm:.1} µs/request (tollgate-lease − wasm-floor-calls: tollgate's own wasm \
             code, less the calls into the VM it saves by exporting only the callbacks it uses)."
        );
    }
    if let Some((hold, rest)) = flood_cost_split(rows) {
        println!(
            "- where tollgate-flood-exact's Envoy CPU goes (medians): holding each request for a \
             callout its worker shares {hold:.1} µs/request (wasm-floor-hold), the rest \
             {rest:.1} µs/request (tollgate-flood-exact − wasm-floor-hold: tollgate's own wasm \
             code and host calls, checks relayed between workers, larger callouts)."
        );
    }
    if let Some((mid, low, high, n)) = slice_ratios(rows, "tollgate-lease", "wasm-floor") {
        println!(
            "- tollgate-lease ÷ wasm-floor Envoy CPU/request slice by slice (the goal takes the \
             median of per-round ratios): median {mid:.3}, quartiles {low:.3}–{high:.3}, over {n} \
             pairs of slices."
        );
    }
    if let Some(wasm) = &settings.compare_wasm {
        for b in rows.iter().filter(|r| r.def.a_side().is_some()) {
            let a_name = b.def.a_side().unwrap_or_default();
            let Some(a) = row_named(rows, a_name) else {
                continue;
            };
            let per_round = paired_ratio(&b.samples, &a.samples, Sample::cpu);
            let slices = if b.def.sliced() {
                slice_ratios(rows, b.def.name, a_name).map_or(
                    "; slice by slice not measured".to_string(),
                    |(mid, low, high, n)| {
                        format!(
                            "; slice by slice median {mid:.3}, quartiles {low:.3}–{high:.3}, \
                             over {n} pairs of slices"
                        )
                    },
                )
            } else {
                String::new()
            };
            println!(
                "- {} ({}) ÷ {a_name} Envoy CPU/request: median of per-round ratios {}{slices}.",
                b.def.name,
                wasm.display(),
                fmt(per_round, 3)
            );
        }
    }
    for r in rows
        .iter()
        .filter(|r| r.def.flood() && r.def.tollgate_mode() == Some("exact"))
    {
        println!("- {}.", flood_detail(rows, r.def.name));
    }
    if let Some((mid, low, high, n)) =
        slice_ratios(rows, "tollgate-lease", "tollgate-lease-no-body-export")
    {
        println!(
            "- tollgate-lease ÷ tollgate-lease-no-body-export Envoy CPU/request slice by slice (the \
             same tollgate.wasm, with and without the {BODY_CALLBACK} export: Envoy calls into the \
             VM once more per response chunk, here one): median {mid:.3}, quartiles \
             {low:.3}–{high:.3}, over {n} pairs of slices."
        );
    }
    println!(
        "- Envoy CPU = the CPU time of the scenario's Envoy process(es) over the load (every thread's \
         from /proc/<pid>/task/*/schedstat), ÷ requests answered; Webdis+Redis CPU likewise for the \
         shared backend."
    );
    println!(
        "- tollgate-flood-*: one rule keyed on query:{QUERY_KEY}, limit {HUGE_RATE}/s; every request \
         carries a key never sent before, so every request is a miss (a check for its cost in \
         both modes: lease mode, seeing most new keys only once, leases only a key that comes back). tollgate-flood-exact is also the random-key exact scenario: its script calls per request show how many checks of different keys share a call. \
         Its load runs as {} h2load processes of one connection each (h2load's -i starts every client at the top of its list), \
         so its req/s is not quite the same load generator as plain's.",
        settings.connections
    );
    println!(
        "- tollgate-tenant-*: one Envoy, lease mode, one rule keyed on query:{QUERY_KEY} with the limited \
         rate and burst; p50/p99 and admitted ÷ ideal are the tenant's, CPU and Redis calls cover every \
         request (the flood's too)."
    );
    println!(
        "- tollgate scenarios use envoy/envoy.yaml, failure_mode closed (a backend failure is a 503), \
         timeout 100 ms; tollgate-exact, -lease and -limited-* have one rule keyed on header:{USER_HEADER}; \
         tollgate-exact and -lease send one user with a limit of {HUGE_RATE}/s (never reached)."
    );
    println!(
        "- Limited and tenant rows are paced (open loop), so their req/s and latency are not compared with \
         plain. ideal = burst + rate × T, T = the hot key's first request start to its last completion \
         (across both proxies for limited rows): an upper bound on what the global bucket can grant; \
         admitted = the hot key's 200s."
    );
    println!(
        "- non-200 sums every round: 429, 5xx, other statuses, failed streams, and hung = requests still \
         unanswered when a load ended beyond the one per connection h2load always leaves in flight."
    );
    for r in rows {
        if let Some(mode) = r.def.tollgate_mode() {
            let mut totals: BTreeMap<String, i64> = BTreeMap::new();
            let mut redis_failed = 0;
            for s in &r.samples {
                redis_failed += s.redis_failed_calls;
                for (k, v) in &s.stats {
                    *totals.entry(k.clone()).or_insert(0) += v;
                }
            }
            let listed: Vec<String> = totals
                .iter()
                .map(|(k, v)| {
                    let short = k
                        .strip_prefix("cluster.tollgate_backend.")
                        .map_or_else(|| k.clone(), |s| format!("backend {s}"));
                    format!("{short}={v}")
                })
                .collect();
            println!(
                "- {} (mode {mode}), Envoy counters over all rounds: {}{}",
                r.def.name,
                if listed.is_empty() {
                    "none changed".to_string()
                } else {
                    listed.join(", ")
                },
                if redis_failed > 0 {
                    format!("; Redis failed script calls: {redis_failed}")
                } else {
                    String::new()
                }
            );
            let one_key = matches!(
                r.def.setup,
                Setup::Tollgate(_)
                    | Setup::Limited(_)
                    | Setup::Compared { flood: false, .. }
                    | Setup::BodyUnexported
                    | Setup::Baseline
            );
            if one_key && mode == "lease" && r.redis_per_1k_admitted.is_some_and(|x| x >= 900.0) {
                println!(
                    "  {} calls Redis for about every admitted request: lease mode is behaving as exact.",
                    r.def.name
                );
            }
        }
        let silent: Vec<String> = r
            .samples
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.answered())
            .map(|(i, s)| format!("round {} ({} started, none answered)", i + 1, s.unfinished))
            .collect();
        if !silent.is_empty() {
            println!(
                "- {}: NO request was answered in {}: its figures leave those rounds out",
                r.def.name,
                silent.join(", ")
            );
        }
        let repeated: u64 = r.samples.iter().map(|s| s.repeated_keys).sum();
        if repeated > 0 {
            println!(
                "- {}: {repeated} flood requests reused a key (an h2load connection went round its URI \
                 list): raise FLOOD_MAX_RPS",
                r.def.name
            );
        }
        let done_gap = r
            .samples
            .iter()
            .map(|s| s.h2load_done.abs_diff(s.requests))
            .max()
            .unwrap_or(0);
        if done_gap > 0 {
            println!(
                "- {}: h2load's `done` and its per-request log differ by up to {done_gap} requests in a round",
                r.def.name
            );
        }
    }
    for w in &run.drift {
        println!("- warning: {w}");
    }
    println!("- logs and configs: {}", run.dir.display());
}
