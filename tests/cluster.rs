//! Fleet scale on Redis Cluster: two tollgate Envoys (2 workers each) share one Webdis, which talks to
//! Envoy's redis_proxy (envoy/redis-cluster/envoy.yaml) in front of a real 3-master Redis Cluster.
//! Exact mode with a slow refill makes every count exact: each key admits its burst, wherever its slot
//! lives. Then one master is killed: keys on the others go on being limited exactly, keys on it
//! follow the failure mode (`closed`: 503); and the lost master's errors (error replies from the
//! redis_proxy front, not a dead backend) never open the proxy-wide circuit breaker, so they cannot
//! spill over onto the live masters' keys. And the filter's own slot function (which groups a
//! batch's keys by slot) agrees with Redis' `CLUSTER KEYSLOT`. Needs `make setup` and `make
//! build`; run with `--nocapture` to see the figures.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_e2e as common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::envoy::brief_log;
use common::redis_cluster::ClusterBackend;
use common::{scratch_dir, try_http, Envoy};

const BURST: u64 = 3;
const USERS: usize = 30;
/// Requests per user in each round: the burst, then as many again that must be denied.
const REQUESTS: usize = 2 * BURST as usize;

/// One rule keyed on `x-user-id`, exact mode, 1 token a minute (no refill during the test), burst 3;
/// a backend failure answers 503. `backend_extra` adds backend fields (starting with a comma).
fn config(backend_extra: &str) -> String {
    format!(
        r#"{{ "backend": {{ "cluster": "tollgate_backend", "authority": "webdis", "timeout_ms": 2000
                         {backend_extra} }},
             "failure_mode": "closed",
             "rules": [ {{ "name": "per-user", "match": {{ "path_prefix": "/api/" }},
                           "key": ["header:x-user-id"], "mode": "exact",
                           "rate": 1, "period_ms": 60000, "burst": {BURST} }} ] }}"#
    )
}

/// The Redis key tollgate uses for `user` under the rule above.
fn key_of(user: &str) -> String {
    tollgate_core::rule::bucket_key(
        "tollgate",
        "per-user",
        &[tollgate_core::config::KeySource::Header("x-user-id".into())],
        &[user.as_bytes().to_vec()],
    )
}

