//! `Quota`: the limits a rule, a fallback or an override may have.
//!
//! Invariant: a `Quota` holds `rate` in 1..=[`MAX_TOKENS`], `period_ms` in 1..=[`MAX_PERIOD_MS`],
//! `burst` in 1..=[`MAX_TOKENS`], and a refill step the script can take for them
//! ([`Limits::step_ms`]: `burst × period_ms / step` at most [`MAX_FULL_UNITS`], 2^50, for a step
//! of 1 ms, or of whole seconds or minutes that divide `period_ms`): limits the script always
//! accepts ([`Limits::is_valid`]), so a configured rule never sends a call the script refuses.
//! The bounds are the ones `bucket` and `bounds` define; a `Quota` reads as the `Limits` it holds.

use std::fmt;

use super::bounds::{MAX_PERIOD_MS, MAX_TOKENS};
use super::int::Int;
use crate::bucket::{Limits, MAX_FULL_UNITS, STEPS_MS};

/// A `rate` or `burst` (and a `cost`): 1..=`MAX_TOKENS`.
pub type Tokens = Int<1, MAX_TOKENS>;
/// A `period_ms`: 1..=`MAX_PERIOD_MS`.
pub type PeriodMs = Int<1, MAX_PERIOD_MS>;

/// Limits the script accepts, within the configuration's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quota(Limits);

/// No refill step fits: `burst × period_ms` is above the script's capacity counted in
/// milliseconds, and `period_ms` is not whole seconds or minutes that would fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityError {
    pub burst: u64,
    pub period_ms: u64,
}

impl fmt::Display for CapacityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (burst, period_ms) = (self.burst, self.period_ms);
        // The first step whose count of the period would fit, were the period a multiple of it.
        let fits = |step: u64| {
            u128::from(burst) * u128::from(period_ms)
                <= u128::from(MAX_FULL_UNITS) * u128::from(step)
        };
        match STEPS_MS.into_iter().skip(1).find(|&step| fits(step)) {
            Some(1000) => write!(
                f,
                "with burst {burst}, a period this long must be whole seconds: period_ms must be \
                 a multiple of 1000 (burst × period_ms is above 2^50 = {MAX_FULL_UNITS})"
            ),
            Some(step) => write!(
                f,
                "with burst {burst}, a period this long must be whole minutes: period_ms must be \
                 a multiple of {step} (burst × period_ms / 1000 is above 2^50 = {MAX_FULL_UNITS})"
            ),
            None => write!(
                f,
                "burst × period_ms / 60000 must be at most 2^50 = {MAX_FULL_UNITS} \
                 (got {burst} × {period_ms} / 60000)"
            ),
        }
    }
}

impl std::error::Error for CapacityError {}

impl Quota {
    /// `rate` tokens every `period_ms`, up to `burst`: each already in its range, so only their
    /// product is left to check.
    pub fn new(rate: Tokens, period_ms: PeriodMs, burst: Tokens) -> Result<Quota, CapacityError> {
        let (rate, period_ms, burst) = (rate.get(), period_ms.get(), burst.get());
        let limits = Limits {
            burst,
            rate,
            period_ms,
        };
        if limits.step_ms().is_none() {
            return Err(CapacityError { burst, period_ms });
        }
        Ok(Quota(limits))
    }

    /// The limits, as a script call carries them.
    pub fn limits(&self) -> Limits {
        self.0
    }
}

/// Limits outside a `Quota`'s bounds (from [`Quota::try_from`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAQuota(pub Limits);

impl fmt::Display for NotAQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "limits outside the configuration's bounds: {:?}", self.0)
    }
}

impl std::error::Error for NotAQuota {}

/// Limits from elsewhere (a tool, a test), checked.
impl TryFrom<Limits> for Quota {
    type Error = NotAQuota;

    fn try_from(l: Limits) -> Result<Quota, NotAQuota> {
        let (Some(rate), Some(period_ms), Some(burst)) = (
            Tokens::new(l.rate),
            PeriodMs::new(l.period_ms),
            Tokens::new(l.burst),
        ) else {
            return Err(NotAQuota(l));
        };
        Quota::new(rate, period_ms, burst).map_err(|_| NotAQuota(l))
    }
}

/// A quota reads as its limits (`rule.limits.burst`); it cannot be changed through them.
impl std::ops::Deref for Quota {
    type Target = Limits;

    fn deref(&self) -> &Limits {
        &self.0
    }
}

