//! The per-worker request engine: Envoy's callbacks come in as events (`request_headers`,
//! `call_response`, `tick`, `response_headers`, `done`), and the engine answers through the
//! [`Host`] trait (dispatch, resume, respond, add headers, tick period, shared data).
//!
//! Invariant: the engine owns every paused request by context id, and every paused request is
//! resumed or answered exactly once: each of its checks gets an outcome from the local stage, a
//! backend answer, a failed or refused call (the failure mode), or its patience running out
//! (twice the backend timeout, for lease waits whose call was lost or never came: from the wait's
//! arrival, or from the send of its worker's own lease call for the key, whose answer or timeout
//! ends the wait; four timeouts from arrival at most). A request whose client went away (`done`)
//! is forgotten and never touched again.
//!
//! Lease checks wait per key ([`lease`]): one call per key per proxy, served when its tokens
//! arrive, not by polling; the tick runs only while something is due (a held request, a
//! patience deadline, another worker's lease call on a key waited for here, counts waiting to be
//! pushed to the host).
//!
//! The engine composes components that own their state — the requests ([`requests`]), the calls
//! in flight ([`calls`]), the lease waits ([`lease`]), the exact calls shared by a hot key
//! ([`coalesce`]), the response usage ([`usage`]), the worker's leased tokens ([`stash`]), the
//! keys seen lately ([`sightings`]), the clock and tick ([`tick`]) — and routes each event
//! through them: the local stage ([`local`]), deciding a request ([`decide`]), sending calls
//! ([`send`]). No component reaches into another's state.

mod batch;
mod calls;
mod coalesce;
mod compaction;
mod cost;
mod decide;
pub mod decision;
mod handover;
pub mod health;
mod host;
mod ids;
mod lease;
mod local;
pub mod plugin;
mod refund;
mod requests;
mod rules;
mod send;
mod sightings;
mod stash;
pub mod testkit;
mod tick;
pub mod usage;
mod verdict;

use crate::backend::{Answer, BackendError, Reply};
use crate::metrics::Metrics;
use crate::rule::{KeyCache, RequestView};

use calls::Purpose;
use requests::Request;

pub use cost::{bad_cost, cost_of, parse_cost, CostError, BAD_COST_STATUS};
pub use handover::Pending;
pub use host::{Action, Host};
pub use ids::{ById, CheckId, ContextId, IdHasher, Token};
pub use plugin::{Plan, Plugin};
pub use rules::{RuleId, RuleRef, Rules};
pub use usage::{Chunk, Look};
pub use verdict::{
    is_grpc, verdict, Admit, LocalReply, Outcome, Shown, Source, Verdict,
    BACKEND_UNAVAILABLE_STATUS, GRPC_RESOURCE_EXHAUSTED, GRPC_UNAVAILABLE,
};

/// The engine of one worker (one plugin configuration).
pub struct Engine {
    plugin: Plugin,
    requests: requests::Requests,
    calls: calls::Calls,
    /// The calls that go out together in the worker's next flight.
    open: batch::OpenBatch,
    /// A [`coalesce::LEAVE`] note is on this worker's queue: the open batch leaves when it comes.
    leaving: bool,
    /// The worker's last flight from its open batch had company: several calls, or calls that
    /// waited behind a flight. Only then does an idle worker's open batch wait for the end of
    /// the round (see `flush_open`).
    company: bool,
    /// Whether the backend is known to be a Redis Cluster (one slot per flight).
    cluster_known: bool,
    /// Bucket keys of recently seen key values (a hot key's requests skip the digest).
    keys: KeyCache,
    waits: lease::Waits,
    stashes: stash::Stashes,
    sightings: sightings::Sightings,
    chains: coalesce::Chains,
    /// Whether this worker is the proxy's collector (other workers relay their checks to it).
    collecting: bool,
    /// Answers to other workers' relayed checks, sent at the end of the event.
    answers: coalesce::Answers,
    usage: usage::Usage,
    timer: tick::Timer,
    /// Where response headers are written (kept: its capacity is reused).
    header_buf: String,
    /// Where a request's decision record is written (kept: its capacity is reused).
    record: String,
}

impl Engine {
    pub fn new(plugin: Plugin) -> Engine {
        Engine {
            plugin,
            requests: requests::Requests::default(),
            calls: calls::Calls::default(),
            open: batch::OpenBatch::default(),
            leaving: false,
            company: false,
            cluster_known: false,
            keys: KeyCache::default(),
            waits: lease::Waits::default(),
            stashes: stash::Stashes::default(),
            sightings: sightings::Sightings::default(),
            chains: coalesce::Chains::default(),
            collecting: false,
            answers: coalesce::Answers::default(),
            usage: usage::Usage::default(),
            timer: tick::Timer::default(),
            header_buf: String::new(),
            record: String::new(),
        }
    }

    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// Requests, calls and waiters the engine holds (for tests and the idle check).
    pub fn load(&self) -> (usize, usize, usize) {
        (self.requests.len(), self.calls.len(), self.waits.waiters())
    }

