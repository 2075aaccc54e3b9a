//! Envoy attributes as the filter reads them (`proxy_get_property`): a path in the host's encoding,
//! and the client address Envoy hands over, without its port.
//!
//! Invariant: a path's encoding is each segment followed by one NUL, nothing else, and encoding
//! it never allocates for a path of up to `SHORT` bytes (a header's is, and the local path may
//! read one per request). Reading an address never fails: what is not `host:port` comes back as it is.

/// Encoded paths up to this long are built on the stack.
const SHORT: usize = 128;

/// The attribute that holds the downstream peer's address (`ip:port`, `[ip6]:port`).
pub const SOURCE_ADDRESS: &[&str] = &["source", "address"];

/// Runs `f` on `path` in the host's encoding, built on the stack when short.
pub fn with_path<R>(path: &[&str], f: impl FnOnce(&[u8]) -> R) -> R {
    let len: usize = path.iter().map(|p| p.len() + 1).sum();
    let mut short = [0u8; SHORT];
    if let Some(buf) = short.get_mut(..len) {
        // Each segment, then a NUL (the buffer is zeroed).
        let mut at = 0;
        for segment in path {
            let end = at + segment.len();
            if let Some(text) = buf.get_mut(at..end) {
                text.copy_from_slice(segment.as_bytes());
            }
            at = end + 1;
        }
        return f(buf);
    }
    let mut long = Vec::with_capacity(len);
    for segment in path {
        long.extend_from_slice(segment.as_bytes());
        long.push(0);
    }
    f(&long)
}

/// The address part of a `source.address` value: `1.2.3.4:5678` -> `1.2.3.4`, `[::1]:5678` ->
/// `::1`; anything else (a bare IPv6 address, a value without a port) as it is.
pub fn strip_port(addr: &[u8]) -> &[u8] {
    if let Some(rest) = addr.strip_prefix(b"[") {
        if let Some(end) = rest.iter().position(|&b| b == b']') {
            return rest.get(..end).unwrap_or(rest);
        }
        return addr;
    }
    let colons = addr.iter().filter(|&&b| b == b':').count();
    if colons == 1 {
        if let Some(pos) = addr.iter().position(|&b| b == b':') {
            return addr.get(..pos).unwrap_or(addr);
        }
    }
    addr
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(path: &[&str]) -> Vec<u8> {
        with_path(path, <[u8]>::to_vec)
    }

    #[test]
    fn each_segment_ends_with_a_nul() {
        assert_eq!(encoded(SOURCE_ADDRESS), b"source\0address\0");
        assert_eq!(
            encoded(&["request", "headers", "x-user-id"]),
            b"request\0headers\0x-user-id\0"
        );
        assert_eq!(encoded(&[]), b"");
        assert_eq!(encoded(&[""]), b"\0");
        assert_eq!(encoded(&["", "a", ""]), b"\0a\0\0");
    }

    #[test]
    fn short_and_long_paths_encode_alike() {
        // Around the stack buffer's size: one byte under, at, and over it.
        for n in [SHORT - 2, SHORT - 1, SHORT, SHORT + 1, 10 * SHORT] {
            let long = "k".repeat(n);
            let path = ["metadata", long.as_str()];
            let mut want = b"metadata\0".to_vec();
            want.extend_from_slice(long.as_bytes());
            want.push(0);
            assert_eq!(encoded(&path), want, "{n}");
        }
    }

    #[test]
    fn the_port_is_stripped_from_source_addresses() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"1.2.3.4:5678", b"1.2.3.4"),
            (b"1.2.3.4", b"1.2.3.4"),
            (b"[::1]:5678", b"::1"),
            (b"[2001:db8::7]:443", b"2001:db8::7"),
            (b"[::1]", b"::1"),
            (b"::1", b"::1"),
            (b"2001:db8::7", b"2001:db8::7"),
            (b"[::1", b"[::1"),
            (b"host:", b"host"),
            (b":80", b""),
            (b"", b""),
            (b"[]:1", b""),
        ];
        for (addr, want) in cases {
            assert_eq!(strip_port(addr), *want, "{}", String::from_utf8_lossy(addr));
        }
    }
}
