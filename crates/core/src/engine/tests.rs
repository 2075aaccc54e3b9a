//! The engine against a fake host that keeps the real host's semantics ([`super::testkit`], the
//! one the lease simulator runs on too): shared data with CAS and no empty values, callout tokens,
//! answers delivered later on the root context (whichever callback sent the call), a tick that
//! fires only when asked for.

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;

use super::testkit::FakeHost as Fake;
use super::*;
use crate::config::Config;
use crate::metrics::{Batched, Counter, Recorder, METRICS_FLUSH_MS};
use crate::shared::lease::{LeasePool, Unmet};

/// `request_headers` of `r` as `ctx`, with `r`'s headers kept readable later, as the host keeps
/// a paused request's.
fn send(e: &mut Engine, h: &mut Fake, ctx: u32, r: &Req) -> Action {
    h.request_headers.insert(ctx, r.0.clone());
    e.request_headers(h, ctx.into(), r)
}

struct Req(HashMap<String, Vec<u8>>);

impl RequestView for Req {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.0.get(name).map(|v| Cow::Borrowed(v.as_slice()))
    }
    fn client_ip(&self) -> Option<Vec<u8>> {
        Some(b"10.0.0.1".to_vec())
    }
}

fn req(path: &str, headers: &[(&str, &str)]) -> Req {
    let mut m: HashMap<String, Vec<u8>> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
    m.insert(":path".into(), path.as_bytes().to_vec());
    m.insert(":method".into(), b"GET".to_vec());
    Req(m)
}

/// Response headers (or trailers).
fn resp(headers: &[(&str, &str)]) -> Req {
    Req(headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect())
}

fn user(u: &str) -> Req {
    req("/api/x", &[("x-user", u)])
}

/// A plugin whose calls go to Webdis in every build (the tests read and answer Webdis calls; the
/// Higress build's RESP transport has its own tests in `backend::resp` and `tests/higress.rs`).
///
/// Unless `top` sets `backend.batch_max_keys`, every call goes in a flight of its own
/// (`batch_max_keys: 1`), so a test reads and answers each check's call on its own; the tests of
/// `batch` set it.
fn webdis_plugin(top: &str, rules: &str, rec: &Rc<Recorder>) -> Plugin {
    let json = format!(r#"{{{top} "rules":[{rules}]}}"#);
    let mut doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let backend = doc
        .as_object_mut()
        .unwrap()
        .entry("backend")
        .or_insert_with(|| serde_json::json!({}));
    if backend.get("batch_max_keys").is_none() {
        backend["batch_max_keys"] = 1.into();
    }
    let config = Config::try_from(doc.to_string().as_bytes()).unwrap();
    let webdis = crate::backend::webdis::Webdis::new(
        &config.backend.authority,
        config.backend.basic_auth.as_deref(),
    );
    Plugin::with_transport(config, Box::new(rec.clone()), Box::new(webdis))
}

/// An engine whose counts are batched as a real worker's: they reach the recorder only when the
/// engine flushes them.
fn batched_engine(top: &str, rules: &str) -> (Engine, Rc<Recorder>) {
    let rec = Rc::new(Recorder::default());
    let plugin = webdis_plugin(top, rules, &rec);
    (Engine::new(plugin), rec)
}

fn engine(top: &str, rules: &str) -> (Engine, Rc<Recorder>) {
    let rec = Rc::new(Recorder::default());
    let mut plugin = webdis_plugin(top, rules, &rec);
    // These tests read the counts right after driving the engine: a table of no rules passes
    // each count through at once. `batched_engine` keeps the batching of a real worker.
    plugin.metrics = Batched::new(Box::new(rec.clone()), 0);
    (Engine::new(plugin), rec)
}

const EXACT: &str = r#"{"name":"per-user","key":["header:x-user"],"rate":10,"burst":20,
    "cost_header":"x-cost"}"#;
const LEASE: &str = r#"{"name":"hot","key":["header:x-user"],"mode":"lease","rate":100,
    "burst":50,"lease_max":20}"#;

/// Webdis' answer to a script call.
fn answer(allowed: bool, remaining: u64, retry: i64, reset: u64, granted: u64) -> Vec<u8> {
    format!(
        r#"{{"EVALSHA":[{},{remaining},{retry},{reset},{granted}]}}"#,
        u8::from(allowed)
    )
    .into_bytes()
}

/// The spill epoch and mark the engine tests' Redis answers with.
const EPOCH: u64 = 1_700_000_000_000_000;
const MARK: u64 = 1000;

/// `reply` to the Webdis command `request` as the script gives it: a 7th and 8th integer (the
/// epoch and the mark) for each call in the tracked form (its settle argument, the 7th, holds an
/// encoded ':'). A reply that is not plain integers, or already has them, stays as it is.
fn with_epochs(request: &str, reply: &[u8]) -> Vec<u8> {
    let tracked = |args: &[&str]| args.get(6).is_some_and(|a| a.contains("%3A"));
    let parts: Vec<&str> = request.split('/').collect();
    let n: usize = parts.get(2).and_then(|n| n.parse().ok()).unwrap_or(0);
    let rest = parts.get(3 + n..).unwrap_or_default();
    let asks: Vec<bool> = if rest.first() == Some(&"batch") {
        let mut asks = Vec::new();
        let mut at = 1;
        while let Some(c) = rest.get(at).and_then(|c| c.parse::<usize>().ok()) {
            // A count 0: the previous key's arguments again.
            let asked = match c {
                0 => asks.last().copied().unwrap_or(false),
                _ => tracked(rest.get(at + 1..at + 1 + c).unwrap_or_default()),
            };
            asks.push(asked);
            at += 1 + c;
        }
        asks
    } else {
        vec![tracked(rest)]
    };
    let Ok(text) = std::str::from_utf8(reply) else {
        return reply.to_vec();
    };
    let Some((head, ints)) = text.split_once(":[") else {
        return reply.to_vec();
    };
    let Some(ints) = ints.strip_suffix("]}") else {
        return reply.to_vec();
    };
    let Ok(ints) = ints
        .split(',')
        .map(str::parse)
        .collect::<Result<Vec<i64>, _>>()
    else {
        return reply.to_vec();
    };
    let out: Vec<i64> = if rest.first() == Some(&"batch") {
        if ints.len() != 6 * asks.len() {
            return reply.to_vec();
        }
        ints.chunks(6)
            .zip(&asks)
            .flat_map(|(g, &a)| {
                let stamp = if g[0] == -1 {
                    [0, 0]
                } else {
                    [EPOCH as i64, MARK as i64]
                };
                let n = if a { 2 } else { 0 };
                g.iter().copied().chain(stamp.into_iter().take(n))
            })
            .collect()
    } else {
        if !asks[0] || !(5..=6).contains(&ints.len()) {
            return reply.to_vec();
        }
        let mut out = ints.clone();
        out.resize(6, 0);
        out.extend([EPOCH as i64, MARK as i64]);
        out
    };
    let list: Vec<String> = out.iter().map(i64::to_string).collect();
    format!("{head}:[{}]}}", list.join(",")).into_bytes()
}

const NOSCRIPT: &[u8] = br#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;

fn header<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    hs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// What call `token` asked for: max(cost, lease_want).
fn asked(h: &Fake, token: u32) -> u64 {
    let body = &h.out[&token].body;
    // .../<cost>/<lease>/<max_wait_ms>/<settle>, the lease `<want>` or `<want>:<holder>:...`
    // (its colons encoded).
    let mut nums = body
        .rsplit('/')
        .skip(2)
        .take(2)
        .map(|n| n.split("%3A").next().unwrap().parse::<u64>().unwrap());
    let want = nums.next().unwrap();
    let cost = nums.next().unwrap();
    want.max(cost)
}

/// Whether `body` is an exact check of cost 1: its lease argument is "0" (no holder).
fn is_exact_check(body: &str) -> bool {
    let segs: Vec<&str> = body.rsplit('/').take(4).collect();
    segs[3] == "1" && segs[2] == "0"
}

/// Whether `body` is a lease call needing `cost` and wanting `want`, waiting up to ten of
/// [`LEASE`]'s horizons, that names a holder holding nothing.
fn is_lease_call(body: &str, cost: u64, want: u64) -> bool {
    let segs: Vec<&str> = body.rsplit('/').take(4).collect();
    let lease: Vec<&str> = segs[2].split("%3A").collect();
    segs[3] == cost.to_string()
        && lease.len() == 6
        && lease[0] == want.to_string()
        && lease[1].parse::<u64>().is_ok_and(|id| id >= 1)
        && lease[2].parse::<u64>().is_ok_and(|seq| seq >= 1)
        && lease[4] == "0"
        && segs[0] == "0"
        && segs[1] == "2000"
}

/// Grants lease call `token` all it asked for.
fn grant_all(e: &mut Engine, h: &mut Fake, token: u32) -> u64 {
    let n = asked(h, token);
    deliver(e, h, token, 200, &answer(true, 40, 0, 300, n));
    n
}

/// A grant of 20 tokens from a bucket that keeps 30.
const TWENTY_LEASED: crate::shared::lease::Grant = crate::shared::lease::Grant {
    tokens: 20,
    global_remaining: 30,
    reset_after_ms: 300,
    refill_ms: 0,
};

/// Puts `grant` into user "a"'s lease in the proxy pool of `e` at time 0, as a lease call of
/// its own would (a key at 100/s, burst 50, leases of at most 20).
fn deposit_at_0(h: &Fake, e: &Engine, grant: crate::shared::lease::Grant) {
    let pool = LeasePool::new(&*h.store, &e.plugin.ns);
    let sizing = crate::shared::lease::Sizing {
        burst: 50,
        rate: 100,
        period_ms: 1000,
        lease_max: 20,
        horizon_ms: 200,
        hold_ms: 0,
    };
    let key = lease_key(e, "a");
    let Ok((crate::shared::lease::Flight::Claimed(claim, _), _)) =
        pool.begin_flight(&key, 1, Unmet::default(), 0, 100, &sizing)
    else {
        panic!()
    };
    pool.deposit(claim, &grant, &[], 0, &sizing).unwrap();
}

/// Delivers the answer to `token` (on the root context, as the host does): Webdis' `status` and
/// `body`, or with `status` 0 no answer (the stream reset or timed out).
fn deliver(e: &mut Engine, h: &mut Fake, token: u32, status: u32, body: &[u8]) {
    let sent = h.out.remove(&token);
    // As the script answers: a call in the tracked form gets its epoch.
    let body = sent.map_or(body.to_vec(), |out| with_epochs(&out.body, body));
    let answer = match status {
        0 => crate::backend::Answer::NoAnswer,
        status => crate::backend::Answer::Http {
            status,
            body: crate::backend::Payload::Read(body),
        },
    };
    e.call_response(h, token, &answer);
}

// ----- exact mode -----

#[test]
fn exact_admits_on_the_backend_answer_and_adds_headers_to_the_response() {
    let (mut e, rec) = engine("", EXACT);
    let mut h = Fake::default();
    assert_eq!(
        e.request_headers(&mut h, 10.into(), &user("a")),
        Action::Pause
    );
    let [t] = h.tokens()[..] else { panic!() };
    assert!(h.sent[0].starts_with("EVALSHA/") && h.sent[0].ends_with("/20/10/1000/1/0/0/0"));
    deliver(&mut e, &mut h, t, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(h.resumed, [10]);
    e.response_headers(&mut h, 10.into(), &resp(&[]));
    assert_eq!(
        header(&h.added[0].1, "ratelimit"),
        Some("\"per-user\";r=19;t=1")
    );
    assert_eq!(rec.get(0, Counter::Allowed), 1);
    assert_eq!(rec.get(0, Counter::BackendCalls), 1);
    e.done(&mut h, 10.into());
    assert_eq!(e.load(), (0, 0, 0));
}

/// A key source named twice is checked against the rule's one bucket for ambiguous requests,
/// never an override's, and counted in `ambiguous`.
#[test]
fn an_ambiguous_key_is_checked_in_the_shared_bucket_and_counted() {
    let (mut e, rec) = engine(
        "",
        r#"{"name":"per-key","key":["query:k"],"rate":10,"burst":3,
            "overrides":[{"key":["internal"],"unlimited":true}]}"#,
    );
    let mut h = Fake::default();
    assert_eq!(
        e.request_headers(&mut h, 10.into(), &req("/?k=internal", &[])),
        Action::Continue
    );
    assert!(h.sent.is_empty(), "the override: no call");
    assert_eq!(rec.get(0, Counter::Ambiguous), 0);
    assert_eq!(
        e.request_headers(&mut h, 11.into(), &req("/?k=internal&k=x", &[])),
        Action::Pause
    );
    let shared = crate::rule::bucket_key_of(
        "tollgate",
        "per-key",
        &e.plugin.config.rules[0].key,
        &[crate::rule::Part::Ambiguous],
    );
    let digest = &shared[shared.len() - 33..shared.len() - 1];
    assert!(h.sent[0].contains(digest), "{} has {digest}", h.sent[0]);
    assert_eq!(rec.get(0, Counter::Ambiguous), 1);
    deliver(&mut e, &mut h, 1, 200, &answer(true, 2, 0, 100, 1));
    e.request_headers(&mut h, 12.into(), &req("/?k=y;k=z", &[]));
    assert!(h.sent[1].contains(digest), "the same bucket");
    assert_eq!(rec.get(0, Counter::Ambiguous), 2);
}

