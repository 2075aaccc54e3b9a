//! Deciding a request: its checks from the rules that match, the local stage's answers, the calls
//! for what is left undecided, and the verdict once its checks say enough.
//!
//! Invariant: a verdict is applied once per request: inside its own `request_headers` it is
//! returned to Envoy from there; otherwise the paused request is resumed, held until its
//! reservation is due, or answered here. A request decided is taken off every wait it was in.

use super::decision::{self, By};
use super::host::{Action, Host};
use super::ids::{CheckId, ContextId};
use super::local::LocalStage;
use super::plugin::Plan;
use super::refund::{self, Refund};
use super::requests::{Check, Local, Request, Route};
use super::rules::RuleRef;
use super::usage::{self, Admitted};
use super::verdict::{is_grpc, Fold, Outcome, Source, Verdict};
use super::{coalesce, cost, describe, Engine};
use crate::backend::BackendError;
use crate::config::Mode;
use crate::metrics::{Counter, Metrics};
use crate::rule::RequestView;

impl Engine {
    pub(super) fn decide_headers(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        req: &dyn RequestView,
    ) {
        let rules = self.plugin.rules();
        // One slot per rule, in order: a matching rule's check, or None.
        let mut slots = self.requests.spare_slots();
        let mut stage = LocalStage {
            plugin: &self.plugin,
            stashes: &mut self.stashes,
            sightings: &mut self.sightings,
            waits: &mut self.waits,
            timer: &mut self.timer,
        };
        // The local path's verdict, folded as the checks get their outcomes: no check is built
        // (nor a rule handle taken) unless the request must be kept.
        let mut fold = Fold::default();
        let mut undecided = false;
        let mut bad_cost = None;
        for rule in rules.iter() {
            let call = match self.plugin.check_for(rule, req, &mut self.keys) {
                Plan::Skip => {
                    slots.push(None);
                    continue;
                }
                Plan::Unlimited => {
                    self.plugin.metrics.count(rule.id(), Counter::Allowed, 1);
                    slots.push(None);
                    continue;
                }
                Plan::BadCost(e) => {
                    bad_cost = Some((rule.clone(), e));
                    break;
                }
                Plan::Check(call) => call,
            };
            let lease = rule.mode == Mode::Lease;
            let (outcome, route) = stage.outcome(host, rule, &call, lease);
            match outcome {
                Some((o, _)) => {
                    self.plugin.count(rule, (o, Source::Local));
                    fold.add(rule, o, call.limits());
                }
                None => undecided = true,
            }
            slots.push(Some(Local {
                call,
                outcome,
                route,
            }));
        }
        if let Some((rule, e)) = bad_cost {
            self.requests.give_back_slots(slots);
            return self.apply(
                host,
                ctx,
                cost::bad_cost(&rule.name, &e),
                Default::default(),
            );
        }
        if undecided && !fold.refuses() {
            return self.keep_undecided(host, ctx, slots);
        }
        // Whether the client speaks gRPC matters only for a local answer: read it only then.
        let grpc = fold.refuses() && is_grpc(req.header("content-type").as_deref());
        let verdict = fold.verdict(&self.plugin.config, grpc);
        if self.plugin.config.record_decisions {
            let answered = rules.iter().zip(&slots).filter_map(|(rule, slot)| {
                let (outcome, by) = slot.as_ref()?.outcome?;
                Some((rule, outcome, by))
            });
            record(host, ctx, &mut self.record, answered);
        }
        for local in slots.drain(..).flatten() {
            self.keys.recycle(local.call.key);
        }
        self.requests.give_back_slots(slots);
        self.apply(host, ctx, verdict, Default::default());
    }

    /// Keeps the request of `ctx`, which the local stage left undecided (`slots`: its checks as
    /// the local stage left them, one slot per rule), and sends (or queues) the calls its
    /// undecided checks need. Each check takes its rule: the one of its slot (the local stage
    /// pushed one slot per rule, in order, so the two line up). Out of line: the local path,
    /// which answers most requests, never runs it, and its code would sit between that path's
    /// instructions.
    #[inline(never)]
    fn keep_undecided(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        mut slots: Vec<Option<Local>>,
    ) {
        let checks = self
            .plugin
            .rules()
            .iter()
            .zip(slots.drain(..))
            .filter_map(|(rule, slot)| {
                let local = slot?;
                Some(Check {
                    rule: rule.clone(),
                    call: local.call,
                    outcome: local.outcome,
                    route: local.route,
                    backend: false,
                })
            })
            .collect();
        self.requests.give_back_slots(slots);
        self.send_undecided(host, ctx, checks);
    }

