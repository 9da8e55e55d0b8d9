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
    #[error(
        "the master sent its public-key signature (pub_sig) but verify_master_pubkey_sign is not \
         enabled on this minion: enable it (and copy the master's master_sign.pub into pki_dir), \
         or disable master_sign_pubkey on the master"
    )]
    PubSigNotVerified,
    #[error(
        "the master did not send its public-key signature (pub_sig) but verify_master_pubkey_sign \
         is enabled on this minion: enable master_sign_pubkey on the master, or disable \
         verification here"
    )]
    PubSigMissing,
    #[error(
        "verification public key {path} does not exist: copy {name}.pub from the master's \
         pki_dir into this minion's pki_dir (master_sign_key_name: {name})"
    )]
    NoVerificationKey { path: PathBuf, name: String },
    #[error(
        "the master's public-key signature (pub_sig) does not verify with {path}: this master \
         is not signed by the key the minion trusts; refused"
    )]
    PubSigInvalid { path: PathBuf },
}

/// MultiMaster-PKI on the minion: Salt's `verify_master_pubkey_sign`, `always_verify_signature`
/// and `master_sign_key_name` (`salt/crypt.py` `verify_master`, `check_auth_deps`,
/// `verify_pubkey_sig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignCheck {
    /// The master must send `pub_sig`; a new or changed master key is accepted only when it
    /// verifies (and replaces the cached one).
    pub verify: bool,
    /// Verify `pub_sig` also when the key equals the cached one.
    pub always: bool,
    /// `master_sign_key_name`: the verification key is `<pki_dir>/<name>.pub`.
    pub key_name: String,
}

