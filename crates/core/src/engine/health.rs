//! The backend's health as this proxy sees it, shared by all workers: a circuit breaker and which
//! error classes are failing now.
//!
//! Invariant: after `threshold` consecutive calls that say the backend cannot serve, no call goes
//! out (the failure mode answers at once) until a cool-off has passed; then exactly one caller
//! probes, and its success closes the breaker. A log line is written per change of state (breaker
//! opened or closed, an error class starting or stopping), never per request.

use crate::backend::{BackendError, ErrorClass};
use crate::shared::{read_u64, update, write_u64s, Change, Store};

/// A change worth one log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Opened,
    Closed,
    /// An error class started failing (with the message of its first error).
    Failing(ErrorClass, String),
    /// Error classes that stopped failing.
    Recovered(Vec<ErrorClass>),
}

/// Where each field of the shared value lies: three u64s, in this order.
const FAILURES_AT: usize = 0;
const OPEN_UNTIL_AT: usize = 8;
const FAILING_AT: usize = 16;
const STATE_LEN: usize = 24;

/// (consecutive breaker failures, open until ms or 0, bit set of failing classes)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct State {
    failures: u64,
    open_until: u64,
    failing: u64,
}

impl State {
    fn decode(bytes: Option<&[u8]>) -> State {
        let Some(b) = bytes else {
            return State::default();
        };
        State {
            failures: read_u64(b, FAILURES_AT).unwrap_or(0),
            open_until: read_u64(b, OPEN_UNTIL_AT).unwrap_or(0),
            failing: read_u64(b, FAILING_AT).unwrap_or(0),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(STATE_LEN);
        write_u64s(&mut out, &[self.failures, self.open_until, self.failing]);
        out
    }
}

fn bit(class: ErrorClass) -> u64 {
    let pos = ErrorClass::ALL
        .iter()
        .position(|c| *c == class)
        .unwrap_or(0);
    1 << pos
}

/// What the breaker says to a call about to go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Closed: calls go out.
    Closed,
    /// Half-open: this call is the one probe.
    Probe,
    /// Open: no call goes out.
    Shut,
}

pub struct Health<'a> {
    store: &'a dyn Store,
    key: String,
    threshold: u64,
    cooloff_ms: u64,
}

impl<'a> Health<'a> {
    pub fn new(store: &'a dyn Store, ns: &str, threshold: u64, cooloff_ms: u64) -> Self {
        Health {
            store,
            key: [ns, "|health"].concat(),
            threshold,
            cooloff_ms,
        }
    }

    fn read(&self) -> State {
        let value = self.store.get(&self.key).ok().and_then(|(v, _)| v);
        State::decode(value.as_deref())
    }

    /// Whether the breaker is open now (for the gauge).
    pub fn is_open(&self) -> bool {
        self.read().open_until != 0
    }

    /// Until when the breaker is open (no call goes out before then; at that time one caller gets
    /// to probe). None while it is closed.
    pub fn open_until(&self) -> Option<u64> {
        Some(self.read().open_until).filter(|t| *t != 0)
    }

    /// Whether the breaker refuses every call now (open, its cool-off not over). Claims nothing:
    /// a check that will go out later asks [`Health::allow`] then.
    pub fn refuses(&self, now_ms: u64) -> bool {
        let open_until = self.read().open_until;
        open_until != 0 && now_ms < open_until
    }

    /// Whether a call may go out now (true for the one probe after a cool-off).
    pub fn allow(&self, now_ms: u64) -> bool {
        self.gate(now_ms) != Gate::Shut
    }

    /// Whether a call may go out now, and whether it is the one probe after a cool-off (claimed
    /// by this). The common case, a closed breaker, costs one read.
    pub fn gate(&self, now_ms: u64) -> Gate {
        let open_until = self.read().open_until;
        if open_until == 0 {
            return Gate::Closed;
        }
        if now_ms < open_until {
            return Gate::Shut;
        }
        // Half-open: whoever moves the deadline first is the probe.
        let cooloff = self.cooloff_ms;
        update(self.store, &self.key, |bytes| {
            let mut s = State::decode(bytes);
            if s.open_until != 0 && now_ms >= s.open_until {
                s.open_until = now_ms.saturating_add(cooloff);
                Change::Write(s.encode(), Gate::Probe)
            } else if s.open_until == 0 {
                Change::Keep(Gate::Closed)
            } else {
                Change::Keep(Gate::Shut)
            }
        })
        .unwrap_or(Gate::Shut)
    }

