//! A rule's `match` against a request: path prefix, methods, hosts and header conditions.
//!
//! Invariant: a request cannot step out of a rule by how it spells what the rule matches on: the
//! path under every reading ([`path::prefix_matches`]), the method by asking the application to
//! route it as another ([`method`]), a header by repeating it or respelling its
//! name (a condition holds if it holds for the lines joined or for any one line), the authority
//! by its port, case, trailing dot or IP literal spelling.

use super::method::{self, as_routed};
use super::{host, path, RequestView};
use crate::config::{HeaderValueMatch, Match};

/// Whether the request satisfies every condition of `m` (an empty `Match` matches everything).
pub fn matches(m: &Match, req: &dyn RequestView) -> bool {
    if let Some(prefix) = &m.path_prefix {
        match req.header(":path") {
            Some(full) if path::prefix_matches(&full, prefix.as_bytes(), m.path_ignore_case) => {}
            _ => return false,
        }
    }
    if !m.methods.is_empty() {
        let named = |method: &[u8]| {
            m.methods.iter().any(|x| {
                x.as_bytes().eq_ignore_ascii_case(method) || *x.as_bytes() == *as_routed(method)
            })
        };
        match req.header(":method") {
            Some(sent) if named(&sent) || method::any_override(req, &sent, named) => {}
            _ => return false,
        }
    }
    if !m.hosts.is_empty() {
        match req.header(":authority") {
            Some(authority) if m.hosts.iter().any(|h| host_matches(h, &authority)) => {}
            _ => return false,
        }
    }
    m.headers
        .iter()
        .all(|h| header_condition(&h.name, &h.value, req))
}

/// Whether header condition `value` holds for header `name`: for all the header's lines joined
/// with `,`, or for one of the lines some server reads as that header ([`RequestView::header_lines`]:
/// an application that reads one line sees that one), so a request cannot step out of a rule by
/// repeating a header or respelling its name. `absent` holds when no line has the name itself.
fn header_condition(name: &str, value: &HeaderValueMatch, req: &dyn RequestView) -> bool {
    let holds = |got: &[u8]| match value {
        HeaderValueMatch::Absent | HeaderValueMatch::Present => true,
        HeaderValueMatch::Exact(want) => want.as_bytes() == got,
        HeaderValueMatch::Prefix(want) => got.starts_with(want.as_bytes()),
        HeaderValueMatch::Regex(p) => p.is_match(got),
    };
    match (value, req.header(name)) {
        (HeaderValueMatch::Absent, got) => got.is_none(),
        (_, Some(joined)) if holds(&joined) => true,
        (_, _) => req.header_lines(name).iter().any(holds),
    }
}

/// Whether `pattern` (from `match.hosts`) matches the request's `:authority`.
fn host_matches(pattern: &str, authority: &[u8]) -> bool {
    let host = host::of_authority(authority);
    match pattern.strip_prefix('*') {
        // `*.example.com`: at least one character before `.example.com`.
        Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix.as_bytes()),
        None => host == pattern.as_bytes(),
    }
}
