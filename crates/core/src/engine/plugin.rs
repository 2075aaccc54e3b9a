//! The configuration plus what is derived from it once per configure, and the pure decisions
//! about one request: its cost, each rule's outcome, and the verdict that combines them.
//!
//! Invariant: a request is admitted only if every enforced (non-shadow) rule that matched admits
//! it; the cost a rule charges is never below the rule's `cost`.

use crate::backend::{Reply, ScriptCall, Transport};
use crate::bucket::Limits;
use crate::config::{Config, HeaderStyle, Mode, Protocol, Rule};
use crate::headers::{self, Report};
use crate::metrics::{Batched, Counter, Metrics, NoMetrics};
use crate::rule::{KeyCache, RequestView};

/// gRPC status codes used in local replies.
pub const GRPC_RESOURCE_EXHAUSTED: u32 = 8;
pub const GRPC_UNAVAILABLE: u32 = 14;

pub struct Plugin {
    pub config: Config,
    pub transport: Box<dyn Transport>,
    /// Prefix of this plugin's shared-data keys (Istio gives all plugins of a proxy one namespace).
    pub ns: String,
    /// The metrics given to [`Plugin::with_metrics`], their counts batched: the engine flushes
    /// them when due.
    pub metrics: Batched,
    /// Each rule's `RateLimit-Policy` value under its own limits (constant per configuration).
    policies: Vec<String>,
}

/// How the configuration's script calls travel: Webdis over HTTP, or RESP through Higress' Redis
/// callouts.
fn transport(config: &Config) -> Box<dyn Transport> {
    match config.backend.protocol {
        Protocol::Resp => Box::new(crate::backend::resp::Resp::new()),
        Protocol::Webdis => Box::new(crate::backend::webdis::Webdis::new(
            &config.backend.authority,
            config.backend.basic_auth.as_deref(),
        )),
    }
}

impl Plugin {
    pub fn new(config: Config) -> Plugin {
        Self::with_metrics(config, Box::new(NoMetrics))
    }

    pub fn with_metrics(config: Config, metrics: Box<dyn Metrics>) -> Plugin {
        let transport = transport(&config);
        Self::with_transport(config, metrics, transport)
    }

    /// With a transport of the caller's choosing instead of this build's (tests of the engine
    /// speak Webdis whichever build they run in).
    pub fn with_transport(
        config: Config,
        metrics: Box<dyn Metrics>,
        transport: Box<dyn Transport>,
    ) -> Plugin {
        let rules = config.rules.len();
        // "v3": the shared-data layout (set-associative leases of 12 fields, one health value);
        // a module upgrade in place starts with fresh tables instead of misreading old ones.
        let ns = format!("tollgate|v3|{}", config.key_prefix);
        let policies = config
            .rules
            .iter()
            .map(|r| headers::policy(&r.name, &r.limits))
            .collect();
        Plugin {
            config,
            transport,
            ns,
            metrics: Batched::new(metrics, rules),
            policies,
        }
    }

    pub fn rule(&self, idx: usize) -> Option<&Rule> {
        self.config.rules.get(idx)
    }

    /// What rule `idx` means for `req` (`keys`: this worker's cache of bucket keys).
    pub fn check_for(&self, idx: usize, req: &dyn RequestView, keys: &mut KeyCache) -> Plan {
        let Some(rule) = self.rule(idx) else {
            return Plan::Skip;
        };
        let Some(applied) = crate::rule::applies(&self.config.key_prefix, (idx, rule), req, keys)
        else {
            return Plan::Skip;
        };
        if applied.ambiguous {
            self.metrics.count(idx, Counter::Ambiguous, 1);
        }
        if applied.unlimited {
            return Plan::Unlimited;
        }
        let limits = applied.limits;
        let cost = match cost_of(rule, &limits, req) {
            Ok(c) => c,
            Err(e) => return Plan::BadCost(e),
        };
        let call = ScriptCall {
            // A shadow rule never holds a request.
            max_wait_ms: if rule.shadow { 0 } else { rule.max_wait_ms },
            ..ScriptCall::new(applied.key, &limits, cost)
        };
        Plan::Check(call, rule.mode == Mode::Lease)
    }

    /// Writes the headers of an admitted request's response into `buf` (the rule's policy value
    /// comes from the configuration's, unless an override changed its limits).
    pub fn write_headers(&self, shown: &Shown, buf: &mut String) -> headers::Written {
        let admit = shown
            .admit
            .and_then(|a| Some((a, self.rule(a.rule)?, self.policies.get(a.rule)?)));
        let report = admit.map(|(a, rule, _)| Report {
            rule: &rule.name,
            limits: a.limits,
            remaining: a.remaining,
            reset_ms: a.reset_ms,
        });
        let policy = admit
            .filter(|(a, rule, _)| a.limits == rule.limits)
            .map(|(_, _, p)| p.as_str());
        let style = self.config.response_headers;
        headers::write(style, report.as_ref(), policy, shown.delay_ms, buf)
    }

