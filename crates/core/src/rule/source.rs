//! A key source's reading of a request: a value every reading agrees on, ambiguous (its name
//! appears more than once, however spelled; a method asked for besides the one sent), or missing.
//!
//! Invariant: a value is what a server would see, or what Envoy verified (`client_ip` is Envoy's
//! `source.address`, never `x-forwarded-for`); a source whose name a request repeats, or whose
//! readings differ, reads as [`Read::Ambiguous`], never as one of the values, so repeating it
//! mints no bucket.

use std::borrow::Cow;

use super::method::{self, as_routed};
use super::{host, ip, path, reading, value, Read, RequestView};
use crate::config::KeySource;

/// A key source's reading of `req`, borrowed from the request where it is taken as sent (a
/// header, the method, a literal): the local path then copies no key value.
pub(super) fn key_value<'a>(source: &'a KeySource, req: &'a dyn RequestView) -> Read<'a> {
    match source {
        KeySource::Header(name) => reading::header_key(req.header_lines(name)),
        KeySource::Method => method_value(req),
        KeySource::Literal(text) => Read::Value(Cow::Borrowed(text.as_bytes())),
        derived => derived_value(derived, req),
    }
}

/// The reading of a key source that is derived from what the request sent (normalised, parsed or
/// looked up); the others [`key_value`] borrows. Out of line: a header-keyed rule's path never
/// runs it.
#[inline(never)]
fn derived_value<'a>(source: &'a KeySource, req: &'a dyn RequestView) -> Read<'a> {
    let owned = |v: Option<Vec<u8>>| v.map_or(Read::Missing, |v| Read::Value(Cow::Owned(v)));
    match source {
        KeySource::Header(_) | KeySource::Method | KeySource::Literal(_) => key_value(source, req),
        KeySource::Query(name) => match req.header(":path") {
            Some(full) => reading::query(&full, name),
            None => Read::Missing,
        },
        KeySource::ClientIp {
            v4_prefix,
            v6_prefix,
        } => owned(
            req.client_ip()
                .map(|ip| ip::key_value(&ip, *v4_prefix, *v6_prefix)),
        ),
        KeySource::Path => owned(path_of(req).map(|p| path::key_value(&p))),
        KeySource::Authority => owned(req.header(":authority").map(|a| host::of_authority(&a))),
        KeySource::Cookie(name) => reading::cookie(&req.header_lines("cookie"), name),
        // Envoy's `request.headers` attribute joins a header's lines with `,`: read as the header
        // source reads it, so a repeated line is ambiguous here too.
        KeySource::Property { path, .. } => match (reads_the_path(source), request_header(path)) {
            (Some(part), _) => owned(path_of(req).map(|p| path_value(part, &p))),
            (None, _) if reads_the_method(source) => method_value(req),
            // `:authority` as the `authority` key reads it: every spelling of one host is one
            // value.
            (None, Some(name)) if name == ":authority" => {
                match reading::header(req.header_lines(&name)) {
                    Read::Value(v) => Read::Value(Cow::Owned(host::of_authority(&v))),
                    other => other,
                }
            }
            (None, Some(name)) => reading::header_key(req.header_lines(&name)),
            (None, None) => {
                let segments: Vec<&str> = path.iter().map(String::as_str).collect();
                owned(
                    req.property(&segments)
                        .map(|raw| value::attribute_text(path, raw)),
                )
            }
        },
        KeySource::Metadata { namespace, fields } => owned(
            req.property(&["metadata"])
                .and_then(|metadata| value::metadata_value(&metadata, namespace, fields))
                .as_ref()
                .and_then(value::key_text),
        ),
    }
}

/// `:path` as a key reads it: a CONNECT has none (Envoy's codecs set only `:authority` for one,
/// and a listener with `upgrade_configs: CONNECT` runs the filters for it), and reads as the
/// empty path (`/`'s bucket, never an override's: [`super::apply`] gives a path override only
/// to a path as sent), so a rule keyed on the path does not let a tunnel through unlimited.
fn path_of(req: &dyn RequestView) -> Option<Cow<'_, [u8]>> {
    req.header(":path").or_else(|| {
        req.header(":method")
            .is_some_and(|m| m.eq_ignore_ascii_case(b"CONNECT"))
            .then_some(Cow::Borrowed(&b""[..]))
    })
}

