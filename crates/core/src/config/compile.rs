//! The compile step: a `Document` (what the JSON says) -> the validated `Config` for one artifact.
//!
//! Invariant: everything the document's types cannot say is checked here, and each error names
//! its field: text fields' lengths and characters,
//! defaults that depend on another field (a burst is its rate's, a fallback's period its rule's, a
//! `lease_max` its burst), a cost within every burst of its rule, exact mode for what needs a call
//! per admission, unique rule names; the normal forms of `match` (`matcher.rs`) and the key-source
//! grammar and overrides (`keys.rs`), and tiers (`tiers.rs`).

use super::artifact::Artifact;
use super::bounds::*;
use super::document as doc;
use super::error::{err, index, join, quoted, ConfigError};
use super::model::*;
use super::quota::{PeriodMs, Quota, Tokens};
use super::{keys, matcher, outcome, tiers};

/// `doc` as the configuration `artifact` runs on.
pub fn compile(doc: doc::Document, artifact: Artifact) -> Result<Config, ConfigError> {
    Ok(Config {
        backend: backend(doc.backend, artifact)?,
        key_prefix: key_prefix(doc.key_prefix)?,
        failure_mode: doc.failure_mode,
        response_headers: doc.response_headers,
        deny: deny(doc.deny)?,
        record_decisions: doc.record_decisions,
        rules: rules(doc.rules)?,
    })
}

/// RFC 9110 `tchar`: the characters of header names and methods.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

pub fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

pub fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// A non-empty string of at most `max` bytes with no control characters.
fn check_text(path: &str, s: &str, max: usize) -> Result<(), ConfigError> {
    if s.is_empty() {
        return Err(err(path, "must not be empty"));
    }
    if s.len() > max {
        return Err(err(path, format!("must be at most {max} bytes")));
    }
    if has_control(s) {
        return Err(err(path, "must not contain control characters"));
    }
    Ok(())
}

/// A header name: non-empty token characters, returned lower-cased.
pub fn header_name(path: &str, s: &str) -> Result<String, ConfigError> {
    if s.is_empty() {
        return Err(err(path, "must not be empty"));
    }
    if !is_token(s) {
        return Err(err(
            path,
            format!(
                "must be a header name of token characters (got {})",
                quoted(s)
            ),
        ));
    }
    Ok(s.to_ascii_lowercase())
}

/// `rate` tokens every `period_ms` up to `burst`, for the object at `path`.
pub fn quota(
    path: &str,
    rate: Tokens,
    period_ms: PeriodMs,
    burst: Tokens,
) -> Result<Quota, ConfigError> {
    Quota::new(rate, period_ms, burst).map_err(|e| err(join(path, "burst"), e.to_string()))
}

