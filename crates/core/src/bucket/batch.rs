//! The script's batched form, modelled: one call runs the single form's step for each group (a
//! key and its arguments) in order, and answers six integers per group.
//!
//! Invariant: for the same stored keys, groups and Redis `TIME`, [`take_batch`] answers what the
//! batched form of `lua/token_bucket.lua` answers, group by group, and leaves every key as the
//! script leaves it (tests/model.rs checks this against real Redis). A group the script refuses
//! changes nothing and does not stop the others; a batch it refuses as a whole changes nothing.

use super::{
    operate_penalized, take_penalized, Ask, Holders, Limits, Offences, Operation, Penalty, Reply,
    State, MAX_EXACT, MAX_HOLD_MS, MAX_RATE, MAX_SETTLE_BURSTS, MAX_WAIT_MS,
};

/// Most keys (groups) one batched call carries.
pub const MAX_BATCH_KEYS: usize = 256;

/// Why the batched form answered a group `{-1, code, 0, 0, 0, 0}`: the argument the single
/// form's error reply would name (`ERR tollgate: bad argument <name>`), or an error raised while
/// the group's step ran (a key that is not a hash: WRONGTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupError {
    Key,
    Burst,
    Rate,
    PeriodMs,
    BurstPeriodMs,
    Cost,
    Lease,
    Credit,
    MaxWaitMs,
    Settle,
    Now,
    Penalty,
    Script,
}

impl GroupError {
    pub const ALL: [GroupError; 13] = [
        GroupError::Key,
        GroupError::Burst,
        GroupError::Rate,
        GroupError::PeriodMs,
        GroupError::BurstPeriodMs,
        GroupError::Cost,
        GroupError::Lease,
        GroupError::Credit,
        GroupError::MaxWaitMs,
        GroupError::Settle,
        GroupError::Now,
        GroupError::Penalty,
        GroupError::Script,
    ];

    /// The script's code for it (the 2nd integer of the group's reply): 1 to 13.
    pub fn code(self) -> i64 {
        match self {
            GroupError::Key => 1,
            GroupError::Burst => 2,
            GroupError::Rate => 3,
            GroupError::PeriodMs => 4,
            GroupError::BurstPeriodMs => 5,
            GroupError::Cost => 6,
            GroupError::Lease => 7,
            GroupError::Credit => 8,
            GroupError::MaxWaitMs => 9,
            GroupError::Settle => 10,
            GroupError::Now => 11,
            GroupError::Penalty => 12,
            GroupError::Script => 13,
        }
    }

    /// The error of a code, or None outside 1..=13.
    pub fn from_code(code: i64) -> Option<GroupError> {
        GroupError::ALL.into_iter().find(|e| e.code() == code)
    }

    /// The argument the single form's error reply names; None for [`GroupError::Script`], which
    /// is no argument's fault.
    pub fn argument(self) -> Option<&'static str> {
        Some(match self {
            GroupError::Key => "key",
            GroupError::Burst => "burst",
            GroupError::Rate => "rate",
            GroupError::PeriodMs => "period_ms",
            GroupError::BurstPeriodMs => "burst*period_ms",
            GroupError::Cost => "cost",
            GroupError::Lease => "lease",
            GroupError::Credit => "credit",
            GroupError::MaxWaitMs => "max_wait_ms",
            GroupError::Settle => "settle",
            GroupError::Now => "now",
            GroupError::Penalty => "penalty",
            GroupError::Script => return None,
        })
    }
}

/// The batch as a whole is refused (`ERR tollgate: bad argument batch`): no group, or more than
/// [`MAX_BATCH_KEYS`]. Nothing is changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadBatch;

/// What the script keeps at one key: the bucket (None: no key), its holders and its offences.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    pub state: Option<State>,
    pub holders: Holders,
    pub offences: Offences,
}

/// One group of a batched call: one key and the single form's arguments for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// The key, as an index into the batch's keys (several groups may name the same one).
    pub key: usize,
    /// ARGV[1..3].
    pub limits: Limits,
    /// ARGV[4] (cost), ARGV[5] (the lease, unless `op`), ARGV[6] (max_wait_ms), ARGV[7] (settle).
    pub ask: Ask,
    /// An operator's operation in ARGV[5] instead of the lease.
    pub op: Option<Operation>,
    /// ARGV[9].
    pub penalty: Option<Penalty>,
    /// An explicit now (ARGV[8]); None: the run's Redis `TIME`.
    pub now_us: Option<u64>,
}

