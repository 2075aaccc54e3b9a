//! The shared bucket's backend: the script call, its reply, and how a call travels (a transport).
//!
//! Invariant: every backend outcome is either a well-formed `Reply` (five integers, six with a
//! penalty) or a `BackendError`; nothing in between reaches the decision logic. A batched call's
//! answer is either one error for the whole call or exactly one outcome per key, in order: never a
//! partial mapping.

pub mod batch;
pub mod exchange;
pub mod resp;
pub mod script;
pub mod slot;
pub mod webdis;

pub use batch::{batch_replies, batch_replies_asked, reply_ints, MAX_BATCH_BYTES, MAX_BATCH_KEYS};
pub use exchange::{Answer, Outgoing, Payload, MAX_REPLY_BYTES};
pub use slot::slot;

/// How script calls travel: encoded into a call for the host to send, and decoded from the answer
/// it delivers. Webdis over HTTP callouts (Envoy, Istio), or RESP over Higress' Redis callouts.
pub trait Transport {
    /// One backend request running the script's single form on `call`.
    fn request(&self, call: &ScriptCall, with_source: bool) -> Outgoing;
    /// The script's reply in `answer`, or why there is none (an answer of another transport's
    /// kind is `Malformed`: the host delivered what this transport never asked for).
    fn decode(&self, answer: &Answer) -> Result<Reply, BackendError>;
    /// One backend request carrying the checks of several keys (the script's batched form),
    /// n = `calls.len()` >= 2 (the script accepts 1..=[`MAX_BATCH_KEYS`]; a single call goes
    /// out with `request`, whose bytes are the single form's). Each group's arguments are what
    /// `request` sends after the key, written by the same code.
    fn request_batch(&self, calls: &[&ScriptCall], with_source: bool) -> Outgoing;
    /// The bytes `call` adds to a `request_batch` command: its key, its count and its
    /// arguments (the engine bounds an open batch by their sum, [`MAX_BATCH_BYTES`]).
    fn group_bytes(&self, call: &ScriptCall) -> usize;
    /// The answer to a `request_batch` of `n` calls, `asks` saying which of them sent the
    /// tracked form (8 integers each, 6 for the others; empty: none did): `Err` = the whole request
    /// failed (every call gets it: no answer, NOSCRIPT, CROSSSLOT, a Redis error, anything but
    /// exactly the integers asked for); `Ok` = exactly `n` per-call results, in order (a key's
    /// own error is its own `Err`). The caller still checks each reply against its call with
    /// [`reply_to`] (a penalty claimed for a call that sent none), as it does for `decode`.
    fn decode_batch(
        &self,
        answer: &Answer,
        n: usize,
        asks: &[bool],
    ) -> Result<Vec<Result<Reply, BackendError>>, BackendError>;
}

/// One call of `lua/token_bucket.lua` on one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCall {
    /// The bucket key (`<prefix>:{<rule>:<digest>}`), already free of user text.
    pub key: String,
    pub burst: u64,
    pub rate: u64,
    pub period_ms: u64,
    pub cost: u64,
    /// Tokens the proxy would like to take at once (0 in exact mode).
    pub lease_want: u64,
    /// How long the proxy will hold the request for a reservation (0 = none).
    pub max_wait_ms: u64,
    /// Tokens to charge (> 0) first: usage measured after earlier admissions. (The filter sends
    /// refunds only in `track`: a negative settle gives back nothing.)
    pub settle: i64,
    /// The tracked form of the settlement (ARGV[7] `<charge>:<refund>:<epoch>:<mark>`): set on
    /// every call whose take may be refunded, and on every call that carries a refund. The
    /// bucket tracks its spill epoch, and the reply carries it and the take's mark (a 7th and an
    /// 8th integer).
    pub track: Option<crate::bucket::Tracked>,
    /// Lease mode: the proxy that will hold what is granted, what it still holds and for how long
    /// it may hold a grant (the script counts held tokens against the bucket's capacity).
    pub holder: Option<Box<crate::bucket::Holder>>,
    /// The rule's penalty box (ARGV[9]), sent with every call of a rule that has one, so no call
    /// of it (a settlement included) ends a box by deleting a full bucket.
    pub penalty: Option<crate::bucket::Penalty>,
}

