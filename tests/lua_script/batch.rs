//! The script's batched form (`ARGV[1] = batch`) against a real redis-server: a batch answers, and
//! leaves every key, exactly as the single form called once per group in the same order; a bad
//! frame touches nothing; a bad group or a key of another type answers `{-1, code, 0, 0, 0, 0}`
//! and the others go on; an error about the server as a whole is the whole call's.

use super::{start, SCRIPT, T0};
use redis::Value;
use tollgate_e2e::script::{with_expiries, Rng};

/// The codes of the batched form, by the argument the single form's error names.
const CODES: [(&str, i64); 12] = [
    ("key", 1),
    ("burst", 2),
    ("rate", 3),
    ("period_ms", 4),
    ("burst*period_ms", 5),
    ("cost", 6),
    ("lease", 7),
    ("credit", 8),
    ("max_wait_ms", 9),
    ("settle", 10),
    ("now", 11),
    ("penalty", 12),
];
const BATCH_ERROR: &str = "tollgate: bad argument batch";

fn load(conn: &mut redis::Connection, script: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query(conn)
        .unwrap()
}

fn ints(v: Value) -> Vec<i64> {
    let Value::Array(items) = v else {
        panic!("reply is not an array: {v:?}")
    };
    items
        .iter()
        .map(|x| match x {
            Value::Int(i) => *i,
            other => panic!("reply element is not an integer: {other:?} in {items:?}"),
        })
        .collect()
}

/// The bucket keys of `groups` (by their key numbers) under `prefix`.
fn keys_of(groups: &[(usize, Vec<String>)], prefix: &str) -> Vec<String> {
    groups
        .iter()
        .map(|(k, _)| format!("{prefix}:{{k{k}}}"))
        .collect()
}

/// The batched call: KEYS = `keys`, ARGV = batch, then each group's count and arguments.
fn batch(
    conn: &mut redis::Connection,
    sha: &str,
    keys: &[String],
    groups: &[Vec<String>],
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(keys.len()).arg(keys).arg("batch");
    for g in groups {
        cmd.arg(g.len()).arg(g);
    }
    cmd.query(conn)
}

/// The batched call, sent with the script itself (EVAL).
fn eval_batch(
    conn: &mut redis::Connection,
    keys: &[String],
    groups: &[Vec<String>],
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SCRIPT).arg(keys.len()).arg(keys).arg("batch");
    for g in groups {
        cmd.arg(g.len()).arg(g);
    }
    cmd.query(conn)
}

/// The batched call with raw ARGV after "batch" (for frames that are not well formed).
fn raw_batch(
    conn: &mut redis::Connection,
    keys: &[&str],
    argv: &[&str],
) -> redis::RedisResult<Value> {
    redis::cmd("EVAL")
        .arg(SCRIPT)
        .arg(keys.len())
        .arg(keys)
        .arg("batch")
        .arg(argv)
        .query(conn)
}

/// What the batched form answers for a group whose single call answered `single`: its integers
/// (a 6th of 0 without a penalty), or `{-1, code}` for the bad argument its error names.
fn as_group(single: redis::RedisResult<Vec<i64>>) -> Vec<i64> {
    match single {
        Ok(mut v) => {
            if v.len() == 5 {
                v.push(0);
            }
            assert_eq!(v.len(), 6, "{v:?}");
            v
        }
        Err(e) => {
            let msg = e.to_string();
            let name = msg
                .split("tollgate: bad argument ")
                .nth(1)
                .unwrap_or_else(|| panic!("not a bad argument: {msg}"))
                .trim();
            let code = CODES
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("unknown argument {name:?}"))
                .1;
            vec![-1, code, 0, 0, 0, 0]
        }
    }
}

fn hash(conn: &mut redis::Connection, key: &str) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = redis::cmd("HGETALL").arg(key).query(conn).unwrap();
    all.sort();
    all
}

fn dump(conn: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("DUMP").arg(key).query(conn).unwrap()
}