impl Group {
    /// The argument the script refuses first, checked in its order; None when it takes them all.
    /// (A number above 2^53 is refused; the script reads 2^53 + 1 as the double 2^53, a value no
    /// caller sends.)
    fn refusal(&self, keys: usize) -> Option<GroupError> {
        let exact = |v: u64| v <= MAX_EXACT;
        let (l, a) = (&self.limits, &self.ask);
        let lease_ok = a.holder.is_none_or(|h| {
            (1..=MAX_EXACT).contains(&h.id)
                && (1..=MAX_EXACT).contains(&h.seq)
                && h.hold_ms <= MAX_HOLD_MS
                && !h.steps().is_empty()
                && h.steps()
                    .iter()
                    .all(|&(held, quiet)| exact(held) && quiet <= MAX_HOLD_MS)
        }) && exact(a.lease_want);
        let settle = a.settle.unsigned_abs();
        let checks = [
            (self.key < keys, GroupError::Key),
            (l.burst >= 1 && exact(l.burst), GroupError::Burst),
            ((1..=MAX_RATE).contains(&l.rate), GroupError::Rate),
            (l.period_ms >= 1 && exact(l.period_ms), GroupError::PeriodMs),
            (l.step_ms().is_some(), GroupError::BurstPeriodMs),
            (exact(a.cost), GroupError::Cost),
            (
                !matches!(self.op, Some(Operation::Credit(n)) if !exact(n.get())),
                GroupError::Credit,
            ),
            (self.op.is_none() || a.cost == 0, GroupError::Cost),
            (self.op.is_some() || lease_ok, GroupError::Lease),
            (a.max_wait_ms <= MAX_WAIT_MS, GroupError::MaxWaitMs),
            (
                exact(settle)
                    && settle <= l.burst.saturating_mul(MAX_SETTLE_BURSTS)
                    && (self.op.is_none() || settle == 0)
                    && a.track.is_none_or(|t| {
                        a.settle >= 0
                            && t.refund <= l.burst.saturating_mul(MAX_SETTLE_BURSTS)
                            && exact(t.epoch)
                            && exact(t.mark)
                            && (self.op.is_none() || t.refund == 0)
                    }),
                GroupError::Settle,
            ),
            (self.now_us.is_none_or(exact), GroupError::Now),
        ];
        checks.into_iter().find(|(ok, _)| !ok).map(|(_, e)| e)
    }
}

/// The batched form of the script: each group's step in order on `keys` (a later group of a key
/// sees what an earlier one wrote), every group without an explicit now at `time_us` (the one
/// Redis `TIME` of the run). A refused group gets its [`GroupError`] and changes nothing.
pub fn take_batch(
    keys: &mut [Stored],
    groups: &[Group],
    time_us: u64,
) -> Result<Vec<Result<Reply, GroupError>>, BadBatch> {
    if groups.is_empty() || groups.len() > MAX_BATCH_KEYS {
        return Err(BadBatch);
    }
    let mut replies = Vec::with_capacity(groups.len());
    for group in groups {
        replies.push(match group.refusal(keys.len()) {
            Some(e) => Err(e),
            None => keys
                .get_mut(group.key)
                .map(|stored| step(stored, group, time_us))
                .ok_or(GroupError::Key),
        });
    }
    Ok(replies)
}

/// One group's step on its key, as the single form runs it.
fn step(stored: &mut Stored, group: &Group, time_us: u64) -> Reply {
    let now_us = group.now_us.unwrap_or(time_us);
    let Stored {
        state,
        holders,
        offences,
    } = stored;
    let (next, reply) = match group.op {
        Some(op) => operate_penalized(
            *state,
            holders,
            (offences, group.penalty.as_ref()),
            &group.limits,
            op,
            group.ask.max_wait_ms,
            now_us,
        ),
        None => take_penalized(
            *state,
            holders,
            offences,
            &group.limits,
            &group.ask,
            group.penalty.as_ref(),
            now_us,
        ),
    };
    *state = next;
    reply
}