impl From<Quota> for Limits {
    fn from(q: Quota) -> Limits {
        q.0
    }
}

impl PartialEq<Limits> for Quota {
    fn eq(&self, other: &Limits) -> bool {
        self.0 == *other
    }
}

impl PartialEq<Quota> for Limits {
    fn eq(&self, other: &Quota) -> bool {
        *self == other.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(rate: u64, period_ms: u64, burst: u64) -> Result<Quota, NotAQuota> {
        Quota::try_from(Limits {
            burst,
            rate,
            period_ms,
        })
    }

    #[test]
    fn every_quota_is_limits_the_script_accepts() {
        // The corners of the ranges, and both sides of the capacity.
        for rate in [1, 2, MAX_TOKENS - 1, MAX_TOKENS] {
            for period_ms in [
                1,
                1000,
                16_777_216,
                86_400_001,
                2_592_000_000,
                MAX_PERIOD_MS,
            ] {
                for burst in [1, 67_108_864, 67_108_865, MAX_TOKENS] {
                    let l = Limits {
                        burst,
                        rate,
                        period_ms,
                    };
                    match quota(rate, period_ms, burst) {
                        Ok(q) => {
                            assert!(q.is_valid(), "{l:?}");
                            assert_eq!(q, l);
                            assert_eq!(Limits::from(q), l);
                        }
                        Err(e) => assert!(
                            u128::from(burst) * u128::from(period_ms) > u128::from(MAX_FULL_UNITS),
                            "{e}"
                        ),
                    }
                }
            }
        }
    }

    #[test]
    fn the_capacity_is_burst_times_period_counted_in_steps() {
        // 2^26 × 2^24 = 2^50 exactly is accepted in milliseconds; one token more is not, and
        // 2^24 ms is not whole seconds.
        let q = quota(1, 1 << 24, 1 << 26).unwrap();
        assert_eq!(
            (q.burst * q.period_ms, q.step_ms()),
            (MAX_FULL_UNITS, Some(1))
        );
        let e = Quota::new(
            Tokens::of::<1>(),
            PeriodMs::of::<16_777_216>(),
            Tokens::of::<67_108_865>(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "with burst 67108865, a period this long must be whole seconds: period_ms must be \
             a multiple of 1000 (burst × period_ms is above 2^50 = 1125899906842624)"
        );
        // 1,000,000 per 30 days: whole seconds. 10^9 per 366 days: whole minutes.
        let month = quota(1_000_000, 2_592_000_000, 1_000_000).unwrap();
        assert_eq!(
            (month.step_ms(), month.units_per_token()),
            (Some(1000), Some(2_592_000))
        );
        let year = quota(MAX_TOKENS, MAX_PERIOD_MS, MAX_TOKENS).unwrap();
        assert_eq!(
            (year.step_ms(), year.units_per_token()),
            (Some(60_000), Some(527_040))
        );
        // 10^9 per 30 days and a second: neither minutes nor ms fit.
        let e = quota(1, 2_592_001_000, MAX_TOKENS).unwrap_err();
        assert_eq!(
            e.to_string(),
            "limits outside the configuration's bounds: Limits { burst: 1000000000, rate: 1, \
             period_ms: 2592001000 }"
        );
        let e = Quota::new(
            Tokens::of::<1>(),
            PeriodMs::of::<2_592_001_000>(),
            Tokens::of::<MAX_TOKENS>(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "with burst 1000000000, a period this long must be whole minutes: period_ms must be \
             a multiple of 60000 (burst × period_ms / 1000 is above 2^50 = 1125899906842624)"
        );
        assert_eq!(
            CapacityError {
                burst: u64::MAX,
                period_ms: u64::MAX
            }
            .to_string(),
            format!(
                "burst × period_ms / 60000 must be at most 2^50 = 1125899906842624 (got {} × {} / 60000)",
                u64::MAX,
                u64::MAX
            )
        );
    }

    #[test]
    fn limits_outside_the_ranges_are_not_a_quota() {
        for (rate, period_ms, burst) in [
            (0, 1000, 1),
            (MAX_TOKENS + 1, 1000, 1),
            (1, 0, 1),
            (1, MAX_PERIOD_MS + 1, 1),
            (1, 1000, 0),
            (1, 1, MAX_TOKENS + 1),
        ] {
            assert!(
                quota(rate, period_ms, burst).is_err(),
                "{rate} {period_ms} {burst}"
            );
        }
    }
}
