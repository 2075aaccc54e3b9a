//! The whole thing on one machine: Redis, Webdis in front of it, and one Envoy (2 workers) running
//! tollgate.wasm with envoy/envoy.yaml and envoy/demo-config.json. Three users, each a client with its
//! own address (127.0.0.11, .12 and .13: the rule keys on the client address Envoy sees, which a client
//! cannot rewrite), send paced traffic to `/api/orders` for a few seconds; the table shows how many of
//! each user's requests got through, next to the most the global token bucket allows
//! (burst + rate × elapsed).
//!
//! A second part puts a stand-in LLM API behind Envoy (cluster "app") and limits tokens, not
//! requests: each answer reports `usage.total_tokens`, and tollgate charges it to the user's global
//! bucket after the fact. A user with few but expensive requests is limited; one with many cheap
//! requests is not.
//!
//! Run with `make demo` (installs what is missing and builds the wasm first).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use common::envoy::{brief_log, demo_config, Envoy};
use common::http::{raw_request_from, Resp};
use common::upstream::Upstream;
use common::webdis::{Webdis, WebdisOpts};
use common::{scratch_dir, Redis};

/// How long each user sends.
const RUN_FOR: Duration = Duration::from_secs(4);
const PATH: &str = "/api/orders";
/// (user, the client address it sends from, requests per second)
const USERS: [(&str, Ipv4Addr, u32); 3] = [
    ("alice", Ipv4Addr::new(127, 0, 0, 11), 2),
    ("bob", Ipv4Addr::new(127, 0, 0, 12), 8),
    ("carol", Ipv4Addr::new(127, 0, 0, 13), 30),
];

/// `GET path` to Envoy on 127.0.0.1:`port`, sent from `client` (its `client_ip`).
fn get_from(client: Ipv4Addr, port: u16, path: &str) -> Result<Resp, String> {
    let envoy = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    raw_request_from(Some(IpAddr::V4(client)), envoy, "GET", path, &[])
}

