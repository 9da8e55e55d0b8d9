//! CPU and memory of whole process trees, from `/proc`: a `salt-master` forks its workers, a
//! `saltgate-minion swarm --processes K` starts K children, so "the master's CPU" is the sum
//! over the root and every descendant. Each live member counts utime + stime + cutime + cstime:
//! the last two hold the children it has already reaped, so a worker that exited during the
//! window still counts, once. RSS is the sum of `VmRSS` over the live members.

use std::collections::HashMap;
use std::fs;

use crate::procfs;
use crate::BenchError;

/// The fields of one `/proc/PID/stat` line this module needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatLine {
    pub ppid: u32,
    /// utime + stime + cutime + cstime.
    pub ticks: u64,
}

/// Parses ppid (field 4) and utime, stime, cutime, cstime (fields 14-17). The command name
/// (field 2) may hold spaces and parentheses, so fields are counted after the last `)`.
pub fn parse_stat(line: &str) -> Option<StatLine> {
    let rest = &line[line.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ")": state is index 0, ppid index 1, utime index 11 .. cstime index 14.
    let ppid = f.get(1)?.parse().ok()?;
    let mut ticks = 0u64;
    for i in 11..=14 {
        ticks += f.get(i)?.parse::<u64>().ok()?;
    }
    Some(StatLine { ppid, ticks })
}

/// What a set of process trees holds at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeSample {
    pub ticks: u64,
    pub rss_kib: u64,
    pub procs: usize,
}

/// The members of the trees rooted at `roots` (the roots included), from a pid → ppid map.
pub fn members(parents: &HashMap<u32, u32>, roots: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = roots
        .iter()
        .copied()
        .filter(|r| parents.contains_key(r))
        .collect();
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        let mut kids: Vec<u32> = parents
            .iter()
            .filter(|(pid, pp)| **pp == p && !out.contains(pid))
            .map(|(pid, _)| *pid)
            .collect();
        kids.sort_unstable();
        out.extend(kids);
        i += 1;
    }
    out
}

/// Sums CPU ticks and RSS over the trees rooted at `roots`. A root that has exited counts
/// nothing (its CPU is gone with it: sample before stopping it).
pub fn sample(roots: &[u32]) -> Result<TreeSample, BenchError> {
    let dir = fs::read_dir("/proc").map_err(|e| BenchError::Proc(format!("/proc: {e}")))?;
    let mut stats: HashMap<u32, StatLine> = HashMap::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // A process may exit between the listing and the read: skip it.
        if let Some(s) = fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|l| parse_stat(&l))
        {
            stats.insert(pid, s);
        }
    }
    let parents: HashMap<u32, u32> = stats.iter().map(|(p, s)| (*p, s.ppid)).collect();
    let mut out = TreeSample::default();
    for pid in members(&parents, roots) {
        out.ticks += stats.get(&pid).map_or(0, |s| s.ticks);
        out.rss_kib += fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|t| procfs::parse_status_rss_kib(&t))
            .unwrap_or(0);
        out.procs += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_gives_ppid_and_all_four_cpu_fields() {
        let line = "4242 (salt-master (x) MWorker) S 77 4242 4242 0 -1 4194560 1050 0 0 0 1234 567 10 20 20 0 3 0 9999 1000 200";
        assert_eq!(
            parse_stat(line),
            Some(StatLine {
                ppid: 77,
                ticks: 1234 + 567 + 10 + 20
            })
        );
        assert_eq!(parse_stat("1 (a) S 1 2 3"), None);
    }

    #[test]
    fn members_are_the_roots_and_every_descendant_only() {
        let parents: HashMap<u32, u32> = [(1, 0), (10, 1), (11, 10), (12, 10), (13, 11), (20, 1)]
            .into_iter()
            .collect();
        let mut m = members(&parents, &[10]);
        m.sort_unstable();
        assert_eq!(m, vec![10, 11, 12, 13]);
        let mut m = members(&parents, &[11, 20, 99]);
        m.sort_unstable();
        assert_eq!(m, vec![11, 13, 20]);
    }

    #[test]
    fn this_process_tree_can_be_sampled() {
        let s = sample(&[std::process::id()]).unwrap();
        assert!(s.procs >= 1 && s.rss_kib > 0);
    }
}
