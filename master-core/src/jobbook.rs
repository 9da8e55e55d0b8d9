//! Jobs and returns: the job cache, the JIDs, the origin master of recent jobs, and who waits
//! for a job's returns. The `_return` handler stores into it, the CLI publish waits on it, and a
//! cluster peer's returns arrive in it (through the composition root's [`crate::cluster::PeerSink`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde_json::Value as Json;
use tokio::sync::mpsc;

use crate::jobs::{JidGen, JobCache, JobError};
use crate::util::lock;

/// One minion's return, as the publish CLI sees it.
#[derive(Debug, Clone)]
pub struct ReturnEvent {
    pub minion: String,
    pub ret: Json,
}

/// Jobs and returns (see the module's doc).
#[derive(Debug)]
pub struct JobBook {
    /// This master's id (the origin of its own jobs).
    id: String,
    /// `keep_jobs`: a job older than this is unknown even where it was published here.
    keep_jobs: Duration,
    pub cache: JobCache,
    pub jids: JidGen,
    waiters: Mutex<HashMap<String, mpsc::UnboundedSender<ReturnEvent>>>,
    /// The origin master of recent jobs: a cluster member looks it up for every return, and
    /// reading it from the job cache each time cost a file read and parse per return.
    origins: Mutex<RecentOrigins>,
    /// Returns of known jobs the job cache could not take (a full disk): still passed on to
    /// the waiting `publish` and the origin master, logged, and counted here.
    pub returns_not_cached: AtomicU64,
}

impl JobBook {
    /// The job book of master `id`, its cache under `cachedir`.
    pub fn new(cachedir: &std::path::Path, id: &str, keep_jobs: Duration) -> Self {
        JobBook {
            id: id.to_string(),
            keep_jobs,
            cache: JobCache::for_master(cachedir, id),
            jids: JidGen::default(),
            waiters: Mutex::new(HashMap::new()),
            origins: Mutex::default(),
            returns_not_cached: AtomicU64::new(0),
        }
    }

    /// This master's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Registers a waiter for `jid`'s returns (dropped by [`JobBook::unwait`]).
    pub fn wait_returns(&self, jid: &str) -> mpsc::UnboundedReceiver<ReturnEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.waiters).insert(jid.to_string(), tx);
        rx
    }

    pub fn unwait(&self, jid: &str) {
        lock(&self.waiters).remove(jid);
    }

    /// Hands a stored return to whoever waits for the job.
    pub fn notify_return(&self, jid: &str, ev: ReturnEvent) {
        if let Some(tx) = lock(&self.waiters).get(jid) {
            let _ = tx.send(ev);
        }
    }

    /// Marks `jid` (of master `origin`) published here; false when it already was (the replay
    /// guard of peer publishes: one of the [`RecentOrigins::CAP`] newest).
    pub fn mark_published(&self, jid: &str, origin: &str) -> bool {
        lock(&self.origins).publish(jid, origin)
    }

    /// Whether this master published `jid` (its own job or a peer's), one of the
    /// [`RecentOrigins::CAP`] newest and not yet pruned at `keep_jobs`: such a job is known
    /// even where the job cache could not save it.
    pub fn published_here(&self, jid: &str) -> bool {
        crate::jobs::jid_time(jid).is_some()
            && !crate::jobs::expired(jid, self.keep_jobs, SystemTime::now())
            && lock(&self.origins)
                .by_jid
                .get(jid)
                .is_some_and(|(_, published)| *published)
    }

    /// Stores `minion`'s return of `jid` in the job cache. A job neither in the cache nor
    /// [`JobBook::published_here`] is unknown: `Err`, nothing stored. The return of a known
    /// job that the cache cannot take (a full disk) is logged and counted
    /// (`returns_not_cached`) and is `Ok`: it must still reach the waiting `publish` and the
    /// origin master.
    pub fn cache_return(&self, jid: &str, minion: &str, ret: &Json) -> Result<(), JobError> {
        match self.cache.save_return(jid, minion, ret) {
            Ok(()) => tracing::info!(%minion, %jid, "return stored"),
            Err(e @ (JobError::NotFound(_) | JobError::BadJid(_))) if !self.published_here(jid) => {
                return Err(e)
            }
            Err(e) => {
                self.returns_not_cached.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%minion, %jid, error = %e, "return not stored in the job cache; passed on");
            }
        }
        Ok(())
    }

    /// The master whose publish created `jid`: remembered for recent jobs, else read from the
    /// job cache (the job's load only).
    pub fn job_origin(&self, jid: &str) -> Option<String> {
        if let Some(o) = lock(&self.origins).origin(jid) {
            return Some(o.to_string());
        }
        let load = self.cache.load(jid).ok()?;
        let origin = load["master_id"].as_str()?.to_string();
        lock(&self.origins).learn(jid, &origin);
        Some(origin)
    }
}