#[test]
fn a_denial_is_cached_and_answers_locally_until_its_retry_time() {
    let (mut e, rec) = engine("", EXACT);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(false, 0, 300, 2000, 0));
    assert_eq!(h.status_of(10), Some(429));
    h.now = 1299;
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(h.status_of(11), Some(429));
    assert_eq!(h.sent.len(), 1, "answered from the deny cache");
    assert_eq!(rec.get(0, Counter::LocalDenied), 1);
    h.now = 1300;
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(h.sent.len(), 2, "expired: asks Redis again");
}

#[test]
fn noscript_resends_once_with_eval_on_exact_calls() {
    let (mut e, rec) = engine(r#""failure_mode":"open","#, EXACT);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, NOSCRIPT);
    assert!(h.sent[1].starts_with("EVAL/"), "{}", &h.sent[1][..20]);
    assert_eq!(
        rec.get(0, Counter::BackendErrors),
        0,
        "a NOSCRIPT answered by EVAL is no error"
    );
    // A second NOSCRIPT is a failure: failure_mode open admits.
    deliver(&mut e, &mut h, 2, 200, NOSCRIPT);
    assert_eq!(h.resumed, [10]);
    assert_eq!(rec.get(0, Counter::FailureModeAllowed), 1);
    assert_eq!(rec.get(0, Counter::BackendError(ErrorClass::Script)), 1);
}

use crate::backend::ErrorClass;

#[test]
fn failure_modes_answer_a_failed_call() {
    for (top, want) in [
        (r#""failure_mode":"open","#, None),
        (r#""failure_mode":"closed","#, Some(503)),
    ] {
        let (mut e, _) = engine(top, EXACT);
        let mut h = Fake::default();
        e.request_headers(&mut h, 10.into(), &user("a"));
        deliver(&mut e, &mut h, 1, 0, b"");
        assert_eq!(h.status_of(10), want, "{top}");
        if want.is_some() {
            assert_eq!(header(&h.responded[0].1.headers, "retry-after"), Some("1"));
        }
    }
    // The default is local: the rule's fallback bucket, per proxy. Its admissions are the failure
    // mode's (failure_mode_allowed, which the alerts watch), its denials are denials.
    let (mut e, rec) = engine(
        "",
        r#"{"name":"r","key":["header:x-user"],"rate":1,"burst":10,
            "fallback":{"rate":1,"period_ms":1000,"burst":2}}"#,
    );
    let mut h = Fake::default();
    for ctx in 10..13 {
        e.request_headers(&mut h, ctx.into(), &user("a"));
        let t = *h.tokens().last().unwrap();
        deliver(&mut e, &mut h, t, 503, b"");
    }
    assert_eq!(h.resumed, [10, 11]);
    assert_eq!(h.status_of(12), Some(429));
    assert_eq!(rec.get(0, Counter::Allowed), 2);
    assert_eq!(rec.get(0, Counter::FailureModeAllowed), 2);
    assert_eq!(rec.get(0, Counter::Denied), 1);
}

#[test]
fn a_failed_dispatch_gets_the_failure_mode_at_once() {
    let (mut e, rec) = engine(r#""failure_mode":"closed","#, EXACT);
    let mut h = Fake {
        fail_dispatch: true,
        ..Fake::default()
    };
    assert_eq!(
        e.request_headers(&mut h, 10.into(), &user("a")),
        Action::Pause
    );
    assert_eq!(h.status_of(10), Some(503));
    assert_eq!(
        rec.get(0, Counter::BackendError(ErrorClass::Unreachable)),
        1
    );
    assert_eq!(e.load(), (0, 0, 0));
}

#[test]
fn the_cost_header_raises_the_cost_but_never_lowers_it() {
    let rule = r#"{"name":"c","key":["header:x-user"],"rate":10,"burst":100,"cost":10,
        "cost_header":"x-cost"}"#;
    let (mut e, _) = engine("", rule);
    let mut h = Fake::default();
    e.request_headers(
        &mut h,
        10.into(),
        &req("/", &[("x-user", "a"), ("x-cost", "1")]),
    );
    assert!(
        h.sent[0].ends_with("/100/10/1000/10/0/0/0"),
        "{}",
        h.sent[0]
    );
    e.request_headers(
        &mut h,
        11.into(),
        &req("/", &[("x-user", "a"), ("x-cost", "40")]),
    );
    assert!(
        h.sent[1].ends_with("/100/10/1000/40/0/0/0"),
        "{}",
        h.sent[1]
    );
    for (ctx, bad) in [(12, "0"), (13, "-1"), (14, "1.5"), (15, " 1"), (16, "101")] {
        e.request_headers(
            &mut h,
            ctx.into(),
            &req("/", &[("x-user", "a"), ("x-cost", bad)]),
        );
        assert_eq!(h.status_of(ctx), Some(400), "{bad:?}");
    }
}

#[test]
fn every_enforced_rule_must_admit_and_the_most_restrictive_is_reported() {
    let rules = format!(
        r#"{EXACT}, {{"name":"global","rate":100,"burst":100}}, {{"name":"try","rate":1,"shadow":true}}"#
    );
    let (mut e, rec) = engine("", &rules);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    assert_eq!(h.tokens(), [1, 2, 3]);
    deliver(&mut e, &mut h, 1, 200, &answer(true, 3, 0, 100, 1));
    deliver(&mut e, &mut h, 3, 200, &answer(false, 0, 900, 900, 0));
    assert!(h.resumed.is_empty());
    deliver(&mut e, &mut h, 2, 200, &answer(true, 50, 0, 100, 1));
    assert_eq!(h.resumed, [10], "a shadow denial does not deny");
    assert_eq!(rec.get(2, Counter::ShadowDenied), 1);
    e.response_headers(&mut h, 10.into(), &resp(&[]));
    assert_eq!(
        header(&h.added[0].1, "ratelimit"),
        Some("\"per-user\";r=3;t=1")
    );
    // An enforced denial answers at once, whatever is still out.
    e.request_headers(&mut h, 11.into(), &user("b"));
    deliver(&mut e, &mut h, 5, 200, &answer(false, 0, 300, 300, 0));
    assert_eq!(h.status_of(11), Some(429));
    let ratelimit = header(&h.responded[0].1.headers, "ratelimit");
    assert_eq!(ratelimit, Some("\"global\";r=0;t=1"));
    // Late answers for a decided request change nothing.
    deliver(&mut e, &mut h, 4, 200, &answer(true, 3, 0, 100, 1));
    deliver(&mut e, &mut h, 99, 200, &answer(true, 3, 0, 100, 1));
    assert_eq!(h.responded.len(), 1);
}

#[test]
fn a_grpc_denial_is_resource_exhausted_and_a_closed_failure_unavailable() {
    let (mut e, _) = engine(r#""failure_mode":"closed","#, EXACT);
    let mut h = Fake::default();
    let grpc = |u: &str| {
        req(
            "/svc/M",
            &[("x-user", u), ("content-type", "application/grpc+proto")],
        )
    };
    // Denied by the backend's answer: the content type is read then, not in request_headers.
    send(&mut e, &mut h, 10, &grpc("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(false, 0, 300, 300, 0));
    send(&mut e, &mut h, 11, &grpc("b"));
    deliver(&mut e, &mut h, 2, 0, b"");
    let statuses: Vec<Option<u32>> = h.responded.iter().map(|(_, r)| r.grpc_status).collect();
    assert_eq!(statuses, [Some(8), Some(14)]);
    assert!(header(&h.responded[0].1.headers, "ratelimit").is_some());
    let (mut e, _) = engine(r#""deny":{"grpc_resource_exhausted":false},"#, EXACT);
    let mut h = Fake::default();
    send(&mut e, &mut h, 10, &grpc("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(false, 0, 300, 300, 0));
    assert_eq!(h.responded[0].1.grpc_status, None);
}

/// A request view that counts the reads of one header.
struct Counting<'a>(&'a Req, &'a str, std::cell::Cell<u32>);

impl RequestView for Counting<'_> {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        if name == self.1 {
            self.2.set(self.2.get() + 1);
        }
        self.0.header(name)
    }
    fn client_ip(&self) -> Option<Vec<u8>> {
        self.0.client_ip()
    }
}

#[test]
fn the_content_type_is_read_only_for_a_local_answer() {
    let (mut e, _) = engine("", EXACT);
    let mut h = Fake::default();
    let r = user("a");
    let counted = Counting(&r, "content-type", std::cell::Cell::new(0));
    assert_eq!(
        e.request_headers(&mut h, 10.into(), &counted),
        Action::Pause
    );
    deliver(&mut e, &mut h, 1, 200, &answer(true, 5, 0, 100, 1));
    assert_eq!(h.resumed, [10]);
    assert_eq!(counted.2.get(), 0, "admitted: never read");
}

#[test]
fn a_reservation_holds_the_request_until_due_with_the_tick_on_only_meanwhile() {
    let rules = r#"{"name":"hooks","key":["header:x-user"],"rate":10,"burst":5,"max_wait_ms":800},
                   {"name":"try","rate":1,"shadow":true,"max_wait_ms":800}"#;
    let (mut e, rec) = engine("", rules);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    // Each asks for its spill epoch (the tracked form, nothing to settle): it may be refunded.
    assert!(
        h.sent[0].ends_with("/5/10/1000/1/0/800/0%3A0%3A0%3A0"),
        "{}",
        h.sent[0]
    );
    assert!(
        h.sent[1].ends_with("/1/0/0/0%3A0%3A0%3A0"),
        "a shadow rule never holds"
    );
    deliver(&mut e, &mut h, 1, 200, &answer(true, 0, 300, 800, 1));
    deliver(&mut e, &mut h, 2, 200, &answer(true, 0, 0, 800, 1));
    assert!(h.resumed.is_empty());
    assert_eq!(h.tick, 300);
    h.now = 1299;
    e.tick(&mut h);
    assert!(h.resumed.is_empty());
    h.now = 1300;
    e.tick(&mut h);
    assert_eq!(h.resumed, [10]);
    assert_eq!(h.tick, 0, "nothing due: the tick stops");
    e.response_headers(&mut h, 10.into(), &resp(&[]));
    assert_eq!(header(&h.added[0].1, "x-ratelimit-delay-ms"), Some("300"));
    assert_eq!(rec.get(0, Counter::DelayMs), 300);
}

/// A front that admits a check with a wait longer than the rule's `max_wait_ms` (the script never
/// reserves further): not the script's answer, so the failure mode, not a request held past what
/// its rule allows. Exactly `max_wait_ms` is held.
#[test]
fn a_reservation_longer_than_max_wait_ms_is_malformed() {
    let rule = r#"{"name":"h","rate":10,"burst":5,"max_wait_ms":800}"#;
    let (mut e, rec) = engine(r#""failure_mode":"closed","#, rule);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 0, 801, 900, 1));
    assert_eq!(h.status_of(10), Some(503));
    assert_eq!(rec.get(0, Counter::BackendErrors), 1);
    e.request_headers(&mut h, 11.into(), &user("b"));
    deliver(&mut e, &mut h, 2, 200, &answer(true, 0, 800, 900, 1));
    assert_eq!(h.status_of(11), None, "held for its reservation");
    h.now = 800;
    e.tick(&mut h);
    assert_eq!(h.resumed, vec![11]);
}

#[test]
fn a_held_request_whose_client_left_is_never_resumed() {
    let (mut e, _) = engine("", r#"{"name":"h","rate":10,"burst":5,"max_wait_ms":800}"#);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 0, 300, 800, 1));
    e.done(&mut h, 10.into());
    h.now = 400;
    e.tick(&mut h);
    assert!(h.resumed.is_empty());
    assert_eq!(h.tick, 0);
}

#[test]
fn an_open_breaker_answers_with_the_failure_mode_without_calls_then_probes_once() {
    let top =
        r#""failure_mode":"closed","backend":{"breaker_failures":2,"breaker_cooloff_ms":500},"#;
    let (mut e, rec) = engine(top, &format!("{EXACT}, {LEASE}"));
    let mut h = Fake::at(1000);
    for ctx in [10, 11] {
        e.request_headers(
            &mut h,
            ctx.into(),
            &req("/x", &[("x-other", "1"), ("x-user", "z")]),
        );
    }
    // Both requests: one exact call and one lease call (the second waits on the same key).
    let tokens = h.tokens();
    for t in tokens {
        deliver(&mut e, &mut h, t, 0, b"");
    }
    assert!(rec.breaker.get(), "breaker gauge");
    let sent = h.sent.len();
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(h.status_of(12), Some(503));
    assert_eq!(h.sent.len(), sent, "no call while open");
    h.now = 1600;
    e.request_headers(
        &mut h,
        13.into(),
        &req("/", &[("x-user", "b"), ("x-tier", "1")]),
    );
    let probes = h.sent.len() - sent;
    assert!(probes >= 1);
    e.request_headers(&mut h, 14.into(), &user("c"));
    assert_eq!(h.status_of(14), Some(503), "only one probe per cool-off");
    let t = h.tokens()[0];
    deliver(&mut e, &mut h, t, 200, &answer(true, 5, 0, 100, 1));
    assert!(!rec.breaker.get());
}

#[test]
fn too_many_calls_in_flight_get_the_failure_mode_and_are_counted() {
    let (mut e, rec) = engine(
        r#""failure_mode":"closed","backend":{"max_inflight":2},"#,
        EXACT,
    );
    let mut h = Fake::default();
    for ctx in 10..13 {
        e.request_headers(&mut h, ctx.into(), &user(&format!("u{ctx}")));
    }
    assert_eq!(h.sent.len(), 2);
    assert_eq!(h.status_of(12), Some(503));
    assert_eq!(rec.get(0, Counter::InflightRejected), 1);
}

// ----- lease mode -----

fn lease_key(e: &Engine, u: &str) -> String {
    crate::rule::applies(
        &e.plugin.config.key_prefix,
        (0, &e.plugin.config.rules[0]),
        &user(u),
        &mut crate::rule::KeyCache::default(),
    )
    .unwrap()
    .key
}

#[test]
fn one_lease_call_per_key_serves_every_waiter_then_admits_locally() {
    let (mut e, rec) = engine("", LEASE);
    let mut h = Fake::default();
    for ctx in 10..13 {
        assert_eq!(
            e.request_headers(&mut h, ctx.into(), &user("a")),
            Action::Pause
        );
    }
    assert_eq!(h.sent.len(), 1, "one call for the key");
    assert_eq!(
        asked(&h, 1),
        1,
        "no history yet: what waited when it was sent"
    );
    assert_eq!(h.tick, 100, "only the patience deadline is watched");
    deliver(&mut e, &mut h, 1, 200, &answer(true, 40, 0, 300, 1));
    assert_eq!(h.resumed, [10]);
    // The call for the two that came meanwhile goes with the answer: the host owns callouts on
    // the root context, so no request's end can cancel it.
    assert_eq!(h.sent.len(), 2, "one call for both, at once");
    let granted = grant_all(&mut e, &mut h, 2);
    assert!(granted >= 2, "sized for demand: {granted}");
    assert_eq!(h.resumed, [10, 11, 12], "served in arrival order");
    let local = granted - 2;
    for ctx in 13..13 + local as u32 {
        assert_eq!(
            e.request_headers(&mut h, ctx.into(), &user("a")),
            Action::Continue
        );
    }
    assert_eq!(h.sent.len(), 2, "leased tokens spent with no call");
    assert_eq!(rec.get(0, Counter::LocalAllowed), local);
    assert_eq!(rec.get(0, Counter::LeaseGranted), 1 + granted);
    e.request_headers(&mut h, 99.into(), &user("a"));
    assert_eq!(h.sent.len(), 3, "lease spent: the next miss asks again");
}

#[test]
fn a_grant_above_what_was_asked_is_clamped() {
    let (mut e, rec) = engine("", LEASE);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 40, 0, 300, 1_000_000));
    assert!(rec.get(0, Counter::LeaseGranted) <= 20);
    let l = LeasePool::new(&*h.store, &e.plugin.ns)
        .peek(&lease_key(&e, "a"))
        .unwrap();
    assert!(l.tokens < 20, "{l:?}");
}

#[test]
fn a_lease_denial_denies_the_waiters_until_a_reservation_could_be_made() {
    let (mut e, _) = engine("", LEASE);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert!(
        is_lease_call(&h.sent[0], 1, 1),
        "cost 1, lease 1, waits up to ten horizons: {}",
        h.sent[0]
    );
    // Denied: not even a reservation within the wait, for another 300 ms.
    deliver(&mut e, &mut h, 1, 200, &answer(false, 0, 300, 5000, 0));
    assert_eq!((h.status_of(10), h.status_of(11)), (Some(429), Some(429)));
    h.now = 1299;
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(h.status_of(12), Some(429));
    assert_eq!(h.sent.len(), 1, "answered here until then");
    h.now = 1300;
    e.request_headers(&mut h, 13.into(), &user("a"));
    assert_eq!(h.sent.len(), 2);
    assert_eq!(e.load().2, 1);
}

/// A proxy denied for holding its share is told to retry when one share has refilled, a
/// millisecond with a thousand holders; its count drops only when a later call reports less, so
/// each retry before that is denied again. It waits one horizon (200 ms by default) at least.
#[test]
fn a_lease_denial_holds_the_key_for_one_horizon_at_least() {
    let (mut e, _) = engine("", LEASE);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(false, 0, 1, 5000, 0));
    assert_eq!(h.status_of(10), Some(429));
    h.now = 1199;
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(h.status_of(11), Some(429));
    assert_eq!(h.sent.len(), 1, "no call before a horizon has passed");
    h.now = 1200;
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(h.sent.len(), 2);
}

/// A grant that emptied the global bucket with no reservation in it, less than the proxy asked
/// for (a key with so many holders that the script reserves nothing): once its tokens are spent,
/// the key is denied here for one horizon, as after a denial, instead of called again for each
/// token as it refills.
#[test]
fn a_grant_that_emptied_the_bucket_unreserved_holds_the_key_for_a_horizon() {
    let (mut e, _) = engine("", LEASE);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 30, 0, 200, 1));
    assert_eq!(h.resumed, [10]);
    // Spent: the next request asks again, for more than the bucket holds now.
    e.request_headers(&mut h, 11.into(), &user("a"));
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(h.sent.len(), 2);
    assert!(
        !is_lease_call(&h.sent[1], 1, 1),
        "asks for more than one: {}",
        h.sent[1]
    );
    deliver(&mut e, &mut h, 2, 200, &answer(true, 0, 0, 500, 1));
    assert_eq!((h.resumed.len(), h.status_of(12)), (2, Some(429)));
    h.now = 1199;
    e.request_headers(&mut h, 13.into(), &user("a"));
    assert_eq!(h.status_of(13), Some(429));
    assert_eq!(h.sent.len(), 2, "no call before a horizon has passed");
    h.now = 1200;
    e.request_headers(&mut h, 14.into(), &user("a"));
    assert_eq!(h.sent.len(), 3);
}

/// A racer's grant on a key short of tokens says when the proxy's next turn comes (a negative
/// retry_after_ms): once its tokens are spent the key is denied here until then, longer than a
/// horizon, though the bucket still held some; then the proxy leases again (not an exact check:
/// the key is short).
#[test]
fn a_racers_grant_holds_the_key_until_its_next_turn() {
    let (mut e, _) = engine("", LEASE);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 3, -1500, 200, 1));
    assert_eq!(h.resumed, [10]);
    h.now = 1300;
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(h.status_of(11), Some(429));
    h.now = 2499;
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(h.status_of(12), Some(429));
    assert_eq!(h.sent.len(), 1, "no call before the turn");
    h.now = 2500;
    e.request_headers(&mut h, 13.into(), &user("a"));
    assert_eq!(h.sent.len(), 2);
    let lease = h.sent[1].rsplit('/').nth(2).unwrap_or_default();
    assert!(lease.contains("%3A"), "a lease call: {}", h.sent[1]);
}

