//! Part two of the demo: tokens, not requests. A stand-in LLM API behind Envoy reports each
//! answer's `usage.total_tokens`, and tollgate charges it to the user's global bucket after the
//! fact: a user with few but expensive requests is limited, one with many cheap requests is not,
//! and no user spends more than its budget plus one answer's tokens.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use tollgate_e2e as common;

use common::envoy::{brief_log, Envoy};
use common::upstream::Upstream;

use crate::chart::{Line, Panel};
use crate::{get_from, RUN_FOR};

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

/// Part two: tokens, not requests. Returns whether it behaved, and its panel of the chart (None
/// if its Envoy did not start).
pub fn run(dir: &Path, webdis_port: u16) -> (bool, Option<Panel>) {
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
            return (false, None);
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
                // For the chart: (seconds since the first request, tokens used so far) at each
                // admission's answer.
                let mut steps = Vec::new();
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
                            steps.push((start.elapsed().as_secs_f64(), used as f64));
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
                    steps,
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
    let mut lines = Vec::new();
    let (mut answered, mut charged) = (0u64, 0u64);
    for h in handles {
        let (user, rps, tokens, admitted, limited, other, used, elapsed, steps) =
            h.join().expect("sender");
        lines.push(Line { user, steps });
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
    let panel = Panel {
        title: format!(
            "tokens: rule tokens-per-client, {TOKENS_PER_SECOND} per s, burst {TOKEN_BURST}"
        ),
        y_desc: "tokens used by admitted requests",
        burst: TOKEN_BURST as f64,
        per_second: TOKENS_PER_SECOND as f64,
        seconds: RUN_FOR.as_secs_f64(),
        note: " (charged after each answer)",
        lines,
    };
    (ok, Some(panel))
}
