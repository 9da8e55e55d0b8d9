//! The job stream (a `test.echo` a second through master1) and what it tells: who answered and
//! who missed what (whether a minion answered a job twice: [`crate::masters::Masters`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::masters::Masters;
use crate::JOB_TIMEOUT_S;

/// One job of the stream: when it was published, its jid and who answered (None until it
/// finished).
pub struct Job {
    pub at: Instant,
    pub jid: Option<String>,
    pub answered: Option<BTreeSet<String>>,
}

pub type Jobs = Arc<Mutex<Vec<Job>>>;

/// Publishes a job every second through master1 until `stop`.
pub fn stream(masters: Masters, tgt: String, jobs: Jobs, stop: tokio::sync::watch::Receiver<bool>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut k = 0u64;
        while !*stop.borrow() {
            tick.tick().await;
            let word = format!("job-{k}");
            k += 1;
            let i = {
                let mut j = jobs.lock().unwrap();
                j.push(Job {
                    at: Instant::now(),
                    jid: None,
                    answered: None,
                });
                j.len() - 1
            };
            let (masters, jobs, tgt) = (masters.clone(), jobs.clone(), tgt.clone());
            tokio::spawn(async move {
                let p = masters
                    .publish(
                        &tgt,
                        "test.echo",
                        &[Value::from(word.as_str())],
                        JOB_TIMEOUT_S,
                    )
                    .await;
                let jid = p.as_ref().ok().map(|p| p.jid.clone());
                let got = p
                    .map(|p| {
                        p.returns
                            .into_iter()
                            .filter(|(_, (_, v))| v.as_str() == Some(word.as_str()))
                            .map(|(id, _)| id)
                            .collect()
                    })
                    .unwrap_or_default();
                let mut j = jobs.lock().unwrap();
                j[i].jid = jid;
                j[i].answered = Some(got);
            });
        }
    });
}

/// The first job published after `t0` that every one of `ids` answered: when it was published.
pub fn all_answered_after(jobs: &Jobs, t0: Instant, ids: &BTreeSet<String>) -> Option<Duration> {
    jobs.lock()
        .unwrap()
        .iter()
        .filter(|j| j.at >= t0)
        .find(|j| j.answered.as_ref().is_some_and(|a| a.is_superset(ids)))
        .map(|j| j.at - t0)
}

/// Jobs missed per minion among the finished jobs published in `[from, to)`.
pub fn misses(
    jobs: &Jobs,
    from: Instant,
    to: Instant,
    ids: &BTreeSet<String>,
) -> BTreeMap<String, usize> {
    let mut out: BTreeMap<String, usize> = ids.iter().map(|i| (i.clone(), 0)).collect();
    for j in jobs
        .lock()
        .unwrap()
        .iter()
        .filter(|j| j.at >= from && j.at < to)
    {
        if let Some(a) = &j.answered {
            for id in ids.difference(a) {
                *out.get_mut(id).unwrap() += 1;
            }
        }
    }
    out
}

/// [`misses`], but a job that a minion with an entry in `ran` started to run (by jid) is not
/// counted: it received the job, and its return was lost (a stock minion drops the returns
/// queued on a request connection that breaks: "RequestClient is closed").
pub fn not_run(
    jobs: &Jobs,
    from: Instant,
    to: Instant,
    ids: &BTreeSet<String>,
    ran: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<String, usize> {
    let mut out: BTreeMap<String, usize> = ids.iter().map(|i| (i.clone(), 0)).collect();
    for j in jobs
        .lock()
        .unwrap()
        .iter()
        .filter(|j| j.at >= from && j.at < to)
    {
        if let Some(a) = &j.answered {
            for id in ids.difference(a) {
                let received = j
                    .jid
                    .as_ref()
                    .is_some_and(|jid| ran.get(id).is_some_and(|r| r.contains(jid)));
                if !received {
                    *out.get_mut(id).unwrap() += 1;
                }
            }
        }
    }
    out
}

/// "lo-hi" (or "n") of the values of `m` whose key is in `ids`.
pub fn range(m: &BTreeMap<String, usize>, ids: &BTreeSet<String>) -> String {
    let v: Vec<usize> = m
        .iter()
        .filter(|(k, _)| ids.contains(*k))
        .map(|(_, n)| *n)
        .collect();
    let (lo, hi) = (
        v.iter().min().copied().unwrap_or(0),
        v.iter().max().copied().unwrap_or(0),
    );
    if lo == hi {
        format!("{lo}")
    } else {
        format!("{lo}-{hi}")
    }
}

/// The jids whose return the swarm gave up on (its log: "the minion failed to return the job
/// information ... jid=JID", one line per minion), with how many lines each: those minions received
/// and ran the job, and their return was refused by the dying node (the request path, as a stock
/// minion's "RequestClient is closed"; docs/ha.md).
pub fn swarm_lost_returns(log: &Path) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for l in text
        .lines()
        .filter(|l| l.contains("failed to return the job information"))
    {
        if let Some(jid) = l.split_whitespace().find_map(|w| w.strip_prefix("jid=")) {
            *out.entry(jid.to_string()).or_default() += 1;
        }
    }
    out
}

/// For [`not_run`]: the jids each swarm minion of `swarm` received, as far as the swarm's log
/// tells ([`swarm_lost_returns`]). The log does not name the minion: a job whose return `n` of
/// them gave up on is put down to the first `n` (by id) that did not answer it.
pub fn swarm_ran(
    jobs: &Jobs,
    swarm: &BTreeSet<String>,
    lost: &BTreeMap<String, usize>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> =
        swarm.iter().map(|i| (i.clone(), BTreeSet::new())).collect();
    for j in jobs.lock().unwrap().iter() {
        let (Some(jid), Some(answered)) = (&j.jid, &j.answered) else {
            continue;
        };
        let n = lost.get(jid).copied().unwrap_or(0);
        for id in swarm.difference(answered).take(n) {
            out.get_mut(id).unwrap().insert(jid.clone());
        }
    }
    out
}