#[test]
fn a_reservation_is_spent_as_it_refills_with_no_call_meanwhile() {
    let (mut e, rec) = engine("", LEASE);
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    // The bucket held nothing: the script reserved the token, refilled in 10 ms (100/s).
    deliver(&mut e, &mut h, 1, 200, &answer(true, 0, 10, 510, 1));
    assert_eq!(h.status_of(10), Some(429), "not refilled yet");
    assert_eq!(rec.get(0, Counter::LeaseGranted), 1);
    h.now = 1009;
    assert_eq!(
        e.request_headers(&mut h, 11.into(), &user("a")),
        Action::Pause
    );
    assert_eq!(h.status_of(11), Some(429));
    assert_eq!(
        h.sent.len(),
        1,
        "no second call while the reservation refills"
    );
    h.now = 1010;
    assert_eq!(
        e.request_headers(&mut h, 12.into(), &user("a")),
        Action::Continue
    );
    assert_eq!(h.sent.len(), 1, "spent from the pool, no call");
    assert_eq!(rec.get(0, Counter::LocalAllowed), 1);
    e.request_headers(&mut h, 13.into(), &user("a"));
    assert_eq!(h.sent.len(), 2, "spent: the next miss asks again");
    assert!(e.load().2 == 1 && h.tick > 0);
}

#[test]
fn lease_noscript_resends_eval_under_the_same_claim() {
    let (mut e, _) = engine("", LEASE);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, NOSCRIPT);
    assert!(h.sent[1].starts_with("EVAL/"));
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(h.sent.len(), 2, "the claim is still held: no second call");
    deliver(&mut e, &mut h, 2, 200, &answer(true, 40, 0, 300, 1));
    assert_eq!(h.resumed, [10]);
    h.now += 1;
    e.tick(&mut h);
    assert!(
        h.sent[2].starts_with("EVALSHA/"),
        "the next call tries EVALSHA again"
    );
}

fn claim_free(e: &Engine, h: &Fake, u: &str) -> bool {
    LeasePool::new(&*h.store, &e.plugin.ns)
        .peek(&lease_key(e, u))
        .is_none_or(|l| l.flight_until_ms == 0)
}

#[test]
fn the_claim_is_released_on_every_failure_path() {
    let closed = r#""failure_mode":"closed","#;
    // 1. The call fails to dispatch.
    let (mut e, _) = engine(closed, LEASE);
    let mut h = Fake {
        fail_dispatch: true,
        ..Fake::default()
    };
    e.request_headers(&mut h, 10.into(), &user("a"));
    assert_eq!(h.status_of(10), Some(503));
    assert!(claim_free(&e, &h, "a"), "dispatch failure");
    // 2. The call is answered with an error.
    let (mut e, _) = engine(closed, LEASE);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 0, b"");
    assert_eq!(h.status_of(10), Some(503));
    assert!(claim_free(&e, &h, "a"), "error answer");
    // 3. The EVAL resend after NOSCRIPT fails to dispatch.
    let (mut e, _) = engine(closed, LEASE);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    h.fail_dispatch = true;
    deliver(&mut e, &mut h, 1, 200, NOSCRIPT);
    assert_eq!(h.status_of(10), Some(503));
    assert!(claim_free(&e, &h, "a"), "resend failure");
    // 4. The request that sent the call goes away: the host still answers the call, on the root
    // context (it owns every callout), and the answer serves the other waiter.
    let (mut e, _) = engine(closed, LEASE);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    e.request_headers(&mut h, 11.into(), &user("a"));
    e.done(&mut h, 10.into());
    assert!(!claim_free(&e, &h, "a"), "the call is still out");
    deliver(&mut e, &mut h, 1, 200, &answer(true, 40, 0, 300, 5));
    assert!(
        claim_free(&e, &h, "a"),
        "answered after its sender went away"
    );
    assert_eq!(h.sent.len(), 1, "no second call");
    assert_eq!(h.resumed, [11], "the gone request is never touched");
}

#[test]
fn a_waiter_whose_call_is_lost_gets_the_failure_mode_after_its_patience() {
    let (mut e, rec) = engine(
        r#""failure_mode":"open","backend":{"timeout_ms":50},"#,
        LEASE,
    );
    let mut h = Fake::at(1000);
    e.request_headers(&mut h, 10.into(), &user("a"));
    assert_eq!(h.tick, 100);
    h.now = 1099;
    e.tick(&mut h);
    assert!(h.resumed.is_empty());
    h.now = 1100;
    e.tick(&mut h);
    assert_eq!(h.resumed, [10]);
    assert_eq!(rec.get(0, Counter::FailureModeAllowed), 1);
    assert_eq!(h.tick, 0);
    // The late answer still lands in the pool for later requests.
    deliver(&mut e, &mut h, 1, 200, &answer(true, 40, 0, 300, 5));
    assert_eq!(
        e.request_headers(&mut h, 11.into(), &user("a")),
        Action::Continue
    );
}

#[test]
fn a_client_that_hangs_up_mid_wait_is_dropped_from_the_queue() {
    let (mut e, _) = engine("", LEASE);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    e.request_headers(&mut h, 11.into(), &user("a"));
    e.done(&mut h, 11.into());
    assert_eq!(e.load().2, 1);
    deliver(&mut e, &mut h, 1, 200, &answer(true, 40, 0, 300, 5));
    assert_eq!(h.resumed, [10], "the gone context is never touched");
}

