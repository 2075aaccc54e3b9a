//! A rule's key: the key-source grammar, and the overrides' key values.
//!
//! Invariant: a compiled `KeySource` is one the filter can read (a header or cookie name of token
//! characters, a `property:` path under an attribute Envoy documents and knows at request time,
//! `client_ip` prefixes within the address's bits), and an override's key tuple is in the form a
//! request's values take (`client_ip` as the source writes it, `authority` lower-cased, `path`
//! normalised, a cookie value unquoted), so an override applies to exactly the requests it names.

use std::collections::BTreeMap;

use super::bounds::{MAX_KEY_SOURCES, MAX_OVERRIDES, MAX_PATH_SEGMENTS};
use super::compile::{has_control, is_token, quota};
use super::document as doc;
use super::error::{err, index, join, quoted, ConfigError};
use super::model::{KeySource, Override};
use super::quota::{PeriodMs, Tokens};
use crate::rule::ip::{DEFAULT_V4_PREFIX, DEFAULT_V6_PREFIX};

const KEY_SOURCE_HELP: &str = "expected header:NAME, query:NAME, cookie:NAME, client_ip, \
     client_ip:v4=/N,v6=/M, path, method, authority, literal:TEXT, property:PATH or \
     metadata:NAMESPACE:FIELD";

/// The attributes Envoy documents, by first path segment (`response.*` is not known yet when a
/// request is checked, so it is not here).
const PROPERTY_ROOTS: &[&str] = &[
    "request",
    "connection",
    "source",
    "destination",
    "upstream",
    "metadata",
    "filter_state",
    "upstream_filter_state",
    "xds",
    "node",
    "plugin_name",
    "plugin_root_id",
    "plugin_vm_id",
];

/// `property:` spellings that name another attribute: Envoy has no `source.principal` (Istio's
/// name for the peer's identity); the peer certificate's URI SAN (a SPIFFE ID in a mesh) is it.
const PROPERTY_ALIASES: &[(&str, &str)] =
    &[("source.principal", "connection.uri_san_peer_certificate")];

