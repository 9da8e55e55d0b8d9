//! Keys on disk, in Salt's exact layout, so `salt-key` on the same directory sees the same state.
//!
//! * `<pki_dir>/master.pem` (PKCS#1, mode 0400) and `master.pub` (SPKI): the master key pair,
//!   created on first start;
//! * `minions/<id>` accepted, `minions_pre/<id>` pending, `minions_rejected/<id>` rejected:
//!   one file holding the minion's public key PEM; storing a state removes the other two;
//! * `minions_denied/<id>`: a *different* key offered for an id that already has one.
//!
//! A file found in several state directories is read as Salt reads it: rejected, then pending,
//! then accepted; symlinks are ignored. Every id is validated before a path is built.
//! Writes go to a hidden temp file and are renamed into place (atomic for readers).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use saltgate_wire::pem;
use saltgate_wire::rsa::{PrivateKey, PublicKey, RsaError, KEY_BITS};
use serde::Serialize;
use thiserror::Error;

use crate::id::{validate_minion_id, IdError};
use crate::target::any_glob_match;

#[derive(Debug, Error)]
pub enum KeyError {
    #[error(transparent)]
    Id(#[from] IdError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a usable RSA key: {source}")]
    BadKey {
        path: PathBuf,
        #[source]
        source: RsaError,
    },
    #[error(
        "master_use_pubkey_signature is set but the signature file {path} is missing or empty; \
         create it with `saltgate-master key gen-signature` (salt-key --gen-signature), or name \
         it with master_pubkey_signature"
    )]
    SignatureMissing { path: PathBuf },
    #[error("no key for minion {0:?}")]
    NotFound(String),
    #[error("the key of {id:?} is {state}, not {wanted}")]
    WrongState {
        id: String,
        state: KeyState,
        wanted: &'static str,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where a minion key sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyState {
    Accepted,
    Pending,
    Rejected,
    Denied,
}

impl KeyState {
    /// Salt's directory name for the state.
    pub fn dir(self) -> &'static str {
        match self {
            KeyState::Accepted => "minions",
            KeyState::Pending => "minions_pre",
            KeyState::Rejected => "minions_rejected",
            KeyState::Denied => "minions_denied",
        }
    }

    pub const ALL: [KeyState; 4] = [
        KeyState::Accepted,
        KeyState::Pending,
        KeyState::Rejected,
        KeyState::Denied,
    ];
}

impl std::fmt::Display for KeyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyState::Accepted => "accepted",
            KeyState::Pending => "pending",
            KeyState::Rejected => "rejected",
            KeyState::Denied => "denied",
        })
    }
}

/// Every id by state, sorted; the JSON form is `salt-key -L --out json`'s.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KeyList {
    pub minions: Vec<String>,
    pub minions_pre: Vec<String>,
    pub minions_rejected: Vec<String>,
    pub minions_denied: Vec<String>,
}

impl KeyList {
    /// Every listed id, in any state, sorted, each once.
    pub fn all(&self) -> Vec<String> {
        let mut every: Vec<String> = KeyState::ALL
            .iter()
            .flat_map(|s| self.ids(*s).iter().cloned())
            .collect();
        every.sort();
        every.dedup();
        every
    }

    pub fn ids(&self, state: KeyState) -> &[String] {
        match state {
            KeyState::Accepted => &self.minions,
            KeyState::Pending => &self.minions_pre,
            KeyState::Rejected => &self.minions_rejected,
            KeyState::Denied => &self.minions_denied,
        }
    }
}

/// The minion key directories under one PKI root (`pki_dir`, or `cluster_pki_dir`).
#[derive(Debug, Clone)]
pub struct KeyStore {
    root: PathBuf,
}

impl KeyStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        KeyStore { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates the root (0700) and the four state directories (0750), as Salt does.
    pub fn ensure_dirs(&self) -> Result<(), KeyError> {
        make_dir(&self.root, 0o700)?;
        for s in KeyState::ALL {
            make_dir(&self.root.join(s.dir()), 0o750)?;
        }
        Ok(())
    }

    fn path(&self, state: KeyState, id: &str) -> Result<PathBuf, KeyError> {
        validate_minion_id(id)?;
        Ok(self.root.join(state.dir()).join(id))
    }

    /// The accepted, pending or rejected key of `id` (Salt's precedence), or `None`.
    pub fn fetch(&self, id: &str) -> Result<Option<(KeyState, String)>, KeyError> {
        for state in [KeyState::Rejected, KeyState::Pending, KeyState::Accepted] {
            if let Some(text) = read_key_file(&self.path(state, id)?)? {
                return Ok(Some((state, text)));
            }
        }
        Ok(None)
    }

