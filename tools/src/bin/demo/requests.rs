//! Part one of the demo: requests. Three users, each a client with its own address (the rule keys
//! on the client address Envoy sees, which a client cannot rewrite), send paced traffic; each user's
//! admissions never exceed what the global bucket can grant (burst + rate × elapsed).

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use tollgate_e2e as common;

use common::envoy::{brief_log, demo_config, Envoy};
use common::http::Resp;
use common::webdis::Webdis;
use common::Redis;

use crate::chart::{Line, Panel};
use crate::{get_from, RUN_FOR};

const PATH: &str = "/api/orders";
/// (user, the client address it sends from, requests per second)
const USERS: [(&str, Ipv4Addr, u32); 3] = [
    ("alice", Ipv4Addr::new(127, 0, 0, 11), 2),
    ("bob", Ipv4Addr::new(127, 0, 0, 12), 8),
    ("carol", Ipv4Addr::new(127, 0, 0, 13), 30),
];

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
    /// For the chart: (seconds since the first request was sent, admitted so far) at each
    /// admission's answer.
    admissions: Vec<(f64, f64)>,
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
        admissions: Vec::new(),
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
            Ok(r) if r.status == 200 => {
                t.admitted += 1;
                t.admissions
                    .push((start.elapsed().as_secs_f64(), f64::from(t.admitted)));
            }
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

/// Part one: three users send paced requests for [`RUN_FOR`]; prints what each got and one 429.
/// Returns whether it behaved, and its panel of the chart; Err if its Envoy did not start.
pub fn run(dir: &Path, redis: &Redis, webdis: &Webdis) -> Result<(bool, Panel), String> {
    let config = demo_config();
    let (rate, period_ms, burst) = first_rule(&config);
    let envoy = Envoy::try_start(dir, &config, webdis.port)
        .map_err(|log| format!("envoy failed to start; log:\n{}", brief_log(&log)))?;
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

    let panel = Panel {
        title: format!("requests: rule per-client, {rate} per {period_ms} ms, burst {burst}"),
        y_desc: "requests admitted",
        burst,
        per_second: rate * 1000.0 / period_ms,
        seconds: RUN_FOR.as_secs_f64(),
        note: "",
        lines: tallies
            .iter()
            .map(|t| Line {
                user: t.user,
                steps: t.admissions.clone(),
            })
            .collect(),
    };
    Ok((ok, panel))
}
