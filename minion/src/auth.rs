//! Salt's `_auth` exchange, minion side: the request and every check Salt's minion makes on
//! the reply (`salt/crypt.py` `sign_in`, `handle_signin_response`, `verify_master`,
//! `extract_aes`). Pure: no sockets; [`crate::channel`] sends what this builds.
//!
//! Checks, in Salt's order: the reply is a clear envelope with a signed `load`; a `pub_key` in
//! it must equal the cached master key (or pass `master_finger` and be cached on first
//! contact); `pub_sig` present exactly when `verify_master_pubkey_sign` is on, and then a new
//! or changed master key is taken only when its signature verifies (MultiMaster-PKI); the `aes`
//! key decrypts and its X9.31 `sig` is the SHA-256 hex digest of it; our `token`, when we sent
//! one, comes back decrypted and re-encrypted to us; the PKCS#1 signature over the raw `load`
//! verifies with the master key; the `nonce` is ours. Then `ret` decides pending/rejected/full.

use std::sync::Arc;

use saltgate_wire::crypticle::CrypticleKey;
use saltgate_wire::envelope::{self, map, text, Reply, RequestEnvelope, Value};
use saltgate_wire::hex;
use saltgate_wire::rsa::{EncAlgo, PublicKey, SigAlgo};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::keys::{KeyError, MasterKeyStore, MinionKey};

/// A successful `_auth`: the keys for this master.
#[derive(Debug, Clone)]
pub struct Session {
    /// The master's publish key (shared by all its minions).
    pub aes: CrypticleKey,
    /// Our per-minion session key for v3 requests.
    pub session: CrypticleKey,
    /// The publish port the master announced.
    pub publish_port: Option<u16>,
    pub master_pub: Arc<PublicKey>,
}

/// What the master said.
#[derive(Debug, Clone)]
pub enum AuthOutcome {
    Accepted(Session),
    /// Key stored as pending (`ret: True`): wait `acceptance_wait_time` and ask again.
    Pending,
    /// Key rejected or denied (`ret: False`).
    Rejected,
    /// `max_minions` reached (`ret: "full"`).
    Full,
}

