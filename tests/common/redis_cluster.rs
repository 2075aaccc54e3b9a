//! The Redis Cluster backend chain on loopback: a real Redis Cluster (cluster-enabled `redis-server`s
//! joined as masters by `redis-cli --cluster create`), Envoy's `redis_proxy` in front of it
//! (envoy/redis-cluster/envoy.yaml) and Webdis talking to that front (envoy/redis-cluster/webdis.json).
//! The shipped files are what runs: only ports and paths are filled in. Every process is stopped by
//! pid when its value is dropped; readiness is polled, never slept for.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::envoy::{brief_log, envoy_file, Envoy};
use super::webdis::Webdis;
use super::{free_port, wait_until, Proc, Redis};

/// Redis Cluster's slot count.
pub const SLOTS: u16 = 16384;

/// One line of `CLUSTER NODES`, as one node sees another.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub id: String,
    pub port: u16,
    /// e.g. `["myself", "master"]`, `["master", "fail"]`.
    pub flags: Vec<String>,
    /// Inclusive slot ranges this node serves.
    pub slots: Vec<(u16, u16)>,
}

/// A Redis Cluster of masters only, each node a [`Redis`] in its own subdirectory (for `nodes.conf`).
pub struct RedisCluster {
    pub nodes: Vec<Redis>,
}

impl RedisCluster {
    /// Starts `n` cluster-enabled nodes, joins them as `n` masters and waits until every node reports
    /// `cluster_state:ok` with all slots assigned.
    ///
    /// `cluster-require-full-coverage no`: when a master is lost, the others keep serving their own
    /// slots (the default makes every node refuse every command once one slot has no live owner).
    /// `cluster-node-timeout 2000`: a stopped master is marked `fail` within seconds.
    pub fn start(dir: &Path, n: usize) -> RedisCluster {
        let nodes: Vec<Redis> = (0..n)
            .map(|i| {
                let node_dir = dir.join(format!("redis-node-{i}"));
                std::fs::create_dir_all(&node_dir).expect("create node dir");
                Redis::start_with(
                    &node_dir,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                        "--cluster-require-full-coverage",
                        "no",
                    ],
                )
            })
            .collect();
        let cluster = RedisCluster { nodes };
        let ports: Vec<u16> = cluster.nodes.iter().map(|node| node.port).collect();
        join_as_masters(dir, &[], &ports, || cluster.logs());
        let ok = wait_until(Duration::from_secs(30), || {
            cluster.nodes.iter().all(|node| {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut node.conn())
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_slots_assigned:{SLOTS}"))
                    && info.contains(&format!("cluster_known_nodes:{n}"))
            })
        });
        assert!(ok, "cluster not ok in 30 s\n{}", cluster.logs());
        cluster
    }

    /// Every node's port, in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Whether node `port` is still running (not stopped by the test).
    pub fn is_alive(&self, port: u16) -> bool {
        self.nodes
            .iter()
            .any(|n| n.port == port && n.proc.child.is_some())
    }

    fn live(&self) -> &Redis {
        self.nodes
            .iter()
            .find(|n| n.proc.child.is_some())
            .expect("a live cluster node")
    }

    /// A plain (not cluster-aware) connection to node `port`.
    pub fn conn(&self, port: u16) -> redis::Connection {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
            .conn()
    }

    /// `CLUSTER NODES` as node `port` sees the cluster.
    pub fn view_from(&self, port: u16) -> Vec<NodeView> {
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut self.conn(port))
            .expect("CLUSTER NODES");
        text.lines().filter_map(parse_node_line).collect()
    }

    /// The port of the master serving `slot`, as a live node sees it.
    pub fn owner_of_slot(&self, slot: u16) -> u16 {
        self.view_from(self.live().port)
            .iter()
            .find(|v| v.slots.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot)))
            .map(|v| v.port)
            .unwrap_or_else(|| panic!("no node serves slot {slot}"))
    }

    /// `CLUSTER KEYSLOT key` (hash tags honoured), asked of a live node.
    pub fn keyslot(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.live().conn())
            .expect("CLUSTER KEYSLOT")
    }

    /// The port of the master that holds (or would hold) `key`.
    pub fn owner_of_key(&self, key: &str) -> u16 {
        self.owner_of_slot(self.keyslot(key))
    }

    /// `KEYS pattern` on node `port` alone (a node only knows its own keys).
    pub fn keys_on(&self, port: u16, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut self.conn(port))
            .expect("KEYS");
        keys.sort();
        keys
    }

    /// `DBSIZE` of node `port`.
    pub fn dbsize(&self, port: u16) -> u64 {
        redis::cmd("DBSIZE")
            .query(&mut self.conn(port))
            .expect("DBSIZE")
    }

    /// `CLUSTER COUNTKEYSINSLOT slot` on node `port`.
    pub fn count_keys_in_slot(&self, port: u16, slot: u16) -> u64 {
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut self.conn(port))
            .expect("CLUSTER COUNTKEYSINSLOT")
    }

    /// Kills node `port` (by pid) and reaps it.
    pub fn stop_node(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"));
        node.proc.stop();
    }

    /// Polls until every live node flags node `port` as `fail` (not just `fail?`); false after
    /// `timeout`.
    pub fn wait_marked_failed(&self, port: u16, timeout: Duration) -> bool {
        wait_until(timeout, || {
            self.nodes
                .iter()
                .filter(|n| n.proc.child.is_some())
                .all(|n| {
                    self.view_from(n.port)
                        .iter()
                        .any(|v| v.port == port && v.flags.iter().any(|f| f == "fail"))
                })
        })
    }

    /// `CLUSTER INFO`'s `cluster_state` on node `port`.
    pub fn state_on(&self, port: u16) -> String {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut self.conn(port))
            .expect("CLUSTER INFO");
        info.lines()
            .find_map(|l| l.trim().strip_prefix("cluster_state:"))
            .unwrap_or("?")
            .to_string()
    }

    /// Every node's log (for failure messages).
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- redis {} ---\n{}", n.port, n.proc.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Parses `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`.
fn parse_node_line(line: &str) -> Option<NodeView> {
    let mut fields = line.split_whitespace();
    let id = fields.next()?.to_string();
    let addr = fields.next()?;
    let port = addr
        .split(['@', ','])
        .next()?
        .rsplit_once(':')?
        .1
        .parse()
        .ok()?;
    let flags = fields.next()?.split(',').map(str::to_string).collect();
    let slots = fields
        .skip(5)
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
            None => {
                let one = s.parse().ok()?;
                Some((one, one))
            }
        })
        .collect();
    Some(NodeView {
        id,
        port,
        flags,
        slots,
    })
}

