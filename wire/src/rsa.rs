//! RSA as Salt uses it: 2048-bit keys, OAEP (MGF1 and hash SHA-1, or SHA-224), PKCS#1 v1.5
//! signatures (SHA-1 or SHA-224), and OpenSSL's X9.31 "private encrypt / public decrypt".
//!
//! Keys read and write Salt's exact PEM text (PKCS#1 private, SPKI public; see [`crate::pem`]).
//!
//! **Where each operation runs.** Decryption (OAEP), signatures (PKCS#1 v1.5) and encryption
//! (OAEP) go through the system's OpenSSL (libcrypto 3): its RSA is constant time and blinded,
//! and a private-key operation costs 0.30–0.34 ms there against 2.2–2.6 ms in the `rsa` crate
//! (2048 bits, this project's 2-core VM, `benches/rsa.rs`): two of them are most of a master's
//! CPU per `_auth`. The
//! `rsa` crate still reads and writes keys, generates them, and does OpenSSL's X9.31 "private
//! encrypt" (blinded; a minion's `tok` and the master's `aes` signature, once per key), and
//! public operations use the Montgomery routine in `rsa_public.rs`.
//!
//! **Timing side channel (RUSTSEC-2023-0071, "Marvin").** The `rsa` crate's private-key
//! operations are not constant time; none of them decrypts attacker-chosen bytes any more (the
//! master's decryption of a minion's `_auth` `token` is OpenSSL's). docs/wire.md has the rest.

use std::sync::OnceLock;

use ::rsa::hazmat::{rsa_decrypt_and_check, rsa_encrypt};
use ::rsa::pkcs1::{DecodeRsaPrivateKey, DecodeRsaPublicKey, EncodeRsaPrivateKey};
use ::rsa::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePublicKey};
use ::rsa::traits::PublicKeyParts;
use ::rsa::{BigUint, Pkcs1v15Sign, RsaPrivateKey, RsaPublicKey};
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private, Public};
use rand_core_06::OsRng;
use sha1::{Digest, Sha1};
use sha2::Sha224;
use thiserror::Error;

use crate::pem::{self, PemError};

/// Salt's key size.
pub const KEY_BITS: usize = 2048;

#[derive(Debug, Error)]
pub enum RsaError {
    #[error(transparent)]
    Pem(#[from] PemError),
    #[error("unsupported PEM label {0:?}")]
    UnsupportedLabel(String),
    #[error("bad key: {0}")]
    BadKey(String),
    #[error("RSA operation failed: {0}")]
    Rsa(#[from] ::rsa::Error),
    #[error("RSA operation failed (OpenSSL): {0}")]
    OpenSsl(#[from] openssl::error::ErrorStack),
    #[error("message of {len} bytes does not fit a {key_bytes}-byte key")]
    TooLong { len: usize, key_bytes: usize },
    #[error("X9.31 padding check failed")]
    BadX931Padding,
    #[error("unknown algorithm {0:?}")]
    UnknownAlgorithm(String),
}

/// Salt's `enc_algo` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EncAlgo {
    #[default]
    OaepSha1,
    OaepSha224,
}

impl EncAlgo {
    pub fn parse(s: &str) -> Result<Self, RsaError> {
        match s {
            "OAEP-SHA1" => Ok(EncAlgo::OaepSha1),
            "OAEP-SHA224" => Ok(EncAlgo::OaepSha224),
            _ => Err(RsaError::UnknownAlgorithm(s.to_owned())),
        }
    }

    /// OAEP's hash, which is MGF1's too (as Salt's `cryptography` calls use it).
    fn digest(self) -> MessageDigest {
        match self {
            EncAlgo::OaepSha1 => MessageDigest::sha1(),
            EncAlgo::OaepSha224 => MessageDigest::sha224(),
        }
    }
}

/// Salt's `sig_algo` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SigAlgo {
    #[default]
    Pkcs1v15Sha1,
    Pkcs1v15Sha224,
}

impl SigAlgo {
    pub fn parse(s: &str) -> Result<Self, RsaError> {
        match s {
            "PKCS1v15-SHA1" => Ok(SigAlgo::Pkcs1v15Sha1),
            "PKCS1v15-SHA224" => Ok(SigAlgo::Pkcs1v15Sha224),
            _ => Err(RsaError::UnknownAlgorithm(s.to_owned())),
        }
    }

