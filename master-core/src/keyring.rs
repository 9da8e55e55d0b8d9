//! Keys and authentication: the minion keys, the master key pair, the publish key handed out
//! in `_auth` replies, the minions' session keys, the replay guard and the `tok`s that verified.
//! What the `_auth` handler and the authentication of every encrypted request use
//! ([`crate::request`]); publishing borrows the key pair and the accepted minions from it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saltgate_wire::crypticle::CrypticleKey;

use crate::keys::{make_dir, write_atomic, KeyStore, MasterKey};
use crate::rotate::PublishKey;
use crate::signing::PubSig;
use crate::target::Target;
use crate::util::lock;

/// Keys and authentication (see the module's doc).
pub struct KeyRing {
    /// Minion keys (`pki_dir`, or `cluster_pki_dir` in a cluster).
    pub keys: KeyStore,
    /// The key pair minions see (the cluster's in a cluster).
    pub master_key: MasterKey,
    /// The publish key ("aes"): shared by all minions, new on every start (the cluster's in a
    /// cluster), rotated by [`crate::rotate`]; publishing encrypts with the same one.
    pub aes: Arc<PublishKey>,
    /// The port minions are told to subscribe to (the bound one).
    pub publish_port: u16,
    pub sessions: Sessions,
    pub nonces: NonceGuard,
    /// `tok`s that verified, per minion and accepted key.
    pub toks: VerifiedToks,
    /// `pub_sig` of `_auth` replies (`master_sign_pubkey`); see [`crate::signing`].
    pub pub_sig: Option<PubSig>,
    /// The `sig` of an `_auth` reply (X9.31 over the publish key's SHA-256) for the current
    /// publish key: one of the three RSA private operations of every `_auth`, the same for
    /// every minion until the key rotates.
    aes_sig: Mutex<Option<(String, Vec<u8>)>>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRing")
            .field("keys", &self.keys)
            .field("publish_port", &self.publish_port)
            .finish()
    }
}

impl KeyRing {
    /// `keys_root` holds the minion keys; sessions live under `cachedir`; requests are fresh
    /// within `request_window`.
    pub fn new(
        keys_root: PathBuf,
        cachedir: &std::path::Path,
        request_window: Duration,
        master_key: MasterKey,
        aes: Arc<PublishKey>,
        publish_port: u16,
        pub_sig: Option<PubSig>,
    ) -> Self {
        KeyRing {
            keys: KeyStore::new(keys_root),
            master_key,
            aes,
            publish_port,
            sessions: Sessions::new(cachedir),
            nonces: NonceGuard::new(request_window),
            toks: VerifiedToks::default(),
            pub_sig,
            aes_sig: Mutex::default(),
        }
    }

    /// Accepted minion ids matched by `target`.
    pub fn expected_minions(&self, target: &Target) -> Vec<String> {
        match self.keys.list() {
            Ok(l) => l
                .minions
                .into_iter()
                .filter(|id| target.matches(id))
                .collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot list accepted keys");
                Vec::new()
            }
        }
    }

    /// The master's X9.31 signature of the publish key `aes` (a key string) as an `_auth` reply
    /// carries it (`sig`), made once per key.
    pub fn aes_key_sig(&self, aes: &str) -> Result<Vec<u8>, saltgate_wire::rsa::RsaError> {
        if let Some((k, sig)) = lock(&self.aes_sig).as_ref() {
            if k == aes {
                return Ok(sig.clone());
            }
        }
        use sha2::Digest;
        let digest = saltgate_wire::hex(&sha2::Sha256::digest(aes.as_bytes()));
        let sig = self
            .master_key
            .private
            .private_encrypt_x931(digest.as_bytes())?;
        *lock(&self.aes_sig) = Some((aes.to_string(), sig.clone()));
        Ok(sig)
    }
}

/// Per-minion session keys (Salt: `cachedir/sessions/<id>`, one key string per file).
#[derive(Debug)]
pub struct Sessions {
    dir: PathBuf,
    keys: Mutex<HashMap<String, CrypticleKey>>,
}

