//! The Redis the buckets live in, reached from the operator's machine: standalone or a Redis
//! Cluster (found out from the server itself), over TLS (`rediss://`) and with an ACL user and
//! password in the URL.
//!
//! Invariant: a bucket is changed only by `lua/token_bucket.lua` (EVALSHA, EVAL on NOSCRIPT), the
//! script the filter runs; reads are one atomic script run that returns the hash with the server's
//! own TIME, on the node that holds the key. Every failure is a `StoreError` that names the URL
//! without its password.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use redis::{ConnectionLike, ErrorKind, RedisError, Value};
use tollgate_core::backend::script;

/// How long to wait for a connection or an answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Where Redis is and how to trust it.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `redis://[user:password@]host:port[/db]`, or `rediss://` for TLS.
    pub url: String,
    /// PEM CA certificate that signed the server's (instead of the system's roots).
    pub ca: Option<PathBuf>,
    /// PEM client certificate and key, when the server asks for one (mutual TLS).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The database the filter keeps its buckets in, when the configuration says (the Higress
    /// build's `backend.database`): used when the URL names none, and a URL naming another is
    /// refused.
    pub database: Option<u64>,
}

/// Why Redis gave no answer.
#[derive(Debug)]
pub enum StoreError {
    BadUrl {
        url: String,
        reason: String,
    },
    Tls(String),
    Unreachable {
        url: String,
        reason: String,
    },
    Auth {
        url: String,
        reason: String,
    },
    /// Redis answered with an error.
    Refused {
        url: String,
        reason: String,
    },
    /// Redis answered something the script never returns.
    Unexpected(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::BadUrl { url, reason } => write!(
                f,
                "bad Redis URL {url:?}: {reason} (expected redis://[user:password@]host:port[/db] or rediss://… for TLS)"
            ),
            StoreError::Tls(e) => write!(f, "TLS set-up: {e}"),
            StoreError::Unreachable { url, reason } => write!(f, "cannot reach Redis at {url}: {reason}"),
            StoreError::Auth { url, reason } => write!(f, "Redis at {url} refused the credentials: {reason}"),
            StoreError::Refused { url, reason } => write!(f, "Redis at {url} answered an error: {reason}"),
            StoreError::Unexpected(e) => write!(f, "unexpected answer from Redis: {e}"),
        }
    }
}

