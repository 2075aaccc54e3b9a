//! Pure token-bucket math: the Rust model of `lua/token_bucket.lua`.
//!
//! Invariant: for the same sequence of (now, cost, lease_want) calls and the same limits, `take` returns
//! exactly what the Lua script returns (tests/model.rs checks this against real Redis).
//! All arithmetic is on integers (u64 limits, i64 units so a bucket can go into debt), so there is
//! no drift over millions of calls. The script's batched form is `take_batch` (bucket/batch.rs):
//! this `take` once per group, in order.

mod batch;
pub use batch::{batch_integers, take_batch, BadBatch, Group, GroupError, Stored, MAX_BATCH_KEYS};

/// A bucket's configured limits: `rate` tokens are added every `period_ms`, up to `burst` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Limits {
    pub burst: u64,
    pub rate: u64,
    pub period_ms: u64,
}

/// Largest capacity of a bucket in units (`burst` × units per token) the script accepts: 2^50, so
/// every value the script computes stays an exact integer in a Lua number (a double, exact below
/// 2^53).
pub const MAX_FULL_UNITS: u64 = 1 << 50;

/// The refill steps the script may take, finest first: a bucket refills by whole steps of the
/// finest one that divides `period_ms` and keeps `burst × period_ms / step` within
/// [`MAX_FULL_UNITS`].
pub const STEPS_MS: [u64; 3] = [1, 1000, 60_000];

/// The longest time the script reports (and the longest key expiry it sets): 2^53 ms, about
/// 285,000 years. Longer times saturate here; a key that would be full only later is kept without
/// an expiry.
pub const MAX_REPLY_MS: u64 = MAX_EXACT;

/// Largest `rate` the script accepts.
pub const MAX_RATE: u64 = 1_000_000_000;

/// Integers up to 2^53 are exact in a Lua number.
const MAX_EXACT: u64 = 1 << 53;

/// A stretch whose marks pass this starts again (the script's MAX_TAKEN): sums stay exact.
const MAX_TAKEN: u64 = 1 << 51;

/// Longest `max_wait_ms` the script accepts (so the deepest debt stays below 2^53).
pub const MAX_WAIT_MS: u64 = 3_600_000;

/// A settlement is at most this many bursts, and a charge takes the bucket at most this many
/// bursts into debt (4 × 2^50 units plus the deepest reservation stay below 2^53).
pub const MAX_SETTLE_BURSTS: u64 = 4;

/// A bucket's stored state (the Redis hash `u`, `t`, `p`). No state at all means a full bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Units held; one token is `per_token` units. Negative while reservations are outstanding
    /// (the bucket is in debt).
    pub units: i64,
    /// Microsecond timestamp of the last refill point (advanced by whole steps only).
    pub ts_us: u64,
    /// The units per token `units` are scaled by ([`Limits::units_per_token`] of the limits that
    /// wrote it: `per_token` when the step is 1 ms).
    pub per_token: u64,
    /// The spill epoch, on a bucket that tracks it (the hash's `E`, `D`; its `T` is `ts_us`).
    pub spill: Option<Spill>,
}

/// A tracking bucket's current stretch (the script's header, "The spill epoch"): a refund of a
/// take in it gives back at most `headroom` + the take's mark, in units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spill {
    /// When the stretch began (µs): a refill reached the cap, the bucket was created, or what
    /// came before is unknown.
    pub epoch: u64,
    /// Full less the most V + taken - R has been since `epoch`, less R (V: units held, with what
    /// holders hold; R: units refunds gave back since). Negative when refunds used it up.
    pub headroom: i64,
    /// Units taken since `epoch` (a take's mark is this after it).
    pub taken: u64,
    /// Until when (µs) a reservation may still be waiting for its tokens: no refund comes back
    /// before (the hash's `W`). A refund into a bucket whose debt is promised to held requests
    /// would let a later take be released with one of them.
    pub reserved_until_us: u64,
}

/// What a take in the tracked form is answered with, and its refund carries back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp {
    /// The bucket's spill epoch after the call.
    pub epoch: u64,
    /// Units taken in the stretch, this call's take included.
    pub mark: u64,
}

/// What a call that may be refunded sends in the tracked form of its settlement (the script's
/// `<charge>:<refund>:<epoch>:<mark>`): the bucket tracks its spill epoch, and the reply carries
/// it with the take's mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tracked {
    /// Tokens to give back, as far as the bucket's headroom allows (0: none).
    pub refund: u64,
    /// The stamp the refund's take was answered with.
    pub epoch: u64,
    pub mark: u64,
}

/// The script's reply: `{allowed, remaining, retry_after_ms, reset_after_ms, granted}`, and with a
/// penalty a 6th, `penalized`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub allowed: bool,
    /// Whole tokens left after this call.
    pub remaining: u64,
    /// Allowed: 0, or how long to hold the request for a reservation, or, negative, a racer's paced
    /// grant (`RACE_SHARE`): minus the ms until the holder's next turn. Denied: ms until `cost`
    /// could be reserved within `max_wait_ms` (until it is held, when that is 0). -1 when
    /// `cost > burst` (never admissible).
    pub retry_after_ms: i64,
    /// Milliseconds until the bucket is full again (0 when full).
    pub reset_after_ms: u64,
    /// Tokens taken: at least `cost` when allowed, 0 when denied.
    pub granted: u64,
    /// Whether the denial is the penalty box's (the script's 6th field, sent only for a call
    /// with a penalty; `No` otherwise).
    pub penalized: Penalized,
    /// The bucket's spill epoch after this call and the take's mark (the 7th and 8th fields),
    /// for a call in the tracked form only: what a refund of its take carries.
    pub epoch: Option<Stamp>,
}

/// The script's 6th reply field: how the penalty box took part in a denial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Penalized {
    /// Not the box's denial (or the call had no penalty).
    #[default]
    No,
    /// This denial was an offence and boxed the key: `retry_after_ms` is at least its duration.
    Offence,
    /// Denied because the key was already boxed: `retry_after_ms` is the box's time left.
    Boxed,
}

impl Penalized {
    /// The script's integer for it.
    pub fn code(self) -> i64 {
        match self {
            Penalized::No => 0,
            Penalized::Offence => 1,
            Penalized::Boxed => 2,
        }
    }

    /// The value of the script's integer, or None outside 0..=2.
    pub fn from_code(code: i64) -> Option<Penalized> {
        match code {
            0 => Some(Penalized::No),
            1 => Some(Penalized::Offence),
            2 => Some(Penalized::Boxed),
            _ => None,
        }
    }
}

/// Most durations a penalty has, and the most offences the script counts.
pub const MAX_PENALTY_STEPS: usize = 8;

/// Longest penalty duration the script accepts (a day).
pub const MAX_PENALTY_MS: u64 = 86_400_000;

/// Longest offence window the script accepts (a week): an offending key is remembered that long.
pub const MAX_PENALTY_WINDOW_MS: u64 = 604_800_000;

/// A penalty box (the script's ARGV[9], `<window_ms>:<ms1>[:<ms2>...]`): the n-th offence within
/// `window_ms` of the previous one boxes the key for the n-th duration, the last one repeating.
/// Only valid penalties can be built: 1 to [`MAX_PENALTY_STEPS`] non-decreasing durations of 1 ms
/// to [`MAX_PENALTY_MS`], a window of 1 ms to [`MAX_PENALTY_WINDOW_MS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Penalty {
    window_ms: u64,
    ms: [u64; MAX_PENALTY_STEPS],
    len: usize,
}

impl Penalty {
    /// A penalty with these durations and window, or None outside the script's bounds.
    pub fn new(window_ms: u64, durations_ms: &[u64]) -> Option<Penalty> {
        let len = durations_ms.len();
        let ok = (1..=MAX_PENALTY_STEPS).contains(&len)
            && (1..=MAX_PENALTY_WINDOW_MS).contains(&window_ms)
            && durations_ms
                .iter()
                .all(|ms| (1..=MAX_PENALTY_MS).contains(ms))
            && durations_ms.windows(2).all(|w| w.first() <= w.get(1));
        if !ok {
            return None;
        }
        let mut ms = [0; MAX_PENALTY_STEPS];
        for (slot, d) in ms.iter_mut().zip(durations_ms) {
            *slot = *d;
        }
        Some(Penalty { window_ms, ms, len })
    }

    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// The durations, in ms, for the 1st, 2nd, ... offence.
    pub fn durations_ms(&self) -> &[u64] {
        self.ms.get(..self.len).unwrap_or_default()
    }

    /// The duration of the `n`-th offence (n >= 1; the last one repeats).
    pub fn duration_ms(&self, n: u64) -> u64 {
        let i = usize::try_from(n.max(1) - 1).unwrap_or(usize::MAX);
        let last = self.durations_ms().last().copied().unwrap_or(1);
        self.durations_ms().get(i).copied().unwrap_or(last)
    }

    /// Appends the script's ARGV[9] for it (digits and colons only).
    pub fn push_argument(&self, out: &mut Vec<u8>) {
        crate::decimal::push_bytes(out, self.window_ms);
        for &ms in self.durations_ms() {
            out.push(b':');
            crate::decimal::push_bytes(out, ms);
        }
    }
}

/// A key's offences (the script's `x`, `c`, `w`), kept beside its bucket while it is boxed or its
/// last offence is within the window. All zero: none on record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offences {
    /// Microsecond time the box ends (the key is boxed while now is before it).
    pub boxed_until_us: u64,
    /// Offences within the window, at most [`MAX_PENALTY_STEPS`].
    pub count: u64,
    /// Microsecond time of the last offence.
    pub last_us: u64,
}

impl Offences {
    /// How long the key must still be kept for them, in ms rounded up (0: they can go).
    pub fn keep_ms(&self, penalty: &Penalty, now_us: u64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let window_end = self
            .last_us
            .saturating_add(penalty.window_ms.saturating_mul(1000));
        self.boxed_until_us
            .saturating_sub(now_us)
            .div_ceil(1000)
            .max(window_end.saturating_sub(now_us).div_ceil(1000))
    }
}

impl Reply {
    /// What `take` answers for limits the script would reject with an error: never admissible.
    const REJECT: Reply = Reply {
        allowed: false,
        remaining: 0,
        retry_after_ms: -1,
        reset_after_ms: 0,
        granted: 0,
        penalized: Penalized::No,
        epoch: None,
    };
}

impl Limits {
    /// Whether the script accepts these limits (it answers an error reply otherwise).
    pub fn is_valid(&self) -> bool {
        self.burst >= 1 && self.rate >= 1 && self.rate <= MAX_RATE && self.step_ms().is_some()
    }

    /// The refill step the script takes for these limits: the first of [`STEPS_MS`] that divides
    /// `period_ms` with `burst × period_ms / step` at most [`MAX_FULL_UNITS`]; None if there is
    /// none (or `period_ms` is 0).
    pub fn step_ms(&self) -> Option<u64> {
        STEPS_MS.into_iter().find(|&step| {
            self.period_ms >= 1
                && self.period_ms.is_multiple_of(step)
                && self.burst <= MAX_FULL_UNITS / (self.period_ms / step)
        })
    }

    /// Units per token: `period_ms / step_ms` (the bucket gains `rate` units per step).
    pub fn units_per_token(&self) -> Option<u64> {
        self.step_ms().map(|step| self.period_ms / step)
    }
}

/// A proxy holding leased tokens of a bucket (the script's `h<id>` and `e<id>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holding {
    pub holder: u64,
    /// Tokens it may still hold (an upper bound: its reports only lower it).
    pub held: u64,
    /// Microsecond time by which it has dropped them.
    pub expires_us: u64,
    /// The latest `seq` of its calls that ran.
    pub seq: u64,
    /// The demand its latest call reported ([`Holder::demand`]; 0: none): what its share is
    /// weighed by.
    pub demand: u64,
}

/// The holders of one bucket, by holder id (what the script keeps beside `u`, `t`, `p`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders(pub Vec<Holding>);

impl Holders {
    /// Tokens every holder on record may still hold.
    pub fn held(&self) -> u64 {
        self.0.iter().map(|h| h.held).fold(0, u64::saturating_add)
    }

    /// The demand every holder on record reported, together (the script's `s`).
    pub fn demand(&self) -> u64 {
        self.0.iter().map(|h| h.demand).fold(0, u64::saturating_add)
    }

