//! When a collection that keeps its gone entries is looked through to drop them.
//!
//! Invariant: a collection that asks [`worth_compacting`] each time one of its entries goes, and
//! drops its gone entries when told to, holds at most `2 × live + SLACK` entries after each
//! leave, and its look-throughs cost each leave at most two steps, amortised.

/// Entries a collection may keep beyond twice its live ones: a small one is never looked through.
const SLACK: usize = 64;

/// Whether a collection keeping `kept` entries, `live` of them still wanted, should now be looked
/// through to drop the others.
///
/// An entry whose owner goes stays where it is: taking it out would mean looking for it, and n
/// entries leaving a collection of n would cost n² steps. Keeping them all instead lets the
/// collection grow with every entry that comes and goes (a client opening and resetting streams).
/// So the gone are dropped in one look-through once they may outnumber the live: right after a
/// look-through every entry is live, so when this says yes (`kept > 2 × live + SLACK`), more
/// than half of the `kept` entries went since the last one, and the look-through's `kept` steps
/// are under two per entry that went. Meanwhile the collection holds at most `2 × live + SLACK`
/// entries: bounded by what it serves, not by how many came and went.
///
/// `live` may be an estimate from below (a count of leaves that may include entries never in
/// the collection): the look-through still costs under two steps per counted leave, and the
/// bound holds on the estimate.
pub(super) fn worth_compacting(kept: usize, live: usize) -> bool {
    kept > live.saturating_mul(2).saturating_add(SLACK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collection_is_looked_through_once_its_gone_may_outnumber_its_live() {
        assert!(!worth_compacting(0, 0));
        assert!(!worth_compacting(64, 0), "small: never looked through");
        assert!(worth_compacting(65, 0));
        assert!(!worth_compacting(2 * 100 + 64, 100));
        assert!(worth_compacting(2 * 100 + 65, 100));
        assert!(!worth_compacting(usize::MAX, usize::MAX), "no overflow");
    }

    #[test]
    fn leaving_one_by_one_costs_under_two_steps_each_and_keeps_the_bound() {
        // n entries all leave, newest first: each look-through keeps only the live.
        let n = 100_000;
        let (mut kept, mut live, mut steps) = (n, n, 0);
        for _ in 0..n {
            live -= 1;
            if worth_compacting(kept, live) {
                steps += kept;
                kept = live;
            }
            assert!(kept <= 2 * live + 64, "{kept} kept for {live}");
        }
        assert!(steps < 2 * n, "{steps} steps for {n} leaves");
    }
}
