//! A rule applied to a request: whether its match holds and every key source is present, and if
//! so its bucket key and the limits that hold for it.
//!
//! Invariant: overrides and tiers change a bucket's limits, never its key, and apply only where
//! every reading agrees on the key: never to an ambiguous source, nor to a path that some reading
//! spells otherwise. An ambiguous source keys the request into one bucket per rule (and per the
//! other sources' values), under the rule's own limits. An override for the key wins over the
//! tier; a tier wins over the rule's limits (`tiers`: only a value every reading agrees on picks
//! one).

use std::borrow::Cow;

use super::source::{as_spelled, key_value, reads_the_path};
use super::tiers::{pick, Pick};
use super::{bucket_key_of, matches, path, KeyCache, Part, Read, RequestView};
use crate::bucket::Limits;
use crate::config::{KeySource, Override, Rule};

/// A rule that applies to a request: its bucket and the limits that hold for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// `<prefix>:{<rule>:<digest>}`: the same whatever override applies.
    pub key: String,
    /// The rule's limits, or its override's for this key.
    pub limits: Limits,
    /// An override says this key is not limited: admit without a backend call (still count it).
    /// `limits` are then the rule's, for headers.
    pub unlimited: bool,
    /// A key source was ambiguous ([`Read::Ambiguous`]): `key` is the rule's bucket for ambiguous
    /// requests, under the rule's own limits.
    pub ambiguous: bool,
    /// What decided `limits` (and `unlimited`).
    pub by: LimitsBy,
}

/// What decided the limits of an applying rule's check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitsBy {
    /// The rule's own: no override, no tier (or a value no tier names).
    Rule,
    /// The override for the key.
    Override,
    /// The tier the rule's tier source named.
    Tier,
    /// The rule's own, because the tier source could not be read as one value (named twice, a
    /// list or a struct, a path read differently): counted as ambiguous.
    AmbiguousTier,
}

/// The override of `rule`, which has overrides, for key `values` of `req`, if there is one and
/// every reading of the request agrees on its key: when a source reads the path (`path`, or the
/// attributes `request.path` and `request.url_path`), only if the path as sent is that path under
/// every reading ([`path::agreed`]), as a path match holds under any. Out of line: few rules have
/// overrides, and [`applies`] calls it only for those.
#[inline(never)]
fn override_of<'r>(
    rule: &'r Rule,
    values: &[&[u8]],
    req: &dyn RequestView,
) -> Option<&'r Override> {
    if rule.key.iter().any(|s| reads_the_path(s).is_some()) && !path_agreed(req) {
        return None;
    }
    // A header a filter before tollgate sets: only its own spelling names an override.
    if !rule
        .key
        .iter()
        .zip(values)
        .all(|(s, v)| as_spelled(s, req, v))
    {
        return None;
    }
    let values: Vec<Vec<u8>> = values.iter().map(|v| v.to_vec()).collect();
    rule.overrides.get(&values)
}

/// Whether the request has a path and every reading of it agrees on it ([`path::agreed`]).
pub(super) fn path_agreed(req: &dyn RequestView) -> bool {
    req.header(":path")
        .is_some_and(|full| path::agreed(&full).is_some())
}

/// A key value of `source` (a request's, or an override's or a tier's) as a rule whose path match
/// ignores case or not (`path_ignore_case`) reads it: ASCII lower-cased when the source reads the
/// path and the match ignores case, so `/API/x` and `/api/x`, one path to that rule, share a
/// bucket (and an override written for either).
pub fn as_matched<'v>(
    path_ignore_case: bool,
    source: &KeySource,
    value: Cow<'v, [u8]>,
) -> Cow<'v, [u8]> {
    if path_ignore_case && reads_the_path(source).is_some() {
        Cow::Owned(value.to_ascii_lowercase())
    } else {
        value
    }
}

/// The bucket key and effective limits if the rule's match holds and all key sources are present.
/// `idx` is the rule's index in its configuration (for `keys`).
pub fn applies(
    prefix: &str,
    (idx, rule): (usize, &Rule),
    req: &dyn RequestView,
    keys: &mut KeyCache,
) -> Option<Applied> {
    if !matches(&rule.matcher, req) {
        return None;
    }
    // One source (the usual rule) needs no Vec of values.
    let (one, single, many, refs);
    let values: &[&[u8]] = match rule.key.as_slice() {
        [source] => {
            one = match key_value(source, req) {
                Read::Value(v) => as_matched(rule.matcher.path_ignore_case, source, v),
                Read::Missing => return None,
                Read::Ambiguous => return Some(ambiguous(prefix, rule, &[Part::Ambiguous])),
            };
            single = [&*one];
            &single[..]
        }
        sources => {
            many = sources
                .iter()
                .map(|s| match key_value(s, req) {
                    Read::Value(v) => Some(Some(as_matched(rule.matcher.path_ignore_case, s, v))),
                    Read::Missing => None,
                    Read::Ambiguous => Some(None),
                })
                .collect::<Option<Vec<_>>>()?;
            if many.iter().any(Option::is_none) {
                let parts: Vec<Part<'_>> = many
                    .iter()
                    .map(|v| v.as_deref().map_or(Part::Ambiguous, Part::Value))
                    .collect();
                return Some(ambiguous(prefix, rule, &parts));
            }
            refs = many.iter().flatten().map(|v| &**v).collect::<Vec<_>>();
            &refs
        }
    };
    let overridden = if rule.overrides.is_empty() {
        None
    } else {
        override_of(rule, values, req)
    };
    let (given, by) = match (overridden, &rule.tiers) {
        (Some(o), _) => (Some(o), LimitsBy::Override),
        (None, None) => (None, LimitsBy::Rule),
        (None, Some(tiers)) => match pick(rule, tiers, req) {
            Pick::Tier(t) => (Some(t), LimitsBy::Tier),
            Pick::Default => (None, LimitsBy::Rule),
            Pick::Ambiguous => (None, LimitsBy::AmbiguousTier),
        },
    };
    let (limits, unlimited) = match given {
        None => (rule.limits, false),
        Some(Override::Limits(l)) => (*l, false),
        Some(Override::Unlimited) => (rule.limits, true),
    };
    Some(Applied {
        key: keys.bucket_key(idx, (prefix, &rule.name, &rule.key), values),
        limits: limits.limits(),
        unlimited,
        ambiguous: false,
        by,
    })
}

/// A request one of whose key sources is ambiguous (`parts`, none missing): the rule's bucket for
/// ambiguous requests, under the rule's limits (no override, no tier), its key digested each time (the
/// key cache holds values only). Out of line and cold: only a client that repeats a key source's
/// name comes here.
#[cold]
#[inline(never)]
fn ambiguous(prefix: &str, rule: &Rule, parts: &[Part<'_>]) -> Applied {
    Applied {
        key: bucket_key_of(prefix, &rule.name, &rule.key, parts),
        limits: rule.limits.limits(),
        unlimited: false,
        ambiguous: true,
        by: LimitsBy::Rule,
    }
}
