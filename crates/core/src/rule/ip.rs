//! The `client_ip` key value: the client's address, or its network for IPv6 (and IPv4 if asked).
//!
//! Invariant: every spelling of one address (`::1`, `0:0::1`, `[::1]:80`, `::ffff:10.0.0.1` for
//! `10.0.0.1`) gives the same value, and every address of one network gives the network's value,
//! so a client cannot get a fresh bucket by changing how its address is written or by hopping
//! inside its own prefix.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Default IPv4 prefix: the whole address.
pub const DEFAULT_V4_PREFIX: u8 = 32;
/// Default IPv6 prefix: a /64 is what one customer line or host typically owns.
pub const DEFAULT_V6_PREFIX: u8 = 64;

/// `addr` (as Envoy's `source.address` gives it, with or without a port) parsed.
fn parse(addr: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(addr).ok()?.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    // `[v6]` without a port.
    s.strip_prefix('[')?
        .strip_suffix(']')?
        .parse::<IpAddr>()
        .ok()
}

fn v4_network(ip: Ipv4Addr, prefix: u8) -> String {
    if prefix >= 32 {
        return ip.to_string();
    }
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    format!("{}/{prefix}", Ipv4Addr::from(u32::from(ip) & mask))
}

fn v6_network(ip: Ipv6Addr, prefix: u8) -> String {
    if prefix >= 128 {
        return ip.to_string();
    }
    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
    format!("{}/{prefix}", Ipv6Addr::from(u128::from(ip) & mask))
}

/// The key value for client address `addr`: IPv4 as `a.b.c.d` (or `a.b.c.0/N` below /32), IPv6 as
/// its network in RFC 5952 form, e.g. `2001:db8:1:2::/64`. An IPv4-mapped IPv6 address is IPv4.
/// Anything that is not an IP address (a Unix socket path) is its bytes as they are.
pub fn key_value(addr: &[u8], v4_prefix: u8, v6_prefix: u8) -> Vec<u8> {
    let text = match parse(addr) {
        Some(IpAddr::V4(ip)) => v4_network(ip, v4_prefix),
        Some(IpAddr::V6(ip)) => match ip.to_ipv4_mapped() {
            Some(v4) => v4_network(v4, v4_prefix),
            None => v6_network(ip, v6_prefix),
        },
        None => return addr.to_vec(),
    };
    text.into_bytes()
}

