//! Job ids and the on-disk job cache.
//!
//! * JIDs are Salt's: `YYYYMMDDhhmmssffffff` (20 digits, UTC here; Salt uses local time), made
//!   unique within the process by bumping the microseconds.
//! * Layout: `<cachedir>/jobs/<jid>/load.json` (the job as published plus the expected
//!   minions) and `<cachedir>/jobs/<jid>/returns.<master id>.jsonl`, the returns that master
//!   stored, one record `{"id": minion, "ret": return, "t": unix time}` per line, appended. A log
//!   per master, because cluster members share `cachedir` (over NFS, where appends from two
//!   hosts to one file overwrite each other). JSON, not Salt's msgpack `local_cache` layout:
//!   this cache is ours, read by `saltgate-master jobs`. One file per job and master, not per
//!   return: a file per return cost an inode allocation each, and on ext4 with many recently
//!   deleted inodes (a master pruning its jobs) that scan was a third of the master's CPU per
//!   return.
//! * Caches written before that (`<jid>/returns/<minion id>.json`) are still read, and
//!   [`JobCache::save_load`] still makes `returns/`, so a member of the earlier version sharing
//!   the cache during a rolling upgrade can store its returns.
//! * [`JobCache::prune`] removes jobs whose JID time is older than `keep_jobs` hours.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value as Json};
use thiserror::Error;

use crate::id::validate_minion_id;
use crate::keys::{make_dir, write_atomic, KeyError};

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
    #[error(
        "{path}: return of {minion} written short ({written} of {len} bytes); the disk may be full"
    )]
    Short {
        path: PathBuf,
        minion: String,
        written: usize,
        len: usize,
    },
}

/// The per-return files of caches written before the logs (read, and made for older members).
const LEGACY_RETURNS: &str = "returns";

/// A returns log's file name: `returns.<writer>.jsonl`, or `returns.jsonl`.
fn log_name(writer: Option<&str>) -> String {
    match writer {
        Some(w) => format!("returns.{w}.jsonl"),
        None => "returns.jsonl".into(),
    }
}

fn is_log_name(name: &str) -> bool {
    name.starts_with("returns") && name.ends_with(".jsonl")
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
    /// The returns log this cache appends to, in each job's directory.
    log: String,
}

fn check_jid(jid: &str) -> Result<(), JobError> {
    jid_time(jid)
        .map(|_| ())
        .ok_or_else(|| JobError::BadJid(jid.to_string()))
}

impl JobCache {
    /// A cache that reads every master's returns and appends to `returns.jsonl`.
    pub fn new(cachedir: &Path) -> Self {
        JobCache {
            dir: cachedir.join("jobs"),
            log: log_name(None),
        }
    }

