//! `tollgate`: check a configuration, explain a request, inspect, reset or credit a bucket.
//!
//! Invariant: every answer comes from the core's own code (configuration, matching, keys, the
//! bucket model) and every change to a bucket from `lua/token_bucket.lua`, so the command can
//! never disagree with the filter. Exit status: 0 done, 1 the configuration or Redis refused,
//! 2 a usage error (clap's).
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod around;
mod describe;
mod envoy;
mod explain;
mod load;
mod metadata;
mod request;
mod state;
mod store;
mod target;

use std::io::Write;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tollgate_core::bucket::Operation;
use tollgate_core::config::{Artifact, KeySource};

use load::{load, Loaded};
use request::Described;
use store::{Options, Store};
use target::target;

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "Check, explain, inspect, reset and credit tollgate rate limits"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration offline, with the filter's messages, and summarise each rule.
    Check {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Which rules apply to a request, the key values each reads, its bucket and cost.
    Explain {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        request: RequestArgs,
    },
    /// A bucket's state in Redis: tokens now, debt, leases, time until full.
    Inspect {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        bucket: BucketArgs,
        #[command(flatten)]
        redis: RedisArgs,
    },
    /// Refill one bucket, atomically, through the filter's script: it holds burst again, less the
    /// tokens proxies hold on lease and the tokens reserved by held requests.
    Reset {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        bucket: BucketArgs,
        #[command(flatten)]
        redis: RedisArgs,
    },
    /// Give one bucket N more tokens, atomically, through the filter's script (debt is repaid
    /// first; never past burst less what is on lease).
    Credit {
        /// Tokens to add: 1 to 1000000000, the largest burst a rule can have.
        #[arg(value_parser = clap::value_parser!(u64).range(1..=tollgate_core::bucket::MAX_RATE))]
        tokens: u64,
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        bucket: BucketArgs,
        #[command(flatten)]
        redis: RedisArgs,
    },
}

#[derive(Args)]
struct ConfigArg {
    /// The configuration: JSON, or an Istio WasmPlugin / TrafficExtension or Higress WasmPlugin
    /// manifest (YAML).
    config: PathBuf,
    /// The artifact that loads it (default: higress for a Higress manifest, envoy otherwise).
    #[arg(long, value_enum)]
    artifact: Option<ArtifactArg>,
}

#[derive(Clone, Copy, ValueEnum)]
enum ArtifactArg {
    /// tollgate.wasm (Envoy, Istio): Webdis.
    Envoy,
    /// tollgate-higress.wasm: Redis callouts.
    Higress,
}

#[derive(Args)]
struct RequestArgs {
    #[arg(long, default_value = "GET")]
    method: String,
    /// The path as sent, with its query.
    #[arg(long, default_value = "/")]
    path: String,
    /// The :authority (host[:port]).
    #[arg(long)]
    host: Option<String>,
    /// A header line, `name: value` (repeat for more; a repeated name is two lines).
    #[arg(long = "header", short = 'H', value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// The client's address as Envoy sees it (source.address).
    #[arg(long = "client-ip", value_name = "ADDRESS")]
    client_ip: Option<String>,
    /// Dynamic metadata of one namespace, `NAMESPACE=JSON object`, e.g.
    /// envoy.filters.http.jwt_authn='{"payload":{"sub":"alice"}}' (repeat per namespace).
    #[arg(long = "metadata", value_name = "NAMESPACE=JSON")]
    metadata: Vec<String>,
    /// An Envoy attribute, `path=value`, e.g. connection.uri_san_peer_certificate=spiffe://… .
    #[arg(long = "property", value_name = "PATH=VALUE")]
    properties: Vec<String>,
}

#[derive(Args)]
struct BucketArgs {
    /// The rule's name.
    #[arg(long, required_unless_present = "bucket")]
    rule: Option<String>,
    /// The key values, one per key source of the rule in order (literal: sources excepted), as
    /// `explain` prints them (what the filter reads: a client address, a JWT claim, a header
    /// value, a cookie or query parameter decoded); none for a rule without key or with only
    /// literal: sources.
    #[arg(long = "key", value_name = "VALUE", num_args = 1.., requires = "rule")]
    keys: Vec<String>,
    /// Or the bucket key itself, as `explain` prints it (`<prefix>:{<rule>:<digest>}`): also
    /// names a rule's bucket for ambiguous requests, which no key value does.
    #[arg(long, value_name = "KEY", conflicts_with_all = ["rule", "keys"])]
    bucket: Option<String>,
}