    /// The accepted key of `id`, read from disk on every call (as Salt's `tok` check does).
    pub fn accepted(&self, id: &str) -> Result<Option<String>, KeyError> {
        read_key_file(&self.path(KeyState::Accepted, id)?)
    }

    /// The denied key stored for `id`, if any.
    pub fn denied(&self, id: &str) -> Result<Option<String>, KeyError> {
        read_key_file(&self.path(KeyState::Denied, id)?)
    }

    /// Stores `pub_pem` as `state` (accepted, pending or rejected) and removes the other two.
    pub fn store(&self, id: &str, state: KeyState, pub_pem: &str) -> Result<(), KeyError> {
        let target = self.path(state, id)?;
        self.ensure_dirs()?;
        for other in [KeyState::Accepted, KeyState::Pending, KeyState::Rejected] {
            if other != state {
                remove_if_exists(&self.path(other, id)?)?;
            }
        }
        write_atomic(&target, pub_pem.as_bytes(), 0o640)
    }

    /// Records a conflicting key for `id` in `minions_denied` (Salt keeps one per id on disk).
    pub fn store_denied(&self, id: &str, pub_pem: &str) -> Result<(), KeyError> {
        let target = self.path(KeyState::Denied, id)?;
        self.ensure_dirs()?;
        write_atomic(&target, pub_pem.as_bytes(), 0o640)
    }

    /// All ids by state. Entries that are not regular files or not valid ids are skipped.
    pub fn list(&self) -> Result<KeyList, KeyError> {
        let mut out = KeyList::default();
        for state in KeyState::ALL {
            let dir = self.root.join(state.dir());
            let mut ids = Vec::new();
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(&dir)(e)),
            };
            for entry in entries {
                let entry = entry.map_err(io_err(&dir))?;
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
                // Hidden names are our own in-flight writes (and Salt skips them too).
                if is_file && !name.starts_with('.') && validate_minion_id(&name).is_ok() {
                    ids.push(name);
                }
            }
            ids.sort();
            match state {
                KeyState::Accepted => out.minions = ids,
                KeyState::Pending => out.minions_pre = ids,
                KeyState::Rejected => out.minions_rejected = ids,
                KeyState::Denied => out.minions_denied = ids,
            }
        }
        // An id found in several state directories is listed once, in the state Salt reads it
        // in (rejected, then pending, then accepted; `fetch`), as `salt-key -L` lists it.
        let (pre, rejected) = (out.minions_pre.clone(), out.minions_rejected.clone());
        out.minions_pre
            .retain(|id| rejected.binary_search(id).is_err());
        out.minions
            .retain(|id| rejected.binary_search(id).is_err() && pre.binary_search(id).is_err());
        Ok(out)
    }

    /// `salt-key -a ID`: a pending key becomes accepted.
    pub fn accept(&self, id: &str) -> Result<(), KeyError> {
        self.move_key(id, KeyState::Pending, KeyState::Accepted, "pending")
    }

    /// `salt-key -r ID`: a pending key becomes rejected.
    pub fn reject(&self, id: &str) -> Result<(), KeyError> {
        self.move_key(id, KeyState::Pending, KeyState::Rejected, "pending")
    }

    fn move_key(
        &self,
        id: &str,
        from: KeyState,
        to: KeyState,
        wanted: &'static str,
    ) -> Result<(), KeyError> {
        match self.fetch(id)? {
            Some((state, text)) if state == from => self.store(id, to, &text),
            Some((state, _)) => Err(KeyError::WrongState {
                id: id.to_string(),
                state,
                wanted,
            }),
            None => Err(KeyError::NotFound(id.to_string())),
        }
    }

    /// `salt-key -d ID`: removes every key of `id`, denied included. Returns whether any existed.
    pub fn delete(&self, id: &str) -> Result<bool, KeyError> {
        let mut any = false;
        for s in KeyState::ALL {
            any |= remove_if_exists(&self.path(s, id)?)?;
        }
        Ok(any)
    }

    /// Salt's fingerprint (`pem_finger`) of the key of `id` in `state`.
    pub fn finger(&self, id: &str, state: KeyState) -> Result<Option<String>, KeyError> {
        Ok(read_key_file(&self.path(state, id)?)?.map(|t| pem::pem_finger(&t)))
    }

    /// `salt-key -F` / `-f GLOB`: the fingerprints of every key whose name matches `pattern` (a
    /// glob, or several joined by commas), by Salt's status names: `local` (the `.pem` and `.pub`
    /// files in `local_dir`, the master's own), `minions`, `minions_denied`, `minions_pre`,
    /// `minions_rejected`. Statuses with no match are left out, as Salt does.
    pub fn fingers(&self, local_dir: &Path, pattern: &str) -> Result<Fingers, KeyError> {
        let wanted = |name: &str| any_glob_match(pattern, name);
        let mut out = Fingers::new();
        let list = self.list()?;
        for state in KeyState::ALL {
            for id in list.ids(state).iter().filter(|id| wanted(id)) {
                if let Some(f) = self.finger(id, state)? {
                    out.entry(state.dir()).or_default().insert(id.clone(), f);
                }
            }
        }
        let entries = match std::fs::read_dir(local_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_err(local_dir)(e)),
        };
        for e in entries {
            let e = e.map_err(io_err(local_dir))?;
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            if !(name.ends_with(".pem") || name.ends_with(".pub")) || !wanted(&name) {
                continue;
            }
            if let Some(text) = read_key_file(&e.path())? {
                out.entry("local")
                    .or_default()
                    .insert(name, pem::pem_finger(&text));
            }
        }
        Ok(out)
    }
}

