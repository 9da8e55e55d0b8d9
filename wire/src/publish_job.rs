//! The job id (`jid`) of a publish, read with the cluster's AES key.
//!
//! A Salt 3008 cluster master wraps every job it publishes as
//! `msgpack({"enc": "aes", "load": Crypticle.dumps(load)[, "sig_algo", "sig"]})`
//! (`PubServerChannel.wrap_payload`, `salt/channel/server.py`); a cluster master adds no `serial`
//! and no nonce. Every master of the cluster encrypts with the same key (`<cluster_pki_dir>/.aes`)
//! but a fresh IV, so the copies of one job differ byte-wise and only the decrypted `jid` says they
//! are the same job. [`publish_jid`] does that read: one MAC check and one decryption per key tried
//! (the current key first, so one in the normal case), and a borrowed msgpack decode of the load.
//!
//! Nothing here panics on bytes a peer controls; every failure is a [`JobIdError`].

use rmpv::decode::read_value_ref_with_max_depth;
use rmpv::ValueRef;
use thiserror::Error;

use crate::crypticle::{Crypticle, CrypticleError, PICKLE_PAD};
use crate::envelope::MAX_DEPTH;

/// Why a publish's jid could not be read. [`JobIdError::label`] is a short metric label.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum JobIdError {
    /// No key to try.
    #[error("no cluster key loaded")]
    NoKey,
    /// The payload is not a msgpack map with `enc: aes` and a byte-string `load`.
    #[error("payload is not an aes publish envelope")]
    NotAes,
    /// No key authenticated the load (another key, a rotated one, or a damaged message).
    #[error("no cluster key authenticates the load (HMAC mismatch)")]
    BadMac,
    /// Authenticated, but not whole blocks, bad padding, no `pickle::`, or not a msgpack map.
    #[error("the decrypted load is not a Salt job")]
    BadLoad,
    /// A job without a string or integer `jid`.
    #[error("the job has no jid")]
    NoJid,
}

impl JobIdError {
    /// The label used in metrics: `no_key`, `not_aes`, `bad_mac`, `bad_load`, `no_jid`.
    pub fn label(self) -> &'static str {
        match self {
            JobIdError::NoKey => "no_key",
            JobIdError::NotAes => "not_aes",
            JobIdError::BadMac => "bad_mac",
            JobIdError::BadLoad => "bad_load",
            JobIdError::NoJid => "no_jid",
        }
    }

    pub const ALL: [JobIdError; 5] = [
        JobIdError::NoKey,
        JobIdError::NotAes,
        JobIdError::BadMac,
        JobIdError::BadLoad,
        JobIdError::NoJid,
    ];
}

fn decode_one(bytes: &[u8]) -> Option<ValueRef<'_>> {
    let mut rd = bytes;
    let v = read_value_ref_with_max_depth(&mut rd, MAX_DEPTH).ok()?;
    rd.is_empty().then_some(v)
}

fn bytes_of<'v>(v: &'v ValueRef<'_>) -> Option<&'v [u8]> {
    match v {
        ValueRef::String(s) => Some(s.as_bytes()),
        ValueRef::Binary(b) => Some(b),
        _ => None,
    }
}