const KEYS: usize = 4;
const LIMITS: [(u64, u64, u64); 4] = [(5, 1, 1000), (10, 2, 100), (3, 1, 7), (20, 1000, 1)];

/// A random group: a key and its single-form arguments (with an explicit now, so that batch
/// and singles see the same clock), now and then one bad argument. Returns (key, arguments).
fn random_group(rng: &mut Rng, now: u64, seq: &mut u64, last_key: usize) -> (usize, Vec<String>) {
    let key = if rng.chance(30) {
        last_key
    } else {
        rng.below(KEYS as u64) as usize
    };
    let (burst, rate, period) = if rng.chance(90) {
        LIMITS[key]
    } else {
        LIMITS[rng.below(4) as usize]
    };
    let mut cost = match rng.below(100) {
        0..=4 => 0,
        5..=9 => burst + 1,
        _ => 1 + rng.below(burst.min(3)),
    };
    let mut settle: i64 = 0;
    let lease = match rng.below(100) {
        0..=54 => "0".to_string(),
        55..=64 => rng.below(burst * 2).to_string(),
        65..=89 => {
            // A lease holder (one of three proxies) reporting one to three steps.
            *seq += 1;
            let mut lease = format!(
                "{}:{}:{}:{}",
                rng.below(burst * 2),
                1 + rng.below(3),
                if rng.chance(85) {
                    *seq
                } else {
                    1 + rng.below(*seq)
                },
                rng.below(3000)
            );
            for _ in 0..1 + rng.below(3) {
                lease.push_str(&format!(":{}:{}", rng.below(burst + 2), rng.below(2000)));
            }
            lease
        }
        90..=94 => {
            cost = 0;
            "reset".to_string()
        }
        _ => {
            cost = 0;
            format!("credit:{}", 1 + rng.below(burst * 2))
        }
    };
    let op = lease == "reset" || lease.starts_with("credit:");
    if !op && rng.chance(20) {
        settle = i64::try_from(rng.below(burst * 4 + 1)).unwrap() * [1, -1][rng.below(2) as usize];
    }
    let wait = if rng.chance(30) { rng.below(2000) } else { 0 };
    let mut args = vec![
        burst.to_string(),
        rate.to_string(),
        period.to_string(),
        cost.to_string(),
        lease,
        wait.to_string(),
        settle.to_string(),
        now.to_string(),
    ];
    match rng.below(3) {
        0 => {}
        1 => args.push("0".to_string()),
        _ => args.push(["1000:200:500", "50:1", "100000:3000:6000"][rng.below(3) as usize].into()),
    }
    if rng.chance(6) {
        let bad: [(usize, &str); 11] = [
            (0, "0"),
            (1, "1000000001"),
            (2, "0"),
            (0, "1125899906842625"),
            (3, "-1"),
            (4, "5:0:1:100:0:0"),
            (4, "credit:0"),
            (5, "3600001"),
            (6, "1000"),
            (7, "soon"),
            (8, "100:5:3"),
        ];
        let (i, v) = bad[rng.below(bad.len() as u64) as usize];
        if i < args.len() {
            args[i] = v.to_string();
        }
    }
    (key, args)
}

