//! A Redis that requires TLS and an ACL user, and the front that reaches it: certificates made with
//! `openssl` for the test (a CA and server certificates it signs), a real `redis-server` listening on
//! a TLS port only, Envoy's `redis_proxy` rendered from envoy/redis-tls/envoy.yaml with the ACL user's
//! credentials in its environment, and Webdis from envoy/redis-cluster/webdis.json pointed at the
//! front. The shipped files are what runs: only ports, the host name and the CA file are filled in.
//! Every process is stopped by pid when its value is dropped; readiness is polled, never slept for.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::envoy::{brief_log, envoy_file, Envoy};
use super::redis_cluster::{join_as_masters, start_webdis_ready_when};
use super::webdis::Webdis;
use super::{free_port, wait_until, Proc};

/// The password of Redis' `default` user in these tests: the operator's account, used to create the
/// ACL user and to read what the filter wrote.
pub const ADMIN_PASSWORD: &str = "admin-s3cret";

/// Every `ACL SETUSER` line of docs/deploy/redis.md, as arguments, its password placeholder
/// (`><password>`) replaced by `password`.
fn documented_acl_lines(password: &str) -> Vec<Vec<String>> {
    let page = std::fs::read_to_string(super::repo_root().join("docs/deploy/redis.md")).unwrap();
    page.lines()
        .map(str::trim)
        .filter(|l| l.starts_with("ACL SETUSER "))
        .map(|l| {
            l.split_whitespace()
                .map(|a| match a {
                    "><password>" => format!(">{password}"),
                    _ => a.to_string(),
                })
                .collect()
        })
        .collect()
}

/// The `ACL SETUSER` line of docs/deploy/redis.md that creates the user (the one line that sets
/// its password), as arguments with `password`; (user name, arguments).
pub fn documented_acl(password: &str) -> (String, Vec<String>) {
    let set = format!(">{password}");
    let lines: Vec<Vec<String>> = documented_acl_lines(password)
        .into_iter()
        .filter(|l| l.contains(&set))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "docs/deploy/redis.md creates the user in one ACL SETUSER line with `><password>`: {lines:?}"
    );
    let args = lines.into_iter().next().unwrap();
    (args[2].clone(), args)
}

/// A plain (no TLS) Redis whose `default` user has password [`ADMIN_PASSWORD`], with the ACL
/// user of docs/deploy/redis.md created with `password`: the Redis, a connection as `default`
/// (to read what the user wrote), and the user's name.
pub fn redis_with_documented_user(
    dir: &Path,
    password: &str,
) -> (super::Redis, redis::Connection, String) {
    let redis = super::Redis::start_with(dir, &["--requirepass", ADMIN_PASSWORD]);
    let mut admin = redis::Client::open(format!(
        "redis://default:{ADMIN_PASSWORD}@127.0.0.1:{}/",
        redis.port
    ))
    .and_then(|c| c.get_connection())
    .unwrap_or_else(|e| panic!("connect to redis as default: {e}"));
    let (user, acl) = documented_acl(password);
    redis::cmd(&acl[0])
        .arg(&acl[1..])
        .query::<()>(&mut admin)
        .unwrap_or_else(|e| panic!("{acl:?}: {e}"));
    (redis, admin, user)
}

/// The other `ACL SETUSER` lines of docs/deploy/redis.md: what a Redis Cluster adds for the front,
/// as arguments. Each names the user that [`documented_acl`] creates.
pub fn documented_cluster_acl() -> Vec<Vec<String>> {
    let (user, _) = documented_acl("p");
    let lines: Vec<Vec<String>> = documented_acl_lines("p")
        .into_iter()
        .filter(|l| !l.iter().any(|a| a == ">p"))
        .collect();
    assert!(
        !lines.is_empty(),
        "docs/deploy/redis.md gives the cluster's ACL line"
    );
    for l in &lines {
        assert_eq!(l[2], user, "{l:?} names the user");
    }
    lines
}

