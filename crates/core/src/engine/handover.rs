//! What an engine hands to the next one when its configuration is replaced: the usage settlements
//! it still owes the backend.
//!
//! Invariant: a settlement pending when a worker's engine is replaced (`on_configure` again on its
//! root, or its root deleted while another root of the same plugin namespace lives on) is flushed
//! by the engine that takes over, under the rule of the same name; none is flushed twice. The
//! amounts in the settle table stay there throughout (it is keyed by the plugin namespace, not by
//! the engine); what moves is the schedule that flushes them, the charges the outgoing engine
//! held stranded (failed calls' charges the table had no room for), and, on the same root, the
//! requests it admitted that still wait for their answer's usage or their reservation's time
//! (their later events reach the next engine), the
//! calls in flight that carry some, whose failure must put them back, and those waiting in the
//! open batch, and the checks other workers relayed or sent for a hot key in those flights, which
//! it answers to them. A deleted root's calls are answered to no engine: what they carried, and
//! what waited in its open batch, is put back first, as a failure would put it back (in shared
//! data, or stranded when it has no room, then moved). Other workers' checks that no call
//! carries yet go back to their workers at once, and those in a deleted root's flights fail into
//! their failure modes (they may have run).

use super::calls::{Call, Flight, Purpose};
use super::coalesce::Told;
use super::host::Host;
use super::ids::{ContextId, Token};
use super::requests::Request;
use super::usage::Flush;
use super::Engine;
use crate::backend::ScriptCall;
use crate::bucket::Limits;
use crate::shared::collect::Collector;
use crate::shared::lead::Leaders;

/// An outgoing engine's pending settlements, by rule name (a new configuration may number its
/// rules differently).
#[derive(Debug, Default)]
pub struct Pending {
    /// The shared-data namespace the settlements are kept under.
    ns: String,
    /// Flushes scheduled: (due, rule name, bucket key, the key's effective limits).
    flushes: Vec<(u64, String, String, Limits)>,
    /// Flights out that carry settlements.
    calls: Vec<Carrying>,
    /// Settlements that were waiting in the open batch: (rule name, the call).
    open: Vec<(String, ScriptCall)>,
    /// Charges held stranded in the worker: (rule name, bucket key, the key's effective limits,
    /// tokens).
    stranded: Vec<(String, String, Limits, u64)>,
    /// The outgoing engine's queue, if it was the proxy's collector: the next engine unnames it
    /// (no flight of it will be answered by the old engine).
    collector: Option<u32>,
    /// What the checks other workers relayed or sent to the outgoing engine are told: not taken
    /// if they were waiting for a call of it (their workers send them), failed if their flight
    /// was out and its root is gone (it may have run; on the same root the next engine answers
    /// them). (queue, ask, told)
    told: Vec<(u32, u64, Told)>,
    /// On the same root: the requests the outgoing engine admitted that are still waiting for
    /// their answer (its usage) or for their reservation's time (held until), by context id.
    /// Their later events reach the next engine, which must know them.
    admitted: Vec<(ContextId, Request, Option<u64>)>,
}

/// A flight in flight with the calls of it the next engine answers.
#[derive(Debug)]
struct Carrying {
    token: Token,
    /// How many calls the flight carried.
    size: usize,
    /// Which of them sent the tracked form (`Flight::asks`).
    asks: Vec<bool>,
    /// Its settling calls and the calls that answer other workers' checks.
    kept: Vec<Kept>,
    with_source: bool,
    batched: bool,
}

/// A call of a flight in flight that the next engine answers: a settlement (the request it was
/// for belongs to the outgoing engine), or a call that answers checks of other workers, relayed
/// or queued for a hot key (each answer goes to that worker's queue, as the outgoing engine
/// would have sent it).
#[derive(Debug)]
struct Kept {
    at: usize,
    rule: String,
    call: ScriptCall,
    sent_ms: u64,
    purpose: Purpose,
}

impl Pending {
    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.flushes.is_empty()
            && self.calls.is_empty()
            && self.open.is_empty()
            && self.stranded.is_empty()
            && self.collector.is_none()
            && self.told.is_empty()
            && self.admitted.is_empty()
    }

    /// Settlements scheduled, stranded or in flight, and checks other workers relayed in flights
    /// (for tests and logs).
    pub fn len(&self) -> usize {
        let in_flight: usize = self.calls.iter().map(|c| c.kept.len()).sum();
        self.flushes.len() + in_flight + self.open.len() + self.stranded.len() + self.admitted.len()
    }
}