/// A rule's `key`.
pub fn sources(items: &[String], path: &str) -> Result<Vec<KeySource>, ConfigError> {
    if items.len() > MAX_KEY_SOURCES {
        return Err(err(
            path,
            format!(
                "must have at most {MAX_KEY_SOURCES} key sources (got {})",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, s)| source(s, &index(path, i)))
        .collect()
}

/// One key source (also a tier's `from`).
pub(super) fn source(s: &str, path: &str) -> Result<KeySource, ConfigError> {
    match s {
        "client_ip" => return Ok(KeySource::CLIENT_IP),
        "path" => return Ok(KeySource::Path),
        "method" => return Ok(KeySource::Method),
        "authority" => return Ok(KeySource::Authority),
        _ => {}
    }
    if let Some(spec) = s.strip_prefix("client_ip:") {
        return client_ip(spec, s, path);
    }
    if let Some(name) = s.strip_prefix("header:") {
        if !is_token(name) {
            return Err(err(
                path,
                format!(
                    "header:NAME needs a non-empty header name of token characters (got {})",
                    quoted(s)
                ),
            ));
        }
        if name.eq_ignore_ascii_case("host") {
            return Err(host_is_the_authority(s, path));
        }
        return Ok(KeySource::Header(name.to_ascii_lowercase()));
    }
    if let Some(name) = s.strip_prefix("query:") {
        if name.is_empty() {
            return Err(err(
                path,
                format!("query:NAME needs a non-empty name (got {})", quoted(s)),
            ));
        }
        return Ok(KeySource::Query(name.to_owned()));
    }
    if let Some(name) = s.strip_prefix("cookie:") {
        if !is_token(name) {
            return Err(err(
                path,
                format!(
                    "cookie:NAME needs a non-empty cookie name of token characters (got {})",
                    quoted(s)
                ),
            ));
        }
        return Ok(KeySource::Cookie(name.to_owned()));
    }
    if let Some(spelled) = s.strip_prefix("property:") {
        return property(spelled, s, path);
    }
    if let Some(spec) = s.strip_prefix("metadata:") {
        return metadata(spec, s, path);
    }
    if let Some(text) = s.strip_prefix("literal:") {
        if text.is_empty() {
            return Err(err(
                path,
                format!("literal:TEXT needs a non-empty text (got {})", quoted(s)),
            ));
        }
        return Ok(KeySource::Literal(text.to_owned()));
    }
    Err(err(
        path,
        format!("unknown key source {} ({KEY_SOURCE_HELP})", quoted(s)),
    ))
}

/// Dot-separated segments, each non-empty and without control characters, at most
/// `MAX_PATH_SEGMENTS`.
fn segments(text: &str) -> Option<Vec<String>> {
    let parts: Vec<String> = text.split('.').map(str::to_owned).collect();
    let ok = !text.is_empty()
        && parts.len() <= MAX_PATH_SEGMENTS
        && parts.iter().all(|p| !p.is_empty() && !has_control(p));
    ok.then_some(parts)
}

/// `property:` + an attribute path.
fn property(spelled: &str, whole: &str, path: &str) -> Result<KeySource, ConfigError> {
    let resolved = PROPERTY_ALIASES
        .iter()
        .find(|(alias, _)| *alias == spelled)
        .map_or(spelled, |(_, to)| to);
    let Some(segs) = segments(resolved) else {
        return Err(err(
            path,
            format!(
                "property:PATH needs 1 to {MAX_PATH_SEGMENTS} non-empty dot-separated segments (got {})",
                quoted(whole)
            ),
        ));
    };
    let root = segs.first().map(String::as_str).unwrap_or_default();
    if !PROPERTY_ROOTS.contains(&root) {
        let why = if root == "response" {
            "response attributes are not known yet when a request is checked".to_owned()
        } else {
            format!(
                "unknown attribute {} (Envoy's attributes start with {})",
                quoted(root),
                PROPERTY_ROOTS.join(", ")
            )
        };
        return Err(err(path, format!("{why} (got {})", quoted(whole))));
    }
    if crate::rule::request_header(&segs).as_deref() == Some("host") {
        return Err(host_is_the_authority(whole, path));
    }
    Ok(KeySource::Property {
        spelled: spelled.to_owned(),
        path: segs,
    })
}

/// A key on the `host` header: Envoy keeps a request's `Host` as `:authority` (its header map
/// stores a `host` line under that name), so no request would have the source and the rule would
/// limit nothing.
fn host_is_the_authority(whole: &str, path: &str) -> ConfigError {
    err(
        path,
        format!(
            "Envoy gives a request's Host header as :authority, so no request has a `host` header \
             and the rule would limit nothing: use the key source \"authority\" (got {})",
            quoted(whole)
        ),
    )
}

/// `metadata:` + `<namespace>:<field>[.<field>…]`.
fn metadata(spec: &str, whole: &str, path: &str) -> Result<KeySource, ConfigError> {
    let parsed = spec.split_once(':').and_then(|(ns, fields)| {
        let ns_ok = !ns.is_empty() && !has_control(ns);
        ns_ok.then_some(())?;
        Some((ns.to_owned(), segments(fields)?))
    });
    let Some((namespace, fields)) = parsed else {
        return Err(err(
            path,
            format!(
                "metadata:NAMESPACE:FIELD[.FIELD…] needs a namespace and 1 to {MAX_PATH_SEGMENTS} \
                 non-empty fields (got {})",
                quoted(whole)
            ),
        ));
    };
    Ok(KeySource::Metadata { namespace, fields })
}

/// `v4=/N`, `v6=/M` or both, comma-separated, after `client_ip:`.
fn client_ip(spec: &str, whole: &str, path: &str) -> Result<KeySource, ConfigError> {
    let bad = || {
        err(
            path,
            format!(
                "client_ip takes v4=/N (8-32) and/or v6=/M (8-128), comma-separated (got {})",
                quoted(whole)
            ),
        )
    };
    let (mut v4, mut v6) = (None, None);
    for part in spec.split(',') {
        let (family, bits) = part.split_once("=/").ok_or_else(bad)?;
        let bits: u8 = bits
            .parse()
            .ok()
            .filter(|b| bits.bytes().all(|c| c.is_ascii_digit()) && *b >= 8)
            .ok_or_else(bad)?;
        let slot = match family {
            "v4" if bits <= 32 => &mut v4,
            "v6" if bits <= 128 => &mut v6,
            _ => return Err(bad()),
        };
        if slot.replace(bits).is_some() {
            return Err(bad());
        }
    }
    Ok(KeySource::ClientIp {
        v4_prefix: v4.unwrap_or(DEFAULT_V4_PREFIX),
        v6_prefix: v6.unwrap_or(DEFAULT_V6_PREFIX),
    })
}

/// The value an override (or a tier) names for `source`, in the form a request's value would
/// take.
fn override_value(source: &KeySource, text: &str, path: &str) -> Result<Vec<u8>, ConfigError> {
    match source {
        KeySource::ClientIp {
            v4_prefix,
            v6_prefix,
        } => crate::rule::ip::canonical(text, *v4_prefix, *v6_prefix).ok_or_else(|| {
            err(
                path,
                format!(
                    "must be an address or network as {source} gives it: IPv4 /{v4_prefix}, \
                     IPv6 /{v6_prefix}, host bits zero (got {})",
                    quoted(text)
                ),
            )
        }),
        KeySource::Authority => Ok(crate::rule::host::of_authority(text.as_bytes())),
        KeySource::Cookie(_) => {
            crate::rule::reading::cookie_value(text.as_bytes()).ok_or_else(|| {
                err(
                    path,
                    format!(
                        "a quoted cookie value with a backslash is read differently by different \
                     servers, so it is never a key (got {})",
                        quoted(text)
                    ),
                )
            })
        }
        _ if crate::rule::reads_the_method(source) => {
            Ok(crate::rule::as_routed(text.as_bytes()).into_owned())
        }
        // A header's value is read without the spaces and tabs around it.
        KeySource::Header(_) => header_value(text, path),
        // `request.host` and `request.headers.:authority` are read as the `authority` key is.
        KeySource::Property {
            path: attribute, ..
        } if crate::rule::request_header(attribute).as_deref() == Some(":authority") => {
            Ok(crate::rule::host::of_authority(text.as_bytes()))
        }
        KeySource::Property {
            path: attribute, ..
        } if crate::rule::reads_the_path(source).is_none()
            && crate::rule::request_header(attribute).is_some() =>
        {
            header_value(text, path)
        }
        _ => Ok(match crate::rule::reads_the_path(source) {
            Some(part) => crate::rule::path_value(part, text.as_bytes()),
            None => text.as_bytes().to_vec(),
        }),
    }
}

/// A header's value an override or a tier names, read as a request's is: without the whitespace
/// around it (`reading::header_key`). One of nothing else would silently become the empty
/// value's.
fn header_value(text: &str, path: &str) -> Result<Vec<u8>, ConfigError> {
    let value = crate::rule::reading::header_key_value(text.as_bytes());
    if value.is_empty() && !text.is_empty() {
        return Err(err(
            path,
            "is only whitespace, which a header's value is read without",
        ));
    }
    Ok(value.to_vec())
}

/// The value an override or a tier names for `source`, as a rule whose path match ignores case
/// (`path_ignore_case`) reads it ([`crate::rule::as_matched`]).
pub(super) fn matched_value(
    source: &KeySource,
    text: &str,
    path: &str,
    path_ignore_case: bool,
) -> Result<Vec<u8>, ConfigError> {
    let value = std::borrow::Cow::Owned(override_value(source, text, path)?);
    Ok(crate::rule::as_matched(path_ignore_case, source, value).into_owned())
}

/// A rule's `overrides`: key tuples (as requests give them) to their limits. An override's
/// `period_ms` defaults to the rule's, its burst must hold the rule's cost.
pub fn overrides(
    items: Vec<doc::Override>,
    path: &str,
    (key, path_ignore_case): (&[KeySource], bool),
    rule_period: PeriodMs,
    cost: u64,
) -> Result<BTreeMap<Vec<Vec<u8>>, Override>, ConfigError> {
    if items.len() > MAX_OVERRIDES {
        return Err(err(
            path,
            format!(
                "must have at most {MAX_OVERRIDES} overrides (got {})",
                items.len()
            ),
        ));
    }
    if key.is_empty() && !items.is_empty() {
        return Err(err(
            path,
            "needs key sources: a rule without a key has one bucket, give it these limits instead",
        ));
    }
    let mut out = BTreeMap::new();
    for (i, o) in items.into_iter().enumerate() {
        let p = index(path, i);
        let key_path = join(&p, "key");
        if o.key.len() != key.len() {
            return Err(err(
                &key_path,
                format!(
                    "must have one value per key source ({}, got {})",
                    key.len(),
                    o.key.len()
                ),
            ));
        }
        let tuple = o
            .key
            .iter()
            .zip(key)
            .enumerate()
            .map(|(j, (v, source))| {
                matched_value(source, v, &index(&key_path, j), path_ignore_case)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let value = limits_of(
            &p,
            (o.unlimited, o.rate, o.period_ms, o.burst),
            rule_period,
            cost,
        )?;
        if out.insert(tuple, value).is_some() {
            return Err(err(&key_path, "names the same key as an earlier override"));
        }
    }
    Ok(out)
}

/// What the object at `path` gives instead of the rule's limits: `unlimited`, or `rate`,
/// `period_ms` (default the rule's) and `burst` (default its rate, at least the rule's `cost`).
/// An override's and a tier's, checked alike.
pub(super) fn limits_of(
    path: &str,
    (unlimited, rate, period_ms, burst): (
        Option<bool>,
        Option<Tokens>,
        Option<PeriodMs>,
        Option<Tokens>,
    ),
    rule_period: PeriodMs,
    cost: u64,
) -> Result<Override, ConfigError> {
    let has_limits = rate.is_some() || period_ms.is_some() || burst.is_some();
    Ok(match (unlimited, rate) {
        (Some(true), _) if has_limits => {
            return Err(err(
                path,
                "must have either \"unlimited\": true or limits (rate, period_ms, burst), not both",
            ))
        }
        (Some(true), _) => Override::Unlimited,
        (Some(false), _) => return Err(err(join(path, "unlimited"), "must be true")),
        (None, None) => return Err(err(join(path, "rate"), "required")),
        (None, Some(rate)) => {
            let limits = quota(
                path,
                rate,
                period_ms.unwrap_or(rule_period),
                burst.unwrap_or(rate),
            )?;
            if cost > limits.burst {
                return Err(err(
                    join(path, "burst"),
                    format!("must be at least the rule's cost ({cost})"),
                ));
            }
            Override::Limits(limits)
        }
    })
}