#[test]
fn a_key_another_worker_is_calling_for_is_polled_without_writes_then_served() {
    let (mut w1, _) = engine("", LEASE);
    let (mut w2, _) = engine("", LEASE);
    let mut h = Fake::default();
    w1.request_headers(&mut h, 10.into(), &user("a"));
    w2.request_headers(&mut h, 20.into(), &user("a"));
    assert_eq!(h.sent.len(), 1, "one call per key per proxy");
    assert_eq!(h.tick, 1, "worker 2 polls the shared pool");
    let writes = h.store.writes();
    w2.tick(&mut h);
    assert_eq!(h.store.writes(), writes, "polling writes nothing");
    w1.request_headers(&mut h, 11.into(), &user("a"));
    // Worker 1's first call asked for one token; its answer serves worker 1's first waiter, and
    // its second waiter's call, which goes out with that answer, carries worker 2's demand too
    // (counted in the shared lease).
    deliver(&mut w1, &mut h, 1, 200, &answer(true, 40, 0, 300, 1));
    assert_eq!(h.resumed, [10]);
    assert_eq!(h.sent.len(), 2);
    let granted = grant_all(&mut w1, &mut h, 2);
    assert!(granted >= 2, "{granted}");
    assert_eq!(h.resumed, [10, 11]);
    w2.tick(&mut h);
    assert_eq!(
        h.resumed,
        [10, 11, 20],
        "worker 2 finds the tokens in the pool"
    );
    w2.tick(&mut h);
    assert_eq!(h.tick, 0, "nothing left to watch");
}

#[test]
fn a_flood_of_distinct_keys_costs_one_call_each_and_leaves_nothing_behind() {
    let (mut e, _) = engine(r#""backend":{"max_inflight":5000},"#, LEASE);
    let mut h = Fake::default();
    for ctx in 100..1100 {
        e.request_headers(&mut h, ctx.into(), &user(&format!("k{ctx}")));
    }
    assert_eq!(h.sent.len(), 1000);
    let lease_calls = h.sent.iter().filter(|s| is_lease_call(s, 1, 1)).count();
    let alone = h.sent.iter().filter(|s| s.ends_with("/1/0/0/0")).count();
    assert_eq!(
        (lease_calls, alone),
        (15, 985),
        "leases until the worker sees most new keys only once, then each on its own"
    );
    assert_eq!(h.tick_sets, 1, "the tick is armed once, not per request");
    let writes = h.store.writes();
    for t in h.tokens() {
        deliver(&mut e, &mut h, t, 200, &answer(true, 40, 0, 300, 1));
    }
    assert_eq!(h.resumed.len(), 1000);
    assert_eq!(
        h.store.writes(),
        writes + 15,
        "only the leases' deposits write the pool"
    );
    for ctx in 100..1100 {
        e.response_headers(&mut h, ctx.into(), &resp(&[]));
        e.done(&mut h, ctx.into());
    }
    assert_eq!(e.load(), (0, 0, 0));
    h.now = 10_000;
    e.tick(&mut h);
    assert_eq!(h.tick, 0);
}

#[test]
fn under_a_flood_of_new_keys_a_key_leases_once_it_comes_back() {
    let (mut e, rec) = engine(r#""backend":{"max_inflight":5000},"#, LEASE);
    let mut h = Fake::default();
    for ctx in 100..200 {
        e.request_headers(&mut h, ctx.into(), &user(&format!("k{ctx}")));
    }
    h.sent.clear();
    h.out.clear();
    let writes = h.store.writes();
    assert_eq!(
        e.request_headers(&mut h, 10.into(), &user("a")),
        Action::Pause
    );
    assert!(
        h.sent[0].ends_with("/1/0/0/0"),
        "its own call: {}",
        h.sent[0]
    );
    let t = h.tokens()[0];
    deliver(&mut e, &mut h, t, 200, &answer(true, 40, 0, 300, 1));
    assert_eq!(h.resumed, [10]);
    assert_eq!(h.store.writes(), writes, "no flight, no deposit");
    assert!(LeasePool::new(&*h.store, &e.plugin.ns)
        .peek(&lease_key(&e, "a"))
        .is_none());
    let granted = rec.get(0, Counter::LeaseGranted);
    // Back again: now it waits for a lease call, which the requests after it share.
    assert_eq!(
        e.request_headers(&mut h, 11.into(), &user("a")),
        Action::Pause
    );
    assert_eq!(
        e.request_headers(&mut h, 12.into(), &user("a")),
        Action::Pause
    );
    assert_eq!(h.sent.len(), 2, "one lease call for both");
    assert!(is_lease_call(&h.sent[1], 1, 1), "a lease: {}", h.sent[1]);
    assert!(!claim_free(&e, &h, "a"));
    let t = h.tokens()[0];
    grant_all(&mut e, &mut h, t);
    assert!(rec.get(0, Counter::LeaseGranted) > granted);
    // Another worker, flooded too, has not seen the key; but the proxy's pool knows it, so its
    // first request there spends leased tokens or waits for a lease.
    let (mut w2, _) = engine(r#""backend":{"max_inflight":5000},"#, LEASE);
    for ctx in 300..400 {
        w2.request_headers(&mut h, ctx.into(), &user(&format!("k{ctx}")));
    }
    let sent = h.sent.len();
    w2.request_headers(&mut h, 20.into(), &user("a"));
    assert!(
        h.sent[sent..].iter().all(|s| !s.ends_with("/1/0/0/0")),
        "not on its own: {:?}",
        &h.sent[sent..]
    );
}

/// Two requests for `u` at `ctx`, `ctx + 1`: the second call is sized for demand, and leaves
/// leased tokens unspent in the pool. Returns how many.
fn lease_with_leftover(e: &mut Engine, h: &mut Fake, u: &str, ctx: u32) -> u64 {
    e.request_headers(h, ctx.into(), &user(u));
    e.request_headers(h, ContextId::from(ctx + 1), &user(u));
    let t = *h.tokens().last().unwrap();
    deliver(e, h, t, 200, &answer(true, 40, 0, 300, 1));
    // The second waiter's call goes out with that answer (the clock stands still here, so that
    // no lease expires while the table fills).
    let Some(&t) = h.tokens().last() else {
        return 0; // went exact: no slot
    };
    let granted = grant_all(e, h, t);
    e.done(h, ctx.into());
    e.done(h, ContextId::from(ctx + 1));
    granted.saturating_sub(1)
}

#[test]
fn under_slot_pressure_a_tenants_paid_tokens_survive_and_newcomers_go_exact() {
    let (mut e, rec) = engine("", LEASE);
    let mut h = Fake::default();
    let left = lease_with_leftover(&mut e, &mut h, "tenant", 10);
    assert!(left >= 1, "{left}");
    for i in 0..10_000u32 {
        lease_with_leftover(&mut e, &mut h, &format!("r{i}"), 100 + 2 * i);
    }
    let exact = h.sent.iter().filter(|s| s.ends_with("/1/0/0/0")).count();
    assert!(
        exact > 0,
        "some newcomers found their set full and went exact"
    );
    assert_eq!(
        rec.get(0, Counter::LeaseEvicted),
        0,
        "no live lease was evicted"
    );
    for ctx in 0..left as u32 {
        assert_eq!(
            e.request_headers(&mut h, ContextId::from(50_000 + ctx), &user("tenant")),
            Action::Continue
        );
    }
}

#[test]
fn an_idle_engine_stops_ticking() {
    let (mut e, _) = engine("", LEASE);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 40, 0, 300, 1));
    e.request_headers(&mut h, 11.into(), &user("a"));
    grant_all(&mut e, &mut h, 2);
    h.now = 200;
    e.tick(&mut h);
    assert_eq!(h.tick, 0);
    assert_eq!(
        e.request_headers(&mut h, 12.into(), &user("a")),
        Action::Continue
    );
    // It moved a batch out of the pool: the worker ticks when that batch's lease expires
    // (at 400) to drop what is left of it, then goes idle again.
    assert_eq!(h.tick, 200, "a tick at the batch's expiry");
    h.now = 400;
    e.tick(&mut h);
    assert_eq!(h.tick, 0, "idle again");
}

#[test]
fn stash_admissions_read_no_clock_and_the_tick_at_the_lease_expiry_ends_them() {
    let (mut e, rec) = engine("", LEASE);
    let mut h = Fake::default();
    deposit_at_0(&h, &e, TWENTY_LEASED);
    // The first admission moves a batch from the proxy's pool into the worker's stash: it reads
    // the clock, and arms a tick at the lease's expiry.
    assert_eq!(
        e.request_headers(&mut h, 10.into(), &user("a")),
        Action::Continue
    );
    let (stashed, expiry) = e.stashed(&lease_key(&e, "a")).unwrap();
    assert!(stashed >= 2, "a batch: {stashed}");
    assert_eq!(h.tick, expiry);
    let reads = h.clock_reads.get();
    h.now = expiry - 1;
    for ctx in 11..11 + stashed as u32 {
        assert_eq!(
            e.request_headers(&mut h, ctx.into(), &user("a")),
            Action::Continue
        );
        e.response_headers(&mut h, ctx.into(), &resp(&[]));
        e.done(&mut h, ctx.into());
    }
    assert_eq!(
        h.clock_reads.get(),
        reads,
        "no clock read by a stash admission"
    );
    assert_eq!(e.stashed(&lease_key(&e, "a")), None, "all spent");
    assert_eq!(rec.get(0, Counter::LocalAllowed), 1 + stashed);
    // Another batch, then its lease runs out: the tick drops it, and the next request is not
    // admitted from it.
    assert_eq!(
        e.request_headers(&mut h, 40.into(), &user("a")),
        Action::Continue
    );
    let (left, _) = e.stashed(&lease_key(&e, "a")).unwrap();
    h.now = expiry;
    e.tick(&mut h);
    assert_eq!(e.stashed(&lease_key(&e, "a")), None, "expired: dropped");
    assert_eq!(rec.get(0, Counter::LeaseDropped), left);
    let sent = h.sent.len();
    assert_eq!(
        e.request_headers(&mut h, 41.into(), &user("a")),
        Action::Pause
    );
    assert_eq!(h.sent.len(), sent + 1, "a lease call, not a stashed token");
}

/// Two workers of one proxy in lease mode, with `grant` in the proxy's pool for user "a" at 0.
fn two_lease_workers(grant: crate::shared::lease::Grant) -> (Worker, Worker, Fake) {
    let (w1, w2) = (engine("", LEASE), engine("", LEASE));
    let h = Fake::default();
    deposit_at_0(&h, &w1.0, grant);
    (w1, w2, h)
}

#[test]
fn workers_stashing_batches_never_spend_more_than_was_granted() {
    // The proxy's pool holds a lease of 20 tokens for the key.
    let ((mut w1, rec1), (mut w2, rec2), mut h) = two_lease_workers(TWENTY_LEASED);
    let leased = 20;
    // Both workers alternate until each has missed once.
    let (mut admitted, mut missed1, mut missed2) = (0, false, false);
    for ctx in 100..1000u32 {
        let (w, missed) = if ctx % 2 == 0 {
            (&mut w1, &mut missed1)
        } else {
            (&mut w2, &mut missed2)
        };
        if *missed {
            continue;
        }
        match w.request_headers(&mut h, ctx.into(), &user("a")) {
            Action::Continue => admitted += 1,
            Action::Pause => *missed = true,
        }
        if missed1 && missed2 {
            break;
        }
    }
    assert_eq!(admitted, leased, "every leased token spent once, none more");
    let local = rec1.get(0, Counter::LocalAllowed) + rec2.get(0, Counter::LocalAllowed);
    assert_eq!(local, leased);
}

#[test]
fn two_workers_spend_a_reservation_no_faster_than_the_bucket_refills_it() {
    // 20 tokens: 5 the bucket held, 15 it refills at 100/s over the next 150 ms.
    let ((mut w1, _), (mut w2, _), mut h) = two_lease_workers(crate::shared::lease::Grant {
        tokens: 20,
        global_remaining: 0,
        reset_after_ms: 650,
        refill_ms: 150,
    });
    let mut admitted = 0u64;
    let mut ctx = 100;
    for now in 0..=200 {
        h.now = now;
        for w in [&mut w1, &mut w2] {
            for _ in 0..2 {
                ctx += 1;
                if w.request_headers(&mut h, ctx.into(), &user("a")) == Action::Continue {
                    admitted += 1;
                }
            }
        }
        assert!(
            admitted <= 5 + now / 10,
            "{admitted} admitted by {now} ms: ahead of the refill"
        );
    }
    assert_eq!(admitted, 20, "all of it once refilled");
}

// ----- exact mode at a hot key -----

#[test]
fn concurrent_exact_checks_of_a_key_share_one_call_after_the_one_out() {
    let (mut e, rec) = engine("", EXACT);
    let mut h = Fake::default();
    for ctx in 10..14 {
        e.request_headers(&mut h, ctx.into(), &user("a"));
    }
    assert_eq!(h.sent.len(), 1, "one call out; the others queue behind it");
    deliver(&mut e, &mut h, 1, 200, &answer(true, 9, 0, 100, 1));
    assert_eq!(h.resumed, [10]);
    assert_eq!(h.sent.len(), 2, "the shared call goes out with the answer");
    assert!(
        h.sent[1].ends_with("/20/10/1000/1/3/0/0"),
        "one token each for three: {}",
        h.sent[1]
    );
    // Meanwhile another arrives: it waits for the next call.
    e.request_headers(&mut h, 14.into(), &user("a"));
    deliver(&mut e, &mut h, 2, 200, &answer(true, 6, 0, 100, 3));
    assert_eq!(h.resumed, [10, 11, 12, 13]);
    assert!(
        h.sent[2].ends_with("/1/1/0/0"),
        "sent at once from the root: {}",
        h.sent[2]
    );
    deliver(&mut e, &mut h, 3, 200, &answer(true, 5, 0, 100, 1));
    assert_eq!(h.resumed, [10, 11, 12, 13, 14]);
    assert_eq!(rec.get(0, Counter::BackendCalls), 3);
    assert_eq!(rec.get(0, Counter::Allowed), 5);
    for ctx in 10..15 {
        e.response_headers(&mut h, ctx.into(), &resp(&[]));
        e.done(&mut h, ctx.into());
    }
    assert_eq!(e.load(), (0, 0, 0));
}

#[test]
fn checks_that_leave_a_keys_chain_are_not_asked_for() {
    let (mut e, rec) = engine("", EXACT);
    let mut h = Fake::default();
    for ctx in 10..16 {
        e.request_headers(&mut h, ctx.into(), &user("a"));
    }
    // Three of the five queued behind the call out leave.
    for ctx in [11, 13, 14] {
        e.done(&mut h, ctx.into());
    }
    deliver(&mut e, &mut h, 1, 200, &answer(true, 9, 0, 100, 1));
    assert_eq!(asked(&h, 2), 2, "one token each for the two still here");
    deliver(&mut e, &mut h, 2, 200, &answer(true, 7, 0, 100, 2));
    assert_eq!(h.resumed, [10, 12, 15]);
    assert_eq!(rec.get(0, Counter::Allowed), 3);
    for ctx in [10, 12, 15] {
        e.response_headers(&mut h, ctx.into(), &resp(&[]));
        e.done(&mut h, ctx.into());
    }
    assert_eq!(e.load(), (0, 0, 0));
}

/// An engine of `rules` whose first call for key a (request 10) is out, never answered while
/// request 11 waits behind it and a client opens and resets 100,000 streams of a.
fn streams_reset_behind_a_call_out(rules: &str) -> (Engine, Fake) {
    let (mut e, _) = engine("", rules);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    e.request_headers(&mut h, 11.into(), &user("a"));
    for ctx in 12..100_012u32 {
        e.request_headers(&mut h, ctx.into(), &user("a"));
        e.done(&mut h, ctx.into());
    }
    (e, h)
}

#[test]
fn streams_reset_behind_a_keys_call_out_do_not_grow_its_chain() {
    let (mut e, mut h) = streams_reset_behind_a_call_out(EXACT);
    assert!(
        e.chains.queued() <= 2 + 64, // one live waiter (11): twice it plus 64
        "{} queued",
        e.chains.queued()
    );
    // The one still waiting gets its share.
    deliver(&mut e, &mut h, 1, 200, &answer(true, 9, 0, 100, 1));
    assert_eq!(asked(&h, 2), 1);
    deliver(&mut e, &mut h, 2, 200, &answer(true, 8, 0, 100, 1));
    assert_eq!(h.resumed, [10, 11]);
}

#[test]
fn checks_whose_requests_another_rule_refused_do_not_grow_their_keys_chain() {
    // Every request checks user a exactly and leases tenant t.
    let tenant = r#"{"name":"tenant","key":["header:x-tenant"],"mode":"lease","rate":100,
        "burst":50,"lease_max":20}"#;
    let (mut e, _) = engine("", &format!("{EXACT}, {tenant}"));
    let mut h = Fake::default();
    let of = req("/api/x", &[("x-user", "a"), ("x-tenant", "t")]);
    // Request 10's calls: user a's (token 1), the tenant's lease call (token 2), never answered
    // while 10,000 more queue behind both.
    for ctx in 10..10_011u32 {
        e.request_headers(&mut h, ctx.into(), &of);
    }
    assert_eq!(h.sent.len(), 2);
    // The tenant is refused: every request is decided, its check of user a no longer waited for.
    deliver(&mut e, &mut h, 2, 200, &answer(false, 0, 100, 2000, 0));
    assert_eq!(h.status_of(10_010), Some(429));
    assert!(e.chains.queued() <= 64, "{} queued", e.chains.queued());
    deliver(&mut e, &mut h, 1, 200, &answer(true, 9, 0, 100, 1));
    assert_eq!(h.sent.len(), 2, "no call for checks no one waits for");
}