    /// When the last holder on record has dropped its tokens (0: none).
    pub fn last_expiry_us(&self) -> u64 {
        self.0.iter().map(|h| h.expires_us).max().unwrap_or(0)
    }

    fn expire(&mut self, now_us: u64) {
        self.0.retain(|h| h.expires_us > now_us);
    }

    fn get(&self, holder: u64) -> Option<Holding> {
        self.0.iter().find(|h| h.holder == holder).copied()
    }

    fn put(&mut self, holding: Holding) {
        match self.0.iter_mut().find(|h| h.holder == holding.holder) {
            Some(h) => *h = holding,
            None => {
                self.0.push(holding);
                self.0.sort();
            }
        }
    }
}

/// Most steps a holder's report carries.
pub const MAX_STEPS: usize = 8;

/// A lease call's holder (the script's `want:holder:seq:hold_ms[:back]:held:quiet_ms...[/demand]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The proxy's id (>= 1, random per proxy).
    pub id: u64,
    /// Grows with each lease call the proxy sends for the key (>= 1): a call that runs after a
    /// later one reports nothing.
    pub seq: u64,
    /// How long it may hold what it is granted, after any reservation in it refilled.
    pub hold_ms: u64,
    /// Tokens it was granted and dropped unspent (its lease expired) since its last call: the
    /// script puts them back in the bucket, as far as its record still counts them as held
    /// (`back` in the script; 0: none, and the argument leaves it out).
    pub back: u64,
    /// Its recent demand for the key, in thousandths of a token per second (at most
    /// [`MAX_DEMAND`]), or None: unknown (the argument leaves it out, and the holder's share is
    /// the equal one). See [`share`].
    pub demand: Option<u64>,
    steps: [(u64, u64); MAX_STEPS],
    len: usize,
}

impl Holder {
    /// A holder reporting `steps`: (held at most, for the last ms), oldest first; the last is
    /// what it holds now. Only the last [`MAX_STEPS`] are kept (the others add nothing after
    /// them, as far as soundness goes).
    pub fn new(id: u64, seq: u64, hold_ms: u64, steps: &[(u64, u64)]) -> Holder {
        let kept = steps
            .get(steps.len().saturating_sub(MAX_STEPS)..)
            .unwrap_or_default();
        let mut out = [(0, 0); MAX_STEPS];
        for (slot, step) in out.iter_mut().zip(kept) {
            *slot = *step;
        }
        Holder {
            id,
            seq,
            hold_ms,
            back: 0,
            demand: None,
            steps: out,
            len: kept.len(),
        }
    }

    /// The same holder, giving back `back` tokens it dropped unspent.
    pub fn giving_back(self, back: u64) -> Holder {
        Holder { back, ..self }
    }

    /// The same holder, reporting its recent demand (thousandths of a token per second).
    pub fn demanding(self, demand: u64) -> Holder {
        Holder {
            demand: Some(demand),
            ..self
        }
    }

    /// The steps of its report, oldest first.
    pub fn steps(&self) -> &[(u64, u64)] {
        self.steps.get(..self.len).unwrap_or_default()
    }
}

/// Longest `hold_ms` the script accepts (a day).
pub const MAX_HOLD_MS: u64 = 86_400_000;

/// A holder whose share (burst ÷ holders on record) is below this many tokens, and below the
/// burst (it is not the only holder), reserves nothing: it takes what the bucket holds now, and
/// when that is too little it is denied until the bucket has refilled a token for every holder
/// on record (its turn). With so many holders a reservation would bring a few tokens per call at
/// most, and would tie them to a proxy before it has requests for them (a quiet proxy drops most
/// of them unspent). A racer's share is its part by demand even on a key short of tokens (at most
/// what the other holders leave of the burst), and its grant there (the bucket under half of what
/// it can hold) is paced: the reply's `retry_after_ms` is minus its next turn, the refill time of
/// `granted` × ⌊total demand ÷ its own⌋ tokens (× the holders on record without a demand).
pub const RACE_SHARE: u64 = 5;

/// The largest demand a holder may report, in thousandths of a token per second (2^32: over four
/// million tokens a second). With it, the demands of up to 2^21 holders add up exactly.
pub const MAX_DEMAND: u64 = 1 << 32;

/// `burst` divided by the `holders` on record, at least `cost`: every holder's share when the key
/// is short of tokens, and what decides whether a holder races (`RACE_SHARE`).
pub fn equal_share(burst: u64, cost: u64, holders: u64) -> u64 {
    cost.max(burst / holders.max(1))
}

/// A holder's share of a key's burst: the most it may hold at once. The equal share, `burst`
/// divided by the holders on record (at least `cost`); or, when the key is not short of tokens
/// (`plenty`: the bucket holds at least half of what it can hold) and the holder reported a
/// demand and that is more, its part of the burst by demand, `burst × demand ÷ total` (the total
/// over every holder on record, this one's latest report included), at most `burst` and at most
/// `room`: what it may hold with every other holder's tokens still at most half the burst
/// (`burst ÷ 2` − what the others hold). So a busy holder among many quiet ones holds what it
/// spends in a lease's life instead of a sliver, a quiet one still gets the equal share, and a
/// key short of tokens is shared equally as before (a busy holder's large shares would take
/// every token as it refills from quiet holders waiting their turn); and parts by demand never
/// take the bucket's room to refill below half the burst (tokens sitting in leases would make
/// the refill overflow, and with a long `lease_horizon_ms` a fleet at its limit admitted less).
/// The shares are only a cap on what each asks: what holders hold together never passes `burst`
/// whatever they are (the script grants at most `burst` − what all hold), so the demands decide
/// who holds the burst, never how much of it is out.
///
/// The script computes `burst × demand` in a double: exact below 2^53. At 2^53 or more (a burst
/// over 2^21 tokens) the part is `burst ÷ ⌊total ÷ demand⌋` instead, a little more than exact.
pub fn share(
    burst: u64,
    cost: u64,
    holders: u64,
    (demand, total): (u64, u64),
    (plenty, room): (bool, u64),
) -> u64 {
    let equal = equal_share(burst, cost, holders);
    if !plenty || demand == 0 || total == 0 {
        return equal;
    }
    let part = match burst.checked_mul(demand).filter(|&p| p < MAX_EXACT) {
        Some(p) => p / total,
        None => burst / (total / demand).max(1),
    };
    equal.max(part.min(burst).min(room))
}

/// The deepest debt a period change keeps, in units (2^52: more than 75 minutes of refill at
/// [`MAX_RATE`]); every value stays exact.
const DEBT_FLOOR: i64 = -(1 << 52);

/// What one script call asks of the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ask {
    /// Tokens needed now (0 only settles).
    pub cost: u64,
    /// Tokens the caller would take at once.
    pub lease_want: u64,
    /// The proxy that holds what it is granted (lease mode); None: spent at once.
    pub holder: Option<Holder>,
    pub max_wait_ms: u64,
    /// Tokens to charge (> 0) first; a refund without an epoch (< 0) gives back nothing. In the
    /// tracked form (`track`), the charge (>= 0).
    pub settle: i64,
    /// The tracked form of the settlement: a refund with its epoch, and the epoch in the reply.
    pub track: Option<Tracked>,
}

/// One atomic step of the bucket, exactly as `lua/token_bucket.lua` does it, for a caller that holds
/// nothing: see [`take_held`].
pub fn take(
    state: Option<State>,
    limits: &Limits,
    cost: u64,
    lease_want: u64,
    max_wait_ms: u64,
    settle: i64,
    now_us: u64,
) -> (Option<State>, Reply) {
    let ask = Ask {
        cost,
        lease_want,
        holder: None,
        max_wait_ms,
        settle,
        track: None,
    };
    take_held(state, &mut Holders::default(), limits, &ask, now_us)
}

/// One atomic step of the bucket, exactly as `lua/token_bucket.lua` does it: drop expired holders,
/// refill up to `now_us` (never past burst less what holders hold), apply the holder's report,
/// settle `settle` tokens (a charge only lowers, a refund only raises), then take `cost` tokens
/// (and up to `max(cost, lease_want)` when they are there, a holder no more than its share), or
/// reserve them if they will be there within `max_wait_ms`. A `cost` of 0 only settles.
///
/// Returns the new stored state (None = key deleted because the bucket is full and nobody holds
/// anything; `holders` is updated in place) and the script's reply. Arguments the script would
/// reject with an error (invalid limits, `max_wait_ms` above [`MAX_WAIT_MS`], a settlement beyond
/// [`MAX_SETTLE_BURSTS`] bursts, a holder id of 0 or `hold_ms` above [`MAX_HOLD_MS`]) change
/// nothing and answer "never admissible" (`retry_after_ms == -1`).
pub fn take_held(
    state: Option<State>,
    holders: &mut Holders,
    limits: &Limits,
    ask: &Ask,
    now_us: u64,
) -> (Option<State>, Reply) {
    let mut offences = Offences::default();
    take_penalized(state, holders, &mut offences, limits, ask, None, now_us)
}

