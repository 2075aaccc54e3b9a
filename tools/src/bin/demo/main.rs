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
//! Both parts are drawn in target/demo/demo.svg (chart.rs): each user's admissions over time against
//! what its bucket allows.
//!
//! requests.rs is part one, tokens.rs part two. Run with `make demo` (installs what is missing and
//! builds the wasm first).

// A tool run natively, never in the VM: a broken invariant here fails the run with its message.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod chart;
mod requests;
mod tokens;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use tollgate_e2e::http::{raw_request_from, Resp};
use tollgate_e2e::webdis::{Webdis, WebdisOpts};
use tollgate_e2e::{repo_root, scratch_dir, Redis};

/// How long each user sends, in both parts.
const RUN_FOR: Duration = Duration::from_secs(4);

/// `GET path` to Envoy on 127.0.0.1:`port`, sent from `client` (its `client_ip`).
fn get_from(client: Ipv4Addr, port: u16, path: &str) -> Result<Resp, String> {
    let envoy = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    raw_request_from(Some(IpAddr::V4(client)), envoy, "GET", path, &[])
}

fn main() -> ExitCode {
    let dir = scratch_dir("demo");
    let redis = Redis::start(&dir);
    let webdis = match Webdis::try_start_with(&dir, redis.port, &WebdisOpts::default()) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("demo: webdis failed to start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (mut ok, requests) = match requests::run(&dir, &redis, &webdis) {
        Ok(part) => part,
        Err(e) => {
            eprintln!("demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!();
    let (tokens_ok, tokens) = tokens::run(&dir, webdis.port);
    ok &= tokens_ok;

    let svg = repo_root().join("target/demo/demo.svg");
    let panels: Vec<chart::Panel> = std::iter::once(requests).chain(tokens).collect();
    match chart::write(&svg, &panels) {
        Ok(()) => println!("\nchart: {}", svg.display()),
        Err(e) => {
            ok = false;
            eprintln!("demo: the chart: {e}");
        }
    }

    // Stop Webdis, then Redis (each killed by its pid).
    drop(webdis);
    drop(redis);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
