//! The script's batched form, transport-neutral: its bounds, the bytes a call adds to a batch, and
//! the batched reply (6 integers per key, 8 for a key that asked for its spill epoch and mark)
//! as one outcome per key.
//!
//! Invariant: a batched reply maps to outcomes only when it holds exactly the integers each key
//! sent asks for (6, or 8 in the tracked form); anything else is one `Malformed` for the whole
//! call, never a partial mapping. A key's group is
//! either its `{-1, code, 0, 0, 0, 0}` error, mapped to the error its single call would have got,
//! or the script's reply checked as the single form's is (`script_reply_of`, 6-integer form).

use super::{script_reply_of, BackendError, Reply, ScriptCall};
use crate::bucket::GroupError;

/// Most keys in one batched call: the script refuses more (`ERR tollgate: bad argument batch`);
/// `backend.batch_max_keys` is at most this. The script's bound, defined with its model.
pub const MAX_BATCH_KEYS: usize = crate::bucket::MAX_BATCH_KEYS;

/// Most bytes the groups of one batched call may add up to (each call's
/// [`Transport::group_bytes`](super::Transport::group_bytes)): a bound on the command a flood of
/// new keys can build, whatever the keys.
pub const MAX_BATCH_BYTES: usize = 16384;

/// Integers per key in the batched reply: allowed, remaining, retry_after_ms, reset_after_ms,
/// granted, penalized.
pub const GROUP_INTS: usize = 6;

/// A batched call's argument groups as one transport encodes them (`encode`: its single form's
/// arguments of a call, their count returned): `emit` gets, for each call in order, its count
/// and its encoded arguments, or None for a call whose encoded arguments are the previous
/// call's (the script's count `0`: the same arguments again). A call with the previous call's
/// fields is not encoded again (a flood's calls differ only in their keys).
pub(super) fn each_group(
    calls: &[&ScriptCall],
    encode: impl Fn(&ScriptCall, &mut Vec<u8>) -> usize,
    mut emit: impl FnMut(Option<(usize, &[u8])>),
) {
    let (mut args, mut previous) = (Vec::with_capacity(160), Vec::with_capacity(160));
    let mut last: Option<&ScriptCall> = None;
    for &call in calls {
        if last.is_some_and(|l| l.same_args(call)) {
            emit(None);
            continue;
        }
        last = Some(call);
        args.clear();
        let count = encode(call, &mut args);
        if args == previous {
            emit(None);
        } else {
            emit(Some((count, &args)));
            std::mem::swap(&mut args, &mut previous);
        }
    }
}

/// The batched reply `ints` to a call of `n` keys none of which asked for its epoch.
pub fn batch_replies(
    ints: &[i64],
    n: usize,
) -> Result<Vec<Result<Reply, BackendError>>, BackendError> {
    batch_replies_asked(ints, n, &[])
}

/// The integers a batched reply holds for `n` keys, of which those whose `asks` entry is true
/// sent the tracked form (8 integers: the epoch and the mark; the others, and every key past the
/// end of `asks`, 6).
pub fn reply_ints(n: usize, asks: &[bool]) -> usize {
    let tracked = asks.iter().take(n).filter(|&&a| a).count();
    n.saturating_mul(GROUP_INTS)
        .saturating_add(tracked.saturating_mul(STAMP_INTS))
}

/// The integers a key in the tracked form adds to its group: its epoch and its mark.
pub const STAMP_INTS: usize = 2;

/// The batched reply `ints` as one outcome per key, in order, for `n` keys that asked for their
/// spill epoch or not (`asks`, as [`reply_ints`] reads it); `Malformed` for the whole call
/// unless there are exactly the integers they asked for.
pub fn batch_replies_asked(
    ints: &[i64],
    n: usize,
    asks: &[bool],
) -> Result<Vec<Result<Reply, BackendError>>, BackendError> {
    let want = reply_ints(n, asks);
    if ints.len() != want {
        return Err(BackendError::Malformed(format!(
            "expected {want} integers for {n} keys, got {}",
            ints.len()
        )));
    }
    let mut out = Vec::with_capacity(n);
    let mut rest = ints;
    for i in 0..n {
        let asked = asks.get(i).copied().unwrap_or(false);
        let len = GROUP_INTS + if asked { STAMP_INTS } else { 0 };
        let Some((one, more)) = rest.split_at_checked(len) else {
            return Err(BackendError::Malformed("a short batched reply".to_string()));
        };
        out.push(group(one));
        rest = more;
    }
    Ok(out)
}