/// Runs `openssl` with `args` in `dir`; panics with its output if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run openssl: {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A certificate authority made for one test: its key and self-signed certificate in `dir`.
pub struct Ca {
    dir: PathBuf,
    name: String,
    /// The CA's certificate (PEM): what a client trusts.
    pub cert: PathBuf,
}

/// A server certificate and its key (PEM files).
pub struct ServerCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    /// A new CA named `name` (files `<name>.crt`, `<name>.key` in `dir`), valid for a day.
    pub fn new(dir: &Path, name: &str) -> Ca {
        let key = format!("{name}.key");
        let cert = format!("{name}.crt");
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &key,
                "-out",
                &cert,
            ],
        );
        Ca {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            cert: dir.join(cert),
        }
    }

    /// A server certificate for the DNS name `dns` (subject and subjectAltName), signed by this CA.
    pub fn issue(&self, file: &str, dns: &str) -> ServerCert {
        let (key, csr, cert, ext) = (
            format!("{file}.key"),
            format!("{file}.csr"),
            format!("{file}.crt"),
            format!("{file}.ext"),
        );
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={dns}"),
                "-keyout",
                &key,
                "-out",
                &csr,
            ],
        );
        std::fs::write(
            self.dir.join(&ext),
            // No extendedKeyUsage: Redis Cluster nodes present theirs as client certificates too,
            // on the cluster bus.
            format!("subjectAltName=DNS:{dns}\n"),
        )
        .expect("write the extensions file");
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-days",
                "1",
                "-in",
                &csr,
                "-CA",
                &format!("{}.crt", self.name),
                "-CAkey",
                &format!("{}.key", self.name),
                "-CAcreateserial",
                "-extfile",
                &ext,
                "-out",
                &cert,
            ],
        );
        ServerCert {
            cert: self.dir.join(cert),
            key: self.dir.join(key),
        }
    }
}

/// A real `redis-server` on a TLS port only (`--port 0`: no plain-text listener), serving `cert`,
/// clients not asked for certificates (`--tls-auth-clients no`, as managed Redis services do), the
/// `default` user protected by [`ADMIN_PASSWORD`].
pub struct TlsRedis {
    pub port: u16,
    pub proc: Proc,
    /// The CA that signed the server's certificate (what `redis-cli` trusts here).
    ca: PathBuf,
}

impl TlsRedis {
    /// Starts Redis in `dir` and waits until it answers PING over TLS; retries on a fresh port when
    /// another process took the port meanwhile.
    pub fn start(dir: &Path, cert: &ServerCert, ca: &Ca) -> TlsRedis {
        Self::start_with(dir, cert, ca, &[])
    }

    /// Like [`TlsRedis::start`], with extra command-line arguments (e.g. cluster mode).
    pub fn start_with(dir: &Path, cert: &ServerCert, ca: &Ca, extra: &[&str]) -> TlsRedis {
        let mut last = String::new();
        for _attempt in 0..3 {
            let port = free_port();
            let mut cmd = Command::new("redis-server");
            cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir)
                .arg("--tls-cert-file")
                .arg(&cert.cert)
                .arg("--tls-key-file")
                .arg(&cert.key)
                .arg("--tls-ca-cert-file")
                .arg(&ca.cert)
                .args(["--tls-auth-clients", "no"])
                .args(["--requirepass", ADMIN_PASSWORD])
                .args(extra);
            let proc = Proc::spawn("redis-server", cmd, &dir.join(format!("redis-{port}.log")));
            let mut redis = TlsRedis {
                port,
                proc,
                ca: ca.cert.clone(),
            };
            let mut exited = false;
            let ready = wait_until(Duration::from_secs(10), || {
                if let Some(Ok(Some(_))) = redis.proc.child.as_mut().map(|c| c.try_wait()) {
                    exited = true;
                    return true;
                }
                redis.admin(&["PING"]).trim() == "PONG"
            });
            if ready && !exited {
                return redis;
            }
            redis.proc.stop();
            last = redis.proc.log_text();
            if !last.contains("Address already in use") {
                break;
            }
        }
        panic!("TLS redis-server did not start; log:\n{last}");
    }

    /// `redis-cli` over TLS (trusting the test's CA) as `user` with `password`; its output, error
    /// replies included (`NOPERM …`).
    pub fn cli_as(&self, user: &str, password: &str, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(&self.ca)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["--user", user, "--pass", password, "--no-auth-warning"])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run redis-cli: {e}"));
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `redis-cli` over TLS as the `default` user (the operator).
    pub fn admin(&self, args: &[&str]) -> String {
        self.cli_as("default", ADMIN_PASSWORD, args)
    }

    pub fn log_text(&self) -> String {
        self.proc.log_text()
    }
}

