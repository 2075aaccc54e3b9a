//! The requests a worker is deciding, holding for a reservation, or keeping response headers and
//! usage admissions for; each with one check per matching rule.
//!
//! Invariant: a check gets at most one outcome, and only while its request is still deciding; a
//! request is kept by its context id until it is decided and, if admitted, until its response
//! has nothing more to say (headers written, usage settled) or its context is gone. A request
//! decided inside its own `request_headers` is never kept: its action is returned from there.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use super::compaction::worth_compacting;
use super::decision::By;
use super::host::Action;
use super::ids::{ById, CheckId, ContextId};
use super::refund::Refund;
use super::rules::RuleRef;
use super::usage::Admitted;
use super::verdict::{Fold, Outcome, Shown, Source};
use crate::backend::ScriptCall;

/// One matching rule's check of a request.
#[derive(Debug, Clone)]
pub(super) struct Check {
    pub rule: RuleRef,
    pub call: ScriptCall,
    /// Its outcome, and who answered it.
    pub outcome: Option<(Outcome, By)>,
    pub route: Route,
    /// The outcome came from a script call (so the global bucket charged the up-front cost).
    pub backend: bool,
}

/// A matching rule's check as the local stage leaves it, while its request is decided inside its
/// `request_headers` (its rule is the one at the same place in the configuration).
#[derive(Debug)]
pub(super) struct Local {
    pub call: ScriptCall,
    pub outcome: Option<(Outcome, By)>,
    pub route: Route,
}

/// Where a check goes when the local stage has no answer for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// Its own call, or its share of one call for its key (exact mode).
    Exact,
    /// The proxy's lease call for its key.
    Lease,
    /// Its own call: a lease key new to this worker and its proxy, while most new keys lately
    /// were seen only once ([`sightings`](super::sightings)).
    Alone,
}

/// A request the engine is deciding, holding, or keeping response headers for.
#[derive(Debug)]
pub(super) enum Request {
    /// Still deciding: one check per matching rule, in the configuration's order.
    Deciding(Vec<Check>),
    /// Admitted, and kept for its response.
    Admitted {
        /// What the response's headers say (until they are added).
        headers: Option<Shown>,
        /// Usage rules that admitted it, until the response says what it used.
        usage: Vec<Admitted>,
        /// While it is held for a reservation: what the global bucket took for it, given back
        /// if its client leaves before it goes upstream (empty if it is not held).
        held: Vec<Refund>,
    },
}

impl Request {
    /// An admitted request, kept for what its response's headers say and its usage admissions
    /// (`held`: what it took, if it is held for a reservation).
    pub fn admitted(shown: Shown, usage: Vec<Admitted>, held: Vec<Refund>) -> Request {
        Request::Admitted {
            headers: Some(shown),
            usage,
            held,
        }
    }

    /// An admitted request under the rules of the same names in `rules` (a new configuration on
    /// the same root); None for a request still deciding (its checks' calls are the old
    /// engine's).
    pub fn rebind(self, rules: &super::rules::Rules) -> Option<Request> {
        let Request::Admitted {
            headers,
            usage,
            held,
        } = self
        else {
            return None;
        };
        Some(Request::Admitted {
            headers: headers.map(|s| s.rebind(rules)),
            usage: usage.into_iter().filter_map(|a| a.rebind(rules)).collect(),
            held: held.into_iter().filter_map(|r| r.rebind(rules)).collect(),
        })
    }

    /// Its checks while it is being decided.
    pub fn checks(&self) -> &[Check] {
        match self {
            Request::Deciding(checks) => checks,
            Request::Admitted { .. } => &[],
        }
    }

    /// What the response's headers say, once (None: nothing, or written already).
    pub fn take_headers(&mut self) -> Option<Shown> {
        match self {
            Request::Admitted { headers, .. } => headers.take(),
            Request::Deciding(_) => None,
        }
    }

    /// The usage admissions still waiting for the response to say what it used.
    pub fn usage(&self) -> &[Admitted] {
        match self {
            Request::Admitted { usage, .. } => usage,
            Request::Deciding(_) => &[],
        }
    }

    /// The usage admissions, to read the response's usage into (None while deciding).
    pub fn usage_mut(&mut self) -> Option<&mut Vec<Admitted>> {
        match self {
            Request::Admitted { usage, .. } => Some(usage),
            Request::Deciding(_) => None,
        }
    }

    /// Check `check` of this request, if it has no outcome yet.
    pub fn waiting(&self, check: CheckId) -> Option<&Check> {
        self.checks()
            .get(check.place())
            .filter(|c| c.outcome.is_none())
    }

