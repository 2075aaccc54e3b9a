//! A bucket's state in human units: what `inspect` prints, and what `reset` and `credit` print
//! after changing it.
//!
//! Invariant: the numbers are the model's (`bucket::take_held` with a cost of 0, the script's
//! own arithmetic) over the hash as Redis stores it, at Redis' TIME: the refill to now and the
//! holders that expired are what the script's next call would see. Nothing here writes.

use tollgate_core::bucket::{take_held, Ask, Holders, Holding, Penalty, State};

use crate::describe;
use crate::target::Target;

/// The stored hash as the model's state and holders (a hash without a readable `u`, `t`, `p` is
/// a full bucket, as the script reads it).
pub fn parse(fields: &[(String, String)]) -> (Option<State>, Holders) {
    let get = |name: &str| {
        fields
            .iter()
            .find(|(f, _)| f == name)
            .map(|(_, v)| v.as_str())
    };
    let state = match (
        get("u").and_then(|v| v.parse::<i64>().ok()),
        get("t").and_then(|v| v.parse::<u64>().ok()),
        get("p").and_then(|v| v.parse::<u64>().ok()),
    ) {
        (Some(units), Some(ts_us), Some(per_token)) if per_token >= 1 => Some(State {
            units,
            ts_us,
            per_token,
            // The spill epoch (E, D, N) of a bucket that tracks it; the refill to now is the
            // same.
            spill: match (
                get("E").and_then(|v| v.parse::<u64>().ok()),
                get("D").and_then(|v| v.parse::<i64>().ok()),
                get("N").and_then(|v| v.parse::<u64>().ok()),
            ) {
                (Some(epoch), Some(headroom), Some(taken)) => Some(tollgate_core::bucket::Spill {
                    epoch,
                    headroom,
                    taken,
                    reserved_until_us: get("W").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0),
                }),
                _ => None,
            },
        }),
        _ => None,
    };
    let mut holders = Vec::new();
    for (f, v) in fields {
        let Some(id) = f.strip_prefix('e') else {
            continue;
        };
        let num = |name: String| get(&name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        holders.push(Holding {
            holder: id.parse().unwrap_or(0),
            held: num(format!("h{id}")),
            expires_us: v.parse().unwrap_or(0),
            seq: num(format!("q{id}")),
            demand: num(format!("d{id}")),
        });
    }
    holders.sort();
    (state, Holders(holders))
}

/// When a debt of `units` (< 0) is repaid: the refill repays `rate` units per step of `step_ms`.
/// `since_ms`: the time since the refill point, less than a step (whole steps count from it).
fn repaid_ms(units: i64, rate: u64, step_ms: u64, since_ms: u64) -> u64 {
    let steps = units.unsigned_abs().div_ceil(rate.max(1));
    steps
        .saturating_mul(step_ms)
        .saturating_sub(if steps > 0 { since_ms } else { 0 })
}