/// Each user's requests in order, alternating between the proxies (users run in parallel threads);
/// a transport failure is recorded as status 0.
fn drive(ports: &[u16], users: &[String], requests: usize) -> BTreeMap<String, Vec<u16>> {
    let handles: Vec<_> = users
        .iter()
        .enumerate()
        .map(|(u, user)| {
            let user = user.clone();
            let ports = ports.to_vec();
            std::thread::spawn(move || {
                let statuses: Vec<u16> = (0..requests)
                    .map(|i| {
                        let port = ports[(u + i) % ports.len()];
                        try_http(port, "GET", "/api/orders", &[("x-user-id", &user)])
                            .map_or(0, |r| r.status)
                    })
                    .collect();
                (user, statuses)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

/// `n` 200s then 429s: the burst admitted, everything after it denied.
fn burst_then_denied(n: usize) -> Vec<u16> {
    (0..n)
        .map(|i| if i < BURST as usize { 200 } else { 429 })
        .collect()
}

#[test]
fn fleet_on_redis_cluster_limits_exactly_and_follows_failure_mode_for_a_lost_master() {
    let dir = scratch_dir("cluster");
    let mut backend = ClusterBackend::start(&dir);
    // Default settings, circuit breaker included: see the check at the end.
    let fleet_config = config("");
    let proxies = [
        Envoy::start(&dir, &fleet_config, backend.webdis.port),
        Envoy::start(&dir, &fleet_config, backend.webdis.port),
    ];
    let ports: Vec<u16> = proxies.iter().map(|p| p.listen_port).collect();
    let masters = backend.cluster.ports();
    let logs = |backend: &ClusterBackend| {
        let mut text = backend.logs();
        for (i, p) in proxies.iter().enumerate() {
            text.push_str(&format!(
                "\n--- tollgate envoy {i} ---\n{}",
                brief_log(&p.log_text())
            ));
        }
        text
    };
    eprintln!(
        "cluster: masters {masters:?}, redis_proxy front :{}, webdis :{}, tollgate proxies {ports:?}",
        backend.front.listen_port, backend.webdis.port
    );

    // Round 1: every user, through both proxies, lands on the master that owns its slot.
    let users: Vec<String> = (0..USERS).map(|i| format!("user-{i:02}")).collect();
    let round1 = drive(&ports, &users, REQUESTS);
    // Every status the proxies answered in this test, to check their counters against at the end.
    let mut answered: BTreeMap<u16, u64> = BTreeMap::new();
    let mut tally = |statuses: &[u16]| {
        for &s in statuses {
            *answered.entry(s).or_default() += 1;
        }
    };
    round1.values().for_each(|s| tally(s));
    let owner: BTreeMap<&str, u16> = users
        .iter()
        .map(|u| (u.as_str(), backend.cluster.owner_of_key(&key_of(u))))
        .collect();
    eprintln!("round 1: admitted / limit per key ({REQUESTS} requests each, alternating proxies)");
    for (user, statuses) in &round1 {
        eprintln!(
            "  {user} -> master :{}  admitted {}/{BURST}  statuses {statuses:?}",
            owner[user.as_str()],
            count(statuses, 200)
        );
    }
    for (user, statuses) in &round1 {
        assert_eq!(
            statuses,
            &burst_then_denied(REQUESTS),
            "{user}: exactly the burst is admitted, then 429\n{}",
            logs(&backend)
        );
    }

    // Where the keys really are: each node's own KEYS, DBSIZE and COUNTKEYSINSLOT.
    eprintln!("keys per master after round 1:");
    let mut found: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    for &port in &masters {
        let keys = backend.cluster.keys_on(port, "tollgate:*");
        let dbsize = backend.cluster.dbsize(port);
        let mut slots: Vec<u16> = keys.iter().map(|k| backend.cluster.keyslot(k)).collect();
        slots.sort_unstable();
        slots.dedup();
        let in_slots: u64 = slots
            .iter()
            .map(|&s| backend.cluster.count_keys_in_slot(port, s))
            .sum();
        let (evalsha, eval) = common::script_calls(&mut backend.cluster.conn(port));
        eprintln!(
            "  master :{port}  keys {}  DBSIZE {dbsize}  COUNTKEYSINSLOT sum {in_slots} over {} slots  \
             calls: EVALSHA {evalsha}, EVAL {eval}",
            keys.len(),
            slots.len()
        );
        assert!(
            eval >= 1,
            "NOSCRIPT is per node: :{port} needed the EVAL fallback"
        );
        assert!(
            !keys.is_empty(),
            "master :{port} got no key: keys are not spread"
        );
        assert_eq!(dbsize, keys.len() as u64, "only bucket keys on :{port}");
        assert_eq!(in_slots, keys.len() as u64, "slot counts on :{port}");
        for k in keys {
            found.entry(k).or_default().push(port);
        }
    }
    assert_eq!(found.len(), USERS, "one key per user: {found:?}");
    for user in &users {
        assert_eq!(
            found.get(&key_of(user)),
            Some(&vec![owner[user.as_str()]]),
            "{user}'s key lives only on the master that owns its slot"
        );
    }

    // Kill one master and wait until the others have marked it failed.
    let victim = masters[0];
    let survivors: Vec<u16> = masters.iter().copied().filter(|&p| p != victim).collect();
    backend.cluster.stop_node(victim);
    assert!(
        backend
            .cluster
            .wait_marked_failed(victim, Duration::from_secs(30)),
        "the survivors never flagged :{victim} as failed\n{}",
        logs(&backend)
    );
    let states: Vec<String> = survivors
        .iter()
        .map(|&p| format!(":{p} cluster_state:{}", backend.cluster.state_on(p)))
        .collect();
    eprintln!("stopped master :{victim}; survivors see it as failed; {states:?}");

    // Round 2: new users. On the survivors: burst then 429, exactly as before. On the stopped
    // master: the failure mode (closed: 503 with Retry-After: 1), never an admission.
    let late: Vec<String> = (0..USERS).map(|i| format!("late-{i:02}")).collect();
    let late_owner: BTreeMap<&str, u16> = late
        .iter()
        .map(|u| (u.as_str(), backend.cluster.owner_of_key(&key_of(u))))
        .collect();
    let round2 = drive(&ports, &late, REQUESTS);
    round2.values().for_each(|s| tally(s));
    let (mut on_victim, mut on_survivors) = (0usize, 0usize);
    eprintln!("round 2 (new users, after the stop):");
    for (user, statuses) in &round2 {
        let port = late_owner[user.as_str()];
        eprintln!(
            "  {user} -> master :{port}{}  admitted {}  statuses {statuses:?}",
            if port == victim { " (stopped)" } else { "" },
            count(statuses, 200)
        );
    }
    for (user, statuses) in &round2 {
        if late_owner[user.as_str()] == victim {
            on_victim += 1;
            assert_eq!(
                statuses,
                &vec![503; REQUESTS],
                "{user}: its master is gone, failure_mode closed answers 503\n{}",
                logs(&backend)
            );
        } else {
            on_survivors += 1;
            assert_eq!(
                statuses,
                &burst_then_denied(REQUESTS),
                "{user}: its master is alive, limits hold exactly\n{}",
                logs(&backend)
            );
        }
    }
    assert!(
        on_victim > 0 && on_survivors > 0,
        "round 2 covers both kinds of key"
    );
    let victim_user = late
        .iter()
        .find(|u| late_owner[u.as_str()] == victim)
        .unwrap();
    let r = proxies[0].get("/api/orders", &[("x-user-id", victim_user)]);
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    tally(&[r.status]);
    for &port in &survivors {
        let keys = backend.cluster.keys_on(port, "tollgate:{per-user:*");
        for user in late.iter().filter(|u| late_owner[u.as_str()] == port) {
            assert!(keys.contains(&key_of(user)), "{user}'s key is on :{port}");
        }
    }

    // Round 1's users once more: still limited on the survivors; on the stopped master either a
    // known denial answered by the proxy's deny cache (429) or the failure mode (503), never 200.
    let again = drive(&ports, &users, 2);
    again.values().for_each(|s| tally(s));
    let mut old_victim = BTreeMap::<u16, usize>::new();
    let mut old_survivor = BTreeMap::<u16, usize>::new();
    for (user, statuses) in &again {
        let on_victim = owner[user.as_str()] == victim;
        for &s in statuses {
            *if on_victim {
                old_victim.entry(s).or_default()
            } else {
                old_survivor.entry(s).or_default()
            } += 1;
        }
        if on_victim {
            assert!(
                statuses.iter().all(|s| [429, 503].contains(s)),
                "{user} on the stopped master: {statuses:?}"
            );
        } else {
            assert_eq!(statuses, &vec![429; 2], "{user} stays limited");
        }
    }
    eprintln!(
        "round 1 users again (2 requests each): on survivors {old_survivor:?}, on the stopped master {old_victim:?}"
    );
    // The lost master's keys fail with error replies from the redis_proxy front: the backend is
    // reachable, so the proxy-wide breaker must not open. Far more than its threshold (5) of such
    // failures in a row on one proxy, then a fresh key on a live master is still limited exactly.
    let threshold = usize::try_from(tollgate_core::config::DEFAULT_BREAKER_FAILURES).unwrap();
    let pick = |prefix: &str, on_victim: bool, n: usize| -> Vec<String> {
        let users: Vec<String> = (0..1000)
            .map(|i| format!("{prefix}-{i:02}"))
            .filter(|u| (backend.cluster.owner_of_key(&key_of(u)) == victim) == on_victim)
            .take(n)
            .collect();
        assert_eq!(users.len(), n, "{prefix}: not enough keys of that kind");
        users
    };
    let doomed = pick("streak-lost", true, threshold * 3);
    let alive = pick("streak-live", false, 1).remove(0);
    for user in &doomed {
        let r = proxies[0].get("/api/orders", &[("x-user-id", user)]);
        assert_eq!(r.status, 503, "{user}: {r:?}");
        tally(&[r.status]);
    }
    let after: Vec<u16> = (0..=BURST)
        .map(|_| {
            proxies[0]
                .get("/api/orders", &[("x-user-id", &alive)])
                .status
        })
        .collect();
    tally(&after);
    let mut want = vec![200u16; usize::try_from(BURST).unwrap()];
    want.push(429);
    assert_eq!(
        after,
        want,
        "{alive} on a live master, after {} failures in a row for the lost master's keys\n{}",
        doomed.len(),
        brief_log(&proxies[0].log_text())
    );
    let log = proxies[0].log_text();
    assert!(!log.contains("circuit open"), "{}", brief_log(&log));
    assert!(
        log.contains("tollgate: backend error"),
        "{}",
        brief_log(&log)
    );
    eprintln!(
        "after {} failed calls in a row for the lost master's keys, {alive} (on a live master) got {after:?}",
        doomed.len()
    );

    // Envoy puts the filter's metrics under its `wasmcustom.` stat namespace.
    let stat = |name: &str| -> u64 {
        proxies
            .iter()
            .map(|p| {
                p.stat_value(&format!("wasmcustom.tollgate.per-user.{name}"))
                    .unwrap_or(0)
            })
            .sum()
    };
    // The proxies' counters agree with what the clients saw: each 200 an allowed check; each 429
    // a denied one, and each 503 too (failure mode closed denies), after a failed backend call
    // (one call per request: no two requests of a key are ever in flight together here). The
    // filter pushes its counts up to a second late.
    let seen = |status: u16| answered.get(&status).copied().unwrap_or(0);
    let want = [
        ("allowed", seen(200)),
        ("denied", seen(429) + seen(503)),
        ("backend_errors", seen(503)),
    ];
    let counters = common::eventually(
        || want.map(|(name, _)| (name, stat(name))),
        |got| *got == want,
    );
    eprintln!(
        "proxy counters (both proxies): {counters:?}, local_denied {}, backend_calls {}; statuses answered {answered:?}",
        stat("local_denied"),
        stat("backend_calls"),
    );
    assert_eq!(counters, want, "counters against the statuses answered");
    eprintln!(
        "summary: {USERS} keys before the stop spread {:?} over masters {masters:?}; after stopping :{victim}, {on_survivors} new keys on survivors admitted exactly {BURST} each, {on_victim} new keys on :{victim} got 503",
        masters
            .iter()
            .map(|m| owner.values().filter(|&&o| o == *m).count())
            .collect::<Vec<_>>()
    );
}

/// `backend::slot`, which keeps a batch sent to a Cluster within one slot, is what a cluster-enabled
/// Redis answers to `CLUSTER KEYSLOT` for tollgate's keys and for keys with every shape of hash tag
/// (one node: KEYSLOT needs no slots assigned).
#[test]
fn the_filters_slot_is_cluster_keyslot() {
    let dir = scratch_dir("cluster-keyslot");
    let redis = common::Redis::start_with(&dir, &["--cluster-enabled", "yes"]);
    let mut conn = redis.conn();
    let mut keys: Vec<String> = (0..500).map(|u| key_of(&format!("user-{u}"))).collect();
    let parts = [
        "", "{", "}", "{}", "a", "{a}", "}{", "user1000", ":", "é", "{{b}}",
    ];
    for a in parts {
        for b in parts {
            for c in parts {
                keys.push(format!("{a}{b}{c}"));
            }
        }
    }
    let mut differ = Vec::new();
    for key in &keys {
        let want: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .unwrap();
        let got = tollgate_core::backend::slot(key);
        if got != want {
            differ.push((key.clone(), got, want));
        }
    }
    assert!(differ.is_empty(), "(key, ours, Redis'): {differ:?}");
    println!("{} keys: the same slot as CLUSTER KEYSLOT", keys.len());
}
