//! Salt's "Crypticle": AES-192-CBC with HMAC-SHA256, encrypt-then-MAC, and the `pickle::`
//! framing with an optional 32-character nonce and a `serial` replay guard.
//!
//! * Key string: `base64(24-byte AES key ‖ 32-byte HMAC key)`, 76 characters.
//! * `encrypt`: PKCS#7 pad to 16 (always 1–16 bytes), random IV, output `IV ‖ ct ‖ MAC` where
//!   `MAC = HMAC-SHA256(hmac_key, IV ‖ ct)`.
//! * `decrypt`: the MAC is checked in constant time (`subtle`) before anything is decrypted.
//! * `dumps`/`loads`: `b"pickle::" ‖ [nonce] ‖ msgpack(obj)`; a map carrying `serial` must have
//!   a serial greater than the last one seen, else it is a replay.
//!
//! Where Python Salt quietly returns `{}` (no `pickle::` prefix, replayed serial) we return a
//! distinct error, so callers can count and log it.

use std::fmt;

use aes::Aes192;
use base64::Engine;
use cbc::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use hmac::{Hmac, Mac};
use rand::RngCore;
use rmpv::Value;
use sha2::Sha256;
use subtle::ConstantTimeEq;
use thiserror::Error;

use crate::envelope::{self, EnvelopeError};

pub const AES_KEY_LEN: usize = 24;
pub const HMAC_KEY_LEN: usize = 32;
pub const BLOCK_LEN: usize = 16;
pub const MAC_LEN: usize = 32;
/// Length of a key string (`base64` of 56 bytes).
pub const KEY_STRING_LEN: usize = 76;
pub const PICKLE_PAD: &[u8] = b"pickle::";
pub const NONCE_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CrypticleError {
    #[error("key string is not base64 of 56 bytes")]
    BadKey,
    #[error("ciphertext of {0} bytes is too short or not whole blocks")]
    BadLength(usize),
    #[error("message authentication failed")]
    BadMac,
    #[error("invalid padding")]
    BadPadding,
    #[error("plaintext lacks the pickle:: marker")]
    NotPickled,
    #[error("nonce mismatch")]
    NonceMismatch,
    #[error("replayed or old serial {serial} (last seen {last})")]
    Replay { serial: i64, last: i64 },
    #[error("serial is not an integer")]
    BadSerial,
    #[error(transparent)]
    Payload(#[from] EnvelopeError),
}

/// The two keys behind a key string. `Debug` does not print them.
#[derive(Clone, PartialEq, Eq)]
pub struct CrypticleKey {
    aes: [u8; AES_KEY_LEN],
    hmac: [u8; HMAC_KEY_LEN],
}

impl fmt::Debug for CrypticleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CrypticleKey(..)")
    }
}

impl CrypticleKey {
    /// A fresh random key (Salt's `generate_key_string`).
    pub fn generate() -> Self {
        let mut raw = [0u8; AES_KEY_LEN + HMAC_KEY_LEN];
        rand::rng().fill_bytes(&mut raw);
        Self::from_raw(&raw)
    }

    fn from_raw(raw: &[u8; AES_KEY_LEN + HMAC_KEY_LEN]) -> Self {
        let (a, h) = raw.split_at(AES_KEY_LEN);
        let mut aes = [0u8; AES_KEY_LEN];
        let mut hmac = [0u8; HMAC_KEY_LEN];
        aes.copy_from_slice(a);
        hmac.copy_from_slice(h);
        CrypticleKey { aes, hmac }
    }

    /// Parses a 76-character key string (surrounding whitespace is ignored, as in a key file).
    pub fn from_key_string(s: &str) -> Result<Self, CrypticleError> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(s.trim())
            .map_err(|_| CrypticleError::BadKey)?;
        let raw: [u8; AES_KEY_LEN + HMAC_KEY_LEN] =
            raw.try_into().map_err(|_| CrypticleError::BadKey)?;
        Ok(Self::from_raw(&raw))
    }

    pub fn to_key_string(&self) -> String {
        let mut raw = Vec::with_capacity(AES_KEY_LEN + HMAC_KEY_LEN);
        raw.extend_from_slice(&self.aes);
        raw.extend_from_slice(&self.hmac);
        base64::engine::general_purpose::STANDARD.encode(raw)
    }
}

/// A Crypticle with its replay-guard state (the last `serial` accepted).
#[derive(Debug, Clone)]
pub struct Crypticle {
    key: CrypticleKey,
    last_serial: i64,
}

impl Crypticle {
    pub fn new(key: CrypticleKey) -> Self {
        Crypticle {
            key,
            last_serial: 0,
        }
    }

    pub fn key(&self) -> &CrypticleKey {
        &self.key
    }

