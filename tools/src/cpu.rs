//! CPU time of a process, read off /proc without changing anything: schedstat nanoseconds (exact) and
//! utime + stime clock ticks (coarse: a tick is charged to whoever runs when it fires). A process that
//! is gone reads as zero.

use std::process::Command;

/// utime + stime of a process (all its threads), in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> u64 { fields.get(i).and_then(|f| f.parse().ok()).unwrap_or(0) };
    // fields[0] is field 3 (state); utime is field 14, stime field 15.
    field(11) + field(12)
}

/// CPU time of a process (every thread), in nanoseconds, from /proc/<pid>/task/*/schedstat: exact,
/// where utime+stime come in clock ticks (a tick is charged to whoever runs when it fires).
pub fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|text| text.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The CPU time of several processes together, in nanoseconds.
pub fn cpu_ns_of(pids: &[u32]) -> u64 {
    pids.iter().map(|p| cpu_ns(*p)).sum()
}

pub fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_used_cpu_and_a_gone_one_none() {
        let me = std::process::id();
        // Spin a little so the reading cannot be zero on a coarse clock.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(cpu_ns(me) > 0);
        assert!(cpu_ns_of(&[me, me]) >= cpu_ns(me));
        // Pids above the kernel's pid_max (at most 2^22) never exist.
        assert_eq!(cpu_ns(u32::MAX), 0);
        assert_eq!(cpu_ticks(u32::MAX), 0);
    }
}