impl ScriptCall {
    /// A call taking `cost` from `key`'s bucket under `limits`: no lease, no wait, nothing to settle.
    pub fn new(key: String, limits: &crate::bucket::Limits, cost: u64) -> ScriptCall {
        ScriptCall {
            key,
            burst: limits.burst,
            rate: limits.rate,
            period_ms: limits.period_ms,
            cost,
            lease_want: 0,
            max_wait_ms: 0,
            settle: 0,
            track: None,
            holder: None,
            penalty: None,
        }
    }

    /// Whether `other` sends this call's arguments after the key: the same fields, so the same
    /// encoded arguments in either transport (a batched call sends `0` for them).
    pub fn same_args(&self, other: &ScriptCall) -> bool {
        // Every field but the key, named: a new field must be compared here too.
        let ScriptCall {
            key: _,
            burst,
            rate,
            period_ms,
            cost,
            lease_want,
            max_wait_ms,
            settle,
            track,
            holder,
            penalty,
        } = self;
        *burst == other.burst
            && *rate == other.rate
            && *period_ms == other.period_ms
            && *cost == other.cost
            && *lease_want == other.lease_want
            && *max_wait_ms == other.max_wait_ms
            && *settle == other.settle
            && *track == other.track
            && *holder == other.holder
            && *penalty == other.penalty
    }

    /// Whether the call sends the tracked form of the settlement (its reply has the epoch).
    pub fn tracked(&self) -> bool {
        self.track.is_some()
    }

    /// Whether the call carries a settlement (a charge, or a refund in its tracked form).
    pub fn settles(&self) -> bool {
        self.settle != 0 || self.track.is_some_and(|t| t.refund > 0)
    }

    /// Appends the script's ARGV[8] and ARGV[9] when the call has a penalty: `time` (Redis'
    /// clock, as when absent) and `<window_ms>:<ms1>[:<ms2>...]`, each through `arg` (digits,
    /// colons and letters only). Nothing without a penalty.
    pub fn push_penalty(&self, mut arg: impl FnMut(&[u8])) {
        if let Some(p) = &self.penalty {
            arg(b"time");
            let mut out = Vec::with_capacity(96);
            p.push_argument(&mut out);
            arg(&out);
        }
    }

    /// The script's arguments after the key that are plain unsigned integers, in order: burst,
    /// rate, period_ms, cost (ARGV[1..=4]); then come the lease ([`ScriptCall::push_lease`]),
    /// max_wait_ms and the signed settle.
    pub fn limit_args(&self) -> [u64; 4] {
        [self.burst, self.rate, self.period_ms, self.cost]
    }

    /// Appends the lease argument (ARGV[5]): `<lease_want>`, or with a holder
    /// `<lease_want>:<holder>:<seq>:<hold_ms>`, then `:<back>` when it gives tokens back (the
    /// script tells it by the odd count of parts), its steps `:<held>:<quiet_ms>`, and
    /// `/<demand>` when it reports its demand (digits, colons and a slash only).
    pub fn push_lease(&self, out: &mut Vec<u8>) {
        crate::decimal::push_bytes(out, self.lease_want);
        if let Some(h) = &self.holder {
            let back = (h.back > 0).then_some(h.back);
            let steps = h.steps().iter().flat_map(|&(held, quiet)| [held, quiet]);
            let head = [h.id, h.seq, h.hold_ms].into_iter().chain(back);
            for n in head.chain(steps) {
                out.push(b':');
                crate::decimal::push_bytes(out, n);
            }
            if let Some(d) = h.demand {
                out.push(b'/');
                crate::decimal::push_bytes(out, d);
            }
        }
    }