/// The lines describing `target`'s bucket at `now_us`, from its stored `fields`.
pub fn report(target: &Target<'_>, now_us: u64, fields: &[(String, String)]) -> Vec<String> {
    let l = target.limits;
    let mut out = vec![format!("bucket: {}", target.key)];
    if target.values.is_empty() {
        out.push(format!(
            "rule {}: named by its bucket key (its key values, and an override of them, are not \
             known here)",
            target.rule.name
        ));
    } else {
        let values: Vec<String> = target
            .rule
            .key
            .iter()
            .zip(&target.values)
            .map(|(s, v)| format!("{s} = {:?}", String::from_utf8_lossy(v)))
            .collect();
        out.push(format!(
            "rule {}: key {}",
            target.rule.name,
            values.join(", ")
        ));
    }
    let whose = if l == target.rule.limits.limits() {
        "the rule's"
    } else {
        "an override's"
    };
    out.push(format!("limits: {} ({whose})", describe::limits(&l)));
    if target.unlimited {
        out.push(
            "an override makes these key values unlimited: the filter never calls Redis for a \
             request that reads them the override's way; one that reads them only some ways \
             (another spelling of its path or header) is charged here under the rule's limits"
                .to_string(),
        );
    }
    let (stored, mut holders) = parse(fields);
    if stored.is_none() && fields.is_empty() {
        out.push(format!(
            "no state in Redis: the bucket is full ({} tokens)",
            l.burst
        ));
        return out;
    }
    let ask = Ask::default();
    let (now, reply) = take_held(stored, &mut holders, &l, &ask, now_us);
    let period = i64::try_from(l.units_per_token().unwrap_or(1))
        .unwrap_or(i64::MAX)
        .max(1);
    let step_ms = l.step_ms().unwrap_or(1);
    let units = now.map_or(i64::MAX, |s| s.units);
    out.push(format!("tokens now: {} of {}", reply.remaining, l.burst));
    if units < 0 {
        let debt = units.saturating_neg();
        let debt_tokens = debt.div_euclid(period) + i64::from(debt.rem_euclid(period) != 0);
        let since_ms = now.map_or(0, |s| now_us.saturating_sub(s.ts_us) / 1000);
        let repaid = repaid_ms(units, l.rate, step_ms, since_ms);
        out.push(format!(
            "debt: {debt_tokens} token{} (reservations or usage charged after the fact), repaid in {}",
            if debt_tokens == 1 { "" } else { "s" },
            describe::duration(repaid)
        ));
        if describe::held_ms(target.rule) > 0 {
            out.push(format!(
                "reservations outstanding: requests may be held for up to {} of it",
                describe::duration(target.rule.max_wait_ms)
            ));
        }
    } else {
        out.push("debt: none".to_string());
    }
    if holders.0.is_empty() {
        out.push("on lease: none".to_string());
    } else {
        let last = holders.last_expiry_us().saturating_sub(now_us) / 1000;
        out.push(format!(
            "on lease: up to {} token{} held by {} prox{} (counted against the bucket until they report or expire, at the latest in {})",
            holders.held(),
            if holders.held() == 1 { "" } else { "s" },
            holders.0.len(),
            if holders.0.len() == 1 { "y" } else { "ies" },
            describe::duration(last)
        ));
    }
    out.push(format!(
        "full again in: {}",
        describe::duration(reply.reset_after_ms)
    ));
    if let Some(penalty) = &target.rule.penalty {
        out.push(penalty_line(penalty, now_us, fields));
    }
    out
}

/// The penalty box as the script's next call would see it (`x`, `c`, `w`).
fn penalty_line(penalty: &Penalty, now_us: u64, fields: &[(String, String)]) -> String {
    let num = |name: &str| {
        fields
            .iter()
            .find(|(f, _)| f == name)
            .and_then(|(_, v)| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let (until, count, last) = (num("x"), num("c"), num("w"));
    let window_end = last.saturating_add(penalty.window_ms().saturating_mul(1000));
    let ago = describe::duration(now_us.saturating_sub(last) / 1000);
    if until > now_us {
        format!(
            "penalty box: boxed for {} more (offence {count} within the window, {ago} ago)",
            describe::duration((until - now_us).div_ceil(1000))
        )
    } else if count > 0 && window_end > now_us {
        format!(
            "penalty box: not boxed; {count} offence{} within the window (the last {ago} ago): the next boxes the key for {}",
            if count == 1 { "" } else { "s" },
            describe::duration(penalty.duration_ms(count.saturating_add(1)))
        )
    } else {
        "penalty box: not boxed, no offence within the window".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::repaid_ms;

    /// A debt is repaid at the step that brings its last unit, never earlier: what the script's
    /// next call would say (`wait_for`: whole steps after the refill point, less the time since).
    #[test]
    fn a_debt_is_repaid_at_the_step_that_brings_its_last_unit() {
        // One unit short at a minute's step, 10^9 units a step: the next step, 60 s after the
        // refill point.
        assert_eq!(repaid_ms(-1, 1_000_000_000, 60_000, 0), 60_000);
        // 20 s into the step: 40 s left.
        assert_eq!(repaid_ms(-1, 1_000_000_000, 60_000, 20_000), 40_000);
        // Two steps and a unit: three steps.
        assert_eq!(repaid_ms(-2_000_000_001, 1_000_000_000, 60_000, 0), 180_000);
        // A ms step, 10 units a ms: 25 units in 3 ms.
        assert_eq!(repaid_ms(-25, 10, 1, 0), 3);
    }
}
