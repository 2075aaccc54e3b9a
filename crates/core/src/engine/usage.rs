//! What a response's usage means for the bucket (the reading itself is in [`read`]): the
//! difference from the up-front cost, settled through this proxy's pending settlements.
//!
//! Invariant: every admission of a usage rule by the global bucket that may have reached the
//! upstream (not one still held for its reservation) settles exactly once: the usage its
//! response reported, clamped to `[0, cap]`, or, when that never becomes readable (none in the
//! answer, an invalid value, an encoding or a size the reader does not take, a worker already
//! reading its most bodies, a request that ended before its response did), a worst case that is
//! never below what the admission paid up front. So nothing a client or upstream does to the
//! answer lowers a charge below the up-front cost, and only a readable usage below it refunds.
//! A `charge_on` rule's usage is its status ([`status`]): the up-front cost, or nothing for a
//! status outside its set, read at the response headers.

mod charge;
mod flushes;
mod read;
mod readers;
mod status;
mod stranded;
pub use read::{
    encoded, from_headers, parse_header, partial, BodyReader, Chunk, Look, Unreadable, WINDOW,
};
pub use readers::{Readers, MAX_READERS};

pub(super) use charge::{carry_taken, Settlement};
pub(super) use flushes::Flush;
use flushes::Flushes;
pub(super) use stranded::Charge as StrandedCharge;
use stranded::Stranded;
#[cfg(test)]
pub(super) use stranded::MAX_KEYS as MAX_STRANDED;

use super::requests::Check;
use super::rules::RuleRef;
use super::verdict::Outcome;
use crate::bucket::Limits;
use crate::config::UsageSource;
use crate::metrics::{Batched, Counter, Metrics};
use crate::rule::RequestView;

/// The settlement for one admission: usage clamped to `[0, cap]`, minus what was charged up front.
/// Returns (delta, whether the usage was clamped).
pub fn settlement(usage: u64, upfront: u64, cap: u64) -> (i64, bool) {
    let clamped = usage.min(cap);
    let delta = i128::from(clamped) - i128::from(upfront);
    (
        i64::try_from(delta).unwrap_or(if delta > 0 { i64::MAX } else { i64::MIN }),
        usage > cap,
    )
}

/// An admission of a usage rule, waiting for the response to say what it used.
#[derive(Debug)]
pub(super) struct Admitted {
    rule: RuleRef,
    key: String,
    /// The key's effective limits (a settlement must not change them).
    limits: Limits,
    upfront: u64,
    /// The spill epoch and mark of its take (what a refund of it carries; None: the call did
    /// not ask).
    epoch: Option<crate::bucket::Stamp>,
    /// The response's headers have been seen.
    answered: bool,
    /// Following the body, for a `body_field` source.
    reader: Option<BodyReader>,
}

impl Admitted {
    /// This admission under the rule of the same name in `rules` (a new configuration on the same
    /// root), if that rule still reads usage; its key, limits, up-front cost, epoch and reading
    /// so far stay as they were.
    pub(super) fn rebind(self, rules: &super::rules::Rules) -> Option<Admitted> {
        let rule = rules.named(&self.rule.name)?.clone();
        rule.usage.is_some().then_some(Admitted { rule, ..self })
    }
}

/// The usage rules that admitted a request through the global bucket (they charged its up-front
/// cost, so the difference is theirs to settle), from its `checks`. Failure-mode admissions
/// settle nothing.
pub(super) fn admissions(checks: &[Check]) -> Vec<Admitted> {
    checks
        .iter()
        .filter(|c| c.backend)
        .filter(|c| {
            matches!(
                c.outcome,
                Some((Outcome::Allowed { .. } | Outcome::Reserved { .. }, _))
            )
        })
        .filter(|c| c.rule.usage.is_some())
        .map(|c| Admitted {
            rule: c.rule.clone(),
            key: c.call.key.clone(),
            limits: c.call.limits(),
            upfront: c.call.cost,
            epoch: c.outcome.and_then(|(o, _)| o.epoch()),
            answered: false,
            reader: None,
        })
        .collect()
}