    /// The script's arguments after the key (its single-form ARGV), each through `arg`: burst,
    /// rate, period_ms, cost, the lease, max_wait_ms, settle, and with a penalty `time` and the
    /// penalty. With [`Tail::Trimmed`] the trailing optional ones that are 0 are left out
    /// (settle, then max_wait_ms: the script's defaults; never before a penalty). Both
    /// transports' single and batched forms write a call's arguments here and nowhere else, so
    /// the forms cannot drift apart. Returns how many arguments went out (5..=9).
    pub fn push_args(&self, tail: Tail, mut arg: impl FnMut(&[u8])) -> usize {
        let with_penalty = self.penalty.is_some();
        let (with_settle, with_wait) = match tail {
            Tail::Full => (true, true),
            Tail::Trimmed => {
                let settle = with_penalty || self.settle != 0 || self.tracked();
                (settle, settle || self.max_wait_ms != 0)
            }
        };
        // Numbers are written on the stack: this runs for every call, and more than once for a
        // batched one (its size, then its command).
        let mut number = [0u8; 21];
        for n in self.limit_args() {
            arg(crate::decimal::digits(&mut number, n));
        }
        if self.holder.is_some() {
            let mut lease = Vec::with_capacity(64);
            self.push_lease(&mut lease);
            arg(&lease);
        } else {
            arg(crate::decimal::digits(&mut number, self.lease_want));
        }
        if with_wait {
            arg(crate::decimal::digits(&mut number, self.max_wait_ms));
        }
        if let (true, Some(t)) = (with_settle, self.track) {
            // `<charge>:<refund>:<epoch>:<mark>`: digits and colons only.
            let mut out = Vec::with_capacity(64);
            crate::decimal::push_bytes(&mut out, u64::try_from(self.settle).unwrap_or(0));
            for n in [t.refund, t.epoch, t.mark] {
                out.push(b':');
                crate::decimal::push_bytes(&mut out, n);
            }
            arg(&out);
        } else if with_settle {
            arg(crate::decimal::signed_digits(&mut number, self.settle));
        }
        self.push_penalty(&mut arg);
        5 + usize::from(with_wait) + usize::from(with_settle) + 2 * usize::from(with_penalty)
    }

    /// The limits the call carries (the rule's, or an override's for its key).
    pub fn limits(&self) -> crate::bucket::Limits {
        crate::bucket::Limits {
            burst: self.burst,
            rate: self.rate,
            period_ms: self.period_ms,
        }
    }
}

/// Which of a call's trailing optional arguments go out: all of them (Webdis), or only up to the
/// last one that is not the script's default 0 (RESP: see `resp::command` for why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    Full,
    Trimmed,
}

/// The script's flat reply (the one reply type: `bucket::take` models it exactly).
pub use crate::bucket::Reply;

/// The script's five integers `{allowed, remaining, retry_after_ms, reset_after_ms, granted}` as a
/// `Reply`, with the ranges the script guarantees checked (both transports' decoders end here).
pub fn script_reply(ints: [i64; 5]) -> Result<Reply, BackendError> {
    let [allowed, remaining, retry_after_ms, reset_after_ms, granted] = ints;
    let non_negative = |v: i64, what: &str| {
        u64::try_from(v).map_err(|_| BackendError::Malformed(format!("negative {what}")))
    };
    if !(0..=1).contains(&allowed) || (allowed == 0 && retry_after_ms < -1) {
        return Err(BackendError::Malformed("field out of range".to_string()));
    }
    Ok(Reply {
        allowed: allowed == 1,
        remaining: non_negative(remaining, "remaining")?,
        retry_after_ms,
        reset_after_ms: non_negative(reset_after_ms, "reset_after_ms")?,
        granted: non_negative(granted, "granted")?,
        penalized: crate::bucket::Penalized::No,
        epoch: None,
    })
}

/// The script's reply as a list of integers: five; six when the call had a penalty (the 6th
/// says whether the denial is the penalty box's); eight when it asked for its spill epoch (the
/// tracked form of the settlement: the 7th is the epoch, the 8th the take's mark, the 6th as
/// with a penalty). A 6th field outside 0..=2, one claiming a penalty for an admission or for a
/// denial of less than 1 ms, or a negative epoch or mark, is malformed.
pub fn script_reply_of(ints: &[i64]) -> Result<Reply, BackendError> {
    let (five, sixth, stamp) = match *ints {
        [a, b, c, d, e] => ([a, b, c, d, e], None, None),
        [a, b, c, d, e, f] => ([a, b, c, d, e], Some(f), None),
        [a, b, c, d, e, f, g, h] => ([a, b, c, d, e], Some(f), Some((g, h))),
        _ => {
            return Err(BackendError::Malformed(format!(
                "expected 5, 6 or 8 integers, got {}",
                ints.len()
            )))
        }
    };
    let mut reply = script_reply(five)?;
    if let Some(code) = sixth {
        use crate::bucket::Penalized;
        let penalized = Penalized::from_code(code)
            .ok_or_else(|| BackendError::Malformed("penalized out of range".to_string()))?;
        if penalized != Penalized::No && (reply.allowed || reply.retry_after_ms < 1) {
            return Err(BackendError::Malformed(
                "penalized without a denial".to_string(),
            ));
        }
        reply.penalized = penalized;
    }
    if let Some((epoch, mark)) = stamp {
        let negative = |_| BackendError::Malformed("negative epoch or mark".to_string());
        reply.epoch = Some(crate::bucket::Stamp {
            epoch: u64::try_from(epoch).map_err(negative)?,
            mark: u64::try_from(mark).map_err(negative)?,
        });
    }
    Ok(reply)
}

