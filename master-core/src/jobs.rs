//! Job ids and the on-disk job cache.
//!
//! * JIDs are Salt's: `YYYYMMDDhhmmssffffff` (20 digits, UTC here; Salt uses local time), made
//!   unique within the process by bumping the microseconds.
//! * Layout: `<cachedir>/jobs/<jid>/load.json` (the job as published plus the expected
//!   minions), `<cachedir>/jobs/<jid>/returns/<minion id>.json` (one return each). JSON, not
//!   Salt's msgpack `local_cache` layout: this cache is ours, read by `saltgate-master jobs`.
//! * [`JobCache::prune`] removes jobs whose JID time is older than `keep_jobs` hours.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value as Json};
use thiserror::Error;

use crate::id::validate_minion_id;
use crate::keys::{make_dir, write_atomic, write_atomic_unsynced, KeyError};

#[derive(Debug, Error)]
pub enum JobError {
    #[error("{0:?} is not a job id (20 digits, YYYYMMDDhhmmssffffff)")]
    BadJid(String),
    #[error("no job {0} in the job cache")]
    NotFound(String),
    #[error("no job cache directory to write to: {0}")]
    Store(#[from] KeyError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("minion id refused: {0}")]
    Id(#[from] crate::id::IdError),
}

pub use saltgate_wire::jid::{jid_at, jid_time};

/// Hands out unique, increasing JIDs.
#[derive(Debug, Default)]
pub struct JidGen {
    last: Mutex<Option<SystemTime>>,
}

impl JidGen {
    pub fn next(&self) -> String {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        // Whole microseconds: that is the JID's resolution.
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        let mut now = UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).unwrap_or(0));
        if let Some(prev) = *last {
            if now <= prev {
                now = prev + Duration::from_micros(1);
            }
        }
        *last = Some(now);
        jid_at(now)
    }
}

/// The job cache under `<cachedir>/jobs`.
#[derive(Debug, Clone)]
pub struct JobCache {
    dir: PathBuf,
}

fn check_jid(jid: &str) -> Result<(), JobError> {
    jid_time(jid)
        .map(|_| ())
        .ok_or_else(|| JobError::BadJid(jid.to_string()))
}

