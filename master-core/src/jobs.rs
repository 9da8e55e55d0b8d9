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
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The JID for a moment (microsecond precision).
pub fn jid_at(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (y, mo, day) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}{mo:02}{day:02}{:02}{:02}{:02}{:06}",
        s / 3600,
        (s / 60) % 60,
        s % 60,
        d.subsec_micros()
    )
}

/// The moment a JID names, or `None` when it is not a valid JID.
pub fn jid_time(jid: &str) -> Option<SystemTime> {
    if jid.len() != 20 || !jid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = |r: std::ops::Range<usize>| jid.get(r)?.parse::<u32>().ok();
    let (y, mo, d) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (h, mi, s, us) = (n(8..10)?, n(10..12)?, n(12..14)?, n(14..20)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(i64::from(y), mo, d);
    let secs = days * 86_400 + i64::from(h * 3600 + mi * 60 + s);
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(u64::from(us)))
}

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
        write_atomic(
            &self
                .dir
                .join(jid)
                .join("returns")
                .join(format!("{minion}.json")),
            &bytes,
            0o600,
        )?;
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

    /// A job's load and returns: `{"jid", "load", "returns": {id: ret}}`.
    pub fn show(&self, jid: &str) -> Result<Json, JobError> {
        check_jid(jid)?;
        let job = self.dir.join(jid);
        let load_path = job.join("load.json");
        let load = read_json(&load_path).map_err(|e| match e {
            JobError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                JobError::NotFound(jid.to_string())
            }
            other => other,
        })?;
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
    fn jid_format_and_parse_round_trip() {
        let t = UNIX_EPOCH + Duration::from_micros(1_795_837_028_835_052);
        let jid = jid_at(t);
        assert_eq!(jid.len(), 20);
        assert_eq!(jid_time(&jid), Some(t));
        assert_eq!(jid_at(UNIX_EPOCH), "19700101000000000000");
        assert_eq!(
            jid_at(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "20000229000000000000"
        );
        for bad in [
            "",
            "req",
            "2026112203370883505",
            "2026132203370883505x",
            "20261322033708835052",
        ] {
            assert_eq!(jid_time(bad), None, "{bad}");
        }
    }

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