    /// A master's cache: appends to `returns.<master id>.jsonl`, or, for an id that could not
    /// be a file name as it is (the config allows a leading `.`, `..` inside, 255 bytes),
    /// `returns.<first 16 bytes of its SHA-256, hex>.jsonl`: every master a log of its own.
    pub fn for_master(cachedir: &Path, master_id: &str) -> Self {
        let name = log_name(Some(master_id));
        let log = if validate_minion_id(master_id).is_ok() && name.len() <= 255 {
            name
        } else {
            use sha2::{Digest, Sha256};
            let d = Sha256::digest(master_id.as_bytes());
            let hex: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
            log_name(Some(&hex))
        };
        JobCache {
            dir: cachedir.join("jobs"),
            log,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The returns log this cache appends to (a file name in each job's directory).
    pub fn log_name(&self) -> &str {
        &self.log
    }

    /// Saves a new job's load (with the minions expected to return).
    pub fn save_load(&self, jid: &str, load: &Json) -> Result<(), JobError> {
        check_jid(jid)?;
        let job = self.dir.join(jid);
        make_dir(&self.dir, 0o700)?;
        make_dir(&job, 0o700)?;
        make_dir(&job.join(LEGACY_RETURNS), 0o700)?;
        let bytes = serde_json::to_vec_pretty(load).unwrap_or_default();
        write_atomic(&job.join("load.json"), &bytes, 0o600)?;
        Ok(())
    }

    pub fn exists(&self, jid: &str) -> bool {
        check_jid(jid).is_ok() && self.dir.join(jid).join("load.json").is_file()
    }

    /// Saves one minion's return for a job that exists: one record appended to this master's
    /// returns log in a single `write` (`O_APPEND`), so this master's concurrent returns never
    /// interleave. The record is `\n{json}\n`: should a write be torn (a full disk), the next
    /// record still starts on a line of its own. Not synced: Salt's `local_cache` does not
    /// sync returns either (the `publish` client that waited for them has them).
    pub fn save_return(&self, jid: &str, minion: &str, ret: &Json) -> Result<(), JobError> {
        use std::io::Write;
        check_jid(jid)?;
        validate_minion_id(minion)?;
        if !self.exists(jid) {
            return Err(JobError::NotFound(jid.to_string()));
        }
        let path = self.dir.join(jid).join(&self.log);
        let mut f = open_log(&path).map_err(|source| JobError::Io {
            path: path.clone(),
            source,
        })?;
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        /// A returns-log record, borrowing the return (`json!` would copy it whole).
        #[derive(serde::Serialize)]
        struct Record<'a> {
            id: &'a str,
            ret: &'a Json,
            t: f64,
        }
        let mut line = vec![b'\n'];
        serde_json::to_writer(&mut line, &Record { id: minion, ret, t }).unwrap_or_default();
        line.push(b'\n');
        match f.write(&line) {
            Ok(n) if n == line.len() => Ok(()),
            Ok(n) => Err(JobError::Short {
                path,
                minion: minion.to_string(),
                written: n,
                len: line.len(),
            }),
            Err(source) => Err(JobError::Io { path, source }),
        }
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

    /// A job's load and returns: `{"jid", "load", "returns": {id: ret}}`, each minion's
    /// latest return: the last line in each master's log, the latest `t` across logs (the
    /// per-return files of older versions count as oldest).
    /// A line that is not a whole record (a write torn by a full disk) is skipped and named
    /// under `"unreadable_lines"` as `file:line`; the unfinished last line of a log being
    /// written is not read yet.
    pub fn show(&self, jid: &str) -> Result<Json, JobError> {
        let load = self.load(jid)?;
        let job = self.dir.join(jid);
        // id → (time, return); older versions' files count as the oldest.
        let mut latest: std::collections::BTreeMap<String, (f64, Json)> = Default::default();
        if let Ok(entries) = std::fs::read_dir(job.join(LEGACY_RETURNS)) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(id) = name.strip_suffix(".json") {
                    if validate_minion_id(id).is_ok() {
                        latest.insert(id.to_string(), (f64::NEG_INFINITY, read_json(&e.path())?));
                    }
                }
            }
        }
        let mut logs: Vec<String> = match std::fs::read_dir(&job) {
            Ok(entries) => entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| is_log_name(n))
                .collect(),
            Err(source) => return Err(JobError::Io { path: job, source }),
        };
        logs.sort();
        let mut unreadable = Vec::new();
        for name in logs {
            let path = job.join(&name);
            let bytes = std::fs::read(&path).map_err(|source| JobError::Io { path, source })?;
            // Within a log the last line wins (a writer's clock may step back); across logs,
            // the latest `t`.
            let mut in_log: std::collections::HashMap<String, (f64, Json)> = Default::default();
            // Only lines ended by a newline: a record is one write, ended by one.
            let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            for (n, line) in bytes[..whole].split(|&b| b == b'\n').enumerate() {
                if line.is_empty() {
                    continue;
                }
                match record(line) {
                    Some((id, t, ret)) => {
                        in_log.insert(id, (t, ret));
                    }
                    None => unreadable.push(format!("{name}:{}", n + 1)),
                }
            }
            for (id, (t, ret)) in in_log {
                if latest.get(&id).is_none_or(|(seen, _)| t >= *seen) {
                    latest.insert(id, (t, ret));
                }
            }
        }
        let returns: serde_json::Map<String, Json> =
            latest.into_iter().map(|(id, (_, ret))| (id, ret)).collect();
        let mut out = json!({"jid": jid, "load": load, "returns": returns});
        if !unreadable.is_empty() {
            out["unreadable_lines"] = json!(unreadable);
        }
        Ok(out)
    }