/// Renders envoy/redis-tls/envoy.yaml: the redis_proxy listener on `listen_port`, admin on
/// `admin_port`, Redis at `host`:`redis_port` (also the SNI and the name its certificate must
/// carry), trusting the CA bundle `ca_file`.
pub fn render_tls_front_yaml(
    listen_port: u16,
    admin_port: u16,
    host: &str,
    redis_port: u16,
    ca_file: &Path,
) -> String {
    envoy_file("redis-tls/envoy.yaml")
        .replace("{{ADMIN_PORT}}", &admin_port.to_string())
        .replace("{{LISTEN_PORT}}", &listen_port.to_string())
        .replace("{{REDIS_HOST}}", host)
        .replace("{{REDIS_PORT}}", &redis_port.to_string())
        .replace("{{CA_FILE}}", &ca_file.to_string_lossy())
}

/// What the front is given: where Redis is, whom to trust, and the ACL user's credentials (into
/// Envoy's environment as REDIS_USERNAME and REDIS_PASSWORD, as the template reads them).
pub struct FrontOpts<'a> {
    pub host: &'a str,
    pub redis_port: u16,
    pub ca_file: &'a Path,
    pub username: &'a str,
    pub password: &'a str,
}

/// Starts Envoy with envoy/redis-tls/envoy.yaml; ready when its admin /ready answers (it connects to
/// Redis only when a command comes).
pub fn start_tls_front(dir: &Path, opts: &FrontOpts) -> Envoy {
    let env = [
        ("REDIS_USERNAME", opts.username),
        ("REDIS_PASSWORD", opts.password),
    ];
    Envoy::try_start_yaml_env(dir, &env, |listen, admin| {
        render_tls_front_yaml(listen, admin, opts.host, opts.redis_port, opts.ca_file)
    })
    .unwrap_or_else(|log| panic!("redis-tls Envoy did not start; log:\n{}", brief_log(&log)))
}

/// Starts Webdis with envoy/redis-cluster/webdis.json pointed at the front on `redis_port`; ready
/// when it answers HTTP (`GET /PING`: 403, the command is not allowed), which needs no Redis, so a
/// chain whose Redis refuses the front starts too.
pub fn start_webdis(dir: &Path, redis_port: u16) -> Webdis {
    start_webdis_ready_when(dir, redis_port, Duration::from_secs(10), |webdis| {
        webdis.try_get("/PING").is_ok()
    })
}

/// The backend chain in front of a TLS Redis: the front, then Webdis. Drops Webdis first.
pub struct TlsChain {
    pub webdis: Webdis,
    pub front: Envoy,
}

impl TlsChain {
    pub fn start(dir: &Path, opts: &FrontOpts) -> TlsChain {
        let front = start_tls_front(dir, opts);
        let webdis = start_webdis(dir, front.listen_port);
        TlsChain { webdis, front }
    }

    /// A counter or gauge of the front's admin /stats (e.g. `cluster.redis.ssl.fail_verify_san`).
    pub fn front_stat(&self, name: &str) -> u64 {
        self.front.stat_value(name).unwrap_or(0)
    }

    pub fn logs(&self) -> String {
        format!(
            "--- webdis ---\n{}\n--- redis-tls front ---\n{}",
            self.webdis.log_text(),
            brief_log(&self.front.log_text())
        )
    }
}

