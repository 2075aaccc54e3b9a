//! What the script tests share: the script itself, the batched form wrapped to report and clear
//! every key's expiry, and a deterministic generator for their random calls.

/// The script, as the filter embeds it.
pub const SCRIPT: &str = include_str!("../../lua/token_bucket.lua");

/// The script, verbatim, wrapped so that every key's PTTL is read at the end of the run and its
/// expiry then removed: the test clock is the explicit ARGV now, so real time must not expire a
/// key between two runs. Returns the script's integers, then one PTTL per KEYS[i].
pub fn with_expiries() -> String {
    format!(
        "local function tollgate_script()\n{SCRIPT}\nend\n\
         local r = tollgate_script()\n\
         if r.err then return r end\n\
         local ttls = {{}}\n\
         for i = 1, #KEYS do ttls[i] = redis.call('PTTL', KEYS[i]) end\n\
         for i = 1, #KEYS do redis.call('PERSIST', KEYS[i]); table.insert(r, ttls[i]) end\n\
         return r\n"
    )
}

/// xorshift64*: deterministic, no dependency.
pub struct Rng(pub u64);

impl Rng {
    // Not an iterator: it never ends, and its callers read one number at a time.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in 0..n (n >= 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}