/// [`take_held`] with a penalty box (the script's ARGV[9]): while `offences` says the key is
/// boxed, a call with `0 < cost <= burst` is denied until the box ends (nothing taken, no new
/// offence; settlement still applies first); otherwise a denial by the bucket is an offence that
/// boxes the key for the penalty's next duration. `offences` is updated in place, and emptied when
/// the key is deleted or nothing about them needs remembering. Without a penalty, `offences` is
/// left as it is while the key stays (the script leaves `x`, `c`, `w` alone) and the reply's
/// `penalized` is `No`.
pub fn take_penalized(
    state: Option<State>,
    holders: &mut Holders,
    offences: &mut Offences,
    limits: &Limits,
    ask: &Ask,
    penalty: Option<&Penalty>,
    now_us: u64,
) -> (Option<State>, Reply) {
    let Ask {
        cost,
        lease_want,
        holder,
        max_wait_ms,
        settle,
        track,
    } = *ask;
    let most = limits.burst.saturating_mul(MAX_SETTLE_BURSTS);
    let settle_ok = settle.unsigned_abs() <= most
        && track.is_none_or(|t| {
            settle >= 0 && t.refund <= most && t.epoch <= MAX_EXACT && t.mark <= MAX_EXACT
        });
    let holder_ok = holder.is_none_or(|h| {
        h.id >= 1
            && h.seq >= 1
            && h.hold_ms <= MAX_HOLD_MS
            && !h.steps().is_empty()
            && h.steps().iter().all(|&(_, quiet)| quiet <= MAX_HOLD_MS)
            && h.demand.is_none_or(|d| d <= MAX_DEMAND)
    });
    if !limits.is_valid() || max_wait_ms > MAX_WAIT_MS || !settle_ok || !holder_ok {
        return (state, Reply::REJECT);
    }
    // Every value below stays under 2^53 (valid limits, cost <= burst where it matters), so i64
    // holds it exactly.
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let step_ms = limits.step_ms().unwrap_or(1);
    let step_us = step_ms.saturating_mul(1000);
    let (burst, rate) = (int(limits.burst), int(limits.rate));
    let per_token = int(limits.period_ms / step_ms);
    let full = burst.saturating_mul(per_token);

    // 1. Load (absent = full, no holders), rescale to these units per token; drop expired holders
    // and clamp to what the bucket can hold.
    // The spill epoch, on a bucket that tracks it: (headroom, taken), and whether a stretch
    // began in this call (no refund comes back in it). A stretch begins where V is known.
    let tracked = track.is_some() || state.is_some_and(|s| s.spill.is_some());
    let stored_epoch = state.filter(|s| s.per_token >= 1).and_then(|s| s.spill);
    let mut reserved_until = stored_epoch.map_or(0, |sp| sp.reserved_until_us);
    let (mut headroom, mut taken, mut renew) = match (stored_epoch, state) {
        (Some(sp), Some(s)) if int(s.per_token) == per_token && sp.taken <= MAX_TAKEN => {
            (sp.headroom, sp.taken, false)
        }
        // Another unit per token, or marks too large to stay exact: what came before is unknown.
        _ => (0, 0, tracked),
    };
    let (mut units, mut ts_us) = match state {
        Some(s) if s.per_token >= 1 => {
            let p = int(s.per_token);
            let units = if p == per_token {
                s.units
            } else if s.units < 0 {
                // Debt: rescale by whole tokens, rounding the debt up, never down (2^52 units
                // deep at most, so it stays exact).
                let debt = ceil_div_i(s.units.saturating_neg(), p);
                let deepest = -DEBT_FLOOR / per_token;
                -debt.min(deepest).saturating_mul(per_token)
            } else if s.units <= int(MAX_EXACT) / per_token {
                s.units.saturating_mul(per_token).div_euclid(p)
            } else {
                // As the script: the product could pass 2^53, so drop the partial token (rounds down).
                s.units.div_euclid(p).saturating_mul(per_token)
            };
            (units, s.ts_us)
        }
        _ => {
            holders.0.clear();
            // A missing key is a full bucket: a new stretch, as a spill starts one.
            renew = tracked;
            (full, now_us)
        }
    };
    let mut out = int(holders.held());
    // Full less V + taken: what the headroom never passes.
    let room = |units: i64, out: i64, taken: u64| {
        full.saturating_sub(units)
            .saturating_sub(out.saturating_mul(per_token))
            .saturating_sub(int(taken))
    };
    if tracked {
        if renew {
            (taken, headroom) = (0, room(units, out, 0));
        } else {
            headroom = headroom.min(room(units, out, taken));
        }
    }
    let capacity = |out: i64| full.saturating_sub(out.saturating_mul(per_token)).max(0);
    units = units.min(capacity(out));
    // 2. Refill by whole steps (ts_us keeps the remainder), never past what the bucket can hold.
    // The holder's report only lowers what it holds, each step from its quiet_ms ago on.
    // True when the refill reached the cap (what came past it spilled).
    let refill = |units: &mut i64, ts_us: &mut u64, to_us: u64, out: i64| {
        let elapsed = int(to_us.saturating_sub(*ts_us) / step_us);
        if elapsed > 0 {
            let to_full = ceil_div_i(capacity(out).saturating_sub(*units), rate);
            if elapsed >= to_full {
                *units = capacity(out);
                *ts_us = to_us;
                return true;
            }
            // elapsed < to_full, so neither can overflow.
            *units = units.saturating_add(elapsed.saturating_mul(rate));
            *ts_us =
                ts_us.saturating_add(u64::try_from(elapsed).unwrap_or(0).saturating_mul(step_us));
        }
        false
    };
    if now_us < ts_us {
        ts_us = now_us; // the clock went back: no refill
    }
    // Expired holders dropped their tokens by their expiry, not before: refill up to each
    // expiry in turn with its tokens counted until then.
    let mut gone: Vec<Holding> = holders
        .0
        .iter()
        .filter(|h| h.expires_us <= now_us)
        .copied()
        .collect();
    gone.sort_by_key(|h| h.expires_us);
    for h in gone {
        if h.expires_us > ts_us {
            let c = refill(&mut units, &mut ts_us, h.expires_us, out);
            if tracked && c {
                (renew, taken, headroom) = (true, 0, room(units, out, 0));
            } else if tracked {
                headroom = headroom.min(room(units, out, taken));
            }
        }
        out -= int(h.held);
    }
    holders.expire(now_us);
    let mut record = holder.map(|h| {
        holders.get(h.id).unwrap_or(Holding {
            holder: h.id,
            held: 0,
            expires_us: 0,
            seq: 0,
            demand: 0,
        })
    });
    // A call that runs after a later one of the same holder reports nothing: its report is
    // stale (it may not count a grant the proxy has since deposited).
    let fresh = matches!((holder, record), (Some(h), Some(r)) if h.seq > r.seq);
    // What the holder gives back: tokens its record still counts as held (before this report),
    // so putting them back in the bucket moves them from what holders hold to the bucket and
    // never adds to the two together.
    let mut back = 0;
    if let (Some(rec), Some(h), true) = (record.as_mut(), holder, fresh) {
        back = int(h.back.min(rec.held));
        // Its latest report of its demand weighs its share (none: it weighs nothing).
        rec.demand = h.demand.unwrap_or(0);
        for &(held, quiet_ms) in h.steps() {
            let from = now_us.saturating_sub(quiet_ms.saturating_mul(1000));
            if from > ts_us {
                let c = refill(&mut units, &mut ts_us, from, out);
                if tracked && c {
                    (renew, taken, headroom) = (true, 0, room(units, out, 0));
                } else if tracked {
                    headroom = headroom.min(room(units, out, taken));
                }
            }
            if held < rec.held {
                out -= int(rec.held - held);
                rec.held = held;
            }
        }
    }
    if refill(&mut units, &mut ts_us, now_us, out) && tracked {
        // A spill: the new stretch begins here.
        (renew, taken, headroom) = (true, 0, room(units, out, 0));
    }
    if back > 0 {
        units = units.max(
            units
                .saturating_add(back.saturating_mul(per_token))
                .min(capacity(out)),
        );
    }
    if tracked {
        // The most V + taken - R has been since the stretch began: never below what it is now.
        headroom = headroom.min(room(units, out, taken));
    }
    // Refilled to now: less than a step has passed since ts_us, and the refill comes at whole
    // steps after it.
    let clock = Clock::new(limits, ts_us, now_us);
    let holder_count = i64::try_from(holders.0.len()).unwrap_or(i64::MAX)
        + i64::from(record.is_some_and(|r| r.expires_us == 0));
    // The demand holders reported, this holder's latest report in place of its earlier one.
    let total_demand = record.map_or(0, |rec| {
        let others = holders.0.iter().filter(|h| h.holder != rec.holder);
        others
            .map(|h| h.demand)
            .fold(rec.demand, u64::saturating_add)
    });

    // A stretch that began on a bucket in debt (what came before is unknown): reservations may
    // be waiting until the refill has repaid it.
    if tracked && renew && units < 0 {
        let wait_us = u64::try_from(clock.wait_ms(-units))
            .unwrap_or(0)
            .saturating_mul(1000);
        reserved_until = reserved_until.max(now_us.saturating_add(wait_us).min(MAX_EXACT));
    }

    // 2c. Settle: a charge only lowers (at most MAX_SETTLE_BURSTS bursts into debt), a refund
    // only raises (never past what the bucket can hold).
    // A refund without an epoch (settle < 0) gives back nothing.
    let floor = -full.saturating_mul(int(MAX_SETTLE_BURSTS));
    let delta = settle.saturating_mul(per_token);
    if settle > 0 {
        units = units.saturating_sub(delta).max(units.min(floor));
    }
    // A refund gives back at most the headroom + its take's mark (units: part of a token too),
    // if no stretch began since its take; a mark is never past what was taken.
    if let (Some(t), false, Some(sp)) = (track, renew, stored_epoch) {
        if t.refund > 0 && t.epoch == sp.epoch && now_us >= reserved_until {
            let bound = headroom.saturating_add(int(t.mark.min(taken)));
            let x = int(t.refund).saturating_mul(per_token).min(bound);
            if x > 0 {
                units += x;
                headroom -= x;
            }
        }
    }

    // 2d. The penalty box: what is on record, if the call has a penalty (a count past the
    // script's bound is unreadable: nothing on record; without a penalty it is not read).
    let unreadable = penalty.is_some() && offences.count > MAX_PENALTY_STEPS as u64;
    if state.is_none() || unreadable {
        *offences = Offences::default();
    }
    let boxed = penalty.is_some() && offences.boxed_until_us > now_us;

    // 3. Decide. cost * per_token is only computed once cost <= burst (so it is <= full).
    // racing: a holder whose equal share is under RACE_SHARE tokens (and who is not alone);
    // paced: a racer's call on a key short of tokens (a grant tells it its next turn).
    let (mut racing, mut paced) = (false, false);
    let (allowed, granted, mut retry_after_ms) = if cost == 0 {
        (true, 0, 0)
    } else if int(cost) > burst {
        (false, 0, -1)
    } else if boxed {
        // Boxed: denied until the box ends, nothing taken, no new offence.
        let left = offences
            .boxed_until_us
            .saturating_sub(now_us)
            .div_ceil(1000);
        (false, 0, int(left))
    } else {
        let cost = int(cost);
        let mut want = cost.max(int(lease_want)).min(burst);
        let mut share = burst;
        if let Some(rec) = record {
            let n = u64::try_from(holder_count).unwrap_or(1);
            let c = u64::try_from(cost).unwrap_or(0);
            let equal = int(equal_share(limits.burst, c, n));
            // The bucket holds at least half of what it can hold.
            let plenty = units.saturating_mul(2) >= capacity(out);
            // A holder among so many that an equal share is small (RACE_SHARE) gets its part by
            // demand even on a key short of tokens: its grants are paced instead (`pace`).
            racing = equal < int(RACE_SHARE).min(burst);
            paced = racing && !plenty;
            // What it may hold with the others' tokens at most half the burst.
            let others = out - int(rec.held);
            // A racer's room is what the others leave of the burst: their tokens are few each,
            // spent or not (a record drops only at the holder's next call), and half the burst
            // would leave a busy racer no part at all.
            let half = if racing { burst } else { burst / 2 };
            let room = u64::try_from(half - others).unwrap_or(0);
            let demand = (rec.demand, total_demand);
            share = int(self::share(
                limits.burst,
                c,
                n,
                demand,
                (plenty || racing, room),
            ));
            want = want.min(share - share.min(int(rec.held))).min(burst - out);
        }
        let need = cost.saturating_mul(per_token);
        if want < cost {
            (false, 0, clock.wait_ms(share.saturating_mul(per_token)))
        } else if units >= want.saturating_mul(per_token) || (record.is_none() && units >= need) {
            let granted = want.min(units / per_token);
            units -= granted.saturating_mul(per_token);
            (true, granted, 0)
        } else {
            // A holder among so many that an equal share is small reserves nothing
            // (RACE_SHARE), whatever its demand.
            // A take without a record reserves nothing while holders hold tokens: its release
            // time would be fixed by the refill, and a holder may spend what it holds at that
            // very moment (burst 2: H leases both tokens, X reserves the tokens of 2 s, and at
            // 2 s X goes through as H spends its two).
            let beside_held = record.is_none() && out > 0;
            let reach_ms = if racing || beside_held {
                0
            } else {
                int(max_wait_ms)
            };
            let take = if record.is_some() {
                let reach = units.saturating_add(clock.refill_within(reach_ms)) / per_token;
                cost.max(want.min(reach))
            } else {
                cost
            };
            let wait_ms = clock.wait_ms(take.saturating_mul(per_token).saturating_sub(units));
            if wait_ms <= reach_ms {
                units -= take.saturating_mul(per_token);
                (true, take, wait_ms)
            } else if racing {
                // Its turn: when the bucket has refilled a token for every holder on record.
                let turn = clock.wait_ms(holder_count.saturating_mul(per_token));
                (false, 0, wait_ms.max(turn))
            } else {
                (false, 0, wait_ms - reach_ms)
            }
        }
    };

    // 3d. A racer's grant on a key short of tokens, with nothing reserved, tells the holder its
    // next turn (as -ms): the refill of its tokens times the total demand over its own (times
    // the holders on record, without a demand), so each racer calls at the pace of its part of
    // the rate by demand rather than for every token as it refills.
    if paced && allowed && granted > 0 && retry_after_ms == 0 {
        let per = match record {
            Some(rec) if rec.demand > 0 && total_demand > 0 => {
                int((total_demand / rec.demand).max(1))
            }
            _ => holder_count.max(1),
        };
        let tokens = granted.saturating_mul(per).min(int(MAX_EXACT) / per_token);
        retry_after_ms = -clock.wait_ms(tokens * per_token).max(1);
    }

    // 3c. A denial by the bucket is an offence: the n-th within the window of the previous one
    // boxes the key for the n-th duration.
    let mut penalized = if boxed && cost >= 1 && int(cost) <= burst {
        Penalized::Boxed
    } else {
        Penalized::No
    };
    if let (Some(p), false, Penalized::No, true) =
        (penalty, allowed, penalized, retry_after_ms >= 0)
    {
        let within = now_us <= offences.last_us.saturating_add(p.window_ms * 1000);
        offences.count = if offences.count > 0 && within {
            (offences.count + 1).min(MAX_PENALTY_STEPS as u64)
        } else {
            1
        };
        let d = p.duration_ms(offences.count);
        offences.boxed_until_us = now_us.saturating_add(d * 1000);
        offences.last_us = now_us;
        retry_after_ms = retry_after_ms.max(int(d));
        penalized = Penalized::Offence;
    }

    // A reservation's tokens are promised to its request at its release: no refund comes back
    // before the last one is released.
    if tracked && allowed && retry_after_ms > 0 {
        let wait_us = u64::try_from(retry_after_ms)
            .unwrap_or(0)
            .saturating_mul(1000);
        let until = now_us.saturating_add(wait_us);
        reserved_until = reserved_until.max(until.min(MAX_EXACT));
    }

    // A take marks the units taken in the stretch (a holder's grant moves tokens from the bucket
    // to what holders hold: V, as the bound counts it, stays the same).
    if tracked && record.is_none() {
        taken = taken.saturating_add(u64::try_from(granted.saturating_mul(per_token)).unwrap_or(0));
    }

    // 3b. The holder's record: what it holds now, until its grant's reservation has refilled and
    // hold_ms more; a denied holder stays on record as one asking for a share.
    if let (Some(rec), Some(h)) = (record.as_mut(), holder) {
        rec.held = rec.held.saturating_add(u64::try_from(granted).unwrap_or(0));
        out += granted;
        let wait = if allowed { retry_after_ms.max(0) } else { 0 };
        let until = now_us.saturating_add(
            u64::try_from(wait)
                .unwrap_or(0)
                .saturating_add(h.hold_ms)
                .saturating_mul(1000),
        );
        rec.expires_us = rec.expires_us.max(until);
        rec.seq = rec.seq.max(h.seq);
        holders.put(*rec);
    }

    // 4. Report.
    let reply = Reply {
        allowed,
        remaining: u64::try_from(units.max(0) / per_token).unwrap_or(0),
        retry_after_ms,
        reset_after_ms: u64::try_from(clock.wait_ms(capacity(out) - units)).unwrap_or(0),
        granted: u64::try_from(granted).unwrap_or(0),
        penalized,
        epoch: None,
    };

    // 4b. The spill epoch: a stretch that began in this call gets a new epoch; E only grows
    // while the key lives.
    let spill = tracked.then(|| {
        let epoch = match (renew, stored_epoch) {
            (false, Some(sp)) => sp.epoch,
            (true, Some(sp)) => now_us.max(sp.epoch.saturating_add(1)),
            (_, None) => now_us,
        };
        Spill {
            epoch,
            headroom,
            taken,
            reserved_until_us: reserved_until,
        }
    });
    let reply = Reply {
        epoch: track.and(spill).map(|sp| Stamp {
            epoch: sp.epoch,
            mark: sp.taken,
        }),
        ..reply
    };

    // 5. Store: a full bucket with no holders is no key at all, unless it is boxed or remembers
    // an offence within the window.
    let keep_ms = penalty.map_or(0, |p| offences.keep_ms(p, now_us));
    if penalty.is_some() && keep_ms == 0 {
        *offences = Offences::default();
    }
    let next = (units < full || !holders.0.is_empty() || keep_ms > 0).then_some(State {
        units,
        ts_us,
        per_token: limits.period_ms / step_ms,
        spill,
    });
    if next.is_none() {
        *offences = Offences::default();
    }
    (next, reply)
}