/// The backend: `artifact::refuse_foreign` has refused the fields of the other artifact's
/// transport, so every field given here is one `artifact` uses.
fn backend(b: doc::Backend, artifact: Artifact) -> Result<Backend, ConfigError> {
    const PATH: &str = "backend";
    let at = |name: &str| join(PATH, name);
    // Higress names a Redis service `outbound|<port>||<service>`, as its own Redis plugins take
    // it; a `.static` service listens on port 80.
    let cluster_field = if b.service_name.is_some() {
        "service_name"
    } else {
        "cluster"
    };
    let cluster = match (b.service_name, b.cluster) {
        (Some(_), Some(_)) => {
            return Err(err(
                at("service_name"),
                "give either cluster or service_name, not both",
            ))
        }
        (None, None) if b.service_port.is_some() => {
            return Err(err(at("service_port"), "needs service_name"))
        }
        (None, Some(_)) if b.service_port.is_some() => {
            return Err(err(
                at("service_port"),
                "goes with service_name, not cluster (a cluster's name says its port)",
            ))
        }
        (Some(name), None) => {
            check_text(&at("service_name"), &name, MAX_BACKEND_NAME_LEN - 16)?;
            let port = b.service_port.map_or(
                if name.ends_with(".static") {
                    DEFAULT_STATIC_PORT
                } else {
                    DEFAULT_REDIS_PORT
                },
                |p| p.get(),
            );
            format!("outbound|{port}||{name}")
        }
        (None, Some(cluster)) => {
            check_text(&at("cluster"), &cluster, MAX_BACKEND_NAME_LEN)?;
            cluster
        }
        (None, None) => DEFAULT_CLUSTER.to_owned(),
    };
    // Higress cuts the cluster at its first '?' and reads the rest as its Redis client's
    // parameters: a database chosen there would escape the password `database` needs, and
    // `buffer_flush_timeout=0` (`resp::redis_target`) would no longer be one of them.
    if artifact == Artifact::Higress && cluster.contains('?') {
        return Err(err(
            at(cluster_field),
            "must not contain '?': Higress reads what follows it as its Redis client's \
             parameters (give the database as backend.database)",
        ));
    }
    let username = redis_secret(&at("username"), b.username)?;
    let password = redis_secret(&at("password"), b.password)?;
    if username.is_some() && password.is_none() {
        return Err(err(at("username"), "needs password"));
    }
    let database = b.database.map_or(0, |d| d.get());
    if database != 0 && password.is_none() {
        return Err(err(
            at("database"),
            "other than 0 needs password (a client Higress makes anew starts in database 0, and \
             only Redis refusing it unauthenticated tells tollgate to select it again)",
        ));
    }
    let authority = match b.authority {
        Some(a) => {
            check_text(&at("authority"), &a, MAX_BACKEND_NAME_LEN)?;
            a
        }
        None => DEFAULT_AUTHORITY.to_owned(),
    };
    let basic_auth = b
        .basic_auth
        .map(|s| {
            // Never echo the value: it is a secret.
            let path = at("basic_auth");
            if s.len() > MAX_BASIC_AUTH_LEN {
                return Err(err(
                    path,
                    format!("must be at most {MAX_BASIC_AUTH_LEN} bytes"),
                ));
            }
            if has_control(&s) {
                return Err(err(path, "must not contain control characters"));
            }
            if !s.contains(':') {
                return Err(err(path, "must have the form user:pass"));
            }
            Ok(s)
        })
        .transpose()?;
    Ok(Backend {
        cluster,
        authority,
        timeout_ms: b.timeout_ms.get(),
        basic_auth,
        username,
        password,
        database,
        protocol: artifact.protocol(),
        breaker_failures: b.breaker_failures.get(),
        breaker_cooloff_ms: b.breaker_cooloff_ms.get(),
        max_inflight: b.max_inflight.get(),
        batch_max_keys: b.batch_max_keys.get(),
    })
}

/// A Redis ACL user or password: never echoed.
fn redis_secret(path: &str, s: Option<String>) -> Result<Option<String>, ConfigError> {
    let Some(s) = s else { return Ok(None) };
    if s.is_empty() {
        return Err(err(path, "must not be empty"));
    }
    if s.len() > MAX_REDIS_SECRET_LEN {
        return Err(err(
            path,
            format!("must be at most {MAX_REDIS_SECRET_LEN} bytes"),
        ));
    }
    if has_control(&s) {
        return Err(err(path, "must not contain control characters"));
    }
    Ok(Some(s))
}

/// It goes into every Redis key and names the proxy's shared-data tables.
fn key_prefix(p: String) -> Result<String, ConfigError> {
    let ok = !p.is_empty()
        && p.len() <= MAX_KEY_PREFIX_LEN
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b));
    if !ok {
        return Err(err(
            "key_prefix",
            format!(
                "must be 1 to {MAX_KEY_PREFIX_LEN} characters of [A-Za-z0-9_.:-] (got {})",
                quoted(&p)
            ),
        ));
    }
    Ok(p)
}

fn deny(d: doc::Deny) -> Result<Deny, ConfigError> {
    let status = u32::try_from(d.status.get()).map_err(|_| {
        err(
            "deny.status",
            format!("must be an integer <= {MAX_DENY_STATUS}"),
        )
    })?;
    if d.body.len() > MAX_DENY_BODY_LEN {
        return Err(err(
            "deny.body",
            format!(
                "must be at most {MAX_DENY_BODY_LEN} bytes (got {})",
                d.body.len()
            ),
        ));
    }
    Ok(Deny {
        status,
        body: d.body,
        grpc_resource_exhausted: d.grpc_resource_exhausted,
    })
}

