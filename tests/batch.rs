//! Checks of different keys sharing one script call, end to end (real Envoy, Webdis, Redis): a
//! request's several rules go out in one backend request, and checks of many keys from many
//! clients at once, batched as they come (across the proxy's two workers too), each get exactly
//! their own bucket's answer.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::HashMap;
use std::sync::Mutex;

use tollgate_e2e as common;

use common::Stack;

/// Two rules on every request, each on its own key; slow refill, so every count is exact.
const CONFIG: &str = r#"{
  "backend": { "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 2000 },
  "rules": [
    { "name": "per-user", "key": ["header:x-user"], "rate": 1, "period_ms": 3600000, "burst": 3 },
    { "name": "per-path", "key": ["path"], "rate": 1, "period_ms": 3600000, "burst": 1000000 }
  ]
}"#;

/// Script runs Redis made so far (EVALSHA and EVAL: one per backend request).
fn script_runs(conn: &mut redis::Connection) -> u64 {
    let (evalsha, eval) = common::script_calls(conn);
    evalsha + eval
}

#[test]
fn a_requests_two_rules_share_one_script_run() {
    let stack = Stack::start("batch-two-rules", CONFIG);
    let mut conn = stack.redis.conn();
    let before = script_runs(&mut conn);
    for i in 0..10 {
        let r = stack.get("/api/x", &[("x-user", &format!("user-{i}"))]);
        assert_eq!(r.status, 200, "{r:?}\n{}", stack.logs());
    }
    let runs = script_runs(&mut conn) - before;
    println!("10 requests of two rules: {runs} script runs");
    // One per request (an EVAL after a NOSCRIPT may add one); without batching, two.
    assert!((10..=11).contains(&runs), "{runs}\n{}", stack.logs());
    // Counted per check: each rule's checks (and an EVAL resend) are the script runs.
    let envoy = &stack.envoy;
    for rule in ["per-user", "per-path"] {
        let name = format!("wasmcustom.tollgate.{rule}.backend_calls");
        let calls = envoy.stat_eventually(&name, |v| v == Some(runs));
        assert_eq!(calls, Some(runs), "{rule}: one check per script run");
    }
}

#[test]
fn many_keys_from_many_clients_at_once_each_get_exactly_their_burst() {
    let stack = Stack::start("batch-many-keys", CONFIG);
    let statuses: Mutex<HashMap<String, Vec<u16>>> = Mutex::new(HashMap::new());
    // 16 clients; 64 keys; each key asked 5 times, by different clients, interleaved.
    std::thread::scope(|s| {
        for client in 0..16 {
            let (stack, statuses) = (&stack, &statuses);
            s.spawn(move || {
                for round in 0..20 {
                    let key = format!("k{}", (client * 4 + round) % 64);
                    let r = stack.get("/api/x", &[("x-user", &key)]);
                    statuses
                        .lock()
                        .unwrap()
                        .entry(key)
                        .or_default()
                        .push(r.status);
                }
            });
        }
    });
    let statuses = statuses.into_inner().unwrap();
    assert_eq!(statuses.len(), 64);
    let mut total = (0, 0);
    for (key, got) in &statuses {
        let ok = got.iter().filter(|s| **s == 200).count();
        let refused = got.iter().filter(|s| **s == 429).count();
        assert_eq!(ok + refused, got.len(), "{key}: {got:?}\n{}", stack.logs());
        assert_eq!(ok, 3.min(got.len()), "{key}: exactly its burst: {got:?}");
        total = (total.0 + ok, total.1 + refused);
    }
    let mut conn = stack.redis.conn();
    let runs = script_runs(&mut conn);
    // Counts agree with what the clients saw (the filter pushes them up to a second late).
    let envoy = &stack.envoy;
    let stat = |name: &str| {
        envoy
            .stat_value(&format!("wasmcustom.tollgate.per-user.{name}"))
            .unwrap_or(0)
    };
    // `denied` counts every denial, the deny cache's (`local_denied`) too.
    let want = (total.0 as u64, total.1 as u64);
    let got = common::eventually(|| (stat("allowed"), stat("denied")), |got| *got == want);
    println!(
        "320 requests of 64 keys: {} admitted, {} refused; {runs} script runs for {} per-user \
         checks, {} relayed between the workers",
        total.0,
        total.1,
        stat("backend_calls"),
        stat("relayed")
    );
    assert_eq!(got, want, "counters against the statuses answered");
    // Both workers had checks out at once: one's rode the other's flights.
    assert!(
        stat("relayed") > 0,
        "no check was relayed\n{}",
        stack.logs()
    );
}