/// The value under `key` in a map whose keys may be str- or bin-typed (Salt packs both).
fn field<'v, 'a>(map: &'v ValueRef<'a>, key: &str) -> Option<&'v ValueRef<'a>> {
    match map {
        ValueRef::Map(entries) => entries
            .iter()
            .find(|(k, _)| bytes_of(k) == Some(key.as_bytes()))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// The `jid` of the job in `payload` (a publish's last ZMTP frame), trying `keys` in order.
/// A string jid is returned as its bytes, an integer one as its decimal text.
pub fn publish_jid(payload: &[u8], keys: &[&Crypticle]) -> Result<Vec<u8>, JobIdError> {
    let env = decode_one(payload).ok_or(JobIdError::NotAes)?;
    let enc = field(&env, "enc").and_then(bytes_of);
    let load = field(&env, "load").and_then(bytes_of);
    let load = match (enc, load) {
        (Some(b"aes"), Some(load)) => load,
        _ => return Err(JobIdError::NotAes),
    };
    if keys.is_empty() {
        return Err(JobIdError::NoKey);
    }
    let mut plain = None;
    for k in keys {
        match k.decrypt(load) {
            Ok(p) => {
                plain = Some(p);
                break;
            }
            Err(CrypticleError::BadMac) => continue,
            // Too short or ragged is the same for every key: the message, not the key.
            Err(_) => return Err(JobIdError::BadLoad),
        }
    }
    let plain = plain.ok_or(JobIdError::BadMac)?;
    let job = plain
        .strip_prefix(PICKLE_PAD)
        .and_then(decode_one)
        .filter(|v| matches!(v, ValueRef::Map(_)))
        .ok_or(JobIdError::BadLoad)?;
    match field(&job, "jid") {
        Some(ValueRef::Integer(i)) => Ok(i.to_string().into_bytes()),
        Some(v) => bytes_of(v)
            .filter(|b| !b.is_empty())
            .map(<[u8]>::to_vec)
            .ok_or(JobIdError::NoJid),
        None => Err(JobIdError::NoJid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypticle::CrypticleKey;
    use crate::envelope::{bin, encode, map, text, PublishEnvelope};
    use rmpv::Value;

    fn wrap(c: &Crypticle, job: &Value) -> Vec<u8> {
        PublishEnvelope {
            enc: "aes".into(),
            load: c.dumps(job, None),
            sig: None,
            sig_algo: None,
        }
        .encode()
    }

    fn job(jid: Value) -> Value {
        map(vec![
            ("fun", text("test.ping")),
            ("tgt", text("*")),
            ("jid", jid),
        ])
    }

    #[test]
    fn copies_with_different_ivs_give_the_same_jid() {
        let c = Crypticle::new(CrypticleKey::generate());
        let (a, b) = (
            wrap(&c, &job(text("2026112301"))),
            wrap(&c, &job(text("2026112301"))),
        );
        assert_ne!(a, b, "fresh IV per copy");
        assert_eq!(publish_jid(&a, &[&c]).unwrap(), b"2026112301");
        assert_eq!(publish_jid(&b, &[&c]).unwrap(), b"2026112301");
        assert_eq!(publish_jid(&wrap(&c, &job(7.into())), &[&c]).unwrap(), b"7");
    }

    #[test]
    fn the_second_key_is_tried_after_a_mac_failure() {
        let (old, new) = (
            Crypticle::new(CrypticleKey::generate()),
            Crypticle::new(CrypticleKey::generate()),
        );
        let m = wrap(&old, &job(text("j1")));
        assert_eq!(publish_jid(&m, &[&new]), Err(JobIdError::BadMac));
        assert_eq!(publish_jid(&m, &[&new, &old]).unwrap(), b"j1");
        assert_eq!(publish_jid(&m, &[]), Err(JobIdError::NoKey));
    }

    #[test]
    fn every_unreadable_shape_is_an_error_not_a_panic() {
        let c = Crypticle::new(CrypticleKey::generate());
        let env = |enc: &str, load: Value| {
            encode(&Value::Map(vec![
                (text("enc"), text(enc)),
                (text("load"), load),
            ]))
        };
        assert_eq!(publish_jid(b"", &[&c]), Err(JobIdError::NotAes));
        assert_eq!(publish_jid(b"\xc1", &[&c]), Err(JobIdError::NotAes));
        assert_eq!(
            publish_jid(&encode(&text("x")), &[&c]),
            Err(JobIdError::NotAes)
        );
        assert_eq!(
            publish_jid(&env("clear", bin(b"x")), &[&c]),
            Err(JobIdError::NotAes)
        );
        assert_eq!(
            publish_jid(&env("aes", 5.into()), &[&c]),
            Err(JobIdError::NotAes)
        );
        assert_eq!(
            publish_jid(&env("aes", bin(b"short")), &[&c]),
            Err(JobIdError::BadLoad)
        );
        // Authenticated but not pickled, or pickled but not a map.
        let not_pickled = env("aes", bin(&c.encrypt(b"hello")));
        assert_eq!(publish_jid(&not_pickled, &[&c]), Err(JobIdError::BadLoad));
        let list = env("aes", bin(&c.dumps(&Value::Array(vec![]), None)));
        assert_eq!(publish_jid(&list, &[&c]), Err(JobIdError::BadLoad));
        let no_jid = wrap(&c, &map(vec![("fun", text("test.ping"))]));
        assert_eq!(publish_jid(&no_jid, &[&c]), Err(JobIdError::NoJid));
        let empty_jid = wrap(&c, &job(text("")));
        assert_eq!(publish_jid(&empty_jid, &[&c]), Err(JobIdError::NoJid));
        let mut trailing = wrap(&c, &job(text("j")));
        trailing.push(0);
        assert_eq!(publish_jid(&trailing, &[&c]), Err(JobIdError::NotAes));
    }

    #[test]
    fn a_signed_publish_reads_the_same() {
        let c = Crypticle::new(CrypticleKey::generate());
        let m = PublishEnvelope {
            enc: "aes".into(),
            load: c.dumps(&job(text("j9")), None),
            sig: Some(vec![1; 256]),
            sig_algo: Some("PKCS1v15-SHA224".into()),
        }
        .encode();
        assert_eq!(publish_jid(&m, &[&c]).unwrap(), b"j9");
    }
}