/// Python's `binascii.a2b_base64` for the base64 Salt sends (whitespace ignored).
pub fn a2b_base64(text: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine;
    let clean: Vec<u8> = text
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(clean).ok()
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
    sign: SignCheck,
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
            sign: SignCheck::default(),
            cached: Mutex::new(cached),
        })
    }

    /// Turns MultiMaster-PKI verification on as `sign` says.
    pub fn with_sign_check(mut self, sign: SignCheck) -> Self {
        self.sign = sign;
        self
    }

    /// `<pki_dir>/<master_sign_key_name>.pub`.
    fn verification_key_path(&self) -> PathBuf {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        dir.join(format!("{}.pub", self.sign.key_name))
    }

    /// Salt's `verify_pubkey_sig`: `pub_sig` (base64) is a PKCS#1 v1.5 SHA-1 signature of the
    /// reply's `pub_key` text by the verification key, read from disk each time (Salt reloads
    /// it when it changes).
    fn verify_pub_sig(&self, pem_text: &str, pub_sig: &[u8]) -> Result<(), KeyError> {
        let path = self.verification_key_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(KeyError::NoVerificationKey {
                    path,
                    name: self.sign.key_name.clone(),
                })
            }
            Err(e) => return Err(io(&path)(e)),
        };
        let key = PublicKey::from_pem(&text).map_err(|source| KeyError::BadKey {
            path: path.clone(),
            source,
        })?;
        let ok = a2b_base64(pub_sig).is_some_and(|sig| {
            key.verify(
                saltgate_wire::rsa::SigAlgo::Pkcs1v15Sha1,
                pem_text.as_bytes(),
                &sig,
            )
        });
        if ok {
            tracing::debug!(key = %path.display(), "verified the master public key's signature");
            Ok(())
        } else {
            Err(KeyError::PubSigInvalid { path })
        }
    }

    /// Salt's `verify_master` with MultiMaster-PKI: checks that master and minion agree on
    /// signing (`check_auth_deps`), then [`Self::check_or_pin`] without verification; with it,
    /// a new or changed key is accepted (and cached) only when `pub_sig` verifies, and with
    /// `always_verify_signature` the cached key too. Returns the key and whether it replaced
    /// another (then Salt does not check the returned `token`: it was encrypted to the old key).
    pub fn verify_master(
        &self,
        pem_text: &str,
        pub_sig: Option<&[u8]>,
    ) -> Result<(Arc<PublicKey>, bool), KeyError> {
        let sig = match (pub_sig, self.sign.verify) {
            (Some(_), false) => return Err(KeyError::PubSigNotVerified),
            (None, true) => return Err(KeyError::PubSigMissing),
            (None, false) => return self.check_or_pin(pem_text).map(|k| (k, false)),
            (Some(s), true) => s,
        };
        let clean = clean_key(pem_text);
        let mut cached = self.lock();
        let had = match cached.as_ref() {
            Some((text, key)) if *text == clean => {
                if self.sign.always {
                    self.verify_pub_sig(pem_text, sig)?;
                }
                return Ok((key.clone(), false));
            }
            other => other.is_some(),
        };
        self.verify_pub_sig(pem_text, sig)?;
        let key = self.pin(&mut cached, clean)?;
        if had {
            tracing::info!(path = %self.path.display(),
                "the master's public key changed and its signature verified; cached the new key");
        }
        Ok((key, had))
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
        self.pin(&mut cached, clean)
    }

    /// Checks `master_finger` and caches `clean` (memory and `minion_master.pub`).
    fn pin(
        &self,
        cached: &mut Option<(String, Arc<PublicKey>)>,
        clean: String,
    ) -> Result<Arc<PublicKey>, KeyError> {
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

    mod multimaster_pki {
        use super::*;
        use saltgate_test_support::pki_fixture as fx;
        use saltgate_wire::rsa::SigAlgo;

        fn b64(b: &[u8]) -> String {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(b) + "\n"
        }

        fn store(dir: &Path, always: bool) -> MasterKeyStore {
            std::fs::write(dir.join("master_sign.pub"), fx::SIGN_PUB).unwrap();
            MasterKeyStore::open(dir, None)
                .unwrap()
                .with_sign_check(SignCheck {
                    verify: true,
                    always,
                    key_name: "master_sign".into(),
                })
        }

        #[test]
        fn salts_signature_is_accepted_and_ours_is_salts() {
            let dir = tempfile::tempdir().unwrap();
            let s = store(dir.path(), false);
            let pem = clean_key(fx::MASTER_PUB);
            let (_, replaced) = s
                .verify_master(&pem, Some(fx::SALT_SIG.as_bytes()))
                .unwrap();
            assert!(!replaced, "first contact replaces nothing");
            assert_eq!(
                std::fs::read_to_string(dir.path().join("minion_master.pub")).unwrap(),
                pem
            );
            // The signature Rust makes with the same key is Salt's, byte for byte.
            let ours = PrivateKey::from_pem(fx::SIGN_PEM)
                .unwrap()
                .sign(SigAlgo::Pkcs1v15Sha1, pem.as_bytes())
                .unwrap();
            assert_eq!(b64(&ours), fx::SALT_SIG);
        }

        #[test]
        fn a_changed_master_key_is_taken_only_with_a_valid_signature() {
            let dir = tempfile::tempdir().unwrap();
            let s = store(dir.path(), false);
            let first = clean_key(fx::MASTER_PUB);
            s.verify_master(&first, Some(fx::SALT_SIG.as_bytes()))
                .unwrap();
            let other = PrivateKey::generate(1024)
                .unwrap()
                .public_key()
                .to_clean_pem()
                .unwrap();
            // Signed by a key the minion does not trust: refused, the cached key stays.
            let rogue = PrivateKey::generate(1024).unwrap();
            let bad = b64(&rogue.sign(SigAlgo::Pkcs1v15Sha1, other.as_bytes()).unwrap());
            let e = s.verify_master(&other, Some(bad.as_bytes())).unwrap_err();
            assert!(matches!(e, KeyError::PubSigInvalid { .. }), "{e}");
            assert!(e.to_string().contains("master_sign.pub"), "{e}");
            let e = s.verify_master(&other, Some(b"not base64!")).unwrap_err();
            assert!(matches!(e, KeyError::PubSigInvalid { .. }), "{e}");
            assert_eq!(
                std::fs::read_to_string(dir.path().join("minion_master.pub")).unwrap(),
                first
            );
            // Signed by the trusted signing key: the new master key replaces the old one.
            let sign = PrivateKey::from_pem(fx::SIGN_PEM).unwrap();
            let good = b64(&sign.sign(SigAlgo::Pkcs1v15Sha1, other.as_bytes()).unwrap());
            let (_, replaced) = s.verify_master(&other, Some(good.as_bytes())).unwrap();
            assert!(replaced);
            assert_eq!(
                std::fs::read_to_string(dir.path().join("minion_master.pub")).unwrap(),
                other
            );
        }

        #[test]
        fn both_sides_must_agree_and_the_verification_key_must_exist() {
            let dir = tempfile::tempdir().unwrap();
            let pem = clean_key(fx::MASTER_PUB);
            let s = store(dir.path(), false);
            let e = s.verify_master(&pem, None).unwrap_err();
            assert!(matches!(e, KeyError::PubSigMissing), "{e}");
            let plain = MasterKeyStore::open(dir.path(), None).unwrap();
            let e = plain
                .verify_master(&pem, Some(fx::SALT_SIG.as_bytes()))
                .unwrap_err();
            assert!(matches!(e, KeyError::PubSigNotVerified), "{e}");
            std::fs::remove_file(dir.path().join("master_sign.pub")).unwrap();
            let s = MasterKeyStore::open(dir.path(), None)
                .unwrap()
                .with_sign_check(SignCheck {
                    verify: true,
                    always: false,
                    key_name: "master_sign".into(),
                });
            let e = s
                .verify_master(&pem, Some(fx::SALT_SIG.as_bytes()))
                .unwrap_err();
            assert!(matches!(e, KeyError::NoVerificationKey { .. }), "{e}");
            assert!(e.to_string().contains("copy master_sign.pub"), "{e}");
        }

        #[test]
        fn always_verify_signature_checks_the_cached_key_too() {
            let dir = tempfile::tempdir().unwrap();
            let pem = clean_key(fx::MASTER_PUB);
            let s = store(dir.path(), false);
            s.verify_master(&pem, Some(fx::SALT_SIG.as_bytes()))
                .unwrap();
            let forged = fx::SALT_SIG.replace('A', "B");
            // The same key as cached: not checked again by default...
            s.verify_master(&pem, Some(forged.as_bytes())).unwrap();
            // ...but with always_verify_signature it is.
            let s = store(dir.path(), true);
            s.verify_master(&pem, Some(fx::SALT_SIG.as_bytes()))
                .unwrap();
            let e = s.verify_master(&pem, Some(forged.as_bytes())).unwrap_err();
            assert!(matches!(e, KeyError::PubSigInvalid { .. }), "{e}");
        }
    }
}
