//! The masters a scenario publishes through: a saltgate-master cluster (master1's local socket,
//! the cluster's job cache), or a real salt-master 3008.5 cluster (master1 through Salt's
//! LocalClient, [`crate::salt::SaltJobs`]). The scenarios, the job stream and the misses and
//! duplicates they count are the same for both.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use saltgate_bench::lab::{publish, Published};
use serde_json::Value;

use crate::salt::SaltJobs;

#[derive(Clone)]
pub enum Masters {
    /// saltgate-master: master1's local socket; the cluster's shared job cache.
    Saltgate { cli: PathBuf, cachedir: PathBuf },
    /// Real salt-master 3008.5: jobs published through master1.
    Salt(Arc<SaltJobs>),
}

impl Masters {
    /// The names of the two kinds, as the test prints them.
    pub const SALTGATE: &'static str = "saltgate-master";
    pub const REAL_SALT: &'static str = "salt-master 3008.5";

    /// Publishes `fun(args)` to the glob `tgt` through master1 and waits until every targeted
    /// minion returned or `timeout_secs` passed.
    pub async fn publish(
        &self,
        tgt: &str,
        fun: &str,
        args: &[Value],
        timeout_secs: u64,
    ) -> anyhow::Result<Published> {
        match self {
            Masters::Saltgate { cli, .. } => publish(cli, tgt, fun, args, timeout_secs).await,
            Masters::Salt(jobs) => jobs.publish(tgt, fun, args, timeout_secs).await,
        }
    }

    /// Whether master1 published a job whose arguments mention `word`.
    pub fn published(&self, word: &str) -> bool {
        match self {
            Masters::Saltgate { cachedir, .. } => jid_of(cachedir, word).is_some(),
            Masters::Salt(jobs) => jobs.published(word),
        }
    }

    /// (jid, minion, returns) of every job one of `ids` returned more than once to the cluster.
    pub fn returned_twice(&self, ids: &BTreeSet<String>) -> Vec<(String, String, usize)> {
        match self {
            Masters::Saltgate { cachedir, .. } => twice(saltgate_returns(cachedir), ids),
            Masters::Salt(jobs) => twice(jobs.returns(), ids),
        }
    }
}

/// How late one minion's returns reached master1 (real Salt only).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Lag {
    /// Returns seen (late ones included).
    pub returns: usize,
    /// Of those, how many came more than the stream's job timeout after the publish: the stream
    /// counts that job as missed.
    pub late: usize,
    /// The slowest, in seconds from the publish.
    pub max_s: f64,
}

impl std::fmt::Display for Lag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} returns, slowest {:.1} s, {} late",
            self.returns, self.max_s, self.late
        )
    }
}

impl Masters {
    /// Per minion of `ids`: how late its returns reached master1, late ones included, counting
    /// as late those more than `timeout_s` after the publish. Real Salt only (saltjobd.py's
    /// `lag`); None for saltgate-master, whose returns log has no time.
    pub fn return_lags(
        &self,
        ids: &BTreeSet<String>,
        timeout_s: u64,
    ) -> Option<BTreeMap<String, Lag>> {
        let Masters::Salt(jobs) = self else {
            return None;
        };
        let mut out: BTreeMap<String, Lag> =
            ids.iter().map(|i| (i.clone(), Lag::default())).collect();
        for (_, id, lag) in jobs.returns_with_lag() {
            let (Some(l), Some(lag)) = (out.get_mut(&id), lag) else {
                continue;
            };
            l.returns += 1;
            l.max_s = l.max_s.max(lag);
            if lag > timeout_s as f64 {
                l.late += 1;
            }
        }
        Some(out)
    }
}

/// The jid of the job in a saltgate-master job cache whose load mentions `word`, once master1
/// stored it.
fn jid_of(cachedir: &Path, word: &str) -> Option<String> {
    std::fs::read_dir(cachedir.join("jobs"))
        .ok()?
        .flatten()
        .find(|e| {
            std::fs::read_to_string(e.path().join("load.json")).is_ok_and(|t| t.contains(word))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
}

/// Every return master1 of a saltgate-master cluster stored, as (jid, minion): its returns log in
/// the cluster's job cache (`<cachedir>/jobs/<jid>/returns.master1.jsonl`,
/// master-core/src/jobs.rs). master1 published every job, so it stores every return once,
/// whichever member the minion returned to (the others forward it).
fn saltgate_returns(cachedir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(cachedir.join("jobs")) else {
        return out;
    };
    for e in dir.flatten() {
        let jid = e.file_name().to_string_lossy().into_owned();
        let Ok(text) = std::fs::read_to_string(e.path().join("returns.master1.jsonl")) else {
            continue;
        };
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if let Some(id) = v.get("id").and_then(Value::as_str) {
                out.push((jid.clone(), id.to_string()));
            }
        }
    }
    out
}

/// Of the returns `(jid, minion)`, those one of `ids` sent more than once for one job: (jid,
/// minion, count). A minion that runs a job twice returns it twice.
pub fn twice(
    returns: impl IntoIterator<Item = (String, String)>,
    ids: &BTreeSet<String>,
) -> Vec<(String, String, usize)> {
    let mut n: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (jid, id) in returns.into_iter().filter(|(_, id)| ids.contains(id)) {
        *n.entry((jid, id)).or_default() += 1;
    }
    n.into_iter()
        .filter(|(_, c)| *c > 1)
        .map(|((jid, id), c)| (jid, id, c))
        .collect()
}
