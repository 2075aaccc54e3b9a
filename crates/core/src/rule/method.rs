//! The methods an application may route a request as.
//!
//! Invariant: a request cannot step out of a method match, or into a bucket of its own under the
//! `method` key, by how it asks for a method: `HEAD` is `GET` ([`as_routed`]), and a request that
//! asks the application to route it as another method ([`any_override`]) matches a rule naming
//! either, and its `method` key is ambiguous (one bucket per rule) unless every reading agrees.

use std::borrow::Cow;

use super::{reading, RequestView};

/// The headers with which a request asks to be routed as another method: Symfony and Laravel,
/// Rack (Rails, Sinatra), ASP.NET Core's and Express's method-override middleware, Scalatra, Slim
/// and Yii read `X-HTTP-Method-Override`; others read `X-HTTP-Method` or `X-Method-Override`.
/// Most honour it on a `POST` only; Slim, Yii and Express (configured so) on any method.
const OVERRIDE_HEADERS: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The query parameter with which a `POST` asks the same (Laravel enables Symfony's `_method`).
const OVERRIDE_PARAMETER: &str = "_method";

/// The method as applications route it: upper-cased (HTTP/2 lets a client send `delete`, which
/// Django and Werkzeug upper-case and run as `DELETE`), and `HEAD` runs the `GET` handler
/// (Express, Rails, Flask, Django, Spring, Go's mux: the response is the GET's without its body),
/// so it is `GET` to a method match and to the `method` key; a request cannot step out of a rule,
/// or into a bucket of its own, by the case of its method or by asking for the headers only.
pub fn as_routed(method: &[u8]) -> Cow<'_, [u8]> {
    if method.eq_ignore_ascii_case(b"HEAD") {
        Cow::Borrowed(b"GET")
    } else if method.iter().any(u8::is_ascii_lowercase) {
        Cow::Owned(method.to_ascii_uppercase())
    } else {
        Cow::Borrowed(method)
    }
}

/// Whether `holds` holds for one of the methods a request sent as `sent` asks the application to
/// route it as instead, each upper-cased as the frameworks upper-case them: each line of the
/// override headers (names as servers fold them, [`RequestView::header_lines`]), whole and each of
/// its comma-separated items trimmed (Express reads the first), on any method; and for a `POST`,
/// each value of `_method` in the query.
pub fn any_override(
    req: &dyn RequestView,
    sent: &[u8],
    mut holds: impl FnMut(&[u8]) -> bool,
) -> bool {
    let mut asks = |value: &[u8]| {
        holds(&value.to_ascii_uppercase())
            || (value.contains(&b',')
                && value
                    .split(|&b| b == b',')
                    .any(|item| holds(&item.trim_ascii().to_ascii_uppercase())))
    };
    let in_headers = OVERRIDE_HEADERS
        .iter()
        .any(|name| req.header_lines(name).iter().any(&mut asks));
    in_headers
        || (sent.eq_ignore_ascii_case(b"POST")
            && req.header(":path").is_some_and(|full| {
                reading::query_values(&full, OVERRIDE_PARAMETER).any(|value| asks(&value))
            }))
}
