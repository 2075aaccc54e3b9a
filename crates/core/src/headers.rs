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

/// The policy window: seconds to refill a whole burst (so `q`/`w` is the long-run rate). Counted
/// in u128: a burst of 10^9 over a year's period is 3 × 10^19 token-ms, past u64.
pub fn window_secs(limits: &Limits) -> u64 {
    let refill_ms = (u128::from(limits.burst) * u128::from(limits.period_ms))
        .div_ceil(u128::from(limits.rate.max(1)));
    u64::try_from(refill_ms.div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Whether report `a` is more restrictive than `b`: fewer tokens left, or as few and a longer
/// wait. (Of equally restrictive reports the first one seen is kept.)
pub fn more_restrictive(a: &Report<'_>, b: &Report<'_>) -> bool {
    a.remaining
        .cmp(&b.remaining)
        .then(b.reset_ms.cmp(&a.reset_ms))
        .is_lt()
}

/// The `RateLimit-Policy` value of a rule under `limits`: `"<rule>";q=<burst>;w=<window>`. It
/// depends on nothing else, so a rule's is built once per configuration.
pub fn policy(rule: &str, limits: &Limits) -> String {
    let mut v = String::with_capacity(rule.len() + 48);
    push_policy(&mut v, rule, limits);
    v
}

#[inline(never)]
fn push_policy(out: &mut String, rule: &str, limits: &Limits) {
    out.push('"');
    out.push_str(rule);
    out.push_str("\";q=");
    crate::decimal::push(out, limits.burst);
    out.push_str(";w=");
    crate::decimal::push(out, window_secs(limits));
}

/// Most headers one response gets: five rate-limit headers and the delay.
pub const MAX: usize = 6;

/// Response headers written into one buffer (see [`write`]): their names, and where each value
/// lies in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    spans: [(&'static str, usize, usize); MAX],
    len: usize,
}

impl Written {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The headers, their values taken from `buf`, the buffer they were written into; the first
    /// `len` entries of the array (the slice `headers` gives).
    pub fn pairs<'a>(&self, buf: &'a str) -> [(&'static str, &'a str); MAX] {
        let mut pairs = [("", ""); MAX];
        for (pair, &(name, start, end)) in pairs.iter_mut().zip(&self.spans).take(self.len) {
            *pair = (name, buf.get(start..end).unwrap_or_default());
        }
        pairs
    }

    /// The written headers out of [`Written::pairs`].
    pub fn headers<'p, 'a>(
        &self,
        pairs: &'p [(&'static str, &'a str); MAX],
    ) -> &'p [(&'static str, &'a str)] {
        pairs.get(..self.len).unwrap_or_default()
    }

    fn push(&mut self, name: &'static str, start: usize, end: usize) {
        if let Some(span) = self.spans.get_mut(self.len) {
            *span = (name, start, end);
            self.len += 1;
        }
    }
}

/// Writes into `buf` (cleared first) the rate-limit headers of `r` in `style`, if there is a
/// report, and [`DELAY`] if `delay_ms > 0`. `policy`: the report's `RateLimit-Policy` value when
/// it was built already ([`policy`]). Built without `core::fmt` ([`crate::decimal`]) and, once the
/// buffer has grown, without allocating: they go on every admitted response, and formatting and
/// allocation cost more in wasm than the rest of the local path.
pub fn write(
    style: HeaderStyle,
    r: Option<&Report<'_>>,
    policy: Option<&str>,
    delay_ms: u64,
    buf: &mut String,
) -> Written {
    buf.clear();
    let mut w = Written {
        spans: [("", 0, 0); MAX],
        len: 0,
    };
    if let Some(r) = r {
        let reset = ceil_secs(r.reset_ms);
        if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
            let start = buf.len();
            match policy {
                Some(p) => buf.push_str(p),
                None => push_policy(buf, r.rule, &r.limits),
            }
            w.push("ratelimit-policy", start, buf.len());
            let start = buf.len();
            buf.push('"');
            buf.push_str(r.rule);
            buf.push_str("\";r=");
            crate::decimal::push(buf, r.remaining);
            buf.push_str(";t=");
            crate::decimal::push(buf, reset);
            w.push("ratelimit", start, buf.len());
        }
        if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
            write_legacy(r, reset, buf, &mut w);
        }
    }
    if delay_ms > 0 {
        let start = buf.len();
        crate::decimal::push(buf, delay_ms);
        w.push(DELAY, start, buf.len());
    }
    w
}

