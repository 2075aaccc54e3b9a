//! Rate-limit response headers: IETF `RateLimit` / `RateLimit-Policy`, legacy `X-RateLimit-*`, and
//! `Retry-After`.
//!
//! Invariant: every number is whole seconds rounded up, so a client that waits what the headers say
//! never retries too early.

use crate::bucket::Limits;
use crate::config::HeaderStyle;

/// On a response that was held for a reservation: how long, in milliseconds.
pub const DELAY: &str = "x-ratelimit-delay-ms";

/// What one rule says about a request, for its headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report<'a> {
    pub rule: &'a str,
    pub limits: Limits,
    /// Whole tokens left (0 on a denial).
    pub remaining: u64,
    /// Milliseconds until the quota is back: until full when admitted, until retry when denied.
    pub reset_ms: u64,
}

/// Whole seconds, rounded up.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// `Retry-After` seconds for a denial: rounded up, at least 1.
pub fn retry_after_secs(ms: u64) -> u64 {
    ceil_secs(ms).max(1)
}

/// The policy window: seconds to refill a whole burst (so `q`/`w` is the long-run rate).
pub fn window_secs(limits: &Limits) -> u64 {
    let refill_ms = limits
        .burst
        .saturating_mul(limits.period_ms)
        .div_ceil(limits.rate.max(1));
    ceil_secs(refill_ms).max(1)
}

/// The most restrictive of several reports: fewest tokens left, then the longest wait.
pub fn most_restrictive<'a, 'b>(reports: &'b [Report<'a>]) -> Option<&'b Report<'a>> {
    reports.iter().min_by(|a, b| {
        a.remaining
            .cmp(&b.remaining)
            .then(b.reset_ms.cmp(&a.reset_ms))
    })
}

/// The rate-limit headers for one report in the configured style. Built without `core::fmt`
/// ([`crate::decimal`]):
/// they go on every admitted response, and formatting machinery costs more in wasm than the rest
/// of the local path.
pub fn rate_limit_headers(style: HeaderStyle, r: &Report<'_>) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(5);
    let reset = ceil_secs(r.reset_ms);
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
        let quoted_rule = |extra: usize| {
            let mut v = String::with_capacity(r.rule.len() + 2 + extra);
            v.push('"');
            v.push_str(r.rule);
            v.push('"');
            v
        };
        let mut policy = quoted_rule(48);
        policy.push_str(";q=");
        crate::decimal::push(&mut policy, r.limits.burst);
        policy.push_str(";w=");
        crate::decimal::push(&mut policy, window_secs(&r.limits));
        out.push(("ratelimit-policy".to_string(), policy));
        let mut now = quoted_rule(48);
        now.push_str(";r=");
        crate::decimal::push(&mut now, r.remaining);
        now.push_str(";t=");
        crate::decimal::push(&mut now, reset);
        out.push(("ratelimit".to_string(), now));
    }
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        let decimal = |n: u64| {
            let mut v = String::with_capacity(20);
            crate::decimal::push(&mut v, n);
            v
        };
        out.push(("x-ratelimit-limit".to_string(), decimal(r.limits.burst)));
        out.push(("x-ratelimit-remaining".to_string(), decimal(r.remaining)));
        out.push(("x-ratelimit-reset".to_string(), decimal(reset)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        burst: 200,
        rate: 100,
        period_ms: 1000,
    };

    fn report(remaining: u64, reset_ms: u64) -> Report<'static> {
        Report {
            rule: "per-user",
            limits: LIMITS,
            remaining,
            reset_ms,
        }
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(1000), 1);
        assert_eq!(ceil_secs(1001), 2);
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(10), 1);
        assert_eq!(retry_after_secs(2500), 3);
    }

    #[test]
    fn window_is_time_to_refill_burst() {
        assert_eq!(window_secs(&LIMITS), 2);
        let slow = Limits {
            burst: 10,
            rate: 1,
            period_ms: 60_000,
        };
        assert_eq!(window_secs(&slow), 600);
        let fast = Limits {
            burst: 1,
            rate: 1000,
            period_ms: 1000,
        };
        assert_eq!(window_secs(&fast), 1);
    }

    #[test]
    fn ietf_headers() {
        let h = rate_limit_headers(HeaderStyle::Ietf, &report(57, 1430));
        assert_eq!(
            h,
            vec![
                (
                    "ratelimit-policy".to_string(),
                    "\"per-user\";q=200;w=2".to_string()
                ),
                ("ratelimit".to_string(), "\"per-user\";r=57;t=2".to_string()),
            ]
        );
    }

    #[test]
    fn legacy_and_both_and_none() {
        let legacy = rate_limit_headers(HeaderStyle::Legacy, &report(0, 999));
        assert_eq!(
            legacy,
            vec![
                ("x-ratelimit-limit".to_string(), "200".to_string()),
                ("x-ratelimit-remaining".to_string(), "0".to_string()),
                ("x-ratelimit-reset".to_string(), "1".to_string()),
            ]
        );
        assert_eq!(
            rate_limit_headers(HeaderStyle::Both, &report(0, 999)).len(),
            5
        );
        assert!(rate_limit_headers(HeaderStyle::None, &report(0, 999)).is_empty());
    }

    #[test]
    fn most_restrictive_is_fewest_left_then_longest_wait() {
        let rs = [
            report(5, 100),
            report(2, 100),
            report(2, 900),
            report(9, 5000),
        ];
        assert_eq!(most_restrictive(&rs), Some(&rs[2]));
        assert_eq!(most_restrictive(&[]), None);
    }
}