/// Fingerprints by Salt's status name, then key name; both sorted, as `salt-key -F` prints them.
pub type Fingers =
    std::collections::BTreeMap<&'static str, std::collections::BTreeMap<String, String>>;

/// `salt-key`'s heading for a status name of [`Fingers`] or [`KeyList`].
pub fn status_title(status: &str) -> &'static str {
    match status {
        "local" => "Local Keys:",
        "minions" => "Accepted Keys:",
        "minions_denied" => "Denied Keys:",
        "minions_pre" => "Unaccepted Keys:",
        "minions_rejected" => "Rejected Keys:",
        _ => "Keys:",
    }
}

/// Salt compares keys as text after `clean_key`.
pub fn same_key(a: &str, b: &str) -> bool {
    pem::clean_key(a) == pem::clean_key(b)
}

/// A key file's text, or `None` when there is no regular file at `path` (a symlink, a
/// directory, a FIFO are not keys). Read on every request that checks a `tok`, so one open
/// (`O_NOFOLLOW`, and `O_NONBLOCK` so a FIFO cannot block it), one `fstat` and the read.
fn read_key_file(path: &Path) -> Result<Option<String>, KeyError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    /// A key file is a few hundred bytes; refuse to read something absurd.
    const MAX: u64 = 64 * 1024;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    let meta = f.metadata().map_err(io_err(path))?;
    if !meta.file_type().is_file() {
        return Ok(None);
    }
    let mut text = Vec::with_capacity(meta.len().min(MAX) as usize + 1);
    f.take(MAX + 1)
        .read_to_end(&mut text)
        .map_err(io_err(path))?;
    if text.len() as u64 > MAX {
        return Err(io_err(path)(std::io::Error::other(
            "key file larger than 64 KiB",
        )));
    }
    Ok(Some(String::from_utf8_lossy(&text).into_owned()))
}

fn remove_if_exists(path: &Path) -> Result<bool, KeyError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(path)(e)),
    }
}

pub(crate) fn make_dir(path: &Path, mode: u32) -> Result<(), KeyError> {
    match std::fs::create_dir_all(path) {
        Ok(()) => {}
        Err(e) => return Err(io_err(path)(e)),
    }
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
    Ok(())
}

/// Writes `data` to a hidden temp file next to `target`, flushes it to disk, then renames it
/// into place: for keys and job loads, which must survive a crash.
pub(crate) fn write_atomic(target: &Path, data: &[u8], mode: u32) -> Result<(), KeyError> {
    let dir = target.parent().unwrap_or(Path::new("."));
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{:016x}.tmp", rand::random::<u64>()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    let written = f.write_all(data).and_then(|()| f.sync_all());
    drop(f);
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, target)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(target)(e));
    }
    Ok(())
}

/// The master's RSA key pair (`master.pem` / `master.pub` in `pki_dir`).
#[derive(Debug, Clone)]
pub struct MasterKey {
    pub private: PrivateKey,
    pub public: PublicKey,
    /// The public key as sent to minions (`clean_key` form).
    pub pub_pem: String,
}

