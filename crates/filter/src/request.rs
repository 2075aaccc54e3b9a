//! The `RequestView`s of the stream being called back: the request and the response's headers or
//! trailers, each map read from the host in one call, the first time a rule needs a header.
//!
//! Invariant: a header or attribute the host will not give reads as absent, never a panic; a
//! header map is read at most once per callback, whole, so every line of a header is seen.

use std::borrow::Cow;

use tollgate_abi::{self as abi, MapType};
use tollgate_core::property::{strip_port, SOURCE_ADDRESS};
use tollgate_core::rule::{Lines, RequestView};

use crate::host::property;

/// A header map of the current stream, read lazily from the host: all its lines in one call, the
/// first time a rule needs one (each header read on its own would cost Envoy a call and an
/// allocation callback into the VM, and `get_header_map_value` gives only a header's first line).
struct HostMap {
    map: MapType,
    pairs: std::cell::OnceCell<Option<Vec<u8>>>,
}

impl HostMap {
    fn new(map: MapType) -> HostMap {
        HostMap {
            map,
            pairs: std::cell::OnceCell::new(),
        }
    }

    /// The map's lines as the host encodes them, read once.
    fn pairs(&self) -> Option<&[u8]> {
        self.pairs
            .get_or_init(|| {
                let pairs = abi::header_pairs(self.map).ok();
                if pairs.is_none() && self.map == MapType::HttpRequestHeaders {
                    log::error!("tollgate: the host gave no request headers; rules see none");
                }
                pairs
            })
            .as_deref()
    }

    /// Every line of a repeated header, joined with `,` as Envoy's `request.headers` attribute
    /// joins them.
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        tollgate_core::pairs::lookup(self.pairs()?, name)
    }

    /// The map's lines whose name some server reads as `name` (`x_api_key` for `x-api-key`).
    fn header_lines(&self, name: &str) -> Lines<'_> {
        let Some(pairs) = self.pairs() else {
            return Lines::None;
        };
        let mut lines = Lines::None;
        let wanted = |key: &[u8]| tollgate_core::rule::reading::is_header_name(key, name);
        match tollgate_core::pairs::each(pairs, wanted, |v| lines.push(Cow::Borrowed(v))) {
            Some(()) => lines,
            None => Lines::None,
        }
    }
}

/// The stream's request headers, or its response's headers or trailers: the response has no
/// client address of its own, and a usage header sent twice, however spelled, is seen twice (and
/// charged as unreadable), never read from its first line.
pub struct HostView(HostMap);

impl HostView {
    pub fn request() -> HostView {
        HostView(HostMap::new(MapType::HttpRequestHeaders))
    }

    pub fn response_headers() -> HostView {
        HostView(HostMap::new(MapType::HttpResponseHeaders))
    }

    pub fn response_trailers() -> HostView {
        HostView(HostMap::new(MapType::HttpResponseTrailers))
    }
}

impl RequestView for HostView {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.0.header(name)
    }

    fn header_lines(&self, name: &str) -> Lines<'_> {
        self.0.header_lines(name)
    }

    fn client_ip(&self) -> Option<Vec<u8>> {
        if self.0.map != MapType::HttpRequestHeaders {
            return None;
        }
        let addr = property(SOURCE_ADDRESS)?;
        Some(strip_port(&addr).to_vec())
    }

    /// The stream's attributes (`response.code_details`: who answered, and why).
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        property(path)
    }
}
