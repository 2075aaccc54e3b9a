//! `charge_on`: a rule that keeps the tokens an admission took only when the answer's HTTP status
//! is one of a set, and refunds them otherwise.
//!
//! Invariant: a [`StatusSet`] holds only codes 100..=599 and is never empty. A `charge_on` whose
//! `status` lists anything else (a code outside 100..=599, a class other than "1xx".."5xx", no
//! entry, more than [`MAX_CHARGE_ON_STATUSES`], an entry that adds nothing to those before it) is a
//! configuration error naming the entry. A `charge_on` rule compiles to a usage rule whose usage
//! is its up-front cost or nothing ([`UsageSource::Status`]), so it is settled by the one usage
//! path; like `usage`, it is exact mode only, and never together with `usage`.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, Unexpected, Visitor};

use super::bounds::{MAX_CHARGE_ON_STATUSES, MAX_STATUS, MIN_STATUS};
use super::document as doc;
use super::error::{err, index, join, ConfigError};
use super::model::{Mode, Usage, UsageSource, WorstCase};

/// One entry of `charge_on.status` as written: a code, or a class (`"4xx"` is 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusEntry {
    Code(u16),
    Class(u8),
}

impl<'de> Deserialize<'de> for StatusEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(EntryVisitor)
    }
}

struct EntryVisitor;

impl Visitor<'_> for EntryVisitor {
    type Value = StatusEntry;

    /// What any other value is told (`must be ` + this); it never echoes the value.
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a status code {MIN_STATUS} to {MAX_STATUS} or a class \"1xx\" to \"5xx\""
        )
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<StatusEntry, E> {
        u16::try_from(n)
            .ok()
            .filter(|c| (MIN_STATUS..=MAX_STATUS).contains(c))
            .map(StatusEntry::Code)
            .ok_or_else(|| E::invalid_value(Unexpected::Unsigned(n), &self))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<StatusEntry, E> {
        Err(E::invalid_value(Unexpected::Signed(n), &self))
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<StatusEntry, E> {
        Err(E::invalid_value(Unexpected::Float(f), &self))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<StatusEntry, E> {
        match s.as_bytes() {
            [d @ b'1'..=b'5', b'x', b'x'] => Ok(StatusEntry::Class(d - b'0')),
            _ => Err(E::invalid_value(Unexpected::Str(s), &self)),
        }
    }
}

/// Words in a `[u64]` bit set of the codes 100..=599 (bit `code - 100`).
const WORDS: usize = (MAX_STATUS - MIN_STATUS) as usize / 64 + 1;

/// A set of HTTP status codes, each in 100..=599; never empty once compiled.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StatusSet {
    bits: [u64; WORDS],
}

impl StatusSet {
    fn empty() -> StatusSet {
        StatusSet { bits: [0; WORDS] }
    }

    /// The word and the bit of `code`, if it is in 100..=599.
    fn place(code: u16) -> Option<(usize, u64)> {
        if !(MIN_STATUS..=MAX_STATUS).contains(&code) {
            return None;
        }
        let i = usize::from(code - MIN_STATUS);
        Some((i / 64, 1 << (i % 64)))
    }

    /// Adds `code`; false if it was there already (or is no status).
    fn insert(&mut self, code: u16) -> bool {
        let Some((w, bit)) = Self::place(code) else {
            return false;
        };
        match self.bits.get_mut(w) {
            Some(word) if *word & bit == 0 => {
                *word |= bit;
                true
            }
            _ => false,
        }
    }

    /// Whether `code` is in the set.
    pub fn contains(&self, code: u16) -> bool {
        Self::place(code)
            .and_then(|(w, bit)| self.bits.get(w).map(|word| word & bit != 0))
            .unwrap_or(false)
    }

    /// The set of `codes` (for tests and tools); None if one is no status or `codes` is empty.
    pub fn of(codes: &[u16]) -> Option<StatusSet> {
        let mut set = StatusSet::empty();
        for &c in codes {
            Self::place(c)?;
            set.insert(c);
        }
        (!codes.is_empty()).then_some(set)
    }
}

/// `401, 403, 5xx`: a whole class as its name, other codes one by one.
impl fmt::Display for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for class in 1..=5u16 {
            let codes: Vec<u16> = (class * 100..class * 100 + 100)
                .filter(|&c| self.contains(c))
                .collect();
            if codes.len() == 100 {
                parts.push(format!("{class}xx"));
            } else {
                parts.extend(codes.iter().map(u16::to_string));
            }
        }
        f.write_str(&parts.join(", "))
    }
}

/// A rule's `charge_on` (at `path`), as the usage it settles by: the up-front cost when the
/// status is in the set, nothing otherwise, the up-front cost when no status ever comes.
pub fn compile(c: doc::ChargeOn, path: &str) -> Result<Usage, ConfigError> {
    let at = join(path, "status");
    if c.status.is_empty() || c.status.len() > MAX_CHARGE_ON_STATUSES {
        return Err(err(
            at,
            format!(
                "must have 1 to {MAX_CHARGE_ON_STATUSES} entries (got {})",
                c.status.len()
            ),
        ));
    }
    let mut set = StatusSet::empty();
    for (i, entry) in c.status.iter().enumerate() {
        let codes = match *entry {
            StatusEntry::Code(code) => code..code + 1,
            StatusEntry::Class(class) => {
                let first = u16::from(class) * 100;
                first..first + 100
            }
        };
        // An entry whose codes were given before adds nothing: most likely a typo for another.
        if let Some(repeated) = codes.clone().find(|&code| set.contains(code)) {
            return Err(err(
                index(&at, i),
                format!("repeats a status given before ({repeated})"),
            ));
        }
        for code in codes {
            set.insert(code);
        }
    }
    Ok(Usage {
        source: UsageSource::Status(set),
        flush_ms: c.flush_ms.get(),
        unreadable: WorstCase::Upfront,
    })
}

/// A rule's usage source, from its `usage` (compiled) and its `charge_on` (at `path`): at most
/// one of them, and only in exact mode.
pub fn usage(
    usage: Option<Usage>,
    charge_on: Option<doc::ChargeOn>,
    mode: Mode,
    path: &str,
) -> Result<Option<Usage>, ConfigError> {
    let Some(c) = charge_on else {
        return Ok(usage);
    };
    let charge_on = compile(c, path)?;
    if usage.is_some() {
        return Err(err(
            path,
            "not together with \"usage\" (both settle the same admission: one by the answer's \
             status, the other by the usage it reports)",
        ));
    }
    if mode == Mode::Lease {
        return Err(err(
            path,
            "needs \"mode\": \"exact\" (lease admissions spend local tokens without a call, so a \
             refund could not reach the global bucket before the next admission)",
        ));
    }
    Ok(Some(charge_on))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_holds_only_statuses() {
        let s = StatusSet::of(&[401, 599, 100]).unwrap();
        assert!(s.contains(401) && s.contains(599) && s.contains(100));
        assert!(!s.contains(402) && !s.contains(99) && !s.contains(600) && !s.contains(0));
        assert_eq!(StatusSet::of(&[600]), None);
        assert_eq!(StatusSet::of(&[99]), None);
        assert_eq!(StatusSet::of(&[]), None);
        assert_eq!(s.to_string(), "100, 401, 599");
        let mut all5 = StatusSet::of(&[401]).unwrap();
        for c in 500..600 {
            all5.insert(c);
        }
        assert_eq!(all5.to_string(), "401, 5xx");
    }
}