impl MasterKey {
    /// Loads `<dir>/<name>.pem`, or creates the pair (RSA 2048) when it does not exist yet.
    pub fn load_or_create(dir: &Path, name: &str) -> Result<Self, KeyError> {
        make_dir(dir, 0o700)?;
        let pem_path = dir.join(format!("{name}.pem"));
        let pub_path = dir.join(format!("{name}.pub"));
        let private = match std::fs::read_to_string(&pem_path) {
            Ok(text) => PrivateKey::from_pem(&text).map_err(|source| KeyError::BadKey {
                path: pem_path.clone(),
                source,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::info!(path = %pem_path.display(), "creating the master key pair (RSA 2048)");
                let key = PrivateKey::generate(KEY_BITS).map_err(|source| KeyError::BadKey {
                    path: pem_path.clone(),
                    source,
                })?;
                let text = key.to_pem().map_err(|source| KeyError::BadKey {
                    path: pem_path.clone(),
                    source,
                })?;
                write_atomic(&pem_path, text.as_bytes(), 0o400)?;
                key
            }
            Err(e) => return Err(io_err(&pem_path)(e)),
        };
        let public = private.public_key();
        let pub_text = public.to_pem().map_err(|source| KeyError::BadKey {
            path: pub_path.clone(),
            source,
        })?;
        match std::fs::read_to_string(&pub_path) {
            Ok(existing) if same_key(&existing, &pub_text) => {}
            _ => write_atomic(&pub_path, pub_text.as_bytes(), 0o644)?,
        }
        Ok(MasterKey {
            private,
            public,
            pub_pem: pem::clean_key(&pub_text),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUB: &str = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";

    #[test]
    fn storing_a_state_removes_the_other_two_and_denied_is_separate() {
        let d = tempfile::tempdir().unwrap();
        let ks = KeyStore::new(d.path());
        ks.store("m1", KeyState::Pending, PUB).unwrap();
        assert_eq!(ks.fetch("m1").unwrap().unwrap().0, KeyState::Pending);
        ks.accept("m1").unwrap();
        assert_eq!(ks.fetch("m1").unwrap().unwrap().0, KeyState::Accepted);
        assert!(!d.path().join("minions_pre/m1").exists());
        ks.store_denied("m1", "other").unwrap();
        let l = ks.list().unwrap();
        assert_eq!(l.minions, vec!["m1"]);
        assert_eq!(l.minions_denied, vec!["m1"]);
        assert!(ks.delete("m1").unwrap());
        assert_eq!(ks.list().unwrap(), KeyList::default());
    }

    #[test]
    fn rejected_wins_over_pending_and_accepted_like_salt() {
        let d = tempfile::tempdir().unwrap();
        let ks = KeyStore::new(d.path());
        ks.ensure_dirs().unwrap();
        for dir in ["minions", "minions_pre", "minions_rejected"] {
            std::fs::write(d.path().join(dir).join("m"), PUB).unwrap();
        }
        assert_eq!(ks.fetch("m").unwrap().unwrap().0, KeyState::Rejected);
    }

    #[test]
    fn symlinks_and_hidden_files_are_not_keys() {
        let d = tempfile::tempdir().unwrap();
        let ks = KeyStore::new(d.path());
        ks.ensure_dirs().unwrap();
        std::fs::write(d.path().join("outside"), PUB).unwrap();
        std::os::unix::fs::symlink(d.path().join("outside"), d.path().join("minions/evil"))
            .unwrap();
        std::fs::write(d.path().join("minions/.tmpfile"), PUB).unwrap();
        assert_eq!(ks.fetch("evil").unwrap(), None);
        assert!(ks.list().unwrap().minions.is_empty());
        // Neither a directory nor a FIFO (which must not block the read) is a key.
        std::fs::create_dir(d.path().join("minions/dir")).unwrap();
        let fifo =
            std::ffi::CString::new(d.path().join("minions_pre/pipe").to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(ks.fetch("dir").unwrap(), None);
        assert_eq!(ks.fetch("pipe").unwrap(), None);
        // A regular file still is, and an absurd one is an error, not a read of it all.
        std::fs::write(d.path().join("minions/web1"), PUB).unwrap();
        assert_eq!(ks.accepted("web1").unwrap().as_deref(), Some(PUB));
        std::fs::write(d.path().join("minions/huge"), vec![b'A'; 70 * 1024]).unwrap();
        assert!(ks.accepted("huge").is_err());
    }

    #[test]
    fn bad_ids_never_reach_the_file_system() {
        let d = tempfile::tempdir().unwrap();
        let ks = KeyStore::new(d.path().join("pki"));
        assert!(matches!(
            ks.store("../x", KeyState::Pending, PUB),
            Err(KeyError::Id(_))
        ));
        assert!(matches!(ks.delete("a/b"), Err(KeyError::Id(_))));
        assert!(
            !d.path().join("pki").exists(),
            "nothing created for a bad id"
        );
    }

    #[test]
    fn accept_of_a_rejected_key_is_refused_with_its_state() {
        let d = tempfile::tempdir().unwrap();
        let ks = KeyStore::new(d.path());
        ks.store("m", KeyState::Rejected, PUB).unwrap();
        let e = ks.accept("m").unwrap_err();
        assert!(e.to_string().contains("rejected"), "{e}");
        assert!(matches!(ks.accept("nope"), Err(KeyError::NotFound(_))));
    }
}
