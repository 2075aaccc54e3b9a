//! A rule's `tiers`: which key source may pick a bucket's limits, and the table it picks from.
//!
//! Invariant: a compiled `Tiers` belongs to a rule with a key, and reads its tier from a source
//! the client cannot write (dynamic metadata, filter state, the peer certificate's identity), or
//! from one the configuration explicitly said is `"trusted": true`; never from a literal (the same
//! tier for every request).
//! Each tier's limits are checked as an override's are (`keys::limits_of`), and each tier name is
//! in the form the source's value takes (`keys::override_value`), so a tier applies to exactly
//! the values it names.

use std::collections::BTreeMap;

use super::bounds::{MAX_TIERS, MAX_TIER_NAME_LEN};
use super::compile::has_control;
use super::document as doc;
use super::error::{err, field_name, join, quoted, ConfigError};
use super::keys;
use super::model::{KeySource, Tiers};
use super::quota::PeriodMs;

/// The attributes under `connection` that are the peer's identity as Envoy verified it (its
/// certificate, checked against the listener's trust).
const PEER_IDENTITY: &[&str] = &[
    "uri_san_peer_certificate",
    "dns_san_peer_certificate",
    "subject_peer_certificate",
    "sha256_peer_certificate_digest",
    "mtls",
];

/// Attribute roots whose values filters before tollgate set (the client writes none of them).
const SET_BY_FILTERS: &[&str] = &["metadata", "filter_state", "upstream_filter_state"];

/// Why the client, not Envoy, decides `from`'s value; None for a source a client cannot write.
fn client_controlled(from: &KeySource) -> Option<&'static str> {
    Some(match from {
        KeySource::Metadata { .. } => return None,
        KeySource::Property { path, .. } => {
            let verified = match path.as_slice() {
                [root, ..] if SET_BY_FILTERS.contains(&root.as_str()) => true,
                [conn, attr] => conn == "connection" && PEER_IDENTITY.contains(&attr.as_str()),
                _ => false,
            };
            if verified {
                return None;
            }
            "this attribute is not an identity Envoy verified (the request, the connection's \
             parameters and the addresses are the client's choice)"
        }
        KeySource::Header(_) => "a request header is written by the client",
        KeySource::Query(_) => "a query parameter is written by the client",
        KeySource::Cookie(_) => "a cookie is written by the client",
        KeySource::Path | KeySource::Method | KeySource::Authority => {
            "the request line is written by the client"
        }
        KeySource::ClientIp { .. } => {
            "the client's address is where it connects from, not an identity Envoy verified"
        }
        // Refused before this is asked.
        KeySource::Literal(_) => "a literal is the same for every request",
    })
}

/// A rule's `tiers` at `path`: tiers' `period_ms` default to the rule's, their bursts must hold
/// the rule's cost.
pub fn tiers(
    t: doc::Tiers,
    path: &str,
    (key, path_ignore_case): (&[KeySource], bool),
    rule_period: PeriodMs,
    cost: u64,
) -> Result<Tiers, ConfigError> {
    // Each check takes the bucket under its own tier's limits (a smaller burst clamps it): one
    // bucket for every caller would be cut to the smallest tier by each of its requests.
    if key.is_empty() {
        return Err(err(
            path,
            "needs key sources: a rule without a key has one bucket for every caller, which each \
             request would take under its own tier's limits; key the rule on who the tier is for",
        ));
    }
    let from_path = join(path, "from");
    let from = keys::source(&t.from, &from_path)?;
    if let KeySource::Literal(_) = from {
        return Err(err(
            &from_path,
            format!(
                "a literal picks the same tier for every request: give the rule those limits \
                 (got {})",
                quoted(&t.from)
            ),
        ));
    }
    if let (Some(why), false) = (client_controlled(&from), t.trusted) {
        return Err(err(
            &from_path,
            format!(
                "{} cannot pick a tier: {why}, so a client could pick its own. Use an identity \
                 Envoy verified (metadata:NAMESPACE:FIELD, property:source.principal), or add \
                 \"trusted\": true if a filter before tollgate sets or checks this value",
                quoted(&t.from)
            ),
        ));
    }
    let limits_path = join(path, "limits");
    if t.limits.is_empty() {
        return Err(err(&limits_path, "must name at least one tier"));
    }
    if t.limits.len() > MAX_TIERS {
        return Err(err(
            &limits_path,
            format!(
                "must have at most {MAX_TIERS} tiers (got {})",
                t.limits.len()
            ),
        ));
    }
    let mut out = BTreeMap::new();
    for (name, tier) in t.limits {
        let p = join(&limits_path, &field_name(&name));
        if name.is_empty() || name.len() > MAX_TIER_NAME_LEN || has_control(&name) {
            return Err(err(
                &p,
                format!(
                    "a tier name must be 1 to {MAX_TIER_NAME_LEN} bytes without control \
                     characters"
                ),
            ));
        }
        let value = keys::matched_value(&from, &name, &p, path_ignore_case)?;
        let given = keys::limits_of(
            &p,
            (tier.unlimited, tier.rate, tier.period_ms, tier.burst),
            rule_period,
            cost,
        )?;
        if out.insert(value, given).is_some() {
            return Err(err(
                &p,
                format!("names the same value of {from} as another tier"),
            ));
        }
    }
    Ok(Tiers { from, limits: out })
}
