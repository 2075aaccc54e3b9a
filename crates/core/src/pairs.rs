//! The proxy-wasm map encoding of header pairs: a little-endian u32 count, then a (name length,
//! value length) u32 pair per entry, then each name and value followed by a NUL.
//!
//! `lookup` reads a header from a map the host handed over (`proxy_get_header_map_pairs`), and
//! `each` visits its lines one by one: one host call gives every header a request's rules need,
//! where reading them one by one costs a call (and an allocation callback into the VM) each. The buffer comes from the host, but its
//! sizes are checked like any other input: a malformed map reads as no header, never a panic.

use std::borrow::Cow;

/// Encodes `pairs` (as `proxy_http_call` and `proxy_send_local_response` take them).
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let count = u32::try_from(pairs.len()).unwrap_or(0);
    let mut out = Vec::new();
    out.extend_from_slice(&count.to_le_bytes());
    for (k, v) in pairs.iter().take(count as usize) {
        out.extend_from_slice(&u32::try_from(k.as_ref().len()).unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&u32::try_from(v.as_ref().len()).unwrap_or(0).to_le_bytes());
    }
    for (k, v) in pairs.iter().take(count as usize) {
        out.extend_from_slice(k.as_ref().as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_ref().as_bytes());
        out.push(0);
    }
    out
}

fn u32_le(bytes: &[u8]) -> Option<usize> {
    let word = bytes.first_chunk::<4>()?;
    usize::try_from(u32::from_le_bytes(*word)).ok()
}

/// Every value of header `name` (ASCII case-insensitive) in encoded map `buf`, repeated lines
/// joined with `,` as Envoy's `request.headers` attribute joins them; None if it has none or
/// `buf` is malformed. Borrowed from `buf` when there is one line.
pub fn lookup<'a>(buf: &'a [u8], name: &str) -> Option<Cow<'a, [u8]>> {
    let mut found: Option<Cow<'a, [u8]>> = None;
    each(
        buf,
        |key| key.len() == name.len() && key.eq_ignore_ascii_case(name.as_bytes()),
        |value| {
            found = Some(match found.take() {
                Some(first) => {
                    let mut joined = first.into_owned();
                    joined.push(b',');
                    joined.extend_from_slice(value);
                    Cow::Owned(joined)
                }
                None => Cow::Borrowed(value),
            });
        },
    )?;
    found
}

/// `value` without the spaces and tabs around it, as an HTTP/1.1 server reads a field (RFC 9112
/// section 5). Envoy trims them from what an HTTP/1.1 client sends, but passes an HTTP/2 or
/// HTTP/3 client's through (`x-user: W ` is `W` to the application): read trimmed, such a value
/// names no bucket, and steps out of no condition, of its own.
pub fn trim_ows(value: &[u8]) -> &[u8] {
    let start = value
        .iter()
        .position(|b| !is_ows(*b))
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !is_ows(*b))
        .map_or(start, |i| i + 1);
    value.get(start..end).unwrap_or_default()
}

/// Whether `b` is optional whitespace around a field value: a space or a tab.
pub fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Calls `each` with the value of every entry of encoded map `buf` whose name `wanted` accepts,
/// in order, [trimmed](trim_ows). None when `buf` is malformed: what `each` was given then must
/// be dropped.
pub fn each<'a>(
    buf: &'a [u8],
    mut wanted: impl FnMut(&[u8]) -> bool,
    mut each: impl FnMut(&'a [u8]),
) -> Option<()> {
    let (count, rest) = buf.split_first_chunk::<4>()?;
    let count = usize::try_from(u32::from_le_bytes(*count)).ok()?;
    let (sizes, data) = rest.split_at_checked(count.checked_mul(8)?)?;
    // Offsets only: a name and value are sliced out when `wanted` asks for the name. Each name
    // and value is followed by a NUL, skipped, not checked.
    let mut at = 0usize;
    for entry in sizes.chunks_exact(8) {
        let (key_len, value_len) = (u32_le(entry)?, u32_le(entry.get(4..)?)?);
        let value_at = at.checked_add(key_len)?.checked_add(1)?;
        let next = value_at.checked_add(value_len)?.checked_add(1)?;
        if wanted(data.get(at..value_at - 1)?) {
            each(trim_ows(data.get(value_at..next - 1)?));
        }
        at = next;
    }
    // A map whose sizes run past its data is malformed: nothing in it is read.
    (at <= data.len()).then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_was_encoded_and_joins_repeated_lines() {
        let buf = encode(&[
            (":path", "/api/x"),
            ("x-user-id", "a"),
            ("empty", ""),
            ("X-User-Id", "b"),
        ]);
        assert_eq!(lookup(&buf, ":path").as_deref(), Some(&b"/api/x"[..]));
        assert_eq!(lookup(&buf, "x-user-id").as_deref(), Some(&b"a,b"[..]));
        assert_eq!(lookup(&buf, "empty").as_deref(), Some(&b""[..]));
        assert_eq!(lookup(&buf, "missing"), None);
        assert_eq!(lookup(&encode::<&str, &str>(&[]), ":path"), None);
        // One line is the map's own bytes, not a copy; only repeated lines are joined into one.
        assert!(matches!(lookup(&buf, ":path"), Some(Cow::Borrowed(_))));
        assert!(matches!(lookup(&buf, "x-user-id"), Some(Cow::Owned(_))));
    }

    #[test]
    fn values_are_read_without_the_spaces_and_tabs_around_them() {
        let buf = encode(&[("x-user", " W \t"), ("pad", " \t "), ("in", "a  b")]);
        assert_eq!(lookup(&buf, "x-user").as_deref(), Some(&b"W"[..]));
        assert_eq!(lookup(&buf, "pad").as_deref(), Some(&b""[..]));
        assert_eq!(
            lookup(&buf, "in").as_deref(),
            Some(&b"a  b"[..]),
            "only around it"
        );
        assert_eq!(trim_ows(b"\tx\r"), b"x\r", "spaces and tabs only");
    }

    #[test]
    fn each_visits_the_lines_a_name_test_accepts_in_order() {
        let buf = encode(&[("a", "1"), ("b", "2"), ("A", "3"), ("a_", "4")]);
        let mut seen = Vec::new();
        let got = each(&buf, |k| k.eq_ignore_ascii_case(b"a"), |v| seen.push(v));
        assert_eq!((got, seen), (Some(()), vec![&b"1"[..], b"3"]));
        let cut = buf.get(..buf.len() - 3).unwrap();
        assert_eq!(each(cut, |_| true, |_| {}), None, "a malformed map");
    }

    #[test]
    fn a_malformed_map_reads_as_no_header() {
        let good = encode(&[("a", "1"), ("b", "2")]);
        for cut in 0..good.len() - 1 {
            // Never a panic; a header whose bytes are missing is not found.
            let _ = lookup(good.get(..cut).unwrap(), "a");
            assert_eq!(lookup(good.get(..cut).unwrap(), "b"), None, "cut at {cut}");
        }
        let mut huge = good.clone();
        huge.get_mut(..4)
            .unwrap()
            .copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(lookup(&huge, "a"), None);
        let mut long_key = good;
        long_key
            .get_mut(4..8)
            .unwrap()
            .copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(lookup(&long_key, "a"), None);
    }
}
