//! The yardsticks both simulators measure the engine against: what one perfect token bucket,
//! answering each request the moment it arrived (letting it wait for a token as long as its rule
//! holds requests), admits of the same requests; and the fullest
//! window of a length among the admissions (the most any window of that length holds starts at an
//! admission), to hold against the bound burst + rate × W.

/// What one perfect token bucket (full at the first arrival) admits of requests arriving at
/// `arrivals` (sorted, µs).
pub fn perfect(arrivals: &[u64], burst: u64, rate: u64) -> u64 {
    perfect_waiting(arrivals, burst, rate, 0, u64::MAX)
}

/// What one perfect token bucket (full at the first arrival) admits of requests arriving at
/// `arrivals` (sorted, µs) that may each wait up to `wait_ms` for a token, in arrival order (a
/// rule's `max_wait_ms`), and lets through by `end_us`: a request is admitted if its token
/// refills within its wait, and let through when it has, as the rule's own reservations are.
pub fn perfect_waiting(arrivals: &[u64], burst: u64, rate: u64, wait_ms: u64, end_us: u64) -> u64 {
    let (burst, rate) = (burst as f64, rate as f64);
    // The level may go into debt by what refills within the wait: those tokens are taken ahead.
    let reach = rate * wait_ms as f64 / 1000.0;
    let (mut level, mut at, mut admitted) = (burst, arrivals.first().copied().unwrap_or(0), 0);
    for &t in arrivals {
        level = (level + (t - at) as f64 * rate / 1e6).min(burst);
        at = t;
        if level + reach >= 1.0 {
            // Let through once the level is back to 1 (now, if it is there already).
            let release = t as f64 + (1.0 - level).max(0.0) / rate * 1e6;
            level -= 1.0;
            if release <= end_us as f64 {
                admitted += 1;
            }
        }
    }
    admitted
}

/// The fullest window of length `len_ms` among `admits` (sorted, µs): the index of the admission
/// the first such window starts at, and the admissions it holds; `None` when there are none.
pub fn fullest(admits: &[u64], len_ms: u64) -> Option<(usize, u64)> {
    let mut best: Option<(usize, u64)> = None;
    let mut end = 0;
    for (start, &t) in admits.iter().enumerate() {
        while end < admits.len() && admits[end] < t + len_ms * 1000 {
            end += 1;
        }
        let held = (end - start) as u64;
        if best.is_none_or(|(_, most)| held > most) {
            best = Some((start, held));
        }
    }
    best
}
