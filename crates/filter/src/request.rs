//! The `RequestView`s of the stream being called back: the request (its headers read from the host
//! in one call, the first time a rule needs one) and the response's headers or trailers.
//!
//! Invariant: a header or attribute the host will not give reads as absent, never a panic; the
//! request's header map is read at most once per callback.

use std::borrow::Cow;

use tollgate_abi::{self as abi, MapType};
use tollgate_core::property::{strip_port, SOURCE_ADDRESS};
use tollgate_core::rule::{Lines, RequestView};

use crate::host::property;

/// The current request, read lazily from the host: all its headers in one call, the first time
/// a rule needs one (each header read on its own would cost Envoy a call and an allocation
/// callback into the VM).
#[derive(Default)]
pub struct HostRequest {
    headers: std::cell::OnceCell<Option<Vec<u8>>>,
}

impl HostRequest {
    /// The request's headers as the host encodes them, read once.
    fn pairs(&self) -> Option<&[u8]> {
        self.headers
            .get_or_init(|| {
                let pairs = abi::header_pairs(MapType::HttpRequestHeaders).ok();
                if pairs.is_none() {
                    log::error!("tollgate: the host gave no request headers; rules see none");
                }
                pairs
            })
            .as_deref()
    }
}

impl RequestView for HostRequest {
    /// Every line of a repeated header, joined with `,` as Envoy's `request.headers` attribute
    /// joins them (`get_header_map_value` would give only the first line).
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

    fn client_ip(&self) -> Option<Vec<u8>> {
        let addr = property(SOURCE_ADDRESS)?;
        Some(strip_port(&addr).to_vec())
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        property(path)
    }
}

/// The current response's headers or trailers.
pub struct HostResponse(MapType);

impl HostResponse {
    pub fn headers() -> HostResponse {
        HostResponse(MapType::HttpResponseHeaders)
    }

    pub fn trailers() -> HostResponse {
        HostResponse(MapType::HttpResponseTrailers)
    }
}

impl RequestView for HostResponse {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        abi::header(self.0, name).ok().map(Cow::Owned)
    }

    fn client_ip(&self) -> Option<Vec<u8>> {
        None
    }

    /// The stream's attributes (`response.code_details`: who answered, and why).
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        property(path)
    }
}
