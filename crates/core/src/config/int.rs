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
        in_range(Number::U64(n), MIN, MAX)
            .map(Int)
            .map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
        in_range(Number::I64(n), MIN, MAX)
            .map(Int)
            .map_err(E::custom)
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Self::Value, E> {
        in_range(Number::F64(f), MIN, MAX)
            .map(Int)
            .map_err(E::custom)
    }
}

/// A JSON number as serde hands it over.
enum Number {
    U64(u64),
    I64(i64),
    F64(f64),
}

/// `n` when it is an integer in `min..=max`, or why not. One function for every `Int`, so each
/// pair of bounds adds no code of its own to the wasm.
fn in_range(n: Number, min: u64, max: u64) -> Result<u64, String> {
    let above = match n {
        Number::U64(n) if (min..=max).contains(&n) => return Ok(n),
        Number::U64(n) => n > max,
        Number::I64(n) => match u64::try_from(n) {
            Ok(n) => return in_range(Number::U64(n), min, max),
            Err(_) => false,
        },
        // A float is never an integer here; one above the range (an integer too large for u64
        // arrives as a float) is told what is wrong with it.
        Number::F64(f) => f > max as f64,
    };
    Err(if above {
        format!("must be an integer <= {max}")
    } else {
        format!("must be an integer >= {min}")
    })
}