impl BucketArgs {
    /// The bucket these arguments name in `config`.
    fn target<'c>(
        &self,
        config: &'c tollgate_core::config::Config,
    ) -> Result<target::Target<'c>, Failed> {
        let named = match (&self.bucket, &self.rule) {
            (Some(key), _) => target::by_key(config, key),
            (None, Some(rule)) => target(config, rule, &self.keys),
            (None, None) => {
                return Err(Failed(
                    "name a bucket: --rule and --key, or --bucket".to_string(),
                ))
            }
        };
        named.map_err(|e| Failed(e.to_string()))
    }
}

#[derive(Args)]
struct RedisArgs {
    /// redis://[user:password@]host:port[/db], rediss:// for TLS; a Cluster is found out by itself.
    #[arg(
        long,
        env = "TOLLGATE_REDIS",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    redis: String,
    /// PEM CA certificate to trust for rediss:// (default: the system's roots).
    #[arg(long = "tls-ca", value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// PEM client certificate, when Redis asks for one.
    #[arg(long = "tls-cert", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// PEM client key.
    #[arg(long = "tls-key", value_name = "FILE")]
    tls_key: Option<PathBuf>,
}

/// A failure, already worded for the operator.
struct Failed(String);

fn main() -> ExitCode {
    // redis-rs leaves rustls' cryptography to the application.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(lines) => {
            // A reader that stops early (`tollgate check … | head -2`) is not an error of ours.
            let mut out = std::io::stdout().lock();
            for line in lines {
                if writeln!(out, "{line}").is_err() {
                    break;
                }
            }
            ExitCode::SUCCESS
        }
        Err(Failed(message)) => {
            eprintln!("tollgate: {message}");
            ExitCode::from(1)
        }
    }
}

fn run(command: Command) -> Result<Vec<String>, Failed> {
    match command {
        Command::Check { config } => {
            let loaded = configured(&config)?;
            let artifact = match loaded.artifact {
                Artifact::Envoy => "tollgate.wasm",
                Artifact::Higress => "tollgate-higress.wasm",
            };
            let mut out = vec![format!(
                "ok: {} ({}), for {artifact}",
                config.config.display(),
                loaded.origin
            )];
            out.extend(describe::summary(&loaded.config));
            if let Some(bootstrap) = &loaded.bootstrap {
                out.extend(around::warnings(&loaded.config, bootstrap));
            }
            Ok(out)
        }
        Command::Explain { config, request } => {
            let loaded = configured(&config)?;
            let req = described(&request)?;
            Ok(explain::explain(&loaded.config, &req))
        }
        Command::Inspect {
            config,
            bucket,
            redis,
        } => {
            let loaded = configured(&config)?;
            let t = bucket.target(&loaded.config)?;
            let mut store = connect(&redis, &loaded)?;
            let (now, fields) = store.snapshot(&t.key).map_err(|e| Failed(e.to_string()))?;
            let mut out = vec![store.describe()];
            out.extend(state::report(&t, now, &fields));
            Ok(out)
        }
        Command::Reset {
            config,
            bucket,
            redis,
        } => operate(&config, &bucket, &redis, Operation::Reset),
        Command::Credit {
            tokens,
            config,
            bucket,
            redis,
        } => match NonZeroU64::new(tokens) {
            Some(n) => operate(&config, &bucket, &redis, Operation::Credit(n)),
            None => Err(Failed("credit: at least 1 token".to_string())),
        },
    }
}

fn configured(arg: &ConfigArg) -> Result<Loaded, Failed> {
    let artifact = arg.artifact.map(|a| match a {
        ArtifactArg::Envoy => Artifact::Envoy,
        ArtifactArg::Higress => Artifact::Higress,
    });
    load(&arg.config, artifact).map_err(|e| Failed(e.to_string()))
}

/// The Redis of `loaded`'s buckets: for the Higress build, in the database its
/// `backend.database` names (Higress selects it on each connection); Webdis keeps its own.
fn connect(args: &RedisArgs, loaded: &Loaded) -> Result<Store, Failed> {
    Store::connect(&Options {
        url: args.redis.clone(),
        ca: args.tls_ca.clone(),
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
        database: (loaded.artifact == Artifact::Higress).then_some(loaded.config.backend.database),
    })
    .map_err(|e| Failed(e.to_string()))
}