impl Sessions {
    pub fn new(cachedir: &std::path::Path) -> Self {
        Sessions {
            dir: cachedir.join("sessions"),
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// The session key of an already validated id, if one was issued.
    pub fn get(&self, id: &str) -> Option<CrypticleKey> {
        if let Some(k) = lock(&self.keys).get(id) {
            return Some(k.clone());
        }
        let text = std::fs::read_to_string(self.dir.join(id)).ok()?;
        let key = CrypticleKey::from_key_string(&text).ok()?;
        lock(&self.keys).insert(id.to_string(), key.clone());
        Some(key)
    }

    /// The session key of `id`, created (and saved, mode 0600) when there is none.
    pub fn get_or_create(&self, id: &str) -> CrypticleKey {
        if let Some(k) = self.get(id) {
            return k;
        }
        let key = CrypticleKey::generate();
        if make_dir(&self.dir, 0o700).is_ok() {
            if let Err(e) = write_atomic(&self.dir.join(id), key.to_key_string().as_bytes(), 0o600)
            {
                tracing::warn!(error = %e, "session key not saved; it lives until restart");
            }
        }
        lock(&self.keys).insert(id.to_string(), key.clone());
        key
    }
}

/// Why a nonce was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonceRefusal {
    /// `ts` is outside the window around our clock.
    Stale,
    /// The same (id, nonce) was seen within the window.
    Replay,
}

/// Remembers (id, nonce) pairs for `window`; refuses repeats and requests whose `ts` is outside
/// the window. Salt itself only echoes the nonce; this guard is ours.
#[derive(Debug)]
pub struct NonceGuard {
    window: u64,
    seen: Mutex<HashMap<String, u64>>,
}

/// Entries kept before expired ones are swept.
const NONCE_SWEEP_AT: usize = 100_000;

impl NonceGuard {
    pub fn new(window: Duration) -> Self {
        NonceGuard {
            window: window.as_secs().max(1),
            seen: Mutex::new(HashMap::new()),
        }
    }

    pub fn check(
        &self,
        id: &str,
        nonce: &str,
        ts: Option<i64>,
        now: u64,
    ) -> Result<(), NonceRefusal> {
        if let Some(ts) = ts {
            let now_i = i64::try_from(now).unwrap_or(i64::MAX);
            if now_i.saturating_sub(ts).unsigned_abs() > self.window {
                return Err(NonceRefusal::Stale);
            }
        }
        let mut seen = lock(&self.seen);
        let key = format!("{id}\n{nonce}");
        if seen.get(&key).is_some_and(|exp| *exp > now) {
            return Err(NonceRefusal::Replay);
        }
        if seen.len() >= NONCE_SWEEP_AT {
            seen.retain(|_, exp| *exp > now);
        }
        seen.insert(key, now + self.window);
        Ok(())
    }
}

/// For each minion, a digest of (accepted key, `tok`) that verified: the same pair needs no
/// second RSA operation. Bounded: past [`VerifiedToks::CAP`] minions it starts over.
#[derive(Debug, Default)]
pub struct VerifiedToks(Mutex<HashMap<String, [u8; 32]>>);

impl VerifiedToks {
    const CAP: usize = 200_000;

    fn digest(key_pem: &str, tok: &[u8]) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update((key_pem.len() as u64).to_be_bytes());
        h.update(key_pem.as_bytes());
        h.update(tok);
        h.finalize().into()
    }

    /// True when `tok` verified against exactly this `key_pem` for `id` before; else the
    /// digest to [`VerifiedToks::remember`] once it has.
    pub fn known_good(&self, id: &str, key_pem: &str, tok: &[u8]) -> Result<(), [u8; 32]> {
        let d = Self::digest(key_pem, tok);
        match lock(&self.0).get(id) {
            Some(known) if *known == d => Ok(()),
            _ => Err(d),
        }
    }

    pub fn remember(&self, id: &str, d: [u8; 32]) {
        let mut m = lock(&self.0);
        if m.len() >= Self::CAP && !m.contains_key(id) {
            m.clear();
        }
        m.insert(id.to_string(), d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tok_is_known_good_only_with_the_key_it_verified_against() {
        let t = VerifiedToks::default();
        let Err(d) = t.known_good("m1", "KEY A", b"tok") else {
            panic!("unknown pair known good")
        };
        t.remember("m1", d);
        assert!(t.known_good("m1", "KEY A", b"tok").is_ok());
        assert!(t.known_good("m1", "KEY B", b"tok").is_err(), "changed key");
        assert!(t.known_good("m1", "KEY A", b"other").is_err(), "other tok");
        assert!(t.known_good("m2", "KEY A", b"tok").is_err(), "other minion");
        // Length-prefixed: moving bytes between key and tok is a different pair.
        assert!(t.known_good("m1", "KEY At", b"ok").is_err());
    }
}