/// One key's 6 integers (8 with its epoch and mark).
fn group(ints: &[i64]) -> Result<Reply, BackendError> {
    match *ints {
        [-1, code, 0, 0, 0, 0] | [-1, code, 0, 0, 0, 0, 0, 0] => Err(group_error(code)),
        [-1, ..] => Err(BackendError::Malformed(
            "an error group with fields".to_string(),
        )),
        _ => script_reply_of(ints),
    }
}

/// The error a key's code stands for: what the single form answers for the same arguments
/// (the codes are the script model's, `bucket::GroupError`).
fn group_error(code: i64) -> BackendError {
    match GroupError::from_code(code).map(GroupError::argument) {
        Some(Some(name)) => BackendError::Redis(format!("ERR tollgate: bad argument {name}")),
        Some(None) => BackendError::Redis("ERR tollgate: script error".to_string()),
        None => BackendError::Malformed(format!("unknown error code {code}")),
    }
}

/// A Redis error answering a whole batched call: `CROSSSLOT` becomes [`BackendError::CrossSlot`]
/// (a single call has one key, so its decoders leave that word as any other error).
pub fn whole_error(e: BackendError) -> BackendError {
    match e {
        BackendError::Redis(msg) if msg.starts_with("CROSSSLOT") => BackendError::CrossSlot,
        other => other,
    }
}

/// Five checks of one rule (200 per second, a burst of 200) at costs 1, 1, 1, 2, 2: the second,
/// third and fifth repeat the arguments of the call before them.
#[cfg(test)]
pub(crate) fn repeating_calls() -> Vec<ScriptCall> {
    let limits = crate::bucket::Limits {
        burst: 200,
        rate: 100,
        period_ms: 1000,
    };
    [("a", 1), ("b", 1), ("c", 1), ("d", 2), ("e", 2)]
        .into_iter()
        .map(|(k, cost)| ScriptCall::new(format!("k:{{{k}}}"), &limits, cost))
        .collect()
}

