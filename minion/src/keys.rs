//! The minion's key pair on disk and the master's public key it trusts.
//!
//! Salt's layout in `pki_dir`: `minion.pem` (PKCS#1, mode 0400) and `minion.pub` (SPKI), created
//! on first start; `minion_master.pub` written on first contact with a master (trust on first
//! use) and compared as text (`clean_key`) on every later `_auth`; `master_finger` pins it.
//! Does not talk to the network.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use saltgate_wire::pem::{clean_key, pem_finger};
use saltgate_wire::rsa::{PrivateKey, PublicKey, RsaError, KEY_BITS};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a usable RSA key ({source}); delete it to have a new one generated")]
    BadKey {
        path: PathBuf,
        #[source]
        source: RsaError,
    },
    #[error("key generation failed: {0}")]
    Generate(RsaError),
    #[error(
        "the master's public key changed (cached in {path}); the master may have been \
         subverted: verify it, then delete the file to accept the new key"
    )]
    MasterKeyChanged { path: PathBuf },
    #[error("the master's key fingerprint {got} does not match master_finger {want}")]
    FingerMismatch { got: String, want: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A minion's key pair and what is derived from it once.
#[derive(Debug)]
pub struct MinionKey {
    pub private: PrivateKey,
    /// `clean_key` text of the public key: what `_auth` sends and the master stores.
    pub public_pem: String,
    /// `tok` = X9.31(private key, b"salt"): deterministic, so computed once.
    pub tok: Vec<u8>,
}

impl MinionKey {
    pub fn from_private(private: PrivateKey) -> Result<Self, RsaError> {
        let public_pem = private.public_key().to_clean_pem()?;
        let tok = private.private_encrypt_x931(b"salt")?;
        Ok(MinionKey {
            private,
            public_pem,
            tok,
        })
    }

    /// Loads `<dir>/<stem>.pem`, or generates a 2048-bit key and writes `<stem>.pem` (0400) and
    /// `<stem>.pub`. Slow when it generates (an RSA keygen): call from a blocking thread.
    pub fn load_or_create(dir: &Path, stem: &str) -> Result<Self, KeyError> {
        let pem_path = dir.join(format!("{stem}.pem"));
        let pub_path = dir.join(format!("{stem}.pub"));
        match std::fs::read_to_string(&pem_path) {
            Ok(text) => {
                let private = PrivateKey::from_pem(&text).map_err(|source| KeyError::BadKey {
                    path: pem_path.clone(),
                    source,
                })?;
                let key = Self::from_private(private).map_err(|source| KeyError::BadKey {
                    path: pem_path.clone(),
                    source,
                })?;
                if !pub_path.exists() {
                    write_file(&pub_path, format!("{}\n", key.public_pem).as_bytes(), 0o644)?;
                }
                Ok(key)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(io(dir))?;
                let private = PrivateKey::generate(KEY_BITS).map_err(KeyError::Generate)?;
                let pem = private.to_pem().map_err(KeyError::Generate)?;
                let key = Self::from_private(private).map_err(KeyError::Generate)?;
                write_file(&pem_path, pem.as_bytes(), 0o400)?;
                write_file(&pub_path, format!("{}\n", key.public_pem).as_bytes(), 0o644)?;
                Ok(key)
            }
            Err(e) => Err(io(&pem_path)(e)),
        }
    }
}

/// Writes a file atomically (temp file + rename) with the given mode.
fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), KeyError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(data).map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// The trusted master public key (`minion_master.pub`), shared by every link of a minion and,
/// in a swarm, by every simulated minion.
#[derive(Debug)]
pub struct MasterKeyStore {
    path: PathBuf,
    finger: Option<String>,
    /// The cached key's clean text and parsed key, once known.
    cached: Mutex<Option<(String, Arc<PublicKey>)>>,
}

impl MasterKeyStore {
    /// Reads `<pki_dir>/minion_master.pub` if present.
    pub fn open(pki_dir: &Path, finger: Option<String>) -> Result<Self, KeyError> {
        let path = pki_dir.join("minion_master.pub");
        let cached = match std::fs::read_to_string(&path) {
            Ok(text) => {
                let key = PublicKey::from_pem(&text).map_err(|source| KeyError::BadKey {
                    path: path.clone(),
                    source,
                })?;
                Some((clean_key(&text), Arc::new(key)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&path)(e)),
        };
        Ok(MasterKeyStore {
            path,
            finger,
            cached: Mutex::new(cached),
        })
    }

    /// The cached master key, if any (sent as the reason to include `token` in `_auth`).
    pub fn current(&self) -> Option<Arc<PublicKey>> {
        self.lock().as_ref().map(|(_, k)| k.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(String, Arc<PublicKey>)>> {
        self.cached.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Salt's `verify_master`: a key different from the cached one is refused; on first contact
    /// the key is checked against `master_finger` (if set) and cached.
    pub fn check_or_pin(&self, pem_text: &str) -> Result<Arc<PublicKey>, KeyError> {
        let clean = clean_key(pem_text);
        let mut cached = self.lock();
        if let Some((text, key)) = cached.as_ref() {
            if *text == clean {
                return Ok(key.clone());
            }
            return Err(KeyError::MasterKeyChanged {
                path: self.path.clone(),
            });
        }
        if let Some(want) = &self.finger {
            let got = pem_finger(&clean);
            if got != *want {
                return Err(KeyError::FingerMismatch {
                    got,
                    want: want.clone(),
                });
            }
        }
        let key = PublicKey::from_pem(&clean).map_err(|source| KeyError::BadKey {
            path: self.path.clone(),
            source,
        })?;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        write_file(&self.path, clean.as_bytes(), 0o644)?;
        let key = Arc::new(key);
        *cached = Some((clean, key.clone()));
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_created_once_then_reloaded_and_master_key_is_pinned() {
        let dir = tempfile::tempdir().unwrap();
        let a = MinionKey::load_or_create(dir.path(), "minion").unwrap();
        let b = MinionKey::load_or_create(dir.path(), "minion").unwrap();
        assert_eq!(a.public_pem, b.public_pem);
        assert_eq!(a.tok, b.tok);
        assert!(dir.path().join("minion.pub").exists());

        let store = MasterKeyStore::open(dir.path(), None).unwrap();
        assert!(store.current().is_none());
        store.check_or_pin(&a.public_pem).unwrap();
        store.check_or_pin(&format!("{}\n", a.public_pem)).unwrap();
        let other = PrivateKey::generate(1024).unwrap().public_key();
        let err = store
            .check_or_pin(&other.to_clean_pem().unwrap())
            .unwrap_err();
        assert!(matches!(err, KeyError::MasterKeyChanged { .. }));
        // A new store reads the pinned key back from disk.
        let store = MasterKeyStore::open(dir.path(), None).unwrap();
        assert!(store.current().is_some());
    }

    #[test]
    fn master_finger_refuses_another_key_on_first_contact() {
        let dir = tempfile::tempdir().unwrap();
        let k = PrivateKey::generate(1024).unwrap().public_key();
        let pem = k.to_clean_pem().unwrap();
        let wrong = vec!["00"; 32].join(":");
        let store = MasterKeyStore::open(dir.path(), Some(wrong)).unwrap();
        assert!(matches!(
            store.check_or_pin(&pem),
            Err(KeyError::FingerMismatch { .. })
        ));
        let store = MasterKeyStore::open(dir.path(), Some(pem_finger(&pem))).unwrap();
        store.check_or_pin(&pem).unwrap();
    }
}
