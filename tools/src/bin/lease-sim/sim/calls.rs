//! The script calls: what the engine dispatched, read back from its Webdis request, run against
//! the bucket model (`tollgate_core::bucket`, the model of the Lua script) after half a random
//! round trip, and answered on the worker's root context after the other half.

use tollgate_core::backend::{Answer, Payload};
use tollgate_core::bucket::{self, Ask, Holder, Limits};

use super::{Ev, Sim, UPSTREAM_US};
use crate::worker::ROOT;

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
    pub(super) lat_us: u64,
    /// The bucket's answer, once Redis ran it; and the tokens it held just before.
    pub(super) reply: Option<(bucket::Reply, u64)>,
    pub(super) exec_us: u64,
}
/// Undoes the Webdis percent-encoding of one argument.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// A script call as the engine sent it (the Webdis request's body): its bucket key, the limits and
/// what it asks of the bucket.
pub(crate) fn parse_call(text: &str) -> (String, Limits, Ask) {
    let parts: Vec<&str> = text.split('/').collect();
    let num = |i: usize| parts[i].parse::<u64>().unwrap();
    let key = unescape(parts[3]);
    let lease: Vec<u64> = unescape(parts[8])
        .split(':')
        .map(|n| n.parse().unwrap())
        .collect();
    let limits = Limits {
        burst: num(4),
        rate: num(5),
        period_ms: num(6),
    };
    let ask = Ask {
        cost: num(7),
        lease_want: lease[0],
        holder: (lease.len() > 1).then(|| {
            let steps: Vec<(u64, u64)> = lease[4..].chunks(2).map(|c| (c[0], c[1])).collect();
            Holder::new(lease[1], lease[2], lease[3], &steps)
        }),
        max_wait_ms: num(9),
        settle: parts[10].parse().unwrap(),
    };
    (key, limits, ask)
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
        let wk = &mut self.workers[p][w];
        let host = &mut wk.host;
        // The calls go to Redis; what the host logged for the tests is not needed here.
        let out = std::mem::take(&mut host.out);
        host.sent.clear();
        host.added.clear();
        host.decisions.clear();
        let resumed = std::mem::take(&mut host.resumed);
        let responded = std::mem::take(&mut host.responded);
        // The tick period, if the engine asked for one during the callback.
        let tick = (host.tick_sets > 0).then_some(host.tick);
        host.tick_sets = 0;
        for (token, call) in out {
            let carrier = call.sent_during;
            let (key, limits, ask) = parse_call(&call.body);
            let lat = self.rng.between(self.o.lat_min_us, self.o.lat_max_us);
            let idx = self.calls.len();
            self.calls.push(CallRec {
                proxy: p,
                worker: w,
                carrier,
                key: key.clone(),
                limits,
                cost: ask.cost,
                want: ask.lease_want,
                holder: ask.holder,
                max_wait_ms: ask.max_wait_ms,
                settle: ask.settle,
                sent_us: now,
                lat_us: lat,
                reply: None,
                exec_us: 0,
            });
            self.key.get_or_insert(key);
            self.workers[p][w].calls.insert(token, idx);
            self.at(now + lat / 2, Ev::Exec(idx));
        }
        for ctx in resumed {
            self.at(now + UPSTREAM_US, Ev::Complete(p, w, ctx, 200));
        }
        for (ctx, reply) in responded {
            self.at(now + UPSTREAM_US, Ev::Complete(p, w, ctx, reply.status));
        }
        if let Some(period) = tick {
            let wk = &mut self.workers[p][w];
            wk.tick_ms = period;
            wk.tick_gen += 1;
            let gen = wk.tick_gen;
            if period > 0 {
                self.at(now + period * 1000, Ev::Tick(p, w, gen));
            }
        }
    }

    pub(super) fn exec(&mut self, i: usize) {
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
        };
        let (state, reply) =
            bucket::take_held(state, &mut holders, &call.limits, &ask, self.now_us);
        self.bucket.insert(call.key.clone(), (state, holders));
        let lat = call.lat_us;
        self.calls[i].reply = Some((reply, before));
        self.calls[i].exec_us = self.now_us;
        self.at(self.now_us + lat - lat / 2, Ev::Answer(i));
    }

    pub(super) fn answer(&mut self, i: usize) {
        let call = self.calls[i].clone();
        let (p, w) = (call.proxy, call.worker);
        let Some((reply, _)) = call.reply else {
            return;
        };
        let token = {
            let wk = &self.workers[p][w];
            *wk.calls.iter().find(|(_, &c)| c == i).unwrap().0
        };
        let now = self.now_us;
        let wk = &mut self.workers[p][w];
        wk.calls.remove(&token);
        let body = format!(
            r#"{{"EVALSHA":[{},{},{},{},{}]}}"#,
            u8::from(reply.allowed),
            reply.remaining,
            reply.retry_after_ms,
            reply.reset_after_ms,
            reply.granted
        );
        wk.host.now = now / 1000;
        // On the root context, whichever callback sent it.
        wk.host.current = ROOT;
        let answer = Answer::Http {
            status: 200,
            body: Payload::Read(body.into_bytes()),
        };
        wk.engine.call_response(&mut wk.host, token, &answer);
        self.after(p, w);
    }

    pub(super) fn tick(&mut self, p: usize, w: usize, gen: u64) {
        let now = self.now_us;
        let wk = &mut self.workers[p][w];
        if gen != wk.tick_gen || wk.tick_ms == 0 {
            return;
        }
        wk.host.now = now / 1000;
        wk.host.current = ROOT;
        wk.engine.tick(&mut wk.host);
        self.last_tick = now;
        self.after(p, w);
        let wk = &self.workers[p][w];
        if wk.tick_gen == gen && wk.tick_ms > 0 {
            let next = now + wk.tick_ms * 1000;
            self.at(next, Ev::Tick(p, w, gen));
        }
    }
}
