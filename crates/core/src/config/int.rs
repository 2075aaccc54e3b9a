//! `Int<MIN, MAX>`: a configuration integer and its bounds, as one type.
//!
//! Invariant: an `Int<MIN, MAX>` holds a value in `MIN..=MAX`, and it is read only from a JSON
//! integer: a float (even `1.0`), a string, a negative number or any other value is refused with
//! the reference's words, `must be an integer >= MIN` (or `<= MAX` for a number above the range).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A JSON integer in `MIN..=MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Int<const MIN: u64, const MAX: u64>(u64);

impl<const MIN: u64, const MAX: u64> Int<MIN, MAX> {
    /// `n`, when it is in range.
    pub const fn new(n: u64) -> Option<Self> {
        if MIN <= n && n <= MAX {
            Some(Int(n))
        } else {
            None
        }
    }

    /// `N`, checked when the program is compiled (the document's defaults).
    pub const fn of<const N: u64>() -> Self {
        const { assert!(MIN <= N && N <= MAX, "a default outside its bounds") };
        Int(N)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    /// The reason a value below the range (or not an integer at all) is refused.
    pub fn too_small() -> String {
        format!("must be an integer >= {MIN}")
    }

    /// The reason a number above the range is refused.
    pub fn too_big() -> String {
        format!("must be an integer <= {MAX}")
    }
}

impl<'de, const MIN: u64, const MAX: u64> Deserialize<'de> for Int<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(IntVisitor::<MIN, MAX>)
    }
}

struct IntVisitor<const MIN: u64, const MAX: u64>;

impl<const MIN: u64, const MAX: u64> Visitor<'_> for IntVisitor<MIN, MAX> {
    type Value = Int<MIN, MAX>;

    /// What any value that is not a number is told (`must be ` + this).
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an integer >= {MIN}")
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
        match Int::new(n) {
            Some(int) => Ok(int),
            None if n > MAX => Err(E::custom(Int::<MIN, MAX>::too_big())),
            None => Err(E::custom(Int::<MIN, MAX>::too_small())),
        }
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
        match u64::try_from(n) {
            Ok(n) => self.visit_u64(n),
            Err(_) => Err(E::custom(Int::<MIN, MAX>::too_small())),
        }
    }

    /// A float is never an integer here; one above the range (an integer too large for u64
    /// arrives as a float) is told what is wrong with it.
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Self::Value, E> {
        if f > MAX as f64 {
            Err(E::custom(Int::<MIN, MAX>::too_big()))
        } else {
            Err(E::custom(Int::<MIN, MAX>::too_small()))
        }
    }
}
