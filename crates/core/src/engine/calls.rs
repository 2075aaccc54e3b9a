//! The worker's backend requests in flight (flights), by the host's token, each with the script
//! calls it carries and what each call's answer is for.
//!
//! Invariant: a flight is kept from its dispatch until its answer (or until it is handed to the
//! engine that replaces this one), and its answer is taken exactly once; at most the backend's
//! `max_inflight` flights are out per worker. A flight of one call travels in the script's
//! single form; of several, in its batched form, each call answered by its own slice of the
//! reply, by position.

use std::collections::HashMap;

use super::coalesce::Waiter;
use super::ids::{ById, CheckId, ContextId, Token};
use super::rules::RuleRef;
use crate::backend::ScriptCall;
use crate::shared::lease::Claim;

/// Why a script call is out.
#[derive(Debug)]
pub(super) enum Purpose {
    /// Check `check` of request `ctx` (exact mode).
    Check { ctx: ContextId, check: CheckId },
    /// The proxy's lease call for `claim`'s key.
    Lease(Claim),
    /// One call for several exact checks of one key (of this worker or sent by others), one
    /// token each, in order.
    Batch(Vec<Waiter>),
    /// A [`Purpose::Batch`] call the engine this one replaced sent: its answer goes to the
    /// checks in it (those of its own worker's requests are gone: their shares go back), and it
    /// is not this engine's chain for the key.
    Adopted(Vec<Waiter>),
    /// Carries a key's pending usage settlement, nothing else (cost 0).
    Settle,
    /// Check `ask` of the worker on `queue`, relayed here to ride this worker's flight.
    Relayed { queue: u32, ask: u64 },
}

impl Purpose {
    /// The checks of other workers whose answers this call's answer is: (queue, ask) each.
    pub fn asked_by_others(&self) -> Vec<(u32, u64)> {
        match self {
            Purpose::Relayed { queue, ask } => vec![(*queue, *ask)],
            Purpose::Batch(checks) | Purpose::Adopted(checks) => checks
                .iter()
                .filter_map(|w| match *w {
                    Waiter::Remote { queue, ask } => Some((queue, ask)),
                    Waiter::Local(..) => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// One script call and what its answer is for.
#[derive(Debug)]
pub(super) struct Call {
    pub rule: RuleRef,
    pub call: ScriptCall,
    pub purpose: Purpose,
    /// When it went out (a denial is cached from then, never later).
    pub sent_ms: u64,
}

impl Call {
    pub fn new(rule: RuleRef, call: ScriptCall, purpose: Purpose, now: u64) -> Call {
        Call {
            rule,
            call,
            purpose,
            sent_ms: now,
        }
    }
}

/// One backend request: the calls it carries, each at its position in the request.
#[derive(Debug)]
pub(super) struct Flight {
    /// How many calls the request carried (the reply has one answer per call).
    pub size: usize,
    /// Which of them sent the tracked form (their answers have a 7th integer); empty when none
    /// did (no allocation on the common path).
    pub asks: Vec<bool>,
    /// The calls whose answers matter, with their positions (all of them, but for a flight
    /// adopted from a replaced engine: only its settlements).
    pub calls: Vec<(usize, Call)>,
    /// Whether this is the EVAL resend after NOSCRIPT.
    pub with_source: bool,
    /// Whether it left from the worker's open batch (exact checks and settlements), not as a
    /// lease call.
    pub batched: bool,
}

impl Flight {
    /// [`Flight::asks`] of the calls a request carries, in order.
    pub fn asks<'a>(calls: impl Iterator<Item = &'a ScriptCall> + Clone) -> Vec<bool> {
        if calls.clone().any(ScriptCall::tracked) {
            calls.map(ScriptCall::tracked).collect()
        } else {
            Vec::new()
        }
    }
}

/// The flights a worker has out.
#[derive(Debug, Default)]
pub(super) struct Calls {
    by_token: HashMap<Token, Flight, ById>,
    /// Flights out that left from the open batch.
    batched_out: usize,
}

impl Calls {
    pub fn len(&self) -> usize {
        self.by_token.len()
    }

    /// Whether `max_inflight` flights are out already.
    pub fn full(&self, max_inflight: u64) -> bool {
        self.by_token.len() as u64 >= max_inflight
    }

    /// Whether a flight that left from the open batch is out (the next one waits for its
    /// answer, gathering the checks that come meanwhile).
    pub fn batched_out(&self) -> bool {
        self.batched_out > 0
    }

    /// Flight `token` went out.
    pub fn sent(&mut self, token: Token, flight: Flight) {
        if flight.batched {
            self.batched_out += 1;
        }
        if let Some(old) = self.by_token.insert(token, flight) {
            // A host never reuses a token while its call is out; if one did, the old flight is
            // forgotten (its answer can no longer be told apart).
            self.batched_out -= usize::from(old.batched);
        }
    }

    /// The flight `token` answers (None: not this engine's, or answered already).
    pub fn answered(&mut self, token: Token) -> Option<Flight> {
        let flight = self.by_token.remove(&token)?;
        self.batched_out -= usize::from(flight.batched);
        Some(flight)
    }

    /// The flights out, by token (for the hand-over of their settlements).
    pub fn flights(&self) -> impl Iterator<Item = (Token, &Flight)> {
        self.by_token.iter().map(|(token, f)| (*token, f))
    }
}
