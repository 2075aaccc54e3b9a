//! Redis' INFO commandstats as `make bench` and `make peers` read it: the calls that reach Redis
//! from outside (scripts, and PINGs), never the commands a script runs. A reading that fails counts
//! as zero.

/// Redis' script calls, from INFO commandstats: counters since Redis started, or (`since`) over a
/// load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScriptCalls {
    /// evalsha + eval calls, and their failed_calls.
    pub calls: u64,
    pub failed: u64,
    /// evalsha calls alone, and the µs Redis spent running them (`usec`): µs per call is the
    /// script's time per backend request, whatever number of keys each carried.
    pub evalsha_calls: u64,
    pub evalsha_usec: u64,
    /// PING calls (a held request's callout in `make peers`' wasm-floor-hold).
    pub pings: u64,
}

impl ScriptCalls {
    /// The calls made between `before` and `self`.
    pub fn since(self, before: ScriptCalls) -> ScriptCalls {
        ScriptCalls {
            calls: self.calls.saturating_sub(before.calls),
            failed: self.failed.saturating_sub(before.failed),
            evalsha_calls: self.evalsha_calls.saturating_sub(before.evalsha_calls),
            evalsha_usec: self.evalsha_usec.saturating_sub(before.evalsha_usec),
            pings: self.pings.saturating_sub(before.pings),
        }
    }

    /// Reads INFO commandstats' text.
    pub fn parse(info: &str) -> ScriptCalls {
        let mut s = ScriptCalls::default();
        for line in info.lines() {
            let Some((name, fields)) = line.trim().split_once(':') else {
                continue;
            };
            let evalsha = name == "cmdstat_evalsha";
            if name == "cmdstat_ping" {
                s.pings += fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                continue;
            }
            if !evalsha && name != "cmdstat_eval" {
                continue;
            }
            for kv in fields.split(',') {
                let Some((k, v)) = kv.split_once('=') else {
                    continue;
                };
                let n = v.parse::<u64>().unwrap_or(0);
                match k {
                    "calls" => {
                        s.calls += n;
                        if evalsha {
                            s.evalsha_calls += n;
                        }
                    }
                    "failed_calls" => s.failed += n,
                    "usec" if evalsha => s.evalsha_usec += n,
                    _ => {}
                }
            }
        }
        s
    }
}

/// Redis' script calls so far.
pub fn redis_script_calls(conn: &mut redis::Connection) -> ScriptCalls {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .unwrap_or_default();
    ScriptCalls::parse(&info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_script_calls_pings_and_evalsha_time_from_commandstats() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=10,usec=250,usec_per_call=25.00,rejected_calls=0,failed_calls=2\r\n\
            cmdstat_eval:calls=3,usec=900,usec_per_call=300.00,rejected_calls=0,failed_calls=1\r\n\
            cmdstat_info:calls=7,usec=70,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_ping:calls=4,usec=1,usec_per_call=0.25,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_hmget:calls=70,usec=40,usec_per_call=0.57,rejected_calls=0,failed_calls=0\r\n";
        let now = ScriptCalls::parse(info);
        assert_eq!(
            now,
            ScriptCalls {
                calls: 13,
                failed: 3,
                evalsha_calls: 10,
                evalsha_usec: 250,
                pings: 4,
            }
        );
        let before = ScriptCalls {
            calls: 3,
            failed: 3,
            evalsha_calls: 2,
            evalsha_usec: 50,
            pings: 1,
        };
        assert_eq!(
            now.since(before),
            ScriptCalls {
                calls: 10,
                failed: 0,
                evalsha_calls: 8,
                evalsha_usec: 200,
                pings: 3,
            }
        );
        assert_eq!(ScriptCalls::parse(""), ScriptCalls::default());
    }
}
