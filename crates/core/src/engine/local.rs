//! The local stage: what a check gets without a network hop — a leased token (from this worker's
//! stash, or a batch moved from the proxy's pool) or a cached denial — and where it goes if
//! neither.
//!
//! Invariant: a check admitted here spends a token the global bucket granted to this proxy
//! (moved, never copied, from the pool), and one held for a token still refilling is let through
//! only once the bucket has refilled it; a check denied here is denied until the retry time the
//! bucket gave, or while this proxy's reservation for the key refills. Nothing here admits a
//! check the bucket would not have.

use super::decision::By;
use super::host::Host;
use super::lease::{self, give_back, Waits};
use super::plugin::Plugin;
use super::requests::Route;
use super::rules::RuleRef;
use super::sightings::Sightings;
use super::stash::Stashes;
use super::tick::Timer;
use super::verdict::Outcome;
use crate::backend::ScriptCall;
use crate::metrics::{Counter, Metrics};
use crate::shared::deny::DenyCache;
use crate::shared::lease::{LeasePool, Spent, Taken};

/// Why the proxy's pool had no leased token for a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoLease {
    /// The proxy's reservation for the key covers the cost in this many ms.
    Refilling(u64),
    /// The key's lease holds too few tokens, now and later.
    Spent,
    /// The pool has no lease for the key.
    Unknown,
}

/// What the local stage reads and changes, borrowed from the engine for one request's checks
/// (while the engine walks its configuration's rules).
pub(super) struct LocalStage<'a> {
    pub plugin: &'a Plugin,
    pub stashes: &'a mut Stashes,
    pub sightings: &'a mut Sightings,
    /// For the demand denied here (the next lease call of the key asks for it too).
    pub waits: &'a mut Waits,
    pub timer: &'a mut Timer,
}

impl LocalStage<'_> {
    /// What the local stage answers for a check of `rule` (`lease`: a lease rule's): a leased
    /// token or a cached denial, and who gave it; and where the check goes if neither.
    pub fn outcome(
        &mut self,
        host: &dyn Host,
        rule: &RuleRef,
        call: &ScriptCall,
        lease: bool,
    ) -> (Option<(Outcome, By)>, Route) {
        if lease {
            // By the worker's latest clock reading (see [`stash`](super::stash)): the local
            // path's one clock-free answer.
            let latest = self.timer.latest();
            if let Some(spent) = self.stashes.spend(&call.key, call.cost, latest) {
                return (Some((Outcome::leased(spent), By::Lease)), Route::Lease);
            }
        }
        self.shared_outcome(host, rule, call, lease)
    }

    /// [`LocalStage::outcome`] past this worker's stash: the proxy's pool and deny cache in
    /// shared data. Out of line, as `send_undecided`.
    #[inline(never)]
    fn shared_outcome(
        &mut self,
        host: &dyn Host,
        rule: &RuleRef,
        call: &ScriptCall,
        lease: bool,
    ) -> (Option<(Outcome, By)>, Route) {
        let now = self.timer.read(host);
        let store = host.store();
        let mut refilling = None;
        let mut route = Route::Exact;
        if lease {
            let why = match self.spend_leased(host, rule, call, now) {
                Ok(s) => return (Some((Outcome::leased(s), By::Lease)), Route::Lease),
                Err(why) => why,
            };
            let alone = self.sightings.goes_alone(&call.key);
            route = match why {
                NoLease::Refilling(later) => {
                    refilling = Some(later);
                    Route::Lease
                }
                NoLease::Unknown if alone => Route::Alone,
                NoLease::Unknown | NoLease::Spent => Route::Lease,
            };
        }
        let cached = DenyCache::new(store, &self.plugin.ns)
            .denial(&call.key, call.cost, now, call.penalty.is_some())
            .map(|(retry_ms, boxed)| {
                if boxed {
                    self.plugin.metrics.count(rule.id(), Counter::Penalized, 1);
                }
                (retry_ms, By::DenyCache)
            });
        let denied = cached
            .or(refilling.map(|retry_ms| (retry_ms, By::Lease)))
            .map(|(retry_ms, by)| (Outcome::Denied { retry_ms }, by));
        if lease && denied.is_some() {
            self.waits.unmet(&call.key, call.cost, now);
        }
        (denied, route)
    }

    /// Spends `call`'s cost from a batch moved out of the proxy's pool into this worker's stash;
    /// or says why it cannot.
    fn spend_leased(
        &mut self,
        host: &dyn Host,
        rule: &RuleRef,
        call: &ScriptCall,
        now: u64,
    ) -> Result<Spent, NoLease> {
        let metrics = &self.plugin.metrics;
        let pool = LeasePool::new(host.store(), &self.plugin.ns);
        let (room, gone) = self.stashes.room_for(&call.key, now);
        for (rule, key, back) in gone {
            give_back(&pool, metrics, (rule, &key, back), now);
        }
        let sizing = lease::sizing(rule, &call.limits());
        let back = self.stashes.hand_back(&call.key);
        match pool.take_batch(&call.key, call.cost, now, &sizing, (!room, back)) {
            Ok(Taken::Batch(batch)) if room => {
                Ok(self
                    .stashes
                    .keep((rule.id(), &call.key), &batch, call.cost, now))
            }
            // Exactly the cost, spent at once: nothing to keep.
            Ok(Taken::Batch(batch)) => Ok(Spent {
                remaining: batch.global_remaining,
                reset_ms: batch.reset_at_ms.saturating_sub(now),
                delay_ms: 0,
            }),
            // Held until the proxy's reservation has refilled its tokens.
            Ok(Taken::Held(spent)) => Ok(spent),
            Ok(Taken::Refilling(ms)) => Err(NoLease::Refilling(ms)),
            Ok(Taken::Miss) => Err(NoLease::Spent),
            // A failing store knows nothing either.
            Ok(Taken::Unknown) | Err(_) => Err(NoLease::Unknown),
        }
    }
}