/// `reply` as the answer to `call`: the script says the penalty box denied only a call that sent
/// one (ARGV[9]); a box claimed for any other is not its answer (a hostile or confused front
/// would otherwise turn a denial into a box refusing every cost of the key). Nor is an epoch the
/// call did not ask for, or a reservation longer than its `max_wait_ms`.
pub fn reply_to(call: &ScriptCall, reply: Reply) -> Result<Reply, BackendError> {
    if call.penalty.is_none() && reply.penalized != crate::bucket::Penalized::No {
        return Err(BackendError::Malformed(
            "penalized for a call without a penalty".to_string(),
        ));
    }
    // The epoch comes back to a call in the tracked form, and only to one.
    if call.tracked() != reply.epoch.is_some() {
        return Err(BackendError::Malformed(
            "a spill epoch the call did not ask for, or none where it did".to_string(),
        ));
    }
    // The script reserves only what refills within the call's max_wait_ms (ARGV[6]): a longer
    // wait would hold the request, or mark a lease refilling, past what its rule allows.
    if reply.allowed
        && reply.retry_after_ms > 0
        && reply.retry_after_ms.unsigned_abs() > call.max_wait_ms
    {
        return Err(BackendError::Malformed(
            "an admission that waits longer than the call's max_wait_ms".to_string(),
        ));
    }
    Ok(reply)
}

/// An HTTP request to the backend cluster, ready to dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// Header pairs, pseudo-headers (`:method`, `:path`, `:authority`) first.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Why a backend call did not produce a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// The callout could not be dispatched (e.g. unknown cluster).
    Dispatch(String),
    /// The stream was reset or timed out before an answer (Envoy reports both as zero headers).
    Reset,
    /// The backend answered with an HTTP status other than 200.
    Status(u32),
    /// Redis does not have the script cached: send it with EVAL.
    NoScript,
    /// Redis (through Webdis) answered with an error, e.g. `WRONGPASS`, `NOAUTH`, `ERR ...`.
    Redis(String),
    /// The reply is not the five-integer array.
    Malformed(String),
    /// The circuit breaker is open: no call was made.
    CircuitOpen,
    /// The worker already has `max_inflight` calls out: no call was made.
    Overflow,
    /// A Redis Cluster refused a batched call whose keys hash to several slots
    /// (`-CROSSSLOT ...`), before the script ran: nothing was changed, and the call's checks may
    /// be sent again, one slot per call.
    CrossSlot,
}

/// What kind of trouble a failed call means, for the breaker, the logs and one counter each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// No answer: not dispatched, reset, timed out, an HTTP error from the front, or a front that
    /// cannot reach the Redis node of this key.
    Unreachable,
    /// Redis answered but cannot serve now: OOM, BUSY, LOADING, READONLY, MASTERDOWN, CLUSTERDOWN,
    /// TRYAGAIN, or MOVED/ASK that a cluster-aware front should have followed.
    Overloaded,
    /// Redis refused our credentials: NOAUTH, WRONGPASS, NOPERM.
    Auth,
    /// The script failed or is missing after EVAL: a bug or a Redis without scripting; or a
    /// call the backend refused to run as sent (CROSSSLOT, when sending it again per slot did not
    /// help: a bug too).
    Script,
    /// The answer is not the script's reply.
    Malformed,
}

impl ErrorClass {
    pub const ALL: [ErrorClass; 5] = [
        ErrorClass::Unreachable,
        ErrorClass::Overloaded,
        ErrorClass::Auth,
        ErrorClass::Script,
        ErrorClass::Malformed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::Unreachable => "unreachable",
            ErrorClass::Overloaded => "overloaded",
            ErrorClass::Auth => "auth",
            ErrorClass::Script => "script",
            ErrorClass::Malformed => "malformed",
        }
    }
}

