//! The ledger of a load: the global bucket's level and the leased tokens held at any moment, and,
//! at the end, the load's figures (run.rs) from what the engines counted and the calls recorded.

use tollgate_core::bucket::{self, Ask};
use tollgate_core::metrics::Counter;
use tollgate_core::shared::lease::LeasePool;

use super::Sim;
use crate::ideal;
use crate::run::{Run, Window, WINDOWS_MS};
use crate::worker::ROOT;

impl Sim<'_> {
    /// Whole tokens in the global bucket at `t_us` (without changing it).
    pub(super) fn level(&self, t_us: u64) -> u64 {
        let Some(key) = &self.key else {
            return self.o.burst;
        };
        let (state, mut holders) = self.bucket.get(key).cloned().unwrap_or_default();
        bucket::take_held(state, &mut holders, &self.limits, &Ask::default(), t_us)
            .1
            .remaining
    }

    /// Tokens in the global bucket at `t_us` (the last counted completion), negative while it is
    /// in debt (reservations).
    pub(super) fn signed_level(&self, t_us: u64) -> f64 {
        match bucket::take(self.end_state, &self.limits, 0, 0, 0, 0, t_us).0 {
            Some(st) => st.units as f64 / st.per_token as f64,
            None => self.o.burst as f64,
        }
    }

    /// Live leased tokens in every pool and stash at `t_us`.
    pub(super) fn held(&self, t_us: u64) -> u64 {
        let Some(key) = &self.key else {
            return 0;
        };
        let now_ms = t_us / 1000;
        let mut held = 0;
        for (p, ws) in self.workers.iter().enumerate() {
            let ns = &ws[0].engine.plugin().ns;
            if let Some(l) = LeasePool::new(&*self.stores[p], ns).peek(key) {
                held += l.live_tokens(now_ms);
            }
            for wk in ws {
                if let Some((tokens, expires)) = wk.engine.stashed(key) {
                    if now_ms < expires {
                        held += tokens;
                    }
                }
            }
        }
        held
    }

    pub(super) fn finish(mut self) -> Run {
        let first = self.first_start.unwrap_or(0);
        let t_end = self.last_end.max(first);
        let o = self.o;
        let mut r = std::mem::take(&mut self.run);
        let secs = (t_end - first) as f64 / 1e6;
        r.ideal = o.burst as f64 + o.rate as f64 * secs;
        r.in_bucket_end = self.signed_level(t_end);
        r.mean_bucket = self.bucket_samples.0 / self.bucket_samples.1.max(1) as f64;
        r.mean_held = self.held_samples / self.bucket_samples.1.max(1) as f64;
        for ws in &self.workers {
            for wk in ws {
                // Counts still batched in the engine (a real worker pushes them at its next tick).
                wk.engine.plugin().metrics.flush();
                r.dropped += wk.rec.get(0, Counter::LeaseDropped);
                r.local_denied += wk.rec.get(0, Counter::LocalDenied);
            }
        }
        // Every admission the engine made spent a granted token; some were answered after the
        // load's last counted completion.
        let allowed: u64 = self
            .workers
            .iter()
            .flatten()
            .map(|wk| wk.rec.get(0, Counter::Allowed))
            .sum();
        r.spent_after = allowed.saturating_sub(r.admitted);
        for c in &self.calls {
            let Some((reply, before)) = c.reply else {
                continue;
            };
            if c.exec_us > t_end {
                continue;
            }
            r.calls += 1;
            r.calls_per_proxy[c.proxy] += 1;
            r.granted += reply.granted;
            if before >= c.limits.burst {
                r.at_full += 1;
            }
            if c.carrier == ROOT {
                r.from_root += 1;
            }
            if c.want == 0 {
                r.exact += 1;
            } else if !reply.allowed {
                r.lease_denied += 1;
            } else if reply.retry_after_ms > 0 {
                r.lease_reserved += 1;
            } else if reply.granted < c.want.max(c.cost) {
                r.lease_partial += 1;
            } else {
                r.lease_full += 1;
            }
        }
        r.held_end = self.end_held;
        r.worst = self.worst_window();
        r.perfect = self.perfect();
        r.ticks_after_ms = self.last_tick.saturating_sub(t_end) as f64 / 1000.0;
        // Tokens granted ahead of the refill (reserved) are not part of the ideal yet.
        let ahead = (-r.in_bucket_end).max(0.0);
        r.held_end_refilled = r.held_end as f64 - ahead;
        r.overflow = r.ideal - (r.granted as f64 - ahead) - r.in_bucket_end.max(0.0);
        r
    }

    /// What one token bucket with the rule's limits, answering every request the moment it
    /// reached its proxy, would have admitted of the requests counted.
    pub(super) fn perfect(&self) -> u64 {
        let mut arrivals = self.arrivals.clone();
        arrivals.sort_unstable();
        ideal::perfect(&arrivals, self.o.burst, self.o.rate)
    }

    /// Of every window of each length in [`WINDOWS_MS`] that starts at an admission, the one with
    /// the most admissions over the bound burst + rate × W (the first such, shortest first).
    pub(super) fn worst_window(&self) -> Window {
        let mut admits = self.admits.clone();
        admits.sort_unstable();
        let first = self.first_start.unwrap_or(0);
        let mut worst = Window {
            bound: f64::INFINITY,
            ..Window::default()
        };
        for len_ms in WINDOWS_MS {
            let Some((start, admitted)) = ideal::fullest(&admits, len_ms) else {
                continue;
            };
            let w = Window {
                start_ms: admits[start].saturating_sub(first) as f64 / 1000.0,
                len_ms,
                admitted,
                bound: self.o.burst as f64 + self.o.rate as f64 * len_ms as f64 / 1000.0,
            };
            if w.excess() > worst.excess() {
                worst = w;
            }
        }
        worst
    }
}
