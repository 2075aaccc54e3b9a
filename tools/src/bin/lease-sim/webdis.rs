//! The script call as Webdis carries it, both ways: the engine's request read back into its keys'
//! groups (each a bucket key, the limits and what it asks of the bucket, in
//! `tollgate_core::bucket`'s terms), in the script's single form or its batched form; and the
//! bucket's replies written as Webdis answers an `EVALSHA` (a flat array of integers: 5 for the
//! single form, 6 per key for the batched one). Both simulators speak it, so the engine parses
//! what a real Webdis would send.

use tollgate_core::bucket::{self, Ask, Holder, Limits, Tracked};

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

/// Which form of the script a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `EVALSHA <sha> 1 <key> <args>`: one key, a reply of 5 integers.
    Single,
    /// `EVALSHA <sha> <n> <keys> batch <c1> <args 1> ...`: n keys, 6 integers each.
    Batched,
}

/// One key's part of a call: its bucket key, its limits and what it asks of the bucket.
#[derive(Debug, Clone)]
pub struct Group {
    pub key: String,
    pub limits: Limits,
    pub ask: Ask,
}

/// A script call as the engine sent it (the Webdis request's body): its form and its keys' groups,
/// in the order the script runs them.
pub fn parse_request(text: &str) -> (Form, Vec<Group>) {
    let parts: Vec<&str> = text.split('/').collect();
    let n: usize = parts[2].parse().unwrap();
    let keys: Vec<String> = parts[3..3 + n].iter().map(|k| unescape(k)).collect();
    let args = &parts[3 + n..];
    if args.first() != Some(&"batch") {
        assert_eq!(n, 1, "a single call has one key: {text}");
        let key = keys.into_iter().next().unwrap();
        return (Form::Single, vec![group(key, args)]);
    }
    let mut at = 1;
    let mut groups = Vec::with_capacity(n);
    // A count 0: the previous key's arguments again.
    let mut own: &[&str] = &[];
    for key in keys {
        let count: usize = args[at].parse().unwrap();
        if count > 0 {
            own = &args[at + 1..at + 1 + count];
        }
        groups.push(group(key, own));
        at += 1 + count;
    }
    assert_eq!(at, args.len(), "every argument belongs to a group: {text}");
    (Form::Batched, groups)
}

/// A key's group from its single-form arguments: burst, rate, period_ms, cost, the lease, then
/// max_wait_ms and settle when sent (a penalty's `time` and window are not modelled here).
fn group(key: String, args: &[&str]) -> Group {
    let num = |i: usize| args[i].parse::<u64>().unwrap();
    let lease_arg = unescape(args[4]);
    // A holder's demand comes after a slash.
    let (lease_arg, demand) = match lease_arg.split_once('/') {
        Some((body, d)) => (body.to_string(), Some(d.parse::<u64>().unwrap())),
        None => (lease_arg, None),
    };
    let lease: Vec<u64> = lease_arg.split(':').map(|n| n.parse().unwrap()).collect();
    // The settlement, in its tracked form `<charge>:<refund>:<epoch>:<mark>` when the call may
    // be refunded.
    let (settle, track) = match args.get(6).map(|s| unescape(s)) {
        Some(s) if s.contains(':') => {
            let n: Vec<u64> = s.split(':').map(|n| n.parse().unwrap()).collect();
            let track = Tracked {
                refund: n[1],
                epoch: n[2],
                mark: n[3],
            };
            (n[0] as i64, Some(track))
        }
        Some(s) => (s.parse().unwrap(), None),
        None => (0, None),
    };
    let limits = Limits {
        burst: num(0),
        rate: num(1),
        period_ms: num(2),
    };
    let ask = Ask {
        cost: num(3),
        lease_want: lease[0],
        holder: (lease.len() > 1).then(|| {
            // An odd count of parts: the fifth is what the holder gives back.
            let (back, first) = if lease.len() % 2 == 1 {
                (lease[4], 5)
            } else {
                (0, 4)
            };
            let steps: Vec<(u64, u64)> = lease[first..].chunks(2).map(|c| (c[0], c[1])).collect();
            let h = Holder::new(lease[1], lease[2], lease[3], &steps).giving_back(back);
            match demand {
                Some(d) => h.demanding(d),
                None => h,
            }
        }),
        max_wait_ms: args.get(5).map_or(0, |_| num(5)),
        settle,
        track,
    };
    Group { key, limits, ask }
}

