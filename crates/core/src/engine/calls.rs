//! The worker's backend calls in flight, by the host's token, each with what its answer is for.
//!
//! Invariant: a call is kept from its dispatch until its answer (or until it is handed to the
//! engine that replaces this one), and its answer is taken exactly once; at most the backend's
//! `max_inflight` calls are out per worker.

use std::collections::HashMap;

use super::coalesce::Waiter;
use super::ids::{ById, CheckId, ContextId, Token};
use super::rules::RuleRef;
use crate::backend::ScriptCall;
use crate::shared::lease::Claim;

/// Why a backend call is out.
#[derive(Debug)]
pub(super) enum Purpose {
    /// Check `check` of request `ctx` (exact mode).
    Check { ctx: ContextId, check: CheckId },
    /// The proxy's lease call for `claim`'s key.
    Lease(Claim),
    /// One call for several exact checks of one key (of this worker or sent by others), one
    /// token each, in order.
    Batch(Vec<Waiter>),
    /// Carries a key's pending usage settlement, nothing else (cost 0).
    Settle,
}

#[derive(Debug)]
pub(super) struct Call {
    pub rule: RuleRef,
    pub call: ScriptCall,
    pub purpose: Purpose,
    /// When the first attempt was sent (a denial is cached from then, never later).
    pub sent_ms: u64,
    /// Whether this is the EVAL resend after NOSCRIPT.
    pub with_source: bool,
}

impl Call {
    /// A first attempt (EVALSHA), sent now.
    pub fn new(rule: RuleRef, call: ScriptCall, purpose: Purpose, now: u64) -> Call {
        Call {
            rule,
            call,
            purpose,
            sent_ms: now,
            with_source: false,
        }
    }
}

/// The calls a worker has out.
#[derive(Debug, Default)]
pub(super) struct Calls {
    by_token: HashMap<Token, Call, ById>,
}

impl Calls {
    pub fn len(&self) -> usize {
        self.by_token.len()
    }

    /// Whether `max_inflight` calls are out already.
    pub fn full(&self, max_inflight: u64) -> bool {
        self.by_token.len() as u64 >= max_inflight
    }

    /// Call `token` went out.
    pub fn sent(&mut self, token: Token, call: Call) {
        self.by_token.insert(token, call);
    }

    /// The call `token` answers (None: not this engine's, or answered already).
    pub fn answered(&mut self, token: Token) -> Option<Call> {
        self.by_token.remove(&token)
    }

    /// The calls out that carry a usage settlement.
    pub fn settling(&self) -> impl Iterator<Item = (Token, &Call)> {
        self.by_token
            .iter()
            .filter(|(_, c)| c.call.settle != 0)
            .map(|(token, c)| (*token, c))
    }
}
