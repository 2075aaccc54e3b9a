//! The Lua script, embedded at build time, and its SHA-1 (the name `EVALSHA` uses).
//!
//! Invariant: `SOURCE` is byte for byte `lua/token_bucket.lua`, and `sha1_hex()` is what Redis'
//! `SCRIPT LOAD` answers for it.

use sha1::{Digest, Sha1};

/// The script text sent with `EVAL` when Redis lacks it.
pub const SOURCE: &str = include_str!("../../../../lua/token_bucket.lua");

/// Lower-case hex SHA-1 of `SOURCE`.
pub fn sha1_hex() -> String {
    hex(&Sha1::digest(SOURCE.as_bytes()))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        for nibble in [b >> 4, b & 0x0f] {
            out.push(char::from_digit(u32::from(nibble), 16).unwrap_or('0'));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha1_is_forty_hex_digits() {
        let sha = sha1_hex();
        assert_eq!(sha.len(), 40);
        assert!(sha
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }

    #[test]
    fn hex_of_known_bytes() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}
