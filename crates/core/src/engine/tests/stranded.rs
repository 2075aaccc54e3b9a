//! Settlements stranded by a failed call whose key has no room in the settle table (its set is
//! full of other keys' pending settlements): a charge is kept by the worker and carried later,
//! once, never lost.

use super::*;
use crate::shared::settle;

/// `n` keys other than `key` whose pending settlements share `key`'s set of the settle table.
fn set_mates(key: &str, n: usize) -> Vec<String> {
    let set = |k: &str| crate::shared::hash(k) % settle::SETS;
    (0..)
        .map(|i| format!("other-{i}"))
        .filter(|k| k != key && set(k) == set(key))
        .take(n)
        .collect()
}

/// Fills `key`'s set with pending charges of other keys: no room is left for `key`.
fn fill_set_of(e: &Engine, h: &Fake, key: &str) -> Vec<String> {
    let mates = set_mates(key, settle::WAYS);
    for k in &mates {
        assert_eq!(
            settle::add_charge(&*h.store, &e.plugin.ns, k, 1, 1000),
            Ok(true)
        );
    }
    mates
}

/// An engine (failure mode open) whose call out (token 2) carries user "a"'s charge of 39, with
/// "a"'s set of the settle table full of other keys' settlements meanwhile.
fn charge_out_with_a_full_set(top: &str) -> (Engine, Fake, Rc<Recorder>, String) {
    let (mut e, rec) = engine(top, LLM);
    let mut h = Fake::default();
    e.request_headers(&mut h, 10.into(), &user("a"));
    deliver(&mut e, &mut h, 1, 200, &answer(true, 59, 0, 100, 1));
    e.response_headers(&mut h, 10.into(), &resp(&[("x-usage-tokens", "40")]));
    e.done(&mut h, 10.into());
    e.request_headers(&mut h, 11.into(), &user("a"));
    assert_eq!(settle_arg(&h.out[&2].body), 39, "the next call carries it");
    let key = lease_key(&e, "a");
    fill_set_of(&e, &h, &key);
    (e, h, rec, key)
}

