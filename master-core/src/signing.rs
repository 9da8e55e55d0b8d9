//! MultiMaster-PKI, master side: the master signs its public key so that a minion holding only
//! the signing key's public half (`master_sign.pub`) can trust any master of the set, as Salt
//! 3008.5 does (`salt/crypt.py` `MasterKeys`, `salt/master.py` `_auth`, `salt/key.py`
//! `gen_keys_signature`).
//!
//! * `master_sign_pubkey: True` adds `pub_sig` to every accepting `_auth` reply: base64 (with
//!   its trailing newline, Python's `binascii.b2a_base64`) of a PKCS#1 v1.5 signature, with the
//!   `sig_algo` the minion asked for (default SHA-1), over the `pub_key` string of the reply
//!   (the `clean_key` PEM: no trailing newline). The signing pair `<master_sign_key_name>.pem`/
//!   `.pub` in `pki_dir` is created on start when missing. PKCS#1 v1.5 is deterministic, so the
//!   signature is made once per algorithm and kept (Salt signs on every `_auth`).
//! * with `master_use_pubkey_signature: True` the reply carries the content of the
//!   pre-computed signature file `<pki_dir>/<master_pubkey_signature>` (Salt's default name:
//!   `<id>_pubkey_signature`), `clean_key`ed; a missing file stops the master, as Salt exits.
//! * [`gen_signature`] is `salt-key --gen-signature [--auto-create] [--priv] [--pub]
//!   [--signature-path]`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64::Engine;
use saltgate_config::salt_master::SaltMasterConfig;
use saltgate_wire::envelope::{text, Value};
use saltgate_wire::pem::clean_key;
use saltgate_wire::rsa::{PrivateKey, PublicKey, RsaError, SigAlgo, KEY_BITS};

use crate::keys::{write_atomic, KeyError, MasterKey};

/// What goes into `pub_sig`.
pub enum PubSig {
    /// Sign the reply's `pub_key` with the signing key; signatures kept per (algorithm, key).
    Sign {
        key: Box<PrivateKey>,
        made: Mutex<Vec<(SigAlgo, String, String)>>,
    },
    /// The pre-computed signature file's text (`clean_key`).
    File(String),
}

impl std::fmt::Debug for PubSig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PubSig::Sign { .. } => f.write_str("PubSig::Sign"),
            PubSig::File(_) => f.write_str("PubSig::File"),
        }
    }
}

/// Python's `binascii.b2a_base64`: standard alphabet, padded, one trailing newline.
pub fn b2a_base64(bytes: &[u8]) -> String {
    let mut s = base64::engine::general_purpose::STANDARD.encode(bytes);
    s.push('\n');
    s
}

/// Python's `binascii.a2b_base64` for what Salt writes: whitespace ignored.
pub fn a2b_base64(text: &[u8]) -> Option<Vec<u8>> {
    let clean: Vec<u8> = text
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(clean).ok()
}

impl PubSig {
    /// What the configuration asks for: `None` without `master_sign_pubkey`. Reads the
    /// signature file, or loads (creating when missing) the signing key pair.
    pub fn load(config: &SaltMasterConfig) -> Result<Option<PubSig>, KeyError> {
        let s = &config.signing;
        if !s.sign_pubkey {
            return Ok(None);
        }
        if s.use_signature_file {
            let path = config.pki_dir.join(config.pubkey_signature_file());
            return match std::fs::read_to_string(&path) {
                Ok(t) if !clean_key(&t).is_empty() => {
                    tracing::info!(path = %path.display(), "read the master public key's signature");
                    Ok(Some(PubSig::File(clean_key(&t))))
                }
                Ok(_) => Err(KeyError::SignatureMissing { path }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Err(KeyError::SignatureMissing { path })
                }
                Err(e) => Err(KeyError::Io { path, source: e }),
            };
        }
        let pair = MasterKey::load_or_create(&config.pki_dir, &s.key_name)?;
        tracing::info!(key = %config.pki_dir.join(format!("{}.pem", s.key_name)).display(),
            "signing the master public key in _auth replies (master_sign_pubkey)");
        Ok(Some(PubSig::Sign {
            key: Box::new(pair.private),
            made: Mutex::new(Vec::new()),
        }))
    }

    /// The `pub_sig` value of a reply whose `pub_key` is `pub_pem`, for a minion that asked
    /// for `algo`.
    pub fn value(&self, pub_pem: &str, algo: SigAlgo) -> Result<Value, RsaError> {
        match self {
            PubSig::File(t) => Ok(text(t)),
            PubSig::Sign { key, made } => {
                let mut made = made.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((_, _, s)) = made.iter().find(|(a, p, _)| *a == algo && p == pub_pem) {
                    return Ok(text(s));
                }
                let sig = b2a_base64(&key.sign(algo, pub_pem.as_bytes())?);
                // A handful at most (algorithms × the key in use); keep it bounded anyway.
                if made.len() >= 8 {
                    made.clear();
                }
                made.push((algo, pub_pem.to_string(), sig.clone()));
                Ok(text(&sig))
            }
        }
    }
}

