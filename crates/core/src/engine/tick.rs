//! The worker's time: its latest reading of the host's clock, and the tick it asks of the host,
//! which runs only while something is due.
//!
//! Invariant: the tick is on exactly while some deadline is pending (a held request, a lease
//! wait's patience or a key polled for another worker's call, a forwarded check, a usage flush,
//! a stash's expiry, batched counts to push), at the period of the nearest one; outside a tick it
//! is only ever brought forward, so a busy worker does not re-arm the host's timer per request.

use super::host::Host;
use super::lease::give_back;
use super::Engine;
use crate::metrics::METRICS_FLUSH_MS;
use crate::shared::lease::LeasePool;

/// The shortest tick period the host is asked for (ms): a deadline already past is served at the
/// next tick.
const MIN_TICK_MS: u64 = 1;

/// The worker's clock reading and tick period.
#[derive(Debug, Default)]
pub(super) struct Timer {
    /// The latest time this worker read from the host's clock ([`Timer::read`]). A request
    /// admitted from the worker's stash reads no clock of its own: it goes by this one.
    clock_ms: u64,
    /// The tick period asked of the host (0: off).
    tick_ms: u64,
    /// When that tick fires next (as of the clock reading it was asked or last fired at).
    tick_next_ms: u64,
}

impl Timer {
    /// The host's clock, read now, and kept as the worker's latest reading.
    pub fn read(&mut self, host: &dyn Host) -> u64 {
        let now = host.now_ms();
        self.clock_ms = self.clock_ms.max(now);
        now
    }

    /// The worker's latest clock reading (no host call).
    pub fn latest(&self) -> u64 {
        self.clock_ms
    }

    /// Keeps the tick at the period that fires at `next` (off if None). Outside a tick the tick
    /// is only ever brought forward, and only when something is due before it fires anyway: a
    /// deadline that stays put does not re-arm it at every event. The host starts its tick over
    /// when it is set, so a tick brought forward is aimed from the clock, not from `now`: that
    /// may be an old reading (a request admitted from a stash reads none), and a tick aimed from
    /// it would fire late by its age, later even than the one it replaced (a stash's expiry,
    /// after which the stash would still be spent).
    fn aim(&mut self, host: &mut dyn Host, now: u64, in_tick: bool, next: Option<u64>) {
        let want_from = |now: u64| next.map_or(0, |due| due.saturating_sub(now).max(MIN_TICK_MS));
        let sooner = |timer: &Timer, now: u64, want: u64| {
            want != 0 && (timer.tick_ms == 0 || now.saturating_add(want) < timer.tick_next_ms)
        };
        let (mut now, mut want) = (now, want_from(now));
        let change = if in_tick {
            want != self.tick_ms
        } else if sooner(self, now, want) {
            now = self.read(&*host);
            want = want_from(now);
            sooner(self, now, want)
        } else {
            false
        };
        if change {
            host.set_tick(want);
            self.tick_ms = want;
        }
        if change || in_tick {
            self.tick_next_ms = now.saturating_add(self.tick_ms);
        }
    }
}

/// The earlier of two optional deadlines.
fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Engine {
    /// The periodic tick of the worker's root context.
    pub fn tick(&mut self, host: &mut dyn Host) {
        let now = self.timer.read(host);
        let metrics = &self.plugin.metrics;
        // An expired stash's batch goes back to the pool: the proxy no longer holds it, and its
        // unspent tokens are the pool's again while the key's lease lives (else they are dropped).
        let pool = LeasePool::new(host.store(), &self.plugin.ns);
        self.stashes.expire(now, |rule, key, back| {
            give_back(&pool, metrics, (rule, key, back), now)
        });
        while let Some(ctx) = self.requests.pop_held(now) {
            host.resume(ctx);
        }
        self.expire_waiters(host, now);
        self.expire_forwarded(host, now);
        self.poll_leases(host, now);
        self.defer_flushes_while_open(host, now);
        self.flush_settlements(host, now);
        self.schedule(host, now, true);
    }

    /// Keeps the tick running at the period of the nearest deadline, and off when nothing is due.
    /// Outside a tick it only ever shortens the period (so a busy worker does not re-arm the
    /// timer on every request). Every event that can count ends here: batched counts are pushed
    /// to the host once due, and keep a tick coming until they are; and the worker's open batch
    /// goes out if it may.
    pub(super) fn schedule(&mut self, host: &mut dyn Host, now: u64, in_tick: bool) {
        self.flush_open(host);
        std::mem::take(&mut self.answers).send(host);
        // Outside a tick, pending counts only need some tick at most `METRICS_FLUSH_MS` apart
        // (the tick then aims at their deadline): asking for the time left would shorten the
        // period again on every request as the deadline nears.
        let mut next = self.plugin.metrics.flush_if_due(now).map(|due| {
            if in_tick {
                due
            } else {
                now.saturating_add(METRICS_FLUSH_MS)
            }
        });
        // Deadlines of lease waits that ended meanwhile are nothing to watch.
        self.waits.drop_ended_patience();
        next = earliest(next, self.waits.next_due(now));
        next = earliest(next, self.usage.next_flush());
        next = earliest(next, self.chains.next_deadline());
        next = earliest(next, self.requests.next_held());
        next = earliest(next, self.stashes.next_expiry());
        self.timer.aim(host, now, in_tick, next);
    }
}