    /// Keeps the request of `ctx`, decided by `checks`, and sends (or queues) the calls its
    /// undecided checks need.
    fn send_undecided(&mut self, host: &mut dyn Host, ctx: ContextId, checks: Vec<Check>) {
        // A lease call checks the breaker when it is about to go out, a flight when it leaves
        // (the half-open probe is claimed then); an open breaker refuses the others here.
        let own_call = |c: &Check| c.route != Route::Lease;
        let n = checks.len();
        let calls_own = checks.iter().any(|c| c.outcome.is_none() && own_call(c));
        if checks.iter().any(|c| c.rule.reads_body()) {
            // Its usage will be read from the body, which the filter reads only unencoded: ask
            // the upstream for that (an answer encoded anyway is charged the worst case).
            host.set_request_header(ctx, "accept-encoding", "identity");
        }
        self.requests.insert(ctx, Request::Deciding(checks));
        let now = self.timer.read(host);
        if calls_own && self.breaker_refuses(host, now) {
            // The breaker is open: the failure mode answers now, no request waits on a dead backend.
            for check in (0..n).map(CheckId::at) {
                if self.requests.waiting(ctx, check).is_some_and(own_call) {
                    self.fail_check(host, ctx, check, &BackendError::CircuitOpen, now);
                }
            }
        }
        // Each check still undecided when its turn comes (an earlier one's failure mode may have
        // answered the request).
        for check in (0..n).map(CheckId::at) {
            let Some(route) = self.requests.waiting(ctx, check).map(|c| c.route) else {
                continue;
            };
            match route {
                Route::Exact => self.send_exact(host, ctx, check, now),
                Route::Lease => self.wait_for_lease(host, ctx, check, now),
                Route::Alone => self.send_check(host, ctx, check, now),
            }
        }
    }

    /// Records check `check`'s outcome (once), answered `by`, and applies the verdict when the
    /// request has one.
    pub(super) fn settle(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        check: CheckId,
        (outcome, by): (Outcome, By),
    ) {
        let Some(request) = self.requests.get_mut(ctx) else {
            return;
        };
        let Some((rule, source)) = request.record(check, outcome, by) else {
            return;
        };
        self.plugin.count(rule, (outcome, source));
        let (fold, complete) = request.fold();
        if !fold.refuses() && !complete {
            return;
        }
        // A local answer after all: its shape depends on whether the client speaks gRPC.
        let grpc = fold.refuses() && is_grpc(host.request_header(ctx, "content-type").as_deref());
        let verdict = fold.verdict(&self.plugin.config, grpc);
        let Some(request) = self.requests.remove(ctx) else {
            return;
        };
        if self.plugin.config.record_decisions {
            let answered = request.checks().iter().filter_map(|c| {
                let (outcome, by) = c.outcome?;
                Some((&c.rule, outcome, by))
            });
            record(host, ctx, &mut self.record, answered);
        }
        let usage = self.close_request(ctx, &request);
        let held = match &verdict {
            // It never goes upstream: what the global bucket took for it goes back (its usage
            // admissions settle nothing else).
            Verdict::Respond(_) => {
                self.refund(host, refund::of_checks(request.checks()));
                Vec::new()
            }
            // Held for a reservation: given back if its client leaves meanwhile.
            Verdict::Allow(shown) if shown.delay_ms > 0 => refund::of_checks(request.checks()),
            Verdict::Allow(_) => Vec::new(),
        };
        self.apply(host, ctx, verdict, (usage, held));
    }

    /// Applies the verdict of `ctx` (`usage`: the usage admissions of its request, if it was kept;
    /// `held`: what it took, if it is held for a reservation). Inside its own `request_headers`
    /// the action is returned to Envoy from there; otherwise the paused request is resumed or
    /// answered here.
    fn apply(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        verdict: Verdict,
        (usage, held): (Vec<Admitted>, Vec<Refund>),
    ) {
        log::debug!("tollgate: {}", describe(&verdict));
        match verdict {
            Verdict::Respond(reply) => {
                host.respond(ctx, &reply);
                self.requests.decided_in_headers(ctx, Action::Pause);
            }
            Verdict::Allow(shown) => {
                let delay_ms = shown.delay_ms;
                let style = self.plugin.config.response_headers;
                if shown.any(style) || !usage.is_empty() {
                    self.requests
                        .insert(ctx, Request::admitted(shown, usage, held));
                }
                if delay_ms > 0 {
                    let now = self.timer.read(host);
                    self.requests.hold(ctx, now.saturating_add(delay_ms));
                    self.schedule(host, now, false);
                    self.requests.decided_in_headers(ctx, Action::Pause);
                } else if !self.requests.decided_in_headers(ctx, Action::Continue) {
                    host.resume(ctx);
                }
            }
        }
    }

    /// Takes decided request `r` of `ctx` off the lease queues and key chains it still waits in;
    /// its usage admissions.
    fn close_request(&mut self, ctx: ContextId, r: &Request) -> Vec<Admitted> {
        self.leave_waits(ctx, r.checks());
        usage::admissions(r.checks())
    }

    /// The checks of request `ctx` (decided or gone: no longer among the requests) that have no
    /// outcome leave the lease queues and key chains they wait in; whether any had none.
    pub(super) fn leave_waits(&mut self, ctx: ContextId, checks: &[Check]) -> bool {
        let mut waited = false;
        for (place, c) in checks.iter().enumerate() {
            if c.outcome.is_some() {
                continue;
            }
            waited = true;
            match c.route {
                Route::Lease => self.waits.left(&c.call.key, ctx, CheckId::at(place)),
                Route::Exact => {
                    let requests = &self.requests;
                    self.chains
                        .left(&c.call.key, |w| coalesce::waited_for(requests, w));
                }
                Route::Alone => {}
            }
        }
        waited
    }
}

/// Writes the decision record of request `ctx` from its answered checks into `buf` (the engine's,
/// reused), and gives it to the host; nothing if no check was answered.
fn record<'a>(
    host: &mut dyn Host,
    ctx: ContextId,
    buf: &mut String,
    answered: impl Iterator<Item = (&'a RuleRef, Outcome, By)>,
) {
    decision::write(buf, answered);
    if !buf.is_empty() {
        host.record_decision(ctx, buf);
    }
}
