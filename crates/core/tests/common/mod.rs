//! What the window tests share: a seeded generator, so a failing sequence can be replayed, and
//! the window check of tests whose admissions take several tokens.

use tollgate_core::bucket::Limits;

/// A 64-bit linear congruential generator (Knuth's MMIX constants): the same seed gives the same
/// sequence on every machine.
pub struct Rng(pub u64);

impl Rng {
    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

/// The most any window that starts at an admission passes `burst + ceil(rate × W / period)`
/// (the step is 1 ms for every case here); `used`: (time in ms, tokens) in time order.
#[allow(dead_code)] // only the tests whose admissions take several tokens weigh them
pub fn excess(l: &Limits, used: &[(u64, u64)]) -> i64 {
    let mut worst = i64::MIN;
    for (i, &(from, _)) in used.iter().enumerate() {
        let mut sum = 0;
        for &(to, n) in &used[i..] {
            sum += n;
            let bound = l.burst + ((to - from) * l.rate).div_ceil(l.period_ms);
            worst = worst.max(sum as i64 - bound as i64);
        }
    }
    worst
}