/// What one user's sender saw.
struct Tally {
    user: &'static str,
    client: Ipv4Addr,
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
fn run_user(port: u16, (user, client, per_second): (&'static str, Ipv4Addr, u32)) -> Tally {
    let interval = Duration::from_secs(1) / per_second;
    let mut t = Tally {
        user,
        client,
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
        match get_from(client, port, PATH) {
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
        "rule per-client (path /api/, one bucket per client address): {rate} per {period_ms} ms, \
         burst {burst}; each user sends GET {PATH} from its own address for {} s",
        RUN_FOR.as_secs()
    );
    println!("configs and logs: {}", dir.display());
    println!();

    let handles: Vec<_> = USERS
        .iter()
        .map(|&user| std::thread::spawn(move || run_user(port, user)))
        .collect();
    let tallies: Vec<Tally> = handles
        .into_iter()
        .map(|h| h.join().expect("sender thread"))
        .collect();

    println!(
        "{:<6} {:<11} {:>7} {:>5} {:>9} {:>8} {:>6}   {:>13}",
        "user", "client", "req/s", "sent", "admitted", "limited", "other", "max admitted"
    );
    let mut ok = true;
    for t in &tallies {
        let max = burst + rate * t.elapsed.as_secs_f64() * 1000.0 / period_ms;
        println!(
            "{:<6} {:<11} {:>7} {:>5} {:>9} {:>8} {:>6}   {:>13.1}",
            t.user,
            t.client.to_string(),
            t.per_second,
            t.sent,
            t.admitted,
            t.limited,
            t.other,
            max
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

    // The filter pushes its counts up to a second after counting them: wait until every answered
    // request's decision is in.
    let answered: u64 = tallies
        .iter()
        .map(|t| u64::from(t.admitted + t.limited))
        .sum();
    let stats = envoy.stats_when(|s| common::envoy::decided_in(s, "per-client") >= answered);
    let ours: Vec<&str> = stats
        .lines()
        .filter(|l| l.starts_with("wasmcustom.tollgate.") && !l.ends_with(": 0"))
        .filter(|l| !l.ends_with("No recorded values"))
        .collect();
    if !ours.is_empty() {
        println!();
        println!("filter metrics (admin /stats):");
        for line in ours {
            println!("  {line}");
        }
    }

    drop(envoy);
    println!();
    ok &= usage_demo(&dir, webdis.port);

    // Stop Webdis, then Redis (each killed by its pid).
    drop(webdis);
    drop(redis);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The token budget of the usage part: tokens per second and burst, per user.
const TOKENS_PER_SECOND: u64 = 1000;
const TOKEN_BURST: u64 = 2000;
/// (user, the client address it sends from, requests per second, tokens each answer reports)
const LLM_USERS: [(&str, Ipv4Addr, u32, u64); 2] = [
    ("dana", Ipv4Addr::new(127, 0, 0, 21), 2, 1500),
    ("eli", Ipv4Addr::new(127, 0, 0, 22), 10, 40),
];

/// A stand-in LLM API: answers `/app/chat?tokens=N` with a completion whose usage is N tokens.
fn llm_stand_in() -> Upstream {
    Upstream::start_with(|head| {
        let tokens: u64 = head
            .split_whitespace()
            .nth(1)
            .and_then(|target| target.split("tokens=").nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        let body = format!(
            r#"{{"object":"chat.completion","choices":[{{"message":{{"content":"..."}}}}],"usage":{{"prompt_tokens":12,"completion_tokens":{},"total_tokens":{tokens}}}}}"#,
            tokens.saturating_sub(12)
        );
        vec![format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()]
    })
}

/// Part two: tokens, not requests. Returns whether it behaved.
fn usage_demo(dir: &std::path::Path, webdis_port: u16) -> bool {
    let app = llm_stand_in();
    let config = format!(
        r#"{{ "backend": {{ "timeout_ms": 500 }},
        "rules": [ {{ "name": "tokens-per-client", "match": {{ "path_prefix": "/app/" }},
                     "key": ["client_ip"], "rate": {TOKENS_PER_SECOND}, "burst": {TOKEN_BURST},
                     "usage": {{ "body_field": "usage.total_tokens" }} }} ] }}"#
    );
    let wasm = common::wasm_path();
    let envoy = match Envoy::try_start_wasm(dir, &wasm, &config, (webdis_port, app.port)) {
        Ok(e) => e,
        Err(log) => {
            eprintln!(
                "demo: envoy (usage) failed to start; log:\n{}",
                brief_log(&log)
            );
            return false;
        }
    };
    println!(
        "part two: tokens, not requests. A stand-in LLM API behind Envoy reports usage.total_tokens; \
         rule tokens-per-client: {TOKENS_PER_SECOND} tokens/s per client address, burst {TOKEN_BURST}, \
         charged after each answer"
    );
    let port = envoy.listen_port;
    let handles: Vec<_> = LLM_USERS
        .iter()
        .map(|&(user, client, per_second, tokens)| {
            std::thread::spawn(move || {
                let interval = Duration::from_secs(1) / per_second;
                let start = Instant::now();
                let (mut admitted, mut limited, mut used, mut other) = (0u32, 0u32, 0u64, 0u32);
                for i in 0..per_second * RUN_FOR.as_secs() as u32 {
                    if let Some(wait) =
                        (start + interval * i).checked_duration_since(Instant::now())
                    {
                        std::thread::sleep(wait); // pacing, not a readiness wait
                    }
                    let path = format!("/app/chat?tokens={tokens}");
                    match get_from(client, port, &path) {
                        Ok(r) if r.status == 200 => {
                            admitted += 1;
                            used += tokens;
                        }
                        Ok(r) if r.status == 429 => limited += 1,
                        _ => other += 1,
                    }
                }
                (
                    user,
                    per_second,
                    tokens,
                    admitted,
                    limited,
                    other,
                    used,
                    start.elapsed(),
                )
            })
        })
        .collect();
    println!(
        "{:<6} {:>7} {:>12} {:>9} {:>8} {:>6} {:>12} {:>12}",
        "user",
        "req/s",
        "tokens/req",
        "admitted",
        "limited",
        "other",
        "tokens used",
        "token budget"
    );
    let mut ok = true;
    let mut results = Vec::new();
    let (mut answered, mut charged) = (0u64, 0u64);
    for h in handles {
        let (user, rps, tokens, admitted, limited, other, used, elapsed) =
            h.join().expect("sender");
        answered += u64::from(admitted + limited);
        // Each admission paid 1 token up front; its answer's usage charged the rest.
        charged += used - u64::from(admitted);
        let budget = TOKEN_BURST as f64 + TOKENS_PER_SECOND as f64 * elapsed.as_secs_f64();
        println!(
            "{user:<6} {rps:>7} {tokens:>12} {admitted:>9} {limited:>8} {other:>6} {used:>12} {budget:>12.0}"
        );
        ok &= other == 0;
        results.push((user, limited, used, budget, tokens));
    }
    println!(
        "(token budget = burst + rate × elapsed; an answer's tokens are charged after it, so a user \
         can overshoot by what one request uses)"
    );
    for (user, limited, used, budget, tokens) in &results {
        // Sequential requests: at most one answer's tokens beyond the budget.
        if *used as f64 > budget + *tokens as f64 {
            ok = false;
            eprintln!("demo: {user} used {used} tokens, over the budget");
        }
        if *user == "dana" && *limited == 0 {
            ok = false;
            eprintln!("demo: dana was never limited by tokens");
        }
        if *user == "eli" && *limited != 0 {
            ok = false;
            eprintln!("demo: eli was limited although his tokens fit");
        }
    }
    // Every answered request's decision and usage in (the filter pushes its counts up to a second
    // after counting them).
    let stats = envoy.stats_when(|s| {
        let charged_in =
            common::envoy::stat_in(s, "wasmcustom.tollgate.tokens-per-client.usage_charged");
        common::envoy::decided_in(s, "tokens-per-client") >= answered
            && charged_in.unwrap_or(0) >= charged
    });
    for name in ["usage_charged", "allowed", "denied"] {
        let full = format!("wasmcustom.tollgate.tokens-per-client.{name}");
        if let Some(v) = common::envoy::stat_in(&stats, &full) {
            println!("  {full}: {v}");
        }
    }
    ok
}