/// What one admission of a usage rule used, once known: the usage read, or why there is none.
#[derive(Debug)]
struct Known {
    rule: RuleRef,
    key: String,
    limits: Limits,
    upfront: u64,
    epoch: Option<crate::bucket::Stamp>,
    result: Result<u64, Unreadable>,
}

fn known(a: &Admitted, result: Result<u64, Unreadable>) -> Known {
    Known {
        rule: a.rule.clone(),
        key: a.key.clone(),
        limits: a.limits,
        upfront: a.upfront,
        epoch: a.epoch,
        result,
    }
}

/// A worker's reading of usage: the body readers alive (capped), the settlement flushes
/// scheduled, the charges stranded by failed calls (capped), and whether an unreadable usage and
/// a dropped charge were logged already.
#[derive(Debug, Default)]
pub(super) struct Usage {
    /// The response bodies this worker is reading for usage (capped).
    readers: Readers,
    flushes: Flushes,
    /// Charges of failed calls that the settle table had no room for.
    stranded: Stranded,
    /// Whether an unreadable usage was logged already (once per worker).
    logged: bool,
    /// Whether a dropped charge was logged already (once per worker).
    logged_drop: bool,
}

impl Usage {
    /// The body readers alive in this worker.
    #[cfg(test)]
    pub fn readers(&self) -> &Readers {
        &self.readers
    }

    /// Whether this is the worker's first unreadable usage (logged once per worker).
    fn first_unreadable(&mut self) -> bool {
        !std::mem::replace(&mut self.logged, true)
    }

    /// Whether this is the worker's first dropped charge (logged once per worker).
    fn first_dropped_charge(&mut self) -> bool {
        !std::mem::replace(&mut self.logged_drop, true)
    }

    /// Gives up every stranded charge, in key order (for the engine that takes over).
    pub fn hand_over_stranded(&mut self) -> Vec<(String, StrandedCharge)> {
        self.stranded.take_all()
    }

    /// Keys holding a stranded charge.
    #[cfg(test)]
    pub fn stranded_keys(&self) -> usize {
        self.stranded.len()
    }

    /// When the first settlement flush is due.
    pub fn next_flush(&self) -> Option<u64> {
        self.flushes.next_due()
    }

    /// Gives up every scheduled flush, the earliest of each key (for the engine that takes over).
    pub fn hand_over_flushes(&mut self) -> Vec<Flush> {
        self.flushes.take_earliest_per_key()
    }

    /// Takes over a flush the previous engine scheduled.
    pub fn adopt_flush(&mut self, flush: Flush) {
        self.flushes.push(flush);
    }