    fn scheme_and_digest(self, msg: &[u8]) -> (Pkcs1v15Sign, Vec<u8>) {
        match self {
            SigAlgo::Pkcs1v15Sha1 => (Pkcs1v15Sign::new::<Sha1>(), Sha1::digest(msg).to_vec()),
            SigAlgo::Pkcs1v15Sha224 => {
                (Pkcs1v15Sign::new::<Sha224>(), Sha224::digest(msg).to_vec())
            }
        }
    }
}

/// An RSA private key: the `rsa` crate's (key files, X9.31) and the same key in OpenSSL
/// (decryption, signatures).
#[derive(Clone)]
pub struct PrivateKey(RsaPrivateKey, PKey<Private>);

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrivateKey(..)")
    }
}

/// An RSA public key; its OpenSSL form is made on the first encryption.
#[derive(Clone)]
pub struct PublicKey(RsaPublicKey, OnceLock<PKey<Public>>);

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PublicKey").field(&self.0).finish()
    }
}

impl PartialEq for PublicKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for PublicKey {}

impl From<RsaPublicKey> for PublicKey {
    fn from(k: RsaPublicKey) -> Self {
        PublicKey(k, OnceLock::new())
    }
}

/// OAEP decryption in OpenSSL, `algo`'s hash for OAEP and MGF1 (as Salt's `cryptography` calls).
fn oaep_decrypt(key: &PKey<Private>, algo: EncAlgo, ct: &[u8]) -> Result<Vec<u8>, RsaError> {
    let mut d = openssl::encrypt::Decrypter::new(key)?;
    d.set_rsa_padding(openssl::rsa::Padding::PKCS1_OAEP)?;
    d.set_rsa_oaep_md(algo.digest())?;
    d.set_rsa_mgf1_md(algo.digest())?;
    let mut out = vec![0u8; d.decrypt_len(ct)?];
    let n = d.decrypt(ct, &mut out)?;
    out.truncate(n);
    Ok(out)
}

/// OAEP encryption in OpenSSL (a fresh random seed), as [`oaep_decrypt`].
fn oaep_encrypt(key: &PKey<Public>, algo: EncAlgo, msg: &[u8]) -> Result<Vec<u8>, RsaError> {
    let mut e = openssl::encrypt::Encrypter::new(key)?;
    e.set_rsa_padding(openssl::rsa::Padding::PKCS1_OAEP)?;
    e.set_rsa_oaep_md(algo.digest())?;
    e.set_rsa_mgf1_md(algo.digest())?;
    let mut out = vec![0u8; e.encrypt_len(msg)?];
    let n = e.encrypt(msg, &mut out)?;
    out.truncate(n);
    Ok(out)
}

impl PrivateKey {
    /// The same key in OpenSSL beside the `rsa` crate's.
    fn new(key: RsaPrivateKey) -> Result<Self, RsaError> {
        let der = key
            .to_pkcs1_der()
            .map_err(|e| RsaError::BadKey(e.to_string()))?;
        let ossl = PKey::from_rsa(openssl::rsa::Rsa::private_key_from_der(der.as_bytes())?)?;
        Ok(PrivateKey(key, ossl))
    }

    /// A new key with e = 65537 (Salt: `keysize` 2048).
    pub fn generate(bits: usize) -> Result<Self, RsaError> {
        PrivateKey::new(RsaPrivateKey::new(&mut OsRng, bits)?)
    }

    /// Reads `BEGIN RSA PRIVATE KEY` (PKCS#1) or unencrypted `BEGIN PRIVATE KEY` (PKCS#8).
    pub fn from_pem(text: &str) -> Result<Self, RsaError> {
        let (label, der) = pem::decode(text)?;
        let key =
            match label.as_str() {
                "RSA PRIVATE KEY" => RsaPrivateKey::from_pkcs1_der(&der)
                    .map_err(|e| RsaError::BadKey(e.to_string()))?,
                "PRIVATE KEY" => RsaPrivateKey::from_pkcs8_der(&der)
                    .map_err(|e| RsaError::BadKey(e.to_string()))?,
                _ => return Err(RsaError::UnsupportedLabel(label)),
            };
        PrivateKey::new(key)
    }

    /// Salt's private key file text: PKCS#1, 64 columns, trailing newline.
    pub fn to_pem(&self) -> Result<String, RsaError> {
        let der = self
            .0
            .to_pkcs1_der()
            .map_err(|e| RsaError::BadKey(e.to_string()))?;
        Ok(pem::encode("RSA PRIVATE KEY", der.as_bytes()))
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey::from(self.0.to_public_key())
    }