    /// Removes jobs older than `keep` (by JID time). `keep` zero keeps everything, like Salt's
    /// `keep_jobs: 0`. Returns the JIDs removed.
    pub fn prune(&self, keep: Duration, now: SystemTime) -> Result<Vec<String>, JobError> {
        let mut removed = Vec::new();
        if keep.is_zero() {
            return Ok(removed);
        }
        for jid in self.list()? {
            if expired(&jid, keep, now) {
                let path = self.dir.join(&jid);
                std::fs::remove_dir_all(&path).map_err(|source| JobError::Io { path, source })?;
                removed.push(jid);
            }
        }
        Ok(removed)
    }
}

/// Whether job `jid` is older than `keep` (by its JID time) at `now`, so [`JobCache::prune`]
/// removes it. `keep` zero keeps everything, like Salt's `keep_jobs: 0`; a bad JID is never
/// expired.
pub fn expired(jid: &str, keep: Duration, now: SystemTime) -> bool {
    !keep.is_zero()
        && jid_time(jid).is_some_and(|t| now.duration_since(t).is_ok_and(|age| age > keep))
}

/// Opens a job's returns log for appending, creating it (mode 0600).
fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
}

/// One returns-log record: `(minion id, time, return)`, or `None` when it is not one.
fn record(line: &[u8]) -> Option<(String, f64, Json)> {
    let mut v: Json = serde_json::from_slice(line).ok()?;
    let id = v.get("id")?.as_str()?.to_string();
    validate_minion_id(&id).ok()?;
    let t = v.get("t").and_then(Json::as_f64).unwrap_or(0.0);
    Some((id, t, v.get_mut("ret")?.take()))
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

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_resent_return_replaces_the_first_and_a_job_is_one_log() {
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
        assert_eq!(shown["returns"].as_object().unwrap().len(), 2);
        assert!(shown.get("unreadable_lines").is_none());
        let job = cache.dir().join(&jid);
        // `returns/` stays (empty) for members of the earlier version during an upgrade.
        assert_eq!(
            names(&job),
            ["load.json", LEGACY_RETURNS, "returns.jsonl"],
            "no file per return, no temp file"
        );
        assert!(names(&job.join(LEGACY_RETURNS)).is_empty());
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(job.join("returns.jsonl")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn members_sharing_the_cache_write_a_log_each_and_the_latest_return_wins() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (
            JobCache::for_master(d.path(), "m1.example.com"),
            JobCache::for_master(d.path(), "m2"),
        );
        assert_eq!(a.log_name(), "returns.m1.example.com.jsonl");
        // Ids the config takes that are no file name as they are get a log of their own too.
        let long = "m".repeat(250);
        let odd: Vec<String> = [".m1", "m..1", long.as_str(), "../x"]
            .iter()
            .map(|id| JobCache::for_master(d.path(), id).log_name().to_string())
            .collect();
        for name in &odd {
            assert!(is_log_name(name) && name.len() == 8 + 32 + 6, "{name}");
        }
        let mut unique = odd.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), odd.len());
        let jid = jid_at(SystemTime::now());
        a.save_load(&jid, &json!({"fun": "test.ping"})).unwrap();
        a.save_return(&jid, "web1", &json!("first")).unwrap();
        b.save_return(&jid, "web1", &json!("second")).unwrap();
        b.save_return(&jid, "web2", &json!(true)).unwrap();
        a.save_return(&jid, "web3", &json!(false)).unwrap();
        let job = a.dir().join(&jid);
        assert_eq!(
            names(&job),
            [
                "load.json",
                LEGACY_RETURNS,
                "returns.m1.example.com.jsonl",
                "returns.m2.jsonl"
            ]
        );
        // Any reader sees every log: web1's later return (in m2's log, sorted after m1's).
        for reader in [&a, &b, &JobCache::new(d.path())] {
            let shown = reader.show(&jid).unwrap();
            assert_eq!(
                shown["returns"],
                json!({"web1": "second", "web2": true, "web3": false})
            );
        }
        // The time decides, not the file's name: a newer return in the first log wins.
        a.save_return(&jid, "web1", &json!("third")).unwrap();
        assert_eq!(a.show(&jid).unwrap()["returns"]["web1"], json!("third"));
        // Within one log the last line wins, even if its writer's clock stepped back.
        let mut f = open_log(&job.join("returns.m2.jsonl")).unwrap();
        std::io::Write::write_all(
            &mut f,
            b"\n{\"id\":\"web9\",\"ret\":\"new\",\"t\":200.0}\n\n{\"id\":\"web9\",\"ret\":\"newer\",\"t\":100.0}\n",
        )
        .unwrap();
        assert_eq!(a.show(&jid).unwrap()["returns"]["web9"], json!("newer"));
    }

    #[test]
    fn concurrent_returns_are_whole_lines_and_a_torn_line_costs_only_itself() {
        let d = tempfile::tempdir().unwrap();
        let cache = JobCache::new(d.path());
        let jid = jid_at(SystemTime::now());
        cache.save_load(&jid, &json!({"fun": "cmd.run"})).unwrap();
        // Returns big enough that interleaved writes would show, from eight threads at once.
        let big = "x".repeat(64 * 1024);
        std::thread::scope(|s| {
            for t in 0..8 {
                let (cache, jid, big) = (&cache, &jid, &big);
                s.spawn(move || {
                    for i in 0..25 {
                        let id = format!("m{t}-{i}");
                        cache
                            .save_return(jid, &id, &json!({"return": format!("{id}{big}")}))
                            .unwrap();
                    }
                });
            }
        });
        let shown = cache.show(&jid).unwrap();
        let returns = shown["returns"].as_object().unwrap();
        assert_eq!(returns.len(), 200);
        for (id, ret) in returns {
            assert_eq!(ret["return"], json!(format!("{id}{big}")));
        }
        assert!(shown.get("unreadable_lines").is_none());
        // A write torn by a full disk (no newline after it): the next return still starts on
        // a line of its own, and only the torn one is lost (each record is `\n{json}\n`, so
        // 200 records end at line 400).
        let log = cache.dir().join(&jid).join("returns.jsonl");
        let mut f = open_log(&log).unwrap();
        std::io::Write::write_all(&mut f, b"{\"id\":\"torn\",\"ret\":{\"ret").unwrap();
        // Until a newline follows, it is an unfinished last line: not read, not unreadable.
        let shown = cache.show(&jid).unwrap();
        assert!(shown.get("unreadable_lines").is_none());
        assert_eq!(shown["returns"].as_object().unwrap().len(), 200);
        cache.save_return(&jid, "after", &json!(true)).unwrap();
        let shown = cache.show(&jid).unwrap();
        assert_eq!(shown["returns"]["after"], json!(true));
        assert!(shown["returns"].get("torn").is_none());
        assert_eq!(shown["unreadable_lines"], json!(["returns.jsonl:401"]));
    }

    #[test]
    fn a_cache_from_before_the_log_is_read_and_takes_new_returns() {
        let d = tempfile::tempdir().unwrap();
        let cache = JobCache::new(d.path());
        let jid = jid_at(SystemTime::now());
        let job = cache.dir().join(&jid);
        std::fs::create_dir_all(job.join(LEGACY_RETURNS)).unwrap();
        std::fs::write(job.join("load.json"), b"{\"fun\": \"test.ping\"}").unwrap();
        std::fs::write(job.join(LEGACY_RETURNS).join("old.json"), b"true").unwrap();
        std::fs::write(job.join(LEGACY_RETURNS).join("both.json"), b"1").unwrap();
        cache.save_return(&jid, "new", &json!(false)).unwrap();
        cache.save_return(&jid, "both", &json!(2)).unwrap();
        let shown = cache.show(&jid).unwrap();
        assert_eq!(
            shown["returns"],
            json!({"old": true, "new": false, "both": 2})
        );
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