/// Random batches (1 to 12 groups over four keys, a key often twice, lease holders, reservations,
/// settlements, penalties, resets and credits, now and then a bad argument) answer exactly what
/// the single form answers group by group on a copy of the same state, and leave every key (its
/// hash and its PTTL) as the single calls leave it.
#[test]
fn a_batch_answers_and_writes_what_single_calls_do_in_the_same_order() {
    let (_r, mut c) = start("lua-batch-singles");
    let sha = load(&mut c, &with_expiries());
    let mut rng = Rng(0xBA7C_0001);
    let mut now = T0;
    let mut seq = 0;
    // Seen: a key twice in a batch, holders, a reservation, an offence, a bad group, a reset.
    let mut seen = [0usize; 6];
    for round in 0..400 {
        now += [0, rng.below(3000), rng.below(2_000_000)][rng.below(3) as usize];
        let n = 1 + rng.below(12) as usize;
        let mut groups = Vec::new();
        let mut last = 0;
        for _ in 0..n {
            // Mostly the run's now; now and then a group of its own, earlier or later.
            let at = match rng.below(10) {
                0 => now.saturating_sub(rng.below(500_000)),
                1 => now + rng.below(500_000),
                _ => now,
            };
            let (key, args) = random_group(&mut rng, at, &mut seq, last);
            last = key;
            groups.push((key, args));
        }
        let keys = |prefix: &str| keys_of(&groups, prefix);
        let args: Vec<Vec<String>> = groups.iter().map(|(_, a)| a.clone()).collect();
        let got = ints(batch(&mut c, &sha, &keys("a"), &args).unwrap());
        let (replies, batch_ttls) = got.split_at(6 * n);

        let mut want = Vec::new();
        let mut single_ttls = [None; KEYS];
        for (key, args) in &groups {
            let single: redis::RedisResult<Value> = redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(format!("b:{{k{key}}}"))
                .arg(args)
                .query(&mut c);
            let single = single.map(|v| {
                let mut v = ints(v);
                single_ttls[*key] = v.pop();
                v
            });
            want.extend(as_group(single));
        }
        let ctx = format!("round {round}: {groups:?}");
        assert_eq!(replies, &want[..], "{ctx}: batch vs single calls");
        for (k, single_ttl) in single_ttls.into_iter().enumerate() {
            let (a, b) = (format!("a:{{k{k}}}"), format!("b:{{k{k}}}"));
            assert_eq!(hash(&mut c, &a), hash(&mut c, &b), "{ctx}: key {k}");
            // The PTTL the last step of the key set (read at the end of the run in the batch).
            if let Some(single) = single_ttl {
                let i = groups.iter().position(|(key, _)| *key == k).unwrap();
                let batch = batch_ttls[i];
                assert!(
                    batch == single || (batch >= 0 && single >= 0 && batch.abs_diff(single) < 1000),
                    "{ctx}: key {k} PTTL {batch} in the batch, {single} alone"
                );
            }
        }
        let mut dup = groups.iter().map(|(k, _)| *k).collect::<Vec<_>>();
        dup.sort();
        seen[0] += usize::from(dup.windows(2).any(|w| w[0] == w[1]));
        for ((_, args), r) in groups.iter().zip(replies.chunks(6)) {
            seen[1] += usize::from(args[4].matches(':').count() >= 5 && r[0] == 1);
            seen[2] += usize::from(r[0] == 1 && r[2] > 0);
            seen[3] += usize::from(r[5] == 1);
            seen[4] += usize::from(r[0] == -1);
            seen[5] += usize::from(args[4] == "reset" && r[0] == 1);
        }
    }
    assert!(
        seen.iter().all(|&n| n >= 10),
        "twice, holders, reservations, offences, bad groups, resets: {seen:?}"
    );
}

/// A count 0 stands for the previous key's arguments: random batches (some groups repeating the
/// arguments of the group before them, as many keys of one rule do) answer and write the same
/// with each repeat sent as 0 as with every group written out.
#[test]
fn a_count_of_zero_repeats_the_previous_keys_arguments() {
    let (_r, mut c) = start("lua-batch-repeat");
    let sha = load(&mut c, SCRIPT);
    let mut rng = Rng(0xBA7C_0002);
    let mut now = T0;
    let mut seq = 0;
    let mut repeats = 0;
    for round in 0..200 {
        now += rng.below(200_000);
        let n = 1 + rng.below(12) as usize;
        let mut groups: Vec<(usize, Vec<String>)> = Vec::new();
        for i in 0..n {
            let (key, fresh) =
                random_group(&mut rng, now, &mut seq, groups.last().map_or(0, |g| g.0));
            let args = match groups.last() {
                Some((_, previous)) if i > 0 && rng.below(2) == 0 => previous.clone(),
                _ => fresh,
            };
            groups.push((key, args));
        }
        let keys = |prefix: &str| keys_of(&groups, prefix);
        let args: Vec<Vec<String>> = groups.iter().map(|(_, a)| a.clone()).collect();
        let written = batch(&mut c, &sha, &keys("a"), &args);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&sha).arg(n).arg(keys("b")).arg("batch");
        for (i, g) in args.iter().enumerate() {
            if i > 0 && args[i - 1] == *g {
                cmd.arg("0");
                repeats += 1;
            } else {
                cmd.arg(g.len()).arg(g);
            }
        }
        let compact: redis::RedisResult<Value> = cmd.query(&mut c);
        let ctx = format!("round {round}: {groups:?}");
        assert_eq!(
            written.map(ints).map_err(|e| e.to_string()),
            compact.map(ints).map_err(|e| e.to_string()),
            "{ctx}"
        );
        for k in 0..KEYS {
            let (a, b) = (format!("a:{{k{k}}}"), format!("b:{{k{k}}}"));
            assert_eq!(hash(&mut c, &a), hash(&mut c, &b), "{ctx}: key {k}");
        }
    }
    assert!(repeats >= 100, "only {repeats} groups repeated");
}