/// The key value an override names for a `client_ip` source: `text` as an address or as a network
/// (`a.b.c.0/24`, `2001:db8::/64`, whose prefix must be the source's), in the form requests give.
pub fn canonical(text: &str, v4_prefix: u8, v6_prefix: u8) -> Option<Vec<u8>> {
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, Some(p.parse::<u8>().ok()?)),
        None => (text, None),
    };
    let ip = addr.parse::<IpAddr>().ok()?;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let want = match ip {
        IpAddr::V4(_) => v4_prefix,
        IpAddr::V6(_) => v6_prefix,
    };
    // A written prefix must be the source's (full-length addresses may be written without one).
    match (prefix, ip) {
        (Some(p), _) if p != want => return None,
        (None, IpAddr::V4(_)) if want != 32 => return None,
        (None, IpAddr::V6(_)) if want != 128 => return None,
        _ => {}
    }
    // The network must be written with its host bits zero, as a request's value would be.
    let value = key_value(ip.to_string().as_bytes(), v4_prefix, v6_prefix);
    let written = match prefix {
        Some(p) if p < 32 || (matches!(ip, IpAddr::V6(_)) && p < 128) => format!("{ip}/{p}"),
        _ => ip.to_string(),
    };
    (value == written.as_bytes()).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(addr: &str, v4: u8, v6: u8) -> String {
        String::from_utf8(key_value(addr.as_bytes(), v4, v6)).unwrap()
    }

    #[test]
    fn ipv4_is_the_whole_address_by_default() {
        assert_eq!(key("10.0.0.7", 32, 64), "10.0.0.7");
        assert_eq!(key("10.0.0.7:5678", 32, 64), "10.0.0.7");
        assert_eq!(key(" 10.0.0.7 ", 32, 64), "10.0.0.7");
        assert_eq!(key("10.0.0.7", 24, 64), "10.0.0.0/24");
        assert_eq!(key("10.0.0.7", 1, 64), "0.0.0.0/1");
        assert_eq!(key("200.0.0.7", 1, 64), "128.0.0.0/1");
    }

    #[test]
    fn ipv6_is_its_network() {
        assert_eq!(key("2001:db8:1:2:3:4:5:6", 32, 64), "2001:db8:1:2::/64");
        assert_eq!(
            key("[2001:db8:1:2:3:4:5:6]:443", 32, 64),
            "2001:db8:1:2::/64"
        );
        assert_eq!(key("[2001:db8:1:2::9]", 32, 64), "2001:db8:1:2::/64");
        assert_eq!(key("2001:DB8:1:2:0:0:0:1", 32, 64), "2001:db8:1:2::/64");
        assert_eq!(key("2001:db8:1:2ff::1", 32, 56), "2001:db8:1:200::/56");
        assert_eq!(key("2001:db8::1", 32, 128), "2001:db8::1");
        assert_eq!(key("::1", 32, 64), "::/64");
        assert_eq!(key("[::1]:40000", 32, 64), "::/64");
        assert_eq!(key("ff02::1", 32, 1), "8000::/1");
        // Two addresses in one /64 share it; the next /64 does not.
        assert_eq!(
            key("2001:db8:0:1::a", 32, 64),
            key("2001:db8:0:1:ffff:ffff:ffff:ffff", 32, 64)
        );
        assert_ne!(
            key("2001:db8:0:1::a", 32, 64),
            key("2001:db8:0:2::a", 32, 64)
        );
    }

    #[test]
    fn ipv4_mapped_ipv6_is_ipv4() {
        assert_eq!(key("::ffff:10.0.0.7", 32, 64), "10.0.0.7");
        assert_eq!(key("[::ffff:10.0.0.7]:80", 32, 64), "10.0.0.7");
        assert_eq!(key("::ffff:a00:7", 24, 64), "10.0.0.0/24");
    }

    #[test]
    fn not_an_address_is_kept() {
        assert_eq!(key("/var/run/envoy.sock", 32, 64), "/var/run/envoy.sock");
        assert_eq!(key("fe80::1%eth0", 32, 64), "fe80::1%eth0");
        assert_eq!(key_value(&[0xff, 0xfe], 32, 64), vec![0xff, 0xfe]);
        assert_eq!(key("", 32, 64), "");
    }

    #[test]
    fn canonical_override_values() {
        let c =
            |t: &str, v4: u8, v6: u8| canonical(t, v4, v6).map(|v| String::from_utf8(v).unwrap());
        assert_eq!(c("10.0.0.7", 32, 64).as_deref(), Some("10.0.0.7"));
        assert_eq!(c("10.0.0.7/32", 32, 64).as_deref(), Some("10.0.0.7"));
        assert_eq!(c("::ffff:10.0.0.7", 32, 64).as_deref(), Some("10.0.0.7"));
        assert_eq!(c("10.1.2.0/24", 24, 64).as_deref(), Some("10.1.2.0/24"));
        assert_eq!(
            c("2001:db8:0:1::/64", 32, 64).as_deref(),
            Some("2001:db8:0:1::/64")
        );
        assert_eq!(
            c("2001:DB8:0:1:0::/64", 32, 64).as_deref(),
            Some("2001:db8:0:1::/64")
        );
        assert_eq!(c("2001:db8::1", 32, 128).as_deref(), Some("2001:db8::1"));
        // Host bits set, a prefix other than the source's, or no prefix where one is needed.
        assert_eq!(c("10.1.2.3/24", 24, 64), None);
        assert_eq!(c("10.1.2.0/16", 24, 64), None);
        assert_eq!(c("10.1.2.0", 24, 64), None);
        assert_eq!(c("2001:db8::1", 32, 64), None);
        assert_eq!(c("2001:db8::/56", 32, 64), None);
        assert_eq!(c("example.com", 32, 64), None);
        assert_eq!(c("10.0.0.1/x", 32, 64), None);
    }
}
