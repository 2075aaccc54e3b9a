//! The per-request state machine: `start` -> `Step::Done(Verdict)` or `Step::Call(..)`; each
//! backend answer goes to `on_reply`, which resends once on NOSCRIPT and finishes with a `Verdict`
//! once every rule has its outcome.
//!
//! Invariant: every request that reaches `start` ends in exactly one `Verdict`: whatever the
//! backend does (answers, errs, times out, is never reached), each pending rule gets an outcome,
//! so a paused request is always resumed or answered.

use crate::backend::webdis::{self, Invoke};
use crate::backend::{script, BackendError, HttpRequest, ScriptCall, ScriptReply};
use crate::config::{Config, FailureMode, Mode, Rule};
use crate::headers::{self, Report};
use crate::local::{
    self, Breaker, DenyCache, LeasePool, LeaseSizing, LogGate, SharedStore, Transition,
};
use crate::metrics::{Counter, Metrics, NoMetrics};
use crate::rule::{self, RequestView};

/// The configuration plus what is derived from it once per configure.
pub struct Plugin {
    pub config: Config,
    /// SHA-1 of the embedded script, for EVALSHA.
    pub sha: String,
    /// Ready `Authorization` header value for Webdis, if configured.
    pub auth: Option<String>,
    /// Prefix of this plugin's shared-data keys (Istio gives all plugins one namespace).
    pub ns: String,
    pub metrics: Box<dyn Metrics>,
}

impl Plugin {
    pub fn new(config: Config) -> Plugin {
        Self::with_metrics(config, Box::new(NoMetrics))
    }

    pub fn with_metrics(config: Config, metrics: Box<dyn Metrics>) -> Plugin {
        let auth = config
            .backend
            .basic_auth
            .as_deref()
            .map(webdis::basic_auth_header);
        let ns = format!("tollgate|{}", config.key_prefix);
        Plugin {
            config,
            sha: script::sha1_hex(),
            auth,
            ns,
            metrics,
        }
    }

    /// Counts one check's outcome (see `metrics` for what each counter means).
    fn count(&self, rule_idx: usize, (outcome, source): (Outcome, Source)) {
        let shadow = self.config.rules.get(rule_idx).is_some_and(|r| r.shadow);
        let denied = if shadow {
            Counter::ShadowDenied
        } else {
            Counter::Denied
        };
        let m = &self.metrics;
        match outcome {
            Outcome::Reserved { delay_ms, .. } => {
                m.count(rule_idx, Counter::Allowed, 1);
                m.count(rule_idx, Counter::Delayed, 1);
                m.count(rule_idx, Counter::DelayMs, delay_ms);
            }
            Outcome::Allowed { .. } | Outcome::FailOpen => {
                m.count(rule_idx, Counter::Allowed, 1);
                if source == Source::Local {
                    m.count(rule_idx, Counter::LocalAllowed, 1);
                }
                if source == Source::Failure {
                    m.count(rule_idx, Counter::FailureModeAllowed, 1);
                }
            }
            Outcome::Denied { .. } | Outcome::FailClosed => {
                m.count(rule_idx, denied, 1);
                if source == Source::Local {
                    m.count(rule_idx, Counter::LocalDenied, 1);
                }
            }
        }
    }

    fn request(&self, call: &ScriptCall, invoke: Invoke<'_>) -> HttpRequest {
        webdis::request(
            call,
            invoke,
            &self.config.backend.authority,
            self.auth.as_deref(),
        )
    }
}

/// What the filter does with the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through (after holding it `delay_ms`, for a reservation); add `headers` to the
    /// response.
    Allow {
        headers: Vec<(String, String)>,
        delay_ms: u64,
    },
    /// Answer it here.
    Respond {
        status: u32,
        headers: Vec<(String, String)>,
        body: String,
    },
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
    /// The backend failed: the failure mode's answer.
    FailOpen,
    FailClosed,
}

/// Where the outcome came from (for metrics and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The local deny cache.
    Local,
    /// The global bucket in Redis.
    Backend,
    /// The failure mode (open/closed) or the per-proxy fallback bucket (local).
    Failure,
}

/// One matching rule's check.
#[derive(Debug, Clone)]
pub struct Check {
    pub rule: usize,
    pub call: ScriptCall,
    pub outcome: Option<(Outcome, Source)>,
    /// Whether the EVAL fallback was already sent for this check.
    pub eval_sent: bool,
    /// Lease mode: the check waits for the proxy's lease on its key instead of calling itself.
    pub lease: bool,
}

/// A request waiting for backend answers.
#[derive(Debug, Clone)]
pub struct Pending {
    pub checks: Vec<Check>,
    /// Local clock (ms) when the calls were sent: a denial is cached from then, never later.
    pub sent_ms: u64,
}

impl Pending {
    /// Indexes of lease-mode checks still waiting for tokens.
    pub fn waiting_leases(&self) -> Vec<usize> {
        self.checks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.lease && c.outcome.is_none())
            .map(|(i, _)| i)
            .collect()
    }
}

#[derive(Debug)]
pub enum Step {
    Done(Verdict),
    /// Send each `(check index, request)` and feed every answer to `on_reply`; the checks in
    /// `Pending::waiting_leases` wait for a lease (`serve_waiter`).
    Call(Pending, Vec<(usize, HttpRequest)>),
}

/// What to do after one answer.
#[derive(Debug)]
pub enum Next {
    /// Other checks are still out.
    Wait,
    /// Send this request for the same check (the EVAL after NOSCRIPT).
    Resend(HttpRequest),
    Done(Verdict),
}

/// Why a request's cost is not usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostError {
    Invalid,
    OverBurst { rule: String, burst: u64 },
}