/// A Redis Cluster of masters only over TLS: each node a [`TlsRedis`] serving the same certificate,
/// on a TLS port only, with `tls-cluster yes` (the cluster bus is TLS, and `CLUSTER SLOTS` announces
/// the TLS ports, which is what the front connects to).
pub struct TlsCluster {
    pub nodes: Vec<TlsRedis>,
}

impl TlsCluster {
    /// Starts `n` nodes, joins them as `n` masters (`redis-cli --tls --cluster create`) and waits
    /// until every node reports `cluster_state:ok` and knows the others.
    pub fn start(dir: &Path, n: usize, cert: &ServerCert, ca: &Ca) -> TlsCluster {
        let nodes: Vec<TlsRedis> = (0..n)
            .map(|i| {
                let node_dir = dir.join(format!("redis-node-{i}"));
                std::fs::create_dir_all(&node_dir).expect("create node dir");
                TlsRedis::start_with(
                    &node_dir,
                    cert,
                    ca,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                        "--cluster-require-full-coverage",
                        "no",
                        "--tls-cluster",
                        "yes",
                    ],
                )
            })
            .collect();
        let cluster = TlsCluster { nodes };
        let ports: Vec<u16> = cluster.nodes.iter().map(|node| node.port).collect();
        let ca_file = ca.cert.to_str().expect("a UTF-8 path");
        let connection = [
            "--tls",
            "--cacert",
            ca_file,
            "-a",
            ADMIN_PASSWORD,
            "--no-auth-warning",
        ];
        join_as_masters(dir, &connection, &ports, || cluster.logs());
        let ok = wait_until(Duration::from_secs(30), || {
            cluster.nodes.iter().all(|node| {
                let info = node.admin(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{n}"))
            })
        });
        assert!(ok, "TLS cluster not ok in 30 s\n{}", cluster.logs());
        cluster
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- redis {} ---\n{}", n.port, n.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// envoy/redis-cluster/envoy.yaml with the last two blocks of envoy/redis-tls/envoy.yaml's cluster
/// (`typed_extension_protocol_options` and `transport_socket`, rendered for `host` and `ca_file`)
/// added, as they are, to its `redis_cluster` cluster: what docs/deploy/redis.md tells a Redis
/// Cluster front to do.
pub fn render_tls_cluster_front_yaml(
    listen_port: u16,
    admin_port: u16,
    seeds: &[u16],
    host: &str,
    ca_file: &Path,
) -> String {
    let tls = render_tls_front_yaml(0, 0, host, 0, ca_file);
    let blocks = tls
        .find("\n    typed_extension_protocol_options:\n")
        .and_then(|at| tls.get(at + 1..))
        .expect("envoy/redis-tls/envoy.yaml: the cluster's typed_extension_protocol_options");
    assert!(
        blocks.contains("\n    transport_socket:\n"),
        "envoy/redis-tls/envoy.yaml ends with the cluster's two blocks"
    );
    let plain = super::redis_cluster::render_redis_proxy_yaml(listen_port, admin_port, seeds);
    let anchor = "    load_assignment:\n      cluster_name: redis_cluster\n";
    let at = plain
        .find(anchor)
        .expect("envoy/redis-cluster/envoy.yaml: the redis_cluster cluster's load_assignment");
    format!("{}{blocks}{}", &plain[..at], &plain[at..])
}

/// Starts Envoy with [`render_tls_cluster_front_yaml`]; ready once it has the topology (its
/// /ready waits for the first `CLUSTER SLOTS`, which it asks as the ACL user).
pub fn start_tls_cluster_front(
    dir: &Path,
    cluster: &TlsCluster,
    host: &str,
    ca_file: &Path,
    (username, password): (&str, &str),
) -> Envoy {
    let seeds = cluster.ports();
    let env = [("REDIS_USERNAME", username), ("REDIS_PASSWORD", password)];
    Envoy::try_start_yaml_env(dir, &env, |listen, admin| {
        render_tls_cluster_front_yaml(listen, admin, &seeds, host, ca_file)
    })
    .unwrap_or_else(|log| {
        panic!(
            "redis-cluster front with TLS did not start; log:\n{}\n{}",
            brief_log(&log),
            cluster.logs()
        )
    })
}