/// A frame that is not well formed (no key, more than 256, a count that is not 5 to 9 or a 0
/// for the first key, too few or too many arguments) is refused as a whole before any step:
/// every key stays as it was, even when the first groups are fine.
#[test]
fn a_bad_frame_is_refused_and_touches_nothing() {
    let (_r, mut c) = start("lua-batch-frame");
    let keys = ["a:{1}", "a:{2}", "a:{fresh}"];
    let now = T0.to_string();
    // State to keep: a drained bucket with a holder, and one boxed by a penalty.
    let boxed: &[&str] = &["1", "1", "60000", "1", "0", "0", "0", &now, "60000:30000"];
    let set_up: [(&str, &[&str]); 3] = [
        (
            keys[0],
            &["5", "1", "1000", "1", "3:7:1:60000:0:0", "0", "0", &now],
        ),
        (keys[1], boxed),
        (keys[1], boxed),
    ];
    for (key, args) in set_up {
        redis::cmd("EVAL")
            .arg(SCRIPT)
            .arg(1)
            .arg(key)
            .arg(args)
            .query::<Value>(&mut c)
            .unwrap();
    }
    let before: Vec<_> = keys.iter().map(|k| dump(&mut c, k)).collect();
    assert!(before[0].is_some() && before[1].is_some() && before[2].is_none());

    let good = ["5", "1", "1000", "1", "0", "0", "0", now.as_str()];
    let frames: Vec<(Vec<&str>, Vec<&str>)> = vec![
        // No key.
        (vec![], [&["8"][..], &good].concat()),
        // A count out of 5..=9, or not one digit.
        (vec![keys[0]], [&["4"][..], &good[..4]].concat()),
        (vec![keys[0]], [&["10"][..], &good, &["0", "0"]].concat()),
        (vec![keys[0]], [&["08"][..], &good].concat()),
        (vec![keys[0]], [&["x"][..], &good].concat()),
        (vec![keys[0]], [&[" 8"][..], &good].concat()),
        // A count 0 (the previous key's arguments) for the first key, alone or with arguments.
        (vec![keys[0]], vec!["0"]),
        (vec![keys[0], keys[2]], [&["0"][..], &["8"], &good].concat()),
        (vec![keys[0]], [&["0"][..], &good].concat()),
        // Too few arguments: the last group is cut short, or has no count at all.
        (
            vec![keys[0], keys[2]],
            [&["8"][..], &good, &["8"], &good[..7]].concat(),
        ),
        (vec![keys[0], keys[2]], [&["8"][..], &good].concat()),
        (vec![keys[0]], vec![]),
        // Too many: an argument after the last group.
        (
            vec![keys[0], keys[2]],
            [&["8"][..], &good, &["8"], &good, &["0"]].concat(),
        ),
        // The counts do not match the keys: three groups for two keys.
        (
            vec![keys[0], keys[1]],
            [&["8"][..], &good, &["8"], &good, &["8"], &good].concat(),
        ),
    ];
    for (k, argv) in &frames {
        let err = raw_batch(&mut c, k, argv).expect_err(&format!("{k:?} {argv:?} accepted"));
        assert!(
            err.to_string().contains(BATCH_ERROR),
            "{k:?} {argv:?}: {err}"
        );
        let after: Vec<_> = keys.iter().map(|k| dump(&mut c, k)).collect();
        assert_eq!(after, before, "{k:?} {argv:?} touched a key");
    }
}