#[test]
fn a_partial_grant_admits_that_many_and_denies_the_rest_as_redis_would() {
    let (mut e, _) = engine("", EXACT);
    let mut h = Fake::default();
    for ctx in 10..13 {
        e.request_headers(&mut h, ctx.into(), &user("a"));
    }
    deliver(&mut e, &mut h, 1, 200, &answer(true, 2, 0, 100, 1));
    e.tick(&mut h);
    deliver(&mut e, &mut h, 2, 200, &answer(true, 0, 0, 1900, 1));
    assert_eq!(h.resumed, [10, 11]);
    assert_eq!(h.status_of(12), Some(429));
    let retry = header(&h.responded[0].1.headers, "retry-after");
    assert_eq!(retry, Some("1"), "the next token, at 10/s");
    // A denial of the whole batch denies each.
    e.request_headers(&mut h, 20.into(), &user("b"));
    e.request_headers(&mut h, 21.into(), &user("b"));
    deliver(&mut e, &mut h, 3, 200, &answer(true, 0, 0, 100, 1));
    e.tick(&mut h);
    deliver(&mut e, &mut h, 4, 200, &answer(false, 0, 300, 2000, 0));
    assert_eq!(h.status_of(21), Some(429));
}

#[test]
fn a_chain_survives_the_request_that_sent_its_call_going_away_and_other_costs_go_alone() {
    let (mut e, _) = engine("", EXACT);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    e.request_headers(&mut h, 11.into(), &user("a"));
    e.done(&mut h, 10.into());
    assert_eq!(
        h.sent.len(),
        1,
        "the call stays out: the host answers it on the root context"
    );
    deliver(&mut e, &mut h, 1, 200, &answer(true, 5, 0, 100, 1));
    assert_eq!(h.sent.len(), 2, "its answer moved the chain on");
    deliver(&mut e, &mut h, 2, 200, &answer(true, 4, 0, 100, 1));
    assert_eq!(h.resumed, [11], "the gone request is never touched");
    // A cost of 2 is never coalesced (a grant must cover whole requests).
    e.request_headers(
        &mut h,
        20.into(),
        &req("/", &[("x-user", "c"), ("x-cost", "2")]),
    );
    e.request_headers(
        &mut h,
        21.into(),
        &req("/", &[("x-user", "c"), ("x-cost", "2")]),
    );
    assert_eq!(h.sent.len(), 4);
}

type Worker = (Engine, Rc<Recorder>);

/// Two workers of one proxy (queues 1 and 2) on one fake host, exact mode.
fn two_workers() -> (Worker, Worker, Fake) {
    two_workers_with("", EXACT)
}

/// [`two_workers`] with the top-level fields `top` and the rule `rule`.
fn two_workers_with(top: &str, rule: &str) -> (Worker, Worker, Fake) {
    let (mut w1, mut w2) = (engine(top, rule), engine(top, rule));
    let mut h = Fake::default();
    for (q, w) in [(1, &mut w1.0), (2, &mut w2.0)] {
        h.queues.insert(q, Default::default());
        w.set_queue(q);
    }
    (w1, w2, h)
}

/// What the host does for the messages on queue `q`: one `queue_ready` of its worker `w` each.
fn ready(w: &mut Engine, h: &mut Fake, q: u32) {
    for _ in 0..h.queues[&q].len() {
        w.queue_ready(h, q);
    }
}

/// Worker `w` (queue 1) gets hot on user "a": a call out (token 1, answered) and a second check
/// that goes in the chain's next call (token 2, out), so it claims the key.
fn lead_a(w: &mut Engine, h: &mut Fake) {
    w.request_headers(h, 10.into(), &user("a"));
    w.request_headers(h, 11.into(), &user("a"));
    deliver(w, h, 1, 200, &answer(true, 9, 0, 100, 1));
    w.tick(h);
    assert_eq!(h.sent.len(), 2);
    assert_eq!(
        crate::shared::lead::Leaders::new(&*h.store, &w.plugin.ns).leader(&lease_key(w, "a")),
        Some(1)
    );
}

/// Worker 2's check 20 of "a" goes to worker 1, which leads the key ([`lead_a`]): queued behind
/// worker 1's call out, and with `out`, in its next call (token 3), once that one is answered.
fn send_20_to_the_leader(w1: &mut Engine, w2: &mut Engine, h: &mut Fake, out: bool) {
    w2.request_headers(h, 20.into(), &user("a"));
    ready(w1, h, 1);
    if out {
        deliver(w1, h, 2, 200, &answer(true, 8, 0, 100, 1));
        assert_eq!(h.sent.len(), 3, "20 rides worker 1's call");
    }
}

/// A leader's engine replaced or gone: its places in the leader table go with it, so the other
/// workers call for the key themselves rather than send checks to a queue nobody reads.
#[test]
fn an_engine_that_goes_frees_the_keys_it_leads() {
    for same_root in [true, false] {
        let ((mut w1, _), _, mut h) = two_workers();
        lead_a(&mut w1, &mut h);
        let _ = w1.hand_over(&mut h, same_root);
        let leaders = crate::shared::lead::Leaders::new(&*h.store, &w1.plugin.ns);
        assert_eq!(leaders.leader(&lease_key(&w1, "a")), None, "{same_root}");
    }
}

/// A leader's engine replaced or gone with another worker's check of its key on hand: waiting
/// for its next call (nothing ran for it), the check's worker sends it at once; in its call out,
/// the next engine answers it on the same root, and with the root gone (it may have run) it gets
/// its worker's failure mode. Never the wait for the leader's silence, then a second call.
#[test]
fn checks_sent_to_a_leader_that_goes_are_sent_again_answered_or_failed_at_once() {
    for (same_root, out) in [(true, false), (false, false), (true, true), (false, true)] {
        let case = format!("same root {same_root}, its call out {out}");
        let ((mut w1, _), (mut w2, rec2), mut h) = two_workers();
        lead_a(&mut w1, &mut h);
        send_20_to_the_leader(&mut w1, &mut w2, &mut h, out);
        let sent = h.sent.len();
        let pending = w1.hand_over(&mut h, same_root);
        let (mut next, _) = engine("", EXACT);
        next.set_queue(1);
        next.adopt(&mut h, pending);
        ready(&mut w2, &mut h, 2);
        match (same_root, out) {
            (_, false) => {
                assert_eq!(h.sent.len(), sent + 1, "{case}: worker 2 calls for 20");
                assert_eq!(h.status_of(20), None, "{case}");
                deliver(
                    &mut w2,
                    &mut h,
                    sent as u32 + 1,
                    200,
                    &answer(true, 7, 0, 100, 1),
                );
                assert!(h.resumed.contains(&20), "{case}: admitted by its own call");
            }
            (true, true) => {
                assert!(
                    !h.resumed.contains(&20),
                    "{case}: its answer is still to come"
                );
                deliver(&mut next, &mut h, 3, 200, &answer(true, 7, 0, 100, 1));
                ready(&mut w2, &mut h, 2);
                assert!(h.resumed.contains(&20), "{case}: admitted by Redis' answer");
                assert_eq!(rec2.get(0, Counter::Allowed), 1, "{case}");
            }
            (false, true) => {
                // The local fallback bucket (the default failure mode) admits.
                assert!(h.resumed.contains(&20), "{case}: its failure mode, now");
                assert_eq!(rec2.get(0, Counter::BackendCalls), 0, "{case}: never twice");
            }
        }
        assert_eq!(h.sent.len(), sent + usize::from(!out), "{case}");
    }
}

