//! Measuring a scenario: one load (or a flood's many h2load processes) against its Envoys, with
//! the CPU time of Envoy, Webdis and Redis, Redis' script calls and tollgate's counters read around
//! it; the single-key closed loops in interleaved slices, so the scenarios compared with each other
//! share the same seconds of a machine whose other load comes and goes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tollgate_e2e as common;

use common::webdis::Webdis;
use common::Redis;
use tollgate_tools::cpu::{cpu_ns, cpu_ns_of, cpu_ticks};

use crate::args::Settings;
use crate::h2load::{spawn_h2load, wait_h2load, H2Result, H2load, Load, Pace, Target};
use crate::probe::{decided, filter_stats, stats_delta};
use crate::sample::Sample;
use crate::scenarios::{Running, Setup, PACED_CLIENTS, PATH, QUERY_KEY};
use tollgate_tools::commandstats::redis_script_calls;

/// A flood's URI lists are sized for this many requests per second in total, twice over (one
/// connection may run ahead of the others); far above what a flood through Redis reaches here.
pub const FLOOD_MAX_RPS: f64 = 30_000.0;
/// How long an Envoy is watched, with no load, after its load.
pub const IDLE_WINDOW: Duration = Duration::from_secs(3);
/// The scenarios whose Envoy is watched for idle CPU after its load in the last round.
pub const IDLE_CHECKED: [&str; 2] = ["tollgate-lease", "tollgate-flood-lease"];

/// The run's shared backend and what it has measured so far.
pub struct Bench<'a> {
    pub settings: &'a Settings,
    pub dir: PathBuf,
    pub redis: &'a Redis,
    pub webdis: &'a Webdis,
    pub conn: redis::Connection,
    pub ticks_per_s: f64,
    pub runs: u32,
}