    /// Modulus size in bytes.
    pub fn size(&self) -> usize {
        self.0.size()
    }

    /// OAEP decryption (OpenSSL: constant time, blinded).
    pub fn decrypt(&self, algo: EncAlgo, ciphertext: &[u8]) -> Result<Vec<u8>, RsaError> {
        oaep_decrypt(&self.1, algo, ciphertext)
    }

    /// PKCS#1 v1.5 signature over `msg` (hashed here; OpenSSL, blinded). OpenSSL signs the
    /// `DigestInfo` (the hash's prefix and the hash) as given, with type-1 padding and no digest
    /// of its own: the same bytes as a SHA-1 or SHA-224 signature, which a system crypto policy
    /// may refuse to make (RHEL 9's default policy refuses SHA-1 signatures; Salt's default
    /// `sig_algo` is SHA-1, and publishes are signed with it).
    pub fn sign(&self, algo: SigAlgo, msg: &[u8]) -> Result<Vec<u8>, RsaError> {
        let (scheme, digest) = algo.scheme_and_digest(msg);
        let mut info = scheme.prefix.to_vec();
        info.extend_from_slice(&digest);
        let mut ctx = openssl::pkey_ctx::PkeyCtx::new(&self.1)?;
        ctx.sign_init()?;
        ctx.set_rsa_padding(openssl::rsa::Padding::PKCS1)?;
        let mut sig = Vec::with_capacity(self.size());
        ctx.sign_to_vec(&info, &mut sig)?;
        Ok(sig)
    }

    /// OpenSSL `RSA_private_encrypt(RSA_X931_PADDING)`, as Salt's `PrivateKey.encrypt` (used for
    /// the `tok` token and the `sig` of the AES key). Blinded.
    pub fn private_encrypt_x931(&self, msg: &[u8]) -> Result<Vec<u8>, RsaError> {
        let k = self.0.size();
        let em = x931_pad(msg, k)?;
        let s = rsa_decrypt_and_check(&self.0, Some(&mut OsRng), &BigUint::from_bytes_be(&em))?;
        let n = self.0.n();
        let alt = n - &s;
        let s = if alt < s { alt } else { s };
        to_fixed(&s, k)
    }
}

impl PublicKey {
    /// Reads `BEGIN PUBLIC KEY` (SPKI) or `BEGIN RSA PUBLIC KEY` (PKCS#1).
    pub fn from_pem(text: &str) -> Result<Self, RsaError> {
        let (label, der) = pem::decode(text)?;
        let key = match label.as_str() {
            "PUBLIC KEY" => RsaPublicKey::from_public_key_der(&der)
                .map_err(|e| RsaError::BadKey(e.to_string()))?,
            "RSA PUBLIC KEY" => {
                RsaPublicKey::from_pkcs1_der(&der).map_err(|e| RsaError::BadKey(e.to_string()))?
            }
            _ => return Err(RsaError::UnsupportedLabel(label)),
        };
        Ok(PublicKey::from(key))
    }

    /// Salt's public key file text: SPKI, 64 columns, trailing newline.
    pub fn to_pem(&self) -> Result<String, RsaError> {
        let der = self
            .0
            .to_public_key_der()
            .map_err(|e| RsaError::BadKey(e.to_string()))?;
        Ok(pem::encode("PUBLIC KEY", der.as_bytes()))
    }

    /// The text Salt sends and compares (`clean_key` of the file): no trailing newline.
    pub fn to_clean_pem(&self) -> Result<String, RsaError> {
        Ok(pem::clean_key(&self.to_pem()?))
    }

    pub fn size(&self) -> usize {
        self.0.size()
    }

    /// OAEP encryption with a fresh random seed (OpenSSL).
    pub fn encrypt(&self, algo: EncAlgo, msg: &[u8]) -> Result<Vec<u8>, RsaError> {
        let key = match self.1.get() {
            Some(k) => k,
            None => {
                // From n and e: OpenSSL 3's DER decoder costs 100 µs a key, this 10.
                let bn = |x: &BigUint| openssl::bn::BigNum::from_slice(&x.to_bytes_be());
                let rsa =
                    openssl::rsa::Rsa::from_public_components(bn(self.0.n())?, bn(self.0.e())?)?;
                let k = PKey::from_rsa(rsa)?;
                self.1.get_or_init(|| k)
            }
        };
        oaep_encrypt(key, algo, msg)
    }

