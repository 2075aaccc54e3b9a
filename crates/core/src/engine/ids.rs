//! The ids the engine keeps things by: the host's context ids and callout tokens, and a check's
//! place in its request.
//!
//! Invariant: an id names one kind of thing only (a context id is never a token, a check's place
//! never a rule's), and the ids a client could choose never key a map under the fast hasher: the
//! host hands out context ids and tokens, the engine numbers checks.

/// The host's id of a request (its HTTP context), as the filter gets it in every callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContextId(u32);

impl ContextId {
    /// The id as the host spells it.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl From<u32> for ContextId {
    fn from(id: u32) -> ContextId {
        ContextId(id)
    }
}

/// A check's place among its request's checks (one per matching rule, in the configuration's
/// order): what a lease wait, a chained call or a forwarded check names it by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckId(usize);

impl CheckId {
    /// The check at `place` among its request's checks.
    pub(super) const fn at(place: usize) -> CheckId {
        CheckId(place)
    }

    pub(super) const fn place(self) -> usize {
        self.0
    }
}

/// A backend call's token: the host's id of a callout, which its answer comes back with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(u32);

impl From<u32> for Token {
    fn from(token: u32) -> Token {
        Token(token)
    }
}

/// Hashes the host's context ids and callout tokens, which the host hands out (a client cannot
/// choose them), and the numbers of checks sent to other workers, with one multiplication instead
/// of SipHash: the request map is touched several times per request.
pub type ById = std::hash::BuildHasherDefault<IdHasher>;

/// 2^64 divided by the golden ratio: multiplying by it spreads consecutive ids over the whole
/// word (Fibonacci hashing).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Default)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(GOLDEN);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(GOLDEN);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(GOLDEN);
    }
}