fn rules(items: Vec<doc::Rule>) -> Result<Vec<Rule>, ConfigError> {
    if items.is_empty() {
        return Err(err("rules", "must not be empty"));
    }
    if items.len() > MAX_RULES {
        return Err(err(
            "rules",
            format!("must have at most {MAX_RULES} rules (got {})", items.len()),
        ));
    }
    let mut rules: Vec<Rule> = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let path = index("rules", i);
        let rule = rule(item, &path)?;
        if rules.iter().any(|r| r.name == rule.name) {
            return Err(err(
                join(&path, "name"),
                format!("duplicate rule name {}", quoted(&rule.name)),
            ));
        }
        rules.push(rule);
    }
    Ok(rules)
}

fn rule(r: doc::Rule, path: &str) -> Result<Rule, ConfigError> {
    let at = |name: &str| join(path, name);

    // It goes into Redis keys, headers and metric names.
    let name_ok = !r.name.is_empty()
        && r.name.len() <= MAX_RULE_NAME_LEN
        && r.name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !name_ok {
        return Err(err(
            at("name"),
            format!(
                "must be 1 to {MAX_RULE_NAME_LEN} characters of [A-Za-z0-9_-] (got {})",
                quoted(&r.name)
            ),
        ));
    }

    let matcher = matcher::compile(r.matcher, &at("match"))?;
    let key = keys::sources(&r.key, &at("key"))?;
    let limits = quota(path, r.rate, r.period_ms, r.burst.unwrap_or(r.rate))?;

    let cost = r.cost.get();
    if cost > limits.burst {
        return Err(err(
            at("cost"),
            format!("must be an integer <= {} (the rule's burst)", limits.burst),
        ));
    }
    let cost_header = r
        .cost_header
        .map(|s| header_name(&at("cost_header"), &s))
        .transpose()?;

    let lease_max = r.lease_max.map_or(limits.burst, |n| n.get());
    if lease_max > limits.burst {
        return Err(err(
            at("lease_max"),
            format!("must be an integer <= {}", limits.burst),
        ));
    }
    // Exact mode: a reservation's wait. Lease mode: how long a request waits for tokens its
    // proxy's reservation is refilling.
    let max_wait_ms = r.max_wait_ms.get();

    let fallback = r
        .fallback
        .map(|f| fallback(f, r.period_ms, cost, &at("fallback")))
        .transpose()?;
    let usage = r.usage.map(|u| usage(u, &at("usage"))).transpose()?;
    if usage.is_some() && r.mode == Mode::Lease {
        return Err(err(
            at("usage"),
            "needs \"mode\": \"exact\" (leased tokens are spent without a call, so a charge \
             could not be counted before the next admission)",
        ));
    }
    let usage = outcome::usage(usage, r.charge_on, r.mode, &at("charge_on"))?;
    let overrides = keys::overrides(
        r.overrides,
        &at("overrides"),
        (&key, matcher.path_ignore_case),
        r.period_ms,
        cost,
    )?;
    let tiers = r
        .tiers
        .map(|t| {
            let key = (&key[..], matcher.path_ignore_case);
            tiers::tiers(t, &at("tiers"), key, r.period_ms, cost)
        })
        .transpose()?;
    let penalty = r
        .penalty
        .map(|p| penalty(p, (r.mode, max_wait_ms), &at("penalty")))
        .transpose()?;

    Ok(Rule {
        name: r.name,
        matcher,
        key,
        limits,
        cost,
        cost_header,
        mode: r.mode,
        max_wait_ms,
        lease_max,
        lease_horizon_ms: r.lease_horizon_ms.get(),
        shadow: r.shadow,
        fallback,
        usage,
        overrides,
        tiers,
        penalty,
    })
}

/// Shortest default `penalty.window_ms` (an hour): "2 min, then 5, then 10" escalates within it.
const MIN_DEFAULT_PENALTY_WINDOW_MS: u64 = 3_600_000;

