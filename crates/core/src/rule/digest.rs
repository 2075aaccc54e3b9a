//! The bucket key: `<key_prefix>:{<rule>:<digest>}`, the digest a SHA-256 of the rule's key
//! sources and their values.
//!
//! Invariant: each source's canonical spelling and its value are length-prefixed in the digest,
//! so no user text reaches Redis or a URL, two different value tuples never share a key, and
//! changing a rule's key sources starts fresh buckets; an ambiguous part is a length no value
//! gives, so no value names the ambiguous bucket.

use sha2::{Digest, Sha256};

use super::Read;
use crate::config::KeySource;

/// Bytes of the digest that go into the key (hex-encoded: twice as many characters).
const DIGEST_BYTES: usize = 16;

/// One key source's part of a bucket's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part<'a> {
    /// The value every reading agrees on.
    Value(&'a [u8]),
    /// The source is ambiguous ([`Read::Ambiguous`]): a marker no value can equal.
    Ambiguous,
}

impl Read<'_> {
    /// This reading as a part of the bucket's identity; None when missing.
    pub fn part(&self) -> Option<Part<'_>> {
        match self {
            Read::Missing => None,
            Read::Value(v) => Some(Part::Value(v)),
            Read::Ambiguous => Some(Part::Ambiguous),
        }
    }
}

/// `<prefix>:{<rule>:<digest>}`, digest = lowercase hex of the first 16 bytes of SHA-256 over, for
/// each key source in order, (u32 big-endian length ++ the source's canonical spelling ++ u32
/// big-endian length ++ its value). `values` has one value per source.
///
/// A value longer than `u32::MAX` bytes (impossible for a request header) has its length saturated.
/// Out of line: a hot key's requests find their key in the [`KeyCache`], and this code (SHA-256
/// and the key's formatting) would sit in the middle of theirs.
#[inline(never)]
pub fn bucket_key<V: AsRef<[u8]>>(
    prefix: &str,
    rule: &str,
    sources: &[KeySource],
    values: &[V],
) -> String {
    let parts = values.iter().map(|v| Part::Value(v.as_ref()));
    key_of_input(prefix, rule, &digest_input(sources, parts))
}

/// [`bucket_key`] for parts that may be ambiguous: an ambiguous part is digested as the length
/// `u32::MAX` followed by no bytes, which no value gives (a value that long would be followed by
/// its 4 GiB), so it is one bucket per rule and per the other parts' values.
#[inline(never)]
pub fn bucket_key_of(
    prefix: &str,
    rule: &str,
    sources: &[KeySource],
    parts: &[Part<'_>],
) -> String {
    key_of_input(prefix, rule, &digest_input(sources, parts.iter().copied()))
}

/// What the digest is taken over (see [`bucket_key`] and [`bucket_key_of`]).
fn digest_input<'a>(sources: &[KeySource], parts: impl Iterator<Item = Part<'a>>) -> Vec<u8> {
    fn field(input: &mut Vec<u8>, bytes: &[u8]) {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        input.extend_from_slice(&len.to_be_bytes());
        input.extend_from_slice(bytes);
    }
    let mut input = Vec::with_capacity(sources.len() * 64);
    for (source, part) in sources.iter().zip(parts) {
        // The name's length goes first: written after the name, in the room left for it.
        let at = input.len();
        input.extend_from_slice(&[0; 4]);
        source.push_name(&mut input);
        let len = u32::try_from(input.len().saturating_sub(at + 4)).unwrap_or(u32::MAX);
        if let Some(room) = input.get_mut(at..at + 4) {
            room.copy_from_slice(&len.to_be_bytes());
        }
        match part {
            Part::Value(value) => field(&mut input, value),
            Part::Ambiguous => input.extend_from_slice(&u32::MAX.to_be_bytes()),
        }
    }
    input
}

/// The rule name and the digest of bucket key `key` under `prefix`, if it has the form
/// [`bucket_key`] gives it: `<prefix>:{<rule>:<digest>}` (a rule's name has no ':'), the digest
/// [`DIGEST_HEX`] lower-case hex digits when the key is one this code made.
pub fn parts_of_key<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, &'k str)> {
    key.strip_prefix(prefix)?
        .strip_prefix(":{")?
        .strip_suffix('}')?
        .split_once(':')
}

/// How many hex digits a bucket key's digest has.
pub const DIGEST_HEX: usize = DIGEST_BYTES * 2;

fn key_of_input(prefix: &str, rule: &str, input: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(input);
    let mut key = String::with_capacity(prefix.len() + rule.len() + 4 + DIGEST_BYTES * 2);
    key.push_str(prefix);
    key.push_str(":{");
    key.push_str(rule);
    key.push(':');
    for &b in digest.iter().take(DIGEST_BYTES) {
        for nibble in [b >> 4, b & 0x0f] {
            if let Some(&c) = HEX.get(usize::from(nibble)) {
                key.push(char::from(c));
            }
        }
    }
    key.push('}');
    key
}
