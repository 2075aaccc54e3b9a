//! A rule's tiers at request time: the value of the tier source picks the limits of the key's
//! bucket.
//!
//! Invariant: only one value that every reading agrees on picks a tier. A source the request
//! names more than once, a metadata value that is a list or a struct, or a path that some reading
//! spells otherwise picks none and gets the rule's own limits ([`Pick::Ambiguous`], counted),
//! never a higher tier; so does a missing value, or one no tier names ([`Pick::Default`]). A
//! tier never changes the bucket key (`apply`).

use super::apply::{as_matched, path_agreed};
use super::source::key_value;
use super::source::{as_spelled, reads_the_path};
use super::value::{self, Value};
use super::{Read, RequestView};
use crate::config::{KeySource, Override, Rule, Tiers};

/// What a rule's tiers give a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pick<'r> {
    /// The value names this tier.
    Tier(&'r Override),
    /// No value, or one no tier names: the rule's limits.
    Default,
    /// The value cannot be read as one: the rule's limits, and the check counts as ambiguous.
    Ambiguous,
}

/// The tier `tiers` pick for `req`. Out of line: few rules have tiers, and `applies` calls it
/// only for those.
#[inline(never)]
pub(super) fn pick<'r>(rule: &'r Rule, tiers: &'r Tiers, req: &dyn RequestView) -> Pick<'r> {
    let found = |value: &[u8]| tiers.limits.get(value).map_or(Pick::Default, Pick::Tier);
    match &tiers.from {
        KeySource::Metadata { namespace, fields } => {
            let read = req
                .property(&["metadata"])
                .and_then(|metadata| value::metadata_value(&metadata, namespace, fields));
            match read {
                None | Some(Value::Null) => Pick::Default,
                // A list of plans, or an object: no one tier, and its JSON text must not be
                // taken for one.
                Some(Value::Struct(_) | Value::List(_)) => Pick::Ambiguous,
                Some(Value::String(s)) => found(&s),
                Some(scalar) => value::key_text(&scalar).map_or(Pick::Default, |t| found(&t)),
            }
        }
        source => {
            if reads_the_path(source).is_some() && !path_agreed(req) {
                return Pick::Ambiguous;
            }
            match key_value(source, req) {
                // A header a filter before tollgate sets: only its own spelling names a tier.
                Read::Value(v) if !as_spelled(source, req, &v) => Pick::Ambiguous,
                Read::Value(v) => found(&as_matched(rule.matcher.path_ignore_case, source, v)),
                Read::Missing => Pick::Default,
                Read::Ambiguous => Pick::Ambiguous,
            }
        }
    }
}