    /// Leased tokens this worker holds in its stash for bucket `key`, and when they expire (for
    /// the lease simulator's account of where tokens went).
    pub fn stashed(&self, key: &str) -> Option<(u64, u64)> {
        self.stashes.held(key)
    }

    // ----- events -----

    /// A request's headers: decide what can be decided locally, send what needs the backend.
    pub fn request_headers(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        req: &dyn RequestView,
    ) -> Action {
        self.requests.begin_headers(ctx);
        self.decide_headers(host, ctx, req);
        // A check whose flight cannot leave gets its failure mode now, in this callback.
        self.flush_open(host);
        let decided = self.requests.end_headers();
        // The time this request read, or, if it read none (the stash admitted it), the worker's
        // latest reading: all it can have added is counts; a tick brought forward for them is
        // aimed from the clock (`Timer::aim`), never later than the tick it replaces.
        self.schedule(host, self.timer.latest(), false);
        decided.unwrap_or(Action::Pause)
    }

    /// The answer to flight `token` (the host delivers it on the root context, whichever callback
    /// sent it): each call it carried gets its own part.
    pub fn call_response(&mut self, host: &mut dyn Host, token: u32, answer: &Answer) {
        let Some(flight) = self.calls.answered(Token::from(token)) else {
            return;
        };
        let now = self.timer.read(host);
        let transport = &self.plugin.transport;
        let decoded = if flight.size == 1 {
            transport.decode(answer).map(|r| vec![Ok(r)])
        } else {
            transport.decode_batch(answer, flight.size, &flight.asks)
        };
        if matches!(decoded, Err(BackendError::NoScript)) && !flight.with_source {
            self.resend_with_source(host, flight, now);
            self.schedule(host, now, false);
            return;
        }
        // Refused for its keys' slots, or failed by one key's node: nothing ran, or not for every
        // key. The calls go again, one slot (or one key) per flight. A flight of one slot already
        // (which a Redis Cluster never refuses so) goes again key by key, not as itself forever.
        let again = match &decoded {
            Err(BackendError::CrossSlot) if flight.size > 1 => Some(if send::one_slot(&flight) {
                send::Apart::Alone
            } else {
                send::Apart::BySlot
            }),
            Err(e) if flight.size > 1 && send::concerns_one_node(e) => Some(send::Apart::Alone),
            _ => None,
        };
        if let Some(apart) = again {
            let mut calls: Vec<_> = flight.calls.into_iter().map(|(_, c)| c).collect();
            // A script that may have run gave a refund back already: it goes no second time,
            // nor does a call that carried nothing else.
            if decoded.as_ref().is_err_and(BackendError::may_have_run) {
                for c in &mut calls {
                    self.refund_may_have_run(&c.rule, &mut c.call);
                }
                calls.retain(|c| !matches!(c.purpose, Purpose::Settle) || c.call.settles());
            }
            if apart == send::Apart::BySlot {
                self.learn_cluster(host);
            }
            self.send_apart_again(host, calls, apart, now);
            if flight.batched {
                // None may have gone again: no flight of the open batch may be out any more.
                self.stop_collecting(host);
            }
            self.schedule(host, now, false);
            return;
        }
        let replies: Vec<Result<Reply, BackendError>> = match decoded {
            Ok(mut each) => flight
                .calls
                .iter()
                .map(|(at, c)| {
                    let reply = each.get_mut(*at).map_or_else(
                        || Err(BackendError::Malformed("no answer for a call".to_string())),
                        |r| std::mem::replace(r, Err(BackendError::Reset)),
                    );
                    reply.and_then(|r| crate::backend::reply_to(&c.call, r))
                })
                .collect(),
            Err(e) => flight.calls.iter().map(|_| Err(e.clone())).collect(),
        };
        // The backend's health learns of the flight once: a script reply for any of its calls
        // says the backend serves (one key's own error, e.g. a key that is not a hash, is that
        // key's); else its first failure.
        let served = replies.iter().any(Result::is_ok);
        let failure = replies
            .iter()
            .find_map(|r| r.as_ref().err())
            .filter(|_| !served);
        self.feed_health(host, failure.map_or(Ok(()), Err), now);
        for ((_, call), reply) in flight.calls.into_iter().zip(replies) {
            self.plugin
                .metrics
                .latency(call.rule.id(), now.saturating_sub(call.sent_ms));
            if let Err(e) = &reply {
                self.count_failure(&call.rule, e);
                self.settlement_failed(host, &call.rule, &call.call, e.may_have_run(), now);
            }
            self.call_answered(host, call, reply, now);
        }
        if flight.batched {
            // What gathered while this flight was out leaves now, whatever other flights are.
            self.dispatch_open_now(host);
            self.stop_collecting(host);
        }
        self.schedule(host, now, false);
    }