/// An operator's operation on a bucket (the script's `ARGV[5]` = `reset` or `credit:<n>`): what
/// the `tollgate` command sends, never the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// The bucket holds all it can again, less what is out: tokens holders hold (they stay on
    /// record until they expire) and tokens still reserved by held requests.
    Reset,
    /// This many more tokens, never past what the bucket can hold (debt is repaid first).
    Credit(std::num::NonZeroU64),
}

impl Operation {
    /// The script's `ARGV[5]` for this operation.
    pub fn argument(&self) -> String {
        match self {
            Operation::Reset => "reset".to_string(),
            Operation::Credit(n) => format!("credit:{n}"),
        }
    }
}

/// An operator's operation, exactly as `lua/token_bucket.lua` does it: the bucket is refilled to
/// `now_us` (expired holders dropped) as by any call, then [`Operation::Reset`] raises it to what
/// it can hold (`burst` less what holders hold) less the tokens reserved by requests still held
/// (its debt, up to `max_wait_ms` of refill: no reservation reaches deeper), and
/// [`Operation::Credit`] raises it by `n` tokens up to what it can hold. It never lowers a bucket,
/// so tokens on lease or reserved and tokens in the bucket never pass `burst` together.
///
/// The reply is the bucket after it: `{1, remaining, 0, reset_after_ms, 0}`. Arguments the
/// script would refuse (invalid limits, `max_wait_ms` above [`MAX_WAIT_MS`], a credit above
/// 2^53) change nothing and answer "never admissible", as [`take_held`] does.
pub fn operate(
    state: Option<State>,
    holders: &mut Holders,
    limits: &Limits,
    op: Operation,
    max_wait_ms: u64,
    now_us: u64,
) -> (Option<State>, Reply) {
    let mut offences = Offences::default();
    operate_penalized(
        state,
        holders,
        (&mut offences, None),
        limits,
        op,
        max_wait_ms,
        now_us,
    )
}

/// [`operate`] on a key that may have offences on record, with the rule's penalty if the call
/// carries it (the script's ARGV[9]): [`Operation::Reset`] empties the penalty box and forgets
/// the offences (the operator lets the key in again); [`Operation::Credit`] leaves them, and with
/// the penalty keeps the key while they need remembering, as any call of the rule does. They go
/// when the key is deleted.
pub fn operate_penalized(
    state: Option<State>,
    holders: &mut Holders,
    (offences, penalty): (&mut Offences, Option<&Penalty>),
    limits: &Limits,
    op: Operation,
    max_wait_ms: u64,
    now_us: u64,
) -> (Option<State>, Reply) {
    let credit_ok = !matches!(op, Operation::Credit(n) if n.get() > MAX_EXACT);
    if !limits.is_valid() || max_wait_ms > MAX_WAIT_MS || !credit_ok {
        return (state, Reply::REJECT);
    }
    let ask = Ask {
        max_wait_ms,
        ..Ask::default()
    };
    if op == Operation::Reset {
        *offences = Offences::default();
    }
    // A cost of 0 takes nothing: this is the bucket refilled to now, stored as the script stores it.
    let (next, reply) = take_penalized(state, holders, offences, limits, &ask, penalty, now_us);
    let Some(mut refilled) = next else {
        // Full with no holders (or refused): nothing to raise.
        return (next, reply);
    };
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let per_token = int(limits.units_per_token().unwrap_or(1));
    let clock = Clock::new(limits, refilled.ts_us, now_us);
    let full = int(limits.burst).saturating_mul(per_token);
    let capacity = full
        .saturating_sub(int(holders.held()).saturating_mul(per_token))
        .max(0);
    let units = refilled.units;
    refilled.units = match op {
        Operation::Reset => {
            let reserved = units
                .saturating_neg()
                .max(0)
                .min(clock.refill_within(int(max_wait_ms)));
            units.max(capacity - reserved)
        }
        Operation::Credit(n) if units < capacity => {
            if int(n.get()) >= ceil_div_i(capacity.saturating_sub(units), per_token) {
                capacity
            } else {
                units.saturating_add(int(n.get()).saturating_mul(per_token))
            }
        }
        Operation::Credit(_) => units,
    };
    // Tokens an operator puts in were never taken: after a reset nothing taken before comes
    // back (a new stretch); a credit counts as held since the stretch began. The script does
    // this before it ends the call, so a stretch begins at most once in it.
    let before = state
        .filter(|s| s.per_token >= 1)
        .and_then(|s| s.spill)
        .map(|s| s.epoch);
    if let Some(sp) = refilled.spill.as_mut() {
        // Full less V (what holders hold counted, not clamped as the capacity is).
        let held = int(holders.held()).saturating_mul(per_token);
        let room = full - held - refilled.units;
        match op {
            Operation::Reset => {
                sp.headroom = room;
                sp.taken = 0;
                // A stretch begins at most once in a call.
                if before == Some(sp.epoch) {
                    sp.epoch = now_us.max(sp.epoch.saturating_add(1));
                }
            }
            Operation::Credit(_) => {
                let taken = i64::try_from(sp.taken).unwrap_or(i64::MAX);
                sp.headroom = sp.headroom.min(room - taken);
            }
        }
    }
    let reply = Reply {
        allowed: true,
        remaining: u64::try_from(refilled.units.max(0) / per_token).unwrap_or(0),
        retry_after_ms: 0,
        reset_after_ms: u64::try_from(clock.wait_ms(capacity - refilled.units)).unwrap_or(0),
        granted: 0,
        penalized: Penalized::No,
        epoch: None,
    };
    // With the penalty, `offences` already says whether they keep the key (the refill above).
    let keep = penalty.is_some_and(|p| offences.keep_ms(p, now_us) > 0);
    let next = (refilled.units < full || !holders.0.is_empty() || keep).then_some(refilled);
    if next.is_none() {
        *offences = Offences::default();
    }
    (next, reply)
}

/// A bucket's refill seen from now, once it is refilled to now: `rate` units at each whole step
/// after its refill point, which is `since_ms` (less than a step) ago.
#[derive(Debug, Clone, Copy)]
struct Clock {
    rate: i64,
    step_ms: i64,
    since_ms: i64,
}

impl Clock {
    fn new(limits: &Limits, ts_us: u64, now_us: u64) -> Clock {
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Clock {
            rate: int(limits.rate),
            step_ms: int(limits.step_ms().unwrap_or(1)),
            since_ms: int(now_us.saturating_sub(ts_us) / 1000),
        }
    }

    /// Milliseconds until `units` more units have refilled (0 if none are missing), rounded up,
    /// saturated at [`MAX_REPLY_MS`]: the script's `wait_for`.
    fn wait_ms(&self, units: i64) -> i64 {
        if units <= 0 {
            return 0;
        }
        let steps = ceil_div_i(units, self.rate);
        let max = i64::try_from(MAX_REPLY_MS).unwrap_or(i64::MAX);
        if steps > max / self.step_ms.max(1) {
            return max;
        }
        steps * self.step_ms - self.since_ms
    }

    /// The units the refill adds within `ms` from now (the whole steps due by then): the script's
    /// `refill_within`.
    fn refill_within(&self, ms: i64) -> i64 {
        ms.saturating_add(self.since_ms)
            .div_euclid(self.step_ms.max(1))
            .saturating_mul(self.rate)
    }
}

