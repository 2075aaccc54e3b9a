//! The decision record: what the filter decided for a request, as one short line that Envoy's
//! access log can print (the host keeps it as the request's filter state `wasm.tollgate`; written
//! only with `record_decisions`, since it costs the lease path a host call), and the response
//! code details its local replies carry (always).
//!
//! Invariant: a record and a details string hold only rule names (1 to 64 of `[A-Za-z0-9_-]`,
//! checked by the configuration), fixed words and integers: never a request's bytes (no key,
//! header or path), so they are safe to log, need no escaping in a text or JSON access log, and
//! are bounded: at most `MAX_RULES` entries of at most [`MAX_ENTRY_LEN`] bytes each. Writing one
//! allocates nothing once the engine's buffer has grown to the longest record it has written.
//!
//! The record is the request's checks that got an outcome, in the configuration's order, each
//! `<rule>:<outcome>:<remaining>:<by>`, separated by `,`:
//!
//! ```text
//! per-user:admitted:19:lease,per-client:denied:0:deny_cache
//! ```
//!
//! - `outcome`: `admitted`, `delayed` (admitted on reserved tokens, after a hold), `denied`, or
//!   `shadow_denied` (a shadow rule that would have refused; the request went on);
//! - `remaining`: the tokens left, as the rule's `RateLimit` header would say (0 when denied or
//!   delayed), or `-` when the failure mode answered without a bucket (`failure_open`,
//!   `failure_closed`);
//! - `by`: who answered: `redis` (a script call), `lease` (tokens leased to this proxy, or its
//!   reservation still refilling), `deny_cache` (a denial Redis gave earlier, cached here), or,
//!   when the backend failed, the failure mode: `fallback` (`local`: the per-proxy fallback
//!   bucket), `failure_open`, `failure_closed`.

use super::rules::RuleRef;
use super::verdict::Outcome;
use crate::config::MAX_RULE_NAME_LEN;
use crate::decimal;

/// The property the record is set under: Envoy keeps it as filter state `wasm.tollgate`
/// (`%FILTER_STATE(wasm.tollgate:PLAIN)%` in an access log format).
pub const PROPERTY: &str = "tollgate";

/// The longest entry: the longest rule name, outcome and `by`, a 20-digit number and the
/// separators.
pub const MAX_ENTRY_LEN: usize =
    MAX_RULE_NAME_LEN + "shadow_denied".len() + 20 + "failure_closed".len() + 4;

/// Who answered a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// A script call to Redis (this check's, or one shared with other checks of its key).
    Redis,
    /// Tokens leased to this proxy, or this proxy's reservation for the key still refilling.
    Lease,
    /// A denial Redis gave for the key earlier, cached in this proxy until its retry time.
    DenyCache,
    /// The backend failed; failure mode `local` answered from the per-proxy fallback bucket.
    Fallback,
    /// The backend failed; failure mode `open` admitted.
    FailureOpen,
    /// The backend failed; failure mode `closed` refused.
    FailureClosed,
}

impl By {
    /// Its word in the record.
    pub fn name(self) -> &'static str {
        match self {
            By::Redis => "redis",
            By::Lease => "lease",
            By::DenyCache => "deny_cache",
            By::Fallback => "fallback",
            By::FailureOpen => "failure_open",
            By::FailureClosed => "failure_closed",
        }
    }
}

/// An outcome's word in the record, for a rule that is a shadow rule or not.
fn outcome_name(outcome: Outcome, shadow: bool) -> &'static str {
    match outcome {
        o if o.refuses() && shadow => "shadow_denied",
        Outcome::Denied { .. } | Outcome::FailClosed => "denied",
        Outcome::Reserved { .. } => "delayed",
        Outcome::Allowed { .. } | Outcome::FailOpen => "admitted",
    }
}

/// The tokens left after `outcome`, as the rule's `RateLimit` header would say (None: no bucket
/// answered).
fn remaining(outcome: Outcome) -> Option<u64> {
    match outcome {
        Outcome::Allowed { remaining, .. } => Some(remaining),
        Outcome::Reserved { .. } | Outcome::Denied { .. } => Some(0),
        Outcome::FailOpen | Outcome::FailClosed => None,
    }
}

/// Writes the record of a request's answered checks into `out` (emptied first): `(rule,
/// outcome, by)` in the configuration's order. Empty if there is none.
pub fn write<'a>(out: &mut String, checks: impl Iterator<Item = (&'a RuleRef, Outcome, By)>) {
    out.clear();
    for (rule, outcome, by) in checks {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(&rule.name);
        out.push(':');
        out.push_str(outcome_name(outcome, rule.shadow));
        out.push(':');
        match remaining(outcome) {
            Some(n) => decimal::push(out, n),
            None => out.push('-'),
        }
        out.push(':');
        out.push_str(by.name());
    }
}