/// Parses a cost header: a plain positive decimal integer, nothing else (no sign, no float,
/// no spaces, not zero, fits in u64).
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

fn cost_of(rule: &Rule, req: &dyn RequestView) -> Result<u64, CostError> {
    let cost = match &rule.cost_header {
        Some(name) => match req.header(name) {
            Some(v) => parse_cost(&v).ok_or(CostError::Invalid)?,
            None => rule.cost,
        },
        None => rule.cost,
    };
    if cost > rule.limits.burst {
        return Err(CostError::OverBurst {
            rule: rule.name.clone(),
            burst: rule.limits.burst,
        });
    }
    Ok(cost)
}

/// Decides what it can locally and says which backend calls are needed for the rest.
pub fn start(plugin: &Plugin, store: &dyn SharedStore, req: &dyn RequestView, now_us: u64) -> Step {
    let cfg = &plugin.config;
    let now_ms = now_us / 1000;
    let deny_cache = DenyCache::new(store, &plugin.ns);
    let mut checks = Vec::new();
    for (idx, rule) in cfg.rules.iter().enumerate() {
        let Some(applied) = rule::applies(&cfg.key_prefix, rule, req) else {
            continue;
        };
        if applied.unlimited {
            // An `unlimited` override: admitted without a call, still counted.
            plugin.metrics.count(idx, Counter::Allowed, 1);
            continue;
        }
        let (key, limits) = (applied.key, applied.limits);
        let cost = match cost_of(rule, req) {
            Ok(c) => c,
            Err(e) => return Step::Done(bad_cost(&e)),
        };
        let lease = rule.mode == Mode::Lease;
        let spent = if lease {
            LeasePool::new(store, &plugin.ns)
                .take(&key, cost, now_ms, rule.lease_horizon_ms, true)
                .ok()
                .and_then(|t| {
                    plugin.metrics.count(idx, Counter::LeaseDropped, t.dropped);
                    t.spent
                })
        } else {
            None
        };
        let outcome = match spent {
            Some(s) => Some((
                Outcome::Allowed {
                    remaining: s.remaining,
                    reset_ms: s.reset_ms,
                },
                Source::Local,
            )),
            None => deny_cache
                .denied(&key, cost, now_ms)
                .map(|retry_ms| (Outcome::Denied { retry_ms }, Source::Local)),
        };
        checks.push(Check {
            rule: idx,
            call: ScriptCall {
                key,
                burst: limits.burst,
                rate: limits.rate,
                period_ms: limits.period_ms,
                cost,
                lease_want: 0,
                // A shadow rule never holds a request.
                max_wait_ms: if rule.shadow { 0 } else { rule.max_wait_ms },
            },
            outcome,
            eval_sent: false,
            lease,
        });
        if let Some(o) = outcome {
            plugin.count(idx, o);
        }
    }
    let pending = Pending {
        checks,
        sent_ms: now_ms,
    };
    let mut pending = pending;
    let needs_call = pending
        .checks
        .iter()
        .any(|c| c.outcome.is_none() && !c.lease);
    if needs_call
        && !denied_already(cfg, &pending.checks)
        && !backend_allowed(plugin, store, now_ms)
    {
        // The breaker is open: the failure mode answers now, no request waits on a dead backend.
        for idx in 0..pending.checks.len() {
            let waiting = pending
                .checks
                .get(idx)
                .is_some_and(|c| c.outcome.is_none() && !c.lease);
            if waiting {
                let _ = on_reply(
                    plugin,
                    store,
                    &mut pending,
                    idx,
                    Err(BackendError::CircuitOpen),
                    now_us,
                );
            }
        }
    }
    // A denial of an enforced rule answers now: no rule's tokens are spent on a request that will
    // be denied anyway.
    if denied_already(cfg, &pending.checks) || pending.checks.iter().all(|c| c.outcome.is_some()) {
        return Step::Done(verdict(cfg, &pending.checks));
    }
    let calls = pending
        .checks
        .iter()
        .enumerate()
        .filter(|(_, c)| c.outcome.is_none() && !c.lease)
        .map(|(i, c)| (i, plugin.request(&c.call, Invoke::Sha(&plugin.sha))))
        .collect();
    Step::Call(pending, calls)
}

/// Whether an enforced (non-shadow) rule has already denied the request (or its failure mode
/// closed it).
fn denied_already(cfg: &Config, checks: &[Check]) -> bool {
    checks.iter().any(|c| {
        matches!(
            c.outcome,
            Some((Outcome::Denied { .. } | Outcome::FailClosed, _))
        ) && !cfg.rules.get(c.rule).is_some_and(|r| r.shadow)
    })
}

/// Takes one backend answer for check `idx`.
pub fn on_reply(
    plugin: &Plugin,
    store: &dyn SharedStore,
    pending: &mut Pending,
    idx: usize,
    reply: Result<ScriptReply, BackendError>,
    now_us: u64,
) -> Next {
    let Some(check) = pending.checks.get_mut(idx) else {
        return Next::Wait;
    };
    if check.outcome.is_some() {
        return Next::Wait;
    }
    let outcome = match reply {
        Err(BackendError::NoScript) if !check.eval_sent => {
            check.eval_sent = true;
            return Next::Resend(plugin.request(&check.call, Invoke::Source(script::SOURCE)));
        }
        Ok(r) if r.allowed && r.retry_after_ms > 0 => (
            Outcome::Reserved {
                delay_ms: u64::try_from(r.retry_after_ms).unwrap_or(0),
                reset_ms: r.reset_after_ms,
            },
            Source::Backend,
        ),
        Ok(r) if r.allowed => (
            Outcome::Allowed {
                remaining: r.remaining,
                reset_ms: r.reset_after_ms,
            },
            Source::Backend,
        ),
        Ok(r) => {
            // retry_after_ms is -1 only for cost > burst, which `start` already refused.
            let retry_ms = u64::try_from(r.retry_after_ms).unwrap_or(r.reset_after_ms);
            let until = pending.sent_ms.saturating_add(retry_ms);
            let _ =
                DenyCache::new(store, &plugin.ns).remember(&check.call.key, check.call.cost, until);
            (Outcome::Denied { retry_ms }, Source::Backend)
        }
        Err(_) => (
            failure_outcome(plugin, store, check, now_us),
            Source::Failure,
        ),
    };
    set_outcome(plugin, pending, idx, outcome)
}

