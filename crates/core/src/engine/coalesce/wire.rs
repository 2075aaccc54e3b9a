//! Messages between workers on their shared queues: a check sent to the worker leading its key
//! (an ask), checks relayed to the worker collecting the proxy's next flight (a relay), answers
//! to checks (one line each), and a worker's note to itself that its open batch leaves ([`LEAVE`]).
//!
//! Invariant: what is written reads back as it was; anything else (another version's message, a
//! garbled one) reads as nothing, never as another check or answer. A message holds no user
//! text: the key is the bucket key, a digest.

use super::super::host::Host;
use super::super::rules::RuleId;
use super::super::verdict::Outcome;
use crate::backend::ScriptCall;
use crate::bucket::Limits;
use crate::decimal;

/// A worker's note to itself, on its own queue: its open batch leaves now. The host delivers it
/// after the events already at hand (see `Engine::flush_open`).
pub const LEAVE: &[u8] = b"l";

/// The parts of an ask after its `a `: six numbers and the key.
const ASK_PARTS: usize = 7;
/// Room for an ask before its key (six numbers, usually short).
const ASK_HEAD_CAPACITY: usize = 48;

/// An ask: one check another worker sends to the leader of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The asking worker's queue, where the answer goes.
    pub queue: u32,
    /// The asking worker's number for the check.
    pub ask: u64,
    pub rule: RuleId,
    /// The one-token call it asks for.
    pub call: ScriptCall,
}

/// `a <queue> <ask> <rule> <burst> <rate> <period_ms> <key>`: the key last, as it is (it is the
/// bucket key, free of user text; a message holds one ask).
pub fn ask(queue: u32, ask: u64, rule: RuleId, call: &ScriptCall) -> Vec<u8> {
    let mut m = Vec::with_capacity(ASK_HEAD_CAPACITY + call.key.len());
    m.extend_from_slice(b"a");
    for n in [
        u64::from(queue),
        ask,
        rule.index() as u64,
        call.burst,
        call.rate,
        call.period_ms,
    ] {
        m.push(b' ');
        decimal::push_bytes(&mut m, n);
    }
    m.push(b' ');
    m.extend_from_slice(call.key.as_bytes());
    m
}

/// An ask, if `m` is one.
pub fn parse_ask(m: &[u8]) -> Option<Ask> {
    let mut parts = m.strip_prefix(b"a ")?.splitn(ASK_PARTS, |b| *b == b' ');
    let mut num = || -> Option<u64> { std::str::from_utf8(parts.next()?).ok()?.parse().ok() };
    let queue = u32::try_from(num()?).ok()?;
    let ask = num()?;
    let rule = RuleId::new(usize::try_from(num()?).ok()?);
    let (burst, rate, period_ms) = (num()?, num()?, num()?);
    let key = String::from_utf8(parts.next()?.to_vec()).ok()?;
    let limits = Limits {
        burst,
        rate,
        period_ms,
    };
    Some(Ask {
        queue,
        ask,
        rule,
        call: ScriptCall::new(key, &limits, 1),
    })
}

/// One relayed check: its ask number, its rule's place in the configuration, and every part of
/// its call a check has (limits, cost, reservation, penalty box); the key last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relayed {
    pub ask: u64,
    pub rule: RuleId,
    pub call: ScriptCall,
}

/// Parts of a relay line: seven numbers, the penalty and the key.
const RELAY_PARTS: usize = 9;

/// The head of a relay message: `c <queue>`, the worker the answers go to; one line per check
/// follows ([`push_relayed`]).
pub fn relay_head(queue: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(256);
    m.extend_from_slice(b"c ");
    decimal::push_bytes(&mut m, u64::from(queue));
    m.push(b'\n');
    m
}

/// `<ask> <rule> <burst> <rate> <period_ms> <cost> <max_wait_ms> <penalty|0> <key>`: a check of
/// exact mode with nothing to settle (the only kind relayed).
pub fn push_relayed(m: &mut Vec<u8>, ask: u64, rule: RuleId, call: &ScriptCall) {
    for n in [
        ask,
        rule.index() as u64,
        call.burst,
        call.rate,
        call.period_ms,
        call.cost,
        call.max_wait_ms,
    ] {
        decimal::push_bytes(m, n);
        m.push(b' ');
    }
    match &call.penalty {
        Some(p) => p.push_argument(m),
        None => m.push(b'0'),
    }
    m.push(b' ');
    m.extend_from_slice(call.key.as_bytes());
    m.push(b'\n');
}

/// A relay message: the queue its answers go to and its checks; None if any part is not what
/// [`relay_head`] and [`push_relayed`] write.
pub fn parse_relay(m: &[u8]) -> Option<(u32, Vec<Relayed>)> {
    let mut lines = m.strip_prefix(b"c ")?.split(|b| *b == b'\n');
    let queue = u32::try_from(number(lines.next()?)?).ok()?;
    let checks = lines
        .filter(|l| !l.is_empty())
        .map(parse_relayed)
        .collect::<Option<Vec<_>>>()?;
    Some((queue, checks))
}

fn number(part: &[u8]) -> Option<u64> {
    std::str::from_utf8(part).ok()?.parse().ok()
}

