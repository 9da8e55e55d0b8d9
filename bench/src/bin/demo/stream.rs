//! The job stream around the kill, and what it means per side: `test.ping` published every
//! [`STREAM_EVERY`] through the surviving masters in turn (each job a task of its own, so the
//! stream never waits for returns), then, from the returns alone, per side: the jobs each minion
//! missed, when every minion answered again after the kill, and whether every job after that
//! was answered. The analysis is pure (tested below); the printing is in `report`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use saltgate_bench::lab::publish;
use serde_json::Value;
use tokio::task::JoinHandle;

/// One job of the stream every this often.
pub const STREAM_EVERY: Duration = Duration::from_millis(500);

/// One job as published: when (from the stream's start), through which master, and its task.
pub struct Pending {
    pub at: Duration,
    pub via: String,
    task: JoinHandle<anyhow::Result<(String, BTreeMap<String, Duration>)>>,
}

/// Publishes `test.ping` to `tgt` through the master's CLI socket `socket`, collecting returns for
/// `timeout_secs` (or until every targeted minion answered).
pub fn start_job(
    socket: PathBuf,
    via: &str,
    tgt: &str,
    timeout_secs: u64,
    at: Duration,
) -> Pending {
    let tgt = tgt.to_string();
    let task = tokio::spawn(async move {
        let p = publish(&socket, &tgt, "test.ping", &[], timeout_secs).await?;
        // test.ping returns true; anything else is not an answer.
        let answered = p
            .returns
            .into_iter()
            .filter(|(_, (_, v))| *v == Value::Bool(true))
            .map(|(id, (t, _))| (id, t))
            .collect();
        Ok((p.jid, answered))
    });
    Pending {
        at,
        via: via.to_string(),
        task,
    }
}

/// A finished job of the stream.
#[derive(Debug, Clone, Default)]
pub struct JobResult {
    /// When it was published, from the stream's start.
    pub at: Duration,
    pub via: String,
    /// Empty when the publish failed.
    pub jid: String,
    /// Minion id → time from the publish to its `True`.
    pub answered: BTreeMap<String, Duration>,
    /// Why the publish failed (the job then counts as missed by every minion).
    pub error: Option<String>,
}

impl Pending {
    pub async fn finish(self) -> JobResult {
        let (jid, answered, error) = match self.task.await {
            Ok(Ok((jid, answered))) => (jid, answered, None),
            Ok(Err(e)) => (String::new(), BTreeMap::new(), Some(format!("{e:#}"))),
            Err(e) => (String::new(), BTreeMap::new(), Some(e.to_string())),
        };
        JobResult {
            at: self.at,
            via: self.via,
            jid,
            answered,
            error,
        }
    }
}

impl JobResult {
    /// How many of `ids` answered.
    pub fn answered_by(&self, ids: &BTreeSet<String>) -> usize {
        ids.iter()
            .filter(|i| self.answered.contains_key(*i))
            .count()
    }

    /// When the last of `ids` answered, from the stream's start (None if one did not).
    fn all_answered_at(&self, ids: &BTreeSet<String>) -> Option<Duration> {
        let mut last = Duration::ZERO;
        for i in ids {
            last = last.max(*self.answered.get(i)?);
        }
        Some(self.at + last)
    }
}

/// What the stream meant for one side's minions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SideOutcome {
    pub minions: usize,
    pub jobs: usize,
    /// Jobs published after the kill.
    pub jobs_after_kill: usize,
    /// (minion, job) pairs without an answer, over the whole stream.
    pub missed_total: usize,
    /// The most jobs one minion missed.
    pub missed_max: usize,
    /// Minions that missed at least one job.
    pub minions_missing: usize,
    /// Recovery: the first job published after the kill that every minion answered.
    pub recovered: Option<Recovery>,
    /// Jobs published after the recovery job, and how many of them every minion answered.
    pub after_recovery: usize,
    pub after_recovery_full: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    /// Index of the job in the stream.
    pub job: usize,
    /// From the kill to that job's last answer: "every minion answered again after".
    pub after_kill: Duration,
}

/// The stream's jobs (in publish order) seen by the minions `ids`, the master killed at `kill_at`
/// (from the stream's start).
pub fn outcome(jobs: &[JobResult], ids: &BTreeSet<String>, kill_at: Duration) -> SideOutcome {
    let mut per_minion: BTreeMap<&String, usize> = BTreeMap::new();
    let mut missed_total = 0;
    for j in jobs {
        for i in ids {
            if !j.answered.contains_key(i) {
                *per_minion.entry(i).or_default() += 1;
                missed_total += 1;
            }
        }
    }
    let recovered = jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.at >= kill_at)
        .find_map(|(k, j)| {
            j.all_answered_at(ids).map(|t| Recovery {
                job: k,
                after_kill: t.saturating_sub(kill_at),
            })
        });
    let later = recovered.map_or(&[][..], |r| &jobs[r.job + 1..]);
    SideOutcome {
        minions: ids.len(),
        jobs: jobs.len(),
        jobs_after_kill: jobs.iter().filter(|j| j.at >= kill_at).count(),
        missed_total,
        missed_max: per_minion.values().copied().max().unwrap_or(0),
        minions_missing: per_minion.len(),
        recovered,
        after_recovery: later.len(),
        after_recovery_full: later
            .iter()
            .filter(|j| j.answered_by(ids) == ids.len())
            .count(),
    }
}