/// Jobs' origin masters, the most recent [`RecentOrigins::CAP`] jobs.
#[derive(Debug, Default)]
struct RecentOrigins {
    /// jid → (the master whose publish created it, whether this master has published it).
    by_jid: HashMap<String, (String, bool)>,
    order: std::collections::VecDeque<String>,
}

impl RecentOrigins {
    const CAP: usize = 4096;

    fn origin(&self, jid: &str) -> Option<&str> {
        self.by_jid.get(jid).map(|(o, _)| o.as_str())
    }

    /// Remembers `jid`'s origin as read from the job cache (a return arrived for it): the job
    /// is not marked published here, so its peer publish, which may come later, still goes out.
    fn learn(&mut self, jid: &str, origin: &str) {
        if !self.by_jid.contains_key(jid) {
            self.by_jid
                .insert(jid.to_string(), (origin.to_string(), false));
            self.push(jid);
        }
    }

    /// Marks `jid` published here; false when it was already (the replay guard of peer
    /// publishes).
    fn publish(&mut self, jid: &str, origin: &str) -> bool {
        match self.by_jid.get_mut(jid) {
            Some((_, true)) => false,
            Some(entry) => {
                *entry = (origin.to_string(), true);
                true
            }
            None => {
                self.by_jid
                    .insert(jid.to_string(), (origin.to_string(), true));
                self.push(jid);
                true
            }
        }
    }

    fn push(&mut self, jid: &str) {
        self.order.push_back(jid.to_string());
        while self.order.len() > Self::CAP {
            if let Some(old) = self.order.pop_front() {
                self.by_jid.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_origins_keep_the_newest_jobs_up_to_the_cap() {
        let mut o = RecentOrigins::default();
        for n in 0..RecentOrigins::CAP + 10 {
            o.publish(&format!("{n:020}"), if n % 2 == 0 { "m1" } else { "m2" });
        }
        // Publishing a known job again is refused and changes nothing.
        assert!(!o.publish(&format!("{:020}", RecentOrigins::CAP + 9), "m2"));
        assert_eq!(o.by_jid.len(), RecentOrigins::CAP);
        assert_eq!(o.order.len(), RecentOrigins::CAP);
        assert_eq!(o.origin(&format!("{:020}", 9)), None);
        assert_eq!(o.origin(&format!("{:020}", 10)), Some("m1"));
    }

    /// At 9,000 minions a member got returns for a job before its origin's peer publish
    /// reached it: the origin, learned from the job cache for those returns, made the publish
    /// look like a replay, and the member's 3,000 minions never got the job.
    #[test]
    fn a_jobs_origin_learned_from_a_return_does_not_stop_its_peer_publish() {
        let mut o = RecentOrigins::default();
        o.learn("20261123085539677852", "m1");
        assert_eq!(o.origin("20261123085539677852"), Some("m1"));
        assert!(
            o.publish("20261123085539677852", "m1"),
            "first publish here"
        );
        assert!(!o.publish("20261123085539677852", "m1"), "a replay");
        o.learn("20261123085539677852", "m1");
        assert!(!o.publish("20261123085539677852", "m1"), "still a replay");
        assert_eq!(o.order.len(), 1);
    }
}
