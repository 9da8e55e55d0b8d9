//! What the kernel says a process and the machine spent: CPU ticks (utime + stime over all
//! threads) and RSS from `/proc/PID/{stat,status}`, busy and idle ticks from `/proc/stat`, and
//! `/proc/loadavg`. Pure parsers (unit-tested) plus thin readers. Owns no timing and no policy.

use std::fs;

use serde::Serialize;

use crate::BenchError;

/// Kernel clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 on Linux almost always).
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if v > 0 {
        v as u64
    } else {
        100
    }
}

/// utime + stime (fields 14 and 15) of one `/proc/PID/stat` line: all threads of the process.
/// The command name (field 2) may hold spaces and parentheses, so fields are counted after the
/// last `)`.
pub fn parse_stat_ticks(line: &str) -> Option<u64> {
    let rest = &line[line.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After ")": field 3 (state) is index 0, so utime (field 14) is index 11, stime index 12.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// `VmRSS:` of a `/proc/PID/status` file, in KiB.
pub fn parse_status_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// One process at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcSample {
    pub ticks: u64,
    pub rss_kib: u64,
}

/// Reads `/proc/PID/stat` and `/proc/PID/status` (PID 0 means this process).
pub fn sample(pid: u32) -> Result<ProcSample, BenchError> {
    let dir = if pid == 0 {
        "/proc/self".to_string()
    } else {
        format!("/proc/{pid}")
    };
    let stat = fs::read_to_string(format!("{dir}/stat"))
        .map_err(|e| BenchError::Proc(format!("{dir}/stat: {e} (has the process exited?)")))?;
    let status = fs::read_to_string(format!("{dir}/status"))
        .map_err(|e| BenchError::Proc(format!("{dir}/status: {e}")))?;
    let ticks = parse_stat_ticks(&stat)
        .ok_or_else(|| BenchError::Proc(format!("{dir}/stat: no utime/stime fields")))?;
    let rss_kib = parse_status_rss_kib(&status)
        .ok_or_else(|| BenchError::Proc(format!("{dir}/status: no VmRSS line")))?;
    Ok(ProcSample { ticks, rss_kib })
}

/// The machine's aggregate `cpu` line of `/proc/stat`: all ticks, and idle + iowait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct SysSample {
    pub total: u64,
    pub idle: u64,
}

impl SysSample {
    pub fn busy(&self) -> u64 {
        self.total.saturating_sub(self.idle)
    }
}

/// Parses the first (`cpu `) line of `/proc/stat`.
pub fn parse_proc_stat(text: &str) -> Option<SysSample> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already
    // inside user, so only the first eight count.
    let total = v.iter().take(8).sum();
    Some(SysSample {
        total,
        idle: v[3] + v[4],
    })
}

pub fn sys_sample() -> Result<SysSample, BenchError> {
    let text = fs::read_to_string("/proc/stat")
        .map_err(|e| BenchError::Proc(format!("/proc/stat: {e}")))?;
    parse_proc_stat(&text).ok_or_else(|| BenchError::Proc("/proc/stat: no cpu line".into()))
}

/// `/proc/loadavg` as it stands (e.g. `2.09 2.06 1.28 7/125 18679`), trimmed.
pub fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("unreadable: {e}"))
}

/// Online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_ticks_are_utime_plus_stime_even_with_spaces_and_parens_in_the_name() {
        let line = "4242 (tokio (x) y) S 1 4242 4242 0 -1 4194560 1050 0 0 0 1234 567 0 0 20 0 3 0 9999 1000 200";
        assert_eq!(parse_stat_ticks(line), Some(1234 + 567));
    }

    #[test]
    fn stat_ticks_refuse_a_truncated_line() {
        assert_eq!(parse_stat_ticks("1 (a) S 1 2 3"), None);
        assert_eq!(parse_stat_ticks("no parens at all"), None);
    }

    #[test]
    fn status_rss_is_read_in_kib() {
        let s = "Name:\thaproxy\nVmPeak:\t  9000 kB\nVmRSS:\t    8123 kB\nThreads:\t2\n";
        assert_eq!(parse_status_rss_kib(s), Some(8123));
        assert_eq!(parse_status_rss_kib("Name: x\n"), None);
    }

    #[test]
    fn proc_stat_counts_idle_and_iowait_as_idle_and_ignores_guest() {
        let t = "cpu  100 5 50 1000 20 1 2 3 40 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        let s = parse_proc_stat(t).unwrap();
        assert_eq!(s.total, 100 + 5 + 50 + 1000 + 20 + 1 + 2 + 3);
        assert_eq!(s.idle, 1020);
        assert_eq!(s.busy(), 161);
    }

    #[test]
    fn this_process_can_be_sampled() {
        let s = sample(0).unwrap();
        assert!(s.rss_kib > 0);
    }
}