    /// Verifies a PKCS#1 v1.5 signature over `msg`: `sig^e mod n` (the Montgomery routine,
    /// ~4× cheaper than the `rsa` crate's for e = 65537) compared with the expected
    /// `00 01 FF… 00 DigestInfo hash` block. Every minion verifies every publish this way.
    pub fn verify(&self, algo: SigAlgo, msg: &[u8], sig: &[u8]) -> bool {
        let (scheme, digest) = algo.scheme_and_digest(msg);
        let k = self.0.size();
        let t_len = scheme.prefix.len() + digest.len();
        // RFC 8017 §9.2: at least 8 bytes of 0xFF padding.
        if sig.len() != k || k < t_len + 11 {
            return false;
        }
        let s = BigUint::from_bytes_be(sig);
        if &s >= self.0.n() {
            return false;
        }
        let em = match montgomery::public_op(&s, self.0.e(), self.0.n()) {
            Some(m) => m,
            None => return self.0.verify(scheme, &digest, sig).is_ok(),
        };
        let Ok(em) = to_fixed(&em, k) else {
            return false;
        };
        let mut want = Vec::with_capacity(k);
        want.extend_from_slice(&[0x00, 0x01]);
        want.resize(k - t_len - 1, 0xFF);
        want.push(0x00);
        want.extend_from_slice(&scheme.prefix);
        want.extend_from_slice(&digest);
        em == want
    }

    /// OpenSSL `RSA_public_decrypt(RSA_X931_PADDING)`, as Salt's `PublicKey.decrypt`.
    pub fn public_decrypt_x931(&self, sig: &[u8]) -> Result<Vec<u8>, RsaError> {
        let k = self.0.size();
        if sig.len() != k {
            return Err(RsaError::BadX931Padding);
        }
        let s = BigUint::from_bytes_be(sig);
        if &s >= self.0.n() {
            return Err(RsaError::BadX931Padding);
        }
        let r = match montgomery::public_op(&s, self.0.e(), self.0.n()) {
            Some(r) => r,
            None => rsa_encrypt(&self.0, &s)?,
        };
        let twelve = BigUint::from(12u8);
        let sixteen = BigUint::from(16u8);
        let r = if &r % &sixteen != twelve {
            self.0.n() - &r
        } else {
            r
        };
        x931_unpad(&to_fixed(&r, k)?)
    }
}

/// `0x6B, 0xBB…, 0xBA, m, 0xCC`, or `0x6A, m, 0xCC` when only two bytes are free.
fn x931_pad(msg: &[u8], k: usize) -> Result<Vec<u8>, RsaError> {
    let too_long = || RsaError::TooLong {
        len: msg.len(),
        key_bytes: k,
    };
    let j = k.checked_sub(msg.len() + 2).ok_or_else(too_long)?;
    let mut em = Vec::with_capacity(k);
    if j == 0 {
        em.push(0x6A);
    } else {
        em.push(0x6B);
        em.resize(j, 0xBB);
        em.push(0xBA);
    }
    em.extend_from_slice(msg);
    em.push(0xCC);
    Ok(em)
}

fn x931_unpad(em: &[u8]) -> Result<Vec<u8>, RsaError> {
    let bad = || RsaError::BadX931Padding;
    let (&first, rest) = em.split_first().ok_or_else(bad)?;
    let (&last, body) = rest.split_last().ok_or_else(bad)?;
    if last != 0xCC {
        return Err(bad());
    }
    match first {
        0x6A => Ok(body.to_vec()),
        0x6B => {
            let pad = body.iter().take_while(|&&b| b == 0xBB).count();
            match body.get(pad..).and_then(<[u8]>::split_first) {
                Some((0xBA, m)) => Ok(m.to_vec()),
                _ => Err(bad()),
            }
        }
        _ => Err(bad()),
    }
}

fn to_fixed(n: &BigUint, k: usize) -> Result<Vec<u8>, RsaError> {
    let b = n.to_bytes_be();
    let pad = k.checked_sub(b.len()).ok_or(RsaError::BadX931Padding)?;
    let mut out = vec![0u8; pad];
    out.extend_from_slice(&b);
    Ok(out)
}

#[path = "rsa_public.rs"]
mod montgomery;

#[cfg(test)]
#[path = "rsa_tests.rs"]
mod tests;