/// Records check `idx`'s outcome; the verdict once every check has one, or as soon as an
/// enforced rule denies.
fn set_outcome(
    plugin: &Plugin,
    pending: &mut Pending,
    idx: usize,
    outcome: (Outcome, Source),
) -> Next {
    if let Some(check) = pending.checks.get_mut(idx) {
        if check.outcome.is_some() {
            return Next::Wait;
        }
        check.outcome = Some(outcome);
        plugin.count(check.rule, outcome);
    }
    let cfg = &plugin.config;
    if denied_already(cfg, &pending.checks) || pending.checks.iter().all(|c| c.outcome.is_some()) {
        Next::Done(verdict(&plugin.config, &pending.checks))
    } else {
        Next::Wait
    }
}

/// A lease call one worker makes for the requests waiting on one key.
#[derive(Debug, Clone)]
pub struct LeaseFlight {
    pub rule: usize,
    pub call: ScriptCall,
    pub sent_ms: u64,
    pub eval_sent: bool,
}

fn sizing(rule: &Rule) -> LeaseSizing {
    LeaseSizing {
        burst: rule.limits.burst,
        rate: rule.limits.rate,
        period_ms: rule.limits.period_ms,
        lease_max: rule.lease_max,
        horizon_ms: rule.lease_horizon_ms,
    }
}

/// The lease call for `key` (rule `rule_idx`), for waiters whose first needs `first_cost` and who
/// need `waiting_cost` in all; None if another worker of this proxy already has one out (its
/// grant lands in the shared pool, where `serve_waiter` finds it); `CircuitOpen` if the breaker
/// forbids calls (the waiters get the failure mode).
pub fn lease_flight(
    plugin: &Plugin,
    store: &dyn SharedStore,
    rule_idx: usize,
    key: &str,
    first_cost: u64,
    waiting_cost: u64,
    now_ms: u64,
) -> Result<Option<(LeaseFlight, HttpRequest)>, BackendError> {
    let Some(rule) = plugin.config.rules.get(rule_idx) else {
        return Ok(None);
    };
    let pool = LeasePool::new(store, &plugin.ns);
    // The claim outlives the call's own timeout a little, so a lost answer frees it.
    let until = now_ms
        .saturating_add(plugin.config.backend.timeout_ms)
        .saturating_add(50);
    if !pool.begin_flight(key, now_ms, until).unwrap_or(false) {
        return Ok(None);
    }
    if !backend_allowed(plugin, store, now_ms) {
        let _ = pool.end_flight(key, None, now_ms);
        return Err(BackendError::CircuitOpen);
    }
    let want = pool.want(key, waiting_cost, now_ms, &sizing(rule));
    let call = ScriptCall {
        key: key.to_string(),
        burst: rule.limits.burst,
        rate: rule.limits.rate,
        period_ms: rule.limits.period_ms,
        cost: first_cost,
        lease_want: want,
        max_wait_ms: 0,
    };
    let req = plugin.request(&call, Invoke::Sha(&plugin.sha));
    Ok(Some((
        LeaseFlight {
            rule: rule_idx,
            call,
            sent_ms: now_ms,
            eval_sent: false,
        },
        req,
    )))
}

/// Whether the circuit breaker lets a backend call go out now.
fn backend_allowed(plugin: &Plugin, store: &dyn SharedStore, now_ms: u64) -> bool {
    Breaker::new(store, &plugin.ns).allow(now_ms, plugin.config.backend.breaker_cooloff_ms)
}

/// Records one backend call's result in the proxy's circuit breaker and says what, if anything,
/// to log about it: breaker transitions, and other errors (Redis error replies, malformed
/// replies) at most once a minute per distinct message, proxy-wide.
pub fn record_backend(
    plugin: &Plugin,
    store: &dyn SharedStore,
    result: Result<(), &BackendError>,
    now_ms: u64,
) -> Option<(log::Level, String)> {
    let backend = &plugin.config.backend;
    let breaker = Breaker::new(store, &plugin.ns);
    let record = |ok| {
        breaker.record(
            ok,
            now_ms,
            backend.breaker_failures,
            backend.breaker_cooloff_ms,
        )
    };
    let mode = plugin.config.failure_mode;
    match result {
        Err(e) if e.trips_breaker() => match record(false) {
            Some(Transition::Opened) => Some((
                log::Level::Warn,
                format!(
                    "tollgate: backend failing ({e}): circuit open after {} consecutive failures; \
                     failure_mode {mode:?} answers, one probe every {} ms",
                    backend.breaker_failures, backend.breaker_cooloff_ms
                ),
            )),
            _ => None,
        },
        Err(e) => {
            // The backend answered: it is reachable, whatever the error says.
            let _ = record(true);
            let line = format!(
                "tollgate: backend error ({e}); failure_mode {mode:?} applies to the requests it \
                 concerns (the same error is logged at most once a minute)"
            );
            LogGate::new(store, &plugin.ns)
                .admit(&line, now_ms, 60_000)
                .then_some((log::Level::Warn, line))
        }
        Ok(()) => match record(true) {
            Some(Transition::Closed) => Some((
                log::Level::Info,
                "tollgate: backend answering again: circuit closed".to_string(),
            )),
            _ => None,
        },
    }
}

