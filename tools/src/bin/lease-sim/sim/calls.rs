//! The script calls: what the engine dispatched, read back from its Webdis request (one key, or
//! several in the batched form), run against the bucket model (`tollgate_core::bucket`, the model
//! of the Lua script: a batch's keys in order, in one run) after half a random round trip, and
//! answered on the worker's root context after the other half.

use tollgate_core::bucket::{self, Ask, Holder, Limits};

use super::{Ev, Sim, UPSTREAM_US};
use crate::webdis::{parse_request, Form};
use crate::worker::ROOT;

/// One request to the backend: its worker, its token, its form and its keys' records (indices
/// into `Sim::calls`), run together and answered together.
#[derive(Debug, Clone)]
pub(super) struct Flight {
    pub(super) proxy: usize,
    pub(super) worker: usize,
    pub(super) token: u32,
    pub(super) form: Form,
    pub(super) calls: Vec<usize>,
    pub(super) lat_us: u64,
}

/// One key's script call (a single call, or one key of a batched one).
#[derive(Debug, Clone)]
pub(super) struct CallRec {
    pub(super) proxy: usize,
    pub(super) worker: usize,
    pub(super) carrier: u32,
    pub(super) key: String,
    pub(super) limits: Limits,
    pub(super) cost: u64,
    pub(super) want: u64,
    pub(super) holder: Option<Holder>,
    pub(super) max_wait_ms: u64,
    pub(super) settle: i64,
    pub(super) sent_us: u64,
    /// The bucket's answer, once Redis ran it; and the tokens it held just before.
    pub(super) reply: Option<(bucket::Reply, u64)>,
    pub(super) exec_us: u64,
}

impl Sim<'_> {
    pub(super) fn print_calls(&self) {
        let first = self.first_start.unwrap_or(0);
        println!(
            "  t ms     proxy.worker carrier  cost  want granted  held-before remaining  note"
        );
        for c in &self.calls {
            let t = c.sent_us.saturating_sub(first) as f64 / 1000.0;
            let (granted, before, remaining, allowed, retry) = match c.reply {
                Some((r, b)) => (r.granted, b, r.remaining, r.allowed, r.retry_after_ms),
                None => (0, 0, 0, false, 0),
            };
            let note = match (c.reply.is_some(), allowed) {
                (false, _) => "not answered".to_string(),
                (_, false) => format!("denied, retry in {retry} ms"),
                _ if retry > 0 => format!("reserved: refilled in {retry} ms"),
                _ => String::new(),
            };
            println!(
                "  {t:8.1}  {}.{}        {:<7} {:5} {:5} {:7} {:12} {:9}  {note}",
                c.proxy,
                c.worker,
                if c.carrier == ROOT { "root" } else { "request" },
                c.cost,
                c.want,
                granted,
                before,
                remaining
            );
        }
    }

    /// Carries out what the engine asked of the host during a callback.
    pub(super) fn after(&mut self, p: usize, w: usize) {
        let now = self.now_us;
        let asked = self.workers[p][w].drain();
        for (token, call) in asked.calls {
            let carrier = call.sent_during;
            let (form, groups) = parse_request(&call.body);
            let lat = self.rng.between(self.o.lat_min_us, self.o.lat_max_us);
            let f = self.flights.len();
            let mut calls = Vec::with_capacity(groups.len());
            for g in groups {
                calls.push(self.calls.len());
                self.key.get_or_insert(g.key.clone());
                self.calls.push(CallRec {
                    proxy: p,
                    worker: w,
                    carrier,
                    key: g.key,
                    limits: g.limits,
                    cost: g.ask.cost,
                    want: g.ask.lease_want,
                    holder: g.ask.holder,
                    max_wait_ms: g.ask.max_wait_ms,
                    settle: g.ask.settle,
                    sent_us: now,
                    reply: None,
                    exec_us: 0,
                });
            }
            self.flights.push(Flight {
                proxy: p,
                worker: w,
                token,
                form,
                calls,
                lat_us: lat,
            });
            self.workers[p][w].calls.insert(token, f);
            self.at(now + lat / 2, Ev::Exec(f));
        }
        for ctx in asked.resumed {
            self.at(now + UPSTREAM_US, Ev::Complete(p, w, ctx, 200));
        }
        for (ctx, status) in asked.responded {
            self.at(now + UPSTREAM_US, Ev::Complete(p, w, ctx, status));
        }
        if let Some((period, gen)) = asked.tick {
            self.at(now + period * 1000, Ev::Tick(p, w, gen));
        }
    }

    /// Redis runs the flight `f`: each key's call in order, each seeing the ones before.
    pub(super) fn exec(&mut self, f: usize) {
        for i in self.flights[f].calls.clone() {
            self.exec_call(i);
        }
        let lat = self.flights[f].lat_us;
        self.at(self.now_us + lat - lat / 2, Ev::Answer(f));
    }

    fn exec_call(&mut self, i: usize) {
        let call = &self.calls[i];
        let (state, mut holders) = self.bucket.get(&call.key).cloned().unwrap_or_default();
        let peek = &mut holders.clone();
        let before = bucket::take_held(state, peek, &call.limits, &Ask::default(), self.now_us)
            .1
            .remaining;
        let ask = Ask {
            cost: call.cost,
            lease_want: call.want,
            holder: call.holder,
            max_wait_ms: call.max_wait_ms,
            settle: call.settle,
            track: None,
        };
        let (state, reply) =
            bucket::take_held(state, &mut holders, &call.limits, &ask, self.now_us);
        self.bucket.insert(call.key.clone(), (state, holders));
        self.calls[i].reply = Some((reply, before));
        self.calls[i].exec_us = self.now_us;
    }

    pub(super) fn answer(&mut self, f: usize) {
        let flight = self.flights[f].clone();
        let (p, w) = (flight.proxy, flight.worker);
        let Some(replies) = flight
            .calls
            .iter()
            .map(|&i| self.calls[i].reply.map(|(r, _)| r))
            .collect::<Option<Vec<_>>>()
        else {
            return;
        };
        let wk = &mut self.workers[p][w];
        wk.calls.remove(&flight.token);
        wk.answer(self.now_us / 1000, flight.token, flight.form, &replies);
        self.after(p, w);
    }

    pub(super) fn tick(&mut self, p: usize, w: usize, gen: u64) {
        let now = self.now_us;
        if !self.workers[p][w].tick(now / 1000, gen) {
            return;
        }
        self.last_tick = now;
        self.after(p, w);
        if let Some(period) = self.workers[p][w].ticking(gen) {
            self.at(now + period * 1000, Ev::Tick(p, w, gen));
        }
    }
}