fn parse_relayed(line: &[u8]) -> Option<Relayed> {
    let mut parts = line.splitn(RELAY_PARTS, |b| *b == b' ');
    let mut num = || number(parts.next()?);
    let (ask, rule) = (num()?, usize::try_from(num()?).ok()?);
    let limits = Limits {
        burst: num()?,
        rate: num()?,
        period_ms: num()?,
    };
    let (cost, max_wait_ms) = (num()?, num()?);
    let penalty = match parts.next()? {
        b"0" => None,
        p => {
            let mut ms = p.split(|b| *b == b':').map(number);
            let window = ms.next()??;
            let durations = ms.collect::<Option<Vec<u64>>>()?;
            Some(crate::bucket::Penalty::new(window, &durations)?)
        }
    };
    let key = String::from_utf8(parts.next()?.to_vec()).ok()?;
    Some(Relayed {
        ask,
        rule: RuleId::new(rule),
        call: ScriptCall {
            max_wait_ms,
            penalty,
            ..ScriptCall::new(key, &limits, cost)
        },
    })
}

/// What a worker answers for a check another worker sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Told {
    /// The check's call was answered: this is its outcome.
    Decided(Outcome),
    /// The call failed (it may have run): the asking worker applies its failure mode.
    Failed,
    /// Not taken: no call was made for it (the receiver had no room or no such rule), so the
    /// asking worker sends it itself.
    NotTaken,
}

/// One answer line: `r <ask> a <remaining> <reset_ms>` (admitted), `r <ask> w <delay_ms>
/// <reset_ms>` (admitted on a reservation), each with ` <epoch> <mark>` after it when the call
/// asked for its spill epoch, `r <ask> d <retry_ms>` (denied), `r <ask> f` (the call failed) or
/// `r <ask> n` (not taken).
fn push_answer(out: &mut Vec<u8>, ask: u64, told: Told) {
    out.extend_from_slice(b"r ");
    decimal::push_bytes(out, ask);
    // The numbers, and how many of them go out.
    let with = |a: u64, b: u64, stamp: Option<crate::bucket::Stamp>| {
        let s = stamp.unwrap_or_default();
        (
            [a, b, s.epoch, s.mark],
            2 + 2 * usize::from(stamp.is_some()),
        )
    };
    let (kind, (nums, count)): (&[u8], ([u64; 4], usize)) = match &told {
        Told::Decided(Outcome::Allowed {
            remaining,
            reset_ms,
            epoch,
        }) => (b" a", with(*remaining, *reset_ms, *epoch)),
        Told::Decided(Outcome::Reserved {
            delay_ms,
            reset_ms,
            epoch,
        }) => (b" w", with(*delay_ms, *reset_ms, *epoch)),
        Told::Decided(Outcome::Denied { retry_ms }) => (b" d", ([*retry_ms, 0, 0, 0], 1)),
        Told::NotTaken => (b" n", ([0; 4], 0)),
        Told::Decided(Outcome::FailOpen | Outcome::FailClosed) | Told::Failed => {
            (b" f", ([0; 4], 0))
        }
    };
    out.extend_from_slice(kind);
    for n in nums.into_iter().take(count) {
        out.push(b' ');
        decimal::push_bytes(out, n);
    }
    out.push(b'\n');
}

/// The epoch and mark after an admission's numbers: none, or both (None: neither).
fn stamp_of(nums: &[u64]) -> Option<Option<crate::bucket::Stamp>> {
    match *nums {
        [] => Some(None),
        [epoch, mark] => Some(Some(crate::bucket::Stamp { epoch, mark })),
        _ => None,
    }
}

/// An answer line: the ask and what it was told.
pub fn parse_answer(line: &[u8]) -> Option<(u64, Told)> {
    let mut parts = std::str::from_utf8(line.strip_prefix(b"r ")?)
        .ok()?
        .split(' ');
    let ask = parts.next()?.parse().ok()?;
    let kind = parts.next()?;
    let nums: Vec<u64> = parts.map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let told = match (kind, nums.as_slice()) {
        ("a", &[remaining, reset_ms, ref stamp @ ..]) => Told::Decided(Outcome::Allowed {
            remaining,
            reset_ms,
            epoch: stamp_of(stamp)?,
        }),
        ("w", &[delay_ms, reset_ms, ref stamp @ ..]) => Told::Decided(Outcome::Reserved {
            delay_ms,
            reset_ms,
            epoch: stamp_of(stamp)?,
        }),
        ("d", &[retry_ms]) => Told::Decided(Outcome::Denied { retry_ms }),
        ("f", []) => Told::Failed,
        ("n", []) => Told::NotTaken,
        _ => return None,
    };
    Some((ask, told))
}

/// Answers to other workers' checks, one message per worker.
#[derive(Default)]
pub struct Answers(Vec<(u32, Vec<u8>)>);

impl Answers {
    /// The answer to check `ask` of the worker on `queue` (None: its call failed).
    pub fn add(&mut self, queue: u32, ask: u64, outcome: Option<Outcome>) {
        self.tell(queue, ask, outcome.map_or(Told::Failed, Told::Decided));
    }

