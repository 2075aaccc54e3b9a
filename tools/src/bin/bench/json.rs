//! The JSON report (`target/bench/bench-<timestamp>.json` and `target/bench/latest.json`): the
//! settings, the medians, every round's sample with its slices and Envoy processes, the goals and
//! the idle figures, for tools such as bench/perf-split.py and for comparing runs.

use std::path::PathBuf;

use tollgate_e2e::repo_root;

use crate::args::Settings;
use crate::builds::{BASELINE_COMMIT, BODY_CALLBACK, BODY_CALLBACK_RENAMED};
use crate::measure::{FLOOD_MAX_RPS, IDLE_WINDOW};
use crate::report::{protocol, Offered, Outcome};
use crate::rows::median_of;
use crate::sample::Sample;
use crate::scenarios::{HUGE_RATE, PACED_CLIENTS, QUERY_KEY};

fn sample_json(s: &Sample) -> serde_json::Value {
    serde_json::json!({
        "requests": s.requests,
        "h2load_done": s.h2load_done,
        "unanswered_at_end": s.unfinished,
        "hung": s.hung,
        "status_200": s.ok,
        "status_429": s.limited,
        "status_5xx": s.server_errors,
        "status_other": s.other_status,
        "failed": s.failed,
        "rps": s.rps,
        "p50_ms": s.p50_ms,
        "p99_ms": s.p99_ms,
        "wall_s": s.wall_s,
        "envoy_cpu_s": s.envoy_cpu_s,
        "envoy_cpu_us_per_req": s.cpu_us_per_req,
        "slices_envoy_cpu_us_per_req": s.slices_cpu_us,
        "envoy_pids": s.envoy_pids,
        "backend_cpu_us_per_req": s.backend_cpu_us_per_req,
        "webdis_cpu_us_per_req": s.webdis_cpu_us_per_req,
        "redis_cpu_us_per_req": s.redis_cpu_us_per_req,
        "flood_requests": s.background_requests,
        "admitted_for_ideal": s.admitted,
        "repeated_keys": s.repeated_keys,
        "redis_script_calls": s.redis_calls,
        "redis_script_failed_calls": s.redis_failed_calls,
        "redis_evalsha_calls": s.evalsha_calls,
        "redis_evalsha_usec": s.evalsha_usec,
        "keys_per_webdis_request": s.keys_per_webdis_request(),
        "redis_calls_per_1k_requests": s.redis_per_1k_requests(),
        "redis_calls_per_1k_admitted": s.redis_per_1k_admitted(),
        "ideal_admitted": s.ideal,
        "admitted_over_ideal": s.admitted_ratio(),
        "envoy_stats_delta": s.stats,
    })
}

/// Writes the report to `--out` (or a file named for the run's start) and to latest.json; returns
/// the first.
pub fn write(settings: &Settings, run: &Outcome) -> Result<PathBuf, String> {
    let Offered {
        paced,
        offered,
        tenant_paced,
        tenant_offered,
    } = Offered::of(settings);
    let m = &run.machine;
    let builds = &run.builds;
    let report = serde_json::json!({
        "date": m.date,
        "machine": { "nproc": m.nproc, "model_name": m.model },
        "versions": { "envoy": m.envoy_version, "h2load": m.h2load_version },
        "tollgate_wasm": run.tollgate_wasm.to_string_lossy(),
        "compare_wasm": settings.compare_wasm.as_ref().map(|p| p.to_string_lossy()),
        "baseline": (!builds.baseline.as_os_str().is_empty()).then(|| serde_json::json!({
            "commit": BASELINE_COMMIT, "wasm": builds.baseline.to_string_lossy(),
        })),
        "body_unexported": (!builds.body_unexported.as_os_str().is_empty()).then(|| serde_json::json!({
            "export": BODY_CALLBACK,
            "renamed": BODY_CALLBACK_RENAMED,
            "wasm": builds.body_unexported.to_string_lossy(),
        })),
        "settings": {
            "rounds": settings.rounds,
            "duration_s": settings.duration.as_secs_f64(),
            "requests": settings.requests,
            "connections": settings.connections,
            "threads": settings.threads,
            "warmup_s": settings.warmup.as_secs_f64(),
            "protocol": protocol(settings),
            "limited": {
                "rate_per_s": settings.limited_rate,
                "burst": settings.limited_burst,
                "offered_req_per_s": offered,
                "clients_per_proxy": PACED_CLIENTS,
                "rps_per_client": paced,
                "proxies": 2,
            },
            "tollgate_unlimited_rate_per_s": HUGE_RATE,
            "flood": {
                "h2load_processes": settings.connections,
                "connections_per_process": 1,
                "key": format!("query:{QUERY_KEY}"),
                "uri_lists_sized_for_rps": FLOOD_MAX_RPS * 2.0,
            },
            "tenant": {
                "offered_req_per_s": tenant_offered,
                "clients": PACED_CLIENTS,
                "rps_per_client": tenant_paced,
                "proxies": 1,
            },
            "envoy": "--concurrency 2 --disable-hot-restart",
        },
        "scenarios": run.rows.iter().map(|r| serde_json::json!({
            "name": r.def.name,
            "what": r.def.what,
            "mode": r.def.tollgate_mode(),
            "median": {
                "envoy_cpu_us_per_req": r.cpu,
                "backend_cpu_us_per_req": r.backend_cpu,
                "system_cpu_us_per_req": median_of(&r.samples, Sample::system_cpu),
                "rps": r.rps,
                "p50_ms": r.p50,
                "p99_ms": r.p99,
                "redis_calls_per_1k_requests": r.redis_per_1k,
                "redis_calls_per_1k_admitted": r.redis_per_1k_admitted,
                "admitted_over_ideal": r.admitted_ratio,
            },
            "ratio_to_plain": {
                "envoy_cpu_per_req": r.cpu_x,
                "rps": r.rps_x,
                "p50": r.p50_x,
                "p99": r.p99_x,
            },
            "rounds": r.samples.iter().map(sample_json).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "goals": run.goals.iter().map(|g| serde_json::json!({
            "goal": g.what, "value": g.value, "met": g.met, "detail": g.detail,
        })).collect::<Vec<_>>(),
        "idle": run.idle.iter().map(|i| serde_json::json!({
            "scenario": i.scenario,
            "window_s": IDLE_WINDOW.as_secs_f64(),
            "envoy_cpu_ticks": i.ticks,
            "envoy_cpu_ns": i.ns,
            "plain_envoy_cpu_ticks": i.plain.map(|p| p.0),
            "plain_envoy_cpu_ns": i.plain.map(|p| p.1),
            "ticks_per_s": run.ticks_per_s,
        })).collect::<Vec<_>>(),
        "template_warnings": run.drift,
        "scratch_dir": run.dir.to_string_lossy(),
        "elapsed_s": run.began.elapsed().as_secs_f64(),
    });
    let out_dir = repo_root().join("target/bench");
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("create {}: {e}", out_dir.display()))?;
    let out = settings
        .out
        .clone()
        .unwrap_or_else(|| out_dir.join(format!("bench-{}.json", m.stamp)));
    let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    for path in [out.clone(), out_dir.join("latest.json")] {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("create {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, &text).map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    Ok(out)
}