/// What a lease answer means for the waiters on its key.
#[derive(Debug)]
pub enum LeaseResult {
    /// NOSCRIPT: send this (the EVAL) instead, same flight.
    Resend(HttpRequest),
    /// Tokens (or a denial) are recorded: serve the waiters with `serve_waiter`.
    Recorded,
    /// The backend failed: each waiter gets the failure mode (`on_reply` with the error).
    Failed(BackendError),
}

/// Records a lease answer: grants go into the shared pool; a denial, or a grant that emptied the
/// global bucket, goes into the deny cache for at least one horizon, so a saturated key costs
/// each proxy about one call per horizon (the tokens meanwhile stay in the global bucket).
pub fn lease_reply(
    plugin: &Plugin,
    store: &dyn SharedStore,
    flight: &mut LeaseFlight,
    reply: Result<ScriptReply, BackendError>,
    now_ms: u64,
) -> LeaseResult {
    let pool = LeasePool::new(store, &plugin.ns);
    let key = flight.call.key.as_str();
    let Some(rule) = plugin.config.rules.get(flight.rule) else {
        return LeaseResult::Failed(BackendError::Malformed("unknown rule".to_string()));
    };
    let backoff = sizing(rule).backoff_ms();
    let deny = DenyCache::new(store, &plugin.ns);
    match reply {
        Err(BackendError::NoScript) if !flight.eval_sent => {
            flight.eval_sent = true;
            LeaseResult::Resend(plugin.request(&flight.call, Invoke::Source(script::SOURCE)))
        }
        Ok(r) if r.allowed => {
            plugin
                .metrics
                .count(flight.rule, Counter::LeaseGranted, r.granted);
            let dropped = pool.deposit(
                key,
                r.granted,
                r.remaining,
                r.reset_after_ms,
                now_ms,
                rule.lease_horizon_ms,
            );
            plugin
                .metrics
                .count(flight.rule, Counter::LeaseDropped, dropped.unwrap_or(0));
            if r.granted < flight.call.lease_want || r.remaining < r.granted {
                // The bucket held less than asked for, or we took most of what was left: the key
                // is saturated. Spend the grant, then back off instead of asking for each token
                // as it refills (the tokens stay in the global bucket meanwhile; the backoff is
                // short enough that none is lost).
                let _ = deny.remember(key, 1, flight.sent_ms.saturating_add(backoff));
            }
            LeaseResult::Recorded
        }
        Ok(r) => {
            let retry = u64::try_from(r.retry_after_ms).unwrap_or(r.reset_after_ms);
            let until = flight.sent_ms.saturating_add(retry.max(backoff));
            let _ = deny.remember(key, flight.call.cost, until);
            let _ = pool.end_flight(key, Some(r.remaining), now_ms);
            LeaseResult::Recorded
        }
        Err(e) => {
            let _ = pool.end_flight(key, None, now_ms);
            LeaseResult::Failed(e)
        }
    }
}

/// Tries to settle waiting lease check `idx` from the pool or the deny cache; None if it must
/// keep waiting.
pub fn serve_waiter(
    plugin: &Plugin,
    store: &dyn SharedStore,
    pending: &mut Pending,
    idx: usize,
    now_ms: u64,
) -> Option<Next> {
    let check = pending.checks.get(idx)?;
    if check.outcome.is_some() {
        return Some(Next::Wait);
    }
    let horizon = plugin
        .config
        .rules
        .get(check.rule)
        .map_or(0, |r| r.lease_horizon_ms);
    let key = &check.call.key;
    let cost = check.call.cost;
    let taken = LeasePool::new(store, &plugin.ns).take(key, cost, now_ms, horizon, false);
    if let Ok(t) = &taken {
        plugin
            .metrics
            .count(check.rule, Counter::LeaseDropped, t.dropped);
    }
    let outcome = match taken.map(|t| t.spent) {
        Ok(Some(s)) => Outcome::Allowed {
            remaining: s.remaining,
            reset_ms: s.reset_ms,
        },
        _ => Outcome::Denied {
            retry_ms: DenyCache::new(store, &plugin.ns).denied(key, cost, now_ms)?,
        },
    };
    Some(set_outcome(
        plugin,
        pending,
        idx,
        (outcome, Source::Backend),
    ))
}

fn failure_outcome(
    plugin: &Plugin,
    store: &dyn SharedStore,
    check: &Check,
    now_us: u64,
) -> Outcome {
    let cfg = &plugin.config;
    match cfg.failure_mode {
        FailureMode::Open => Outcome::FailOpen,
        FailureMode::Closed => Outcome::FailClosed,
        FailureMode::Local => {
            let Some(rule) = cfg.rules.get(check.rule) else {
                return Outcome::FailClosed;
            };
            let limits = rule.fallback.unwrap_or(rule.limits);
            match local::fallback_take(
                store,
                &format!("{}|{}", plugin.ns, rule.name),
                &check.call.key,
                &limits,
                check.call.cost,
                now_us,
            ) {
                Ok(r) if r.allowed => Outcome::Allowed {
                    remaining: r.remaining,
                    reset_ms: r.reset_after_ms,
                },
                Ok(r) => Outcome::Denied {
                    retry_ms: u64::try_from(r.retry_after_ms).unwrap_or(r.reset_after_ms),
                },
                // Shared data kept failing: deny rather than admit unaccounted.
                Err(_) => Outcome::Denied { retry_ms: 1000 },
            }
        }
    }
}