    /// Usage from response headers (or, with `trailers`, trailers) for a request's `admissions`:
    /// what became known (those admissions leave), and how much of each body chunk the body
    /// readers look at (None: no reader wants the body).
    /// Body readers start at the headers, and finish at the trailers (the body has ended).
    fn read_headers(
        &self,
        admissions: &mut Vec<Admitted>,
        view: &dyn RequestView,
        trailers: bool,
    ) -> (Vec<Known>, Option<Look>) {
        let (content_type, encoded, partial) = if trailers {
            (None, false, false)
        } else {
            (view.header("content-type"), encoded(view), partial(view))
        };
        let mut found = Vec::new();
        let mut look: Option<Look> = None;
        admissions.retain_mut(|a| {
            // Every admission is of a usage rule ([`admissions`]).
            let Some(usage) = a.rule.usage.as_ref() else {
                return false;
            };
            a.answered = true;
            match &usage.source {
                UsageSource::Header(name) => match from_headers(view, name) {
                    Some(result) => {
                        found.push(known(a, result));
                        false
                    }
                    None if trailers => {
                        found.push(known(a, Err(Unreadable::Missing)));
                        false
                    }
                    // Not in the headers: maybe in the trailers, else missing at the end.
                    None => true,
                },
                // Settled at the headers; trailers without headers (never from Envoy) have no
                // status, so they are charged.
                UsageSource::Status(_) if trailers => {
                    found.push(known(a, Err(Unreadable::Missing)));
                    false
                }
                UsageSource::Status(statuses) => {
                    found.push(known(a, status::used(view, statuses, a.upfront)));
                    false
                }
                UsageSource::BodyField(_) if trailers => {
                    let result = a
                        .reader
                        .take()
                        .map_or(Err(Unreadable::Missing), BodyReader::finish);
                    found.push(known(a, result));
                    false
                }
                UsageSource::BodyField(_) if encoded => {
                    found.push(known(a, Err(Unreadable::Encoded)));
                    false
                }
                // A range of the answer, chosen by the client: not the answer's usage.
                UsageSource::BodyField(_) if partial => {
                    found.push(known(a, Err(Unreadable::TooLarge)));
                    false
                }
                UsageSource::BodyField(path) => {
                    match BodyReader::new(content_type.as_deref(), path, &self.readers) {
                        Ok(reader) => {
                            let needs = reader.look();
                            look = Some(look.map_or(needs, |l| l.and(needs)));
                            a.reader = Some(reader);
                        }
                        // Not JSON or an event stream, or too many readers alive in this
                        // worker: charged the worst case now.
                        Err(why) => {
                            found.push(known(a, Err(why)));
                            return false;
                        }
                    }
                    true
                }
            }
        });
        (found, look)
    }

    /// A chunk of a response body for a request's `admissions`: fed to their readers; at the
    /// end, what they read (those admissions leave).
    fn read_body(
        admissions: &mut Vec<Admitted>,
        chunk: Option<Chunk<'_>>,
        end: bool,
    ) -> Vec<Known> {
        let mut found = Vec::new();
        admissions.retain_mut(|a| {
            let Some(reader) = a.reader.as_mut() else {
                return true;
            };
            match chunk {
                Some(chunk) => reader.feed(chunk),
                None => reader.lose(),
            }
            if !end {
                return true;
            }
            if let Some(reader) = a.reader.take() {
                found.push(known(a, reader.finish()));
            }
            false
        });
        found
    }

    /// The request of these `admissions` ended (its context is gone) before their usage was
    /// settled: a body still being read settles what its stream showed so far, or the worst
    /// case; a usage header that came in neither the headers nor trailers is missing; a
    /// response that never came is unfinished.
    fn at_end(admissions: &[Admitted], metrics: &Batched) -> Vec<Known> {
        admissions
            .iter()
            .map(|a| {
                let result = match a.reader.as_ref().and_then(BodyReader::seen) {
                    Some(seen) => {
                        // Counted here: the usage seen settles like any other.
                        metrics.count(a.rule.id(), Counter::UsageUnfinished, 1);
                        seen
                    }
                    None if a.answered && a.reader.is_none() => Err(Unreadable::Missing),
                    None => Err(Unreadable::Unfinished),
                };
                known(a, result)
            })
            .collect()
    }
}

/// One usage rule, `llm` (for the unit tests of this module's parts).
#[cfg(test)]
fn usage_rules() -> super::rules::Rules {
    let json = br#"{"rules":[{"name":"llm","key":["header:x-user"],"rate":1,
        "usage":{"header":"x-used"}}]}"#;
    let config = crate::config::Config::try_from(&json[..]).expect("a valid configuration");
    super::rules::Rules::new(&config.rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settlements_charge_refund_and_clamp() {
        assert_eq!(settlement(40, 1, 400), (39, false));
        assert_eq!(settlement(0, 10, 400), (-10, false));
        assert_eq!(settlement(u64::MAX, 1, 400), (399, true));
    }
}