/// The same with the leader's call for another worker's check still in its open batch, carrying
/// a usage settlement of the key: the settlement goes back to shared data, and the check back to
/// its worker, at once.
#[test]
fn a_check_in_a_gone_leaders_open_batch_goes_back_with_a_settlement_beside_it() {
    let rule = r#"{"name":"per-user","key":["header:x-user"],"rate":10,"burst":20,
        "usage":{"header":"x-usage-tokens","flush_ms":10000}}"#;
    let top = r#""backend":{"batch_max_keys":8},"#;
    let ((mut w1, _), (mut w2, _), mut h) = two_workers_with(top, rule);
    // Worker 1's flights had company (c's check gathered behind a's), and a's usage settles 4
    // more than it paid, pending for the key's next call.
    w1.request_headers(&mut h, 10.into(), &user("a"));
    w1.request_headers(&mut h, 11.into(), &user("c"));
    deliver(&mut w1, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    deliver(&mut w1, &mut h, 2, 200, &answer(true, 19, 0, 100, 1));
    w1.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "5")]));
    w1.done(&mut h, 10.into());
    // A record names worker 1 the key's leader: worker 2 sends it its check of a.
    let key = lease_key(&w1, "a");
    let leaders = crate::shared::lead::Leaders::new(&*h.store, &w1.plugin.ns);
    assert_eq!(leaders.claim(&key, 1).unwrap(), Some(1));
    w2.request_headers(&mut h, 20.into(), &user("a"));
    w1.queue_ready(&mut h, 1);
    assert_eq!(h.sent.len(), 2, "its call waits in worker 1's open batch");
    let pending = w1.hand_over(&mut h, false);
    let (mut next, _) = engine(top, rule);
    next.set_queue(3);
    next.adopt(&mut h, pending);
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.sent.len(), 3, "worker 2 calls for 20 at once");
    assert!(
        h.sent[2].contains("/1/0/0/4%3A"),
        "with the settlement: {}",
        h.sent[2]
    );
}

/// A leader's call for another worker's check, adopted by the engine on the same root, answers
/// that check, and only that: the next engine's own chain of the key goes on with its own call.
#[test]
fn an_adopted_leaders_call_does_not_move_the_next_engines_chain() {
    let ((mut w1, _), (mut w2, _), mut h) = two_workers();
    lead_a(&mut w1, &mut h);
    send_20_to_the_leader(&mut w1, &mut w2, &mut h, true);
    let pending = w1.hand_over(&mut h, true);
    let (mut next, _) = engine("", EXACT);
    next.set_queue(1);
    next.adopt(&mut h, pending);
    next.request_headers(&mut h, 30.into(), &user("a"));
    next.request_headers(&mut h, 31.into(), &user("a"));
    assert_eq!(h.sent.len(), 4, "30's call is out, 31 waits for it");
    deliver(&mut next, &mut h, 3, 200, &answer(true, 7, 0, 100, 1));
    ready(&mut w2, &mut h, 2);
    assert!(h.resumed.contains(&20));
    assert_eq!(h.sent.len(), 4, "31 still waits for 30's call");
    deliver(&mut next, &mut h, 4, 200, &answer(true, 6, 0, 100, 1));
    assert_eq!(h.sent.len(), 5, "then it goes");
}

#[test]
fn a_hot_key_shares_one_call_across_the_proxys_workers() {
    let ((mut w1, rec1), (mut w2, rec2), mut h) = two_workers();
    lead_a(&mut w1, &mut h);
    w2.request_headers(&mut h, 20.into(), &user("a"));
    w2.request_headers(&mut h, 21.into(), &user("a"));
    assert_eq!(
        h.sent.len(),
        2,
        "worker 2 sent its checks to the leader, no call"
    );
    assert_eq!(rec2.get(0, Counter::Forwarded), 2);
    ready(&mut w1, &mut h, 1);
    w1.request_headers(&mut h, 12.into(), &user("a"));
    deliver(&mut w1, &mut h, 2, 200, &answer(true, 8, 0, 100, 1));
    assert_eq!(h.sent.len(), 3, "one call for the three waiting");
    assert!(h.sent[2].ends_with("/1/3/0/0"), "{}", h.sent[2]);
    // Two tokens left: the first two in arrival order (worker 2's) are admitted.
    deliver(&mut w1, &mut h, 3, 200, &answer(true, 0, 0, 100, 2));
    assert_eq!(h.status_of(12), Some(429));
    assert_eq!(h.resumed, [10, 11]);
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.resumed, [10, 11, 20, 21]);
    assert_eq!(rec1.get(0, Counter::BackendCalls), 3);
    assert_eq!(rec2.get(0, Counter::BackendCalls), 0);
    assert_eq!(rec2.get(0, Counter::Allowed), 2);
    for ctx in [20, 21] {
        w2.response_headers(&mut h, ctx.into(), &resp(&[]));
        w2.done(&mut h, ctx.into());
    }
    let sent: Vec<_> = h
        .added
        .iter()
        .map(|(_, hs)| header(hs, "ratelimit"))
        .collect();
    let remaining = ["\"per-user\";r=1;t=1", "\"per-user\";r=0;t=1"];
    assert_eq!(sent, remaining.map(Some), "what the leader's answer said");
    // The leader's chain ends with nothing waiting: the key is free again.
    assert_eq!(w1.load().1, 0);
    let leaders = crate::shared::lead::Leaders::new(&*h.store, &w1.plugin.ns);
    assert_eq!(leaders.leader(&lease_key(&w1, "a")), None);
    assert_eq!(w2.load(), (0, 0, 0));
}

#[test]
fn a_worker_whose_chain_goes_on_while_another_leads_ends_it_with_one_last_call() {
    let ((mut w1, _), (mut w2, rec2), mut h) = two_workers();
    w2.request_headers(&mut h, 20.into(), &user("a"));
    w2.request_headers(&mut h, 21.into(), &user("a"));
    assert_eq!(h.sent.len(), 1, "nobody leads yet: worker 2 calls");
    w1.request_headers(&mut h, 10.into(), &user("a"));
    w1.request_headers(&mut h, 11.into(), &user("a"));
    deliver(&mut w1, &mut h, 2, 200, &answer(true, 9, 0, 100, 1));
    w1.tick(&mut h);
    assert_eq!(
        h.sent.len(),
        3,
        "worker 1 claimed the key with its second call"
    );
    deliver(&mut w2, &mut h, 1, 200, &answer(true, 9, 0, 100, 1));
    w2.tick(&mut h);
    // 21 waited for worker 2's call out: it goes in worker 2's next call, its own (sending it to
    // the leader would make it wait for the leader's call out too). That call is the chain's last.
    assert_eq!(h.sent.len(), 4);
    assert_eq!(rec2.get(0, Counter::Forwarded), 0);
    w2.request_headers(&mut h, 22.into(), &user("a"));
    assert_eq!(h.sent.len(), 4, "worker 2's next check went to the leader");
    assert_eq!(rec2.get(0, Counter::Forwarded), 1);
    deliver(&mut w2, &mut h, 4, 200, &answer(true, 8, 0, 100, 1));
    assert_eq!(h.sent.len(), 4, "no chain left on worker 2");
    ready(&mut w1, &mut h, 1);
    deliver(&mut w1, &mut h, 3, 200, &answer(true, 7, 0, 100, 1));
    deliver(&mut w1, &mut h, 5, 200, &answer(true, 6, 0, 100, 1));
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.resumed, [10, 20, 21, 11, 22]);
}

#[test]
fn a_failed_shared_call_gives_the_asking_worker_its_failure_mode() {
    let ((mut w1, _), (mut w2, rec2), mut h) = two_workers();
    lead_a(&mut w1, &mut h);
    w2.request_headers(&mut h, 20.into(), &user("a"));
    ready(&mut w1, &mut h, 1);
    deliver(&mut w1, &mut h, 2, 503, b"");
    assert_eq!(h.sent.len(), 3, "worker 2's check rides the next call");
    deliver(&mut w1, &mut h, 3, 503, b"");
    ready(&mut w2, &mut h, 2);
    // Worker 2's own failure mode decides: the local fallback bucket (the default) admits.
    assert_eq!(h.resumed, [10, 11, 20]);
    assert_eq!(rec2.get(0, Counter::Allowed), 1);
    assert_eq!(rec2.get(0, Counter::BackendCalls), 0);
}

#[test]
fn a_check_sent_to_a_silent_leader_goes_again_from_its_worker() {
    let ((mut w1, _), (mut w2, _), mut h) = two_workers();
    lead_a(&mut w1, &mut h);
    w2.request_headers(&mut h, 20.into(), &user("a"));
    assert_eq!(h.sent.len(), 2);
    let patience = 2 * w2.plugin.config.backend.timeout_ms;
    assert_eq!(h.tick, patience, "the tick watches the leader's answer");
    h.now += patience;
    w2.tick(&mut h);
    assert_eq!(h.sent.len(), 3, "worker 2 calls itself");
    let leaders = crate::shared::lead::Leaders::new(&*h.store, &w2.plugin.ns);
    assert_eq!(
        leaders.leader(&lease_key(&w2, "a")),
        None,
        "the leader is forgotten"
    );
    deliver(&mut w2, &mut h, 3, 200, &answer(true, 5, 0, 100, 1));
    assert_eq!(h.resumed, [10, 20]);
    // The leader's late answer finds nothing waiting.
    ready(&mut w1, &mut h, 1);
    deliver(&mut w1, &mut h, 2, 200, &answer(true, 5, 0, 100, 1));
    deliver(&mut w1, &mut h, 4, 200, &answer(true, 5, 0, 100, 1));
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.resumed, [10, 20, 11]);
    assert!(h.responded.is_empty());
}

#[test]
fn a_check_sent_to_a_worker_with_no_call_out_goes_at_once() {
    let ((mut w1, _), (mut w2, _), mut h) = two_workers();
    let key = lease_key(&w1, "a");
    let leaders = crate::shared::lead::Leaders::new(&*h.store, &w1.plugin.ns);
    assert_eq!(
        leaders.claim(&key, 1).unwrap(),
        Some(1),
        "a record left behind"
    );
    w2.request_headers(&mut h, 20.into(), &user("a"));
    assert!(h.sent.is_empty());
    ready(&mut w1, &mut h, 1);
    assert_eq!(h.sent.len(), 1, "sent from worker 1's root context");
    deliver(&mut w1, &mut h, 1, 200, &answer(true, 5, 0, 100, 1));
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.resumed, [20]);
    // Garbage on a queue is dropped.
    h.enqueue(1, b"r x\nhello");
    ready(&mut w1, &mut h, 1);
    assert_eq!(w1.load(), (0, 0, 0));
}

#[test]
fn a_check_sent_to_a_workers_older_queue_is_served() {
    let ((mut w1, _), (mut w2, _), mut h) = two_workers();
    lead_a(&mut w1, &mut h);
    // Worker 1 is configured again in the same VM: a new queue; the table still names the old.
    h.queues.insert(3, Default::default());
    w1.set_queue(3);
    w2.request_headers(&mut h, 20.into(), &user("a"));
    ready(&mut w1, &mut h, 1);
    deliver(&mut w1, &mut h, 2, 200, &answer(true, 5, 0, 100, 1));
    deliver(&mut w1, &mut h, 3, 200, &answer(true, 4, 0, 100, 1));
    ready(&mut w2, &mut h, 2);
    assert_eq!(h.resumed, [10, 11, 20]);
}

// ----- batched metrics -----

#[test]
fn counts_reach_the_host_once_due_and_exactly_once_with_a_tick_only_meanwhile() {
    let (mut e, rec) = batched_engine("", EXACT);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(h.resumed, [10]);
    e.done(&mut h, 10.into());
    assert_eq!(rec.get(0, Counter::Allowed), 0, "counted in the VM only");
    assert_eq!(rec.get(0, Counter::BackendCalls), 0);
    assert_eq!(rec.latencies().len(), 1, "a latency goes at once");
    assert_eq!(
        h.tick, METRICS_FLUSH_MS,
        "nothing else is due: the tick is the flush's"
    );
    let sets = h.tick_sets;
    h.now = 500;
    send(&mut e, &mut h, 11, &user("b"));
    deliver(&mut e, &mut h, 2, 200, &answer(true, 19, 0, 100, 1));
    assert_eq!(
        h.tick_sets, sets,
        "the running tick is not re-armed per request"
    );
    h.now = METRICS_FLUSH_MS - 1;
    e.tick(&mut h);
    assert_eq!(rec.get(0, Counter::Allowed), 0, "not due yet");
    assert_eq!(h.tick, 1, "the tick aims at the deadline");
    h.now = METRICS_FLUSH_MS;
    e.tick(&mut h);
    assert_eq!(rec.get(0, Counter::Allowed), 2);
    assert_eq!(rec.get(0, Counter::BackendCalls), 2);
    assert_eq!(h.tick, 0, "nothing pending: no tick");
    h.now += 5 * METRICS_FLUSH_MS;
    e.tick(&mut h);
    e.plugin().metrics.flush();
    assert_eq!(rec.get(0, Counter::Allowed), 2, "each count pushed once");
    assert_eq!(rec.get(0, Counter::BackendCalls), 2);
}

