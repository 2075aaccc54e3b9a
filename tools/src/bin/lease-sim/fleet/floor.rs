//! A lower bound on the hot key's script calls that any lease-style scheme needs for a run's
//! demand and admissions (issue #35): how far the protocol is from what any scheme could do.
//!
//! It is a lower bound under these assumptions, not a measurement:
//! - a proxy admits a request only with a token that a call to the shared bucket granted it (a
//!   call may grant any number of tokens);
//! - the tokens held spendable across the fleet never pass the burst B (necessary for "never more
//!   than B + rate × W in any window" against any demand: held tokens could all be spent at once);
//!   we only use the weaker: their time-average over the run is at most B;
//! - each proxy's requests are a Poisson process of rate D_p = requests ÷ time in the fleet;
//! - a request may wait at most `wait_s` (the call's longest round trip plus the rules'
//!   `max_wait_ms`) for its token: the requests that arrive within `wait_s` of the one that made a
//!   call can share its grant without any token being held idle (expected D_p × wait_s of them).
//!
//! A call made at a request that grants 1 + K + h tokens (K the requests that arrived while it
//! could wait, h held for the next arrivals) holds the j-th held token j ÷ D_p in expectation
//! (memoryless arrivals): h (h + 1) ÷ (2 D_p) token-seconds. A call made between requests only
//! holds longer. Holding is convex in h, so for a proxy's calls and admissions equal grants hold
//! the least. With x_p = calls per admission and m_p = D_p × wait_s, h = 1/x − 1 − m and the
//! holding per admission is φ_p(x) = (1/x − (1 + 2m) + m (1 + m) x) ÷ (2 D_p), convex and
//! decreasing on x ≤ 1/(1 + m). The floor is min Σ a_p x_p subject to Σ a_p φ_p(x_p) ≤ B × T,
//! 1/a_p ≤ x_p (a proxy that admits makes a call) and x_p ≤ 1/(1 + m_p) (h ≥ 0). Lagrange:
//! x_p = 1 / sqrt(m_p (1 + m_p) + 2 D_p / λ), clamped, with λ set by bisection so the holding
//! equals B × T; if even one call per proxy holds no more than B × T, the floor is one call per
//! proxy that admitted. With wait_s = 0: grants g_p = max(1, sqrt(2 D_p / λ)).
//!
//! Expectations stand in for each run's draws, and grants are real numbers rather than whole
//! tokens (both only lower the floor, or move it by far less than the table shows).

/// One proxy's part of a key over a run.
#[derive(Debug, Clone, Copy)]
pub struct ProxyDemand {
    /// Requests of the key it received.
    pub requests: u64,
    /// Of those, admitted.
    pub admitted: u64,
    /// How long it was in the fleet during the run, in seconds.
    pub alive_s: f64,
}

/// The fewest calls any lease-style scheme makes for these admissions (see the module's
/// assumptions): `burst` the key's burst, `seconds` the run's length, `wait_s` how long a request
/// may wait for its token.
pub fn lease_floor(proxies: &[ProxyDemand], burst: f64, seconds: f64, wait_s: f64) -> f64 {
    // (admitted, D, m, x_lo, x_hi) of each proxy that admitted.
    let ps: Vec<(f64, f64, f64, f64, f64)> = proxies
        .iter()
        .filter(|p| p.admitted > 0 && p.requests > 0 && p.alive_s > 0.0)
        .map(|p| {
            let a = p.admitted as f64;
            let d = p.requests as f64 / p.alive_s;
            let m = d * wait_s.max(0.0);
            let lo = 1.0 / a;
            (a, d, m, lo, (1.0 / (1.0 + m)).max(lo))
        })
        .collect();
    let phi = |d: f64, m: f64, x: f64| {
        ((1.0 / x - (1.0 + 2.0 * m) + m * (1.0 + m) * x) / (2.0 * d)).max(0.0)
    };
    let x_at = |lambda: f64, d: f64, m: f64, lo: f64, hi: f64| {
        (1.0 / (m * (1.0 + m) + 2.0 * d / lambda).sqrt()).clamp(lo, hi)
    };
    let holding = |lambda: f64| -> f64 {
        ps.iter()
            .map(|&(a, d, m, lo, hi)| a * phi(d, m, x_at(lambda, d, m, lo, hi)))
            .sum()
    };
    let calls = |lambda: f64| -> f64 {
        ps.iter()
            .map(|&(a, d, m, lo, hi)| a * x_at(lambda, d, m, lo, hi))
            .sum()
    };
    let budget = burst.max(0.0) * seconds.max(0.0);
    // One call per proxy, each granting all it admits: within the budget, that is the floor.
    let one_each: f64 = ps.iter().map(|&(a, d, m, lo, _)| a * phi(d, m, lo)).sum();
    if one_each <= budget {
        return ps.len() as f64;
    }
    // Holding falls as λ grows (calls rise): bisect λ in log space to holding = budget.
    let (mut lo, mut hi) = (-60.0_f64, 60.0_f64);
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if holding(mid.exp()) > budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    calls(hi.exp())
}