/// Calls of every shape a batch carries, for the transports' tests: a plain check, a penalty
/// rule's check with a reservation, a settlement, a lease call with a holder, a key with every
/// character Webdis and RESP could trip on, and the first key again.
#[cfg(test)]
pub(crate) fn sample_calls() -> Vec<ScriptCall> {
    let limits = crate::bucket::Limits {
        burst: 200,
        rate: 100,
        period_ms: 1000,
    };
    let plain = ScriptCall::new("tollgate:{per-user:ab12}".into(), &limits, 1);
    let boxed = ScriptCall {
        max_wait_ms: 250,
        penalty: crate::bucket::Penalty::new(3_600_000, &[120_000, 300_000]),
        ..ScriptCall::new("tollgate:{login:cd34}".into(), &limits, 3)
    };
    let settle = ScriptCall {
        settle: -17,
        ..ScriptCall::new("tollgate:{tokens:ef56}".into(), &limits, 0)
    };
    let lease = ScriptCall {
        lease_want: 50,
        max_wait_ms: 2000,
        holder: Some(Box::new(crate::bucket::Holder::new(
            7,
            3,
            1450,
            &[(40, 30)],
        ))),
        ..ScriptCall::new("tollgate:{lease:0a}".into(), &limits, 1)
    };
    let hostile = ScriptCall::new("a/b+c?d%2F.json\r\n$3\r\n*1 {x}é".into(), &limits, 2);
    vec![plain.clone(), boxed, settle, lease, hostile, plain]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::Penalized;

    /// A call whose fields differ from the previous call's in anything but the key has its
    /// arguments written out; one that differs only in its key goes as `0`.
    #[test]
    fn only_a_call_that_differs_in_its_key_alone_has_the_same_arguments() {
        let limits = crate::bucket::Limits {
            burst: 200,
            rate: 100,
            period_ms: 1000,
        };
        let base = ScriptCall {
            lease_want: 5,
            max_wait_ms: 250,
            settle: 3,
            track: Some(crate::bucket::Tracked {
                refund: 1,
                epoch: 2,
                mark: 3,
            }),
            holder: Some(Box::new(crate::bucket::Holder::new(
                7,
                3,
                1450,
                &[(40, 30)],
            ))),
            penalty: crate::bucket::Penalty::new(3_600_000, &[120_000]),
            ..ScriptCall::new("tollgate:{a:01}".into(), &limits, 1)
        };
        let other_key = ScriptCall {
            key: "tollgate:{a:02}".into(),
            ..base.clone()
        };
        assert!(base.same_args(&other_key));
        let one_field_apart: Vec<ScriptCall> = vec![
            ScriptCall {
                burst: 201,
                ..base.clone()
            },
            ScriptCall {
                rate: 101,
                ..base.clone()
            },
            ScriptCall {
                period_ms: 1001,
                ..base.clone()
            },
            ScriptCall {
                cost: 2,
                ..base.clone()
            },
            ScriptCall {
                lease_want: 6,
                ..base.clone()
            },
            ScriptCall {
                max_wait_ms: 251,
                ..base.clone()
            },
            ScriptCall {
                settle: 4,
                ..base.clone()
            },
            ScriptCall {
                track: Some(crate::bucket::Tracked {
                    refund: 1,
                    epoch: 2,
                    mark: 4,
                }),
                ..base.clone()
            },
            ScriptCall {
                holder: Some(Box::new(crate::bucket::Holder::new(
                    7,
                    4,
                    1450,
                    &[(40, 30)],
                ))),
                ..base.clone()
            },
            ScriptCall {
                penalty: crate::bucket::Penalty::new(3_600_000, &[120_001]),
                ..base.clone()
            },
        ];
        for call in &one_field_apart {
            assert!(!base.same_args(call), "{call:?}");
            let mut emitted = Vec::new();
            let encode = |c: &ScriptCall, out: &mut Vec<u8>| {
                c.push_args(crate::backend::Tail::Full, |arg| out.extend_from_slice(arg))
            };
            each_group(&[&base, call], encode, |g| {
                emitted.push(g.map(|(count, args)| (count, args.to_vec())));
            });
            assert!(emitted[1].is_some(), "written out again: {call:?}");
        }
    }

    fn reply(allowed: bool, remaining: u64, retry: i64, reset: u64, granted: u64) -> Reply {
        Reply {
            allowed,
            remaining,
            retry_after_ms: retry,
            reset_after_ms: reset,
            granted,
            penalized: Penalized::No,
            epoch: None,
        }
    }

    #[test]
    fn six_integers_per_key_in_order() {
        let ints = [
            1, 9, 0, 100, 1, 0, 0, 0, 250, 1000, 0, 0, 0, 0, 120_000, 50, 0, 1,
        ];
        let out = batch_replies(&ints, 3).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[0], Ok(reply(true, 9, 0, 100, 1)));
        assert_eq!(out[1], Ok(reply(false, 0, 250, 1000, 0)));
        let boxed = out[2].clone().unwrap();
        assert_eq!(
            (boxed.allowed, boxed.retry_after_ms, boxed.penalized),
            (false, 120_000, Penalized::Offence)
        );
    }

    #[test]
    fn any_other_count_is_malformed_as_a_whole() {
        let one = [1i64, 9, 0, 100, 1, 0];
        for n in 1..=4usize {
            let full: Vec<i64> = one.iter().copied().cycle().take(6 * n).collect();
            assert_eq!(batch_replies(&full, n).map(|v| v.len()), Ok(n));
            for cut in [6 * n - 1, 6 * n + 1] {
                let ints: Vec<i64> = one.iter().copied().cycle().take(cut).collect();
                assert!(
                    matches!(batch_replies(&ints, n), Err(BackendError::Malformed(_))),
                    "n {n}, {cut} integers"
                );
            }
            assert!(matches!(
                batch_replies(&full, n + 1),
                Err(BackendError::Malformed(_))
            ));
        }
        assert!(matches!(
            batch_replies(&[], usize::MAX),
            Err(BackendError::Malformed(_))
        ));
    }

    #[test]
    fn error_codes_are_the_keys_own_errors() {
        let names = [
            (1, "key"),
            (2, "burst"),
            (3, "rate"),
            (4, "period_ms"),
            (5, "burst*period_ms"),
            (6, "cost"),
            (7, "lease"),
            (8, "credit"),
            (9, "max_wait_ms"),
            (10, "settle"),
            (11, "now"),
            (12, "penalty"),
        ];
        for (code, name) in names {
            let ints = [1, 9, 0, 100, 1, 0, -1, code, 0, 0, 0, 0];
            let out = batch_replies(&ints, 2).unwrap();
            assert_eq!(out[0], Ok(reply(true, 9, 0, 100, 1)));
            assert_eq!(
                out[1],
                Err(BackendError::Redis(format!(
                    "ERR tollgate: bad argument {name}"
                )))
            );
        }
        // Every code the script model knows, each as its single call's error.
        for e in GroupError::ALL {
            let out = batch_replies(&[-1, e.code(), 0, 0, 0, 0], 1).unwrap();
            let want = match e.argument() {
                Some(name) => format!("ERR tollgate: bad argument {name}"),
                None => "ERR tollgate: script error".to_string(),
            };
            assert_eq!(out[0], Err(BackendError::Redis(want)), "{e:?}");
        }
        let out = batch_replies(&[-1, 13, 0, 0, 0, 0], 1).unwrap();
        assert_eq!(
            out[0],
            Err(BackendError::Redis("ERR tollgate: script error".into()))
        );
        // The same names as the script's single form: its error text classes them the same.
        assert_eq!(
            out[0].clone().unwrap_err().class(),
            super::super::ErrorClass::Script
        );
        for bad in [0, 14, -1, i64::MAX, i64::MIN] {
            let out = batch_replies(&[-1, bad, 0, 0, 0, 0, 1, 9, 0, 100, 1, 0], 2).unwrap();
            assert!(matches!(out[0], Err(BackendError::Malformed(_))), "{bad}");
            assert_eq!(out[1], Ok(reply(true, 9, 0, 100, 1)));
        }
        // An error group carries nothing but its code.
        for tail in [[1, 0, 0, 0], [0, 0, 0, 1], [0, -1, 0, 0]] {
            let mut ints = vec![-1, 2];
            ints.extend(tail);
            let out = batch_replies(&ints, 1).unwrap();
            assert!(
                matches!(out[0], Err(BackendError::Malformed(_))),
                "{tail:?}"
            );
        }
    }

    #[test]
    fn a_bad_group_is_that_keys_error_only() {
        for bad in [
            [2, 9, 0, 100, 1, 0],
            [1, -9, 0, 100, 1, 0],
            [0, 9, -2, 100, 0, 0],
            [1, 9, 0, -100, 1, 0],
            [1, 9, 0, 100, -1, 0],
            [1, 9, 0, 100, 1, 3],
            [1, 9, 0, 100, 1, 1],
            [0, 0, 0, 100, 0, 2],
        ] {
            let mut ints = vec![0, 0, 250, 1000, 0, 0];
            ints.extend(bad);
            let out = batch_replies(&ints, 2).unwrap();
            assert_eq!(out[0], Ok(reply(false, 0, 250, 1000, 0)));
            assert!(matches!(out[1], Err(BackendError::Malformed(_))), "{bad:?}");
        }
    }

    /// The 6th integer is checked against the key's call by `reply_to`, as a single reply is: a
    /// penalty claimed for a call without one fails that key alone.
    #[test]
    fn a_penalty_claimed_for_a_call_without_one_fails_that_key() {
        let limits = crate::bucket::Limits {
            burst: 10,
            rate: 1,
            period_ms: 1000,
        };
        let plain = ScriptCall::new("a".into(), &limits, 1);
        let boxed = ScriptCall {
            penalty: crate::bucket::Penalty::new(60_000, &[1000]),
            ..ScriptCall::new("b".into(), &limits, 1)
        };
        let ints = [0, 0, 1000, 1000, 0, 2, 0, 0, 1000, 1000, 0, 2];
        let out: Vec<_> = batch_replies(&ints, 2)
            .unwrap()
            .into_iter()
            .zip([&plain, &boxed])
            .map(|(r, call)| r.and_then(|r| super::super::reply_to(call, r)))
            .collect();
        assert!(matches!(out[0], Err(BackendError::Malformed(_))));
        assert_eq!(out[1].clone().map(|r| r.penalized), Ok(Penalized::Boxed));
    }

    #[test]
    fn crossslot_is_its_own_error_for_a_batch() {
        let e = whole_error(BackendError::Redis(
            "CROSSSLOT Keys in request don't hash to the same slot".into(),
        ));
        assert_eq!(e, BackendError::CrossSlot);
        assert!(!e.trips_breaker());
        for other in [
            BackendError::Redis("ERR no upstream host".into()),
            BackendError::NoScript,
            BackendError::Reset,
        ] {
            assert_eq!(whole_error(other.clone()), other);
        }
    }
}