/// Up to 256 keys in one call; 257 are refused as a whole.
#[test]
fn two_hundred_fifty_six_keys_run_and_two_hundred_fifty_seven_are_refused() {
    let (_r, mut c) = start("lua-batch-size");
    let now = T0.to_string();
    let group = ["3", "1", "1000", "1", "0", "0", "0", now.as_str()];
    let run = |c: &mut redis::Connection, n: usize| {
        let keys: Vec<String> = (0..n).map(|i| format!("a:{{{i}}}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let argv: Vec<&str> = (0..n).flat_map(|_| [&["8"][..], &group].concat()).collect();
        raw_batch(c, &keys, &argv)
    };
    let err = run(&mut c, 257).unwrap_err();
    assert!(err.to_string().contains(BATCH_ERROR), "{err}");
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut c).unwrap(), 0);
    let got = ints(run(&mut c, 256).unwrap());
    assert_eq!(got, [1, 2, 0, 1000, 1, 0].repeat(256));
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut c).unwrap(), 256);
}

/// A group with a bad argument answers `{-1, code, 0, 0, 0, 0}` with the code of the argument
/// the single form's error names, writes nothing to its key, and the groups around it (of the
/// same key too) are applied.
#[test]
fn a_bad_group_answers_its_code_and_the_others_are_applied() {
    let (_r, mut c) = start("lua-batch-group");
    let now = T0.to_string();
    let ok: Vec<String> = ["10", "1", "1000", "1", "0", "0", "0", &now, "0"]
        .map(String::from)
        .to_vec();
    let cases: [(usize, &str, i64); 11] = [
        (0, "x", 2),
        (1, "0", 3),
        (2, "0", 4),
        (0, "1125899906842625", 5),
        (3, "1.5", 6),
        (4, "5:1:1:100:0", 7),
        (4, "credit:0", 8),
        (5, "-1", 9),
        (6, "41", 10),
        (7, "soon", 11),
        (8, "1:0", 12),
    ];
    for (i, (arg, value, code)) in cases.into_iter().enumerate() {
        let mut bad = ok.clone();
        bad[arg] = value.to_string();
        let (k, other) = (format!("a:{{{i}}}"), format!("a:{{other{i}}}"));
        let keys = [k.clone(), k.clone(), other.clone(), k.clone()];
        let groups = [ok.clone(), bad, ok.clone(), ok.clone()];
        let got = ints(eval_batch(&mut c, &keys, &groups).unwrap());
        assert_eq!(
            got,
            [
                [1, 9, 0, 1000, 1, 0],
                [-1, code, 0, 0, 0, 0],
                [1, 9, 0, 1000, 1, 0],
                [1, 8, 0, 2000, 1, 0]
            ]
            .concat(),
            "{arg} = {value:?}"
        );
        let u = |c: &mut redis::Connection, key: &str| {
            redis::cmd("HGET")
                .arg(key)
                .arg("u")
                .query::<String>(c)
                .unwrap()
        };
        assert_eq!(
            (u(&mut c, &k), u(&mut c, &other)),
            ("8000".into(), "9000".into())
        );
    }
}