    /// What the answer to one call of a flight means for its purpose.
    fn call_answered(
        &mut self,
        host: &mut dyn Host,
        call: calls::Call,
        reply: Result<Reply, BackendError>,
        now: u64,
    ) {
        match call.purpose {
            Purpose::Check { ctx, check } => {
                // No longer waited for: another rule refused its request, or the request is
                // gone. It never goes upstream, so what this answer took goes back.
                let late = !self.requests.is_waiting(ctx, check);
                match reply {
                    Ok(r) => {
                        let outcome = (
                            self.reply_outcome(host, &call.rule, &call.call, &r, call.sent_ms),
                            decision::By::Redis,
                        );
                        self.exact_answered(host, (&call.rule, &call.call), &r, now);
                        if late {
                            let of = (&call.rule, &call.call);
                            self.refund_late(host, of, outcome, call.call.cost);
                        } else {
                            self.settle(host, ctx, check, outcome);
                        }
                    }
                    Err(_) if late => {}
                    Err(e) => {
                        let outcome = self.failure_outcome(host, &call.rule, &call.call, &e, now);
                        self.settle(host, ctx, check, outcome);
                    }
                }
                self.own_call_over(host, &call.call, now);
            }
            Purpose::Batch(checks) => {
                let asked = (&call.rule, &call.call);
                self.batch_answer(host, asked, checks, reply, call.sent_ms, now);
                self.chain_next(host, &call.call.key, now);
            }
            Purpose::Adopted(checks) => {
                let asked = (&call.rule, &call.call);
                self.batch_answer(host, asked, checks, reply, call.sent_ms, now);
            }
            Purpose::Settle => {}
            Purpose::Relayed { queue, ask } => {
                self.relayed_answer(host, &call, (queue, ask), reply.as_ref().ok());
            }
            Purpose::Lease(claim) => {
                let answer = (reply, call.sent_ms);
                self.lease_answer(host, &call.rule, claim, &call.call, answer, now);
            }
        }
    }

    /// The response headers of `ctx` (read through `response`): add the rate-limit headers kept
    /// for it, and read usage from a header. How much of each chunk of the body the engine looks
    /// at, if it wants to see the body.
    pub fn response_headers(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        response: &dyn RequestView,
    ) -> Option<Look> {
        let r = self.requests.get_mut(ctx)?;
        if let Some(shown) = r.take_headers() {
            let written = self.plugin.write_headers(&shown, &mut self.header_buf);
            if !written.is_empty() {
                let pairs = written.pairs(&self.header_buf);
                host.add_response_headers(ctx, written.headers(&pairs));
            }
        }
        if r.usage().is_empty() {
            return None;
        }
        self.usage_from_headers(host, ctx, response, false)
    }

    /// A chunk of the response body of `ctx` (`end`: the last one), or as much of it as
    /// `response_headers` said its readers look at. Only looked at.
    pub fn response_body(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        chunk: Chunk<'_>,
        end: bool,
    ) {
        self.usage_from_body(host, ctx, Some(chunk), end);
    }

    /// A chunk of the response body of `ctx` that the host could not give (`end`: the last one):
    /// a usage read from the body is charged the worst case.
    pub fn response_body_lost(&mut self, host: &mut dyn Host, ctx: ContextId, end: bool) {
        self.usage_from_body(host, ctx, None, end);
    }

    /// The response trailers of `ctx`: a usage header may come there.
    pub fn response_trailers(
        &mut self,
        host: &mut dyn Host,
        ctx: ContextId,
        trailers: &dyn RequestView,
    ) {
        self.usage_from_headers(host, ctx, trailers, true);
    }

    /// Context `ctx` is gone (the client went away, or the request ended): forget it, settling
    /// the usage its response has not reported yet. Calls it sent stay out: the host owns every
    /// callout on the root context and answers it there even after the request that sent it is
    /// gone (proxy-wasm-cpp-host `http_call` and Higress' Redis calls), so their grants still
    /// serve the other waiters and the pool.
    pub fn done(&mut self, host: &mut dyn Host, ctx: ContextId) {
        let still_held = self.requests.is_held(ctx);
        let Some(request) = self.requests.remove(ctx) else {
            return;
        };
        match request {
            Request::Admitted { usage, held, .. } => {
                // A request still held for its reservation never went upstream: what it paid
                // goes back, and its usage settles nothing else.
                if still_held {
                    self.refund(host, held);
                    return;
                }
                if !usage.is_empty() {
                    self.usage_at_end(host, ctx, usage);
                }
            }
            Request::Deciding(checks) => {
                // Gone before its verdict: what its answered checks took goes back (the answers
                // still out are refunded as they come, see `call_response`).
                self.refund(host, refund::of_checks(&checks));
                if self.leave_waits(ctx, &checks) {
                    let now = self.timer.read(host);
                    self.schedule(host, now, false);
                }
            }
        }
    }
}

/// A verdict for a debug log line: status and rate-limit headers (rule names and numbers only,
/// never request values).
fn describe(v: &Verdict) -> String {
    match v {
        Verdict::Allow(shown) => format!("allow after {} ms [{:?}]", shown.delay_ms, shown.admit),
        Verdict::Respond(r) => {
            let hs: Vec<String> = r.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            format!("answer {} [{}]", r.status, hs.join("; "))
        }
    }
}

#[cfg(test)]
mod tests;
