//! Host names as `match.hosts` compares them and the `authority` key reads them: one spelling per
//! host, whatever its port, case, trailing dot or IP literal's spelling.
//!
//! Invariant: every spelling of one IPv6 address in brackets (`[::1]`, `[0:0::1]`, `[::0001]`,
//! `[0:0:0:0:0:0:0:1]`, hex digits in either case, with or without a zone id) has one canonical
//! form, `[::1]` (RFC 5952, as Rust prints it), and an IPv4-mapped one (`[::ffff:10.0.0.1]`) is its
//! IPv4 address (`10.0.0.1`), as `client_ip` reads it. A configured host (or `authority` key
//! value) and a request's `:authority` go through the same function, so a request cannot step out
//! of a host-scoped rule, or into a fresh bucket of an `authority` key, by spelling its host
//! another way.

use std::net::Ipv6Addr;

/// `host` (lower-cased, without port or trailing dot) with an IPv6 literal in canonical form;
/// anything else, including a bracketed text that is not an IPv6 address, unchanged.
pub fn canonical(host: Vec<u8>) -> Vec<u8> {
    let Some(inner) = host.strip_prefix(b"[").and_then(|h| h.strip_suffix(b"]")) else {
        return host;
    };
    // A zone id (`%25eth0`, RFC 6874; some clients send a bare `%`) names the client's own
    // interface: the address is the same on the server's side.
    let addr = inner.split(|&b| b == b'%').next().unwrap_or(inner);
    match std::str::from_utf8(addr)
        .ok()
        .and_then(|s| s.parse::<Ipv6Addr>().ok())
    {
        Some(ip) => match ip.to_ipv4_mapped() {
            Some(v4) => v4.to_string().into_bytes(),
            None => format!("[{ip}]").into_bytes(),
        },
        None => host,
    }
}

/// `:authority` as the host a server routes by: without its port (and userinfo), lower-cased,
/// without a trailing dot, an IP literal in canonical form: `API.Example.com.:8443` →
/// `api.example.com`, `[0:0::1]:80` → `[::1]`.
pub fn of_authority(authority: &[u8]) -> Vec<u8> {
    let after_user = match authority.iter().rposition(|&b| b == b'@') {
        Some(at) => authority.get(at + 1..).unwrap_or_default(),
        None => authority,
    };
    let host = if after_user.first() == Some(&b'[') {
        let end = after_user
            .iter()
            .position(|&b| b == b']')
            .map_or(after_user.len(), |e| e + 1);
        after_user.get(..end).unwrap_or(after_user)
    } else {
        match after_user.iter().rposition(|&b| b == b':') {
            Some(colon) => after_user.get(..colon).unwrap_or(after_user),
            None => after_user,
        }
    };
    let mut host = host.strip_suffix(b".").unwrap_or(host).to_vec();
    host.make_ascii_lowercase();
    canonical(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(h: &str) -> String {
        String::from_utf8(canonical(h.as_bytes().to_vec())).unwrap()
    }

    #[test]
    fn one_spelling_per_address() {
        for same in [
            "[::1]",
            "[0:0::1]",
            "[::0001]",
            "[0:0:0:0:0:0:0:1]",
            "[0000:0000:0000:0000:0000:0000:0000:0001]",
            "[::1%25eth0]",
            "[::1%eth0]",
        ] {
            assert_eq!(c(same), "[::1]", "{same}");
        }
        assert_eq!(c("[2001:DB8:0:0:0:0:0:AB]"), "[2001:db8::ab]");
        assert_eq!(c("[2001:db8::Ab]"), "[2001:db8::ab]");
        assert_eq!(c("[fe80::1%25ETH0]"), "[fe80::1]");
        assert_eq!(c("[::ffff:10.0.0.1]"), "10.0.0.1");
        assert_eq!(c("[::ffff:a00:1]"), "10.0.0.1");
        assert_ne!(c("[::2]"), "[::1]");
    }

    #[test]
    fn everything_else_unchanged() {
        for other in [
            "api.example.com",
            "10.0.0.1",
            "[nope]",
            "[::1",
            "::1]",
            "[]",
            "[%25]",
            "",
        ] {
            assert_eq!(c(other), other);
        }
    }
}
