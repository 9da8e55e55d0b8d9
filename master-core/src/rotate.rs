//! Publish-key rotation, the way Salt 3008 does it, so a removed minion stops reading publishes.
//!
//! Every publish is encrypted with one AES key that every authenticated minion holds. Salt rotates
//! it when a key is deleted or rejected (`rotate_aes_key`, default true) and every
//! `publish_session` seconds (default 86400). A stock minion that cannot decrypt a publish
//! re-authenticates, gets the new key in the `_auth` reply and decrypts the same publish again; a
//! minion whose key is gone gets no key, so it never runs the job.
//!
//! The request travels as Salt's *dropfile*: `cachedir/.dfn`, mode 0400, holding the id of the
//! master that should rotate. `saltgate-master key delete|reject` writes it, and so does the real
//! `salt-key` run on the same directories, so either tool works on either master. The running
//! master looks for it every [`CHECK_EVERY`] (Salt: every `loop_interval`, 60 s).
//!
//! In a cluster the key is the cluster's (`cluster_pki_dir/.aes`): the master that rotates writes
//! the new key there (atomically), and every member reloads the file when it changes, so all of
//! them encrypt with the key that minions receive from any of them. When `publish_session` runs
//! out in a cluster, members claim the rotation with the dropfile and act only on a dropfile at
//! least [`CLAIM_SETTLE`] old that still names them (Salt waits 5 s the same way), so one member
//! rotates.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use saltgate_wire::crypticle::CrypticleKey;

use saltgate_config::salt_master::SaltMasterConfig;

use crate::keys::{write_atomic, KeyError};

/// How often the running master looks for a dropfile and for a peer's new cluster key.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// In a cluster, how old a dropfile must be before its named master acts on it.
pub const CLAIM_SETTLE: Duration = Duration::from_secs(5);

const DROPFILE: &str = ".dfn";

/// The current publish key. Cheap to read (a clone of 32 + 32 bytes under a read lock).
#[derive(Debug)]
pub struct PublishKey(RwLock<CrypticleKey>);

impl PublishKey {
    pub fn new(key: CrypticleKey) -> Self {
        PublishKey(RwLock::new(key))
    }

    pub fn current(&self) -> CrypticleKey {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn replace(&self, key: CrypticleKey) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = key;
    }
}

/// Asks the master `master_id` to rotate its publish key (Salt's `salt.crypt.dropfile`): writes
/// `cachedir/.dfn` (mode 0400) unless a request is already pending.
pub fn request_rotation(cachedir: &Path, master_id: &str) -> Result<(), KeyError> {
    let dfn = cachedir.join(DROPFILE);
    if dfn.is_file() {
        return Ok(());
    }
    write_atomic(&dfn, master_id.as_bytes(), 0o400)
}

/// A pending dropfile, if it names `master_id` and is old enough; removes it when taken.
fn take_request(cachedir: &Path, master_id: &str, settle: Duration) -> Option<()> {
    let dfn = cachedir.join(DROPFILE);
    let meta = std::fs::symlink_metadata(&dfn).ok()?;
    if !meta.file_type().is_file() || meta.mode() & 0o777 != 0o400 {
        // Salt ignores it too: only the key tools write 0400 files there.
        tracing::error!(path = %dfn.display(), "found a publish-key dropfile that is not a \
            mode-0400 file; ignoring it (remove it, then delete or reject the key again)");
        return None;
    }
    let age = meta
        .modified()
        .ok()
        .and_then(|m| SystemTime::now().duration_since(m).ok())
        .unwrap_or_default();
    if age < settle {
        return None;
    }
    let named = std::fs::read_to_string(&dfn).ok()?;
    if named.trim() != master_id {
        return None;
    }
    std::fs::remove_file(&dfn).ok()
}

/// `(mtime, len)` of a file, to notice a peer's rewrite without reading it every second.
fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// The rotation task of the master configured by `config`, rotating `key` (the one `_auth`
/// replies hand out and publishes are sealed with): runs for the life of the master.
pub async fn run(key: Arc<PublishKey>, config: SaltMasterConfig) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let config = Arc::new(config);
    let mut state = Rotation::new(&config);
    loop {
        tick.tick().await;
        let (k, c) = (key.clone(), config.clone());
        let s = std::mem::take(&mut state);
        match tokio::task::spawn_blocking(move || {
            let mut s = s;
            s.check(&k, &c);
            s
        })
        .await
        {
            Ok(s) => state = s,
            Err(e) => {
                tracing::error!(error = %e, "publish-key rotation check failed");
                state = Rotation::new(&config);
            }
        }
    }
}

/// What the rotation task remembers between checks.
#[derive(Debug, Default)]
struct Rotation {
    /// When the key in use was made (or loaded), for `publish_session` without a cluster.
    since: Option<Instant>,
    /// The cluster key file as last seen.
    seen: Option<(SystemTime, u64)>,
}