/// The flat integers the script answers for `replies` to `groups` (in order): six per group,
/// and a 7th and 8th, the epoch and the mark (0, 0 for a refused group), for a group in the
/// tracked form.
pub fn batch_integers(groups: &[Group], replies: &[Result<Reply, GroupError>]) -> Vec<i64> {
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut out = Vec::with_capacity(replies.len() * 7);
    for (i, reply) in replies.iter().enumerate() {
        out.extend(match reply {
            Ok(r) => [
                i64::from(r.allowed),
                int(r.remaining),
                r.retry_after_ms,
                int(r.reset_after_ms),
                int(r.granted),
                r.penalized.code(),
            ],
            Err(e) => [-1, e.code(), 0, 0, 0, 0],
        });
        if groups.get(i).is_some_and(|g| g.ask.track.is_some()) {
            let stamp = reply
                .as_ref()
                .ok()
                .and_then(|r| r.epoch)
                .unwrap_or_default();
            out.extend([int(stamp.epoch), int(stamp.mark)]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{take_held, Holder};

    const T0: u64 = 1_700_000_000_000_000;

    fn group(key: usize, cost: u64) -> Group {
        Group {
            key,
            limits: Limits {
                burst: 3,
                rate: 1,
                period_ms: 1000,
            },
            ask: Ask {
                cost,
                ..Ask::default()
            },
            op: None,
            penalty: None,
            now_us: None,
        }
    }

    #[test]
    fn a_batch_is_the_single_steps_in_order() {
        let mut keys = vec![Stored::default(), Stored::default()];
        let groups = [group(0, 2), group(1, 1), group(0, 2), group(0, 1)];
        let got = take_batch(&mut keys, &groups, T0).unwrap();
        // The same key twice: the second step sees the first one's take.
        let (mut a, mut b) = (None, None);
        let mut want = Vec::new();
        for g in &groups {
            let s = if g.key == 0 { &mut a } else { &mut b };
            let (next, reply) = take_held(*s, &mut Holders::default(), &g.limits, &g.ask, T0);
            *s = next;
            want.push(Ok(reply));
        }
        assert_eq!(got, want);
        assert_eq!((keys[0].state, keys[1].state), (a, b));
        assert_eq!(
            batch_integers(&groups, &got),
            [
                1, 1, 0, 2000, 2, 0, 1, 2, 0, 1000, 1, 0, 0, 1, 1000, 2000, 0, 0, 1, 0, 0, 3000, 1,
                0
            ]
        );
    }

    #[test]
    fn a_refused_group_changes_nothing_and_the_others_go_on() {
        let mut keys = vec![Stored::default()];
        let mut bad = group(0, 1);
        bad.ask.max_wait_ms = MAX_WAIT_MS + 1;
        let mut holder = group(0, 1);
        holder.ask.holder = Some(Holder::new(0, 1, 100, &[(0, 0)]));
        let mut reset_with_cost = group(0, 1);
        reset_with_cost.op = Some(Operation::Reset);
        let mut late = group(0, 1);
        late.now_us = Some(MAX_EXACT + 1);
        let groups = [bad, holder, reset_with_cost, late, group(1, 1), group(0, 1)];
        let got = take_batch(&mut keys, &groups, T0).unwrap();
        let errors: Vec<_> = got.iter().map(|r| r.err()).collect();
        use GroupError::*;
        assert_eq!(
            errors,
            [
                Some(MaxWaitMs),
                Some(Lease),
                Some(Cost),
                Some(Now),
                Some(Key),
                None
            ]
        );
        assert_eq!(keys[0].state.map(|s| s.units), Some(2000), "one take only");
        assert_eq!(batch_integers(&groups, &got)[..6], [-1, 9, 0, 0, 0, 0]);
    }

    #[test]
    fn a_batch_of_none_or_too_many_is_refused() {
        let mut keys = vec![Stored::default()];
        assert_eq!(take_batch(&mut keys, &[], T0), Err(BadBatch));
        let many = vec![group(0, 1); MAX_BATCH_KEYS + 1];
        assert_eq!(take_batch(&mut keys, &many, T0), Err(BadBatch));
        assert_eq!(keys[0], Stored::default());
        let most = vec![group(0, 0); MAX_BATCH_KEYS];
        assert_eq!(take_batch(&mut keys, &most, T0).unwrap().len(), 256);
    }

    #[test]
    fn codes_round_trip() {
        for e in GroupError::ALL {
            assert_eq!(GroupError::from_code(e.code()), Some(e));
        }
        assert_eq!(GroupError::from_code(0), None);
        assert_eq!(GroupError::from_code(14), None);
        assert_eq!(
            GroupError::BurstPeriodMs.argument(),
            Some("burst*period_ms")
        );
        assert_eq!(GroupError::Script.argument(), None);
    }
}