/// The bucket's replies as Webdis answers the call: `{"EVALSHA":[allowed,remaining,
/// retry_after_ms,reset_after_ms,granted]}` for the single form, and for the batched one the same
/// five and `penalized` for each key, in order, in one flat array; a call in the tracked form
/// adds `penalized`, its epoch and its mark (8 integers).
pub fn reply_body(form: Form, replies: &[bucket::Reply]) -> String {
    let ints: Vec<String> = replies
        .iter()
        .flat_map(|r| {
            let mut ints = vec![
                i64::from(r.allowed),
                r.remaining as i64,
                r.retry_after_ms,
                r.reset_after_ms as i64,
                r.granted as i64,
            ];
            // The 6th field comes with a batched call and with an epoch, the 7th and 8th with a
            // call in the tracked form.
            if form == Form::Batched || r.epoch.is_some() {
                ints.push(r.penalized.code());
            }
            if let Some(stamp) = r.epoch {
                ints.extend([stamp.epoch as i64, stamp.mark as i64]);
            }
            ints
        })
        .map(|i| i.to_string())
        .collect();
    format!(r#"{{"EVALSHA":[{}]}}"#, ints.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::backend::webdis::{batch_command, command, decode_batch_reply, Invoke};
    use tollgate_core::backend::ScriptCall;

    fn calls() -> Vec<ScriptCall> {
        let limits = Limits {
            burst: 200,
            rate: 100,
            period_ms: 1000,
        };
        let lease = ScriptCall {
            lease_want: 50,
            max_wait_ms: 2000,
            holder: Some(Box::new(Holder::new(7, 3, 1450, &[(40, 30), (5, 2)]))),
            ..ScriptCall::new("tollgate:{lease:0a}".into(), &limits, 1)
        };
        // One that gives tokens back (an odd count of parts) and reports its demand.
        let back = ScriptCall {
            lease_want: 9,
            max_wait_ms: 2000,
            holder: Some(Box::new(
                Holder::new(8, 4, 1450, &[(0, 120)])
                    .giving_back(3)
                    .demanding(16_000),
            )),
            ..ScriptCall::new("tollgate:{lease:0b}".into(), &limits, 1)
        };
        let settle = ScriptCall {
            settle: -17,
            ..ScriptCall::new("tollgate:{tokens:ef56}".into(), &limits, 0)
        };
        // A take that may be refunded, carrying a refund: the tracked form of the settlement.
        let tracked = ScriptCall {
            settle: 2,
            track: Some(Tracked {
                refund: 5,
                epoch: 1_700_000_000_123,
                mark: 42,
            }),
            ..ScriptCall::new("tollgate:{tokens:cd34}".into(), &limits, 1)
        };
        vec![
            ScriptCall::new("tollgate:{per-user:ab12}".into(), &limits, 1),
            lease,
            back,
            settle,
            tracked,
        ]
    }

    fn same(g: &Group, c: &ScriptCall) {
        assert_eq!(g.key, c.key);
        assert_eq!(g.limits, c.limits());
        assert_eq!(g.ask.cost, c.cost);
        assert_eq!(g.ask.lease_want, c.lease_want);
        assert_eq!(g.ask.holder, c.holder.as_deref().copied());
        assert_eq!(g.ask.max_wait_ms, c.max_wait_ms);
        assert_eq!(g.ask.settle, c.settle);
        assert_eq!(g.ask.track, c.track);
    }

    /// What the engine's codec writes, single or batched, reads back as the calls it came from.
    #[test]
    fn both_forms_read_back_as_their_calls() {
        let calls = calls();
        for c in &calls {
            let body = String::from_utf8(command(c, Invoke::Sha("abc"))).unwrap();
            let (form, groups) = parse_request(&body);
            assert_eq!(form, Form::Single);
            assert_eq!(groups.len(), 1);
            same(&groups[0], c);
        }
        let refs: Vec<&ScriptCall> = calls.iter().collect();
        let body = String::from_utf8(batch_command(&refs, Invoke::Sha("abc"))).unwrap();
        let (form, groups) = parse_request(&body);
        assert_eq!(form, Form::Batched);
        assert_eq!(groups.len(), calls.len());
        for (g, c) in groups.iter().zip(&calls) {
            same(g, c);
        }
    }

    /// The batched reply is what the engine's codec decodes into the same replies, in order.
    #[test]
    fn the_batched_reply_decodes_to_the_replies() {
        let replies: Vec<bucket::Reply> = (0..3u64)
            .map(|i| bucket::Reply {
                allowed: i != 1,
                remaining: 10 - i,
                retry_after_ms: if i == 1 { 250 } else { 0 },
                reset_after_ms: 1000 + i,
                granted: u64::from(i != 1),
                penalized: bucket::Penalized::No,
                epoch: None,
            })
            .collect();
        let body = reply_body(Form::Batched, &replies);
        let decoded = decode_batch_reply(body.as_bytes(), 3).unwrap();
        let decoded: Vec<bucket::Reply> = decoded.into_iter().map(Result::unwrap).collect();
        assert_eq!(decoded, replies);
        assert_eq!(
            reply_body(Form::Single, &replies[..1]),
            r#"{"EVALSHA":[1,10,0,1000,1]}"#
        );
        // A call in the tracked form is answered with its epoch and mark, in either form.
        let stamped = bucket::Reply {
            epoch: Some(bucket::Stamp {
                epoch: 1_700_000_000_123,
                mark: 7,
            }),
            ..replies[0]
        };
        assert_eq!(
            reply_body(Form::Single, &[stamped]),
            r#"{"EVALSHA":[1,10,0,1000,1,0,1700000000123,7]}"#
        );
        let single = reply_body(Form::Single, &[stamped]);
        assert_eq!(
            tollgate_core::backend::webdis::decode_reply(single.as_bytes()).unwrap(),
            stamped
        );
        let body = reply_body(Form::Batched, &[replies[1], stamped]);
        let decoded = tollgate_core::backend::webdis::decode_batch_reply_asked(
            body.as_bytes(),
            2,
            &[false, true],
        )
        .unwrap();
        let decoded: Vec<bucket::Reply> = decoded.into_iter().map(Result::unwrap).collect();
        assert_eq!(decoded, vec![replies[1], stamped]);
    }
}