/// The URL with its password replaced, for messages.
pub fn redacted(url: &str) -> String {
    match redis::parse_redis_url(url) {
        Some(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            // A Unix socket URL carries its password as `?pass=`.
            if u.query_pairs().any(|(k, _)| k == "pass") {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if k == "pass" {
                            "***".into()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        // Not a URL: anything up to an `@` may be credentials.
        None => match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_string(),
        },
    }
}

/// A connection to the node(s) holding the buckets.
pub enum Store {
    Single(redis::Connection, String),
    Cluster(Box<redis::cluster::ClusterConnection>, String),
}

impl Store {
    /// Connects, and switches to the Cluster protocol when the server says it is a Cluster node.
    pub fn connect(opts: &Options) -> Result<Store, StoreError> {
        let shown = redacted(&opts.url);
        let bad = |reason: String| StoreError::BadUrl {
            url: shown.clone(),
            reason,
        };
        if redis::parse_redis_url(&opts.url).is_none() {
            return Err(bad("not a redis:// or rediss:// URL".to_string()));
        }
        let mut info = redis::IntoConnectionInfo::into_connection_info(opts.url.as_str())
            .map_err(|e| bad(e.to_string()))?;
        let mut label = shown.clone();
        if let Some(database) = opts.database {
            // A TCP URL names a database by its path, a Unix socket's by `?db=`.
            let named = redis::parse_redis_url(&opts.url).is_some_and(|u| {
                if u.scheme().ends_with("unix") {
                    u.query_pairs().any(|(k, _)| k == "db")
                } else {
                    !u.path().trim_start_matches('/').is_empty()
                }
            });
            let wanted = i64::try_from(database).unwrap_or(i64::MAX);
            if named && info.redis.db != wanted {
                return Err(bad(format!(
                    "it names database {}, but the configuration keeps its buckets in database \
                     {database} (backend.database)",
                    info.redis.db
                )));
            }
            if !named && wanted != 0 {
                label = format!("{shown}, database {database}");
            }
            info.redis.db = wanted;
        }
        let certs = certificates(opts)?;
        let client = match &certs {
            Some(c) => redis::Client::build_with_tls(info.clone(), tls_copy(c)),
            None => redis::Client::open(info.clone()),
        }
        .map_err(|e| bad(e.to_string()))?;
        let mut conn = client
            .get_connection_with_timeout(TIMEOUT)
            .map_err(|e| classify(&shown, e))?;
        let _ = conn.set_read_timeout(Some(TIMEOUT));
        let _ = conn.set_write_timeout(Some(TIMEOUT));
        // A user without INFO may still run the script: then it is taken as standalone, and a
        // MOVED answer says otherwise.
        let info_text: String = redis::cmd("INFO")
            .arg("cluster")
            .query(&mut conn)
            .unwrap_or_default();
        if !info_text.contains("cluster_enabled:1") {
            return Ok(Store::Single(conn, label));
        }
        let mut builder = redis::cluster::ClusterClientBuilder::new(vec![info])
            .connection_timeout(TIMEOUT)
            .response_timeout(TIMEOUT);
        if let Some(c) = certs {
            builder = builder.certs(c);
        }
        let cluster = builder
            .build()
            .and_then(|c| c.get_connection())
            .map_err(|e| classify(&shown, e))?;
        Ok(Store::Cluster(Box::new(cluster), label))
    }

    fn conn(&mut self) -> (&mut dyn ConnectionLike, &str) {
        match self {
            Store::Single(c, url) => (c, url),
            Store::Cluster(c, url) => (&mut **c, url),
        }
    }

    /// `redis: <url without password> (standalone | Redis Cluster)`.
    pub fn describe(&self) -> String {
        match self {
            Store::Single(_, url) => format!("redis: {url} (standalone)"),
            Store::Cluster(_, url) => format!("redis: {url} (Redis Cluster)"),
        }
    }

    /// Runs the bucket script on `key` with `args` (ARGV), loading it on NOSCRIPT.
    pub fn script(&mut self, key: &str, args: &[String]) -> Result<Vec<i64>, StoreError> {
        let (conn, url) = self.conn();
        let url = url.to_string();
        let run = |conn: &mut dyn ConnectionLike, verb: &str, body: &str| {
            redis::cmd(verb)
                .arg(body)
                .arg(1)
                .arg(key)
                .arg(args)
                .query::<Value>(conn)
        };
        let reply = match run(conn, "EVALSHA", &script::sha1_hex()) {
            Err(e) if e.kind() == ErrorKind::NoScriptError => run(conn, "EVAL", script::SOURCE),
            other => other,
        }
        .map_err(|e| classify(&url, e))?;
        let Value::Array(items) = reply else {
            return Err(StoreError::Unexpected(format!("{reply:?}")));
        };
        items
            .iter()
            .map(|v| match v {
                Value::Int(i) => Ok(*i),
                other => Err(StoreError::Unexpected(format!("{other:?}"))),
            })
            .collect()
    }

    /// The server's time (µs) and every field of the hash at `key`, read together in one script
    /// run on the node that holds the key.
    pub fn snapshot(&mut self, key: &str) -> Result<(u64, Vec<(String, String)>), StoreError> {
        const READ: &str = "local t = redis.call('TIME')\n\
                            return {t[1], t[2], redis.call('HGETALL', KEYS[1])}";
        let (conn, url) = self.conn();
        let url = url.to_string();
        let reply: (String, String, Vec<(String, String)>) = redis::cmd("EVAL")
            .arg(READ)
            .arg(1)
            .arg(key)
            .query(conn)
            .map_err(|e| classify(&url, e))?;
        let (secs, micros) = (reply.0.parse::<u64>(), reply.1.parse::<u64>());
        match (secs, micros) {
            (Ok(s), Ok(us)) => Ok((s.saturating_mul(1_000_000).saturating_add(us), reply.2)),
            _ => Err(StoreError::Unexpected(format!(
                "TIME {} {}",
                reply.0, reply.1
            ))),
        }
    }
}

fn certificates(opts: &Options) -> Result<Option<redis::TlsCertificates>, StoreError> {
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|e| StoreError::Tls(format!("{}: {e}", p.display())))
    };
    let client_tls = match (&opts.cert, &opts.key) {
        (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
            client_cert: read(c)?,
            client_key: read(k)?,
        }),
        (None, None) => None,
        _ => {
            return Err(StoreError::Tls(
                "--tls-cert and --tls-key go together".to_string(),
            ))
        }
    };
    if opts.ca.is_none() && client_tls.is_none() {
        return Ok(None);
    }
    if !opts.url.starts_with("rediss://") {
        return Err(StoreError::Tls(
            "--tls-ca, --tls-cert and --tls-key need a rediss:// URL".to_string(),
        ));
    }
    let root_cert = opts.ca.as_ref().map(read).transpose()?;
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

fn tls_copy(c: &redis::TlsCertificates) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: c.client_tls.as_ref().map(|t| redis::ClientTlsConfig {
            client_cert: t.client_cert.clone(),
            client_key: t.client_key.clone(),
        }),
        root_cert: c.root_cert.clone(),
    }
}

/// A client error as the operator needs it: which of unreachable, credentials, or Redis' answer.
fn classify(url: &str, e: RedisError) -> StoreError {
    let url = url.to_string();
    let reason = e.to_string();
    if e.kind() == ErrorKind::AuthenticationFailed
        || reason.contains("WRONGPASS")
        || reason.contains("NOAUTH")
    {
        StoreError::Auth { url, reason }
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_timeout() {
        StoreError::Unreachable { url, reason }
    } else {
        StoreError::Refused { url, reason }
    }
}
