//! What a response's status means for a `charge_on` admission: the whole up-front cost when the
//! status is in the rule's set, nothing when it is not.
//!
//! Invariant: only a well-formed status (three digits, 100..=599) outside the set refunds; a
//! response with no status or another value is unreadable, so charged the up-front cost. The
//! status read is the one Envoy answers the client with, its own local replies included (a 503 when
//! no upstream is healthy or reachable): the upstream's status line, never a header a client or
//! upstream can add. An answer Envoy gave because the application's never came after the request
//! was sent to it (a timeout, a reset, an answer Envoy could not read: [`lost`]) is unfinished,
//! so charged, whatever its status: the application may have taken the request.

use super::read::Unreadable;
use crate::config::StatusSet;
use crate::rule::RequestView;

/// The response status of `value` (`:status`): three ASCII digits in 100..=599.
pub fn parse(value: &[u8]) -> Option<u16> {
    match value {
        [a @ b'1'..=b'5', b @ b'0'..=b'9', c @ b'0'..=b'9'] => {
            Some(u16::from(a - b'0') * 100 + u16::from(b - b'0') * 10 + u16::from(c - b'0'))
        }
        _ => None,
    }
}

/// Whether Envoy's response code details (`response.code_details`) say that Envoy answered
/// because the application's answer never came after the request went to it: the router's
/// upstream failures (`response_timeout`, `upstream_per_try_timeout`,
/// `upstream_reset_before_response_started{remote_reset}`, `…{protocol_error}`, …) and the
/// stream's own timeouts; not a connection that never opened (`…{remote_connection_failure}`,
/// `…{connection_timeout}`, `…{overflow}`), nor the application's own answer (`via_upstream`)
/// or a reply of Envoy that sent nothing upstream (`no_healthy_upstream`, `direct_response`,
/// another filter's). Also a downstream codec's reply (`http1.codec_error`, `http1.*`, `http2.*`,
/// `http3.*`): the client broke its own request (a bad chunk or trailer) after its headers went
/// by, so while the application may already hold it; one that broke before tollgate saw the
/// headers was never admitted.
pub fn lost(details: &[u8]) -> bool {
    const RESET: &[u8] = b"upstream_reset_before_response_started{";
    /// Reset reasons of a connection that never carried the request.
    const NEVER_SENT: &[&[u8]] = &[
        b"connection_failure",
        b"local_connection_failure",
        b"remote_connection_failure",
        b"connection_timeout",
        b"overflow",
    ];
    const TIMEOUTS: &[&[u8]] = &[
        b"response_timeout",
        b"stream_idle_timeout",
        b"request_overall_timeout",
        b"max_duration_timeout",
    ];
    if let Some(reason) = details.strip_prefix(RESET) {
        let end = reason
            .iter()
            .position(|&b| matches!(b, b'}' | b'|' | b','))
            .unwrap_or(reason.len());
        return !NEVER_SENT.contains(&reason.get(..end).unwrap_or(reason));
    }
    /// Envoy's codecs' response code details (`Http1ResponseCodeDetailValues`, and those of
    /// HTTP/2 and HTTP/3).
    const CODECS: &[&[u8]] = &[b"http1.", b"http2.", b"http3."];
    details.starts_with(b"upstream_")
        || TIMEOUTS.contains(&details)
        || CODECS.iter().any(|c| details.starts_with(c))
}