#[test]
fn a_busy_worker_flushes_on_a_request_once_due_with_no_host_call_per_admission() {
    let (mut e, rec) = batched_engine("", LEASE);
    let mut h = Fake::default();
    deposit_at_0(&h, &e, TWENTY_LEASED);
    assert_eq!(
        e.request_headers(&mut h, 10.into(), &user("a")),
        Action::Continue
    );
    let sets = h.tick_sets;
    for ctx in 11..20 {
        h.now = u64::from(ctx);
        assert_eq!(
            e.request_headers(&mut h, ctx.into(), &user("a")),
            Action::Continue
        );
        e.response_headers(&mut h, ctx.into(), &resp(&[]));
        e.done(&mut h, ctx.into());
    }
    assert_eq!(h.tick_sets, sets, "local admissions arm nothing");
    assert_eq!(rec.get(0, Counter::LocalAllowed), 0);
    // The worker's tick at the stash's expiry drops what is left; the counts are not due yet.
    h.now = 400;
    e.tick(&mut h);
    assert_eq!(rec.get(0, Counter::LocalAllowed), 0);
    // The lease has expired by then: this one sends a lease call.
    h.now = METRICS_FLUSH_MS;
    assert_eq!(
        e.request_headers(&mut h, 20.into(), &user("a")),
        Action::Pause
    );
    assert_eq!(rec.get(0, Counter::LocalAllowed), 10);
    assert_eq!(rec.get(0, Counter::Allowed), 10);
    assert_eq!(
        rec.get(0, Counter::BackendCalls),
        1,
        "the flushing request's own counts go with the batch"
    );
    assert!(!e.plugin().metrics.pending());
}

#[test]
fn counts_made_on_a_response_get_a_tick_too() {
    let (mut e, rec) = batched_engine("", LLM);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 59, 0, 100, 1));
    h.now = METRICS_FLUSH_MS + 1;
    e.tick(&mut h);
    assert_eq!(rec.get(0, Counter::Allowed), 1);
    assert_eq!(h.tick, 0, "idle");
    e.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "40")]));
    e.done(&mut h, 10.into());
    assert_eq!(h.tick, 100, "the settlement's flush_ms");
    h.now += 100;
    e.tick(&mut h);
    assert!(h.sent.last().unwrap().ends_with("/0/0/0/39"), "settled");
    assert_eq!(rec.get(0, Counter::UsageCharged), 0, "still in the VM");
    assert!(h.tick > 0, "ticking for the counts");
    h.now += METRICS_FLUSH_MS;
    e.tick(&mut h);
    assert_eq!(rec.get(0, Counter::UsageCharged), 39);
}

// ----- usage-based limits -----

const LLM: &str = r#"{"name":"llm","key":["header:x-user"],"rate":1,"period_ms":60000,"burst":100,
    "usage":{"header":"x-usage-tokens"}}"#;

/// The settlement a call carried (its last argument).
/// What the last argument of a call settles: its charge less its refund (the tracked form
/// `<charge>:<refund>:<epoch>:<mark>`, its colons encoded).
fn settle_arg(body: &str) -> i64 {
    let last = body.rsplit('/').next().unwrap();
    match last.split("%3A").collect::<Vec<_>>()[..] {
        [charge, refund, _epoch, _mark] => {
            charge.parse::<i64>().unwrap() - refund.parse::<i64>().unwrap()
        }
        _ => last.parse().unwrap(),
    }
}

#[test]
fn usage_rides_on_the_next_call_of_the_key() {
    let (mut e, rec) = engine("", LLM);
    let mut h = Fake::default();
    for (i, ctx) in (10..13u32).enumerate() {
        e.request_headers(&mut h, ctx.into(), &user("a"));
        let t = *h.tokens().last().unwrap();
        assert_eq!(settle_arg(&h.out[&t].body), if i == 0 { 0 } else { 39 });
        deliver(&mut e, &mut h, t, 200, &answer(true, 59, 0, 100, 1));
        assert_eq!(
            e.response_headers(&mut h, ctx.into(), &resp(&[("x-usage-tokens", "40")])),
            None
        );
        e.done(&mut h, ctx.into());
    }
    assert_eq!(rec.get(0, Counter::UsageCharged), 3 * 39);
    assert_eq!(
        h.tick, 100,
        "the last charge waits for a call at most flush_ms"
    );
    h.now = 100;
    e.tick(&mut h);
    let flush = h.sent.last().unwrap();
    assert!(flush.ends_with("/0/0/0/39"), "settle only, cost 0: {flush}");
    deliver(&mut e, &mut h, 4, 200, &answer(true, 0, 0, 100, 0));
    // Nothing pending any more: the next call carries nothing, and no flush is due.
    e.request_headers(&mut h, 20.into(), &user("a"));
    assert_eq!(settle_arg(h.sent.last().unwrap()), 0);
}

#[test]
fn a_settlement_kept_pending_on_an_idle_worker_gets_its_tick() {
    let (mut e, _) = engine("", LLM);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 59, 0, 100, 1));
    assert_eq!(h.tick, 0, "idle");
    e.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "40")]));
    e.done(&mut h, 10.into());
    assert_eq!(h.tick, 100, "the settlement's flush_ms");
    h.now = 100;
    e.tick(&mut h);
    let flush = h.sent.last().unwrap();
    assert!(
        flush.ends_with("/0/0/0/39"),
        "settled with no other request: {flush}"
    );
}

#[test]
fn a_failed_call_puts_its_settlement_back() {
    let (mut e, _) = engine(r#""failure_mode":"open","#, LLM);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 59, 0, 100, 1));
    e.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "11")]));
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(settle_arg(&h.out[&2].body), 10);
    deliver(&mut e, &mut h, 2, 0, b"");
    assert_eq!(h.resumed, [10, 11], "failure mode open");
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(settle_arg(&h.out[&3].body), 10, "carried again");
}

/// A flush the open breaker refuses waits for the breaker, not for the next millisecond: the tick
/// fires a handful of times in a cool-off of 5 s, not once per `flush_ms` (1 ms here).
#[test]
fn a_flush_with_the_breaker_open_waits_for_the_breaker() {
    let top =
        r#""failure_mode":"open","backend":{"breaker_failures":1,"breaker_cooloff_ms":5000},"#;
    let rule = r#"{"name":"llm","key":["header:x-user"],"rate":1,"period_ms":60000,"burst":100,
        "usage":{"header":"x-usage-tokens","flush_ms":1}}"#;
    let (mut e, _) = engine(top, rule);
    let mut h = Fake::default();
    // Two keys with usage pending, then a failed call opens the breaker until 5000.
    for (ctx, u) in [(10, "a"), (11, "b")] {
        e.request_headers(&mut h, ctx.into(), &user(u));
        let t = *h.tokens().last().unwrap();
        deliver(&mut e, &mut h, t, 200, &answer(true, 59, 0, 100, 1));
        e.response_headers(&mut h, ctx.into(), &resp(&[("x-usage-tokens", "40")]));
        e.done(&mut h, ctx.into());
    }
    e.request_headers(&mut h, 12.into(), &user("c"));
    let t = *h.tokens().last().unwrap();
    deliver(&mut e, &mut h, t, 0, b"");
    let sent = h.sent.len();
    assert_eq!(h.tick, 1, "the flushes are due in 1 ms");
    // The host fires the tick as asked, until the cool-off is over.
    let mut ticks = 0;
    while h.now < 5000 && h.tick > 0 && ticks < 10_000 {
        h.now += h.tick;
        e.tick(&mut h);
        ticks += 1;
    }
    eprintln!("breaker open: {ticks} ticks in the 5 s cool-off with two flushes due");
    assert_eq!(h.now, 5000, "the next tick is the breaker's");
    assert!(ticks <= 2, "{ticks} ticks while the breaker was open");
    // Then one flush is the probe; the other key's waits for its answer's cool-off.
    assert_eq!(h.sent.len(), sent + 1, "one probe");
    let probe = h.sent.last().unwrap();
    assert!(probe.ends_with("/0/0/0/39"), "a flush: {probe}");
    let mut more = 0;
    while h.now < 10_000 && h.tick > 0 && more < 10_000 {
        h.now += h.tick;
        e.tick(&mut h);
        more += 1;
    }
    assert!(more <= 3, "{more} ticks while the probe was out");
}

// ----- a new configuration -----

/// A worker's engine replaced by a new configuration (its rules in another order): the settlement
/// the old engine had scheduled is flushed by the new one, under the rule of the same name.
#[test]
fn a_pending_settlement_survives_a_new_configuration() {
    let (mut old, _) = engine("", LLM);
    let mut h = Fake::default();
    old.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut old, &mut h, 1, 200, &answer(true, 59, 0, 100, 1));
    old.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "40")]));
    old.done(&mut h, 10.into());
    assert_eq!(h.tick, 100, "the old engine's flush");
    // What the filter did before: a fresh engine in its place knows of nothing to flush.
    let reordered = [EXACT, LLM].join(",");
    let (mut fresh, _) = engine("", &reordered);
    let sent = h.sent.len();
    h.now = 100;
    fresh.tick(&mut h);
    assert_eq!(h.sent.len(), sent, "a fresh engine alone never flushes it");
    let (mut new, _) = engine("", &reordered);
    h.tick = 0;
    let pending = old.hand_over(&mut h, true);
    let left = new.adopt(&mut h, pending);
    assert!(left.is_empty());
    assert_eq!(h.tick, 1, "the new engine's tick, for the flush due now");
    new.tick(&mut h);
    assert_eq!(h.sent.len(), sent + 1);
    let flush = h.sent.last().unwrap();
    assert!(flush.contains("llm"), "the rule of the same name: {flush}");
    assert!(flush.ends_with("/0/0/0/39"), "settled: {flush}");
    old.tick(&mut h);
    assert_eq!(
        h.sent.len(),
        sent + 1,
        "the old engine flushes nothing more"
    );
}

/// A worker's engine replaced on its root (the filter's HTTP contexts follow their root's slot, so
/// every later event of a request admitted by the old engine reaches the new one) while a usage
/// admission waits for its answer: the answer's usage is still charged, and a request held for
/// its reservation is still let through when due. Neither may be lost with the old engine: a
/// client whose long answer spans a configuration push would pay only its up-front cost.
#[test]
fn an_admission_waiting_for_its_answer_survives_a_new_configuration() {
    let (mut old, rec) = engine("", LLM);
    let mut h = Fake::default();
    old.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut old, &mut h, 1, 200, &answer(true, 59, 0, 100, 1));
    assert!(
        h.resumed.contains(&10),
        "admitted at its up-front cost of 1"
    );
    let (mut new, rec_new) = engine("", LLM);
    let pending = old.hand_over(&mut h, true);
    assert!(new.adopt(&mut h, pending).is_empty());
    drop(old);
    // The answer comes to the engine in the slot now: it used 40.
    new.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "40")]));
    new.done(&mut h, 10.into());
    let charged = rec.get(0, Counter::UsageCharged) + rec_new.get(0, Counter::UsageCharged);
    assert_eq!(
        charged, 39,
        "the usage of an answer that came after the push"
    );
    // The key's next call carries it.
    new.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(settle_arg(h.sent.last().unwrap()), 39);
}

/// A request held for its reservation when its root's engine is replaced is let through by the
/// next engine when due (not before), and one whose client leaves meanwhile is still given back.
#[test]
fn a_request_held_for_its_reservation_survives_a_new_configuration() {
    let rules = r#"{"name":"hooks","key":["header:x-user"],"rate":10,"burst":5,"max_wait_ms":800}"#;
    let (mut old, _) = engine("", rules);
    let mut h = Fake::at(1000);
    old.request_headers(&mut h, 10.into(), &user("a"));
    old.request_headers(&mut h, 11.into(), &user("b"));
    deliver(&mut old, &mut h, 1, 200, &answer(true, 0, 300, 800, 1));
    deliver(&mut old, &mut h, 2, 200, &answer(true, 0, 300, 800, 1));
    let (mut new, rec) = engine("", rules);
    let pending = old.hand_over(&mut h, true);
    assert!(new.adopt(&mut h, pending).is_empty());
    drop(old);
    h.now = 1299;
    new.tick(&mut h);
    assert!(h.resumed.is_empty(), "not before its time");
    new.done(&mut h, 11.into());
    assert_eq!(
        rec.get(0, Counter::Refunded),
        1,
        "b left while held: given back"
    );
    h.now = 1300;
    new.tick(&mut h);
    assert_eq!(h.resumed, [10], "let through when due");
}

/// An engine (failure mode open) whose call out (token 2) carries user "a"'s charge of 39: the
/// usage of an admission before it.
fn charge_in_flight() -> (Engine, Fake) {
    let (mut old, _) = engine(r#""failure_mode":"open","#, LLM);
    let mut h = Fake::default();
    old.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut old, &mut h, 1, 200, &answer(true, 59, 0, 100, 1));
    old.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "40")]));
    old.done(&mut h, 10.into());
    old.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(settle_arg(&h.out[&2].body), 39, "the next call carries it");
    (old, h)
}

