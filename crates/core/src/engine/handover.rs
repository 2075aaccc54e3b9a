//! What an engine hands to the next one when its configuration is replaced: the usage settlements
//! it still owes the backend.
//!
//! Invariant: a settlement pending when a worker's engine is replaced (`on_configure` again on its
//! root, or its root deleted while another root of the same plugin namespace lives on) is flushed
//! by the engine that takes over, under the rule of the same name; none is flushed twice. The
//! amounts stay in shared data throughout (the settle table is keyed by the plugin namespace, not
//! by the engine); what moves is the schedule that flushes them and, on the same root, the calls
//! in flight that carry some, whose failure must put them back.

use super::calls::{Call, Purpose};
use super::host::Host;
use super::ids::Token;
use super::usage::Flush;
use super::Engine;
use crate::backend::ScriptCall;
use crate::bucket::Limits;

/// An outgoing engine's pending settlements, by rule name (a new configuration may number its
/// rules differently).
#[derive(Debug, Default)]
pub struct Pending {
    /// The shared-data namespace the settlements are kept under.
    ns: String,
    /// Flushes scheduled: (due, rule name, bucket key, the key's effective limits).
    flushes: Vec<(u64, String, String, Limits)>,
    /// Calls in flight that carry a settlement: (token, rule name, the call, when it was sent,
    /// whether it was the EVAL resend).
    calls: Vec<(Token, String, ScriptCall, u64, bool)>,
}

impl Pending {
    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.flushes.is_empty() && self.calls.is_empty()
    }

    /// Settlements scheduled or in flight (for tests and logs).
    pub fn len(&self) -> usize {
        self.flushes.len() + self.calls.len()
    }
}

impl Engine {
    /// Gives up this engine's pending settlements to the engine that replaces it. `calls_too`:
    /// the answers to this engine's calls in flight will reach the next engine (it replaces this
    /// one on the same root context); otherwise they are left out, as no engine will see them.
    pub fn hand_over(&mut self, calls_too: bool) -> Pending {
        // One flush per key (the earliest): it takes whatever the key has pending then.
        let flushes = self
            .usage
            .hand_over_flushes()
            .into_iter()
            .map(|f| (f.due, f.rule.name.clone(), f.key, f.limits))
            .collect();
        let calls = if calls_too {
            self.calls
                .settling()
                .map(|(token, c)| {
                    // Only the settlement matters now: the request the call was for belongs to
                    // the outgoing engine.
                    let settle = ScriptCall {
                        settle: c.call.settle,
                        penalty: c.call.penalty,
                        ..ScriptCall::new(c.call.key.clone(), &c.call.limits(), 0)
                    };
                    (token, c.rule.name.clone(), settle, c.sent_ms, c.with_source)
                })
                .collect()
        } else {
            Vec::new()
        };
        Pending {
            ns: self.plugin.ns.clone(),
            flushes,
            calls,
        }
    }

    /// Takes over what `pending` names a rule of this configuration for (in the same namespace);
    /// gives back the rest. A rule that is gone leaves its buckets unused (their keys carry the
    /// rule's name), so its settlements no longer matter here.
    pub fn adopt(&mut self, host: &mut dyn Host, pending: Pending) -> Pending {
        if pending.ns != self.plugin.ns {
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
        for (token, name, call, sent_ms, with_source) in pending.calls {
            match rules.named(&name) {
                Some(rule) => {
                    let adopted = Call {
                        with_source,
                        ..Call::new(rule.clone(), call, Purpose::Settle, sent_ms)
                    };
                    self.calls.sent(token, adopted);
                }
                None => left.calls.push((token, name, call, sent_ms, with_source)),
            }
        }
        let now = self.timer.read(host);
        self.schedule(host, now, false);
        left
    }
}
