//! A rule's `match`, compiled: the forms requests are compared in.
//!
//! Invariant: a compiled `Match` holds a path prefix only in the normal form requests are read in
//! (`rule::path`, so `//api/` cannot silently never match), methods upper-cased, header names
//! lower-cased with exactly one condition each, and hosts lower-cased, without port or trailing
//! dot, IPv6 literals canonical (`rule::host`, as a request's `:authority` is read).

use super::bounds::MAX_HOSTS;
use super::compile::{has_control, header_name, is_token};
use super::document as doc;
use super::error::{err, index, join, quoted, ConfigError};
use super::model::{HeaderMatch, HeaderValueMatch, Match};
use crate::rule::pattern::Pattern;

pub fn compile(m: doc::Match, path: &str) -> Result<Match, ConfigError> {
    let at = |name: &str| join(path, name);
    let path_prefix = m
        .path_prefix
        .map(|p| path_prefix(&at("path_prefix"), p))
        .transpose()?;
    let methods = m
        .methods
        .into_iter()
        .enumerate()
        .map(|(i, method)| {
            let p = index(&at("methods"), i);
            if method.is_empty() {
                return Err(err(p, "must not be empty"));
            }
            if !is_token(&method) {
                return Err(err(
                    p,
                    format!(
                        "must be an HTTP method of token characters (got {})",
                        quoted(&method)
                    ),
                ));
            }
            Ok(method.to_ascii_uppercase())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let headers = m
        .headers
        .into_iter()
        .enumerate()
        .map(|(i, h)| header_match(h, &index(&at("headers"), i)))
        .collect::<Result<Vec<_>, _>>()?;
    if m.hosts.len() > MAX_HOSTS {
        return Err(err(
            at("hosts"),
            format!(
                "must have at most {MAX_HOSTS} hosts (got {})",
                m.hosts.len()
            ),
        ));
    }
    let hosts = m
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| host(h, &index(&at("hosts"), i)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Match {
        path_prefix,
        path_ignore_case: m.path_ignore_case,
        methods,
        headers,
        hosts,
    })
}

/// A `path_prefix`: it is compared with every normal form of a request's path, so it must be in
/// normal form itself.
fn path_prefix(path: &str, p: String) -> Result<String, ConfigError> {
    if !p.starts_with('/') {
        return Err(err(
            path,
            format!("must start with '/' (got {})", quoted(&p)),
        ));
    }
    if p.contains(['?', '#']) {
        return Err(err(
            path,
            format!(
                "must not contain '?' or '#': it is matched against the path without the query (got {})",
                quoted(&p)
            ),
        ));
    }
    if has_control(&p) {
        return Err(err(path, "must not contain control characters"));
    }
    let normal = crate::rule::path::normalize(p.as_bytes(), crate::rule::path::Reading::STRICT);
    if normal.irregular || normal.path != p.as_bytes() {
        return Err(err(
            path,
            format!(
                "must be in normal form, as requests are compared in it (got {}, which reads as {})",
                quoted(&p),
                quoted(&String::from_utf8_lossy(&normal.path))
            ),
        ));
    }
    Ok(p)
}

/// A `match.hosts` entry: a host name (or IP literal) without port, optionally starting with `*.`;
/// returned lower-cased, without a trailing dot.
fn host(s: &str, path: &str) -> Result<String, ConfigError> {
    let bad = |why: &str| err(path, format!("{why} (got {})", quoted(s)));
    let host = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
    if host.starts_with('[') {
        let inner = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        if inner.is_some_and(|h| h.contains('%')) {
            return Err(bad(
                "must not have a zone id (it names the client's interface; requests are \
                 compared without it)",
            ));
        }
        let ok = inner.is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok());
        return if ok {
            // Compared in canonical form, as requests' hosts are.
            String::from_utf8(crate::rule::host::canonical(host.into_bytes()))
                .map_err(|_| bad("must be a host name, an IPv4 address or [IPv6], without port"))
        } else {
            Err(bad(
                "must be a host name, an IPv4 address or [IPv6], without port",
            ))
        };
    }
    let name = host.strip_prefix("*.").unwrap_or(&host);
    if name.contains(':') {
        return Err(bad("must not have a port (hosts are compared without it)"));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(bad(
            "must be a host name of letters, digits, '-' and '.', optionally starting with \"*.\"",
        ));
    }
    Ok(host)
}

fn header_match(h: doc::HeaderMatch, path: &str) -> Result<HeaderMatch, ConfigError> {
    const KINDS: &str = "\"exact\", \"prefix\", \"regex\", \"present\" or \"absent\"";
    let name = header_name(&join(path, "name"), &h.name)?;
    // Envoy keeps a request's `Host` as `:authority` (its header map stores a `host` line under
    // that name), so no line a filter reads is named `host`.
    let name = if name == "host" {
        ":authority".to_string()
    } else {
        name
    };
    let given: Vec<&str> = [
        ("exact", h.exact.is_some()),
        ("prefix", h.prefix.is_some()),
        ("regex", h.regex.is_some()),
        ("present", h.present.is_some()),
        ("absent", h.absent.is_some()),
    ]
    .into_iter()
    .filter_map(|(kind, given)| given.then_some(kind))
    .collect();
    if given.len() > 1 {
        return Err(err(
            path,
            format!(
                "must have exactly one of {KINDS}, not {}",
                given.join(" and ")
            ),
        ));
    }
    // A flag condition is written `true`; `false` would read as its opposite.
    let flag = |kind: &str, set: bool| {
        if set {
            Ok(())
        } else {
            Err(err(join(path, kind), "must be true"))
        }
    };
    // As a request's value is read: without the spaces and tabs around it (a prefix's end is
    // its own: `Bearer `).
    let ows = |c: char| u8::try_from(c).is_ok_and(crate::pairs::is_ows);
    let value = match (h.exact, h.prefix, h.regex, h.present, h.absent) {
        (Some(v), ..) => HeaderValueMatch::Exact(v.trim_matches(ows).to_string()),
        // Only spaces or tabs would hold for every value once trimmed: `present` says that.
        (_, Some(v), ..) if !v.is_empty() && v.trim_start_matches(ows).is_empty() => {
            return Err(err(
                join(path, "prefix"),
                "is only spaces or tabs, which a value is read without (use \"present\": true)",
            ))
        }
        (_, Some(v), ..) => HeaderValueMatch::Prefix(v.trim_start_matches(ows).to_string()),
        (_, _, Some(source), ..) => {
            HeaderValueMatch::Regex(Pattern::new(&source).map_err(|e| err(join(path, "regex"), e))?)
        }
        (_, _, _, Some(set), _) => {
            flag("present", set)?;
            HeaderValueMatch::Present
        }
        (.., Some(set)) => {
            flag("absent", set)?;
            HeaderValueMatch::Absent
        }
        (None, None, None, None, None) => {
            return Err(err(path, format!("must have exactly one of {KINDS}")))
        }
    };
    Ok(HeaderMatch { name, value })
}