/// When the stream should stop: `post` after the point `recovered_at` (from the stream's start),
/// or at `deadline` if recovery is not seen.
pub fn stream_done(
    now: Instant,
    recovered_at: Option<Instant>,
    post: Duration,
    deadline: Instant,
) -> bool {
    now >= deadline || recovered_at.is_some_and(|r| now >= r + post)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("m{i}")).collect()
    }

    /// A job at `at_ms` answered (after 100 ms) by the minions whose index is in `who`.
    fn job(at_ms: u64, who: &[usize]) -> JobResult {
        JobResult {
            at: Duration::from_millis(at_ms),
            via: "master2".into(),
            jid: format!("j{at_ms}"),
            answered: who
                .iter()
                .map(|i| (format!("m{i}"), Duration::from_millis(100)))
                .collect(),
            error: None,
        }
    }

    #[test]
    fn a_side_that_answers_everything_recovers_at_the_first_job_after_the_kill() {
        let all = [0, 1, 2];
        let jobs = [
            job(0, &all),
            job(500, &all),
            job(1000, &all),
            job(1500, &all),
        ];
        let o = outcome(&jobs, &ids(3), Duration::from_millis(700));
        assert_eq!(o.missed_total, 0);
        assert_eq!(o.missed_max, 0);
        assert_eq!(o.minions_missing, 0);
        assert_eq!(o.jobs_after_kill, 2);
        assert_eq!(
            o.recovered,
            Some(Recovery {
                job: 2,
                after_kill: Duration::from_millis(400)
            })
        );
        assert_eq!((o.after_recovery, o.after_recovery_full), (1, 1));
    }

    #[test]
    fn misses_in_the_gap_are_counted_per_minion_and_recovery_waits_for_the_last_minion() {
        // m2 was on the killed master: it misses the two jobs after the kill.
        let jobs = [
            job(0, &[0, 1, 2]),
            job(500, &[0, 1]),
            job(1000, &[0, 1]),
            job(1500, &[0, 1, 2]),
            job(2000, &[0, 1, 2]),
        ];
        let o = outcome(&jobs, &ids(3), Duration::from_millis(300));
        assert_eq!((o.missed_total, o.missed_max, o.minions_missing), (2, 2, 1));
        assert_eq!(o.recovered.map(|r| r.job), Some(3));
        assert_eq!(
            o.recovered.map(|r| r.after_kill),
            Some(Duration::from_millis(1300))
        );
        assert_eq!((o.after_recovery, o.after_recovery_full), (1, 1));
    }

    #[test]
    fn a_job_missed_after_recovery_is_counted_against_it() {
        let jobs = [
            job(0, &[0, 1]),
            job(500, &[0, 1]),
            job(1000, &[0]),
            job(1500, &[0, 1]),
        ];
        let o = outcome(&jobs, &ids(2), Duration::from_millis(300));
        assert_eq!(o.recovered.map(|r| r.job), Some(1));
        assert_eq!((o.after_recovery, o.after_recovery_full), (2, 1));
    }

    #[test]
    fn jobs_before_the_kill_never_count_as_recovery() {
        let jobs = [job(0, &[0, 1]), job(500, &[0])];
        let o = outcome(&jobs, &ids(2), Duration::from_millis(300));
        assert_eq!(o.recovered, None);
        assert_eq!(o.after_recovery, 0);
    }

    #[test]
    fn a_failed_publish_is_missed_by_every_minion() {
        let failed = JobResult {
            at: Duration::from_millis(500),
            error: Some("master gone".into()),
            ..JobResult::default()
        };
        let o = outcome(&[job(0, &[0, 1]), failed], &ids(2), Duration::ZERO);
        assert_eq!((o.missed_total, o.missed_max, o.minions_missing), (2, 1, 2));
        assert_eq!(o.recovered.map(|r| r.job), Some(0));
        assert_eq!((o.after_recovery, o.after_recovery_full), (1, 0));
    }

    #[test]
    fn the_stream_stops_after_the_recovery_margin_or_at_the_deadline() {
        let t = Instant::now();
        let s = Duration::from_secs(1);
        assert!(!stream_done(t, None, s, t + 10 * s));
        assert!(stream_done(t + 10 * s, None, s, t + 10 * s));
        assert!(!stream_done(t + s / 2, Some(t), s, t + 10 * s));
        assert!(stream_done(t + s, Some(t), s, t + 10 * s));
    }
}
