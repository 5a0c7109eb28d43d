//! Process accounting from `/proc` (Linux), and the open-file limit.
//!
//! # Key Components
//! - [`ProcSample`]: CPU time (`utime + stime` of `/proc/PID/stat`, all threads) and resident
//!   memory (`VmRSS` of `/proc/PID/status`) summed over a set of processes (the gateway, or
//!   nginx's workers).
//! - [`raise_nofile_limit`]: raises the soft `RLIMIT_NOFILE` to the hard limit.
//!
//! # Error handling
//! A process that cannot be read (gone, not Linux) counts as zero; [`ProcSample::missing`]
//! says how many were unreadable.

use std::{collections::BTreeMap, time::Duration};

/// CPU and memory of a set of processes at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// User + system CPU time.
    pub cpu: Duration,
    /// System (kernel) CPU time alone, part of `cpu`.
    pub sys: Duration,
    /// Resident set size, KiB.
    pub rss_kib: u64,
    /// Processes that could not be read.
    pub missing: usize,
}

/// Clock ticks per second of `/proc/PID/stat` times.
#[allow(unsafe_code)]
fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// `(utime + stime, stime)` of `/proc/<pid>/stat` (`pid` may be `self`, or `PID/task/TID`).
fn cpu_of(pid: &str, ticks: u64) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_times(&stat, ticks)
}

fn stat_cpu(stat: &str, ticks: u64) -> Option<Duration> {
    stat_times(stat, ticks).map(|(cpu, _)| cpu)
}

/// `(utime + stime, stime)` of one `stat` line.
fn stat_times(stat: &str, ticks: u64) -> Option<(Duration, Duration)> {
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    // rest: state(3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime(14)
    let utime: u64 = f.nth(11)?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    let of = |t: u64| {
        Duration::from_secs(t / ticks) + Duration::from_nanos((t % ticks) * 1_000_000_000 / ticks)
    };
    Some((of(utime + stime), of(stime)))
}

fn rss_of(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

// === impl ProcSample ===

impl ProcSample {
    /// Samples the processes `pids` (summed).
    pub fn of(pids: &[u32]) -> Self {
        let ticks = clock_ticks();
        let mut s = Self::default();
        for pid in pids {
            let p = pid.to_string();
            match (cpu_of(&p, ticks), rss_of(&p)) {
                (Some((c, sys)), Some(r)) => {
                    s.cpu += c;
                    s.sys += sys;
                    s.rss_kib += r;
                }
                _ => s.missing += 1,
            }
        }
        s
    }

    /// CPU time of the calling process.
    pub fn own_cpu() -> Duration {
        cpu_of("self", clock_ticks())
            .map(|(c, _)| c)
            .unwrap_or_default()
    }
}

/// CPU time per thread name (`comm`, digits at the end dropped so `gateway-worker-0` and
/// `gateway-worker-1` add up as `gateway-worker-`), summed over the threads of `pids`.
/// Threads that exited are not counted.
pub fn cpu_by_thread(pids: &[u32]) -> BTreeMap<String, Duration> {
    let ticks = clock_ticks();
    let mut out: BTreeMap<String, Duration> = BTreeMap::new();
    for pid in pids {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in dir.flatten() {
            let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
                continue;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let name = stat[open + 1..close].trim_end_matches(|c: char| c.is_ascii_digit());
            if let Some(cpu) = stat_cpu(&stat, ticks) {
                *out.entry(name.to_owned()).or_default() += cpu;
            }
        }
    }
    out
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (each stream is a socket); returns the
/// soft limit now in force.
#[allow(unsafe_code)]
pub fn raise_nofile_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the `rlimit` struct passed by pointer,
    // which lives on this stack frame for the duration of the calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur < rl.rlim_max {
            let want = libc::rlimit {
                rlim_cur: rl.rlim_max,
                rlim_max: rl.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                return want.rlim_cur;
            }
        }
    }
    rl.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_this_process() {
        let pid = std::process::id();
        let s = ProcSample::of(&[pid]);
        assert_eq!(s.missing, 0);
        assert!(s.rss_kib > 0);
        let threads = cpu_by_thread(&[pid]);
        assert!(!threads.is_empty());
        let gone = ProcSample::of(&[u32::MAX]);
        assert_eq!(gone.missing, 1);
        assert!(raise_nofile_limit() > 0);
    }
}