    pub fn last_serial(&self) -> i64 {
        self.last_serial
    }

    fn mac(&self, data: &[u8]) -> HmacSha256 {
        // HMAC zero-pads keys shorter than the 64-byte SHA-256 block, so padding here is the
        // same key and avoids the fallible `new_from_slice`.
        let mut block = [0u8; 64];
        block[..HMAC_KEY_LEN].copy_from_slice(&self.key.hmac);
        let mut mac = <HmacSha256 as hmac::digest::KeyInit>::new(&block.into());
        mac.update(data);
        mac
    }

    /// `IV ‖ AES-192-CBC(PKCS#7(data)) ‖ HMAC-SHA256`.
    pub fn encrypt(&self, data: &[u8]) -> Vec<u8> {
        let mut iv = [0u8; BLOCK_LEN];
        rand::rng().fill_bytes(&mut iv);
        self.encrypt_with_iv(data, &iv)
    }

    fn encrypt_with_iv(&self, data: &[u8], iv: &[u8; BLOCK_LEN]) -> Vec<u8> {
        let pad = BLOCK_LEN - data.len() % BLOCK_LEN;
        let mut out = Vec::with_capacity(BLOCK_LEN + data.len() + pad + MAC_LEN);
        out.extend_from_slice(iv);
        out.extend_from_slice(data);
        out.resize(BLOCK_LEN + data.len() + pad, pad as u8);
        let enc = cbc::Encryptor::<Aes192>::new(&self.key.aes.into(), iv.into());
        let body = out.get_mut(BLOCK_LEN..).unwrap_or_default();
        // The body is whole blocks by construction, so this cannot fail.
        let _ = enc.encrypt_padded_mut::<cbc::cipher::block_padding::NoPadding>(body, body.len());
        let tag = self.mac(&out).finalize().into_bytes();
        out.extend_from_slice(&tag);
        out
    }

    /// Checks the MAC in constant time, then decrypts and strips the padding.
    pub fn decrypt(&self, data: &[u8]) -> Result<Vec<u8>, CrypticleError> {
        let bad_len = || CrypticleError::BadLength(data.len());
        if data.len() < BLOCK_LEN + BLOCK_LEN + MAC_LEN {
            return Err(bad_len());
        }
        let (signed, tag) = data.split_at(data.len() - MAC_LEN);
        let expected = self.mac(signed).finalize().into_bytes();
        if !bool::from(expected.as_slice().ct_eq(tag)) {
            return Err(CrypticleError::BadMac);
        }
        let (iv, ct) = signed.split_at(BLOCK_LEN);
        if ct.len() % BLOCK_LEN != 0 {
            return Err(bad_len());
        }
        let iv: [u8; BLOCK_LEN] = iv.try_into().map_err(|_| bad_len())?;
        let mut buf = ct.to_vec();
        let dec = cbc::Decryptor::<Aes192>::new(&self.key.aes.into(), &iv.into());
        let plain_len = dec
            .decrypt_padded_mut::<cbc::cipher::block_padding::NoPadding>(&mut buf)
            .map_err(|_| bad_len())?
            .len();
        let pad = usize::from(*buf.get(plain_len.wrapping_sub(1)).ok_or_else(bad_len)?);
        if pad == 0 || pad > BLOCK_LEN || pad > plain_len {
            return Err(CrypticleError::BadPadding);
        }
        buf.truncate(plain_len - pad);
        Ok(buf)
    }

    /// Salt's `dumps`: encrypt `pickle::` ‖ nonce ‖ msgpack(value).
    pub fn dumps(&self, value: &Value, nonce: Option<&str>) -> Vec<u8> {
        let mut plain = PICKLE_PAD.to_vec();
        if let Some(n) = nonce {
            plain.extend_from_slice(n.as_bytes());
        }
        plain.extend_from_slice(&envelope::encode(value));
        self.encrypt(&plain)
    }