fn bad_cost(e: &CostError) -> Verdict {
    let body = match e {
        CostError::Invalid => "invalid cost header: expected a positive integer\n".to_string(),
        CostError::OverBurst { rule, burst } => {
            format!("request cost exceeds the burst of rule \"{rule}\" ({burst}): it can never be admitted\n")
        }
    };
    Verdict::Respond {
        status: 400,
        headers: Vec::new(),
        body,
    }
}

/// Combines the checks: denied if any enforced (non-shadow) rule denies; otherwise admitted with
/// the headers of the most restrictive rule.
fn verdict(cfg: &Config, checks: &[Check]) -> Verdict {
    let enforced = checks.iter().filter_map(|c| {
        let rule = cfg.rules.get(c.rule)?;
        let (outcome, _) = c.outcome?;
        (!rule.shadow).then_some((rule, outcome))
    });
    let mut denials = Vec::new();
    let mut admits = Vec::new();
    let mut closed = false;
    let mut delay_ms = 0;
    for (rule, outcome) in enforced {
        match outcome {
            Outcome::Denied { retry_ms } => denials.push(report(rule, 0, retry_ms)),
            Outcome::Reserved {
                delay_ms: d,
                reset_ms,
            } => {
                delay_ms = delay_ms.max(d);
                admits.push(report(rule, 0, reset_ms));
            }
            Outcome::Allowed {
                remaining,
                reset_ms,
            } => admits.push(report(rule, remaining, reset_ms)),
            Outcome::FailClosed => closed = true,
            Outcome::FailOpen => {}
        }
    }
    let style = cfg.response_headers;
    if let Some(worst) = denials.iter().max_by_key(|r| r.reset_ms) {
        let mut hdrs = vec![(
            "retry-after".to_string(),
            headers::retry_after_secs(worst.reset_ms).to_string(),
        )];
        hdrs.extend(headers::rate_limit_headers(style, worst));
        return Verdict::Respond {
            status: cfg.deny.status,
            headers: hdrs,
            body: cfg.deny.body.clone(),
        };
    }
    if closed {
        return Verdict::Respond {
            status: 503,
            headers: vec![("retry-after".to_string(), "1".to_string())],
            body: "rate limit backend unavailable\n".to_string(),
        };
    }
    let mut headers = headers::most_restrictive(&admits)
        .map(|r| headers::rate_limit_headers(style, r))
        .unwrap_or_default();
    if delay_ms > 0 {
        headers.push((headers::DELAY.to_string(), delay_ms.to_string()));
    }
    Verdict::Allow { headers, delay_ms }
}