/// A call in flight that carries a settlement when its root is configured again: its answer comes
/// to the new engine, and a failure puts the settlement back there, to be flushed.
#[test]
fn a_settlement_in_flight_survives_a_new_configuration() {
    let (mut old, mut h) = charge_in_flight();
    let (mut new, _) = engine(r#""failure_mode":"open","#, LLM);
    let pending = old.hand_over(&mut h, true);
    assert_eq!(pending.len(), 2, "the flush and the call");
    assert!(new.adopt(&mut h, pending).is_empty());
    deliver(&mut new, &mut h, 2, 0, b"");
    let sent = h.sent.len();
    h.now += 100;
    new.tick(&mut h);
    assert_eq!(h.sent.len(), sent + 1, "flushed by the new engine");
    assert_eq!(settle_arg(h.sent.last().unwrap()), 39, "put back whole");
    // Answered this time: nothing is pending any more.
    deliver(&mut new, &mut h, 3, 200, &answer(true, 20, 0, 100, 0));
    new.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(settle_arg(h.sent.last().unwrap()), 0);
}

/// A root deleted while a call carrying a charge is out (its answer will reach no engine): the
/// charge is pending again in shared data, and the configuration in force flushes it.
#[test]
fn a_charge_in_flight_survives_its_root_being_deleted() {
    let (mut old, mut h) = charge_in_flight();
    let pending = old.hand_over(&mut h, false);
    let (mut new, _) = engine(r#""failure_mode":"open","#, LLM);
    assert!(new.adopt(&mut h, pending).is_empty());
    let sent = h.sent.len();
    h.now += 100;
    new.tick(&mut h);
    assert_eq!(
        h.sent.len(),
        sent + 1,
        "flushed by the configuration in force"
    );
    assert_eq!(settle_arg(h.sent.last().unwrap()), 39, "put back whole");
}

/// Settlements of a rule the new configuration no longer has, or of another namespace (another
/// `key_prefix`), are not adopted: their buckets are no longer used.
#[test]
fn settlements_of_a_gone_rule_are_not_adopted() {
    let (mut old, _) = engine("", LLM);
    let mut h = Fake::default();
    old.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut old, &mut h, 1, 200, &answer(true, 59, 0, 100, 1));
    old.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "40")]));
    let (mut renamed, _) = engine("", &LLM.replace("\"llm\"", "\"llm2\""));
    let pending = old.hand_over(&mut h, false);
    let left = renamed.adopt(&mut h, pending);
    assert_eq!(left.len(), 1);
    let (mut other_ns, _) = engine(r#""key_prefix":"other","#, LLM);
    let left = other_ns.adopt(&mut h, left);
    assert_eq!(left.len(), 1);
    let (mut same, _) = engine("", LLM);
    assert!(same.adopt(&mut h, left).is_empty());
}

#[test]
fn refunds_trailers_bodies_and_bad_values() {
    let rules = r#"{"name":"h","key":["header:x-user"],"rate":1,"burst":100,"cost":5,
            "usage":{"header":"x-used"}},
        {"name":"b","key":["header:x-user"],"rate":1,"burst":100,
            "usage":{"body_field":"usage.total_tokens"}}"#;
    let (mut e, rec) = engine("", rules);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 50, 0, 100, 5));
    deliver(&mut e, &mut h, 2, 200, &answer(true, 50, 0, 100, 1));
    let sse = resp(&[("content-type", "text/event-stream")]);
    assert_eq!(
        e.response_headers(&mut h, 10.into(), &sse),
        Some(Look::Whole),
        "the body is watched"
    );
    e.response_body(
        &mut h,
        10.into(),
        Chunk::whole(b"data: {\"usage\":{\"total_"),
        false,
    );
    e.response_body(
        &mut h,
        10.into(),
        Chunk::whole(b"tokens\":30}}\n\ndata: [DONE]\n\n"),
        true,
    );
    assert_eq!(rec.get(1, Counter::UsageCharged), 29);
    e.response_trailers(&mut h, 10.into(), &resp(&[("x-used", "2")]));
    assert_eq!(
        rec.get(0, Counter::UsageRefunded),
        3,
        "used 2 of the 5 paid"
    );
    e.done(&mut h, 10.into());
    // Bad values are counted and charged the worst case: the largest usage read (2 and 30),
    // never below the up-front cost (5 and 1).
    e.request_headers(&mut h, 11.into(), &user("b"));
    deliver(&mut e, &mut h, 3, 200, &answer(true, 50, 0, 100, 5));
    deliver(&mut e, &mut h, 4, 200, &answer(true, 50, 0, 100, 1));
    let html = resp(&[("x-used", "-4"), ("content-type", "text/html")]);
    assert_eq!(e.response_headers(&mut h, 11.into(), &html), None);
    assert_eq!(rec.get(0, Counter::UsageInvalid), 1);
    assert_eq!(rec.get(1, Counter::UsageInvalid), 1);
    assert_eq!(rec.get(0, Counter::UsageRefunded), 3, "5 paid, 5 charged");
    assert_eq!(rec.get(1, Counter::UsageCharged), 2 * 29);
    // Absurd usage is clamped to four bursts.
    e.request_headers(&mut h, 12.into(), &user("c"));
    deliver(&mut e, &mut h, 5, 200, &answer(true, 50, 0, 100, 5));
    deliver(&mut e, &mut h, 6, 200, &answer(true, 50, 0, 100, 1));
    e.response_headers(&mut h, 12.into(), &resp(&[("x-used", "999999999999")]));
    assert_eq!(rec.get(0, Counter::UsageClamped), 1);
    assert_eq!(rec.get(0, Counter::UsageCharged), 395);
}

#[test]
fn a_failure_mode_admission_settles_nothing() {
    let (mut e, rec) = engine(r#""failure_mode":"open","#, LLM);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 0, b"");
    e.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "40")]));
    assert_eq!(rec.get(0, Counter::UsageCharged), 0);
}

#[test]
fn a_verdict_reached_inside_request_headers_is_returned_not_resumed() {
    // failure_mode local with a failed dispatch: admitted by the fallback bucket, with headers.
    let (mut e, _) = engine("", EXACT);
    let mut h = Fake {
        fail_dispatch: true,
        ..Fake::default()
    };
    assert_eq!(
        e.request_headers(&mut h, 10.into(), &user("a")),
        Action::Continue
    );
    assert!(h.resumed.is_empty(), "never resumed from its own callback");
    e.response_headers(&mut h, 10.into(), &resp(&[]));
    assert!(header(&h.added[0].1, "ratelimit").is_some());
    // The breaker open, failure_mode open: the same.
    let top = r#""failure_mode":"open","backend":{"breaker_failures":1},"#;
    let (mut e, _) = engine(top, EXACT);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 0, b"");
    assert_eq!(
        e.request_headers(&mut h, 11.into(), &user("b")),
        Action::Continue
    );
    assert_eq!(h.resumed, [10]);
}

/// An engine with `make bench`'s tollgate-lease rule (IETF headers, a limit never reached), its
/// counts batched as a real worker's.
fn bench_lease_engine() -> Engine {
    batched_engine(
        r#""response_headers":"ietf","#,
        r#"{"name":"per-user","match":{"path_prefix":"/api/"},"key":["header:x-user"],
            "mode":"lease","rate":1000000,"burst":1000000}"#,
    )
    .0
}

/// A request's headers as one encoded map, read the way the filter reads Envoy's (`pairs`).
struct Encoded(Vec<u8>);

impl RequestView for Encoded {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        crate::pairs::lookup(&self.0, name)
    }
    fn client_ip(&self) -> Option<Vec<u8>> {
        Some(b"127.0.0.1".to_vec())
    }
}

/// Not a check: a loop over the lease path's local admissions for a profiler
/// (`valgrind --tool=callgrind <test binary> profile_local_path --ignored --exact`).
#[test]
#[ignore]
fn profile_local_path() {
    let mut e = bench_lease_engine();
    let mut h = Fake::default();
    // The bench's request, read from one encoded map as the filter reads Envoy's.
    let r = Encoded(crate::pairs::encode(&[
        (":authority", "127.0.0.1:10000"),
        (":path", "/api/bench"),
        (":method", "GET"),
        (":scheme", "http"),
        ("user-agent", "h2load nghttp2/1.52.0"),
        ("x-user", "bench-user"),
        ("x-forwarded-proto", "http"),
        ("x-request-id", "0b6a2d0c-5a0e-4f4e-9f39-7d6c2f0a1b2c"),
    ]));
    let none = resp(&[]);
    for ctx in 10..200_010u32 {
        h.now = u64::from(ctx) / 100;
        e.request_headers(&mut h, ctx.into(), &r);
        for token in h.tokens() {
            grant_all(&mut e, &mut h, token);
        }
        e.response_headers(&mut h, ctx.into(), &none);
        e.done(&mut h, ctx.into());
        if h.now % 50 == 0 {
            e.tick(&mut h);
        }
        h.resumed.clear();
        h.added.clear();
    }
}

/// Not a check: exact mode at a hot key on two workers, eight checks per shared call (half of them
/// sent by the other worker), for a profiler (see `profile_local_path`).
#[test]
#[ignore]
fn profile_hot_exact() {
    let ((mut w1, _), (mut w2, _), mut h) = two_workers();
    lead_a(&mut w1, &mut h);
    let a = user("a");
    let mut ctx = 100u32;
    for round in 0..20_000u32 {
        for _ in 0..4 {
            w1.request_headers(&mut h, ctx.into(), &a);
            w2.request_headers(&mut h, ContextId::from(ctx + 1), &a);
            ctx += 2;
        }
        ready(&mut w1, &mut h, 1);
        let token = h.tokens()[0];
        deliver(&mut w1, &mut h, token, 200, &answer(true, 1000, 0, 100, 8));
        ready(&mut w2, &mut h, 2);
        for c in ctx - 8..ctx {
            let w = if c % 2 == 0 { &mut w1 } else { &mut w2 };
            w.response_headers(&mut h, c.into(), &resp(&[]));
            w.done(&mut h, c.into());
        }
        h.now = u64::from(round);
        h.resumed.clear();
        h.added.clear();
        h.sent.clear();
    }
}

/// The policy header of a rule is built once per configuration; a key whose override changes its
/// limits gets its own.
#[test]
fn the_policy_header_follows_an_overrides_limits() {
    let (mut e, _) = engine(
        "",
        r#"{"name":"per-user","key":["header:x-user"],"rate":10,"burst":20,
            "overrides":[{"key":["vip"],"rate":100,"burst":400}]}"#,
    );
    let mut h = Fake::default();
    for (ctx, who, policy) in [
        (10, "a", "\"per-user\";q=20;w=2"),
        (11, "vip", "\"per-user\";q=400;w=4"),
        (12, "b", "\"per-user\";q=20;w=2"),
    ] {
        e.request_headers(&mut h, ctx.into(), &user(who));
        let [t] = h.tokens()[..] else { panic!() };
        deliver(&mut e, &mut h, t, 200, &answer(true, 3, 0, 100, 1));
        e.response_headers(&mut h, ctx.into(), &resp(&[]));
        let added = &h.added.last().unwrap().1;
        assert_eq!(header(added, "ratelimit-policy"), Some(policy), "{who}");
        assert_eq!(header(added, "ratelimit"), Some("\"per-user\";r=3;t=1"));
        e.done(&mut h, ctx.into());
    }
}

/// Not a check: lease mode with every request a new key (one lease call each), for a profiler
/// (see `profile_local_path`).
#[test]
#[ignore]
fn profile_lease_new_keys() {
    let mut e = bench_lease_engine();
    let mut h = Fake::default();
    let none = resp(&[]);
    for ctx in 10..40_010u32 {
        h.now = u64::from(ctx) / 10;
        let r = user(&format!("user-{ctx}"));
        e.request_headers(&mut h, ctx.into(), &r);
        for token in h.tokens() {
            grant_all(&mut e, &mut h, token);
        }
        e.response_headers(&mut h, ctx.into(), &none);
        e.done(&mut h, ctx.into());
        e.tick(&mut h);
        h.resumed.clear();
        h.added.clear();
        h.sent.clear();
    }
}

/// Flights: checks of different keys sharing one backend request.
mod batch;
/// Flights against a hostile or confused backend, and the breaker's probe.
mod batch_attack;
/// The decision record and the local replies' details.
mod decision;
/// Lease mode with `max_wait_ms`: requests held for the proxy's reservation.
mod lease_hold;
/// Lease waiters that leave their key's queue: in a step each, as if they never waited.
mod lease_leave;
/// Lease waiters' patience: it bounds the wait for the lease call, and ends with it.
mod lease_patience;
/// Lease mode on a key the proxy is quiet on: exact checks, no holder record.
mod lease_quiet;
/// `charge_on`: settled by the answer's status.
mod outcome;
/// The penalty box: the script says a denial is the box's, the deny cache answers it.
mod penalty;
/// A request that never goes upstream gets back what the global bucket took.
mod refund;
/// Flights shared across a proxy's workers: checks relayed to the collector.
mod relay;
/// Refunds carry their take's spill epoch; failed calls' refunds.
mod spill;
/// The tick at a stash's lease expiry, whatever the worker's latest clock reading.
mod stash_tick;
/// Charges a failed call could not put back in a full settle table.
mod stranded;
/// Limits picked by a tier.
mod tiers;
/// Usage that never becomes readable.
mod unreadable;