impl Bench<'_> {
    /// Runs one load against a scenario; `user` is the x-user-id every request carries (and, in the
    /// tenant scenarios, the hot key's `k`).
    /// Closed loops run for `d`, or send `count` requests if given; paced loads run for `d`.
    pub fn measure(
        &mut self,
        sc: &Running,
        user: &str,
        d: Duration,
        count: Option<u64>,
    ) -> Result<Sample, String> {
        let s = self.settings;
        self.runs += 1;
        let stats_before: Vec<_> = sc.envoys.iter().map(filter_stats).collect();
        let scripts_before = redis_script_calls(&mut self.conn);
        let pids: Vec<u32> = sc.envoys.iter().filter_map(|e| e.proc.pid()).collect();
        let webdis_pid: Vec<u32> = self.webdis.proc.pid().into_iter().collect();
        let redis_pid: Vec<u32> = self.redis.proc.pid().into_iter().collect();
        let cpu_before = cpu_ns_of(&pids);
        let webdis_before = cpu_ns_of(&webdis_pid);
        let redis_before = cpu_ns_of(&redis_pid);

        let closed = match count {
            Some(n) => Pace::Count(n),
            None => Pace::For(d),
        };
        let tag = format!("{}-{}", self.runs, sc.def.name);
        let port = sc.envoys[0].listen_port;
        let path = Target::Path(PATH.to_string());
        // Each h2load process, and whether its requests are the ones latency and admitted ÷ ideal are
        // about (all but the tenant scenario's flood).
        let mut spawned: Vec<(H2load, bool)> = Vec::new();
        match sc.def.setup {
            Setup::Template(_)
            | Setup::Tollgate(_)
            | Setup::Compared { flood: false, .. }
            | Setup::BodyUnexported
            | Setup::Baseline => {
                let load = Load {
                    clients: s.connections,
                    threads: s.threads,
                    pace: closed,
                };
                let h = spawn_h2load(&self.dir, s.h2c, &tag, port, user, path, load)?;
                spawned.push((h, true));
            }
            Setup::Flood(_) | Setup::Compared { flood: true, .. } => {
                for h in self.spawn_flood(&tag, port, closed)? {
                    spawned.push((h, true));
                }
            }
            Setup::Limited(_) => {
                let per_client = paced_rps_per_client(s.limited_load);
                for (i, e) in sc.envoys.iter().enumerate() {
                    let load = Load {
                        clients: PACED_CLIENTS,
                        threads: 1,
                        pace: Pace::Paced(per_client, d),
                    };
                    let tag = format!("{tag}-{i}");
                    let h = spawn_h2load(
                        &self.dir,
                        s.h2c,
                        &tag,
                        e.listen_port,
                        user,
                        path.clone(),
                        load,
                    )?;
                    spawned.push((h, true));
                }
            }
            Setup::Tenant { flood } => {
                // The flood first, so it is under way when the tenant starts.
                if flood {
                    for h in self.spawn_flood(&format!("{tag}-flood"), port, Pace::For(d))? {
                        spawned.push((h, false));
                    }
                }
                let load = Load {
                    clients: PACED_CLIENTS,
                    threads: 1,
                    pace: Pace::Paced(tenant_rps_per_client(s.limited_load), d),
                };
                let hot = Target::Path(format!("{PATH}?{QUERY_KEY}={user}"));
                let h = spawn_h2load(
                    &self.dir,
                    s.h2c,
                    &format!("{tag}-tenant"),
                    port,
                    user,
                    hot,
                    load,
                )?;
                spawned.push((h, true));
            }
        }
        let mut results: Vec<(H2Result, bool)> = Vec::new();
        for (h, primary) in spawned {
            results.push((wait_h2load(h)?, primary));
        }

        let cpu_after = cpu_ns_of(&pids);
        let webdis_after = cpu_ns_of(&webdis_pid);
        let redis_after = cpu_ns_of(&redis_pid);
        let scripts = redis_script_calls(&mut self.conn).since(scripts_before);
        // tollgate pushes its counters to Envoy up to a second after counting them: read them once
        // every answered request's decision is in (each request meets the one rule; a 503 of
        // `failure_mode: closed` counts too, hence at least).
        let answered: u64 = results
            .iter()
            .flat_map(|(r, _)| [200, 429].map(|s| r.statuses.get(&s).copied().unwrap_or(0)))
            .sum();
        let read = || sc.envoys.iter().map(filter_stats).collect::<Vec<_>>();
        let stats_after = if sc.def.tollgate_mode().is_some() {
            common::eventually(read, |after| {
                let new: i64 = after
                    .iter()
                    .zip(&stats_before)
                    .map(|(a, b)| decided(a) - decided(b))
                    .sum();
                new >= i64::try_from(answered).unwrap_or(i64::MAX)
            })
        } else {
            read()
        };
        let mut stats = BTreeMap::new();
        for (after, before) in stats_after.iter().zip(&stats_before) {
            for (k, v) in stats_delta(before, after) {
                *stats.entry(k).or_insert(0) += v;
            }
        }

        let mut sample = Sample {
            stats,
            envoy_pids: pids,
            ..Sample::default()
        };
        let mut first = u64::MAX;
        let mut last = 0;
        for (r, primary) in &results {
            sample.rps += r.rps;
            sample.h2load_done += r.done;
            let unfinished = r.started.saturating_sub(r.done);
            sample.unfinished += unfinished;
            sample.hung += unfinished.saturating_sub(u64::from(r.clients));
            sample.repeated_keys += r.repeated;
            for (&status, &n) in &r.statuses {
                match status {
                    200 => sample.ok += n,
                    429 => sample.limited += n,
                    500..=599 => sample.server_errors += n,
                    s if s < 0 => sample.failed += n,
                    _ => sample.other_status += n,
                }
            }
            let answered = r.latencies_us.len() as u64;
            sample.requests += answered;
            if *primary {
                sample.admitted += r.statuses.get(&200).copied().unwrap_or(0);
                sample.latencies_us.extend_from_slice(&r.latencies_us);
                first = first.min(r.first_start_us);
                last = last.max(r.last_end_us);
            } else {
                sample.background_requests += answered;
            }
        }
        sample.wall_s = if last > first {
            (last - first) as f64 / 1e6
        } else {
            0.0
        };
        let secs = |before: u64, after: u64| after.saturating_sub(before) as f64 / 1e9;
        sample.envoy_cpu_s = secs(cpu_before, cpu_after);
        sample.webdis_cpu_s = secs(webdis_before, webdis_after);
        sample.redis_cpu_s = secs(redis_before, redis_after);
        sample.derive();
        sample.redis_calls = scripts.calls;
        sample.redis_failed_calls = scripts.failed;
        sample.evalsha_calls = scripts.evalsha_calls;
        sample.evalsha_usec = scripts.evalsha_usec;
        if sc.def.paced() {
            sample.ideal = Some(s.limited_burst as f64 + s.limited_rate as f64 * sample.wall_s);
        }
        Ok(sample)
    }

    /// Unmeasured load on a fresh Envoy (`--warmup`); a paced scenario warms up on a hot key of its
    /// own, so its measured key starts on a full bucket.
    pub fn warm_up(&mut self, sc: &Running) -> Result<(), String> {
        let user = if sc.def.paced() {
            "hot-warmup"
        } else {
            "bench-user"
        };
        if !self.settings.warmup.is_zero() {
            self.measure(sc, user, self.settings.warmup, None)?;
        }
        Ok(())
    }

    /// One sample per scenario of `group` (indices into `running`), whose loads take turns: slice k
    /// of every scenario's load runs before slice k + 1 of any, in forward order on even slices and
    /// backward on odd ones. Load from the rest of the machine comes and goes over seconds here (the
    /// plain Envoy measured 49–62 µs/request from round to round in one run), so scenarios compared
    /// with each other must share the same stretch of time, not follow each other by seconds.
    pub fn measure_sliced(
        &mut self,
        running: &[Running],
        group: &[usize],
    ) -> Result<Vec<(usize, Sample)>, String> {
        let s = self.settings;
        let n = s.slices.max(1);
        let d = s.duration / n;
        let count = s.requests.map(|r| r / u64::from(n));
        let mut parts: Vec<Vec<Sample>> = group.iter().map(|_| Vec::new()).collect();
        for k in 0..n {
            let mut order: Vec<usize> = (0..group.len()).collect();
            if k % 2 == 1 {
                order.reverse();
            }
            for j in order {
                parts[j].push(self.measure(&running[group[j]], "bench-user", d, count)?);
            }
        }
        Ok(group
            .iter()
            .copied()
            .zip(parts.into_iter().map(Sample::merge))
            .collect())
    }

    /// A flood of new keys on one Envoy: one h2load process per connection (`--connections`), each
    /// with its own list of unique URIs `…?k=<run>-<connection>-<n>` (h2load's `-i` starts every
    /// client at the top of its list, so two clients of one process would send the same keys).
    pub fn spawn_flood(&self, tag: &str, port: u16, pace: Pace) -> Result<Vec<H2load>, String> {
        use std::io::Write;
        let s = self.settings;
        let n = s.connections;
        let mut spawned = Vec::new();
        for c in 0..n {
            let (pace, lines) = match pace {
                Pace::Count(total) => {
                    let share =
                        total / u64::from(n) + u64::from(u64::from(c) < total % u64::from(n));
                    (Pace::Count(share), share)
                }
                Pace::For(d) | Pace::Paced(_, d) => (pace, flood_uris(d, n)),
            };
            let file = self.dir.join(format!("uris-{tag}-{c}.txt"));
            let f = std::fs::File::create(&file)
                .map_err(|e| format!("create {}: {e}", file.display()))?;
            let mut w = std::io::BufWriter::new(f);
            for j in 0..lines {
                writeln!(
                    w,
                    "http://127.0.0.1:{port}{PATH}?{QUERY_KEY}={}-{c}-{j}",
                    self.runs
                )
                .map_err(|e| format!("write {}: {e}", file.display()))?;
            }
            w.flush()
                .map_err(|e| format!("write {}: {e}", file.display()))?;
            let load = Load {
                clients: 1,
                threads: 1,
                pace,
            };
            let target = Target::File(file, lines);
            let tag = format!("{tag}-c{c}");
            spawned.push(spawn_h2load(
                &self.dir, s.h2c, &tag, port, "flood", target, load,
            )?);
        }
        Ok(spawned)
    }

    /// CPU each of `pids` uses over `IDLE_WINDOW` with no load: (clock ticks, nanoseconds).
    pub fn idle_cpu(pids: &[u32]) -> Vec<(u64, u64)> {
        let before: Vec<(u64, u64)> = pids.iter().map(|p| (cpu_ticks(*p), cpu_ns(*p))).collect();
        std::thread::sleep(IDLE_WINDOW);
        pids.iter()
            .zip(before)
            .map(|(p, (t, n))| {
                (
                    cpu_ticks(*p).saturating_sub(t),
                    cpu_ns(*p).saturating_sub(n),
                )
            })
            .collect()
    }
}