    /// Records `outcome` for `check` (answered `by`), once, while the request is still deciding:
    /// the check's rule and where the outcome came from, to count it (None: nothing recorded).
    pub fn record(
        &mut self,
        check: CheckId,
        outcome: Outcome,
        by: By,
    ) -> Option<(&RuleRef, Source)> {
        let Request::Deciding(checks) = self else {
            return None;
        };
        let check = checks.get_mut(check.place())?;
        if check.outcome.is_some() {
            return None;
        }
        check.outcome = Some((outcome, by));
        // The fallback bucket answers for the failure mode: its admissions are the failure mode's
        // (counted in failure_mode_allowed, settling no usage in Redis), as open's are.
        let source = match (outcome, by) {
            (Outcome::FailOpen | Outcome::FailClosed, _) | (_, By::Fallback) => Source::Failure,
            _ => Source::Backend,
        };
        check.backend = source == Source::Backend;
        Some((&check.rule, source))
    }

    /// Its checks' outcomes folded into a verdict, and whether every check has one.
    pub fn fold(&self) -> (Fold<'_>, bool) {
        let mut fold = Fold::default();
        let mut complete = true;
        for c in self.checks() {
            match c.outcome {
                Some((o, _)) => fold.add(&c.rule, o, c.call.limits()),
                None => complete = false,
            }
        }
        (fold, complete)
    }
}

/// A worker's requests, by context id.
#[derive(Debug, Default)]
pub(super) struct Requests {
    by_ctx: HashMap<ContextId, Request, ById>,
    /// Admitted requests held for a reservation, by due time. A request that goes before it is
    /// due leaves its entry behind until those may outnumber the held requests
    /// ([`worth_compacting`]).
    held: BinaryHeap<Reverse<(u64, ContextId)>>,
    /// The requests held for a reservation now.
    held_now: HashSet<ContextId, ById>,
    /// The request whose `request_headers` is running, and what its verdict says Envoy should do
    /// when that callback returns (a verdict reached inside it is returned, never resumed).
    in_headers: Option<(ContextId, Option<Action>)>,
    /// An empty Vec for the next request's local stage, one slot per rule: a request decided
    /// inside its `request_headers` gives it back, so the local path allocates none.
    spare_slots: Vec<Option<Local>>,
}

impl Requests {
    pub fn len(&self) -> usize {
        self.by_ctx.len()
    }

    pub fn insert(&mut self, ctx: ContextId, request: Request) {
        self.by_ctx.insert(ctx, request);
    }

    pub fn get(&self, ctx: ContextId) -> Option<&Request> {
        self.by_ctx.get(&ctx)
    }

    pub fn get_mut(&mut self, ctx: ContextId) -> Option<&mut Request> {
        self.by_ctx.get_mut(&ctx)
    }

    pub fn remove(&mut self, ctx: ContextId) -> Option<Request> {
        if self.held_now.remove(&ctx) && worth_compacting(self.held.len(), self.held_now.len()) {
            // Entries of requests gone before they were due: a client that leaves a held request
            // must not grow the heap for as long as it would have been held.
            let held_now = &self.held_now;
            self.held.retain(|Reverse((_, c))| held_now.contains(c));
        }
        self.by_ctx.remove(&ctx)
    }

    /// Check `check` of request `ctx`, if the request is still here and the check has no outcome.
    pub fn waiting(&self, ctx: ContextId, check: CheckId) -> Option<&Check> {
        self.by_ctx.get(&ctx)?.waiting(check)
    }

    pub fn is_waiting(&self, ctx: ContextId, check: CheckId) -> bool {
        self.waiting(ctx, check).is_some()
    }

    // ----- the running `request_headers` -----

    /// `request_headers` of `ctx` starts.
    pub fn begin_headers(&mut self, ctx: ContextId) {
        self.in_headers = Some((ctx, None));
    }

    /// `request_headers` ends: what its verdict said Envoy should do (None: undecided).
    pub fn end_headers(&mut self) -> Option<Action> {
        self.in_headers.take().and_then(|(_, action)| action)
    }

    /// Records `action` as the answer of `ctx`'s running `request_headers`; false if `ctx` is not
    /// the request whose headers are being handled (it is paused, and must be resumed).
    pub fn decided_in_headers(&mut self, ctx: ContextId, action: Action) -> bool {
        match &mut self.in_headers {
            Some((current, decided)) if *current == ctx => {
                *decided = Some(action);
                true
            }
            _ => false,
        }
    }

    /// An empty Vec for a request's local stage.
    pub fn spare_slots(&mut self) -> Vec<Option<Local>> {
        std::mem::take(&mut self.spare_slots)
    }

    /// The local stage's Vec, emptied, for the next request.
    pub fn give_back_slots(&mut self, mut slots: Vec<Option<Local>>) {
        slots.clear();
        self.spare_slots = slots;
    }

    // ----- requests held for a reservation -----

    /// Holds admitted request `ctx` until `due`.
    pub fn hold(&mut self, ctx: ContextId, due: u64) {
        self.held.push(Reverse((due, ctx)));
        self.held_now.insert(ctx);
    }

