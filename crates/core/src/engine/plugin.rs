//! The configuration plus what is derived from it once per configure (its rules with their ids and
//! policy values, the transport, the shared-data namespace, the batched metrics), and what one
//! rule means for a request.
//!
//! Invariant: a rule's check carries the key's effective limits and a cost never below the rule's
//! `cost`; every check that gets an outcome counts exactly once in exactly one of `allowed`,
//! `denied` or `shadow_denied`.

use super::cost::{cost_of, CostError};
use super::rules::{RuleId, RuleRef, Rules};
use super::verdict::{Admit, Outcome, Shown, Source};
use crate::backend::{ScriptCall, Transport};
use crate::config::{Config, Protocol};
use crate::headers;
use crate::metrics::{Batched, Counter, Metrics, NoMetrics};
use crate::rule::{KeyCache, RequestView};

/// The version of the shared-data layout (set-associative leases of `shared::lease` entries, one health value,
/// pending settlements of `shared::settle` entries: a charge and a refund with its spill epoch),
/// part of every shared-data key: a module upgrade in place starts with fresh tables instead of
/// misreading old ones.
const SHARED_LAYOUT: &str = "v7";
/// A check waits for a call already out for it (a lease call, a leader's) this many backend
/// timeouts (a call and its NOSCRIPT resend); then that call is taken as lost. A lease wait counts
/// them from its worker's own call for the key once that goes out (`lease::Waits::sent`).
const PATIENCE_TIMEOUTS: u64 = 2;

pub struct Plugin {
    pub config: Config,
    pub transport: Box<dyn Transport>,
    /// Prefix of this plugin's shared-data keys (Istio gives all plugins of a proxy one namespace).
    pub ns: String,
    /// The metrics given to [`Plugin::with_metrics`], their counts batched: the engine flushes
    /// them when due.
    pub metrics: Batched,
    /// The configuration's rules, each with its id and policy value.
    rules: Rules,
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
        let rules = Rules::new(&config.rules);
        let ns = format!("tollgate|{SHARED_LAYOUT}|{}", config.key_prefix);
        Plugin {
            metrics: Batched::new(metrics, rules.len()),
            config,
            transport,
            ns,
            rules,
        }
    }

    /// The configuration's rules, in order.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The rule of a check another worker sent, at place `id` in its configuration, for bucket
    /// key `key` ([`Rules::of_key`]).
    pub fn rule_of_key(&self, id: RuleId, key: &str) -> Option<RuleRef> {
        self.rules.of_key(id, &self.config.key_prefix, key).cloned()
    }

    /// How long a check waits for a call already out for it before that call is taken as lost.
    pub fn patience_ms(&self) -> u64 {
        self.config
            .backend
            .timeout_ms
            .saturating_mul(PATIENCE_TIMEOUTS)
    }

    /// What `rule` means for `req` (`keys`: this worker's cache of bucket keys).
    pub fn check_for(&self, rule: &RuleRef, req: &dyn RequestView, keys: &mut KeyCache) -> Plan {
        let prefix = &self.config.key_prefix;
        let Some(applied) = crate::rule::applies(prefix, (rule.id().index(), rule), req, keys)
        else {
            return Plan::Skip;
        };
        if applied.ambiguous || applied.by == crate::rule::LimitsBy::AmbiguousTier {
            self.metrics.count(rule.id(), Counter::Ambiguous, 1);
        }
        if applied.unlimited {
            return Plan::Unlimited;
        }
        let limits = applied.limits;
        let cost = match cost_of(rule, &limits, req) {
            Ok(c) => c,
            Err(e) => return Plan::BadCost(e),
        };
        Plan::Check(ScriptCall {
            // A shadow rule never holds a request.
            max_wait_ms: if rule.shadow { 0 } else { rule.max_wait_ms },
            penalty: rule.penalty,
            ..ScriptCall::new(applied.key, &limits, cost)
        })
    }

    /// Writes the headers of an admitted request's response into `buf` (the rule's policy value
    /// comes from the configuration's, unless an override changed its limits).
    pub fn write_headers(&self, shown: &Shown, buf: &mut String) -> headers::Written {
        let admit = shown.admit.as_ref();
        let report = admit.map(Admit::report);
        let policy = admit
            .filter(|a| a.limits == a.rule.limits)
            .map(|a| a.rule.policy());
        let style = self.config.response_headers;
        headers::write(style, report.as_ref(), policy, shown.delay_ms, buf)
    }

    /// Counts one check's outcome: exactly one of allowed / denied / shadow_denied, plus where it
    /// came from.
    pub fn count(&self, rule: &RuleRef, (outcome, source): (Outcome, Source)) {
        let (m, id) = (&self.metrics, rule.id());
        match outcome {
            Outcome::Reserved { delay_ms, .. } => {
                m.count(id, Counter::Allowed, 1);
                m.count(id, Counter::Delayed, 1);
                m.count(id, Counter::DelayMs, delay_ms);
            }
            Outcome::Allowed { .. } | Outcome::FailOpen => {
                m.count(id, Counter::Allowed, 1);
                match source {
                    Source::Local => m.count(id, Counter::LocalAllowed, 1),
                    Source::Failure => m.count(id, Counter::FailureModeAllowed, 1),
                    Source::Backend => {}
                }
            }
            Outcome::Denied { .. } | Outcome::FailClosed => {
                let denied = if rule.shadow {
                    Counter::ShadowDenied
                } else {
                    Counter::Denied
                };
                m.count(id, denied, 1);
                if source == Source::Local {
                    m.count(id, Counter::LocalDenied, 1);
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
    /// Check this script call. The call carries the key's effective limits (the rule's, or an
    /// override's).
    Check(ScriptCall),
}
