//! What a response's status means for a `charge_on` admission: the whole up-front cost when the
//! status is in the rule's set, nothing when it is not.
//!
//! Invariant: only a well-formed status (three digits, 100..=599) outside the set refunds; a
//! response with no status or another value is unreadable, so charged the up-front cost. The
//! status read is the one Envoy answers the client with, its own local replies included (a 503 when
//! no upstream is healthy, a 504 on a timeout): the upstream's status line, never a header a
//! client or upstream can add.

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

/// What an admission that paid `upfront` used, by the status of the response `view` shows.
pub fn used(view: &dyn RequestView, statuses: &StatusSet, upfront: u64) -> Result<u64, Unreadable> {
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
