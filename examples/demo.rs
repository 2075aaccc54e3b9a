//! The whole thing on one machine: Redis, Webdis in front of it, and one Envoy (2 workers) running
//! tollgate.wasm with envoy/envoy.yaml and envoy/demo-config.json. Three users send paced traffic to
//! `/api/orders` for a few seconds; the table shows how many of each user's requests got through, next
//! to the most the global token bucket allows (burst + rate × elapsed).
//!
//! Run with `make demo` (installs what is missing and builds the wasm first).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use common::envoy::{brief_log, demo_config, Envoy};
use common::http::{try_http, Resp};
use common::webdis::{Webdis, WebdisOpts};
use common::{scratch_dir, Redis};

/// How long each user sends.
const RUN_FOR: Duration = Duration::from_secs(4);
const PATH: &str = "/api/orders";
/// (user, requests per second)
const USERS: [(&str, u32); 3] = [("alice", 2), ("bob", 8), ("carol", 30)];

/// What one user's sender saw.
struct Tally {
    user: &'static str,
    per_second: u32,
    sent: u32,
    admitted: u32,
    limited: u32,
    other: u32,
    errors: Vec<String>,
    /// From the first request sent to the last answer received: no more Redis time than this passed
    /// between the first and the last decision.
    elapsed: Duration,
    sample_429: Option<Resp>,
}

/// Sends `per_second` requests a second for RUN_FOR, on a fixed schedule (never catching up in a burst).
fn run_user(port: u16, user: &'static str, per_second: u32) -> Tally {
    let interval = Duration::from_secs(1) / per_second;
    let mut t = Tally {
        user,
        per_second,
        sent: 0,
        admitted: 0,
        limited: 0,
        other: 0,
        errors: Vec::new(),
        elapsed: Duration::ZERO,
        sample_429: None,
    };
    let count = per_second * RUN_FOR.as_secs() as u32;
    let start = Instant::now();
    for i in 0..count {
        let due = start + interval * i;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait); // pacing, not a readiness wait
        }
        t.sent += 1;
        match try_http(port, "GET", PATH, &[("x-user-id", user)]) {
            Ok(r) if r.status == 200 => t.admitted += 1,
            Ok(r) if r.status == 429 => {
                t.limited += 1;
                t.sample_429.get_or_insert(r);
            }
            Ok(r) => {
                t.other += 1;
                if t.errors.len() < 3 {
                    t.errors
                        .push(format!("HTTP {}: {}", r.status, r.body.trim()));
                }
            }
            Err(e) => {
                t.other += 1;
                if t.errors.len() < 3 {
                    t.errors.push(e);
                }
            }
        }
        t.elapsed = start.elapsed();
    }
    t
}

/// (rate, period_ms, burst) of the demo config's first rule.
fn first_rule(config: &str) -> (f64, f64, f64) {
    let v: serde_json::Value =
        serde_json::from_str(config).expect("envoy/demo-config.json is JSON");
    let rule = &v["rules"][0];
    let num = |k: &str| {
        rule[k]
            .as_f64()
            .unwrap_or_else(|| panic!("rules[0].{k} missing"))
    };
    let period_ms = rule["period_ms"].as_f64().unwrap_or(1000.0);
    (num("rate"), period_ms, num("burst"))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        429 => "Too Many Requests",
        503 => "Service Unavailable",
        _ => "",
    }
}

fn main() -> ExitCode {
    let config = demo_config();
    let (rate, period_ms, burst) = first_rule(&config);
    let dir = scratch_dir("demo");

    let redis = Redis::start(&dir);
    let webdis = match Webdis::try_start_with(&dir, redis.port, &WebdisOpts::default()) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("demo: webdis failed to start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let envoy = match Envoy::try_start(&dir, &config, webdis.port) {
        Ok(e) => e,
        Err(log) => {
            eprintln!("demo: envoy failed to start; log:\n{}", brief_log(&log));
            return ExitCode::FAILURE;
        }
    };
    let port = envoy.listen_port;

    println!(
        "tollgate demo: client -> envoy 127.0.0.1:{port} (2 workers, admin :{}) -> [tollgate.wasm] \
         -> webdis :{} -> redis :{}",
        envoy.admin_port, webdis.port, redis.port
    );
    println!(
        "rule per-user (path /api/, one bucket per x-user-id): {rate} per {period_ms} ms, burst {burst}; \
         each user sends GET {PATH} for {} s",
        RUN_FOR.as_secs()
    );
    println!("configs and logs: {}", dir.display());
    println!();

    let handles: Vec<_> = USERS
        .iter()
        .map(|&(user, per_second)| std::thread::spawn(move || run_user(port, user, per_second)))
        .collect();
    let tallies: Vec<Tally> = handles
        .into_iter()
        .map(|h| h.join().expect("sender thread"))
        .collect();

    println!(
        "{:<6} {:>7} {:>5} {:>9} {:>8} {:>6}   {:>13}",
        "user", "req/s", "sent", "admitted", "limited", "other", "max admitted"
    );
    let mut ok = true;
    for t in &tallies {
        let max = burst + rate * t.elapsed.as_secs_f64() * 1000.0 / period_ms;
        println!(
            "{:<6} {:>7} {:>5} {:>9} {:>8} {:>6}   {:>13.1}",
            t.user, t.per_second, t.sent, t.admitted, t.limited, t.other, max
        );
        if f64::from(t.admitted) > max {
            ok = false;
            eprintln!("demo: {} was admitted over the limit", t.user);
        }
        for e in &t.errors {
            ok = false;
            eprintln!("demo: {}: {e}", t.user);
        }
    }
    println!(
        "(max admitted = burst + rate × elapsed: what the global bucket can grant in that time)"
    );
    println!();

    match tallies
        .iter()
        .find_map(|t| t.sample_429.as_ref().map(|r| (t.user, r)))
    {
        Some((user, r)) => {
            println!("one limited response ({user}):");
            println!("  HTTP/1.1 {} {}", r.status, reason(r.status));
            for name in ["retry-after", "ratelimit", "ratelimit-policy"] {
                if let Some(v) = r.header(name) {
                    println!("  {name}: {v}");
                }
            }
            println!("  body: {:?}", r.body);
        }
        None => {
            ok = false;
            println!(
                "no request was limited (is the filter working? logs in {})",
                dir.display()
            );
        }
    }

    let stats = envoy.stats();
    let ours: Vec<&str> = stats
        .lines()
        .filter(|l| l.starts_with("tollgate.") && !l.ends_with(": 0"))
        .collect();
    if !ours.is_empty() {
        println!();
        println!("filter metrics (admin /stats):");
        for line in ours {
            println!("  {line}");
        }
    }

    // Stop Envoy, then Webdis, then Redis (each killed by its pid).
    drop(envoy);
    drop(webdis);
    drop(redis);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
