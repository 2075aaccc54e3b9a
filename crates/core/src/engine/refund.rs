//! Refunds: what the global bucket took for a request that never went upstream (another rule
//! refused it, or its client left before it was let through) is given back, through the usage
//! settlements' path (pending for the key in shared data until a call carries it or its flush
//! sends it).
//!
//! Invariant: an exact-mode rule's admission by a script call (Allowed or Reserved, by Redis:
//! not the failure mode, not a lease) of a request that is refused, or that is gone before it
//! went upstream, is refunded its up-front cost exactly once: at the refusal (or the client's
//! leaving) for the checks answered by then, at the answer for a check whose call was still out
//! (each answer is taken once), and never for a share of a shared call that another request
//! used. A refused request's usage admissions settle nothing else, so nothing is settled twice.
//! Lease-mode rules are left out: their tokens are spent from this proxy's lease without a call.

use super::decision::By;
use super::host::Host;
use super::requests::Check;
use super::rules::RuleRef;
use super::verdict::Outcome;
use super::Engine;
use crate::backend::ScriptCall;
use crate::bucket::Limits;
use crate::config::Mode;
use crate::metrics::{Counter, Metrics};

/// Tokens to give back to one key of a rule.
#[derive(Debug, Clone)]
pub(super) struct Refund {
    rule: RuleRef,
    key: String,
    /// The key's effective limits (a settlement must not change them).
    limits: Limits,
    tokens: u64,
}

impl Refund {
    /// `tokens` of `call` (of `rule`) back, if the rule is one whose admissions are refunded.
    pub fn of_call(rule: &RuleRef, call: &ScriptCall, tokens: u64) -> Option<Refund> {
        (rule.mode == Mode::Exact && tokens > 0).then(|| Refund {
            rule: rule.clone(),
            key: call.key.clone(),
            limits: call.limits(),
            tokens,
        })
    }
}

/// Whether `outcome`, answered `by`, took tokens from the global bucket (an admission by a
/// script call).
pub(super) fn took(outcome: Outcome, by: By) -> bool {
    by == By::Redis && matches!(outcome, Outcome::Allowed { .. } | Outcome::Reserved { .. })
}

/// What the answered checks of a request that never went upstream took from the global bucket.
pub(super) fn of_checks(checks: &[Check]) -> Vec<Refund> {
    checks
        .iter()
        .filter(|c| c.backend && c.outcome.is_some_and(|(o, by)| took(o, by)))
        .filter_map(|c| Refund::of_call(&c.rule, &c.call, c.call.cost))
        .collect()
}

impl Engine {
    /// Gives `refunds` back: each becomes a negative settlement pending for its key.
    pub(super) fn refund(&mut self, host: &mut dyn Host, refunds: Vec<Refund>) {
        if refunds.is_empty() {
            return;
        }
        let now = self.timer.read(host);
        for r in refunds {
            self.plugin
                .metrics
                .count(r.rule.id(), Counter::Refunded, r.tokens);
            let delta = i64::try_from(r.tokens).unwrap_or(i64::MAX).saturating_neg();
            self.settle_pending(host, r.rule, &r.key, r.limits, delta, now);
        }
        // The flush of a refund kept pending, and the counts, need the tick.
        self.schedule(host, now, false);
    }

    /// The answer to a check of `rule` (call `call`) whose request is no longer waiting for it
    /// (refused by another rule, or gone): what it took goes back.
    pub(super) fn refund_late(
        &mut self,
        host: &mut dyn Host,
        (rule, call): (&RuleRef, &ScriptCall),
        (outcome, by): (Outcome, By),
        tokens: u64,
    ) {
        if !took(outcome, by) {
            return;
        }
        let refund = Refund::of_call(rule, call, tokens);
        self.refund(host, refund.into_iter().collect());
    }
}