/// Renders envoy/redis-cluster/envoy.yaml: the redis_proxy listener on `listen_port`, admin on
/// `admin_port`, and the first three of `seeds` as the cluster's seed nodes.
pub fn render_redis_proxy_yaml(listen_port: u16, admin_port: u16, seeds: &[u16]) -> String {
    assert!(seeds.len() >= 3, "the template names three seed nodes");
    let mut yaml = envoy_file("redis-cluster/envoy.yaml")
        .replace("{{ADMIN_PORT}}", &admin_port.to_string())
        .replace("{{LISTEN_PORT}}", &listen_port.to_string());
    for (i, port) in seeds.iter().take(3).enumerate() {
        yaml = yaml.replace(&format!("{{{{SEED_PORT_{}}}}}", i + 1), &port.to_string());
    }
    yaml
}

/// Starts Envoy with envoy/redis-cluster/envoy.yaml in front of the cluster; ready once Envoy has the
/// topology (its /ready waits for the cluster's first CLUSTER SLOTS).
pub fn start_redis_proxy(dir: &Path, cluster: &RedisCluster) -> Envoy {
    let seeds = cluster.ports();
    Envoy::try_start_yaml(dir, |listen, admin| {
        render_redis_proxy_yaml(listen, admin, &seeds)
    })
    .unwrap_or_else(|log| panic!("redis_proxy Envoy did not start; log:\n{}", brief_log(&log)))
}

/// envoy/redis-cluster/webdis.json with only the ports and the log file changed.
pub fn render_webdis_json(redis_port: u16, http_port: u16, logfile: &Path) -> serde_json::Value {
    let text = envoy_file("redis-cluster/webdis.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&text).expect("envoy/redis-cluster/webdis.json is JSON");
    cfg["redis_port"] = redis_port.into();
    cfg["http_port"] = http_port.into();
    cfg["logfile"] = logfile.to_string_lossy().into_owned().into();
    cfg
}

/// `POST /` with `body` to Webdis on `port` (how the filter calls it); (status, body).
pub fn webdis_post(port: u16, body: &str) -> Result<(u16, String), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut resp = agent
        .post(format!("http://127.0.0.1:{port}/"))
        .send(body)
        .map_err(|e| format!("POST 127.0.0.1:{port}/: {e}"))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("POST 127.0.0.1:{port}/: reading body: {e}"))?;
    Ok((status, text))
}

