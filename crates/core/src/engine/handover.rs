//! What an engine hands to the next one when its configuration is replaced: the usage settlements
//! it still owes the backend.
//!
//! Invariant: a settlement pending when a worker's engine is replaced (`on_configure` again on its
//! root, or its root deleted while another root of the same plugin namespace lives on) is flushed
//! by the engine that takes over, under the rule of the same name; none is flushed twice. The
//! amounts stay in shared data throughout (the settle table is keyed by the plugin namespace, not
//! by the engine); what moves is the schedule that flushes them and, on the same root, the calls
//! in flight that carry some, whose failure must put them back.

use std::cmp::Reverse;

use super::{Call, Engine, Host, Purpose};
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
    calls: Vec<(u32, String, ScriptCall, u64, bool)>,
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
        let name = |rule: usize| self.plugin.rule(rule).map(|r| r.name.clone());
        // One flush per key (the earliest): it takes whatever the key has pending then.
        let mut by_key = std::collections::BTreeMap::<String, (u64, usize, Limits)>::new();
        for Reverse((due, rule, key, limits)) in std::mem::take(&mut self.flushes) {
            let first = by_key.entry(key).or_insert((due, rule, limits));
            if due < first.0 {
                *first = (due, rule, limits);
            }
        }
        let flushes = by_key
            .into_iter()
            .filter_map(|(key, (due, rule, limits))| Some((due, name(rule)?, key, limits)))
            .collect();
        let calls = if calls_too {
            self.calls
                .iter()
                .filter(|(_, c)| c.call.settle != 0)
                .filter_map(|(token, c)| {
                    // Only the settlement matters now: the request the call was for belongs to
                    // the outgoing engine.
                    let settle = ScriptCall {
                        settle: c.call.settle,
                        ..ScriptCall::new(c.call.key.clone(), &c.call.limits(), 0)
                    };
                    Some((*token, name(c.rule)?, settle, c.sent_ms, c.with_source))
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
        let index = |name: &str| self.plugin.config.rules.iter().position(|r| r.name == name);
        let mut left = Pending {
            ns: pending.ns,
            ..Pending::default()
        };
        for (due, rule, key, limits) in pending.flushes {
            match index(&rule) {
                Some(i) => self.flushes.push(Reverse((due, i, key, limits))),
                None => left.flushes.push((due, rule, key, limits)),
            }
        }
        for (token, rule, call, sent_ms, with_source) in pending.calls {
            match index(&rule) {
                Some(i) => {
                    let adopted = Call {
                        with_source,
                        ..Call::new(i, call, Purpose::Settle, sent_ms)
                    };
                    self.calls.insert(token, adopted);
                }
                None => left.calls.push((token, rule, call, sent_ms, with_source)),
            }
        }
        let now = self.now(host);
        self.schedule(host, now, false);
        left
    }
}