/// What an admission that paid `upfront` used, by the status of the response `view` shows.
pub fn used(view: &dyn RequestView, statuses: &StatusSet, upfront: u64) -> Result<u64, Unreadable> {
    if view
        .property(&["response", "code_details"])
        .is_some_and(|d| lost(&d))
    {
        return Err(Unreadable::Unfinished);
    }
    let value = view.header(":status").ok_or(Unreadable::Missing)?;
    let status = parse(&value).ok_or(Unreadable::Invalid)?;
    Ok(if statuses.contains(status) {
        upfront
    } else {
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    struct Status(Option<&'static str>);

    /// A status and Envoy's response code details.
    struct Detailed(&'static str, &'static str);

    impl RequestView for Detailed {
        fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
            (name == ":status").then_some(Cow::Borrowed(self.0.as_bytes()))
        }
        fn client_ip(&self) -> Option<Vec<u8>> {
            None
        }
        fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
            (path == ["response", "code_details"]).then(|| self.1.as_bytes().to_vec())
        }
    }

    #[test]
    fn an_answer_that_never_came_from_the_application_is_charged_whatever_envoy_says() {
        let set = StatusSet::of(&[401]).unwrap();
        for lost in [
            "response_timeout",
            "upstream_per_try_timeout",
            "upstream_reset_before_response_started{remote_reset}",
            "upstream_reset_before_response_started{connection_termination}",
            "upstream_reset_before_response_started{protocol_error}",
            "upstream_max_stream_duration_reached",
            "stream_idle_timeout",
        ] {
            assert_eq!(
                used(&Detailed("504", lost), &set, 1),
                Err(Unreadable::Unfinished),
                "{lost}"
            );
        }
        for by_status in [
            "via_upstream",
            "no_healthy_upstream",
            "cluster_not_found",
            "direct_response",
            "ext_authz_denied",
            "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
            "upstream_reset_before_response_started{connection_timeout}",
            "upstream_reset_before_response_started{overflow}",
        ] {
            assert_eq!(used(&Detailed("503", by_status), &set, 1), Ok(0), "{by_status}");
        }
        assert_eq!(used(&Detailed("401", "via_upstream"), &set, 1), Ok(1));
    }

    /// An HTTP/1.1 client whose request headers passed tollgate and went upstream (a login with
    /// `authorization: Basic …` and `transfer-encoding: chunked`), then sends a broken chunk
    /// (`zz\r\n`) or a bad trailer before the application answers: Envoy's codec answers `400`
    /// itself (`ServerConnectionImpl::sendProtocolError` → `sendLocalReply`, details
    /// `http1.codec_error`), through the filter chain, while the application already holds the
    /// request. The answer never came from the application, so the admission is charged, as a
    /// reset is; read by its status, the 400 would refund a request the upstream took.
    #[test]
    fn a_client_that_breaks_its_own_request_after_it_went_upstream_is_charged() {
        let set = StatusSet::of(&[401]).unwrap();
        for broken in [
            "http1.codec_error",
            "http1.invalid_characters",
            "http1.headers_too_large",
            "http2.violation.of.messaging.rule",
            "http3.invalid_header_field",
        ] {
            assert_eq!(
                used(&Detailed("400", broken), &set, 1),
                Err(Unreadable::Unfinished),
                "{broken}"
            );
        }
    }

    impl RequestView for Status {
        fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
            (name == ":status")
                .then_some(self.0)
                .flatten()
                .map(|v| Cow::Borrowed(v.as_bytes()))
        }
        fn client_ip(&self) -> Option<Vec<u8>> {
            None
        }
    }

    #[test]
    fn statuses() {
        assert_eq!(parse(b"401"), Some(401));
        assert_eq!(parse(b"100"), Some(100));
        assert_eq!(parse(b"599"), Some(599));
        for bad in [
            &b""[..],
            b"40",
            b"4010",
            b" 401",
            b"600",
            b"099",
            b"4x1",
            b"-01",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn in_the_set_uses_the_upfront_cost_else_nothing_and_no_status_is_charged() {
        let set = StatusSet::of(&[401, 403]).unwrap();
        assert_eq!(used(&Status(Some("401")), &set, 3), Ok(3));
        assert_eq!(used(&Status(Some("200")), &set, 3), Ok(0));
        assert_eq!(used(&Status(Some("503")), &set, 3), Ok(0));
        assert_eq!(
            used(&Status(None), &set, 3),
            Err(Unreadable::Missing),
            "no status: charged the worst case"
        );
        assert_eq!(
            used(&Status(Some("40x")), &set, 3),
            Err(Unreadable::Invalid)
        );
    }
}
