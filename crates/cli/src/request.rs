//! A request described on the command line, read by the core through its own `RequestView`
//! trait, with the host's semantics: header lines kept apart and in order (a repeated header is
//! joined with `,` for `header`, as Envoy's attribute joins it), the client address without its
//! port, dynamic metadata serialised as Envoy serialises it, attributes in the host's encoding.
//!
//! Invariant: what the core reads from a description is what it would read from Envoy for the
//! same request, so `explain`, `inspect`, `reset` and `credit` name the bucket the filter uses.

use std::borrow::Cow;
use std::collections::BTreeMap;

use tollgate_core::rule::reading::is_header_name;
use tollgate_core::rule::value::attribute_text;
use tollgate_core::rule::{Lines, RequestView};

/// A request: header lines (pseudo-headers `:method`, `:path`, `:authority` among them), the
/// client's address, attributes by dotted path in the host's encoding, and dynamic metadata.
#[derive(Debug, Default, Clone)]
pub struct Described {
    lines: Vec<(String, Vec<u8>)>,
    client_ip: Option<Vec<u8>>,
    properties: BTreeMap<String, Vec<u8>>,
    metadata: Option<Vec<u8>>,
}

impl Described {
    /// Adds a header line as sent (a name may come several times), read as the filter reads it:
    /// without the spaces and tabs around its value.
    pub fn line(&mut self, name: &str, value: &[u8]) {
        let value = tollgate_core::pairs::trim_ows(value);
        self.lines.push((name.to_string(), value.to_vec()));
    }

    /// Sets the client's address (Envoy's `source.address`, without its port).
    pub fn client_ip(&mut self, ip: &str) {
        self.client_ip = Some(ip.as_bytes().to_vec());
    }

    /// Sets an attribute from its text, in the host's encoding: an integer or boolean attribute as
    /// the host serialises it (the core's `attribute_text` reads it back as the same text),
    /// anything else as its bytes.
    pub fn property(&mut self, path: &str, text: &str) {
        let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
        let mut candidates: Vec<Vec<u8>> = Vec::new();
        if let Ok(n) = text.parse::<i64>() {
            candidates.push(n.to_le_bytes().to_vec());
        }
        if let Ok(n) = text.parse::<u64>() {
            candidates.push(n.to_le_bytes().to_vec());
        }
        match text {
            "true" => candidates.push(vec![1]),
            "false" => candidates.push(vec![0]),
            _ => {}
        }
        let raw = candidates
            .into_iter()
            .find(|raw| attribute_text(&segments, raw.clone()) == text.as_bytes())
            .unwrap_or_else(|| text.as_bytes().to_vec());
        self.properties.insert(path.to_string(), raw);
    }

    /// Sets the dynamic metadata (a serialised `envoy.config.core.v3.Metadata`).
    pub fn metadata(&mut self, serialised: Vec<u8>) {
        self.metadata = Some(serialised);
    }
}

impl RequestView for Described {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let mut found = self
            .lines
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice());
        let first = found.next()?;
        let mut joined = first.to_vec();
        for more in found {
            joined.push(b',');
            joined.extend_from_slice(more);
        }
        Some(Cow::Owned(joined))
    }

    fn header_lines(&self, name: &str) -> Lines<'_> {
        let mut lines = Lines::None;
        for (n, v) in &self.lines {
            if is_header_name(n.as_bytes(), name) {
                lines.push(Cow::Borrowed(v));
            }
        }
        lines
    }

    fn client_ip(&self) -> Option<Vec<u8>> {
        self.client_ip.clone()
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        if path == ["metadata"] {
            return self.metadata.clone();
        }
        match self.properties.get(&path.join(".")) {
            Some(given) => Some(given.clone()),
            None => self.derived(path),
        }
    }
}

impl Described {
    /// An attribute Envoy derives from the request line, as it derives it, when no `--property`
    /// gives it: `request.query`, the path's query without a fragment (empty without a `?`).
    /// (The attributes Envoy takes from one header the core reads from that header's lines.)
    fn derived(&self, path: &[&str]) -> Option<Vec<u8>> {
        if path != ["request", "query"] {
            return None;
        }
        let full = self.header(":path")?;
        let query = match full.iter().position(|b| *b == b'?') {
            Some(at) => full.get(at + 1..).unwrap_or_default(),
            None => &[],
        };
        let end = query.iter().position(|b| *b == b'#').unwrap_or(query.len());
        query.get(..end).map(<[u8]>::to_vec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_attribute_is_envoys_unless_given() {
        let attr = |req: &Described| RequestView::property(req, &["request", "query"]);
        let mut req = Described::default();
        req.line(":path", b"/a?x=1&y=2#top");
        assert_eq!(attr(&req).as_deref(), Some(&b"x=1&y=2"[..]));
        let mut bare = Described::default();
        bare.line(":path", b"/a");
        assert_eq!(attr(&bare).as_deref(), Some(&b""[..]));
        Described::property(&mut req, "request.query", "given");
        assert_eq!(attr(&req).as_deref(), Some(&b"given"[..]));
    }
}
