//! The cluster's publish key for the fan-out's dedup (`listeners.publish.dedup_cluster_pki_dir`):
//! `<cluster_pki_dir>/.aes`, the 76-character key string every master of a Salt 3008 cluster
//! encrypts its publishes with (`salt/master.py` `read_or_generate_key`).
//!
//! The hot path only loads an [`ArcSwap`] ([`ClusterKey::keys`]); the file is read by the hub's
//! watcher task ([`watch`]) through `tokio::fs` (a blocking-pool thread), never by an upstream
//! reader. The watcher looks at the file's mtime and length every second and reads it again when
//! they change, or when a message failed its MAC check with every key held
//! ([`ClusterKey::request_refresh`]), at most once per second. A key that changes (a
//! `publish_session` rotation, a minion key deleted) becomes current and the one before stays
//! usable for [`GRACE`], for copies a slower master still encrypted with it. A file that is
//! missing, unreadable or half-written keeps the keys held; without any key every message is
//! forwarded (fail open).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::{ArcSwap, Guard};
use saltgate_wire::crypticle::{Crypticle, CrypticleKey};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::ops::ratelimit::LogLimit;
use crate::select::snapshot::Snapshot;

/// How long the dedup remembers a job's identity (`dedup::WINDOW`; defined here, beside the key
/// the dedup reads, so the key does not import the dedup).
pub(crate) const WINDOW: Duration = Duration::from_secs(300);
/// How long the key before a rotation still decrypts: as long as the dedup remembers a job
/// (a copy older than that is forwarded anyway).
pub(crate) const GRACE: Duration = WINDOW;
/// How often the file's mtime is looked at, and the least time between two reads.
pub(crate) const POLL: Duration = Duration::from_secs(1);

/// The keys in use. `dir: None`: dedup is off.
#[derive(Default)]
pub(crate) struct Keys {
    pub dir: Option<PathBuf>,
    pub current: Option<Crypticle>,
    /// The key before the last change, and until when it is tried.
    pub previous: Option<(Crypticle, Instant)>,
}

impl Keys {
    /// The keys to try, current first; `n` of the array are set.
    pub fn usable(&self, now: Instant) -> ([Option<&Crypticle>; 2], usize) {
        let prev = self
            .previous
            .as_ref()
            .filter(|(_, until)| now < *until)
            .map(|(c, _)| c);
        let mut out = [None, None];
        let mut n = 0;
        for c in [self.current.as_ref(), prev].into_iter().flatten() {
            out[n] = Some(c);
            n += 1;
        }
        (out, n)
    }
}

/// What identifies one version of the file (the watcher reads it again when this changes):
/// mtime, length and inode (Salt's `write_key` renames a new file over `.aes`, so a rotation
/// within one mtime tick is still seen).
type Stamp = (Option<SystemTime>, u64, u64);

pub(crate) struct ClusterKey {
    keys: ArcSwap<Keys>,
    /// The stamp of the last successful read (only the watcher touches it).
    stamp: Mutex<Option<Stamp>>,
    refresh: Notify,
    log: LogLimit,
}

impl ClusterKey {
    pub fn new() -> Self {
        ClusterKey {
            keys: ArcSwap::from_pointee(Keys::default()),
            stamp: Mutex::new(None),
            refresh: Notify::new(),
            log: LogLimit::default(),
        }
    }

    pub fn keys(&self) -> Guard<Arc<Keys>> {
        self.keys.load()
    }

    /// A message failed with every key held: the watcher reads the file again (at most once per
    /// [`POLL`]).
    pub fn request_refresh(&self) {
        self.refresh.notify_one();
    }