/// A key that is not a hash fails its own step (code 13: WRONGTYPE is raised inside the script)
/// and is left as it was; the groups before and after it are applied.
#[test]
fn a_key_of_another_type_answers_code_13_and_the_others_are_applied() {
    let (_r, mut c) = start("lua-batch-wrongtype");
    redis::cmd("SET")
        .arg("a:{str}")
        .arg("x")
        .query::<()>(&mut c)
        .unwrap();
    let now = T0.to_string();
    let ok: Vec<String> = ["10", "1", "1000", "1", "0", "0", "0", &now]
        .map(String::from)
        .to_vec();
    let keys = ["a:{1}", "a:{str}", "a:{1}"].map(String::from);
    let got = ints(eval_batch(&mut c, &keys, &[ok.clone(), ok.clone(), ok]).unwrap());
    assert_eq!(
        got,
        [
            [1, 9, 0, 1000, 1, 0],
            [-1, 13, 0, 0, 0, 0],
            [1, 8, 0, 2000, 1, 0]
        ]
        .concat()
    );
    let s: String = redis::cmd("GET").arg("a:{str}").query(&mut c).unwrap();
    assert_eq!(s, "x");
    // The single form answers that key with Redis' own error, as before.
    let err = redis::cmd("EVAL")
        .arg(SCRIPT)
        .arg(1)
        .arg("a:{str}")
        .arg(&["10", "1", "1000", "1", "0"])
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
}

/// An error Redis raises about the server as a whole (OOM past maxmemory, READONLY on a replica)
/// is the whole call's error reply, as for the single form (so the caller counts it against the
/// backend's health), not a per-key code; nothing was written.
#[test]
fn a_server_error_is_the_whole_call_s_error() {
    let (_r, mut c) = start("lua-batch-server-error");
    let now = T0.to_string();
    let ok: Vec<String> = ["10", "1", "1000", "1", "0", "0", "0", &now]
        .map(String::from)
        .to_vec();
    let keys = ["a:{1}", "a:{2}"].map(String::from);
    let groups = [ok.clone(), ok];
    let config = |c: &mut redis::Connection, args: &[&str]| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(args)
            .query::<()>(c)
            .unwrap();
    };
    config(&mut c, &["maxmemory", "1"]);
    let err = eval_batch(&mut c, &keys, &groups).unwrap_err();
    config(&mut c, &["maxmemory", "0"]);
    assert_eq!(err.code(), Some("OOM"), "{err}");
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut c).unwrap(), 0);

    // A replica of a master that is not there (nothing listens on port 1): writes are refused.
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(1)
        .query::<()>(&mut c)
        .unwrap();
    let err = eval_batch(&mut c, &keys, &groups).unwrap_err();
    redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(err.code(), Some("READONLY"), "{err}");
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut c).unwrap(), 0);
    // The server serves again: the same batch runs.
    let got = ints(eval_batch(&mut c, &keys, &groups).unwrap());
    assert_eq!(got, [1, 9, 0, 1000, 1, 0].repeat(2));
}

/// Redis' TIME is read once per run: every group whose arguments give no now (5 to 7 of them, or
/// `time`) refills to the same instant; a group with an explicit now keeps its own.
#[test]
fn groups_without_a_now_share_one_time() {
    let (_r, mut c) = start("lua-batch-time");
    let base = ["3", "1", "60000", "1", "0", "0", "0"];
    let mut groups: Vec<Vec<String>> = Vec::new();
    for i in 0..40 {
        let n = [5, 6, 7, 8][i % 4];
        let mut g: Vec<String> = base[..n.min(7)].iter().map(|s| s.to_string()).collect();
        if n == 8 {
            g.push("time".into());
        }
        groups.push(g);
    }
    let mut explicit: Vec<String> = base.iter().map(|s| s.to_string()).collect();
    explicit.push(T0.to_string());
    groups.push(explicit);
    let keys: Vec<String> = (0..groups.len()).map(|i| format!("a:{{{i}}}")).collect();
    let got = ints(eval_batch(&mut c, &keys, &groups).unwrap());
    assert_eq!(got, [1, 2, 0, 60_000, 1, 0].repeat(41));
    let t: Vec<String> = keys
        .iter()
        .map(|k| redis::cmd("HGET").arg(k).arg("t").query(&mut c).unwrap())
        .collect();
    let (last, shared) = t.split_last().unwrap();
    assert!(shared.iter().all(|x| *x == shared[0]), "{t:?}");
    assert_eq!(*last, T0.to_string());
}