/// The legacy `X-RateLimit-*` headers of `r` (`reset` in seconds), after what `buf` holds. Out of
/// line, as the policy of an override's limits: the default style does not run it.
#[inline(never)]
fn write_legacy(r: &Report<'_>, reset: u64, buf: &mut String, w: &mut Written) {
    for (name, n) in [
        ("x-ratelimit-limit", r.limits.burst),
        ("x-ratelimit-remaining", r.remaining),
        ("x-ratelimit-reset", reset),
    ] {
        let start = buf.len();
        crate::decimal::push(buf, n);
        w.push(name, start, buf.len());
    }
}

/// The rate-limit headers for one report in the configured style, as owned pairs (for a local
/// reply).
pub fn rate_limit_headers(style: HeaderStyle, r: &Report<'_>) -> Vec<(String, String)> {
    let mut buf = String::new();
    let written = write(style, Some(r), None, 0, &mut buf);
    let pairs = written.pairs(&buf);
    written
        .headers(&pairs)
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
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
        // 1,000,000 per 30 days: 30 days. 10^9 per 366 days, burst 10^9: 366 days, though
        // burst × period_ms passes u64. 10^9 tokens at 1 per 366 days: 10^9 × 366 days.
        let month = Limits {
            burst: 1_000_000,
            rate: 1_000_000,
            period_ms: 2_592_000_000,
        };
        assert_eq!(window_secs(&month), 2_592_000);
        let year = Limits {
            burst: 1_000_000_000,
            rate: 1_000_000_000,
            period_ms: 31_622_400_000,
        };
        assert_eq!(window_secs(&year), 31_622_400);
        let slowest = Limits { rate: 1, ..year };
        assert_eq!(window_secs(&slowest), 31_622_400 * 1_000_000_000);
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
    fn more_restrictive_is_fewer_left_then_longer_wait() {
        assert!(more_restrictive(&report(2, 100), &report(5, 100)));
        assert!(more_restrictive(&report(2, 900), &report(2, 100)));
        assert!(
            !more_restrictive(&report(2, 100), &report(2, 100)),
            "a tie keeps the first"
        );
        assert!(!more_restrictive(&report(9, 5000), &report(2, 100)));
    }

    #[test]
    fn written_headers_reuse_the_buffer_and_a_built_policy() {
        let mut buf = String::new();
        let r = report(57, 1430);
        let policy = policy(r.rule, &r.limits);
        assert_eq!(policy, "\"per-user\";q=200;w=2");
        let w = write(HeaderStyle::Both, Some(&r), Some(&policy), 25, &mut buf);
        let pairs = w.pairs(&buf);
        assert_eq!(
            w.headers(&pairs),
            [
                ("ratelimit-policy", "\"per-user\";q=200;w=2"),
                ("ratelimit", "\"per-user\";r=57;t=2"),
                ("x-ratelimit-limit", "200"),
                ("x-ratelimit-remaining", "57"),
                ("x-ratelimit-reset", "2"),
                (DELAY, "25"),
            ]
        );
        let w = write(HeaderStyle::None, Some(&r), None, 7, &mut buf);
        let pairs = w.pairs(&buf);
        assert_eq!(w.headers(&pairs), [(DELAY, "7")], "the buffer starts over");
        let w = write(HeaderStyle::Ietf, None, None, 0, &mut buf);
        assert!(w.is_empty());
    }
}
