//! The largest usage this proxy read from the responses of each usage rule lately: what an
//! admission whose usage cannot be read is charged by default (`usage.unreadable` unset).
//!
//! Invariant: one shared value per rule, at most [`SLOTS`] `(minute, largest usage read in it)`
//! pairs; a reading only ever raises its own minute's entry, so the estimate never falls below
//! what a response of the last [`SLOTS`] minutes used. It decays by time alone only when newer
//! readings exist: the estimate is the largest entry of the current minute and the
//! [`SLOTS`]` - 1` before it, or, if no response was read in that window, the newest entry (a
//! proxy whose answers all became unreadable keeps charging what it last knew, not nothing).

use super::{read_u64, update, write_u64s, Change, Store, StoreError};

/// Length of one entry's minute.
pub const SLOT_MS: u64 = 60_000;
/// Entries kept per rule: the window is the current minute and the four before it.
pub const SLOTS: usize = 5;

fn key(ns: &str, rule: &str) -> String {
    let mut key = String::with_capacity(ns.len() + rule.len() + 6);
    key.push_str(ns);
    key.push_str("|peak|");
    key.push_str(rule);
    key
}

/// The entries, oldest minute first (a malformed tail is dropped).
fn decode(bytes: Option<&[u8]>) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let Some(b) = bytes else {
        return out;
    };
    let mut at = 0;
    while out.len() < SLOTS {
        let (Some(minute), Some(max)) = (read_u64(b, at), read_u64(b, at + 8)) else {
            break;
        };
        out.push((minute, max));
        at += 16;
    }
    out.sort_unstable();
    out
}

fn encode(entries: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 16);
    for (minute, max) in entries {
        write_u64s(&mut out, &[*minute, *max]);
    }
    out
}

/// Records that a response of `rule` used `usage` at `now_ms`. Writes only when that raises the
/// minute's entry (the first reading of a minute, or a larger one).
pub fn record(
    store: &dyn Store,
    ns: &str,
    rule: &str,
    usage: u64,
    now_ms: u64,
) -> Result<(), StoreError> {
    let minute = now_ms / SLOT_MS;
    update(store, &key(ns, rule), |bytes| {
        let mut entries = decode(bytes);
        match entries.iter_mut().find(|(m, _)| *m == minute) {
            Some((_, max)) if *max >= usage => return Change::Keep(()),
            Some((_, max)) => *max = usage,
            None => {
                entries.push((minute, usage));
                entries.sort_unstable();
                // The oldest minutes go first; never the one just written.
                while entries.len() > SLOTS {
                    entries.remove(0);
                }
            }
        }
        Change::Write(encode(&entries), ())
    })
}

/// The largest usage of `rule` read in the window ending at `now_ms`, else the newest one read;
/// None if this proxy never read one (since it started).
pub fn recent(
    store: &dyn Store,
    ns: &str,
    rule: &str,
    now_ms: u64,
) -> Result<Option<u64>, StoreError> {
    let (bytes, _) = store.get(&key(ns, rule))?;
    let entries = decode(bytes.as_deref());
    let minute = now_ms / SLOT_MS;
    let start = minute.saturating_sub(SLOTS as u64 - 1);
    let in_window = entries
        .iter()
        .filter(|(m, _)| *m >= start)
        .map(|(_, max)| *max)
        .max();
    Ok(in_window.or_else(|| entries.last().map(|(_, max)| *max)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::mem::MemStore;

    const MIN: u64 = SLOT_MS;

    #[test]
    fn the_largest_of_the_window_and_nothing_before_a_reading() {
        let s = MemStore::default();
        assert_eq!(recent(&s, "ns", "r", 0), Ok(None));
        record(&s, "ns", "r", 40, 10).unwrap();
        record(&s, "ns", "r", 7, 20).unwrap();
        assert_eq!(
            recent(&s, "ns", "r", 30),
            Ok(Some(40)),
            "a smaller one lowers nothing"
        );
        record(&s, "ns", "r", 900, MIN + 5).unwrap();
        assert_eq!(recent(&s, "ns", "other", MIN + 5), Ok(None), "per rule");
        assert_eq!(recent(&s, "other-ns", "r", MIN + 5), Ok(None), "per plugin");
        assert_eq!(recent(&s, "ns", "r", MIN + 6), Ok(Some(900)));
        // Four minutes later the 900 is still in the window; five later it has left it.
        record(&s, "ns", "r", 40, 5 * MIN).unwrap();
        assert_eq!(recent(&s, "ns", "r", 5 * MIN), Ok(Some(900)));
        record(&s, "ns", "r", 40, 6 * MIN).unwrap();
        assert_eq!(
            recent(&s, "ns", "r", 6 * MIN),
            Ok(Some(40)),
            "one huge answer decays"
        );
    }

    #[test]
    fn with_nothing_read_lately_the_newest_reading_stands() {
        let s = MemStore::default();
        record(&s, "ns", "r", 900, 0).unwrap();
        record(&s, "ns", "r", 30, MIN).unwrap();
        assert_eq!(recent(&s, "ns", "r", 2 * MIN), Ok(Some(900)));
        // An hour of unreadable answers: what it last knew, never less.
        assert_eq!(recent(&s, "ns", "r", 60 * MIN), Ok(Some(30)));
    }

    #[test]
    fn bounded_and_written_only_when_raised() {
        let s = MemStore::default();
        for m in 0..100u64 {
            record(&s, "ns", "r", m, m * MIN).unwrap();
        }
        let (bytes, _) = s.get(&key("ns", "r")).unwrap();
        assert_eq!(bytes.map(|b| b.len()), Some(SLOTS * 16));
        assert_eq!(recent(&s, "ns", "r", 99 * MIN), Ok(Some(99)));
        let writes = s.writes();
        record(&s, "ns", "r", 50, 99 * MIN + 1).unwrap();
        assert_eq!(s.writes(), writes, "not a raise: nothing written");
        record(&s, "ns", "r", 500, 99 * MIN + 2).unwrap();
        assert_eq!(s.writes(), writes + 1);
        assert_eq!(recent(&s, "ns", "r", 99 * MIN + 3), Ok(Some(500)));
    }

    #[test]
    fn a_malformed_value_reads_as_what_it_holds_whole() {
        let s = MemStore::default();
        let mut bytes = encode(&[(3, 70)]);
        bytes.extend_from_slice(&[1, 2, 3]);
        s.set(&key("ns", "r"), &bytes, 0).unwrap();
        assert_eq!(recent(&s, "ns", "r", 3 * MIN), Ok(Some(70)));
    }
}