/// The `method` key's reading: `:method` as applications route it (`HEAD` as `GET`), ambiguous
/// when the request asks to be routed as another method (which one runs depends on the
/// application). The attributes `request.method` and `request.headers.:method` read the same.
fn method_value(req: &dyn RequestView) -> Read<'_> {
    req.header(":method").map_or(Read::Missing, |m| {
        let routed = match m {
            Cow::Borrowed(m) => as_routed(m),
            Cow::Owned(m) => Cow::Owned(as_routed(&m).into_owned()),
        };
        if method::any_override(req, &routed, |other| *as_routed(other) != *routed) {
            return Read::Ambiguous;
        }
        Read::Value(routed)
    })
}

/// Whether `source`'s value is the request's method: `method`, or the attributes
/// `request.method` and `request.headers.:method`, all read as [`method_value`] reads it.
pub fn reads_the_method(source: &KeySource) -> bool {
    match source {
        KeySource::Method => true,
        KeySource::Property { path, .. } => match path.as_slice() {
            [r, m] => r == "request" && m == "method",
            [r, h, m] => r == "request" && h == "headers" && m.eq_ignore_ascii_case(":method"),
            _ => false,
        },
        _ => false,
    }
}

/// What of the request line a source that reads the path keys on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathPart {
    /// The path: `path`, or the attribute `request.url_path`.
    Path,
    /// The path and its query: the attribute `request.path`.
    PathAndQuery,
}

/// Whether `source`'s value is the request's path, in some spelling, and with what (the attributes
/// `request.path` and `request.headers.:path` are the path and its query). Such a source keys on
/// the path as [`path::key_value`] reads it, however the attribute is spelled, so no spelling of a
/// path is a bucket of its own.
pub fn reads_the_path(source: &KeySource) -> Option<PathPart> {
    match source {
        KeySource::Path => Some(PathPart::Path),
        KeySource::Property { path, .. } => match path.as_slice() {
            [r, p] if r == "request" && p == "url_path" => Some(PathPart::Path),
            [r, p] if r == "request" && p == "path" => Some(PathPart::PathAndQuery),
            [r, h, p] if r == "request" && h == "headers" && p.eq_ignore_ascii_case(":path") => {
                Some(PathPart::PathAndQuery)
            }
            _ => None,
        },
        _ => None,
    }
}

/// The key value of a source that reads `part` of `:path` `full_path` (also an override's value,
/// written as a path).
pub fn path_value(part: PathPart, full_path: &[u8]) -> Vec<u8> {
    match part {
        PathPart::Path => path::key_value(full_path),
        PathPart::PathAndQuery => path::key_value_with_query(full_path),
    }
}

/// Whether `value`, which `source` read, is on a line spelled as the source names its header
/// (ASCII case aside): a filter before tollgate that sets, checks or strips a header does so for
/// that spelling only, so a value on another (`x_plan` for `x-plan`, which CGI, WSGI and PHP
/// read alike) is the client's own. Always true for a source that is not a header.
pub(super) fn as_spelled(source: &KeySource, req: &dyn RequestView, value: &[u8]) -> bool {
    let name = match source {
        KeySource::Header(name) => Cow::Borrowed(name.as_str()),
        KeySource::Property { path, .. } => match request_header(path) {
            Some(name) if !name.starts_with(':') => Cow::Owned(name),
            _ => return true,
        },
        _ => return true,
    };
    req.header(&name).is_some_and(|exact| *exact == *value)
}

/// The request header an attribute path names (lower-cased), if it names one: `request.headers.<name>`,
/// and the attributes Envoy takes from one header (`request.host`, `request.scheme`,
/// `request.useragent`, `request.referer`, `request.id`). Such a source is read from the
/// request's lines as `header:` reads them (without the spaces and tabs around the value,
/// ambiguous on several lines), not from Envoy's attribute, which keeps what a client sent.
pub fn request_header(path: &[String]) -> Option<String> {
    match path {
        [request, headers, name] if request == "request" && headers == "headers" => {
            Some(name.to_ascii_lowercase())
        }
        [request, attribute] if request == "request" => {
            let header = match attribute.as_str() {
                "host" => ":authority",
                "scheme" => ":scheme",
                "useragent" => "user-agent",
                "referer" => "referer",
                "id" => "x-request-id",
                _ => return None,
            };
            Some(header.to_string())
        }
        _ => None,
    }
}
/// The rule's key sources' readings in order (each a value or ambiguous), or None if any source
/// is missing (then the rule does not apply).
pub fn key_values<'a>(sources: &'a [KeySource], req: &'a dyn RequestView) -> Option<Vec<Read<'a>>> {
    sources
        .iter()
        .map(|s| match key_value(s, req) {
            Read::Missing => None,
            read => Some(read),
        })
        .collect()
}