    /// Records a call's result; says what changed. A success with nothing failing costs one read.
    pub fn record(&self, result: Result<(), &BackendError>, now_ms: u64) -> Vec<Event> {
        if result.is_ok() && self.read() == State::default() {
            return Vec::new();
        }
        let (threshold, cooloff) = (self.threshold, self.cooloff_ms);
        update(self.store, &self.key, |bytes| {
            let mut s = State::decode(bytes);
            let before = s;
            let mut events = Vec::new();
            match result {
                Ok(()) => {
                    if s.open_until != 0 {
                        events.push(Event::Closed);
                    }
                    let recovered: Vec<ErrorClass> = ErrorClass::ALL
                        .into_iter()
                        .filter(|c| s.failing & bit(*c) != 0)
                        .collect();
                    if !recovered.is_empty() {
                        events.push(Event::Recovered(recovered));
                    }
                    s = State::default();
                }
                Err(e) => {
                    let class = e.class();
                    if s.failing & bit(class) == 0 {
                        s.failing |= bit(class);
                        events.push(Event::Failing(class, e.to_string()));
                    }
                    if e.trips_breaker() {
                        s.failures = s.failures.saturating_add(1);
                        if s.failures >= threshold {
                            if s.open_until == 0 {
                                events.push(Event::Opened);
                            }
                            s.open_until = now_ms.saturating_add(cooloff);
                        }
                    } else {
                        // The backend answered: it is reachable, whatever the error says.
                        s.failures = 0;
                    }
                }
            }
            if s == before {
                Change::Keep(events)
            } else {
                Change::Write(s.encode(), events)
            }
        })
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::mem::MemStore;

    #[test]
    fn opens_after_consecutive_failures_then_probes_once() {
        let s = MemStore::default();
        let h = Health::new(&s, "ns", 3, 100);
        let down = BackendError::Reset;
        assert_eq!(
            h.record(Err(&down), 0),
            vec![Event::Failing(ErrorClass::Unreachable, down.to_string())]
        );
        assert_eq!(h.record(Err(&down), 1), vec![]);
        assert!(h.allow(2));
        assert_eq!(h.record(Err(&down), 2), vec![Event::Opened]);
        assert!(!h.allow(50) && h.is_open());
        assert!(h.allow(102), "the probe");
        assert!(!h.allow(103), "only one probe per cool-off");
        assert_eq!(
            h.record(Ok(()), 104),
            vec![
                Event::Closed,
                Event::Recovered(vec![ErrorClass::Unreachable])
            ]
        );
        assert!(h.allow(105));
        let writes = s.writes();
        assert_eq!(h.record(Ok(()), 106), vec![]);
        assert_eq!(s.writes(), writes, "a healthy success writes nothing");
    }

    #[test]
    fn a_sick_redis_opens_the_breaker_but_a_script_error_does_not() {
        let s = MemStore::default();
        let h = Health::new(&s, "ns", 2, 100);
        let oom =
            BackendError::Redis("OOM command not allowed when used memory > 'maxmemory'.".into());
        h.record(Err(&oom), 0);
        assert_eq!(h.record(Err(&oom), 1), vec![Event::Opened]);
        let s2 = MemStore::default();
        let h2 = Health::new(&s2, "ns", 2, 100);
        let bug = BackendError::Redis("ERR user_script:1: attempt to compare nil".into());
        for t in 0..10 {
            h2.record(Err(&bug), t);
        }
        assert!(h2.allow(11));
        let node = BackendError::Redis("ERR no upstream host".into());
        assert_eq!(node.class(), ErrorClass::Unreachable);
        for t in 0..10 {
            h2.record(Err(&node), t);
        }
        assert!(
            h2.allow(11),
            "one cluster node down does not stop the proxy"
        );
    }

    #[test]
    fn each_class_logs_once_per_change_of_state_whatever_its_message() {
        let s = MemStore::default();
        let h = Health::new(&s, "ns", 1000, 100);
        let events: Vec<Event> = (0..50)
            .flat_map(|i| h.record(Err(&BackendError::Redis(format!("OOM {i}"))), i))
            .collect();
        assert_eq!(events.len(), 1, "{events:?}");
        let auth = BackendError::Redis("WRONGPASS invalid username-password pair".into());
        assert!(matches!(
            h.record(Err(&auth), 60).as_slice(),
            [Event::Failing(ErrorClass::Auth, m)] if m.contains("WRONGPASS")
        ));
        assert_eq!(
            h.record(Ok(()), 61),
            vec![Event::Recovered(vec![
                ErrorClass::Overloaded,
                ErrorClass::Auth
            ])]
        );
    }
}