    /// Salt's `loads`: decrypt, check the marker and the expected nonce, decode, and apply the
    /// serial replay guard (a map's `serial` is removed and must exceed the last one seen).
    pub fn loads(&mut self, data: &[u8], nonce: Option<&str>) -> Result<Value, CrypticleError> {
        let plain = self.decrypt(data)?;
        let rest = plain
            .strip_prefix(PICKLE_PAD)
            .ok_or(CrypticleError::NotPickled)?;
        let rest = match nonce {
            Some(n) => {
                let (got, rest) = crate::zmtp::command::split_at_checked(rest, NONCE_LEN)
                    .ok_or(CrypticleError::NonceMismatch)?;
                if got != n.as_bytes() {
                    return Err(CrypticleError::NonceMismatch);
                }
                rest
            }
            None => rest,
        };
        let mut value = envelope::decode(rest)?;
        if let Value::Map(entries) = &mut value {
            if let Some(i) = entries
                .iter()
                .position(|(k, _)| envelope::as_bytes(k) == Some(b"serial"))
            {
                let (_, serial) = entries.remove(i);
                let serial = serial.as_i64().ok_or(CrypticleError::BadSerial)?;
                if serial <= self.last_serial {
                    return Err(CrypticleError::Replay {
                        serial,
                        last: self.last_serial,
                    });
                }
                self.last_serial = serial;
            }
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{map, text};

    fn key() -> CrypticleKey {
        // base64 of bytes 0..56
        CrypticleKey::from_key_string(
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc=",
        )
        .unwrap()
    }

    #[test]
    fn key_string_is_76_chars_and_round_trips() {
        let k = CrypticleKey::generate();
        let s = k.to_key_string();
        assert_eq!(s.len(), KEY_STRING_LEN);
        assert_eq!(CrypticleKey::from_key_string(&s).unwrap(), k);
        assert_eq!(key().aes[23], 23);
        assert_eq!(key().hmac[0], 24);
    }

    #[test]
    fn wrong_size_or_non_base64_key_string_is_rejected() {
        assert_eq!(
            CrypticleKey::from_key_string("AAAA"),
            Err(CrypticleError::BadKey)
        );
        assert_eq!(
            CrypticleKey::from_key_string("!!!"),
            Err(CrypticleError::BadKey)
        );
    }

    #[test]
    fn debug_does_not_leak_the_key() {
        assert_eq!(format!("{:?}", key()), "CrypticleKey(..)");
    }

    #[test]
    fn ciphertext_is_iv_blocks_and_mac() {
        let c = Crypticle::new(key());
        for n in [0usize, 1, 15, 16, 17, 100] {
            let ct = c.encrypt(&vec![b'x'; n]);
            assert_eq!(ct.len(), BLOCK_LEN + (n / 16 + 1) * 16 + MAC_LEN);
            assert_eq!(c.decrypt(&ct).unwrap(), vec![b'x'; n]);
        }
    }

    #[test]
    fn ciphertext_starts_with_the_iv() {
        let c = Crypticle::new(key());
        let ct = c.encrypt_with_iv(b"salt", &[1u8; 16]);
        assert_eq!(c.decrypt(&ct).unwrap(), b"salt");
        assert_eq!(&ct[..16], &[1u8; 16]);
    }

    #[test]
    fn tampered_ciphertext_fails_the_mac_check() {
        let c = Crypticle::new(key());
        let mut ct = c.encrypt(b"hello");
        ct[20] ^= 1;
        assert_eq!(c.decrypt(&ct), Err(CrypticleError::BadMac));
        let other = Crypticle::new(CrypticleKey::generate());
        assert_eq!(other.decrypt(&c.encrypt(b"x")), Err(CrypticleError::BadMac));
    }

    #[test]
    fn short_or_ragged_input_is_an_error_not_a_panic() {
        let c = Crypticle::new(key());
        for n in [0usize, 1, 31, 63] {
            assert!(matches!(
                c.decrypt(&vec![0; n]),
                Err(CrypticleError::BadLength(_))
            ));
        }
    }

    #[test]
    fn dumps_loads_round_trip_with_nonce() {
        let mut c = Crypticle::new(key());
        let v = map(vec![("cmd", text("_return"))]);
        let nonce = "0123456789abcdef0123456789abcdef";
        let ct = c.dumps(&v, Some(nonce));
        assert_eq!(c.loads(&ct, Some(nonce)).unwrap(), v);
        assert_eq!(
            c.loads(&ct, Some("ffffffffffffffffffffffffffffffff")),
            Err(CrypticleError::NonceMismatch)
        );
    }

    #[test]
    fn plaintext_without_pickle_marker_is_reported() {
        let mut c = Crypticle::new(key());
        let ct = c.encrypt(b"\x80");
        assert_eq!(c.loads(&ct, None), Err(CrypticleError::NotPickled));
    }

    #[test]
    fn serial_replay_is_refused_and_serial_is_removed() {
        let mut c = Crypticle::new(key());
        let job = |s: i64| {
            map(vec![
                ("fun", text("test.ping")),
                ("serial", rmpv::Value::from(s)),
            ])
        };
        let first = c.dumps(&job(1), None);
        assert_eq!(
            c.loads(&first, None).unwrap(),
            map(vec![("fun", text("test.ping"))])
        );
        assert_eq!(c.last_serial(), 1);
        assert_eq!(
            c.loads(&first, None),
            Err(CrypticleError::Replay { serial: 1, last: 1 })
        );
        assert!(c.loads(&c.dumps(&job(2), None), None).is_ok());
    }
}
