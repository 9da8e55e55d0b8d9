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
