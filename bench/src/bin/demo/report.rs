//! What the demo prints at the end and the `--once` verdict: the stream's jobs one per line, the
//! side-by-side table (L4 against fan-out) and the rules that make the run OK. Pure: it formats
//! what `stream` measured and reads nothing itself.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::demo::stream::{JobResult, SideOutcome};

/// Everything the verdict looks at.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Minions per side.
    pub minions: usize,
    /// Warm-up jobs (one through each master, both sides) and how many were never answered by
    /// every minion.
    pub warm_jobs: usize,
    pub warm_missed: usize,
    /// The stream ran (the kill happened and its jobs were collected).
    pub streamed: bool,
    pub l4: SideOutcome,
    pub fanout: SideOutcome,
    /// Publish sessions each saltgate accepted from the stream's start to its end.
    pub l4_reconnects: u64,
    pub fanout_reconnects: u64,
}

impl Summary {
    /// Why the run is not OK (empty: OK). Fan-out: no job missed and no publish session opened
    /// again, over the whole stream. L4: misses in the gap are the expected contrast; it must
    /// recover (a job after the kill answered by every L4 minion) and answer every job after that.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.warm_missed > 0 {
            out.push(format!(
                "{} of {} warm-up jobs not answered by every minion",
                self.warm_missed, self.warm_jobs
            ));
        }
        if !self.streamed {
            out.push("the kill round did not run".into());
            return out;
        }
        let f = &self.fanout;
        if f.missed_total > 0 {
            out.push(format!(
                "fan-out missed {} (minion, job) pairs",
                f.missed_total
            ));
        }
        if self.fanout_reconnects > 0 {
            out.push(format!(
                "fan-out: {} publish sessions reconnected",
                self.fanout_reconnects
            ));
        }
        let l = &self.l4;
        match l.recovered {
            None => out.push("L4 never had a job after the kill answered by every minion".into()),
            Some(_) if l.after_recovery == 0 => {
                out.push("L4 recovered only at the last job: nothing after it to check".into())
            }
            Some(_) if l.after_recovery_full < l.after_recovery => out.push(format!(
                "L4 missed {} of the {} jobs published after it recovered",
                l.after_recovery - l.after_recovery_full,
                l.after_recovery
            )),
            Some(_) => {}
        }
        out
    }

    /// The last line's counts.
    pub fn line(&self) -> String {
        let jobs = self.warm_jobs + self.l4.jobs;
        format!(
            "{n}+{n} minions, {jobs} jobs; fan-out: {} missed, {} reconnects; \
             L4: {} missed, {} reconnects, {}/{} answered after recovery",
            self.fanout.missed_total,
            self.fanout_reconnects,
            self.l4.missed_total,
            self.l4_reconnects,
            self.l4.after_recovery_full,
            self.l4.after_recovery,
            n = self.minions,
        )
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// One line per stream job: when (from the kill), through which master, answered per side.
pub fn timeline(
    jobs: &[JobResult],
    kill_at: Duration,
    l4: &BTreeSet<String>,
    fanout: &BTreeSet<String>,
) -> Vec<String> {
    let mut out = vec![format!(
        "  {:>7}  {:<8} {:<21} {:>9} {:>9}",
        "t-kill", "via", "jid", "L4", "fan-out"
    )];
    for j in jobs {
        let t = j.at.as_secs_f64() - kill_at.as_secs_f64();
        let frac = |ids: &BTreeSet<String>| format!("{}/{}", j.answered_by(ids), ids.len());
        let jid = if j.jid.is_empty() { "-" } else { &j.jid };
        let mut line = format!(
            "  {t:>+6.1}s  {:<8} {jid:<21} {:>9} {:>9}",
            j.via,
            frac(l4),
            frac(fanout)
        );
        if let Some(e) = &j.error {
            line.push_str(&format!("  ({e})"));
        }
        out.push(line);
    }
    out
}

/// The side-by-side table.
pub fn table(s: &Summary) -> Vec<String> {
    let rec = |o: &SideOutcome| {
        o.recovered
            .map_or("never".to_string(), |r| secs(r.after_kill))
    };
    let after = |o: &SideOutcome| format!("{}/{}", o.after_recovery_full, o.after_recovery);
    let rows: [(&str, String, String); 7] = [
        (
            "publish sessions that reconnected",
            s.l4_reconnects.to_string(),
            s.fanout_reconnects.to_string(),
        ),
        (
            "jobs published (after the kill)",
            format!("{} ({})", s.l4.jobs, s.l4.jobs_after_kill),
            format!("{} ({})", s.fanout.jobs, s.fanout.jobs_after_kill),
        ),
        (
            "jobs missed per minion, max",
            s.l4.missed_max.to_string(),
            s.fanout.missed_max.to_string(),
        ),
        (
            "jobs missed, total (minion x job)",
            s.l4.missed_total.to_string(),
            s.fanout.missed_total.to_string(),
        ),
        (
            "minions that missed a job",
            format!("{}/{}", s.l4.minions_missing, s.l4.minions),
            format!("{}/{}", s.fanout.minions_missing, s.fanout.minions),
        ),
        (
            "every minion answered again after",
            rec(&s.l4),
            rec(&s.fanout),
        ),
        (
            "later jobs answered by every minion",
            after(&s.l4),
            after(&s.fanout),
        ),
    ];
    let mut out = vec![format!("  {:<38} {:>10} {:>10}", "", "L4", "fan-out")];
    for (what, l, f) in rows {
        out.push(format!("  {what:<38} {l:>10} {f:>10}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::stream::Recovery;

    fn recovered(after: usize, full: usize) -> SideOutcome {
        SideOutcome {
            minions: 10,
            jobs: 20,
            jobs_after_kill: 14,
            recovered: Some(Recovery {
                job: 20 - after - 1,
                after_kill: Duration::from_secs(1),
            }),
            after_recovery: after,
            after_recovery_full: full,
            ..SideOutcome::default()
        }
    }

    fn good() -> Summary {
        Summary {
            minions: 10,
            warm_jobs: 3,
            streamed: true,
            l4: SideOutcome {
                missed_total: 30,
                missed_max: 10,
                minions_missing: 3,
                ..recovered(6, 6)
            },
            fanout: recovered(13, 13),
            l4_reconnects: 3,
            ..Summary::default()
        }
    }

    #[test]
    fn l4_misses_in_the_gap_are_the_contrast_not_a_failure() {
        assert_eq!(good().failures(), Vec::<String>::new());
        assert_eq!(
            good().line(),
            "10+10 minions, 23 jobs; fan-out: 0 missed, 0 reconnects; \
             L4: 30 missed, 3 reconnects, 6/6 answered after recovery"
        );
    }

    #[test]
    fn any_fanout_miss_or_reconnect_fails() {
        let mut s = good();
        s.fanout.missed_total = 1;
        s.fanout_reconnects = 1;
        assert_eq!(s.failures().len(), 2, "{:?}", s.failures());
    }

    #[test]
    fn l4_must_recover_and_answer_every_job_after_it() {
        for (l4, what) in [
            (
                SideOutcome {
                    recovered: None,
                    ..recovered(0, 0)
                },
                "never",
            ),
            (recovered(0, 0), "last job"),
            (recovered(6, 5), "missed 1 of the 6"),
        ] {
            let s = Summary { l4, ..good() };
            let f = s.failures();
            assert!(f.len() == 1 && f[0].contains(what), "{what}: {f:?}");
        }
    }

    #[test]
    fn a_warm_up_miss_or_no_stream_fails() {
        let s = Summary {
            warm_missed: 1,
            ..good()
        };
        assert_eq!(s.failures().len(), 1);
        let s = Summary {
            streamed: false,
            ..good()
        };
        assert_eq!(s.failures(), vec!["the kill round did not run".to_string()]);
    }

    #[test]
    fn the_table_has_one_column_per_side() {
        let t = table(&good());
        assert!(
            t[1].contains("publish sessions that reconnected") && t[1].ends_with("3          0")
        );
        assert!(t
            .iter()
            .any(|l| l.contains("later jobs answered") && l.ends_with("6/6      13/13")));
    }
}