/// The call at `at` of a flight in flight, if the next engine answers it: one that answers other
/// workers' checks whole (its own worker's checks in it belong to the outgoing engine: their
/// shares go back), a settlement (see [`settlement_of`]).
fn kept(at: usize, c: &Call) -> Option<Kept> {
    let (call, purpose) = match &c.purpose {
        Purpose::Relayed { queue, ask } => (
            c.call.clone(),
            Purpose::Relayed {
                queue: *queue,
                ask: *ask,
            },
        ),
        Purpose::Batch(checks) | Purpose::Adopted(checks)
            if !c.purpose.asked_by_others().is_empty() =>
        {
            (c.call.clone(), Purpose::Adopted(checks.clone()))
        }
        // Its answer is judged against what went out: a reservation within the call's
        // `max_wait_ms` is the script's answer, not a malformed one (which would put back a
        // charge the script applied).
        _ if c.call.settles() => (
            ScriptCall {
                max_wait_ms: c.call.max_wait_ms,
                ..settlement_of(&c.call)
            },
            Purpose::Settle,
        ),
        _ => return None,
    };
    Some(Kept {
        at,
        rule: c.rule.name.clone(),
        call,
        sent_ms: c.sent_ms,
        purpose,
    })
}

/// Only the settlement of `c` matters to the next engine: the request it was for belongs to the
/// outgoing one.
fn settlement_of(c: &ScriptCall) -> ScriptCall {
    ScriptCall {
        settle: c.settle,
        track: c.track,
        penalty: c.penalty,
        ..ScriptCall::new(c.key.clone(), &c.limits(), 0)
    }
}

impl Engine {
    /// Gives up this engine's pending settlements to the engine that replaces it. `calls_too`:
    /// the answers to this engine's calls in flight will reach the next engine (it replaces this
    /// one on the same root context). Otherwise no engine will see them: what they carried is
    /// pending again in shared data as if they failed after their script may have run (a charge
    /// kept, a refund dropped), and what waited in the open batch as if it never left, each with
    /// a flush for whichever engine adopts it (else the key's next call carries it). Charges held
    /// stranded (no room in the settle table) go to the next engine as they are.
    pub fn hand_over(&mut self, host: &mut dyn Host, calls_too: bool) -> Pending {
        let queued = self
            .chains
            .leave(&Leaders::new(host.store(), &self.plugin.ns));
        let mut waiting = self.open.take();
        let others = |c: &Call, told| {
            let asks = c.purpose.asked_by_others().into_iter();
            asks.map(move |(queue, ask)| (queue, ask, told))
        };
        // No call of this engine carries them.
        let queued = queued
            .into_iter()
            .map(|(queue, ask)| (queue, ask, Told::NotTaken));
        let mut told: Vec<_> = waiting
            .iter()
            .flat_map(|c| others(c, Told::NotTaken))
            .chain(queued)
            .collect();
        if !calls_too {
            let now = self.timer.read(host);
            let in_flight: Vec<_> = self
                .calls
                .flights()
                .flat_map(|(_, f)| &f.calls)
                .filter(|(_, c)| c.call.settles())
                .map(|(_, c)| (c.rule.clone(), c.call.clone(), true))
                .collect();
            let never_left = waiting
                .iter()
                .filter(|c| c.call.settles())
                .map(|c| (c.rule.clone(), c.call.clone(), false));
            let carried: Vec<_> = in_flight.into_iter().chain(never_left).collect();
            for (rule, call, may_have_run) in carried {
                self.settlement_failed(host, &rule, &call, may_have_run, now);
            }
            waiting.retain(|c| !c.call.settles());
        }
        // After the failures above: they may strand charges too.
        let stranded = self
            .usage
            .hand_over_stranded()
            .into_iter()
            .map(|(key, c)| (c.rule.name.clone(), key, c.limits, c.tokens))
            .collect();
        // One flush per key (the earliest): it takes whatever the key has pending then.
        let flushes = self
            .usage
            .hand_over_flushes()
            .into_iter()
            .map(|f| (f.due, f.rule.name.clone(), f.key, f.limits))
            .collect();
        let calls = if calls_too {
            self.calls
                .flights()
                .map(|(token, f)| Carrying {
                    token,
                    size: f.size,
                    asks: f.asks.clone(),
                    kept: f.calls.iter().filter_map(|(at, c)| kept(*at, c)).collect(),
                    with_source: f.with_source,
                    batched: f.batched,
                })
                .filter(|c| !c.kept.is_empty())
                .collect()
        } else {
            Vec::new()
        };
        // Out, and answered to no engine (the root is gone): it may have run.
        let in_flights = self.calls.flights().flat_map(|(_, f)| &f.calls);
        told.extend(
            in_flights
                .filter(|_| !calls_too)
                .flat_map(|(_, c)| others(c, Told::Failed)),
        );
        // Not sent yet: any engine of the namespace can send them.
        let open = waiting
            .into_iter()
            .filter(|c| c.call.settles())
            .map(|c| (c.rule.name.clone(), settlement_of(&c.call)))
            .collect();
        // On the same root every later event of these requests reaches the next engine.
        let admitted = if calls_too {
            self.requests.take_admitted()
        } else {
            Vec::new()
        };
        Pending {
            ns: self.plugin.ns.clone(),
            admitted,
            flushes,
            calls,
            open,
            stranded,
            collector: self.chains.lane().filter(|_| self.collecting),
            told,
        }
    }