impl JobCache {
    pub fn new(cachedir: &Path) -> Self {
        JobCache {
            dir: cachedir.join("jobs"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Saves a new job's load (with the minions expected to return).
    pub fn save_load(&self, jid: &str, load: &Json) -> Result<(), JobError> {
        check_jid(jid)?;
        let job = self.dir.join(jid);
        make_dir(&self.dir, 0o700)?;
        make_dir(&job.join("returns"), 0o700)?;
        let bytes = serde_json::to_vec_pretty(load).unwrap_or_default();
        write_atomic(&job.join("load.json"), &bytes, 0o600)?;
        Ok(())
    }

    pub fn exists(&self, jid: &str) -> bool {
        check_jid(jid).is_ok() && self.dir.join(jid).join("load.json").is_file()
    }

    /// Saves one minion's return for a job that exists.
    pub fn save_return(&self, jid: &str, minion: &str, ret: &Json) -> Result<(), JobError> {
        check_jid(jid)?;
        validate_minion_id(minion)?;
        if !self.exists(jid) {
            return Err(JobError::NotFound(jid.to_string()));
        }
        let bytes = serde_json::to_vec_pretty(ret).unwrap_or_default();
        let dir = self.dir.join(jid).join("returns");
        let target = dir.join(format!("{minion}.json"));
        if link_new(&dir, &target, &bytes).is_err() {
            // No O_TMPFILE or /proc here, or a re-sent return: the named temp file and rename
            // (which replaces the first return, as it always did).
            write_atomic_unsynced(&target, &bytes, 0o600)?;
        }
        Ok(())
    }

    /// JIDs in the cache, oldest first.
    pub fn list(&self) -> Result<Vec<String>, JobError> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(source) => {
                return Err(JobError::Io {
                    path: self.dir.clone(),
                    source,
                })
            }
        };
        for e in entries.flatten() {
            if let Ok(name) = e.file_name().into_string() {
                if jid_time(&name).is_some() {
                    out.push(name);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// A job's load as saved (without its returns).
    pub fn load(&self, jid: &str) -> Result<Json, JobError> {
        check_jid(jid)?;
        read_json(&self.dir.join(jid).join("load.json")).map_err(|e| match e {
            JobError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                JobError::NotFound(jid.to_string())
            }
            other => other,
        })
    }

    /// A job's load and returns: `{"jid", "load", "returns": {id: ret}}`.
    pub fn show(&self, jid: &str) -> Result<Json, JobError> {
        let load = self.load(jid)?;
        let job = self.dir.join(jid);
        let mut returns = serde_json::Map::new();
        if let Ok(entries) = std::fs::read_dir(job.join("returns")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(id) = name.strip_suffix(".json") {
                    if validate_minion_id(id).is_ok() {
                        returns.insert(id.to_string(), read_json(&e.path())?);
                    }
                }
            }
        }
        Ok(json!({"jid": jid, "load": load, "returns": returns}))
    }

    /// Removes jobs older than `keep` (by JID time). `keep` zero keeps everything, like Salt's
    /// `keep_jobs: 0`. Returns the JIDs removed.
    pub fn prune(&self, keep: Duration, now: SystemTime) -> Result<Vec<String>, JobError> {
        let mut removed = Vec::new();
        if keep.is_zero() {
            return Ok(removed);
        }
        for jid in self.list()? {
            let Some(t) = jid_time(&jid) else { continue };
            if now.duration_since(t).is_ok_and(|age| age > keep) {
                let path = self.dir.join(&jid);
                std::fs::remove_dir_all(&path).map_err(|source| JobError::Io { path, source })?;
                removed.push(jid);
            }
        }
        Ok(removed)
    }
}

/// Writes `data` as the new file `target` in `dir`: an unnamed file (`O_TMPFILE`), written,
/// then linked in under its name. Readers never see a partial file, and the directory changes
/// once, where a named temp file and a rename change it three times (at 2,000 returns a job,
/// those directory updates were a tenth of the master's CPU per return). Not synced (see
/// [`write_atomic_unsynced`]). Fails, writing nothing, when `target` exists.
fn link_new(dir: &Path, target: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(dir)?;
    f.write_all(data)?;
    let src = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd()))?;
    let dst = CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: two NUL-terminated paths that outlive the call; `f` keeps the descriptor open.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            src.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn read_json(path: &Path) -> Result<Json, JobError> {
    let bytes = std::fs::read(path).map_err(|source| JobError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| JobError::Json {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jids_are_unique_and_increasing() {
        let g = JidGen::default();
        let a: Vec<String> = (0..1000).map(|_| g.next()).collect();
        assert!(a.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn prune_removes_only_jobs_older_than_keep_jobs() {
        let d = tempfile::tempdir().unwrap();
        let cache = JobCache::new(d.path());
        let now = SystemTime::now();
        let old = jid_at(now - Duration::from_secs(25 * 3600));
        let fresh = jid_at(now - Duration::from_secs(3600));
        for jid in [&old, &fresh] {
            cache.save_load(jid, &json!({"fun": "test.ping"})).unwrap();
            cache.save_return(jid, "m1", &json!(true)).unwrap();
        }
        assert!(
            cache.prune(Duration::ZERO, now).unwrap().is_empty(),
            "keep_jobs 0 keeps all"
        );
        let removed = cache.prune(Duration::from_secs(24 * 3600), now).unwrap();
        assert_eq!(removed, vec![old.clone()]);
        assert_eq!(cache.list().unwrap(), vec![fresh.clone()]);
        assert_eq!(cache.show(&fresh).unwrap()["returns"]["m1"], json!(true));
        assert!(matches!(cache.show(&old), Err(JobError::NotFound(_))));
    }

    #[test]
    fn a_resent_return_replaces_the_first_and_no_temp_file_is_left() {
        let d = tempfile::tempdir().unwrap();
        let cache = JobCache::new(d.path());
        let jid = jid_at(SystemTime::now());
        cache.save_load(&jid, &json!({"fun": "test.ping"})).unwrap();
        cache
            .save_return(&jid, "m1", &json!({"return": 1}))
            .unwrap();
        cache
            .save_return(&jid, "m1", &json!({"return": 2}))
            .unwrap();
        cache
            .save_return(&jid, "m2", &json!({"return": 3}))
            .unwrap();
        let shown = cache.show(&jid).unwrap();
        assert_eq!(shown["returns"]["m1"], json!({"return": 2}));
        assert_eq!(shown["returns"]["m2"], json!({"return": 3}));
        let mut names: Vec<String> = std::fs::read_dir(cache.dir().join(&jid).join("returns"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["m1.json", "m2.json"]);
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(cache.dir().join(&jid).join("returns/m2.json")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn returns_for_unknown_jobs_or_bad_ids_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let cache = JobCache::new(d.path());
        let jid = jid_at(SystemTime::now());
        assert!(matches!(
            cache.save_return(&jid, "m", &json!(1)),
            Err(JobError::NotFound(_))
        ));
        cache.save_load(&jid, &json!({})).unwrap();
        assert!(matches!(
            cache.save_return(&jid, "../x", &json!(1)),
            Err(JobError::Id(_))
        ));
        assert!(matches!(
            cache.save_return("../../etc", "m", &json!(1)),
            Err(JobError::BadJid(_))
        ));
    }
}