/// `a / b` rounded up, for `a >= 0`, `b >= 1`.
fn ceil_div_i(a: i64, b: i64) -> i64 {
    let b = b.max(1);
    a.div_euclid(b) + i64::from(a.rem_euclid(b) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000_000; // a realistic µs clock

    fn lim(burst: u64, rate: u64, period_ms: u64) -> Limits {
        Limits {
            burst,
            rate,
            period_ms,
        }
    }

    /// Runs `take` and threads the state through.
    fn step(s: &mut Option<State>, l: &Limits, cost: u64, lease: u64, now: u64) -> Reply {
        let (next, reply) = take(*s, l, cost, lease, 0, 0, now);
        *s = next;
        reply
    }

    #[test]
    fn first_call_on_empty_state_sees_a_full_bucket() {
        let l = lim(10, 5, 1000);
        let (s, r) = take(None, &l, 1, 0, 0, 0, T0);
        assert_eq!(
            r,
            Reply {
                allowed: true,
                remaining: 9,
                retry_after_ms: 0,
                reset_after_ms: 200, // 1000 units at 5 units/ms
                granted: 1,
                penalized: Penalized::No,
                epoch: None,
            }
        );
        assert_eq!(
            s,
            Some(State {
                units: 9000,
                ts_us: T0,
                per_token: 1000,
                spill: None,
            })
        );
    }

    #[test]
    fn drain_then_deny_with_retry_after() {
        let l = lim(3, 1, 1000); // 1 token per second
        let mut s = None;
        for left in (0..3).rev() {
            let r = step(&mut s, &l, 1, 0, T0);
            assert!(r.allowed);
            assert_eq!(r.remaining, left);
        }
        let r = step(&mut s, &l, 1, 0, T0);
        assert!(!r.allowed);
        assert_eq!(r.granted, 0);
        assert_eq!(r.remaining, 0);
        assert_eq!(r.retry_after_ms, 1000);
        assert_eq!(r.reset_after_ms, 3000);
        // 400 ms later: 600 ms still to wait.
        let r = step(&mut s, &l, 1, 0, T0 + 400_000);
        assert!(!r.allowed);
        assert_eq!(r.retry_after_ms, 600);
    }

    #[test]
    fn refill_after_elapsed_time() {
        let l = lim(10, 2, 1000); // 2 tokens per second
        let mut s = None;
        assert!(step(&mut s, &l, 10, 0, T0).allowed);
        assert_eq!(s.map(|s| s.units), Some(0));
        // 1.5 s later: 3 tokens.
        let r = step(&mut s, &l, 1, 0, T0 + 1_500_000);
        assert!(r.allowed);
        assert_eq!(r.remaining, 2);
        // Sub-millisecond remainders are kept: 1000 steps of 1.5 ms refill 1.5 s worth, exactly.
        let l = lim(1000, 1, 1); // 1 token per ms
        let mut s = None;
        assert!(step(&mut s, &l, 1000, 0, T0).allowed);
        let mut now = T0;
        for _ in 0..1000 {
            now += 1500;
            step(&mut s, &l, 1, 0, now); // refills 1 or 2 tokens, takes 1
            let st = s.unwrap();
            assert!(now - st.ts_us < 1000);
        }
        // 1500 ms refilled 1500 tokens; 1000 taken; 500 left; nothing lost to rounding.
        let r = step(&mut s, &l, 1, 0, now);
        assert_eq!(r.remaining + 1 + 1000, 1500);
    }

    #[test]
    fn refill_caps_at_burst_and_deletes_the_key() {
        let l = lim(5, 1, 100);
        let mut s = None;
        step(&mut s, &l, 5, 0, T0);
        assert!(s.is_some());
        let r = step(&mut s, &l, 1, 0, T0 + 3_600_000_000);
        assert_eq!(r.remaining, 4);
        assert_eq!(r.reset_after_ms, 100);
        // A refill that reaches full with no cost taken: state gone (absent == full).
        let (next, r) = take(s, &l, 6, 0, 0, 0, T0 + 3_700_000_000);
        assert_eq!(next, None);
        assert_eq!(r.remaining, 5);
        assert_eq!(r.reset_after_ms, 0);
    }

    #[test]
    fn cost_above_one() {
        let l = lim(10, 1, 1000);
        let mut s = None;
        let r = step(&mut s, &l, 4, 0, T0);
        assert_eq!((r.allowed, r.granted, r.remaining), (true, 4, 6));
        let r = step(&mut s, &l, 4, 0, T0);
        assert_eq!((r.allowed, r.granted, r.remaining), (true, 4, 2));
        let r = step(&mut s, &l, 4, 0, T0);
        assert_eq!((r.allowed, r.granted, r.remaining), (false, 0, 2));
        assert_eq!(r.retry_after_ms, 2000);
    }

    #[test]
    fn cost_above_burst_is_never_admissible_and_takes_nothing() {
        let l = lim(10, 1, 1000);
        let (s, r) = take(None, &l, 11, 0, 0, 0, T0);
        assert_eq!(s, None);
        assert_eq!(
            r,
            Reply {
                allowed: false,
                remaining: 10,
                retry_after_ms: -1,
                reset_after_ms: 0,
                granted: 0,
                penalized: Penalized::No,
                epoch: None,
            }
        );
        let mut s = None;
        step(&mut s, &l, 3, 0, T0);
        let before = s;
        let r = step(&mut s, &l, u64::MAX, u64::MAX, T0);
        assert_eq!((r.retry_after_ms, r.remaining, r.granted), (-1, 7, 0));
        assert_eq!(s, before);
    }

    #[test]
    fn clock_not_moving_refills_nothing() {
        let l = lim(2, 1000, 1); // 1000 tokens per ms
        let mut s = None;
        assert!(step(&mut s, &l, 2, 0, T0).allowed);
        let r = step(&mut s, &l, 1, 0, T0);
        assert!(!r.allowed);
        assert_eq!(r.retry_after_ms, 1);
        // 999 µs is less than a whole millisecond: still nothing.
        let r = step(&mut s, &l, 1, 0, T0 + 999);
        assert!(!r.allowed);
        assert_eq!(s.unwrap().ts_us, T0);
        assert!(step(&mut s, &l, 1, 0, T0 + 1000).allowed);
    }

    #[test]
    fn clock_going_backwards_refills_nothing_and_rebases() {
        let l = lim(10, 1, 1); // 1 token per ms
        let mut s = None;
        step(&mut s, &l, 10, 0, T0);
        let r = step(&mut s, &l, 1, 0, T0 - 5_000_000);
        assert!(!r.allowed);
        assert_eq!(s.unwrap().ts_us, T0 - 5_000_000);
        assert_eq!(s.unwrap().units, 0);
        // Time is now measured from the earlier point: 3 ms later, 3 tokens.
        let r = step(&mut s, &l, 1, 0, T0 - 5_000_000 + 3_000);
        assert!(r.allowed);
        assert_eq!(r.remaining, 2);
    }

    #[test]
    fn huge_elapsed_time_does_not_overflow() {
        let l = lim(MAX_FULL_UNITS, MAX_RATE, 1);
        let mut s = None;
        step(&mut s, &l, MAX_FULL_UNITS, 0, 0);
        assert_eq!(s.unwrap().units, 0);
        let r = step(&mut s, &l, 1, 0, u64::MAX);
        assert!(r.allowed);
        assert_eq!(r.remaining, MAX_FULL_UNITS - 1);
        // And a stored state with extreme values.
        let odd = State {
            units: i64::MAX,
            ts_us: 0,
            per_token: 3,
            spill: None,
        };
        let l = lim(1 << 40, MAX_RATE, 1 << 10);
        let (_, r) = take(Some(odd), &l, 1, u64::MAX, 0, 0, u64::MAX);
        assert!(r.allowed);
        assert_eq!(r.granted, 1 << 40);
        // Invalid limits never panic: "never admissible", state untouched.
        for bad in [
            lim(0, 1, 1),
            lim(1, 0, 1),
            lim(1, 1, 0),
            lim(1, MAX_RATE + 1, 1),
            lim(u64::MAX, 1, u64::MAX),
        ] {
            let (next, r) = take(Some(odd), &bad, 1, 0, 0, 0, T0);
            assert_eq!(next, Some(odd));
            assert_eq!(r, Reply::REJECT);
        }
        let (_, r) = take(None, &lim(2, 1, 1), 1, 0, 0, 9, T0);
        assert_eq!(r, Reply::REJECT, "a settlement beyond 4 bursts");
    }

    #[test]
    fn settle_charges_into_debt_and_refunds_up_to_full() {
        let l = lim(100, 1, 60_000);
        // Up-front cost 1, then usage 40: 39 to charge, riding on the next call.
        let (s, r) = take(None, &l, 1, 0, 0, 0, T0);
        assert_eq!(r.remaining, 99);
        let (s, r) = take(s, &l, 1, 0, 0, 39, T0);
        assert_eq!((r.allowed, r.remaining), (true, 59));
        let (s, r) = take(s, &l, 1, 0, 0, 39, T0);
        assert_eq!((r.allowed, r.remaining), (true, 19));
        let (s, r) = take(s, &l, 1, 0, 0, 39, T0);
        assert!(!r.allowed, "in debt: 19 - 39 = -20 tokens");
        assert_eq!(r.remaining, 0);
        assert_eq!(
            r.retry_after_ms,
            21 * 60_000,
            "the debt plus one token refills first"
        );
        // A refund without an epoch gives back nothing.
        let (after, r) = take(s, &l, 0, 0, 0, -400, T0);
        assert_eq!((r.allowed, r.granted, r.remaining), (true, 0, 0));
        assert_eq!(after, s, "unchanged");
        // A charge goes at most four bursts deep.
        let (s, _) = take(None, &l, 0, 0, 0, 400, T0);
        let (_, r) = take(s, &l, 0, 0, 0, 400, T0);
        assert_eq!(r.reset_after_ms, 500 * 60_000);
    }

    /// Takes and refunds in the tracked form: the refund gives back what the bucket stayed
    /// short of full since the take's stretch began, and nothing after a spill.
    fn tracked(
        s: Option<State>,
        l: &Limits,
        cost: u64,
        refund: u64,
        stamp: Option<Stamp>,
        now: u64,
    ) -> (Option<State>, Reply) {
        let s0 = stamp.unwrap_or_default();
        let ask = Ask {
            cost,
            track: Some(Tracked {
                refund,
                epoch: s0.epoch,
                mark: s0.mark,
            }),
            ..Ask::default()
        };
        take_held(s, &mut Holders::default(), l, &ask, now)
    }

    #[test]
    fn a_refund_gives_back_what_the_bucket_stayed_short_of_full_since_its_take() {
        // burst 1, a token a second: the window-bound case.
        let l = lim(1, 1, 1000);
        let (s, a) = tracked(None, &l, 1, 0, None, T0);
        let stamp = |epoch, mark| Some(Stamp { epoch, mark });
        assert_eq!(
            (a.allowed, a.epoch),
            (true, stamp(T0, 1000)),
            "created: a stretch"
        );
        let (s, b) = tracked(s, &l, 1, 0, None, T0 + 1_000_000);
        assert_eq!(
            (b.allowed, b.epoch),
            (true, stamp(T0 + 1_000_000, 1000)),
            "refilled to full"
        );
        // A's refund at 1100 ms carries the old epoch: nothing back, C is denied.
        let (s, _) = tracked(s, &l, 0, 1, a.epoch, T0 + 1_100_000);
        let (_, c) = tracked(s, &l, 1, 0, None, T0 + 1_100_000);
        assert!(
            !c.allowed,
            "two admissions in 100 ms would pass burst + rate * W"
        );

        // A drained bucket: its refund comes back whole.
        let l = lim(5, 1, 1000);
        let (s, a) = tracked(None, &l, 5, 0, None, T0);
        let (s, r) = tracked(s, &l, 0, 5, a.epoch, T0 + 100_000);
        assert_eq!(r.remaining, 5, "0.1 token refilled, 4.9 back: full");
        assert_eq!(s, None, "full: no key");
        // From a full bucket, a refund gives back what the cap leaves.
        let (s, a) = tracked(None, &l, 3, 0, None, T0);
        let (s, _) = tracked(s, &l, 0, 3, a.epoch, T0 + 100_000);
        assert_eq!(s, None, "2.1 tokens + 2.9 back: full again (no key)");
        // Two takes from a full bucket, both refunded: each comes back, less the refill since.
        let (s, a) = tracked(None, &l, 2, 0, None, T0);
        let (s, b) = tracked(s, &l, 2, 0, None, T0);
        assert_eq!(a.epoch.map(|s| s.epoch), b.epoch.map(|s| s.epoch));
        assert_eq!((a.epoch.unwrap().mark, b.epoch.unwrap().mark), (2000, 4000));
        let (s, _) = tracked(s, &l, 0, 2, a.epoch, T0 + 10_000);
        assert_eq!(
            s.unwrap().units,
            3000,
            "1.01 + 1.99: a's 2 less the refill since"
        );
        let (s, _) = tracked(s, &l, 0, 2, b.epoch, T0 + 10_000);
        assert_eq!(s, None, "b's 2 come back too: full, never past");
        // A refund sent twice gives back no more than its take's mark allows in all.
        let (s, a) = tracked(None, &l, 1, 0, None, T0);
        let (s, _) = tracked(s, &l, 0, 1, a.epoch, T0);
        assert_eq!(s, None, "full again");
        let (s, _) = tracked(s, &l, 0, 1, a.epoch, T0);
        assert_eq!(s, None, "a new bucket: its epoch is not a's stretch");
    }

    #[test]
    fn lease_want_is_granted_partially() {
        let l = lim(10, 1, 1000);
        let mut s = None;
        let r = step(&mut s, &l, 1, 4, T0);
        assert_eq!((r.allowed, r.granted, r.remaining), (true, 4, 6));
        let r = step(&mut s, &l, 1, 100, T0); // capped by what is held
        assert_eq!((r.allowed, r.granted, r.remaining), (true, 6, 0));
        let r = step(&mut s, &l, 1, 4, T0);
        assert_eq!((r.allowed, r.granted), (false, 0));
        // The retry is for cost, not for the lease.
        assert_eq!(r.retry_after_ms, 1000);
        // The lease is capped by burst too, and never below cost.
        let (_, r) = take(None, &l, 1, 50, 0, 0, T0);
        assert_eq!(r.granted, 10);
        let (_, r) = take(None, &l, 3, 1, 0, 0, T0);
        assert_eq!(r.granted, 3);
    }

    #[test]
    fn period_change_rescales_the_units() {
        let mut s = None;
        step(&mut s, &lim(10, 1, 1000), 3, 0, T0); // 7 tokens = 7000 units
        let r = step(&mut s, &lim(10, 1, 10), 1, 0, T0);
        assert_eq!(r.remaining, 6); // 7 tokens = 70 units, take 1
        assert_eq!(
            s,
            Some(State {
                units: 60,
                ts_us: T0,
                per_token: 10,
                spill: None,
            })
        );
        // Partial tokens scale down, never up: 6 tokens + 7/10 at p=10 -> 6.7 tokens at p=1000.
        let part = Some(State {
            units: 67,
            ts_us: T0,
            per_token: 10,
            spill: None,
        });
        let (s, _) = take(part, &lim(10, 1, 1000), 1, 0, 0, 0, T0);
        assert_eq!(s.unwrap().units, 6700 - 1000);
        let part = Some(State {
            units: 7,
            ts_us: T0,
            per_token: 3,
            spill: None,
        });
        let (s, _) = take(part, &lim(10, 1, 2), 1, 0, 0, 0, T0);
        assert_eq!(s.unwrap().units, 4 - 2); // floor(7*2/3) = 4
    }

    #[test]
    fn burst_shrink_clamps_stored_tokens() {
        let mut s = None;
        step(&mut s, &lim(100, 1, 1000), 10, 0, T0); // 90 tokens left
        let r = step(&mut s, &lim(20, 1, 1000), 1, 0, T0);
        assert!(r.allowed);
        assert_eq!(r.remaining, 19);
        assert_eq!(r.reset_after_ms, 1000);
        // Growing the burst back does not restore anything.
        let r = step(&mut s, &lim(100, 1, 1000), 1, 0, T0);
        assert_eq!(r.remaining, 18);
    }

    #[test]
    fn reservations_queue_in_order_one_emission_interval_apart() {
        // 10 tokens per second: one every 100 ms. Burst 2, wait up to 1 s.
        let l = Limits {
            burst: 2,
            rate: 10,
            period_ms: 1000,
        };
        let mut s = None;
        let mut delays = Vec::new();
        for _ in 0..14 {
            let (next, r) = take(s, &l, 1, 0, 1000, 0, T0);
            s = next;
            if !r.allowed {
                assert_eq!(r.granted, 0);
                delays.push(-r.retry_after_ms);
                continue;
            }
            assert_eq!(r.granted, 1);
            delays.push(r.retry_after_ms);
        }
        // Two from the burst, then reservations 100 ms apart up to the 1 s horizon, then denials
        // that say when a reservation would fit again (negated here to tell them apart).
        assert_eq!(
            delays,
            [0, 0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, -100, -100]
        );
        // Nothing was reserved past the horizon: the debt is exactly 10 tokens.
        assert_eq!(s.unwrap().units, -10 * 1000);
        // After 1.1 s the debt is paid and one token is back.
        let (_, r) = take(s, &l, 1, 0, 0, 0, T0 + 1_100_000);
        assert!(r.allowed);
        assert_eq!(r.retry_after_ms, 0);
    }

    #[test]
    fn no_wait_means_no_reservation() {
        let l = Limits {
            burst: 1,
            rate: 1,
            period_ms: 1000,
        };
        let (s, _) = take(None, &l, 1, 0, 0, 0, T0);
        let (s2, r) = take(s, &l, 1, 0, 0, 0, T0);
        assert!(!r.allowed);
        assert_eq!(r.retry_after_ms, 1000);
        assert_eq!(s2.unwrap().units, 0, "nothing reserved");
        // A wait shorter than needed reserves nothing either, and says when it would fit.
        let (s3, r) = take(s2, &l, 1, 0, 400, 0, T0);
        assert!(!r.allowed);
        assert_eq!(r.retry_after_ms, 600);
        assert_eq!(s3.unwrap().units, 0);
    }

    #[test]
    fn debt_rescales_conservatively_on_a_period_change() {
        let debt = State {
            units: -1500,
            ts_us: T0,
            per_token: 1000,
            spill: None,
        };
        let l2 = Limits {
            burst: 2,
            rate: 1,
            period_ms: 2000,
        };
        let (s, r) = take(Some(debt), &l2, 1, 0, 0, 0, T0);
        assert!(!r.allowed);
        assert_eq!(
            s.unwrap().units,
            -2 * 2000,
            "1.5 tokens of debt round up to 2"
        );
    }

    fn credit(n: u64) -> Operation {
        Operation::Credit(std::num::NonZeroU64::new(n).unwrap())
    }

    #[test]
    fn reset_refills_to_burst_less_what_is_out() {
        let l = lim(10, 1, 1000);
        // Drained: a reset fills it again, and a full bucket with no holders is no key at all.
        let (s, _) = take(None, &l, 10, 0, 0, 0, T0);
        let (next, r) = operate(s, &mut Holders::default(), &l, Operation::Reset, 0, T0);
        assert_eq!(next, None);
        assert_eq!((r.allowed, r.remaining, r.reset_after_ms), (true, 10, 0));
        // Four tokens out on lease stay out: the bucket holds 6 and the holder stays on record.
        let mut holders = Holders::default();
        let ask = Ask {
            cost: 1,
            lease_want: 4,
            holder: Some(Holder::new(7, 1, 60_000, &[(0, 0)])),
            ..Ask::default()
        };
        let (s, r) = take_held(None, &mut holders, &l, &ask, T0);
        assert_eq!(r.granted, 4);
        let (s, _) = take(s, &l, 6, 0, 0, 0, T0);
        let (next, r) = operate(s, &mut holders, &l, Operation::Reset, 0, T0);
        assert_eq!(r.remaining, 6);
        assert_eq!(next.unwrap().units, 6000);
        assert_eq!(holders.held(), 4);
    }

    #[test]
    fn reset_keeps_what_held_requests_reserved() {
        let l = lim(10, 1, 1000);
        // 10 taken, then 3 reserved within a 5 s wait: 3 tokens of debt, requests held for them.
        let (s, _) = take(None, &l, 10, 0, 0, 0, T0);
        let (s, r) = take(s, &l, 3, 0, 5000, 0, T0);
        assert_eq!((r.allowed, r.retry_after_ms), (true, 3000));
        let (next, r) = operate(s, &mut Holders::default(), &l, Operation::Reset, 5000, T0);
        assert_eq!((r.remaining, next.unwrap().units), (7, 7000));
        // Debt deeper than the wait can reach is not a reservation: a reset forgives it.
        let (s, _) = take(None, &l, 10, 0, 0, 0, T0);
        let (s, _) = take(s, &l, 0, 0, 0, 40, T0);
        assert_eq!(s.unwrap().units, -40_000);
        let (next, r) = operate(s, &mut Holders::default(), &l, Operation::Reset, 2000, T0);
        assert_eq!((r.remaining, next.unwrap().units), (8, 8000));
    }

    #[test]
    fn credit_repays_debt_first_and_never_passes_burst() {
        let l = lim(10, 1, 1000);
        let (s, _) = take(None, &l, 10, 0, 0, 0, T0);
        let (s, _) = take(s, &l, 0, 0, 0, 5, T0);
        assert_eq!(s.unwrap().units, -5000);
        let (s, r) = operate(s, &mut Holders::default(), &l, credit(7), 0, T0);
        assert_eq!((r.remaining, s.unwrap().units), (2, 2000));
        let (s, r) = operate(
            s,
            &mut Holders::default(),
            &l,
            credit(u64::MAX >> 12),
            0,
            T0,
        );
        assert_eq!((s, r.remaining, r.reset_after_ms), (None, 10, 0));
        // Over 2^53 the script refuses it: nothing changes.
        let (s, _) = take(None, &l, 4, 0, 0, 0, T0);
        let (next, r) = operate(s, &mut Holders::default(), &l, credit(u64::MAX), 0, T0);
        assert_eq!((next, r.retry_after_ms), (s, -1));
    }

    const DAY_US: u64 = 86_400_000_000;
    const MONTH_MS: u64 = 2_592_000_000; // 30 days

    #[test]
    fn the_step_is_a_ms_until_the_units_pass_2_50_then_a_second_then_a_minute() {
        assert_eq!(lim(67_108_864, 1, 1 << 24).step_ms(), Some(1));
        assert_eq!(lim(400_000, 1, MONTH_MS).step_ms(), Some(1));
        assert_eq!(lim(1_000_000, 1, MONTH_MS).step_ms(), Some(1000));
        assert_eq!(lim(MAX_RATE, 1, MONTH_MS).step_ms(), Some(60_000));
        assert_eq!(lim(MAX_RATE, 1, 31_622_400_000).step_ms(), Some(60_000));
        // Not whole seconds (or minutes) where they are needed: the script refuses them.
        for bad in [
            lim(1_000_000, 1, MONTH_MS + 1),
            lim(MAX_RATE, 1, MONTH_MS + 1000),
            lim(1, 1, 0),
        ] {
            assert_eq!(bad.step_ms(), None, "{bad:?}");
            assert!(!bad.is_valid());
        }
    }

    #[test]
    fn a_thirty_day_quota_refills_exactly_by_the_day() {
        // 1,000,000 per 30 days: a token is 2,592,000 units, 1,000,000 units a second.
        let l = lim(1_000_000, 1_000_000, MONTH_MS);
        assert_eq!(
            (l.step_ms(), l.units_per_token()),
            (Some(1000), Some(2_592_000))
        );
        let mut s = None;
        // Day 0: the million, and not one more; the next token is 2.592 s of refill: 3 whole
        // steps.
        let r = step(&mut s, &l, 1_000_000, 0, T0);
        assert_eq!(
            (r.allowed, r.remaining, r.reset_after_ms),
            (true, 0, MONTH_MS)
        );
        let r = step(&mut s, &l, 1, 0, T0);
        assert_eq!((r.allowed, r.retry_after_ms), (false, 3000));
        // Day 15: exactly half.
        let r = step(&mut s, &l, 500_001, 0, T0 + 15 * DAY_US);
        assert_eq!((r.allowed, r.remaining), (false, 500_000));
        let r = step(&mut s, &l, 500_000, 0, T0 + 15 * DAY_US);
        assert_eq!((r.allowed, r.remaining), (true, 0));
        // Day 30: another half; take a quarter.
        let r = step(&mut s, &l, 250_000, 0, T0 + 30 * DAY_US);
        assert_eq!((r.allowed, r.remaining), (true, 250_000));
        // Day 45: 250,000 + 500,000.
        let r = step(&mut s, &l, 750_001, 0, T0 + 45 * DAY_US);
        assert_eq!(
            (r.allowed, r.remaining, r.retry_after_ms),
            (false, 750_000, 3000)
        );
        let r = step(&mut s, &l, 750_000, 0, T0 + 45 * DAY_US);
        assert_eq!((r.allowed, r.remaining), (true, 0));
        // Refill comes by whole seconds: 2.999999 s later there are 2,000,000 units (no token),
        // and the third second, due in 1 ms, brings one.
        let r = step(&mut s, &l, 1, 0, T0 + 45 * DAY_US + 2_999_999);
        assert_eq!((r.allowed, r.retry_after_ms), (false, 1));
        assert_eq!(s.unwrap().ts_us, T0 + 45 * DAY_US + 2_000_000);
        let r = step(&mut s, &l, 1, 0, T0 + 45 * DAY_US + 3_000_000);
        assert_eq!((r.allowed, r.remaining), (true, 0));
        // 60 days after that, full: the key is gone.
        let (next, r) = take(s, &l, 0, 0, 0, 0, T0 + 105 * DAY_US);
        assert_eq!((next, r.remaining, r.reset_after_ms), (None, 1_000_000, 0));
    }

    #[test]
    fn a_reservation_at_a_step_of_a_second_waits_for_whole_steps() {
        let l = lim(1_000_000, 1_000_000, MONTH_MS);
        let (s, _) = take(None, &l, 1_000_000, 0, 0, 0, T0);
        // A token is due in 3 s; 2.999 s of patience reserves nothing.
        let (s2, r) = take(s, &l, 1, 0, 2999, 0, T0);
        assert_eq!((r.allowed, r.retry_after_ms, s2), (false, 1, s));
        let (_, r) = take(s, &l, 1, 0, 3000, 0, T0);
        assert_eq!((r.allowed, r.retry_after_ms, r.granted), (true, 3000, 1));
        // Half a second into a step, the same steps are 500 ms nearer.
        let (_, r) = take(s, &l, 1, 0, 2500, 0, T0 + 500_000);
        assert_eq!((r.allowed, r.retry_after_ms), (true, 2500));
    }

    #[test]
    fn tokens_survive_a_change_of_step_exactly() {
        let ms = lim(400_000, 400_000, MONTH_MS); // a ms step: 2,592,000,000 units a token
        let secs = lim(1_000_000, 400_000, MONTH_MS); // a second: 2,592,000 units a token
        assert_eq!((ms.step_ms(), secs.step_ms()), (Some(1), Some(1000)));
        let mut s = None;
        step(&mut s, &ms, 123_457, 0, T0);
        assert_eq!(
            s.unwrap().per_token,
            MONTH_MS,
            "p is period_ms at a ms step"
        );
        let r = step(&mut s, &secs, 1, 0, T0);
        assert_eq!(r.remaining, 276_542);
        assert_eq!(
            s,
            Some(State {
                units: 276_542 * 2_592_000,
                ts_us: T0,
                per_token: 2_592_000,
                spill: None,
            })
        );
        let r = step(&mut s, &ms, 2, 0, T0);
        assert_eq!(r.remaining, 276_540);
        assert_eq!(s.unwrap().units, 276_540 * MONTH_MS as i64);
        // A partial token rounds down, never up (7 tokens and 999/1000 of a ms's refill); a debt
        // rounds up, in whole tokens.
        let part = Some(State {
            units: 7 * MONTH_MS as i64 + 999,
            ts_us: T0,
            per_token: MONTH_MS,
            spill: None,
        });
        let (next, _) = take(part, &secs, 0, 0, 0, 0, T0);
        assert_eq!(next.unwrap().units, 7 * 2_592_000);
        let debt = Some(State {
            units: -(7 * 2_592_000 + 1),
            ts_us: T0,
            per_token: 2_592_000,
            spill: None,
        });
        let (next, _) = take(debt, &ms, 0, 0, 0, 0, T0);
        assert_eq!(next.unwrap().units, -8 * MONTH_MS as i64);
    }

    #[test]
    fn state_written_at_a_ms_step_reads_the_same_after_an_upgrade() {
        // What the script wrote for 1000 a day (p = period_ms) reads as the same 500 tokens
        // under the same limits, and under a burst of 10^9 a day (a step of a second).
        let old = State {
            units: 500 * 86_400_000,
            ts_us: T0,
            per_token: 86_400_000,
            spill: None,
        };
        let day = lim(1000, 1000, 86_400_000);
        let (next, r) = take(Some(old), &day, 0, 0, 0, 0, T0);
        assert_eq!((next, r.remaining), (Some(old), 500));
        let big = lim(MAX_RATE, 1000, 86_400_000);
        let (next, r) = take(Some(old), &big, 0, 0, 0, 0, T0);
        assert_eq!(r.remaining, 500);
        assert_eq!(next.unwrap().units, 500 * 86_400);
    }

    #[test]
    fn a_billion_tokens_at_one_a_year_saturate_times_at_2_53_ms() {
        let year = 31_622_400_000;
        let l = lim(MAX_RATE, 1, year);
        assert_eq!(
            (l.step_ms(), l.units_per_token()),
            (Some(60_000), Some(527_040))
        );
        let (s, r) = take(None, &l, 1, 0, 0, 0, T0);
        assert_eq!(r.reset_after_ms, year, "one token takes a year");
        let (s, r) = take(s, &l, MAX_RATE - 1, 0, 0, 0, T0);
        assert_eq!(
            (r.allowed, r.remaining, r.reset_after_ms),
            (true, 0, MAX_REPLY_MS)
        );
        // Five minutes (and a µs) later: five units refilled, a token still a year less five
        // minutes away.
        let (_, r) = take(s, &l, 1, 0, 0, 0, T0 + 300_000_001);
        assert_eq!(
            (r.allowed, r.retry_after_ms),
            (false, year as i64 - 300_000)
        );
        let (_, r) = take(s, &l, MAX_RATE, 0, 0, 0, T0);
        assert_eq!(r.retry_after_ms, MAX_REPLY_MS as i64);
    }

    #[test]
    fn a_holder_reserves_what_whole_steps_refill_within_its_wait() {
        // A second's step: 1,000,000 units a second, 2,592,000 a token.
        let l = lim(1_000_000, 1_000_000, MONTH_MS);
        let (s, _) = take(None, &l, 1_000_000, 0, 0, 0, T0);
        let mut holders = Holders::default();
        let ask = Ask {
            cost: 1,
            lease_want: 5,
            holder: Some(Holder::new(7, 1, 1000, &[(0, 0)])),
            max_wait_ms: 10_000,
            ..Ask::default()
        };
        // Ten seconds refill 10,000,000 units: 3 whole tokens, paid after 8 whole seconds.
        let (s, r) = take_held(s, &mut holders, &l, &ask, T0);
        assert_eq!((r.allowed, r.granted, r.retry_after_ms), (true, 3, 8000));
        assert_eq!(s.unwrap().units, -3 * 2_592_000);
        assert_eq!(
            holders.0,
            [Holding {
                holder: 7,
                held: 3,
                expires_us: T0 + 9_000_000,
                seq: 1,
                demand: 0,
            }]
        );
    }

    /// One call of a penalty rule: cost 1, no lease, no wait.
    fn boxed_step(
        s: &mut Option<State>,
        off: &mut Offences,
        l: &Limits,
        p: &Penalty,
        now: u64,
    ) -> Reply {
        let ask = Ask {
            cost: 1,
            ..Ask::default()
        };
        let (next, r) = take_penalized(*s, &mut Holders::default(), off, l, &ask, Some(p), now);
        *s = next;
        r
    }

    #[test]
    fn an_offence_boxes_the_key_longer_when_repeated_within_the_window() {
        let l = lim(1, 10, 1000); // a token every 100 ms
        let p = Penalty::new(60_000, &[2000, 5000]).unwrap();
        let (mut s, mut off) = (None, Offences::default());
        assert!(boxed_step(&mut s, &mut off, &l, &p, T0).allowed);
        let r = boxed_step(&mut s, &mut off, &l, &p, T0);
        assert_eq!(
            (r.allowed, r.retry_after_ms, r.penalized),
            (false, 2000, Penalized::Offence)
        );
        // The bucket refilled long ago; the box still refuses, takes nothing, and is no offence.
        let r = boxed_step(&mut s, &mut off, &l, &p, T0 + 1_500_000);
        assert_eq!(
            (r.allowed, r.retry_after_ms, r.penalized),
            (false, 500, Penalized::Boxed)
        );
        assert_eq!(off.count, 1);
        // The key is kept while it remembers the offence, though its bucket is full.
        assert!(s.is_some_and(|s| s.units == 1000));
        // Out of the box; the next offence within the window gets the second duration, and
        // every one after it the last (the ceiling).
        assert!(boxed_step(&mut s, &mut off, &l, &p, T0 + 2_000_000).allowed);
        let r = boxed_step(&mut s, &mut off, &l, &p, T0 + 2_000_000);
        assert_eq!((r.retry_after_ms, off.count), (5000, 2));
        assert!(boxed_step(&mut s, &mut off, &l, &p, T0 + 7_000_000).allowed);
        let r = boxed_step(&mut s, &mut off, &l, &p, T0 + 7_000_000);
        assert_eq!((r.retry_after_ms, off.count), (5000, 3));
        // An offence after the window starts the count again.
        let later = T0 + 7_000_000 + 60_000_001;
        assert!(boxed_step(&mut s, &mut off, &l, &p, later).allowed);
        let r = boxed_step(&mut s, &mut off, &l, &p, later);
        assert_eq!((r.retry_after_ms, off.count), (2000, 1));
        // Once boxed nothing and past the window, a full bucket is no key and no record.
        let gone = later + 60_000_001;
        let r = take_penalized(
            s,
            &mut Holders::default(),
            &mut off,
            &l,
            &Ask::default(),
            Some(&p),
            gone,
        );
        assert_eq!((r.0, off), (None, Offences::default()));
    }

    #[test]
    fn reset_empties_the_box_and_credit_keeps_it() {
        let l = lim(1, 10, 1000);
        let p = Penalty::new(60_000, &[2000]).unwrap();
        let (mut s, mut off) = (None, Offences::default());
        boxed_step(&mut s, &mut off, &l, &p, T0);
        boxed_step(&mut s, &mut off, &l, &p, T0);
        let boxed = off;
        let mut h = Holders::default();
        let (next, _) = operate_penalized(s, &mut h, (&mut off, Some(&p)), &l, credit(1), 0, T0);
        assert_eq!(off, boxed, "a credit keeps the box");
        assert!(
            next.is_some_and(|n| n.units == 1000),
            "and the full bucket's key"
        );
        // Without the penalty the credit fills the bucket and deletes the key: the filter and
        // the CLI send a penalty rule's penalty with every call for this reason.
        let (next, _) = operate_penalized(s, &mut h, (&mut off, None), &l, credit(1), 0, T0);
        assert_eq!((next, off), (None, Offences::default()));
        off = boxed;
        let (next, _) =
            operate_penalized(s, &mut h, (&mut off, Some(&p)), &l, Operation::Reset, 0, T0);
        assert_eq!(off, Offences::default());
        let r = boxed_step(&mut next.clone(), &mut off, &l, &p, T0);
        assert!(r.allowed, "let in again");
    }

    #[test]
    fn penalties_outside_the_script_s_bounds_cannot_be_built() {
        assert!(Penalty::new(1, &[1]).is_some());
        assert!(Penalty::new(MAX_PENALTY_WINDOW_MS, &[MAX_PENALTY_MS; 8]).is_some());
        for (w, ms) in [
            (0, &[1][..]),
            (MAX_PENALTY_WINDOW_MS + 1, &[1]),
            (10, &[]),
            (10, &[0]),
            (10, &[MAX_PENALTY_MS + 1]),
            (10, &[5, 4]),
            (10, &[1; 9]),
        ] {
            assert_eq!(Penalty::new(w, ms), None, "{w} {ms:?}");
        }
        let mut arg = Vec::new();
        Penalty::new(3_600_000, &[120_000, 300_000])
            .unwrap()
            .push_argument(&mut arg);
        assert_eq!(arg, b"3600000:120000:300000");
    }

    /// One key whose calls alternate between two tiers' limits (a caller holding a `free` and a
    /// `pro` token, or a plan changed back and forth), each call under the tier that leaves the
    /// bucket fuller: the rescale between their units and each call's own refill never admit more
    /// in a window of W ms than the largest burst plus the fastest tier's refill over W (one token
    /// of slack for a partial step).
    #[test]
    fn alternating_tiers_never_pass_the_widest_burst_plus_the_fastest_refill() {
        let tiers = [
            // free: 3 at once, 2 a second; pro: 40 at once, 30 a minute (slower per ms); team: a
            // day's period at a step of a minute.
            Limits {
                burst: 3,
                rate: 2,
                period_ms: 1000,
            },
            Limits {
                burst: 40,
                rate: 30,
                period_ms: 60_000,
            },
            Limits {
                burst: 1_000_000_000,
                rate: 1_000_000_000,
                period_ms: 86_400_000,
            },
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        for pair in [[0, 1], [1, 0], [0, 2], [1, 2]] {
            let (a, b) = (tiers[pair[0]], tiers[pair[1]]);
            let widest = a.burst.max(b.burst);
            let mut state = None;
            let mut now_ms: u64 = 1_000_000;
            let mut admitted: Vec<u64> = Vec::new();
            for _ in 0..4000 {
                now_ms += next(40);
                // The caller picks, each time, the tier that leaves the bucket fuller (or, when
                // neither admits, one at random): greedy for tokens.
                let at = now_ms * 1000;
                let (sa, ra) = take(state, &a, 1, 0, 0, 0, at);
                let (sb, rb) = take(state, &b, 1, 0, 0, 0, at);
                let a_better = match (ra.allowed, rb.allowed) {
                    (true, false) => true,
                    (false, true) => false,
                    (true, true) => ra.remaining >= rb.remaining,
                    (false, false) => next(2) == 0,
                };
                let (s, r) = if a_better { (sa, ra) } else { (sb, rb) };
                state = s;
                if r.allowed {
                    admitted.push(now_ms);
                }
            }
            // Every window that starts at an admission: at most the widest burst, plus what the
            // fastest of the two refills in it.
            for (i, &from) in admitted.iter().enumerate() {
                for (n, &to) in admitted.iter().enumerate().skip(i) {
                    let w = to - from;
                    let refill = [a, b]
                        .iter()
                        .map(|l| (l.rate * w).div_ceil(l.period_ms))
                        .max()
                        .unwrap_or(0);
                    let count = (n - i + 1) as u64;
                    assert!(
                        count <= widest + refill + 1,
                        "{a:?} / {b:?}: {count} admitted in {w} ms"
                    );
                }
            }
            assert!(admitted.len() > 40, "{pair:?}: the test admits");
        }
    }

    /// A holder gives back what it dropped unspent, as far as its record still counts it as
    /// held: the tokens move from what holders hold to the bucket, never add to both.
    #[test]
    fn a_holder_gives_back_what_its_record_still_counts() {
        let l = lim(100, 10, 1000);
        let call = |seq: u64, back: u64, cost: u64| Ask {
            cost,
            lease_want: 40,
            holder: Some(Holder::new(7, seq, 5000, &[(0, 0)]).giving_back(back)),
            ..Ask::default()
        };
        let mut holders = Holders::default();
        let (s, r) = take_held(None, &mut holders, &l, &call(1, 0, 1), T0);
        assert_eq!((r.granted, r.remaining), (40, 60));
        let drain = Ask {
            cost: 60,
            ..Ask::default()
        };
        let (s, r) = take_held(s, &mut holders, &l, &drain, T0);
        assert_eq!((r.allowed, r.remaining), (true, 0));
        // It dropped its 40 unspent and gives back 130: the bucket gets the 40 its record
        // counts, of which this call takes what it wants (its share is the whole burst).
        let (s, r) = take_held(s, &mut holders, &l, &call(2, 130, 1), T0);
        assert_eq!((r.allowed, r.granted, r.remaining), (true, 40, 0));
        assert_eq!(holders.held(), 40);
        // A stale call (an older seq) reports nothing and gives back nothing.
        let (s, r) = take_held(s, &mut holders, &l, &call(1, 40, 0), T0);
        assert_eq!((r.allowed, r.remaining), (true, 0));
        // Once its record has expired, what it gives back counts nowhere: nothing comes back.
        // (Its 40 count until T0 + 5 s: the bucket refills 50 by then, 10 more a second on.)
        let (_, r) = take_held(s, &mut holders, &l, &call(3, 40, 0), T0 + 6_000_000);
        assert_eq!((r.allowed, r.remaining), (true, 60));
    }

    /// `n` quiet holders (a demand of 0.2 tokens a second each) take a token each; then a busy
    /// one (16 a second) asks for 40 with `demand` reported (or none).
    fn busy_among_quiet(n: u64, l: &Limits, demand: Option<u64>) -> (Option<State>, Holders, Ask) {
        let mut holders = Holders::default();
        let mut s = None;
        for id in 1..=n {
            let ask = Ask {
                cost: 1,
                lease_want: 1,
                holder: Some(Holder::new(id, 1, 5000, &[(0, 0)]).demanding(200)),
                ..Ask::default()
            };
            let (next, r) = take_held(s, &mut holders, l, &ask, T0);
            assert_eq!(r.granted, 1);
            s = next;
        }
        let busy = Holder::new(99, 1, 5000, &[(0, 0)]);
        let busy = match demand {
            Some(d) => busy.demanding(d),
            None => busy,
        };
        let ask = Ask {
            cost: 1,
            lease_want: 40,
            holder: Some(busy),
            max_wait_ms: 2000,
            ..Ask::default()
        };
        (s, holders, ask)
    }

    /// A holder's share is weighed by the demand it reports: among 20 quiet holders (an equal
    /// share of 4 tokens: racers) a busy one asking for 40 gets them, its part by demand being 80
    /// of the 100 (16 ÷ (16 + 20 × 0.2)), at most what the others leave of the burst (they hold
    /// 20); among 8 (an equal share of 11) at most what keeps all holders at half the burst: 42.
    /// Without a report, the equal share, as before.
    #[test]
    fn a_busy_holder_among_quiet_ones_gets_its_part_by_demand() {
        let l = lim(100, 100, 1000);
        let (s, mut holders, ask) = busy_among_quiet(8, &l, Some(16_000));
        let ask = Ask {
            lease_want: 60,
            ..ask
        };
        let (_, r) = take_held(s, &mut holders, &l, &ask, T0);
        assert_eq!((r.allowed, r.granted), (true, 42));
        let (s, mut holders, ask) = busy_among_quiet(20, &l, Some(16_000));
        let (s, r) = take_held(s, &mut holders, &l, &ask, T0);
        assert_eq!((r.allowed, r.granted), (true, 40));
        assert_eq!(holders.demand(), 20 * 200 + 16_000);
        assert_eq!(share(100, 1, 21, (16_000, 20_000), (true, 100)), 80);
        assert_eq!(share(100, 1, 21, (16_000, 20_000), (true, 30)), 30);
        assert_eq!(share(100, 1, 21, (16_000, 20_000), (true, 0)), 4);
        // A report weighs until its holder's record expires (every one here 5 s after its
        // grant): then the sum is what the callers since reported.
        let quiet = Ask {
            cost: 1,
            lease_want: 1,
            holder: Some(Holder::new(1, 2, 5000, &[(0, 0)]).demanding(300)),
            ..Ask::default()
        };
        let (_, r) = take_held(s, &mut holders, &l, &quiet, T0 + 6_000_000);
        assert!(r.allowed);
        assert_eq!((holders.0.len(), holders.demand()), (1, 300));
        let (s, mut holders, ask) = busy_among_quiet(20, &l, None);
        let (_, r) = take_held(s, &mut holders, &l, &ask, T0);
        assert_eq!((r.allowed, r.granted), (true, 4), "the equal share");
    }

    /// A key short of tokens (the bucket holds less than half of what it can hold) is shared
    /// equally among holders that reserve, whatever the demands: a busy holder's part would take
    /// every token as it refills from the quiet ones waiting their turn.
    #[test]
    fn a_key_short_of_tokens_is_shared_equally() {
        let l = lim(100, 100, 1000);
        let (s, mut holders, ask) = busy_among_quiet(10, &l, Some(16_000));
        // 90 in the bucket; an exact check takes 46: 44 left, under half of 90.
        let drain = Ask {
            cost: 46,
            ..Ask::default()
        };
        let (s, r) = take_held(s, &mut holders, &l, &drain, T0);
        assert_eq!((r.allowed, r.remaining), (true, 44));
        let (_, r) = take_held(s, &mut holders, &l, &ask, T0);
        assert_eq!((r.allowed, r.granted, r.retry_after_ms), (true, 9, 0));
        assert_eq!(share(100, 1, 11, (16_000, 18_000), (false, 100)), 9);
    }

    /// Racers (an equal share under RACE_SHARE) on a key short of tokens get their part by
    /// demand too, and take turns at the pace of that part: a grant's reply says, as a negative
    /// retry_after_ms, when the holder's next turn comes: the refill of its tokens times the
    /// total demand over its own (over the holders on record, without a demand). Among 20 quiet
    /// holders the busy one takes the 39 there (its part is 80) and comes back once 39 × 20/16
    /// (floored: 39) tokens have refilled; a quiet one (0.2 of 20 a second) takes one token and
    /// comes back once 100 have.
    #[test]
    fn racers_on_a_key_short_of_tokens_take_turns_by_demand() {
        let l = lim(100, 100, 1000);
        let (s, mut holders, ask) = busy_among_quiet(20, &l, Some(16_000));
        // 80 in the bucket; an exact check takes 41: 39 left, under half of 80.
        let drain = Ask {
            cost: 41,
            ..Ask::default()
        };
        let (s, r) = take_held(s, &mut holders, &l, &drain, T0);
        assert_eq!((r.allowed, r.remaining), (true, 39));
        let (s, r) = take_held(s, &mut holders, &l, &ask, T0);
        assert_eq!(
            (r.allowed, r.granted, r.retry_after_ms, r.remaining),
            (true, 39, -390, 0)
        );
        // 20 ms on, 2 tokens there: a quiet one (holder 1, reporting again) takes its one.
        let quiet = Ask {
            cost: 1,
            lease_want: 1,
            holder: Some(Holder::new(1, 2, 5000, &[(0, 0)]).demanding(200)),
            ..Ask::default()
        };
        let (_, r) = take_held(s, &mut holders, &l, &quiet, T0 + 20_000);
        assert_eq!((r.allowed, r.granted, r.retry_after_ms), (true, 1, -1000));
    }

    /// A part by demand comes from what the bucket holds, never from a reservation. Among 30
    /// quiet holders (an equal share of 3, racing) a busy one asking for 60 gets the 36 there
    /// (its part, 70, is what the others leave of the burst); the bucket holds at least half of
    /// what it can hold, so it is not paced.
    #[test]
    fn a_part_by_demand_comes_from_what_the_bucket_holds() {
        let l = lim(100, 100, 1000);
        let (s, mut holders, ask) = busy_among_quiet(30, &l, Some(16_000));
        // 70 in the bucket; an exact check takes 34: 36 left, at least half of 70.
        let drain = Ask {
            cost: 34,
            ..Ask::default()
        };
        let (s, _) = take_held(s, &mut holders, &l, &drain, T0);
        let ask = Ask {
            lease_want: 60,
            ..ask
        };
        let (_, r) = take_held(s, &mut holders, &l, &ask, T0);
        assert_eq!(
            (r.allowed, r.granted, r.retry_after_ms, r.remaining),
            (true, 36, 0, 0),
            "what is there, no reservation"
        );
    }

    /// A demand past MAX_DEMAND is refused, as the script refuses it.
    #[test]
    fn a_demand_past_the_bound_is_refused() {
        let l = lim(100, 100, 1000);
        let call = |d| Ask {
            cost: 1,
            lease_want: 5,
            holder: Some(Holder::new(7, 1, 5000, &[(0, 0)]).demanding(d)),
            ..Ask::default()
        };
        let (_, r) = take_held(None, &mut Holders::default(), &l, &call(MAX_DEMAND), T0);
        assert_eq!(r.granted, 5);
        let (_, r) = take_held(None, &mut Holders::default(), &l, &call(MAX_DEMAND + 1), T0);
        assert_eq!(r, Reply::REJECT);
    }

    /// With so many holders that a share is under RACE_SHARE tokens, a holder reserves nothing:
    /// it takes what the bucket holds, or is denied until the bucket has refilled a token for
    /// every holder on record (its turn), not until the next token.
    #[test]
    fn a_holder_with_a_small_share_takes_what_is_there_or_waits_its_turn() {
        let l = lim(100, 100, 1000);
        let call = |id: u64| Ask {
            cost: 1,
            lease_want: 4,
            holder: Some(Holder::new(id, 1, 5000, &[(0, 0)])),
            max_wait_ms: 2000,
            ..Ask::default()
        };
        let mut holders = Holders::default();
        let mut s = None;
        // 25 holders take 2 each (a share of 4 or more: nothing to reserve yet) ...
        for id in 1..=25 {
            let ask = Ask {
                lease_want: 2,
                ..call(id)
            };
            let (next, r) = take_held(s, &mut holders, &l, &ask, T0);
            assert_eq!(r.granted, 2);
            s = next;
        }
        // ... and an exact check takes the other 50.
        let drain = Ask {
            cost: 50,
            ..Ask::default()
        };
        let (s, r) = take_held(s, &mut holders, &l, &drain, T0);
        assert_eq!((r.allowed, r.remaining), (true, 0));
        // The 26th: a share of 3, an empty bucket. No reservation: denied for 26 tokens' refill.
        let (s, r) = take_held(s, &mut holders, &l, &call(26), T0);
        assert_eq!((r.allowed, r.granted, r.retry_after_ms), (false, 0, 260));
        // 20 ms on, the 27th takes the 2 tokens there, and reserves nothing; without a demand
        // its next turn is when 2 tokens for each of the 27 holders have refilled.
        let (_, r) = take_held(s, &mut holders, &l, &call(27), T0 + 20_000);
        assert_eq!((r.allowed, r.granted, r.retry_after_ms), (true, 2, -540));
    }
}