fn report(rule: &Rule, remaining: u64, reset_ms: u64) -> Report<'_> {
    Report {
        rule: &rule.name,
        limits: rule.limits,
        remaining,
        reset_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::MemStore;
    use std::collections::HashMap;

    struct Req(HashMap<String, Vec<u8>>);

    impl RequestView for Req {
        fn header(&self, name: &str) -> Option<Vec<u8>> {
            self.0.get(name).cloned()
        }
        fn client_ip(&self) -> Option<Vec<u8>> {
            Some(b"127.0.0.1".to_vec())
        }
    }

    fn req(path: &str, headers: &[(&str, &str)]) -> Req {
        let mut m: HashMap<String, Vec<u8>> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        m.insert(":path".into(), path.as_bytes().to_vec());
        m.insert(":method".into(), b"GET".to_vec());
        m.insert(":authority".into(), b"example.com".to_vec());
        Req(m)
    }

    fn plugin(extra: &str, rules: &str) -> Plugin {
        let json = format!(r#"{{ {extra} "rules": [{rules}] }}"#);
        Plugin::new(Config::try_from(json.as_bytes()).unwrap())
    }

    const USER_RULE: &str = r#"{"name":"per-user","match":{"path_prefix":"/api/"},
        "key":["header:x-user"],"rate":10,"period_ms":1000,"burst":20,"cost_header":"x-cost"}"#;

    fn allowed(remaining: u64) -> Result<ScriptReply, BackendError> {
        Ok(ScriptReply {
            allowed: true,
            remaining,
            retry_after_ms: 0,
            reset_after_ms: 100,
            granted: 1,
        })
    }

    fn denied(retry: i64) -> Result<ScriptReply, BackendError> {
        Ok(ScriptReply {
            allowed: false,
            remaining: 0,
            retry_after_ms: retry,
            reset_after_ms: 2000,
            granted: 0,
        })
    }

    fn calls(step: Step) -> (Pending, Vec<(usize, HttpRequest)>) {
        match step {
            Step::Call(p, c) => (p, c),
            Step::Done(v) => panic!("expected calls, got {v:?}"),
        }
    }

    fn header<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
        hs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn unmatched_or_keyless_request_passes_without_a_call() {
        let p = plugin("", USER_RULE);
        let s = MemStore::default();
        for r in [req("/other", &[("x-user", "a")]), req("/api/x", &[])] {
            match start(&p, &s, &r, 0) {
                Step::Done(Verdict::Allow { headers, .. }) => assert!(headers.is_empty()),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn admitted_request_reports_headers() {
        let p = plugin("", USER_RULE);
        let s = MemStore::default();
        let (mut pending, c) = calls(start(&p, &s, &req("/api/x", &[("x-user", "a")]), 0));
        assert_eq!(c.len(), 1);
        let body = String::from_utf8(c[0].1.body.clone()).unwrap();
        assert!(body.starts_with(&format!("EVALSHA/{}/1/tollgate%3A%7Bper-user%3A", p.sha)));
        assert!(body.ends_with("/20/10/1000/1/0/0"), "{body}");
        match on_reply(&p, &s, &mut pending, 0, allowed(7), 0) {
            Next::Done(Verdict::Allow { headers, .. }) => {
                assert_eq!(header(&headers, "ratelimit"), Some("\"per-user\";r=7;t=1"));
                assert_eq!(
                    header(&headers, "ratelimit-policy"),
                    Some("\"per-user\";q=20;w=2")
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn denial_answers_and_is_cached_until_retry() {
        let p = plugin(r#""deny":{"status":429,"body":"slow down\n"},"#, USER_RULE);
        let s = MemStore::default();
        let r = req("/api/x", &[("x-user", "a")]);
        let (mut pending, _) = calls(start(&p, &s, &r, 1_000_000));
        match on_reply(&p, &s, &mut pending, 0, denied(1500), 1_010_000) {
            Next::Done(Verdict::Respond {
                status,
                headers,
                body,
            }) => {
                assert_eq!(status, 429);
                assert_eq!(body, "slow down\n");
                assert_eq!(header(&headers, "retry-after"), Some("2"));
                assert_eq!(header(&headers, "ratelimit"), Some("\"per-user\";r=0;t=2"));
            }
            other => panic!("{other:?}"),
        }
        // Cached from the send time (1000 ms) for 1500 ms: denied locally, no call.
        match start(&p, &s, &r, 2_400_000) {
            Step::Done(Verdict::Respond {
                status, headers, ..
            }) => {
                assert_eq!(status, 429);
                assert_eq!(header(&headers, "retry-after"), Some("1"));
            }
            other => panic!("{other:?}"),
        }
        // Another user is not affected; after the retry time the same user asks Redis again.
        calls(start(&p, &s, &req("/api/x", &[("x-user", "b")]), 2_400_000));
        calls(start(&p, &s, &r, 2_500_000));
    }

    #[test]
    fn noscript_resends_once_with_eval_then_fails() {
        let p = plugin("", USER_RULE);
        let s = MemStore::default();
        let (mut pending, _) = calls(start(&p, &s, &req("/api/x", &[("x-user", "a")]), 0));
        match on_reply(&p, &s, &mut pending, 0, Err(BackendError::NoScript), 0) {
            Next::Resend(r) => {
                let body = String::from_utf8(r.body).unwrap();
                assert!(body.starts_with("EVAL/"), "{}", &body[..20]);
            }
            other => panic!("{other:?}"),
        }
        // A second NOSCRIPT is a failure: failure_mode open admits.
        match on_reply(&p, &s, &mut pending, 0, Err(BackendError::NoScript), 0) {
            Next::Done(Verdict::Allow { headers, .. }) => assert!(headers.is_empty()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn failure_modes() {
        let s = MemStore::default();
        let r = req("/api/x", &[("x-user", "a")]);
        let closed = plugin(r#""failure_mode":"closed","#, USER_RULE);
        let (mut pending, _) = calls(start(&closed, &s, &r, 0));
        match on_reply(&closed, &s, &mut pending, 0, Err(BackendError::Reset), 0) {
            Next::Done(Verdict::Respond {
                status, headers, ..
            }) => {
                assert_eq!(status, 503);
                assert_eq!(header(&headers, "retry-after"), Some("1"));
            }
            other => panic!("{other:?}"),
        }
        let local = plugin(
            r#""failure_mode":"local","#,
            r#"{"name":"r","key":["header:x-user"],"rate":1,"burst":10,
                "fallback":{"rate":1,"period_ms":1000,"burst":2}}"#,
        );
        let mut outcomes = Vec::new();
        for _ in 0..3 {
            let (mut pending, _) = calls(start(&local, &s, &r, 0));
            match on_reply(
                &local,
                &s,
                &mut pending,
                0,
                Err(BackendError::Status(503)),
                0,
            ) {
                Next::Done(Verdict::Allow { .. }) => outcomes.push(true),
                Next::Done(Verdict::Respond { status: 429, .. }) => outcomes.push(false),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(outcomes, [true, true, false], "fallback burst of 2");
    }

    #[test]
    fn cost_header_is_validated() {
        let p = plugin("", USER_RULE);
        let s = MemStore::default();
        for bad in [
            "0",
            "-1",
            "1.5",
            "abc",
            "",
            " 1",
            "99999999999999999999999",
            "+1",
        ] {
            match start(
                &p,
                &s,
                &req("/api/x", &[("x-user", "a"), ("x-cost", bad)]),
                0,
            ) {
                Step::Done(Verdict::Respond { status: 400, .. }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        match start(
            &p,
            &s,
            &req("/api/x", &[("x-user", "a"), ("x-cost", "21")]),
            0,
        ) {
            Step::Done(Verdict::Respond {
                status: 400, body, ..
            }) => {
                assert!(body.contains("exceeds the burst"), "{body}")
            }
            other => panic!("{other:?}"),
        }
        let (pending, c) = calls(start(
            &p,
            &s,
            &req("/api/x", &[("x-user", "a"), ("x-cost", "5")]),
            0,
        ));
        assert_eq!(pending.checks[0].call.cost, 5);
        assert!(String::from_utf8(c[0].1.body.clone())
            .unwrap()
            .ends_with("/5/0/0"));
    }

    #[test]
    fn all_rules_must_admit_and_most_restrictive_is_reported() {
        let rules = format!(
            r#"{USER_RULE}, {{"name":"global","rate":100,"burst":100}}, {{"name":"try","rate":1,"shadow":true}}"#
        );
        let p = plugin("", &rules);
        let s = MemStore::default();
        let r = req("/api/x", &[("x-user", "a")]);
        let (mut pending, c) = calls(start(&p, &s, &r, 0));
        assert_eq!(c.len(), 3);
        assert!(matches!(
            on_reply(&p, &s, &mut pending, 0, allowed(3), 0),
            Next::Wait
        ));
        assert!(matches!(
            on_reply(&p, &s, &mut pending, 2, denied(900), 0),
            Next::Wait
        ));
        match on_reply(&p, &s, &mut pending, 1, allowed(50), 0) {
            Next::Done(Verdict::Allow { headers, .. }) => {
                assert_eq!(header(&headers, "ratelimit"), Some("\"per-user\";r=3;t=1"))
            }
            other => panic!("shadow denial must not deny: {other:?}"),
        }
        let (mut pending, _) = calls(start(&p, &s, &r, 0));
        on_reply(&p, &s, &mut pending, 0, allowed(3), 0);
        on_reply(&p, &s, &mut pending, 2, allowed(0), 0);
        match on_reply(&p, &s, &mut pending, 1, denied(300), 0) {
            Next::Done(Verdict::Respond {
                status: 429,
                headers,
                ..
            }) => {
                assert_eq!(header(&headers, "ratelimit"), Some("\"global\";r=0;t=1"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn late_or_unknown_answers_are_ignored() {
        let p = plugin("", USER_RULE);
        let s = MemStore::default();
        let (mut pending, _) = calls(start(&p, &s, &req("/api/x", &[("x-user", "a")]), 0));
        assert!(matches!(
            on_reply(&p, &s, &mut pending, 9, allowed(1), 0),
            Next::Wait
        ));
        assert!(matches!(
            on_reply(&p, &s, &mut pending, 0, allowed(1), 0),
            Next::Done(_)
        ));
        assert!(matches!(
            on_reply(&p, &s, &mut pending, 0, allowed(1), 0),
            Next::Wait
        ));
    }

    const LEASE_RULE: &str = r#"{"name":"hot","key":["header:x-user"],"mode":"lease",
        "rate":100,"burst":50,"lease_max":20}"#;

    fn lease_pending(p: &Plugin, s: &MemStore, user: &str, now_ms: u64) -> Pending {
        let (pending, c) = calls(start(p, s, &req("/", &[("x-user", user)]), now_ms * 1000));
        assert!(c.is_empty(), "lease checks do not call from the request");
        assert_eq!(pending.waiting_leases(), vec![0]);
        pending
    }

    fn grant(granted: u64, remaining: u64) -> Result<ScriptReply, BackendError> {
        Ok(ScriptReply {
            allowed: true,
            remaining,
            retry_after_ms: 0,
            reset_after_ms: 300,
            granted,
        })
    }

    #[test]
    fn lease_flow_single_flight_then_local_admissions() {
        let p = plugin("", LEASE_RULE);
        let s = MemStore::default();
        let mut w1 = lease_pending(&p, &s, "a", 1000);
        let mut w2 = lease_pending(&p, &s, "a", 1000);
        let key = w1.checks[0].call.key.clone();
        let (mut flight, call) = lease_flight(&p, &s, 0, &key, 1, 2, 1000).unwrap().unwrap();
        assert!(
            lease_flight(&p, &s, 0, &key, 1, 2, 1001).unwrap().is_none(),
            "one lease call per key per proxy"
        );
        let body = String::from_utf8(call.body).unwrap();
        assert!(
            body.ends_with(&format!("/1/{}/0", flight.call.lease_want)),
            "{body}"
        );
        assert!(flight.call.lease_want >= 2, "enough for both waiters");
        assert!(matches!(
            lease_reply(&p, &s, &mut flight, grant(5, 40), 1002),
            LeaseResult::Recorded
        ));
        for w in [&mut w1, &mut w2] {
            match serve_waiter(&p, &s, w, 0, 1003) {
                Some(Next::Done(Verdict::Allow { headers, .. })) => {
                    assert!(header(&headers, "ratelimit").is_some())
                }
                other => panic!("{other:?}"),
            }
        }
        // Three leased tokens left: the next three requests pass with no call at all.
        for _ in 0..3 {
            match start(&p, &s, &req("/", &[("x-user", "a")]), 1_004_000) {
                Step::Done(Verdict::Allow { .. }) => {}
                other => panic!("{other:?}"),
            }
        }
        lease_pending(&p, &s, "a", 1005);
        lease_pending(&p, &s, "b", 1005);
    }

    #[test]
    fn lease_denial_and_short_grant_back_off_waiters() {
        let p = plugin("", LEASE_RULE);
        let s = MemStore::default();
        let mut w = lease_pending(&p, &s, "a", 1000);
        let key = w.checks[0].call.key.clone();
        let (mut flight, _) = lease_flight(&p, &s, 0, &key, 1, 1, 1000).unwrap().unwrap();
        lease_reply(&p, &s, &mut flight, denied(10), 1001);
        match serve_waiter(&p, &s, &mut w, 0, 1002) {
            Some(Next::Done(Verdict::Respond { status: 429, .. })) => {}
            other => panic!("{other:?}"),
        }
        // Backoff: min(horizon 200, half the burst refills in 250 ms) = 200 ms, not 10 ms.
        match start(&p, &s, &req("/", &[("x-user", "a")]), 1_150_000) {
            Step::Done(Verdict::Respond { status: 429, .. }) => {}
            other => panic!("{other:?}"),
        }
        let mut w = lease_pending(&p, &s, "a", 1201);
        let (mut flight, _) = lease_flight(&p, &s, 0, &key, 1, 1, 1201).unwrap().unwrap();
        let asked = flight.call.lease_want;
        assert!(asked > 1, "demand built up: {asked}");
        lease_reply(&p, &s, &mut flight, grant(1, 0), 1202);
        assert!(matches!(
            serve_waiter(&p, &s, &mut w, 0, 1203),
            Some(Next::Done(Verdict::Allow { .. }))
        ));
        match start(&p, &s, &req("/", &[("x-user", "a")]), 1_300_000) {
            Step::Done(Verdict::Respond { status: 429, .. }) => {}
            other => panic!("short grant backs off: {other:?}"),
        }
    }

    #[test]
    fn lease_failure_follows_failure_mode_and_frees_the_flight() {
        let p = plugin(r#""failure_mode":"closed","#, LEASE_RULE);
        let s = MemStore::default();
        let mut w = lease_pending(&p, &s, "a", 1000);
        let key = w.checks[0].call.key.clone();
        let (mut flight, _) = lease_flight(&p, &s, 0, &key, 1, 1, 1000).unwrap().unwrap();
        match lease_reply(&p, &s, &mut flight, Err(BackendError::NoScript), 1001) {
            LeaseResult::Resend(r) => assert!(r.body.starts_with(b"EVAL/")),
            other => panic!("{other:?}"),
        }
        let err = match lease_reply(&p, &s, &mut flight, Err(BackendError::Reset), 1002) {
            LeaseResult::Failed(e) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(serve_waiter(&p, &s, &mut w, 0, 1003).map(|_| ()), None);
        match on_reply(&p, &s, &mut w, 0, Err(err), 1_003_000) {
            Next::Done(Verdict::Respond { status: 503, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(
            lease_flight(&p, &s, 0, &key, 1, 1, 1004).unwrap().is_some(),
            "flight freed"
        );
    }

    #[test]
    fn open_breaker_answers_with_the_failure_mode_without_calls() {
        let p = plugin(
            r#""failure_mode":"closed","backend":{"breaker_failures":2,"breaker_cooloff_ms":500},"#,
            &format!("{USER_RULE}, {LEASE_RULE}"),
        );
        let s = MemStore::default();
        let down = BackendError::Reset;
        assert_eq!(record_backend(&p, &s, Err(&down), 1000), None);
        let (level, line) = record_backend(&p, &s, Err(&down), 1001).unwrap();
        assert_eq!(level, log::Level::Warn);
        assert!(
            line.contains("circuit open after 2 consecutive failures"),
            "{line}"
        );
        match start(&p, &s, &req("/api/x", &[("x-user", "a")]), 1_002_000) {
            Step::Done(Verdict::Respond { status: 503, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            lease_flight(&p, &s, 1, "k", 1, 1, 1002),
            Err(BackendError::CircuitOpen)
        ));
        // After the cool-off one probe goes out; its success closes the breaker.
        let (_, c) = calls(start(&p, &s, &req("/api/x", &[("x-user", "a")]), 1_502_000));
        assert_eq!(c.len(), 1);
        match start(&p, &s, &req("/api/x", &[("x-user", "b")]), 1_502_000) {
            Step::Done(Verdict::Respond { status: 503, .. }) => {}
            other => panic!("only one probe: {other:?}"),
        }
        let (_, line) = record_backend(&p, &s, Ok(()), 1503).unwrap();
        assert!(line.contains("circuit closed"), "{line}");
        calls(start(&p, &s, &req("/api/x", &[("x-user", "b")]), 1_504_000));
    }

    #[test]
    fn a_reservation_admits_after_its_delay_and_says_so() {
        let p = plugin(
            "",
            r#"{"name":"hooks","key":["header:x-user"],"rate":10,"burst":5,"max_wait_ms":800},
               {"name":"try","rate":1,"shadow":true,"max_wait_ms":800}"#,
        );
        let s = MemStore::default();
        let (mut pending, c) = calls(start(&p, &s, &req("/", &[("x-user", "a")]), 0));
        let hooks = String::from_utf8(c[0].1.body.clone()).unwrap();
        assert!(hooks.ends_with("/5/10/1000/1/0/800"), "{hooks}");
        let shadow = String::from_utf8(c[1].1.body.clone()).unwrap();
        assert!(
            shadow.ends_with("/1/0/0"),
            "a shadow rule never holds: {shadow}"
        );
        let reserved = Ok(ScriptReply {
            allowed: true,
            remaining: 0,
            retry_after_ms: 300,
            reset_after_ms: 800,
            granted: 1,
        });
        assert!(matches!(
            on_reply(&p, &s, &mut pending, 0, reserved, 0),
            Next::Wait
        ));
        match on_reply(&p, &s, &mut pending, 1, allowed(0), 0) {
            Next::Done(Verdict::Allow { headers, delay_ms }) => {
                assert_eq!(delay_ms, 300);
                assert_eq!(header(&headers, "x-ratelimit-delay-ms"), Some("300"));
                assert_eq!(header(&headers, "ratelimit"), Some("\"hooks\";r=0;t=1"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn redis_error_replies_never_open_the_breaker_and_log_once() {
        let p = plugin(r#""backend":{"breaker_failures":2},"#, USER_RULE);
        let s = MemStore::default();
        let e = BackendError::Redis("WRONGPASS invalid username-password pair".into());
        let first = record_backend(&p, &s, Err(&e), 1000);
        assert!(first.is_some_and(|(_, l)| l.contains("WRONGPASS")));
        for t in 1001..1100 {
            assert_eq!(record_backend(&p, &s, Err(&e), t), None, "logged once");
        }
        // The breaker stayed closed: calls still go out.
        calls(start(&p, &s, &req("/api/x", &[("x-user", "a")]), 1_200_000));
    }

    #[test]
    fn parse_cost_accepts_only_positive_integers() {
        assert_eq!(parse_cost(b"1"), Some(1));
        assert_eq!(parse_cost(b"007"), Some(7));
        assert_eq!(parse_cost(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"0",
            b"-3",
            b"2.0",
            b"1e3",
            b"18446744073709551616",
            b"\xff",
        ] {
            assert_eq!(parse_cost(bad), None, "{bad:?}");
        }
    }
}
