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
//!
//! A refund gives back what the bucket would still have been short of its cap since the tokens
//! were taken, so it carries the spill epoch its take's reply gave (the script's header, "The
//! spill epoch"). A take asks for it only where it may be refunded ([`Engine::may_refund`]); the
//! refund of a take whose reply has none (a rule alone in its configuration, whose client left
//! while its call was out) is dropped and counted in `refund_dropped`.

use super::decision::By;
use super::host::Host;
use super::requests::Check;
use super::rules::RuleRef;
use super::usage::Settlement;
use super::verdict::Outcome;
use super::Engine;
use crate::backend::ScriptCall;
use crate::bucket::Limits;
use crate::config::Mode;
use crate::metrics::{Counter, Metrics};
use crate::shared::settle;

/// Tokens to give back to one key of a rule.
#[derive(Debug, Clone)]
pub(super) struct Refund {
    rule: RuleRef,
    key: String,
    /// The key's effective limits (a settlement must not change them).
    limits: Limits,
    tokens: u64,
    /// The spill epoch and mark its take's reply gave (None: the call did not ask).
    epoch: Option<crate::bucket::Stamp>,
}

impl Refund {
    /// `tokens` of `call` (of `rule`), admitted with `outcome`, back, if the rule is one whose
    /// admissions are refunded.
    pub fn of_call(
        rule: &RuleRef,
        call: &ScriptCall,
        outcome: Outcome,
        tokens: u64,
    ) -> Option<Refund> {
        (rule.mode == Mode::Exact && tokens > 0).then(|| Refund {
            rule: rule.clone(),
            key: call.key.clone(),
            limits: call.limits(),
            tokens,
            epoch: outcome.epoch(),
        })
    }
}

impl Refund {
    /// This refund under the rule of the same name in `rules` (a new configuration on the same
    /// root), if it has one.
    pub fn rebind(self, rules: &super::rules::Rules) -> Option<Refund> {
        let rule = rules.named(&self.rule.name)?.clone();
        Some(Refund { rule, ..self })
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
        .filter(|c| c.backend)
        .filter_map(|c| {
            let (o, by) = c.outcome?;
            took(o, by).then(|| Refund::of_call(&c.rule, &c.call, o, c.call.cost))?
        })
        .collect()
}

impl Engine {
    /// Whether an admission by `rule` may be refunded, so its call asks for the bucket's spill
    /// epoch: an exact-mode rule with usage (or `charge_on`), one that holds requests for a
    /// reservation (a client may leave first), or one beside other rules (another may refuse
    /// the request). A lone rule's calls never ask: a key that is never refunded stores no
    /// epoch and its replies carry none.
    pub(super) fn may_refund(&self, rule: &RuleRef) -> bool {
        rule.mode == Mode::Exact
            && (rule.usage.is_some() || rule.max_wait_ms > 0 || self.plugin.rules().len() > 1)
    }

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
            let Some(stamp) = r.epoch else {
                let m = &self.plugin.metrics;
                m.count(r.rule.id(), Counter::RefundDropped, r.tokens);
                continue;
            };
            let refund = settle::Refund {
                tokens: r.tokens,
                epoch: stamp.epoch,
                mark: stamp.mark,
            };
            let s = Settlement::Refund(refund);
            self.settle_pending(host, r.rule, &r.key, r.limits, s, now);
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
        let refund = Refund::of_call(rule, call, outcome, tokens);
        self.refund(host, refund.into_iter().collect());
    }
}