/// `salt-key --gen-signature`'s options.
#[derive(Debug, Clone, Default)]
pub struct GenSignature {
    /// `--priv`: the signing private key; default `<pki_dir>/<master_sign_key_name>.pem`.
    pub private: Option<PathBuf>,
    /// `--pub`: the public key to sign; default `<pki_dir>/master.pub`.
    pub public: Option<PathBuf>,
    /// `--signature-path`: the directory of the signature file; default `pki_dir`.
    pub signature_dir: Option<PathBuf>,
    /// `--auto-create`: create the signing pair when there is no private key.
    pub auto_create: bool,
    /// `--keysize` for `--auto-create` (Salt rounds up to 2048).
    pub keysize: Option<usize>,
}

/// Why `gen-signature` did nothing (Salt's messages).
#[derive(Debug, thiserror::Error)]
pub enum GenSignatureError {
    #[error("Public-key {0} does not exist")]
    NoPublic(PathBuf),
    #[error("Private-key {0} does not exist")]
    NoPrivate(PathBuf),
    #[error(
        "No usable private-key found (looked for {0}); create the signing pair with --auto-create"
    )]
    NoUsablePrivate(PathBuf),
    #[error("No usable public-key found (looked for {0}); name it with --pub")]
    NoUsablePublic(PathBuf),
    #[error("{0} already exists at expected location; remove it to make a new signature")]
    Exists(PathBuf),
    #[error("{path}: not a usable RSA key: {source}")]
    BadKey {
        path: PathBuf,
        #[source]
        source: RsaError,
    },
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// `salt-key --gen-signature`: signs the master public key with the signing key and writes
/// `b2a_base64(signature)` to `<dir>/<master_pubkey_signature>` (mode 0400, as Salt's key
/// cache writes it). Returns the signature file's path.
pub fn gen_signature(
    config: &SaltMasterConfig,
    opts: &GenSignature,
) -> Result<PathBuf, GenSignatureError> {
    let pki = &config.pki_dir;
    let key_name = &config.signing.key_name;
    let pub_path = match &opts.public {
        Some(p) if !p.is_file() => return Err(GenSignatureError::NoPublic(p.clone())),
        Some(p) => p.clone(),
        None => {
            let p = pki.join("master.pub");
            if !p.is_file() {
                return Err(GenSignatureError::NoUsablePublic(p));
            }
            p
        }
    };
    let sig_path = opts
        .signature_dir
        .as_deref()
        .unwrap_or(pki)
        .join(config.pubkey_signature_file());
    if sig_path.exists() {
        return Err(GenSignatureError::Exists(sig_path));
    }
    let private = match &opts.private {
        Some(p) if !p.is_file() => return Err(GenSignatureError::NoPrivate(p.clone())),
        Some(p) => read_private(p)?,
        None => {
            let p = pki.join(format!("{key_name}.pem"));
            if p.is_file() {
                read_private(&p)?
            } else if opts.auto_create {
                let bits = opts.keysize.unwrap_or(KEY_BITS).max(KEY_BITS);
                create_pair(pki, key_name, bits)?
            } else {
                return Err(GenSignatureError::NoUsablePrivate(p));
            }
        }
    };
    let public = std::fs::read_to_string(&pub_path)
        .map_err(|source| KeyError::Io {
            path: pub_path.clone(),
            source,
        })
        .map_err(GenSignatureError::from)
        .and_then(|t| {
            PublicKey::from_pem(&t).map_err(|source| GenSignatureError::BadKey {
                path: pub_path.clone(),
                source,
            })
        })?;
    // Salt re-serialises the key and signs its `clean_key` form: the bytes a minion verifies.
    let message = public
        .to_clean_pem()
        .map_err(|source| GenSignatureError::BadKey {
            path: pub_path.clone(),
            source,
        })?;
    let sig = private
        .sign(SigAlgo::Pkcs1v15Sha1, message.as_bytes())
        .map_err(|source| GenSignatureError::BadKey {
            path: pub_path.clone(),
            source,
        })?;
    if let Some(dir) = sig_path.parent() {
        crate::keys::make_dir(dir, 0o700)?;
    }
    write_atomic(&sig_path, b2a_base64(&sig).as_bytes(), 0o400)?;
    Ok(sig_path)
}

fn read_private(path: &Path) -> Result<PrivateKey, GenSignatureError> {
    let t = std::fs::read_to_string(path).map_err(|source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    PrivateKey::from_pem(&t).map_err(|source| GenSignatureError::BadKey {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a new `<name>.pem` (0400) / `<name>.pub` (0644) pair in `dir`.
fn create_pair(dir: &Path, name: &str, bits: usize) -> Result<PrivateKey, GenSignatureError> {
    let pem_path = dir.join(format!("{name}.pem"));
    let bad = |source| GenSignatureError::BadKey {
        path: pem_path.clone(),
        source,
    };
    let key = PrivateKey::generate(bits).map_err(bad)?;
    let pem = key.to_pem().map_err(bad)?;
    let pub_pem = key.public_key().to_pem().map_err(bad)?;
    crate::keys::make_dir(dir, 0o700)?;
    write_atomic(&pem_path, pem.as_bytes(), 0o400)?;
    write_atomic(&dir.join(format!("{name}.pub")), pub_pem.as_bytes(), 0o644)?;
    tracing::info!(path = %pem_path.display(), bits, "created the signing key pair");
    Ok(key)
}

#[cfg(test)]
#[path = "signing_tests.rs"]
mod tests;