    /// What check `ask` of the worker on `queue` is told.
    pub fn tell(&mut self, queue: u32, ask: u64, told: Told) {
        let at = match self.0.iter().position(|(q, _)| *q == queue) {
            Some(at) => at,
            None => {
                self.0.push((queue, Vec::new()));
                self.0.len() - 1
            }
        };
        if let Some((_, message)) = self.0.get_mut(at) {
            push_answer(message, ask, told);
        }
    }

    pub fn send(self, host: &mut dyn Host) {
        for (queue, message) in self.0 {
            // A worker that is gone has no check waiting for this.
            host.enqueue(queue, &message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_and_answers_read_back_as_written() {
        let limits = Limits {
            burst: 20,
            rate: 10,
            period_ms: 1000,
        };
        let call = ScriptCall::new("tg:{r 1:abc}".into(), &limits, 1);
        let m = ask(7, 42, RuleId::new(3), &call);
        let want = Ask {
            queue: 7,
            ask: 42,
            rule: RuleId::new(3),
            call,
        };
        assert_eq!(parse_ask(&m), Some(want));
        assert_eq!(parse_ask(b"a 7 42 3 20 10"), None, "no key");
        assert_eq!(parse_ask(b"a 7 x 3 20 10 1000 k"), None);

        let mut out = Vec::new();
        let allowed = Outcome::Allowed {
            remaining: 5,
            reset_ms: 900,
            epoch: None,
        };
        push_answer(&mut out, 1, Told::Decided(allowed));
        push_answer(
            &mut out,
            2,
            Told::Decided(Outcome::Denied { retry_ms: 100 }),
        );
        push_answer(&mut out, 3, Told::Failed);
        push_answer(&mut out, 4, Told::NotTaken);
        let lines: Vec<_> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(parse_answer)
            .collect();
        assert_eq!(
            lines,
            [
                Some((1, Told::Decided(allowed))),
                Some((2, Told::Decided(Outcome::Denied { retry_ms: 100 }))),
                Some((3, Told::Failed)),
                Some((4, Told::NotTaken)),
            ]
        );
        assert_eq!(parse_answer(b"r 1 a 5"), None);
        assert_eq!(parse_answer(b"r 1 x"), None);
        let reserved = Outcome::Reserved {
            delay_ms: 250,
            reset_ms: 900,
            epoch: None,
        };
        let mut out = Vec::new();
        push_answer(&mut out, 4, Told::Decided(reserved));
        assert_eq!(
            parse_answer(out.trim_ascii_end()),
            Some((4, Told::Decided(reserved)))
        );
        // A spill epoch travels with the admission it came with.
        for told in [
            Outcome::Reserved {
                delay_ms: 250,
                reset_ms: 900,
                epoch: Some(crate::bucket::Stamp {
                    epoch: 1_700_000_000_123_456,
                    mark: 42_000,
                }),
            },
            Outcome::Allowed {
                remaining: 5,
                reset_ms: 900,
                epoch: Some(crate::bucket::Stamp { epoch: 0, mark: 0 }),
            },
        ] {
            let mut out = Vec::new();
            push_answer(&mut out, 5, Told::Decided(told));
            assert_eq!(
                parse_answer(out.trim_ascii_end()),
                Some((5, Told::Decided(told)))
            );
        }
        assert_eq!(parse_answer(b"r 1 a 5 900 7"), None);
        assert_eq!(parse_answer(b"r 1 a 5 900 7 8 9"), None);
    }

    #[test]
    fn relays_read_back_as_written_and_nothing_else_reads_as_one() {
        let limits = Limits {
            burst: 20,
            rate: 10,
            period_ms: 1000,
        };
        let plain = ScriptCall::new("tg:{r 1:abc}".into(), &limits, 3);
        let held = ScriptCall {
            max_wait_ms: 250,
            penalty: crate::bucket::Penalty::new(60_000, &[4000, 8000]),
            ..ScriptCall::new("tg:{login:cd}".into(), &limits, 1)
        };
        let mut m = relay_head(7);
        push_relayed(&mut m, 41, RuleId::new(0), &plain);
        push_relayed(&mut m, 42, RuleId::new(2), &held);
        let (queue, checks) = parse_relay(&m).unwrap();
        assert_eq!(queue, 7);
        assert_eq!(
            checks,
            [
                Relayed {
                    ask: 41,
                    rule: RuleId::new(0),
                    call: plain
                },
                Relayed {
                    ask: 42,
                    rule: RuleId::new(2),
                    call: held
                },
            ]
        );
        for garbled in [
            &b"c x\n1 0 20 10 1000 1 0 0 k\n"[..],
            b"c 7\n1 0 20 10 1000 1 0 0\n",
            b"c 7\n1 0 20 10 1000 1 0 5:0 k\n",
            b"c 7\n1 0 20 10 1000 1 0 0 k\nnot a check\n",
            b"a 7 1 0 20 10 1000 k",
        ] {
            assert_eq!(
                parse_relay(garbled),
                None,
                "{}",
                String::from_utf8_lossy(garbled)
            );
        }
    }
}
