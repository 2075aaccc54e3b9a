//! The yardsticks both simulators measure the engine against: what one perfect token bucket,
//! answering each request the moment it arrived, admits of the same requests; and the fullest
//! window of a length among the admissions (the most any window of that length holds starts at an
//! admission), to hold against the bound burst + rate × W.

/// What one perfect token bucket (full at the first arrival) admits of requests arriving at
/// `arrivals` (sorted, µs).
pub fn perfect(arrivals: &[u64], burst: u64, rate: u64) -> u64 {
    let (burst, rate) = (burst as f64, rate as f64);
    let (mut level, mut at, mut admitted) = (burst, arrivals.first().copied().unwrap_or(0), 0);
    for &t in arrivals {
        level = (level + (t - at) as f64 * rate / 1e6).min(burst);
        at = t;
        if level >= 1.0 {
            level -= 1.0;
            admitted += 1;
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