/// A reset or a credit through the script, then the bucket as it is after it.
fn operate(
    config: &ConfigArg,
    bucket: &BucketArgs,
    redis: &RedisArgs,
    op: Operation,
) -> Result<Vec<String>, Failed> {
    let loaded = configured(config)?;
    let t = bucket.target(&loaded.config)?;
    let mut store = connect(redis, &loaded)?;
    let l = t.limits;
    let mut args = vec![
        l.burst.to_string(),
        l.rate.to_string(),
        l.period_ms.to_string(),
        "0".to_string(),
        op.argument(),
        // What the filter's calls carry: a shadow rule holds no request, so nothing of its debt
        // is reserved.
        describe::held_ms(t.rule).to_string(),
    ];
    // A penalty rule's operation carries its penalty, as the filter's calls do: a credit that
    // fills the bucket must not delete a boxed key.
    if let Some(p) = &t.rule.penalty {
        let mut arg = Vec::new();
        p.push_argument(&mut arg);
        args.extend([
            "0".to_string(),
            "time".to_string(),
            String::from_utf8_lossy(&arg).into_owned(),
        ]);
    }
    let reply = store
        .script(&t.key, &args)
        .map_err(|e| Failed(e.to_string()))?;
    let ([1, remaining, _, _, _] | [1, remaining, _, _, _, 0]) = reply.as_slice() else {
        return Err(Failed(format!(
            "unexpected reply from the script: {reply:?}"
        )));
    };
    let done = match op {
        Operation::Reset => format!("reset: {remaining} tokens now"),
        Operation::Credit(n) => {
            format!("credited {n} tokens (up to what the bucket can hold): {remaining} tokens now")
        }
    };
    let (now, fields) = store.snapshot(&t.key).map_err(|e| Failed(e.to_string()))?;
    let mut out = vec![store.describe(), done];
    out.extend(state::report(&t, now, &fields));
    Ok(out)
}

/// The request a description says.
fn described(args: &RequestArgs) -> Result<Described, Failed> {
    let mut req = Described::default();
    req.line(":method", args.method.as_bytes());
    req.line(":path", args.path.as_bytes());
    if let Some(host) = &args.host {
        req.line(":authority", host.as_bytes());
    }
    let mut scheme = false;
    for h in &args.headers {
        // A pseudo-header (`:scheme: https`) keeps its leading colon.
        let (colon, rest) = match h.strip_prefix(':') {
            Some(rest) => (":", rest),
            None => ("", h.as_str()),
        };
        let Some((name, value)) = rest.split_once(':') else {
            return Err(Failed(format!("--header {h:?}: expected NAME: VALUE")));
        };
        let name = format!("{colon}{}", name.trim().to_ascii_lowercase());
        // Envoy keeps a request's `Host` as `:authority`: the filter never sees a `host` line.
        let name = if name == "host" {
            ":authority".to_string()
        } else {
            name
        };
        scheme |= name == ":scheme";
        req.line(&name, value.as_bytes());
    }
    // Envoy always gives a request its scheme: `http` on a listener without TLS.
    if !scheme {
        req.line(":scheme", b"http");
    }
    if let Some(ip) = &args.client_ip {
        req.client_ip(ip);
    }
    let mut namespaces = Vec::new();
    for m in &args.metadata {
        let Some((ns, json)) = m.split_once('=') else {
            return Err(Failed(format!("--metadata {m:?}: expected NAMESPACE=JSON")));
        };
        match serde_json::from_str::<serde_json::Value>(json) {
            Ok(serde_json::Value::Object(fields)) => namespaces.push((ns.to_string(), fields)),
            Ok(_) => {
                return Err(Failed(format!(
                    "--metadata {ns}: the value must be a JSON object"
                )))
            }
            Err(e) => return Err(Failed(format!("--metadata {ns}: not JSON: {e}"))),
        }
    }
    if !namespaces.is_empty() {
        req.metadata(metadata::encode(&namespaces));
    }
    for p in &args.properties {
        let Some((path, value)) = p.split_once('=') else {
            return Err(Failed(format!("--property {p:?}: expected PATH=VALUE")));
        };
        if let Some(instead) = read_from_the_request(path) {
            return Err(Failed(format!(
                "--property {path}: the filter reads it from the request itself: give {instead}"
            )));
        }
        req.property(path, value);
    }
    Ok(req)
}

/// The option that gives attribute `path`, if the filter reads that attribute from the request's
/// line or headers rather than from Envoy (a `--property` for it would be ignored).
fn read_from_the_request(path: &str) -> Option<String> {
    use tollgate_core::rule::{reads_the_method, reads_the_path, request_header};
    let parts: Vec<String> = path.split('.').map(str::to_string).collect();
    let header = request_header(&parts);
    let source = KeySource::Property {
        spelled: path.to_string(),
        path: parts,
    };
    if reads_the_path(&source).is_some() {
        return Some("--path".to_string());
    }
    if reads_the_method(&source) {
        return Some("--method".to_string());
    }
    header.map(|header| match header.as_str() {
        ":authority" | "host" => "--host".to_string(),
        _ => format!("-H '{header}: VALUE'"),
    })
}