/// A rule's `penalty`: 1 to 8 non-decreasing durations; the window defaults to twice the longest
/// (so a client that offends again soon after its longest box still counts as a repeat) and at
/// least an hour, and must be at least the longest duration (a shorter one forgets an offence
/// before its box ends, so the next could never count as a repeat). Exact mode only.
fn penalty(
    p: doc::Penalty,
    (mode, max_wait_ms): (Mode, u64),
    path: &str,
) -> Result<crate::bucket::Penalty, ConfigError> {
    use crate::bucket::{MAX_PENALTY_STEPS, MAX_PENALTY_WINDOW_MS};
    if mode == Mode::Lease {
        return Err(err(
            path.to_string(),
            "needs \"mode\": \"exact\" (leased tokens are spent without a call, so the other \
             proxies would keep admitting a boxed client until their leases run out)",
        ));
    }
    if max_wait_ms > 0 {
        return Err(err(
            path.to_string(),
            "needs \"max_wait_ms\": 0 (a request held for its reservation would be let through \
             while its key is boxed)",
        ));
    }
    let ms: Vec<u64> = p.ms.iter().map(|d| d.get()).collect();
    if ms.is_empty() || ms.len() > MAX_PENALTY_STEPS {
        return Err(err(
            join(path, "ms"),
            format!("must list 1 to {MAX_PENALTY_STEPS} durations"),
        ));
    }
    if let Some(i) = ms.windows(2).position(|w| w.first() > w.get(1)) {
        return Err(err(
            index(&join(path, "ms"), i + 1),
            "must be at least the duration before it (a repeat offence is never boxed shorter)",
        ));
    }
    let longest = ms.last().copied().unwrap_or(1);
    let window_ms = match p.window_ms {
        Some(w) if w.get() < longest => {
            return Err(err(
                join(path, "window_ms"),
                format!(
                    "must be at least the longest duration ({longest}), or an offence is \
                     forgotten before its box ends"
                ),
            ))
        }
        Some(w) => w.get(),
        // Both bounds are constants, the lower below the upper: clamp cannot panic.
        None => longest
            .saturating_mul(2)
            .clamp(MIN_DEFAULT_PENALTY_WINDOW_MS, MAX_PENALTY_WINDOW_MS),
    };
    crate::bucket::Penalty::new(window_ms, &ms)
        .ok_or_else(|| err(path.to_string(), "is out of bounds"))
}

/// A rule's `fallback`: its `period_ms` defaults to the rule's (a fallback of `"rate": 2` on a
/// rule of 60 per minute is 2 per minute, not 2 per second), and its burst must hold the rule's
/// cost (a smaller one would deny every request while the backend is down).
fn fallback(
    f: doc::Limits,
    rule_period: PeriodMs,
    cost: u64,
    path: &str,
) -> Result<Quota, ConfigError> {
    let limits = quota(
        path,
        f.rate,
        f.period_ms.unwrap_or(rule_period),
        f.burst.unwrap_or(f.rate),
    )?;
    if limits.burst < cost {
        let defaulted = if f.burst.is_none() {
            ": burst defaults to the fallback's rate"
        } else {
            ""
        };
        return Err(err(
            join(path, "burst"),
            format!(
                "must be at least the rule's cost ({cost}), or the fallback denies every request \
                 (got {}{defaulted})",
                limits.burst
            ),
        ));
    }
    Ok(limits)
}

fn usage(u: doc::Usage, path: &str) -> Result<Usage, ConfigError> {
    let source = match (u.header, u.body_field) {
        (Some(h), None) => UsageSource::Header(header_name(&join(path, "header"), &h)?),
        (None, Some(f)) => {
            let segments: Vec<String> = f.split('.').map(str::to_owned).collect();
            let ok_segment = |seg: &String| {
                !seg.is_empty()
                    && seg.len() <= MAX_FIELD_SEGMENT_LEN
                    && seg
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
            };
            if segments.len() > MAX_FIELD_SEGMENTS || !segments.iter().all(ok_segment) {
                return Err(err(
                    join(path, "body_field"),
                    format!(
                        "must be 1 to {MAX_FIELD_SEGMENTS} dot-separated names of [A-Za-z0-9_-] \
                         (got {})",
                        quoted(&f)
                    ),
                ));
            }
            UsageSource::BodyField(segments)
        }
        _ => {
            return Err(err(
                path,
                "needs exactly one of \"header\" or \"body_field\"",
            ))
        }
    };
    Ok(Usage {
        source,
        flush_ms: u.flush_ms.get(),
        unreadable: u
            .unreadable
            .map_or(WorstCase::Recent, |n| WorstCase::Fixed(n.get())),
    })
}