impl Rotation {
    fn new(cfg: &SaltMasterConfig) -> Self {
        Rotation {
            since: Some(Instant::now()),
            seen: cluster_aes_path(cfg).and_then(|p| stamp(&p)),
        }
    }

    fn check(&mut self, key: &PublishKey, cfg: &SaltMasterConfig) {
        let clustered = cfg.cluster.is_some();
        let settle = if clustered {
            CLAIM_SETTLE
        } else {
            Duration::ZERO
        };
        if let Some(path) = cluster_aes_path(cfg) {
            self.reload_if_changed(key, &path);
        }
        let mut reason =
            take_request(&cfg.cachedir, &cfg.id, settle).map(|()| "a key was deleted or rejected");
        if reason.is_none() && cfg.publish_session_secs > 0 {
            let session = Duration::from_secs(cfg.publish_session_secs);
            match cluster_aes_path(cfg) {
                // A cluster member claims the rotation; whoever still holds the claim after
                // CLAIM_SETTLE rotates (on a later check).
                Some(path) => {
                    let age = stamp(&path)
                        .and_then(|(m, _)| SystemTime::now().duration_since(m).ok())
                        .unwrap_or_default();
                    if age >= session {
                        if let Err(e) = request_rotation(&cfg.cachedir, &cfg.id) {
                            tracing::warn!(error = %e, "cannot claim the publish-key rotation");
                        }
                    }
                }
                None => {
                    if self.since.is_some_and(|t| t.elapsed() >= session) {
                        reason = Some("publish_session elapsed");
                    }
                }
            }
        }
        if let Some(reason) = reason {
            self.rotate(key, cfg, reason);
        }
    }

    fn rotate(&mut self, current: &PublishKey, cfg: &SaltMasterConfig, reason: &str) {
        let key = CrypticleKey::generate();
        if let Some(path) = cluster_aes_path(cfg) {
            if let Err(e) = write_atomic(&path, key.to_key_string().as_bytes(), 0o600) {
                tracing::error!(error = %e, "publish key NOT rotated: cannot write the cluster key");
                return;
            }
            self.seen = stamp(&path);
        }
        current.replace(key);
        self.since = Some(Instant::now());
        tracing::info!(
            reason,
            "publish key rotated; minions re-authenticate on the next publish"
        );
    }

    fn reload_if_changed(&mut self, current: &PublishKey, path: &Path) {
        let now = stamp(path);
        if now.is_none() || now == self.seen {
            return;
        }
        self.seen = now;
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the cluster publish key");
                return;
            }
        };
        match CrypticleKey::from_key_string(text.trim()) {
            Ok(k) if k.to_key_string() != current.current().to_key_string() => {
                current.replace(k);
                self.since = Some(Instant::now());
                tracing::info!(path = %path.display(), "publish key reloaded: a cluster peer rotated it");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(path = %path.display(), error = %e,
                "the cluster publish key file does not hold a key; keeping the current one"),
        }
    }
}

fn cluster_aes_path(cfg: &SaltMasterConfig) -> Option<PathBuf> {
    cfg.cluster.as_ref().map(|c| c.pki_dir.join(".aes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_dropfile_is_salts_mode_0400_file_naming_the_master() {
        let d = tempfile::tempdir().unwrap();
        request_rotation(d.path(), "m1").unwrap();
        let dfn = d.path().join(".dfn");
        assert_eq!(std::fs::read_to_string(&dfn).unwrap(), "m1");
        assert_eq!(std::fs::metadata(&dfn).unwrap().mode() & 0o777, 0o400);
        // A second request while one is pending keeps the first (Salt: "already requested").
        request_rotation(d.path(), "m2").unwrap();
        assert_eq!(std::fs::read_to_string(&dfn).unwrap(), "m1");
        // Only the named master takes it, and taking it removes it.
        assert_eq!(take_request(d.path(), "m2", Duration::ZERO), None);
        assert_eq!(
            take_request(d.path(), "m1", Duration::from_secs(3600)),
            None
        );
        assert_eq!(take_request(d.path(), "m1", Duration::ZERO), Some(()));
        assert!(!dfn.exists());
        assert_eq!(take_request(d.path(), "m1", Duration::ZERO), None);
    }

    #[test]
    fn a_dropfile_with_other_permissions_is_ignored_like_salt_does() {
        let d = tempfile::tempdir().unwrap();
        let dfn = d.path().join(".dfn");
        std::fs::write(&dfn, "m1").unwrap();
        std::fs::set_permissions(&dfn, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(take_request(d.path(), "m1", Duration::ZERO), None);
        assert!(dfn.exists());
    }

    #[test]
    fn replacing_the_key_changes_what_readers_get() {
        let k = PublishKey::new(CrypticleKey::generate());
        let before = k.current().to_key_string();
        k.replace(CrypticleKey::generate());
        assert_ne!(k.current().to_key_string(), before);
    }
}