/// Why a reply was refused. Every one is the master's fault (or an attacker's).
#[derive(Debug, Error)]
pub enum AuthError {
    #[error("master reply is not a signed clear envelope: {0}")]
    Malformed(String),
    #[error("master refused the algorithm: {0}")]
    BadAlgo(String),
    #[error(transparent)]
    MasterKey(#[from] KeyError),
    #[error("the aes key did not decrypt with our key: {0}")]
    AesDecrypt(String),
    #[error("the aes key's signature (sig) is missing or wrong")]
    AesSignature,
    #[error("the master failed to decrypt our random token")]
    Token,
    #[error("the payload signature did not validate")]
    Signature,
    #[error("the payload nonce did not validate")]
    Nonce,
}

/// A fresh uuid4-like hex nonce (32 chars), as Salt's `uuid.uuid4().hex`.
pub fn new_nonce() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Builds the clear `_auth` request. `token` is sent OAEP-encrypted to the master only when we
/// already trust a master key (as Salt does).
pub fn request(
    id: &str,
    key: &MinionKey,
    nonce: &str,
    master_pub: Option<&PublicKey>,
    token: &[u8],
) -> RequestEnvelope {
    let mut load = vec![
        ("cmd", text("_auth")),
        ("id", text(id)),
        ("nonce", text(nonce)),
        ("enc_algo", text("OAEP-SHA1")),
        ("sig_algo", text("PKCS1v15-SHA1")),
        ("pub", text(&key.public_pem)),
    ];
    if let Some(mp) = master_pub {
        if let Ok(ct) = mp.encrypt(EncAlgo::OaepSha1, token) {
            load.push(("token", envelope::bin(&ct)));
        }
    }
    RequestEnvelope::clear(map(load))
}

/// Checks the master's reply to [`request`].
pub fn verify_reply(
    reply: Reply,
    key: &MinionKey,
    nonce: &str,
    sent_token: Option<&[u8]>,
    store: &MasterKeyStore,
) -> Result<AuthOutcome, AuthError> {
    let (load, sig) = match reply {
        Reply::Envelope { load, sig, .. } => {
            if let Some(ret) = envelope::get(&load, "ret").and_then(envelope::as_str) {
                if ret.starts_with("bad ") {
                    return Err(AuthError::BadAlgo(ret.to_owned()));
                }
            }
            (load, sig)
        }
        other => return Err(AuthError::Malformed(format!("{other:?}"))),
    };
    let raw = envelope::as_bytes(&load)
        .ok_or_else(|| AuthError::Malformed("load is not bytes".into()))?
        .to_vec();
    let inner = envelope::decode(&raw).map_err(|e| AuthError::Malformed(e.to_string()))?;
    let field = |k: &str| envelope::get(&inner, k);
    let mut accepted = None;
    if let Some(pem) = field("pub_key").and_then(envelope::as_str) {
        let pub_sig = field("pub_sig").map(|v| envelope::as_bytes(v).unwrap_or_default());
        let (master_pub, replaced) = store.verify_master(pem, pub_sig)?;
        let aes_ct = field("aes")
            .and_then(envelope::as_bytes)
            .ok_or_else(|| AuthError::AesDecrypt("no aes".into()))?;
        let aes = key
            .private
            .decrypt(EncAlgo::OaepSha1, aes_ct)
            .map_err(|e| AuthError::AesDecrypt(e.to_string()))?;
        let digest = hex(&Sha256::digest(&aes));
        let sig_ok = field("sig")
            .and_then(envelope::as_bytes)
            .and_then(|s| master_pub.public_decrypt_x931(s).ok())
            .is_some_and(|d| d == digest.as_bytes());
        if !sig_ok {
            return Err(AuthError::AesSignature);
        }
        // A key that replaced the cached one (verified by its signature) never saw our token:
        // it was encrypted to the old key (Salt's `extract_aes(master_pub=False)`).
        if let Some(token) = sent_token.filter(|_| !replaced) {
            let back = field("token")
                .and_then(envelope::as_bytes)
                .and_then(|t| key.private.decrypt(EncAlgo::OaepSha1, t).ok());
            if back.as_deref() != Some(token) {
                return Err(AuthError::Token);
            }
        }
        let aes = std::str::from_utf8(&aes)
            .ok()
            .and_then(|s| CrypticleKey::from_key_string(s).ok())
            .ok_or_else(|| AuthError::AesDecrypt("not a Crypticle key string".into()))?;
        let session = field("session")
            .and_then(envelope::as_bytes)
            .and_then(|s| key.private.decrypt(EncAlgo::OaepSha1, s).ok())
            .and_then(|s| String::from_utf8(s).ok())
            .and_then(|s| CrypticleKey::from_key_string(&s).ok())
            .ok_or_else(|| AuthError::AesDecrypt("session key".into()))?;
        let publish_port = field("publish_port")
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok());
        accepted = Some(Session {
            aes,
            session,
            publish_port,
            master_pub,
        });
    }
    // Salt verifies the signature whenever a master key is cached (including just now).
    if let Some(mp) = store.current() {
        let ok = sig
            .as_deref()
            .is_some_and(|s| mp.verify(SigAlgo::Pkcs1v15Sha1, &raw, s));
        if !ok {
            return Err(AuthError::Signature);
        }
    }
    if field("nonce").and_then(envelope::as_str) != Some(nonce) {
        return Err(AuthError::Nonce);
    }
    match field("ret") {
        Some(Value::Boolean(false)) => return Ok(AuthOutcome::Rejected),
        Some(v) if envelope::as_str(v) == Some("full") => return Ok(AuthOutcome::Full),
        Some(_) => return Ok(AuthOutcome::Pending),
        None => {}
    }
    accepted
        .map(AuthOutcome::Accepted)
        .ok_or_else(|| AuthError::Malformed("neither pub_key nor ret in the reply".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use saltgate_wire::rsa::PrivateKey;

    struct Master {
        key: PrivateKey,
        pem: String,
    }

    fn master() -> Master {
        let key = PrivateKey::generate(1024).unwrap();
        let pem = key.public_key().to_clean_pem().unwrap();
        Master { key, pem }
    }

    fn accept_reply(
        m: &Master,
        minion: &MinionKey,
        nonce: &str,
        token: Option<&[u8]>,
        tamper: &str,
    ) -> Reply {
        accept_reply_with(m, minion, nonce, token, tamper, None)
    }

    /// Builds the reply a Salt master sends on accept, with knobs to break each part.
    fn accept_reply_with(
        m: &Master,
        minion: &MinionKey,
        nonce: &str,
        token: Option<&[u8]>,
        tamper: &str,
        pub_sig: Option<&str>,
    ) -> Reply {
        let mpub = PublicKey::from_pem(&minion.public_pem).unwrap();
        let aes = CrypticleKey::generate().to_key_string();
        let digest = hex(&Sha256::digest(aes.as_bytes()));
        let sig_of = if tamper == "aes_sig" { "x" } else { &digest };
        let mut inner = vec![
            ("enc", text("pub")),
            ("pub_key", text(&m.pem)),
            ("publish_port", Value::from(4505)),
            ("pub_sig", pub_sig.map(text).unwrap_or(Value::Nil)),
            (
                "aes",
                envelope::bin(&mpub.encrypt(EncAlgo::OaepSha1, aes.as_bytes()).unwrap()),
            ),
            (
                "session",
                envelope::bin(
                    &mpub
                        .encrypt(
                            EncAlgo::OaepSha1,
                            CrypticleKey::generate().to_key_string().as_bytes(),
                        )
                        .unwrap(),
                ),
            ),
            (
                "sig",
                envelope::bin(&m.key.private_encrypt_x931(sig_of.as_bytes()).unwrap()),
            ),
            (
                "nonce",
                text(if tamper == "nonce" { "0000" } else { nonce }),
            ),
        ];
        if let Some(t) = token {
            let t = if tamper == "token" {
                b"nope" as &[u8]
            } else {
                t
            };
            inner.push((
                "token",
                envelope::bin(&mpub.encrypt(EncAlgo::OaepSha1, t).unwrap()),
            ));
        }
        inner.retain(|(k, v)| *k != "pub_sig" || !v.is_nil());
        let raw = envelope::encode(&map(inner));
        let mut sig = m.key.sign(SigAlgo::Pkcs1v15Sha1, &raw).unwrap();
        if tamper == "sig" {
            sig[0] ^= 1;
        }
        Reply::Envelope {
            enc: "clear".into(),
            load: envelope::bin(&raw),
            sig: Some(sig),
        }
    }

    fn minion_key() -> MinionKey {
        MinionKey::from_private(PrivateKey::generate(1024).unwrap()).unwrap()
    }

    #[test]
    fn accept_is_verified_and_master_key_cached_then_every_tamper_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = MasterKeyStore::open(dir.path(), None).unwrap();
        let (m, k) = (master(), minion_key());
        let n = new_nonce();
        let out = verify_reply(accept_reply(&m, &k, &n, None, ""), &k, &n, None, &store).unwrap();
        let AuthOutcome::Accepted(s) = out else {
            panic!("{out:?}")
        };
        assert_eq!(s.publish_port, Some(4505));
        assert!(store.current().is_some());
        let tok = b"random token";
        verify_reply(
            accept_reply(&m, &k, &n, Some(tok), ""),
            &k,
            &n,
            Some(tok),
            &store,
        )
        .unwrap();
        for (tamper, want) in [
            ("aes_sig", "AesSignature"),
            ("nonce", "Nonce"),
            ("sig", "Signature"),
            ("token", "Token"),
        ] {
            let r = accept_reply(&m, &k, &n, Some(tok), tamper);
            let e = verify_reply(r, &k, &n, Some(tok), &store).unwrap_err();
            assert!(format!("{e:?}").starts_with(want), "{tamper}: {e:?}");
        }
        // Another master key is refused once one is cached.
        let other = master();
        let e =
            verify_reply(accept_reply(&other, &k, &n, None, ""), &k, &n, None, &store).unwrap_err();
        assert!(matches!(e, AuthError::MasterKey(_)), "{e:?}");
    }

    #[test]
    fn pending_rejected_and_full_are_read_from_ret() {
        let dir = tempfile::tempdir().unwrap();
        let store = MasterKeyStore::open(dir.path(), None).unwrap();
        let k = minion_key();
        let n = new_nonce();
        for (ret, want) in [
            (Value::Boolean(true), "Pending"),
            (Value::Boolean(false), "Rejected"),
            (text("full"), "Full"),
        ] {
            let raw = envelope::encode(&map(vec![("ret", ret), ("nonce", text(&n))]));
            let reply = Reply::Envelope {
                enc: "clear".into(),
                load: envelope::bin(&raw),
                sig: Some(vec![1, 2, 3]),
            };
            let out = verify_reply(reply, &k, &n, None, &store).unwrap();
            assert!(format!("{out:?}").starts_with(want));
        }
        assert!(verify_reply(Reply::Text("bad load".into()), &k, &n, None, &store).is_err());
    }

    #[test]
    fn multimaster_pki_a_signed_master_is_taken_over_and_a_rogue_one_refused() {
        use crate::keys::SignCheck;
        use base64::Engine;
        let dir = tempfile::tempdir().unwrap();
        let signer = PrivateKey::generate(1024).unwrap();
        std::fs::write(
            dir.path().join("master_sign.pub"),
            signer.public_key().to_pem().unwrap(),
        )
        .unwrap();
        let store = MasterKeyStore::open(dir.path(), None)
            .unwrap()
            .with_sign_check(SignCheck {
                verify: true,
                always: false,
                key_name: "master_sign".into(),
            });
        let sign = |by: &PrivateKey, m: &Master| {
            let s = by.sign(SigAlgo::Pkcs1v15Sha1, m.pem.as_bytes()).unwrap();
            base64::engine::general_purpose::STANDARD.encode(s) + "\n"
        };
        let k = minion_key();
        let n = new_nonce();
        let (a, b) = (master(), master());
        let r = accept_reply_with(&a, &k, &n, None, "", Some(&sign(&signer, &a)));
        let out = verify_reply(r, &k, &n, None, &store).unwrap();
        assert!(matches!(out, AuthOutcome::Accepted(_)), "{out:?}");
        // Failover to master b (another master key, same signing key): taken over, and the
        // token we encrypted to a's key is not asked back.
        let tok = b"token for a";
        let r = accept_reply_with(&b, &k, &n, None, "", Some(&sign(&signer, &b)));
        let out = verify_reply(r, &k, &n, Some(tok), &store).unwrap();
        assert!(matches!(out, AuthOutcome::Accepted(_)), "{out:?}");
        // A master signed by another key is refused with the reason.
        let rogue = PrivateKey::generate(1024).unwrap();
        let c = master();
        let r = accept_reply_with(&c, &k, &n, None, "", Some(&sign(&rogue, &c)));
        let e = verify_reply(r, &k, &n, None, &store).unwrap_err();
        assert!(
            matches!(e, AuthError::MasterKey(KeyError::PubSigInvalid { .. })),
            "{e:?}"
        );
        // And one that does not sign at all.
        let r = accept_reply(&c, &k, &n, None, "");
        let e = verify_reply(r, &k, &n, None, &store).unwrap_err();
        assert!(
            matches!(e, AuthError::MasterKey(KeyError::PubSigMissing)),
            "{e:?}"
        );
    }
}