    fn set_stamp(&self, s: Option<Stamp>) {
        *self.stamp.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    fn stamp(&self) -> Option<Stamp> {
        *self.stamp.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One step of the watcher: follows `dir` (the configuration may change on reload), drops an
    /// expired previous key, and reads `<dir>/.aes` when it changed or when `force`d. Returns
    /// whether a new key was installed.
    pub async fn sync(
        &self,
        dir: Option<&Path>,
        force: bool,
        loads: Option<&prometheus::IntCounter>,
    ) -> bool {
        let held = self.keys.load_full();
        if held.dir.as_deref() != dir {
            if let Some(d) = dir {
                tracing::info!(target: "saltgate_proxy::pubhub::clusterkey", dir = %d.display(), "fanout dedup: on, reading the cluster key from {}/.aes", d.display());
            } else if held.dir.is_some() {
                tracing::info!(target: "saltgate_proxy::pubhub::clusterkey", "fanout dedup: off; every copy of a job is forwarded");
            }
            self.keys.store(Arc::new(Keys {
                dir: dir.map(Path::to_path_buf),
                ..Keys::default()
            }));
            self.set_stamp(None);
        }
        let Some(dir) = dir else { return false };
        let now = Instant::now();
        let held = self.keys.load_full();
        if held
            .previous
            .as_ref()
            .is_some_and(|(_, until)| now >= *until)
        {
            self.keys.store(Arc::new(Keys {
                dir: held.dir.clone(),
                current: held.current.clone(),
                previous: None,
            }));
        }
        let path = dir.join(".aes");
        let meta = match tokio::fs::metadata(&path).await {
            Ok(m) => m,
            Err(e) => {
                self.warn(&path, &e.to_string(), held.current.is_some());
                return false;
            }
        };
        let stamp = (meta.modified().ok(), meta.len(), meta.ino());
        if !force && self.stamp() == Some(stamp) {
            return false;
        }
        let key = match tokio::fs::read_to_string(&path).await {
            Ok(text) => CrypticleKey::from_key_string(&text).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let key = match key {
            Ok(k) => k,
            Err(e) => {
                // A half-written file is read again at the next poll (the stamp is not kept).
                self.warn(&path, &e, held.current.is_some());
                return false;
            }
        };
        self.set_stamp(Some(stamp));
        let held = self.keys.load_full();
        if held.current.as_ref().is_some_and(|c| *c.key() == key) {
            return false;
        }
        let rotated = held.current.is_some();
        self.keys.store(Arc::new(Keys {
            dir: held.dir.clone(),
            current: Some(Crypticle::new(key)),
            previous: held.current.clone().map(|c| (c, now + GRACE)),
        }));
        if let Some(c) = loads {
            c.inc();
        }
        if rotated {
            tracing::info!(target: "saltgate_proxy::pubhub::clusterkey", file = %path.display(), grace_s = GRACE.as_secs(), "fanout dedup: the cluster key changed; the previous one still decrypts during the grace period");
        } else {
            tracing::info!(target: "saltgate_proxy::pubhub::clusterkey", file = %path.display(), "fanout dedup: cluster key loaded; the first copy of each job is forwarded, later copies dropped");
        }
        true
    }

    fn warn(&self, path: &Path, error: &str, have_key: bool) {
        if let Some(left_out) = self.log.allow() {
            let then = if have_key {
                "the key held stays in use"
            } else {
                "no key: every copy of every job is forwarded"
            };
            tracing::warn!(target: "saltgate_proxy::pubhub::clusterkey", file = %path.display(), error, left_out, "fanout dedup: cannot read the cluster key; {then}");
        }
    }
}

/// The watcher: follows `listeners.publish.dedup_cluster_pki_dir` of the current snapshot and the
/// file, until the caller drops it (the hub stops).
pub(crate) async fn watch(
    key: &ClusterKey,
    snapshot: Arc<ArcSwap<Snapshot>>,
    loads: Option<prometheus::IntCounter>,
) {
    let mut force = false;
    loop {
        let dir = snapshot.load().config.publish.dedup_cluster_pki_dir.clone();
        let last = Instant::now();
        key.sync(dir.as_deref(), force, loads.as_ref()).await;
        force = tokio::select! {
            _ = tokio::time::sleep_until(last + POLL) => false,
            _ = key.refresh.notified() => {
                tokio::time::sleep_until(last + POLL).await;
                true
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, k: &CrypticleKey) {
        // As Salt writes it: a temporary file renamed over .aes.
        let tmp = dir.join("aes.tmp");
        std::fs::write(&tmp, k.to_key_string()).unwrap();
        std::fs::rename(&tmp, dir.join(".aes")).unwrap();
    }

    fn current(ck: &ClusterKey) -> Option<CrypticleKey> {
        ck.keys().current.as_ref().map(|c| c.key().clone())
    }

    #[tokio::test]
    async fn a_rotated_file_gives_a_new_current_key_and_keeps_the_old_one_for_the_grace() {
        let d = tempfile::tempdir().unwrap();
        let ck = ClusterKey::new();
        assert!(!ck.sync(Some(d.path()), false, None).await, "no file yet");
        assert!(current(&ck).is_none() && ck.keys().dir.is_some());
        let (k1, k2) = (CrypticleKey::generate(), CrypticleKey::generate());
        write(d.path(), &k1);
        assert!(ck.sync(Some(d.path()), false, None).await);
        assert_eq!(current(&ck), Some(k1.clone()));
        assert!(
            !ck.sync(Some(d.path()), false, None).await,
            "unchanged: not read again"
        );
        write(d.path(), &k2);
        assert!(ck.sync(Some(d.path()), false, None).await);
        assert_eq!(current(&ck), Some(k2));
        let keys = ck.keys();
        let (usable, n) = keys.usable(Instant::now());
        assert_eq!(n, 2);
        assert_eq!(usable[1].map(|c| c.key().clone()), Some(k1));
        assert_eq!(
            keys.usable(Instant::now() + GRACE).1,
            1,
            "the old key expires"
        );
    }

    #[tokio::test]
    async fn a_bad_or_missing_file_keeps_the_key_held_and_off_clears_everything() {
        let d = tempfile::tempdir().unwrap();
        let ck = ClusterKey::new();
        let k = CrypticleKey::generate();
        write(d.path(), &k);
        assert!(ck.sync(Some(d.path()), false, None).await);
        std::fs::write(d.path().join(".aes"), "not a key").unwrap();
        assert!(!ck.sync(Some(d.path()), true, None).await);
        assert_eq!(current(&ck), Some(k.clone()));
        std::fs::remove_file(d.path().join(".aes")).unwrap();
        assert!(!ck.sync(Some(d.path()), false, None).await);
        assert_eq!(current(&ck), Some(k));
        assert!(!ck.sync(None, false, None).await);
        assert!(ck.keys().dir.is_none() && current(&ck).is_none());
    }

    #[tokio::test]
    async fn a_forced_read_sees_a_rewrite_the_stamp_misses() {
        // Salt's join path rewrites .aes in place (same inode); within one mtime tick and at
        // the same length only a MAC failure (a forced read) can tell.
        let d = tempfile::tempdir().unwrap();
        let ck = ClusterKey::new();
        let (k1, k2) = (CrypticleKey::generate(), CrypticleKey::generate());
        let path = d.path().join(".aes");
        std::fs::write(&path, k1.to_key_string()).unwrap();
        assert!(ck.sync(Some(d.path()), false, None).await);
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::fs::write(&path, k2.to_key_string()).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert!(!ck.sync(Some(d.path()), false, None).await);
        assert_eq!(current(&ck), Some(k1));
        assert!(ck.sync(Some(d.path()), true, None).await);
        assert_eq!(current(&ck), Some(k2));
    }
}
