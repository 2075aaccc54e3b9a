//! The tick at a stash's expiry. A request admitted from a worker's stash reads no clock, so the
//! tick that drops an expired stash must come at its lease's expiry whatever the worker's latest
//! reading is: the host's tick starts over from the moment it is set, and a tick aimed from an
//! old reading comes later than it was aimed, later even than the tick it replaces. A worker
//! whose stash outlives its lease spends tokens its proxy has told Redis it no longer holds.

use super::*;
use crate::bucket::{take_held, Ask, Holder, Holders, Limits, State};
use crate::shared::lease::{Claim, Flight, Grant, Sizing};

/// A lease rule whose leases live 4 s (two horizons of 2 s).
const LONG_LEASE: &str = r#"{"name":"hot","key":["header:x-user"],"mode":"lease","rate":100,
    "burst":50,"lease_max":20,"lease_horizon_ms":2000}"#;

/// The host's tick, as Envoy runs it: it fires its period after it was last set, and again each
/// period after it fired.
struct Ticks {
    sets: usize,
    due: Option<u64>,
}

impl Ticks {
    fn new(h: &Fake) -> Ticks {
        Ticks {
            sets: h.tick_sets,
            due: None,
        }
    }

    /// Notes whether the engine set the tick during an event at `now`.
    fn note(&mut self, h: &Fake, now: u64) {
        if h.tick_sets != self.sets {
            self.sets = h.tick_sets;
            self.due = (h.tick > 0).then(|| now + h.tick);
        }
    }

    /// Fires the ticks due by `until`.
    fn run(&mut self, e: &mut Engine, h: &mut Fake, until: u64) {
        while let Some(due) = self.due.filter(|&due| due <= until) {
            h.now = due;
            e.tick(h);
            self.sets = h.tick_sets;
            self.due = (h.tick > 0).then(|| due + h.tick);
        }
    }
}

/// One proxy (holder 7) with two workers on a key at 100/s, burst 50, against the bucket model:
/// worker 1 a real engine, worker 2 driven through the proxy's pool as its engine would; a second
/// proxy checks the key exactly. Every admission at 4200 ms must fit in the burst.
#[test]
fn a_stash_admission_never_puts_off_the_tick_at_its_lease_expiry() {
    let limits = Limits {
        burst: 50,
        rate: 100,
        period_ms: 1000,
    };
    let sizing = Sizing {
        burst: 50,
        rate: 100,
        period_ms: 1000,
        lease_max: 20,
        horizon_ms: 2000,
        hold_ms: 0,
    };
    let (mut w1, _) = batched_engine("", LONG_LEASE);
    let mut h = Fake::default();
    let key = lease_key(&w1, "a");
    let store = h.store.clone();
    let ns = w1.plugin.ns.clone();
    let pool = LeasePool::new(&*store, &ns);
    let mut bucket: Option<State> = None;
    let mut holders = Holders::default();
    // The proxy's lease call as the engine sends it (its claim's report, seq and back), run by
    // the model, its grant deposited in the pool.
    let call = |bucket: &mut Option<State>, holders: &mut Holders, c: Claim, want, now: u64| {
        let holder = Holder::new(7, c.seq(), c.life_ms() + 2000, c.report()).giving_back(c.back());
        let ask = Ask {
            cost: 1,
            lease_want: want,
            holder: Some(holder),
            ..Ask::default()
        };
        let (next, r) = take_held(*bucket, holders, &limits, &ask, now * 1000);
        *bucket = next;
        let grant = Grant {
            tokens: r.granted,
            global_remaining: r.remaining,
            reset_after_ms: r.reset_after_ms,
            refill_ms: 0,
        };
        pool.deposit(c, &grant, &[], now, &sizing).unwrap();
        r.granted
    };
    let claim = |now: u64| match pool
        .begin_flight(&key, 1, Unmet::default(), now, now + 100, &sizing)
        .unwrap()
    {
        (Flight::Claimed(c, _), _) => c,
        other => panic!("{other:?}"),
    };

    // 0: the proxy leases 20 of the bucket's 50, until 4000.
    let c = claim(0);
    assert_eq!(call(&mut bucket, &mut holders, c, 20, 0), 20);
    // 1: worker 1 moves a batch into its stash and spends one of it.
    let mut ticks = Ticks::new(&h);
    h.now = 1;
    assert_eq!(
        w1.request_headers(&mut h, 10.into(), &user("a")),
        Action::Continue
    );
    ticks.note(&h, 1);
    assert_eq!(w1.stashed(&key), Some((4, 4000)), "4 left, until 4000");
    // Its tick pushes the counts, then aims at the stash's expiry.
    ticks.run(&mut w1, &mut h, 3500);
    // 3500: an admission from the stash; its counts want a tick within a second.
    h.now = 3500;
    assert_eq!(
        w1.request_headers(&mut h, 11.into(), &user("a")),
        Action::Continue
    );
    ticks.note(&h, 3500);
    // 4150: worker 2 calls for the key. The lease expired at 4000: the call says the proxy has
    // held none of it since 4100 and gives back what the pool dropped; it is granted 1.
    ticks.run(&mut w1, &mut h, 4150);
    let c = claim(4150);
    assert_eq!(c.report(), [(0, 50)]);
    assert_eq!(call(&mut bucket, &mut holders, c, 1, 4150), 1);
    // 4200: worker 2 spends its token; the other proxy takes what the bucket holds; worker 1's
    // requests come.
    ticks.run(&mut w1, &mut h, 4200);
    let w2 = pool.take(&key, &[1], 4200, &sizing).unwrap().spent.len() as u64;
    let mut other = 0;
    loop {
        let ask = Ask {
            cost: 1,
            ..Ask::default()
        };
        let (next, r) = take_held(bucket, &mut holders, &limits, &ask, 4_200_000);
        bucket = next;
        if !r.allowed {
            break;
        }
        other += 1;
    }
    h.now = 4200;
    let w1_admitted = (12..16u32)
        .filter(|&ctx| w1.request_headers(&mut h, ctx.into(), &user("a")) == Action::Continue)
        .count() as u64;
    let total = other + w2 + w1_admitted;
    assert!(
        total <= limits.burst,
        "{total} admitted at 4200 ms, at most the burst ({}) may be: the other proxy {other}, \
         worker 2 {w2}, worker 1 {w1_admitted} from its stash of a lease that expired at 4000",
        limits.burst
    );
}