/// Why the filter answered a request itself: the first word of its response code details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// An enforced rule denied it (the configured `deny` reply, 429 by default).
    RateLimited,
    /// The backend failed and failure mode `closed` refused it (503).
    BackendUnavailable,
    /// Its cost was unusable: a bad cost header, or a cost above the rule's burst (400).
    BadCost,
}

impl Refusal {
    /// The response code details of the reply (`%RESPONSE_CODE_DETAILS%`), naming the rule:
    /// `tollgate_rate_limited{per-user}`. No whitespace (Envoy would turn it into `_`).
    pub fn details(self, rule: &str) -> String {
        let word = match self {
            Refusal::RateLimited => "tollgate_rate_limited",
            Refusal::BackendUnavailable => "tollgate_backend_unavailable",
            Refusal::BadCost => "tollgate_bad_cost",
        };
        let mut d = String::with_capacity(word.len() + rule.len() + 2);
        d.push_str(word);
        d.push('{');
        d.push_str(rule);
        d.push('}');
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, MAX_RULES};
    use crate::engine::rules::Rules;

    fn rules(json: &str) -> Rules {
        Rules::new(&Config::try_from(json.as_bytes()).unwrap().rules)
    }

    #[test]
    fn each_outcome_and_answer_has_its_words() {
        let rules = rules(
            r#"{"rules":[{"name":"a","key":["header:x"],"rate":10},
                {"name":"s","key":["header:x"],"rate":10,"shadow":true}]}"#,
        );
        let [a, s] = [0, 1].map(|i| rules.iter().nth(i).unwrap());
        let allowed = Outcome::Allowed {
            remaining: 19,
            reset_ms: 5,
            epoch: None,
        };
        let denied = Outcome::Denied { retry_ms: 900 };
        let reserved = Outcome::Reserved {
            delay_ms: 40,
            reset_ms: 900,
            epoch: None,
        };
        let mut out = String::from("left over");
        for (checks, want) in [
            (vec![(a, allowed, By::Lease)], "a:admitted:19:lease"),
            (vec![(a, denied, By::DenyCache)], "a:denied:0:deny_cache"),
            (vec![(a, reserved, By::Redis)], "a:delayed:0:redis"),
            (vec![(s, denied, By::Redis)], "s:shadow_denied:0:redis"),
            (vec![(s, allowed, By::Redis)], "s:admitted:19:redis"),
            (
                vec![(a, Outcome::FailOpen, By::FailureOpen)],
                "a:admitted:-:failure_open",
            ),
            (
                vec![(a, Outcome::FailClosed, By::FailureClosed)],
                "a:denied:-:failure_closed",
            ),
            (
                vec![(s, Outcome::FailClosed, By::FailureClosed)],
                "s:shadow_denied:-:failure_closed",
            ),
            (vec![(a, allowed, By::Fallback)], "a:admitted:19:fallback"),
            (
                vec![(a, allowed, By::Redis), (s, denied, By::Redis)],
                "a:admitted:19:redis,s:shadow_denied:0:redis",
            ),
            (vec![], ""),
        ] {
            write(&mut out, checks.into_iter());
            assert_eq!(out, want);
        }
    }

    #[test]
    fn a_record_is_bounded_by_the_configuration() {
        let name = "n".repeat(MAX_RULE_NAME_LEN);
        let rule = |i: usize| {
            format!(
                r#"{{"name":"{}{i:02}","key":["header:x"],"rate":10,"shadow":true}}"#,
                &name[2..]
            )
        };
        let all: Vec<String> = (0..MAX_RULES).map(rule).collect();
        let rules = rules(&format!(r#"{{"rules":[{}]}}"#, all.join(",")));
        let mut out = String::new();
        let worst = rules
            .iter()
            .map(|r| (r, Outcome::FailClosed, By::FailureClosed));
        write(&mut out, worst);
        assert!(out.len() <= MAX_RULES * MAX_ENTRY_LEN, "{}", out.len());
        let longest = rules.iter().map(|r| {
            let o = Outcome::Allowed {
                remaining: u64::MAX,
                reset_ms: 0,
                epoch: None,
            };
            (r, o, By::FailureClosed)
        });
        write(&mut out, longest);
        assert!(out.len() <= MAX_RULES * MAX_ENTRY_LEN, "{}", out.len());
        assert!(out.bytes().all(|b| b.is_ascii_graphic()), "one token");
    }

    #[test]
    fn details_name_the_rule_without_whitespace() {
        assert_eq!(
            Refusal::RateLimited.details("per-user"),
            "tollgate_rate_limited{per-user}"
        );
        assert_eq!(
            Refusal::BackendUnavailable.details("a_b"),
            "tollgate_backend_unavailable{a_b}"
        );
        assert_eq!(Refusal::BadCost.details("r"), "tollgate_bad_cost{r}");
    }
}