    /// When the first held request is due.
    pub fn next_held(&self) -> Option<u64> {
        self.held.peek().map(|Reverse((due, _))| *due)
    }

    /// The next held request due at `now` that is still here (its client may have left).
    pub fn pop_held(&mut self, now: u64) -> Option<ContextId> {
        while let Some(Reverse((due, ctx))) = self.held.peek().copied() {
            if due > now {
                return None;
            }
            self.held.pop();
            if !self.held_now.remove(&ctx) {
                continue;
            }
            if let Some(r) = self.by_ctx.get_mut(&ctx) {
                // It goes upstream now: nothing of it is given back any more.
                if let Request::Admitted { held, .. } = r {
                    held.clear();
                }
                return Some(ctx);
            }
        }
        None
    }

    /// Gives up every admitted request, each with the time it is held until (None: it went
    /// upstream), for the engine that takes over on the same root.
    pub fn take_admitted(&mut self) -> Vec<(ContextId, Request, Option<u64>)> {
        let ctxs: Vec<ContextId> = self
            .by_ctx
            .iter()
            .filter(|(_, r)| matches!(r, Request::Admitted { .. }))
            .map(|(ctx, _)| *ctx)
            .collect();
        // A request held now has an entry in the heap (the earliest counts); one no longer held
        // may have a stale one.
        let mut due: HashMap<ContextId, u64, ById> = HashMap::default();
        for Reverse((at, ctx)) in &self.held {
            if self.held_now.contains(ctx) {
                let d = due.entry(*ctx).or_insert(*at);
                *d = (*d).min(*at);
            }
        }
        let mut out = Vec::with_capacity(ctxs.len());
        for ctx in ctxs {
            if let Some(r) = self.remove(ctx) {
                out.push((ctx, r, due.get(&ctx).copied()));
            }
        }
        out
    }

    /// Whether `ctx` is held for its reservation (it never went upstream).
    pub fn is_held(&self, ctx: ContextId) -> bool {
        self.held_now.contains(&ctx)
    }

    /// Whether `ctx` was admitted and is still held for its reservation: any answer it gets
    /// now is the proxy's own, not the upstream's (a timeout's).
    pub fn still_held(&self, ctx: ContextId) -> bool {
        matches!(self.get(ctx), Some(Request::Admitted { held, .. }) if !held.is_empty())
            && self.is_held(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_requests_are_let_go_when_due_and_only_if_still_here() {
        let mut r = Requests::default();
        let (a, b, c) = (ContextId::from(1), ContextId::from(2), ContextId::from(3));
        for ctx in [a, b, c] {
            r.insert(
                ctx,
                Request::admitted(Shown::default(), Vec::new(), Vec::new()),
            );
        }
        r.hold(a, 30);
        r.hold(b, 10);
        r.hold(c, 20);
        assert!(r.is_held(a));
        assert_eq!(r.next_held(), Some(10));
        r.remove(c);
        assert_eq!(r.pop_held(9), None, "none due yet");
        assert_eq!(r.pop_held(25), Some(b));
        assert_eq!(r.pop_held(25), None, "c went away: never let go");
        assert_eq!(r.next_held(), Some(30));
        assert_eq!(r.pop_held(30), Some(a));
    }

    #[test]
    fn requests_gone_while_held_do_not_grow_the_heap() {
        let mut r = Requests::default();
        let kept = ContextId::from(1);
        r.insert(
            kept,
            Request::admitted(Shown::default(), Vec::new(), Vec::new()),
        );
        r.hold(kept, 1_000_000);
        for i in 2..100_000u32 {
            let ctx = ContextId::from(i);
            r.insert(
                ctx,
                Request::admitted(Shown::default(), Vec::new(), Vec::new()),
            );
            r.hold(ctx, 500_000);
            assert!(r.is_held(ctx));
            r.remove(ctx);
            assert!(!r.is_held(ctx), "gone: no longer held");
            assert!(
                r.held.len() <= 2 * r.held_now.len() + 65,
                "{}",
                r.held.len()
            );
        }
        assert!(r.next_held().is_some());
        assert_eq!(r.pop_held(999_999), None, "only gone requests were due");
        assert_eq!(r.pop_held(1_000_000), Some(kept));
        assert!(!r.is_held(kept));
    }

    #[test]
    fn a_verdict_inside_request_headers_is_kept_for_that_request_only() {
        let mut r = Requests::default();
        let (a, b) = (ContextId::from(1), ContextId::from(2));
        r.begin_headers(a);
        assert!(!r.decided_in_headers(b, Action::Continue), "b is paused");
        assert!(r.decided_in_headers(a, Action::Pause));
        assert_eq!(r.end_headers(), Some(Action::Pause));
        assert_eq!(r.end_headers(), None, "once");
    }
}