/// The key's next call carries a charge its failed call could not put back in the table.
#[test]
fn a_charge_whose_set_is_full_rides_the_keys_next_call() {
    let (mut e, mut h, _, _) = charge_out_with_a_full_set(r#""failure_mode":"open","#);
    deliver(&mut e, &mut h, 2, 0, b"");
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(
        settle_arg(&h.out[&3].body),
        39,
        "the failed call's charge is carried again"
    );
    deliver(&mut e, &mut h, 3, 200, &answer(true, 20, 0, 100, 1));
    e.request_headers(&mut h, 13.into(), &user("a"));
    assert_eq!(settle_arg(&h.out[&4].body), 0, "once, never twice");
}

/// A flush that takes a stranded charge carries it with what the table holds for the key by
/// then, in one call, once.
#[test]
fn a_stranded_charge_and_the_tables_go_together_once() {
    let (mut e, mut h, rec, key) = charge_out_with_a_full_set(r#""failure_mode":"open","#);
    deliver(&mut e, &mut h, 2, 0, b"");
    assert_eq!(e.usage.stranded_keys(), 1);
    // Room again in the set.
    for k in set_mates(&key, settle::WAYS) {
        let _ = settle::take_within(&*h.store, &e.plugin.ns, &k, 1000);
    }
    // Another worker's charge of 9 for the key, pending in the table.
    assert_eq!(
        settle::add_charge(&*h.store, &e.plugin.ns, &key, 9, 1000),
        Ok(true)
    );
    let sent = h.sent.len();
    h.now += 100;
    e.tick(&mut h);
    assert_eq!(h.sent.len(), sent + 1, "one flush");
    assert_eq!(
        settle_arg(h.sent.last().unwrap()),
        39 + 9,
        "both, in one call"
    );
    assert_eq!(e.usage.stranded_keys(), 0);
    let t = *h.tokens().last().unwrap();
    deliver(&mut e, &mut h, t, 200, &answer(true, 20, 0, 100, 0));
    h.now += 1000;
    e.tick(&mut h);
    assert_eq!(h.sent.len(), sent + 1, "nothing flushed twice");
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(settle_arg(h.sent.last().unwrap()), 0, "nor carried twice");
    assert_eq!(rec.get(0, Counter::ChargeDropped), 0);
}

/// During an outage: the failed call opens the breaker, the key's flush waits for it, and the
/// probe after the cool-off carries the stranded charge.
#[test]
fn a_charge_stranded_while_the_breaker_is_open_goes_with_the_probe() {
    let top =
        r#""failure_mode":"open","backend":{"breaker_failures":1,"breaker_cooloff_ms":5000},"#;
    let (mut e, mut h, _, _) = charge_out_with_a_full_set(top);
    deliver(&mut e, &mut h, 2, 0, b"");
    let sent = h.sent.len();
    let mut ticks = 0;
    while h.now < 5000 && h.tick > 0 && ticks < 100 {
        h.now += h.tick;
        e.tick(&mut h);
        ticks += 1;
    }
    assert_eq!(h.now, 5000, "the flush waits for the breaker");
    assert_eq!(h.sent.len(), sent + 1, "the probe");
    let probe = h.sent.last().unwrap().clone();
    assert!(probe.ends_with("/0/0/0/39"), "the stranded charge: {probe}");
    let t = *h.tokens().last().unwrap();
    deliver(&mut e, &mut h, t, 200, &answer(true, 20, 0, 100, 0));
    e.request_headers(&mut h, 12.into(), &user("a"));
    assert_eq!(settle_arg(h.sent.last().unwrap()), 0, "once");
}

/// A flush with the breaker shut when its call would leave (the dispatch refused): the charge
/// is stranded again, not sent again in the same event, and goes with a later flush.
#[test]
fn a_stranded_charge_whose_flush_fails_again_is_kept_again() {
    let (mut e, mut h, _, _) = charge_out_with_a_full_set(r#""failure_mode":"open","#);
    deliver(&mut e, &mut h, 2, 0, b"");
    h.fail_dispatch = true;
    h.now += 100;
    e.tick(&mut h);
    assert_eq!(e.usage.stranded_keys(), 1, "kept again");
    h.fail_dispatch = false;
    let sent = h.sent.len();
    let mut ticks = 0;
    while h.sent.len() == sent && h.tick > 0 && ticks < 100 {
        h.now += h.tick;
        e.tick(&mut h);
        ticks += 1;
    }
    assert_eq!(settle_arg(h.sent.last().unwrap()), 39, "flushed later");
}

/// A worker holds at most `MAX_KEYS` keys' stranded charges; a charge of one more key is dropped
/// and counted, never silently.
#[test]
fn stranded_charges_are_bounded_and_a_dropped_one_is_counted() {
    let (mut e, rec) = engine(r#""failure_mode":"open","#, LLM);
    let mut h = Fake::default();
    // Every set of the settle table full.
    let mut full = 0;
    for i in 0.. {
        if full == settle::SETS as usize * settle::WAYS {
            break;
        }
        let k = format!("other-{i}");
        if settle::add_charge(&*h.store, &e.plugin.ns, &k, 1, 1000) == Ok(true) {
            full += 1;
        }
    }
    let max = super::super::usage::MAX_STRANDED;
    for i in 0..=max as u32 {
        let ctx = 10 + i;
        e.request_headers(&mut h, ctx.into(), &user(&format!("u{i}")));
        let t = *h.tokens().last().unwrap();
        deliver(&mut e, &mut h, t, 200, &answer(true, 59, 0, 100, 1));
        // No room in the table: the charge goes at once, and that call fails.
        h.fail_dispatch = true;
        e.response_headers(&mut h, ctx.into(), &resp(&[("x-usage-tokens", "40")]));
        e.done(&mut h, ctx.into());
        h.fail_dispatch = false;
    }
    assert_eq!(
        rec.get(0, Counter::FailureModeAllowed),
        0,
        "each admitted by Redis"
    );
    assert_eq!(e.usage.stranded_keys(), max);
    assert_eq!(
        rec.get(0, Counter::ChargeDropped),
        39,
        "the one past the bound"
    );
}

/// An engine replaced holds a stranded charge: the next engine flushes it, once.
#[test]
fn a_stranded_charge_survives_a_new_configuration() {
    for same_root in [true, false] {
        let (mut old, mut h, _, _) = charge_out_with_a_full_set(r#""failure_mode":"open","#);
        if same_root {
            deliver(&mut old, &mut h, 2, 0, b"");
        }
        // With the root deleted, its call out is put back as it would be on a failure.
        let pending = old.hand_over(&mut h, same_root);
        let (mut new, _) = engine(r#""failure_mode":"open","#, LLM);
        assert!(new.adopt(&mut h, pending).is_empty(), "{same_root}");
        assert_eq!(new.usage.stranded_keys(), 1, "{same_root}");
        let sent = h.sent.len();
        h.now += 100;
        old.tick(&mut h);
        new.tick(&mut h);
        assert_eq!(
            h.sent.len(),
            sent + 1,
            "{same_root}: flushed by the new engine"
        );
        assert_eq!(settle_arg(h.sent.last().unwrap()), 39, "{same_root}");
    }
}

/// A refund whose failed call certainly never ran, with no room in the table: dropped and
/// counted (it only overcharges), never lost silently.
#[test]
fn a_refund_with_no_room_is_dropped_and_counted() {
    let (mut e, rec) = engine(r#""failure_mode":"open","#, LLM);
    let mut h = Fake::default();
    let key = lease_key(&e, "a");
    let rule = e.plugin.rules().named("llm").unwrap().clone();
    let mut call = crate::backend::ScriptCall::new(key.clone(), &rule.limits.limits(), 0);
    call.track = Some(crate::bucket::Tracked {
        refund: 7,
        epoch: EPOCH,
        mark: MARK,
    });
    fill_set_of(&e, &h, &key);
    e.settlement_failed(&mut h, &rule, &call, false, 0);
    assert_eq!(rec.get(0, Counter::RefundDropped), 7);
}