/// For a scenario in `IDLE_CHECKED`, right after its last load: does its Envoy go quiet? Compared
/// with plain's Envoy over the same window, which has run no load since its own.
pub fn idle_after_load(running: &[Running], i: usize) -> Option<Idle> {
    let name = running[i].def.name;
    if !IDLE_CHECKED.contains(&name) {
        return None;
    }
    let pid = |r: &Running| r.envoys.first().and_then(|e| e.proc.pid());
    let plain = running.iter().find(|r| r.def.name == "plain").and_then(pid);
    let pids: Vec<u32> = pid(&running[i]).into_iter().chain(plain).collect();
    eprint!(" (idle {} s: {name})", IDLE_WINDOW.as_secs());
    let cpu = Bench::idle_cpu(&pids);
    Some(Idle {
        scenario: name,
        ticks: cpu.first()?.0,
        ns: cpu.first()?.1,
        plain: cpu.get(1).copied(),
    })
}

/// URIs one flood connection needs for a timed load: its share of `FLOOD_MAX_RPS`, twice over.
pub fn flood_uris(d: Duration, connections: u32) -> u64 {
    (d.as_secs_f64() * FLOOD_MAX_RPS * 2.0 / f64::from(connections)).ceil() as u64 + 100
}

/// Requests per second per client in the tenant scenarios: all of `--limited-load` to one proxy.
pub fn tenant_rps_per_client(total: u32) -> u32 {
    (total / PACED_CLIENTS).max(1)
}

pub fn paced_rps_per_client(total: u32) -> u32 {
    (total / (2 * PACED_CLIENTS)).max(1)
}
/// CPU ticks an Envoy used over `IDLE_WINDOW` right after its load in the last round, next to the
/// plain Envoy's over the same window (Envoy's own housekeeping).
#[derive(Debug, Clone)]
pub struct Idle {
    pub scenario: &'static str,
    /// utime+stime clock ticks and schedstat nanoseconds over the window.
    pub ticks: u64,
    pub ns: u64,
    /// The plain Envoy's (ticks, nanoseconds) over the same window.
    pub plain: Option<(u64, u64)>,
}