    /// Counts one check's outcome: exactly one of allowed / denied / shadow_denied, plus where it
    /// came from.
    pub fn count(&self, rule_idx: usize, (outcome, source): (Outcome, Source)) {
        let shadow = self.rule(rule_idx).is_some_and(|r| r.shadow);
        let m = &self.metrics;
        match outcome {
            Outcome::Reserved { delay_ms, .. } => {
                m.count(rule_idx, Counter::Allowed, 1);
                m.count(rule_idx, Counter::Delayed, 1);
                m.count(rule_idx, Counter::DelayMs, delay_ms);
            }
            Outcome::Allowed { .. } | Outcome::FailOpen => {
                m.count(rule_idx, Counter::Allowed, 1);
                match source {
                    Source::Local => m.count(rule_idx, Counter::LocalAllowed, 1),
                    Source::Failure => m.count(rule_idx, Counter::FailureModeAllowed, 1),
                    Source::Backend => {}
                }
            }
            Outcome::Denied { .. } | Outcome::FailClosed => {
                let denied = if shadow {
                    Counter::ShadowDenied
                } else {
                    Counter::Denied
                };
                m.count(rule_idx, denied, 1);
                if source == Source::Local {
                    m.count(rule_idx, Counter::LocalDenied, 1);
                }
            }
        }
    }
}

/// What one rule means for a request.
#[derive(Debug)]
pub enum Plan {
    /// Its match fails or a key source is missing.
    Skip,
    /// An override says this key is not limited: admitted without a call, still counted.
    Unlimited,
    /// Its cost is unusable: the request is refused.
    BadCost(CostError),
    /// Check this script call (a lease rule when the flag is set). The call carries the key's
    /// effective limits (the rule's, or an override's).
    Check(ScriptCall, bool),
}

/// How one rule decided (or failed to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed {
        remaining: u64,
        reset_ms: u64,
    },
    Denied {
        retry_ms: u64,
    },
    /// Admitted on tokens reserved from the future: hold the request `delay_ms` first.
    Reserved {
        delay_ms: u64,
        reset_ms: u64,
    },
    /// The backend failed and the failure mode admits / refuses.
    FailOpen,
    FailClosed,
}

impl Outcome {
    /// An admission on leased tokens.
    pub fn leased(s: crate::shared::lease::Spent) -> Outcome {
        Outcome::Allowed {
            remaining: s.remaining,
            reset_ms: s.reset_ms,
        }
    }

    /// What a script reply means for a check (a denial's retry is never negative: -1 only comes
    /// for a cost above the burst, which the engine refuses before calling).
    pub fn of_reply(r: &Reply) -> Outcome {
        match r {
            r if r.allowed && r.retry_after_ms > 0 => Outcome::Reserved {
                delay_ms: u64::try_from(r.retry_after_ms).unwrap_or(0),
                reset_ms: r.reset_after_ms,
            },
            r if r.allowed => Outcome::Allowed {
                remaining: r.remaining,
                reset_ms: r.reset_after_ms,
            },
            r => Outcome::Denied {
                retry_ms: u64::try_from(r.retry_after_ms).unwrap_or(r.reset_after_ms),
            },
        }
    }

    /// Whether this outcome refuses the request (if its rule is enforced).
    pub fn refuses(&self) -> bool {
        matches!(self, Outcome::Denied { .. } | Outcome::FailClosed)
    }
}

/// Where an outcome came from (for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// This proxy's lease or deny cache, no call.
    Local,
    /// The global bucket in Redis.
    Backend,
    /// The failure mode (open/closed) or the per-proxy fallback bucket (local).
    Failure,
}

/// A local answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// For a gRPC request: the grpc-status to answer with (None: Envoy derives it).
    pub grpc_status: Option<u32>,
}

/// What happens to the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through (after holding it `shown.delay_ms`, for a reservation), and say so on the
    /// response.
    Allow(Shown),
    Respond(LocalReply),
}

/// What an admitted request's response headers say (written only when the response comes, see
/// [`Plugin::write_headers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shown {
    /// The most restrictive enforced rule that admitted it with numbers to tell.
    pub admit: Option<Admit>,
    /// How long it was held for a reservation.
    pub delay_ms: u64,
}

impl Shown {
    /// Whether the response gets any header in `style`.
    pub fn any(&self, style: HeaderStyle) -> bool {
        self.delay_ms > 0 || (self.admit.is_some() && style != HeaderStyle::None)
    }
}

/// One enforced rule's admission, for the response headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admit {
    pub rule: usize,
    /// The key's effective limits.
    pub limits: Limits,
    pub remaining: u64,
    pub reset_ms: u64,
}

/// Why a request's cost is not usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostError {
    Invalid,
    OverBurst { rule: String, burst: u64 },
}

/// Parses a cost header: a plain positive decimal integer, nothing else (no sign, no float, no
/// spaces, not zero, fits in u64).
pub fn parse_cost(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 20 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value)
        .ok()?
        .parse::<u64>()
        .ok()
        .filter(|c| *c > 0)
}

