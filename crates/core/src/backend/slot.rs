//! The Redis Cluster slot of a bucket key, computed as Redis computes it.
//!
//! Invariant: `slot(key)` is what `CLUSTER KEYSLOT key` answers: CRC16 (XMODEM: polynomial
//! 0x1021, initial value 0, no reflection) of the key's hash tag, modulo 16384. The hash tag is
//! the text between the first `{` and the first `}` after it, when that text is not empty; else
//! the whole key. A script call may touch keys of one slot only, so a batch sent to a Cluster
//! carries keys of one `slot` value.

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The Redis Cluster slot of `key`.
pub fn slot(key: &str) -> u16 {
    crc16(hash_tag(key.as_bytes())) % SLOTS
}

/// The part of `key` Redis hashes: the non-empty text inside the first `{...}`, else all of it.
fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let after = key.get(open + 1..).unwrap_or_default();
    match after.iter().position(|&b| b == b'}') {
        Some(close) if close > 0 => after.get(..close).unwrap_or(key),
        _ => key,
    }
}

/// CRC16-XMODEM (CCITT polynomial 0x1021, initial value 0), bit by bit: a key is short and this
/// runs once per batched check, so no table is worth its bytes in the wasm.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values `CLUSTER KEYSLOT` answers (Redis 7.0.15), and the CRC16 check value of the spec.
    #[test]
    fn known_vectors() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot(""), 0);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(slot("user1000"), 3443);
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(slot("foo{}{bar}"), 8363);
        // Only the first `{` opens a tag, and the first `}` after it closes it.
        assert_eq!(slot("foo{{bar}}zap"), 4015);
        assert_eq!(slot("{bar"), 4015);
        assert_eq!(slot("foo{bar}{zap}"), 5061);
        // No closing brace: the whole key.
        assert_eq!(slot("{user1000"), 8723);
    }

    /// tollgate's keys hash on `{<rule>:<digest>}`: the prefix never moves a bucket.
    #[test]
    fn the_prefix_is_outside_the_tag() {
        assert_eq!(
            slot("tollgate:{per-user:ab12}"),
            slot("other:{per-user:ab12}")
        );
        assert_eq!(slot("tollgate:{per-user:ab12}"), slot("per-user:ab12"));
        assert_eq!(slot("tollgate:{per-user:ab12}"), 9933);
    }
}
