//! What a request costs a rule: the rule's `cost`, raised (never lowered) by its `cost_header`.
//!
//! Invariant: the cost a rule charges is never below the rule's `cost`, and never above the
//! burst of the key's limits (such a request could never be admitted: it is refused with 400).

use super::decision::Refusal;
use super::verdict::{LocalReply, Verdict};
use crate::bucket::Limits;
use crate::config::Rule;
use crate::rule::{reading, Read, RequestView};

/// The HTTP status of the answer to a request whose cost is unusable.
pub const BAD_COST_STATUS: u32 = 400;
/// Most digits of a cost header: `u64::MAX` has 20.
const MAX_COST_DIGITS: usize = 20;

/// Why a request's cost is not usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostError {
    Invalid,
    OverBurst { rule: String, burst: u64 },
}

/// Parses a cost header: a plain positive decimal integer, nothing else (no sign, no float, no
/// spaces, not zero, fits in u64).
pub fn parse_cost(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > MAX_COST_DIGITS || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value)
        .ok()?
        .parse::<u64>()
        .ok()
        .filter(|c| *c > 0)
}

/// What `rule` charges `req` under `limits`: its `cost`, raised (never lowered) by `cost_header`,
/// read as a `header:` key reads it (`x_cost` is `x-cost` too, as CGI-style servers read it); a
/// header sent more than once, however spelled, is unusable.
pub fn cost_of(rule: &Rule, limits: &Limits, req: &dyn RequestView) -> Result<u64, CostError> {
    let read = rule.cost_header.as_deref().map_or(Read::Missing, |name| {
        reading::header(req.header_lines(name))
    });
    let asked = match read {
        Read::Value(v) => parse_cost(&v).ok_or(CostError::Invalid)?,
        Read::Ambiguous => return Err(CostError::Invalid),
        Read::Missing => rule.cost,
    };
    let cost = asked.max(rule.cost);
    if cost > limits.burst {
        return Err(CostError::OverBurst {
            rule: rule.name.clone(),
            burst: limits.burst,
        });
    }
    Ok(cost)
}

/// The local reply to a request whose cost for `rule` is unusable.
#[cold]
pub fn bad_cost(rule: &str, e: &CostError) -> Verdict {
    let body = match e {
        CostError::Invalid => "invalid cost header: expected a positive integer\n".to_string(),
        CostError::OverBurst { rule, burst } => format!(
            "request cost exceeds the burst of rule \"{rule}\" ({burst}): it can never be admitted\n"
        ),
    };
    Verdict::Respond(LocalReply {
        status: BAD_COST_STATUS,
        headers: Vec::new(),
        body,
        grpc_status: None,
        details: Refusal::BadCost.details(rule),
    })
}
