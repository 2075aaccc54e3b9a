//! Reconfiguration without dropping traffic: an Envoy hot restart (epoch 0 -> epoch 1, the way an
//! operator rolls out a new filter configuration) takes the new plugin configuration at once,
//! keeps every bucket in Redis as it was, and no request fails during the switch.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{envoy_bin, free_port, render_envoy_yaml, scratch_dir, wait_until, wasm_path, Proc};

fn config(burst: u64) -> String {
    format!(
        r#"{{ "backend": {{ "timeout_ms": 2000 }},
             "rules": [ {{ "name": "per-user", "key": ["header:x-user-id"],
                           "rate": 1, "period_ms": 60000, "burst": {burst} }} ] }}"#
    )
}

/// Starts one hot-restart epoch of Envoy on the given ports.
fn epoch(
    dir: &std::path::Path,
    n: u32,
    base_id: u32,
    plugin: &str,
    backend: u16,
    listen: u16,
    admin: u16,
) -> Proc {
    let yaml = render_envoy_yaml(
        plugin,
        backend,
        listen,
        admin,
        &wasm_path(),
        common::envoy::NO_UPSTREAM,
    );
    let path = dir.join(format!("envoy-epoch{n}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    let mut cmd = Command::new(envoy_bin());
    cmd.arg("-c").arg(&path).args([
        "--concurrency",
        "2",
        "--base-id",
        &base_id.to_string(),
        "--restart-epoch",
        &n.to_string(),
        "--drain-time-s",
        "2",
        "--parent-shutdown-time-s",
        "4",
        "-l",
        "info",
    ]);
    Proc::spawn(
        &format!("envoy-epoch{n}"),
        cmd,
        &dir.join(format!("envoy-epoch{n}.log")),
    )
}

struct ShmCleanup(String);

impl Drop for ShmCleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn server_epoch(admin: u16) -> Option<u64> {
    let r = common::try_http(admin, "GET", "/server_info", &[]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&r.body).ok()?;
    if v["state"] != "LIVE" {
        return None;
    }
    v["command_line_options"]["restart_epoch"].as_u64()
}

#[test]
fn hot_restart_applies_new_config_keeps_buckets_and_drops_nothing() {
    let dir = scratch_dir("reload");
    let redis = common::Redis::start(&dir);
    let webdis = common::Webdis::start(&dir, redis.port);
    let (listen, admin) = (free_port(), free_port());
    // A base id of our own, so parallel runs never share Envoy's hot-restart shared memory.
    let base_id = u32::from(listen);
    // Dropped last (declared before the Envoy processes): removes the hot-restart shared memory.
    let _shm = ShmCleanup(format!("/dev/shm/envoy_shared_memory_{}", base_id * 10));
    let mut first = epoch(&dir, 0, base_id, &config(5), webdis.port, listen, admin);
    assert!(
        wait_until(Duration::from_secs(30), || server_epoch(admin) == Some(0)),
        "epoch 0 not live:\n{}",
        first.log_text()
    );
    let alice = [("x-user-id", "alice")];
    for left in [4, 3, 2] {
        let r = common::get(listen, "/x", &alice);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(
            r.header("ratelimit"),
            Some(format!("\"per-user\";r={left};t={}", (5 - left) * 60).as_str())
        );
        assert_eq!(r.header("ratelimit-policy"), Some("\"per-user\";q=5;w=300"));
    }

    // Traffic for another user goes on throughout the restart; every answer must be 200 or 429.
    let stop = Arc::new(AtomicBool::new(false));
    let background = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut answered, mut failed) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match common::try_http(listen, "GET", "/x", &[("x-user-id", "bob")]) {
                    Ok(r) if r.status == 200 || r.status == 429 => answered += 1,
                    Ok(r) => failed.push(format!("status {}", r.status)),
                    Err(e) => failed.push(e),
                }
            }
            (answered, failed)
        })
    };

    let mut second = epoch(&dir, 1, base_id, &config(10), webdis.port, listen, admin);
    let live = wait_until(Duration::from_secs(30), || {
        second.assert_running();
        server_epoch(admin) == Some(1)
    });
    assert!(live, "epoch 1 not live:\n{}", second.log_text());
    // Let the old epoch drain and exit on its own while traffic continues.
    let drained = wait_until(Duration::from_secs(15), || {
        matches!(
            first.child.as_mut().map(|c| c.try_wait()),
            Some(Ok(Some(_)))
        )
    });
    stop.store(true, Ordering::Relaxed);
    let (answered, failed) = background.join().unwrap();
    assert!(
        drained,
        "epoch 0 did not exit after draining:\n{}",
        first.log_text()
    );
    assert!(answered > 0);
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the restart: {:?}",
        failed.len(),
        answered + failed.len() as u64,
        &failed[..failed.len().min(5)]
    );

    // The new burst is in force and alice's bucket kept its state: 2 tokens were left, now 1.
    let r = common::get(listen, "/x", &alice);
    assert_eq!(r.status, 200, "{r:?}\n{}", second.log_text());
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"per-user\";q=10;w=600")
    );
    let rl = r.header("ratelimit").unwrap();
    assert!(rl.starts_with("\"per-user\";r=1;t="), "{rl}");
    eprintln!("reload: {answered} requests answered during the hot restart, none failed");
}