/// Redis error prefixes that mean "this server cannot serve now".
const OVERLOADED: &[&str] = &[
    "OOM",
    "BUSY",
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "MOVED",
    "ASK",
];
const AUTH: &[&str] = &["NOAUTH", "WRONGPASS", "NOPERM"];
/// What Envoy's redis_proxy answers when the node of a key is gone: that node is unreachable,
/// the front and the other nodes are not.
const NODE_UNREACHABLE: &[&str] = &[
    "ERR no upstream host",
    "ERR upstream failure",
    "no upstream host",
    "upstream failure",
    "upstream protocol error",
];

/// Redis and Envoy errors that refuse a call before its script runs: a Redis Cluster redirect, a
/// slot being moved, a cluster down, no host for the key's node.
const REFUSED_BEFORE_RUN: &[&str] = &[
    "MOVED ",
    "ASK ",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "ERR no upstream host",
    "no upstream host",
];

impl BackendError {
    pub fn class(&self) -> ErrorClass {
        match self {
            BackendError::Dispatch(_)
            | BackendError::Reset
            | BackendError::Status(_)
            | BackendError::CircuitOpen
            | BackendError::Overflow => ErrorClass::Unreachable,
            BackendError::NoScript | BackendError::CrossSlot => ErrorClass::Script,
            BackendError::Malformed(_) => ErrorClass::Malformed,
            BackendError::Redis(msg) => {
                let word = msg.split(' ').next().unwrap_or_default();
                if OVERLOADED.contains(&word) {
                    ErrorClass::Overloaded
                } else if AUTH.contains(&word) || msg.contains("unauthenticated") {
                    // Redis 7 closes on an unauthenticated client's large command with
                    // "ERR Protocol error: unauthenticated multibulk length".
                    ErrorClass::Auth
                } else if NODE_UNREACHABLE.iter().any(|p| msg.starts_with(p)) {
                    ErrorClass::Unreachable
                } else {
                    ErrorClass::Script
                }
            }
        }
    }

    /// Whether the script may have run for a call that failed so: anything but a call that never
    /// left (not dispatched, refused by the breaker or `max_inflight`) or that the backend
    /// refused before running the script (NOSCRIPT, CROSSSLOT, a Redis Cluster redirect or
    /// resharding, Envoy finding no host for the key's node). A timeout, a reset, an HTTP error,
    /// another Redis error (Envoy's `upstream failure`: the connection closed with the call
    /// pending) or a garbled reply may all follow a script that ran.
    pub fn may_have_run(&self) -> bool {
        match self {
            BackendError::Dispatch(_)
            | BackendError::CircuitOpen
            | BackendError::Overflow
            | BackendError::NoScript
            | BackendError::CrossSlot => false,
            BackendError::Redis(msg) => !REFUSED_BEFORE_RUN.iter().any(|p| msg.starts_with(p)),
            _ => true,
        }
    }

    /// Whether this failure says the backend as a whole cannot serve (it counts toward opening
    /// the circuit breaker, so the proxy stops hammering it). Not a Redis Cluster front's error
    /// about one node's keys, a script bug or a garbled reply: those concern some calls only.
    pub fn trips_breaker(&self) -> bool {
        match self {
            BackendError::Redis(_) => {
                matches!(self.class(), ErrorClass::Overloaded | ErrorClass::Auth)
            }
            // Refused for its keys' slots before it ran: the backend is fine.
            BackendError::CrossSlot => false,
            BackendError::CircuitOpen | BackendError::Overflow => false,
            _ => self.class() == ErrorClass::Unreachable,
        }
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Dispatch(why) => write!(f, "callout not dispatched: {why}"),
            BackendError::Reset => write!(f, "backend stream reset or timed out"),
            BackendError::Status(s) => write!(f, "backend answered HTTP {s}"),
            BackendError::NoScript => write!(f, "script not cached in Redis (NOSCRIPT)"),
            BackendError::Redis(msg) => write!(f, "Redis error: {msg}"),
            BackendError::Malformed(why) => write!(f, "malformed backend reply: {why}"),
            BackendError::CircuitOpen => write!(f, "circuit breaker open: no call made"),
            BackendError::Overflow => write!(f, "too many calls in flight: no call made"),
            BackendError::CrossSlot => {
                write!(
                    f,
                    "keys of several Redis Cluster slots in one call (CROSSSLOT)"
                )
            }
        }
    }
}
