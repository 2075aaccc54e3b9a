//! Reconfiguration without dropping traffic: an Envoy hot restart (epoch 0 -> epoch 1, the way an
//! operator rolls out a new filter configuration) takes the new plugin configuration at once,
//! keeps every bucket in Redis as it was, and no request fails during the switch. A configuration
//! change inside one Envoy (a listener update) keeps the usage settlements still pending.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

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

// ---- a configuration change inside one Envoy (file-based LDS) ----

/// envoy/envoy.yaml rendered with its listener moved to a file Envoy watches (LDS from a path): the
/// bootstrap, and the listener as a discovery response.
fn lds_bootstrap(yaml: &str, lds: &std::path::Path) -> (String, String) {
    let (start, end) = ("static_resources:\n  listeners:\n", "  clusters:\n");
    let a = yaml.find(start).unwrap();
    let b = a + yaml[a..].find(end).unwrap();
    let bootstrap = format!(
        "{}node:\n  id: reload-test\n  cluster: reload-test\ndynamic_resources:\n  lds_config:\n    \
         path_config_source:\n      path: '{}'\n    resource_api_version: V3\nstatic_resources:\n{}",
        &yaml[..a],
        lds.display(),
        &yaml[b..]
    );
    let listener: Vec<&str> = yaml[a + start.len()..b]
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect();
    let listener = listener.join("\n").replacen(
        "- name: ingress",
        "- \"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\n  name: ingress",
        1,
    );
    (bootstrap, format!("resources:\n{listener}\n"))
}

/// Writes `text` to `path` the way Envoy's file watch sees a new version: a rename over it.
fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A usage rule whose settlements wait 10 s for their flush; `deny_body` tells two versions apart.
fn usage_config(deny_body: &str) -> String {
    format!(
        r#"{{ "backend": {{ "timeout_ms": 2000 }}, "deny": {{ "body": "{deny_body}" }},
             "rules": [ {{ "name": "llm", "match": {{ "path_prefix": "/app/" }},
                           "key": ["header:x-user-id"], "rate": 1, "period_ms": 60000, "burst": 100,
                           "usage": {{ "header": "x-usage-tokens", "flush_ms": 10000 }} }} ] }}"#
    )
}

/// Whole tokens left in bucket `key` (a full bucket when Redis has none).
fn tokens_left(redis: &common::Redis, key: &str) -> i64 {
    let (u, p): (Option<i64>, Option<i64>) = redis::cmd("HMGET")
        .arg(key)
        .arg("u")
        .arg("p")
        .query(&mut redis.conn())
        .unwrap();
    match (u, p) {
        (Some(u), Some(p)) if p > 0 => u.div_euclid(p),
        _ => 100,
    }
}

/// A new plugin configuration taken inside one Envoy (a listener update through file-based LDS:
/// the new configuration gets a new root context in the same VM, the old one is deleted once its
/// filter chain has drained): a usage settlement the old configuration had not flushed yet still
/// reaches Redis. The old configuration's flush was 10 s away when it went; nothing else touches
/// the key, so only a flush can charge it.
#[test]
fn a_settlement_pending_across_a_configuration_change_reaches_redis() {
    let dir = scratch_dir("reload-settle");
    let redis = common::Redis::start(&dir);
    let webdis = common::Webdis::start(&dir, redis.port);
    let app = common::upstream::Upstream::start_answering(vec![b"HTTP/1.1 200 OK\r\n\
        x-usage-tokens: 40\r\ncontent-length: 4\r\nconnection: close\r\n\r\napp\n"
        .to_vec()]);
    let (listen, admin) = (free_port(), free_port());
    let lds = dir.join("lds.yaml");
    let render = |cfg: &str| {
        let yaml = render_envoy_yaml(cfg, webdis.port, listen, admin, &wasm_path(), app.port);
        lds_bootstrap(&yaml, &lds)
    };
    let (bootstrap, listener) = render(&usage_config("limited"));
    std::fs::write(&lds, listener).unwrap();
    let path = dir.join("envoy-lds.yaml");
    std::fs::write(&path, bootstrap).unwrap();
    let mut cmd = Command::new(envoy_bin());
    cmd.arg("-c").arg(&path).args([
        "--concurrency",
        "2",
        "--disable-hot-restart",
        "--drain-time-s",
        "1",
        "-l",
        "info",
    ]);
    let mut envoy = Proc::spawn("envoy", cmd, &dir.join("envoy-lds.log"));
    let stat = |name: &str| -> u64 {
        common::try_http(admin, "GET", "/stats", &[])
            .ok()
            .and_then(|r| common::envoy::stat_in(&r.body, name))
            .unwrap_or(0)
    };
    let listening = wait_until(Duration::from_secs(30), || {
        envoy.assert_running();
        matches!(common::try_http(admin, "GET", "/ready", &[]), Ok(r) if r.status == 200)
            && stat("listener_manager.lds.update_success") >= 1
            && common::port_open(listen)
    });
    assert!(listening, "envoy not ready:\n{}", envoy.log_text());

    let r = common::get(listen, "/app/chat", &[("x-user-id", "ada")]);
    assert_eq!(r.status, 200, "{r:?}\n{}", envoy.log_text());
    let cfg = tollgate_core::config::Config::try_from(usage_config("limited").as_bytes()).unwrap();
    let key = tollgate_core::rule::bucket_key(
        &cfg.key_prefix,
        "llm",
        &cfg.rules[0].key,
        &[b"ada".to_vec()],
    );
    assert_eq!(tokens_left(&redis, &key), 99, "the up-front cost only");

    let updates = stat("listener_manager.lds.update_success");
    let (_, listener) = render(&usage_config("slow down"));
    replace_file(&lds, &listener);
    let updated = wait_until(Duration::from_secs(15), || {
        stat("listener_manager.lds.update_success") > updates
    });
    assert!(
        updated,
        "the listener update was not taken:\n{}",
        envoy.log_text()
    );
    // 40 used, 1 paid up front: 39 more, once the (adopted) flush is due.
    let settled = wait_until(Duration::from_secs(30), || tokens_left(&redis, &key) <= 60);
    let log = envoy.log_text();
    assert!(
        settled,
        "the settlement never reached Redis ({} tokens left)\n{}",
        tokens_left(&redis, &key),
        common::envoy::brief_log(&log)
    );
    assert_eq!(tokens_left(&redis, &key), 60);
    assert!(
        log.contains("handed 1 of 1 pending usage settlements"),
        "the old configuration's root went before its flush:\n{}",
        common::envoy::brief_log(&log)
    );
    eprintln!("reload: the settlement pending across the configuration change reached Redis");
}