/// What `rule` charges `req` under `limits`: its `cost`, raised (never lowered) by `cost_header`.
pub fn cost_of(rule: &Rule, limits: &Limits, req: &dyn RequestView) -> Result<u64, CostError> {
    let asked = match rule
        .cost_header
        .as_deref()
        .and_then(|name| req.header(name))
    {
        Some(v) => parse_cost(&v).ok_or(CostError::Invalid)?,
        None => rule.cost,
    };
    let cost = asked.max(rule.cost);
    if cost > limits.burst {
        return Err(CostError::OverBurst {
            rule: rule.name.clone(),
            burst: limits.burst,
        });
    }
    Ok(cost)
}

#[cold]
pub fn bad_cost(e: &CostError) -> Verdict {
    let body = match e {
        CostError::Invalid => "invalid cost header: expected a positive integer\n".to_string(),
        CostError::OverBurst { rule, burst } => format!(
            "request cost exceeds the burst of rule \"{rule}\" ({burst}): it can never be admitted\n"
        ),
    };
    Verdict::Respond(LocalReply {
        status: 400,
        headers: Vec::new(),
        body,
        grpc_status: None,
    })
}

/// Combines the outcomes `(rule index, outcome, effective limits)` of a request: denied if any enforced rule
/// denies (with the headers of the longest wait); 503 if a `closed` failure mode refused;
/// otherwise admitted with the headers of the most restrictive rule. `grpc` adapts the answer to a
/// gRPC client.
pub fn verdict(
    cfg: &Config,
    outcomes: impl Iterator<Item = (usize, Outcome, Limits)>,
    grpc: bool,
) -> Verdict {
    // Folded as they come, nothing collected: this runs on every request.
    let mut worst_denial: Option<Report> = None;
    let mut admit: Option<(Admit, Report)> = None;
    let mut closed = false;
    let mut delay_ms = 0;
    for (idx, outcome, limits) in outcomes {
        let Some(rule) = cfg.rules.get(idx).filter(|r| !r.shadow) else {
            continue;
        };
        let report = |remaining, reset_ms| Report {
            rule: &rule.name,
            limits,
            remaining,
            reset_ms,
        };
        let (remaining, reset_ms) = match outcome {
            Outcome::Denied { retry_ms } => {
                // The longest wait (the last of equal ones).
                if worst_denial.as_ref().is_none_or(|w| retry_ms >= w.reset_ms) {
                    worst_denial = Some(report(0, retry_ms));
                }
                continue;
            }
            Outcome::Reserved {
                delay_ms: d,
                reset_ms,
            } => {
                delay_ms = delay_ms.max(d);
                (0, reset_ms)
            }
            Outcome::Allowed {
                remaining,
                reset_ms,
            } => (remaining, reset_ms),
            Outcome::FailClosed => {
                closed = true;
                continue;
            }
            Outcome::FailOpen => continue,
        };
        let r = report(remaining, reset_ms);
        if admit
            .as_ref()
            .is_none_or(|(_, a)| headers::more_restrictive(&r, a))
        {
            let a = Admit {
                rule: idx,
                limits,
                remaining,
                reset_ms,
            };
            admit = Some((a, r));
        }
    }
    if let Some(worst) = worst_denial {
        return denial(cfg, &worst, grpc);
    }
    if closed {
        return backend_unavailable(grpc);
    }
    Verdict::Allow(Shown {
        admit: admit.map(|(a, _)| a),
        delay_ms,
    })
}

/// The local reply to a request an enforced rule refused (`worst`: the longest wait). Cold, as
/// the other local replies: most requests are admitted, and this code would otherwise sit in the
/// middle of theirs.
#[cold]
fn denial(cfg: &Config, worst: &Report, grpc: bool) -> Verdict {
    let mut hdrs = vec![(
        "retry-after".to_string(),
        headers::retry_after_secs(worst.reset_ms).to_string(),
    )];
    hdrs.extend(headers::rate_limit_headers(cfg.response_headers, worst));
    Verdict::Respond(LocalReply {
        status: cfg.deny.status,
        headers: hdrs,
        body: cfg.deny.body.clone(),
        grpc_status: (grpc && cfg.deny.grpc_resource_exhausted).then_some(GRPC_RESOURCE_EXHAUSTED),
    })
}

/// The local reply when the backend failed and the failure mode refuses.
#[cold]
fn backend_unavailable(grpc: bool) -> Verdict {
    Verdict::Respond(LocalReply {
        status: 503,
        headers: vec![("retry-after".to_string(), "1".to_string())],
        body: "rate limit backend unavailable\n".to_string(),
        grpc_status: grpc.then_some(GRPC_UNAVAILABLE),
    })
}

/// Whether `content-type` names a gRPC request.
pub fn is_grpc(content_type: Option<&[u8]>) -> bool {
    content_type.is_some_and(|ct| ct.starts_with(b"application/grpc"))
}