/// Starts Webdis with envoy/redis-cluster/webdis.json pointed at the redis_proxy listener on
/// `redis_port`; ready when a one-key EVAL goes through Webdis, Envoy and the cluster.
pub fn start_webdis(dir: &Path, redis_port: u16) -> Webdis {
    start_webdis_ready_when(dir, redis_port, Duration::from_secs(15), |webdis| {
        matches!(
            webdis_post(webdis.port, "EVAL/return 1/1/tollgate:{ready}"),
            Ok((200, body)) if body.contains(":1}")
        )
    })
}

/// Starts Webdis with envoy/redis-cluster/webdis.json pointed at a front on `redis_port`, ready
/// when `ready` says so within `timeout`; another port when it exits early (a port taken between
/// choosing and binding it).
pub fn start_webdis_ready_when(
    dir: &Path,
    redis_port: u16,
    timeout: Duration,
    ready: impl Fn(&Webdis) -> bool,
) -> Webdis {
    let mut last = String::new();
    for _attempt in 0..3 {
        let port = free_port();
        let config_path = dir.join(format!("webdis-{port}.json"));
        let cfg = render_webdis_json(redis_port, port, &dir.join(format!("webdis-{port}.log")));
        std::fs::write(&config_path, cfg.to_string()).expect("write webdis config");
        let mut cmd = Command::new("webdis");
        cmd.arg(&config_path);
        let proc = Proc::spawn("webdis", cmd, &dir.join(format!("webdis-{port}.out")));
        let mut webdis = Webdis {
            port,
            proc,
            basic_auth: None,
        };
        let mut exited = false;
        let is_ready = wait_until(timeout, || {
            if let Some(Ok(Some(_))) = webdis.proc.child.as_mut().map(|c| c.try_wait()) {
                exited = true;
                return true;
            }
            ready(&webdis)
        });
        if is_ready && !exited {
            return webdis;
        }
        webdis.proc.stop();
        last = format!(
            "webdis on {port} {}; log:\n{}",
            if exited {
                "exited early".to_string()
            } else {
                format!("not ready in {} s", timeout.as_secs())
            },
            webdis.log_text()
        );
        if !exited {
            break;
        }
    }
    panic!("{last}");
}

/// Joins the nodes on `ports` as masters with `redis-cli <connection> --cluster create`, which
/// waits for the nodes to agree, forever if they cannot reach each other: bounded here.
pub fn join_as_masters(dir: &Path, connection: &[&str], ports: &[u16], logs: impl Fn() -> String) {
    let mut create = Command::new("redis-cli");
    create.args(connection).args(["--cluster", "create"]);
    for port in ports {
        create.arg(format!("127.0.0.1:{port}"));
    }
    create.args(["--cluster-replicas", "0", "--cluster-yes"]);
    let (status, log) = Proc::run_bounded(
        "redis-cli --cluster create",
        create,
        &dir.join("create.log"),
        Duration::from_secs(60),
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "redis-cli --cluster create failed or did not finish in 60 s ({status:?}):\n{log}\n{}",
        logs()
    );
}

/// The whole backend chain: cluster, redis_proxy front and Webdis. Drops Webdis first, then the front,
/// then the nodes.
pub struct ClusterBackend {
    pub webdis: Webdis,
    pub front: Envoy,
    pub cluster: RedisCluster,
}

impl ClusterBackend {
    /// A 3-master cluster, the front and Webdis, all ready, in `dir`.
    pub fn start(dir: &Path) -> ClusterBackend {
        let cluster = RedisCluster::start(dir, 3);
        let front = start_redis_proxy(dir, &cluster);
        let webdis = start_webdis(dir, front.listen_port);
        ClusterBackend {
            webdis,
            front,
            cluster,
        }
    }

    /// Every log of the chain.
    pub fn logs(&self) -> String {
        format!(
            "--- webdis ---\n{}\n--- redis_proxy envoy ---\n{}\n{}",
            self.webdis.log_text(),
            brief_log(&self.front.log_text()),
            self.cluster.logs()
        )
    }
}