    /// Takes over what `pending` names a rule of this configuration for (in the same namespace);
    /// gives back the rest. A rule that is gone leaves its buckets unused (their keys carry the
    /// rule's name), so its settlements no longer matter here.
    pub fn adopt(&mut self, host: &mut dyn Host, mut pending: Pending) -> Pending {
        if let Some(queue) = pending.collector.take() {
            let _ = Collector::new(host.store(), &pending.ns).release(queue);
        }
        for (queue, ask, told) in pending.told.drain(..) {
            self.answers.tell(queue, ask, told);
        }
        if pending.ns != self.plugin.ns {
            // Other workers' checks in flight: no engine of this namespace will answer them.
            for kept in pending.calls.iter_mut().flat_map(|c| &mut c.kept) {
                for (queue, ask) in kept.purpose.asked_by_others() {
                    self.answers.tell(queue, ask, Told::Failed);
                }
                kept.purpose = Purpose::Settle;
            }
            std::mem::take(&mut self.answers).send(host);
            return pending;
        }
        let rules = self.plugin.rules().clone();
        let mut left = Pending {
            ns: pending.ns,
            ..Pending::default()
        };
        for (due, name, key, limits) in pending.flushes {
            match rules.named(&name) {
                Some(rule) => self.usage.adopt_flush(Flush {
                    due,
                    rule: rule.clone(),
                    key,
                    limits,
                }),
                None => left.flushes.push((due, name, key, limits)),
            }
        }
        for carrying in pending.calls {
            let (ours, theirs): (Vec<_>, Vec<_>) = carrying
                .kept
                .into_iter()
                .partition(|k| rules.named(&k.rule).is_some());
            let calls: Vec<(usize, Call)> = ours
                .into_iter()
                .filter_map(|k| {
                    let rule = rules.named(&k.rule)?.clone();
                    Some((k.at, Call::new(rule, k.call, k.purpose, k.sent_ms)))
                })
                .collect();
            // Other workers' checks of a rule this configuration lacks: nothing here can answer
            // them.
            let (lost, theirs): (Vec<_>, Vec<_>) = theirs
                .into_iter()
                .partition(|k| !k.purpose.asked_by_others().is_empty());
            for (queue, ask) in lost.iter().flat_map(|k| k.purpose.asked_by_others()) {
                self.answers.tell(queue, ask, Told::Failed);
            }
            if !calls.is_empty() {
                let flight = Flight {
                    size: carrying.size,
                    asks: carrying.asks.clone(),
                    calls,
                    with_source: carrying.with_source,
                    batched: carrying.batched,
                };
                self.calls.sent(carrying.token, flight);
            }
            if !theirs.is_empty() {
                left.calls.push(Carrying {
                    kept: theirs,
                    ..carrying
                });
            }
        }
        let now = self.timer.read(host);
        // Requests admitted under the old configuration: their answers' usage is settled here,
        // and a held one is let through when due (under the rules of the same names).
        for (ctx, request, until) in pending.admitted {
            let Some(request) = request.rebind(&rules) else {
                continue;
            };
            self.requests.insert(ctx, request);
            if let Some(due) = until {
                self.requests.hold(ctx, due);
            }
        }
        for (name, key, limits, tokens) in pending.stranded {
            match rules.named(&name) {
                Some(rule) => self.strand(&rule.clone(), &key, limits, tokens, now),
                None => left.stranded.push((name, key, limits, tokens)),
            }
        }
        for (name, call) in pending.open {
            match rules.named(&name) {
                Some(rule) => {
                    let settle = Call::new(rule.clone(), call, Purpose::Settle, now);
                    // A failure to send puts it back (`settlement_failed`).
                    let _ = self.enqueue(host, settle);
                }
                None => left.open.push((name, call)),
            }
        }
        self.schedule(host, now, false);
        left
    }
}
