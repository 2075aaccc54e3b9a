//! Deciding a request: its checks from the rules that match, the local stage's answers, the calls
//! for what is left undecided, and the verdict once its checks say enough.
//!
//! Invariant: a verdict is applied once per request: inside its own `request_headers` it is
//! returned to Envoy from there; otherwise the paused request is resumed, held until its
//! reservation is due, or answered here. A request decided is taken off every wait it was in.

use super::host::{Action, Host};
use super::ids::{CheckId, ContextId};
use super::plugin::Plan;
use super::requests::{Check, Request, Route};
use super::usage::{self, Admitted};
use super::verdict::{is_grpc, Outcome, Source, Verdict};
use super::{cost, describe, Engine};
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
        let mut checks = self.requests.spare_checks();
        // A handle on the rules (a reference count), so the local stage can change the engine.
        let rules = self.plugin.rules().clone();
        for rule in rules.iter() {
            let call = match self.plugin.check_for(rule, req, &mut self.keys) {
                Plan::Skip => continue,
                Plan::Unlimited => {
                    self.plugin.metrics.count(rule.id(), Counter::Allowed, 1);
                    continue;
                }
                Plan::BadCost(e) => {
                    return self.apply(host, ctx, None, cost::bad_cost(&e), false);
                }
                Plan::Check(call) => call,
            };
            let lease = rule.mode == Mode::Lease;
            let (outcome, route) = self.local_outcome(host, rule, &call, lease);
            if let Some(o) = outcome {
                self.plugin.count(rule, (o, Source::Local));
            }
            checks.push(Check {
                rule: rule.clone(),
                call,
                outcome,
                route,
                backend: false,
            });
        }
        let mut request = Request::deciding(checks);
        let cfg = &self.plugin.config;
        // Whether the client speaks gRPC matters only for a local answer: read it only then.
        let verdict = match request.verdict_if_done(cfg) {
            Some(Verdict::Respond(_)) => {
                request.set_grpc(is_grpc(req.header("content-type").as_deref()));
                request.verdict_if_done(cfg)
            }
            other => other,
        };
        if let Some(verdict) = verdict {
            let grpc = request.grpc().unwrap_or(false);
            let mut checks = request.into_checks();
            for c in checks.drain(..) {
                self.keys.recycle(c.call.key);
            }
            self.requests.give_back_checks(checks);
            return self.apply(host, ctx, None, verdict, grpc);
        }
        self.send_undecided(host, ctx, request);
    }

    /// Keeps `request`, which the local stage left undecided, and sends (or queues) the calls its
    /// undecided checks need. Out of line: the local path, which answers most requests, never
    /// runs it, and its code would sit between that path's instructions.
    #[inline(never)]
    fn send_undecided(&mut self, host: &mut dyn Host, ctx: ContextId, request: Request) {
        let undecided: Vec<(CheckId, Route)> = request
            .checks()
            .iter()
            .enumerate()
            .filter(|(_, c)| c.outcome.is_none())
            .map(|(i, c)| (CheckId::at(i), c.route))
            .collect();
        if request.checks().iter().any(|c| c.rule.reads_body()) {
            // Its usage will be read from the body, which the filter reads only unencoded: ask
            // the upstream for that (an answer encoded anyway is charged the worst case).
            host.set_request_header(ctx, "accept-encoding", "identity");
        }
        self.requests.insert(ctx, request);
        let now = self.timer.read(host);
        // A lease call checks the breaker when it is about to go out; the others check it here.
        let own_call = |route: &Route| *route != Route::Lease;
        if undecided.iter().any(|(_, r)| own_call(r)) && !self.backend_allowed(host, now) {
            // The breaker is open: the failure mode answers now, no request waits on a dead backend.
            for (check, _) in undecided.iter().filter(|(_, r)| own_call(r)) {
                self.fail_check(host, ctx, *check, &BackendError::CircuitOpen, now);
            }
        }
        for (check, route) in undecided {
            if !self.requests.is_waiting(ctx, check) {
                continue;
            }
            match route {
                Route::Exact => self.send_exact(host, ctx, check, now),
                Route::Lease => self.wait_for_lease(host, ctx, check, now),
                Route::Alone => self.send_check(host, ctx, check, now),
            }
        }
    }

    /// Records check `check`'s outcome (once), and applies the verdict when the request has one.
    pub(super) fn settle(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        check: CheckId,
        outcome: Outcome,
    ) {
        let Some(request) = self.requests.get_mut(ctx) else {
            return;
        };
        let Some((rule, source)) = request.record(check, outcome) else {
            return;
        };
        self.plugin.count(rule, (outcome, source));
        let cfg = &self.plugin.config;
        let mut verdict = request.verdict_if_done(cfg);
        if matches!(verdict, Some(Verdict::Respond(_))) && request.grpc().is_none() {
            // A local answer after all: its shape depends on whether the client speaks gRPC.
            request.set_grpc(is_grpc(host.request_header(ctx, "content-type").as_deref()));
            verdict = request.verdict_if_done(cfg);
        }
        let grpc = request.grpc().unwrap_or(false);
        if let Some(verdict) = verdict {
            let request = self.requests.remove(ctx);
            self.apply(host, ctx, request, verdict, grpc);
        }
    }

    /// Applies a verdict to `ctx`, whose `request` the caller took out of the engine's requests
    /// (None: decided inside its `request_headers`, it was never kept). Inside its own
    /// `request_headers` the action is returned to Envoy from there; otherwise the paused request
    /// is resumed or answered here.
    fn apply(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        request: Option<Request>,
        verdict: Verdict,
        grpc: bool,
    ) {
        log::debug!("tollgate: {}", describe(&verdict));
        let usage = request
            .map(|r| self.close_request(ctx, &r))
            .unwrap_or_default();
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
                        .insert(ctx, Request::admitted(grpc, shown, usage));
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

    /// Takes decided request `r` of `ctx` off the lease queues it still waits in; its usage
    /// admissions. Out of line: a request decided inside its `request_headers` has none.
    #[inline(never)]
    fn close_request(&mut self, ctx: ContextId, r: &Request) -> Vec<Admitted> {
        for c in r
            .checks()
            .iter()
            .filter(|c| c.route == Route::Lease && c.outcome.is_none())
        {
            self.waits.remove_waiter(&c.call.key, ctx);
        }
        usage::admissions(r.checks())
    }
}
