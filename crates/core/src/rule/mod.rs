//! Rule matching and bucket-key extraction over a `RequestView` (no host calls here).
//!
//! Invariant: the bucket key is `<key_prefix>:{<rule>:<digest>}` where the digest is a SHA-256 of the
//! rule's key sources (their canonical spelling) and key values, each length-prefixed, so no user
//! text reaches Redis or a URL, two different value tuples never share a key, and changing a rule's
//! key sources starts fresh buckets. A request cannot escape a rule by how it spells its path
//! (see `path`) or its address (see `ip`), nor get a fresh bucket by repeating a key source's name
//! (see `reading`): an ambiguous source keys the request into one bucket per rule (and per the
//! other sources' values), marked in the digest so that no value can name it. Overrides and tiers
//! change a bucket's limits, never its key, and apply only where every reading agrees on the key:
//! never to an ambiguous source, nor to a path that some reading spells otherwise.
//!
//! The files: [`matching`] (a rule's `match`), [`source`] (a key source's reading of a request),
//! [`digest`] (the bucket key), [`cache`] (bucket keys of recently seen values), [`apply`] (a rule
//! applied to a request: its key and limits), [`tiers`] (the tier a request's verified attribute
//! picks); and under them [`path`] (path readings), [`method`] (the methods a request may be
//! routed as), [`ip`] (client networks), [`reading`] (headers, query parameters, cookies: one
//! reading or ambiguous), [`value`] (attribute and metadata values), [`host`] (authority normal
//! form), [`pattern`] (header regex), [`hash`].

mod apply;
mod cache;
mod digest;
pub mod hash;
pub mod host;
pub mod ip;
mod matching;
mod method;
pub mod path;
pub mod pattern;
pub mod reading;
mod source;
mod tiers;
pub mod value;

pub use apply::{applies, as_matched, Applied, LimitsBy};
pub use cache::KeyCache;
pub use digest::{bucket_key, bucket_key_of, parts_of_key, Part, DIGEST_HEX};
pub use matching::matches;
pub use method::as_routed;
pub use reading::{Lines, Read};
pub use source::{
    key_values, path_value, reads_the_method, reads_the_path, request_header, PathPart,
};

use std::borrow::Cow;

/// What rule matching needs from a request. Names are lower-case; pseudo-headers `:path`, `:method`,
/// `:authority` are asked for through `header` too.
pub trait RequestView {
    /// The value of request header `name`: when the request has several lines of it, all of them
    /// joined with `,` in the order received (what Envoy's `request.headers` attribute gives, and
    /// how Envoy itself folds the headers it combines). None when the request has no such line; an
    /// empty line is an empty value. Borrowed when the view holds the value as it is (one line),
    /// so a rule that only looks at a header does not copy it.
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>>;
    /// Every line of the request headers that some server reads as header `name`, in the order
    /// received: names compared ASCII case-insensitively, `_` and `-` alike
    /// ([`reading::is_header_name`]). The default, for a view that cannot tell lines apart, is
    /// [`RequestView::header`] as one line.
    fn header_lines(&self, name: &str) -> Lines<'_> {
        self.header(name).map_or(Lines::None, Lines::One)
    }
    /// downstream peer IP without port (Envoy's source.address)
    fn client_ip(&self) -> Option<Vec<u8>>;
    /// An Envoy attribute by path segments (`["connection", "uri_san_peer_certificate"]`), as the
    /// host serialises it; `["metadata"]` is the whole dynamic metadata (a serialised
    /// `envoy.config.core.v3.Metadata`). None when the host has no such value.
    fn property(&self, _path: &[&str]) -> Option<Vec<u8>> {
        None
    }
}

#[cfg(test)]
mod tests;
