//! Salt's msgpack envelopes: requests, replies and publishes, plus Salt's ext types.
//!
//! Salt packs with `use_bin_type=False`, so binary blobs (ciphertexts, signatures, tokens)
//! travel as str-typed msgpack that is not valid UTF-8; it decodes both str and bin the same
//! way. We follow suit: every accessor here accepts str- and bin-typed bytes alike
//! ([`as_bytes`], [`as_str`], [`get`] matches keys of either type). When encoding we emit text
//! as str and binary as bin, which real Salt accepts (verified against a 3008.5 master);
//! [`salt_compat`] converts to Salt's own all-str form where byte-exactness matters.
//!
//! Decoding is bounded (nesting depth, no trailing bytes) and never panics. Owns no crypto:
//! `load` stays opaque bytes here; see [`crate::crypticle`].

use rmpv::Utf8String;
pub use rmpv::Value;
use thiserror::Error;

/// Deepest nesting we decode. Salt payloads are shallow; this bounds recursion on hostile input.
pub const MAX_DEPTH: usize = 128;

/// msgpack ext type 78: a datetime as ASCII `%Y%m%dT%H:%M:%S.%f`.
pub const EXT_DATETIME: i8 = 78;
/// msgpack ext type 79: a Salt constant, `msgpack((name, value))` packed with bin types.
pub const EXT_CONSTANT: i8 = 79;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EnvelopeError {
    #[error("not valid msgpack: {0}")]
    Decode(String),
    #[error("{0} bytes left after the msgpack document")]
    TrailingBytes(usize),
    #[error("envelope is not a map")]
    NotAMap,
    #[error("envelope has no {0:?}")]
    Missing(&'static str),
    #[error("envelope field {0:?} has the wrong type")]
    WrongType(&'static str),
}

/// Decodes exactly one msgpack document.
pub fn decode(bytes: &[u8]) -> Result<Value, EnvelopeError> {
    let mut rd = bytes;
    let v = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| EnvelopeError::Decode(e.to_string()))?;
    if !rd.is_empty() {
        return Err(EnvelopeError::TrailingBytes(rd.len()));
    }
    Ok(v)
}

/// Encodes a value. Unlike `rmpv`'s encoder, a str-typed value holding invalid UTF-8 stays
/// str-typed (as Python Salt emits `bytes`), so [`salt_compat`] output is byte-exact.
pub fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, v);
    out
}

fn encode_into(out: &mut Vec<u8>, v: &Value) {
    use rmp::encode as e;
    // Writing to a Vec cannot fail; lengths above u32::MAX cannot be represented in msgpack
    // and do not occur in memory we would send.
    match v {
        Value::String(s) => {
            let _ = e::write_str_len(out, s.as_bytes().len() as u32);
            out.extend_from_slice(s.as_bytes());
        }
        Value::Array(items) => {
            let _ = e::write_array_len(out, items.len() as u32);
            for i in items {
                encode_into(out, i);
            }
        }
        Value::Map(entries) => {
            let _ = e::write_map_len(out, entries.len() as u32);
            for (k, v) in entries {
                encode_into(out, k);
                encode_into(out, v);
            }
        }
        other => {
            let _ = rmpv::encode::write_value(out, other);
        }
    }
}

/// A str-typed value.
pub fn text(s: &str) -> Value {
    Value::String(s.into())
}

/// A bin-typed value.
pub fn bin(b: &[u8]) -> Value {
    Value::Binary(b.to_vec())
}

/// The bytes of a str- or bin-typed value (str with invalid UTF-8 included).
pub fn as_bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::String(s) => Some(s.as_bytes()),
        Value::Binary(b) => Some(b),
        _ => None,
    }
}

/// Text of a str- or bin-typed value that is valid UTF-8 (Salt's `loads` does the same).
pub fn as_str(v: &Value) -> Option<&str> {
    as_bytes(v).and_then(|b| std::str::from_utf8(b).ok())
}

/// Looks `key` up in a map whose keys may be str- or bin-typed.
pub fn get<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    match map {
        Value::Map(entries) => entries
            .iter()
            .find(|(k, _)| as_bytes(k) == Some(key.as_bytes()))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// Builds a map with str keys.
pub fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (text(k), v)).collect())
}

/// Converts every bin value to a str-typed raw value, recursively: Python
/// `msgpack.packb(use_bin_type=False)`'s view of the same data.
pub fn salt_compat(v: Value) -> Value {
    match v {
        Value::Binary(b) => raw_str(b),
        Value::Array(a) => Value::Array(a.into_iter().map(salt_compat).collect()),
        Value::Map(m) => Value::Map(
            m.into_iter()
                .map(|(k, v)| (salt_compat(k), salt_compat(v)))
                .collect(),
        ),
        other => other,
    }
}

/// A str-typed value holding arbitrary bytes (what Salt emits for Python `bytes`).
pub fn raw_str(b: Vec<u8>) -> Value {
    match String::from_utf8(b) {
        Ok(s) => Value::String(Utf8String::from(s)),
        Err(e) => {
            // rmpv only builds a non-UTF-8 `Utf8String` while decoding: decode a str header
            // followed by the bytes.
            let b = e.into_bytes();
            let mut buf = Vec::with_capacity(b.len() + 5);
            let _ = rmp::encode::write_str_len(&mut buf, b.len() as u32);
            buf.extend_from_slice(&b);
            let mut rd = buf.as_slice();
            rmpv::decode::read_value(&mut rd).unwrap_or(Value::Binary(b))
        }
    }
}

/// Salt's ext types.
#[derive(Debug, Clone, PartialEq)]
pub enum SaltExt {
    /// Ext 78: the datetime text, e.g. `20261122T03:37:08.835052`.
    Datetime(String),
    /// Ext 79: a constant's `(name, value)`.
    Constant { name: String, value: Value },
}

impl SaltExt {
    /// Interprets an ext value; `None` for other types or malformed bodies.
    pub fn from_value(v: &Value) -> Option<Self> {
        let Value::Ext(ty, data) = v else {
            return None;
        };
        match *ty {
            EXT_DATETIME => std::str::from_utf8(data)
                .ok()
                .map(|s| SaltExt::Datetime(s.to_owned())),
            EXT_CONSTANT => {
                let inner = decode(data).ok()?;
                let Value::Array(items) = inner else {
                    return None;
                };
                let mut it = items.into_iter();
                let name = it.next()?;
                let value = it.next()?;
                Some(SaltExt::Constant {
                    name: as_str(&name)?.to_owned(),
                    value,
                })
            }
            _ => None,
        }
    }

    pub fn to_value(&self) -> Value {
        match self {
            SaltExt::Datetime(s) => Value::Ext(EXT_DATETIME, s.as_bytes().to_vec()),
            SaltExt::Constant { name, value } => Value::Ext(
                EXT_CONSTANT,
                encode(&Value::Array(vec![text(name), value.clone()])),
            ),
        }
    }
}

/// A request on the request port (`ret_port`, 4506).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestEnvelope {
    /// `"clear"` or `"aes"`.
    pub enc: String,
    /// A map for clear requests, Crypticle ciphertext bytes for `aes` ones.
    pub load: Value,
    pub version: Option<i64>,
    /// Minion id (encrypted requests only).
    pub id: Option<String>,
    pub enc_algo: Option<String>,
    pub sig_algo: Option<String>,
    /// Keys we do not model, kept in order.
    pub extra: Vec<(Value, Value)>,
}

impl RequestEnvelope {
    /// A clear request with `version: 3` (what 3008 masters require).
    pub fn clear(load: Value) -> Self {
        RequestEnvelope {
            enc: "clear".into(),
            load,
            version: Some(3),
            id: None,
            enc_algo: None,
            sig_algo: None,
            extra: Vec::new(),
        }
    }

    /// An `aes` request carrying a session-key ciphertext.
    pub fn aes(id: &str, ciphertext: &[u8]) -> Self {
        RequestEnvelope {
            enc: "aes".into(),
            load: bin(ciphertext),
            version: Some(3),
            id: Some(id.to_owned()),
            enc_algo: Some("OAEP-SHA1".into()),
            sig_algo: Some("PKCS1v15-SHA1".into()),
            extra: Vec::new(),
        }
    }

    /// Salt's clear `ping`, the cheap health check: `{"enc":"clear","load":{"cmd":"ping"},"version":3}`.
    pub fn ping() -> Self {
        Self::clear(map(vec![("cmd", text("ping"))]))
    }

    pub fn to_value(&self) -> Value {
        let mut m = vec![
            (text("enc"), text(&self.enc)),
            (text("load"), self.load.clone()),
        ];
        if let Some(v) = self.version {
            m.push((text("version"), Value::from(v)));
        }
        for (k, v) in [
            ("id", &self.id),
            ("enc_algo", &self.enc_algo),
            ("sig_algo", &self.sig_algo),
        ] {
            if let Some(v) = v {
                m.push((text(k), text(v)));
            }
        }
        m.extend(self.extra.iter().cloned());
        Value::Map(m)
    }

    pub fn encode(&self) -> Vec<u8> {
        encode(&self.to_value())
    }

    pub fn from_value(v: Value) -> Result<Self, EnvelopeError> {
        let Value::Map(entries) = v else {
            return Err(EnvelopeError::NotAMap);
        };
        let mut env = RequestEnvelope::clear(Value::Nil);
        env.version = None;
        let (mut enc, mut load) = (None, None);
        for (k, v) in entries {
            let opt_str = |v: &Value, f: &'static str| {
                as_str(v)
                    .map(str::to_owned)
                    .ok_or(EnvelopeError::WrongType(f))
            };
            match as_bytes(&k) {
                Some(b"enc") => enc = Some(opt_str(&v, "enc")?),
                Some(b"load") => load = Some(v),
                Some(b"version") => {
                    env.version = Some(v.as_i64().ok_or(EnvelopeError::WrongType("version"))?)
                }
                Some(b"id") => env.id = Some(opt_str(&v, "id")?),
                Some(b"enc_algo") => env.enc_algo = Some(opt_str(&v, "enc_algo")?),
                Some(b"sig_algo") => env.sig_algo = Some(opt_str(&v, "sig_algo")?),
                _ => env.extra.push((k, v)),
            }
        }
        env.enc = enc.ok_or(EnvelopeError::Missing("enc"))?;
        env.load = load.ok_or(EnvelopeError::Missing("load"))?;
        Ok(env)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        Self::from_value(decode(bytes)?)
    }

    /// The load as bytes (for `aes` requests), whatever its msgpack type.
    pub fn load_bytes(&self) -> Option<&[u8]> {
        as_bytes(&self.load)
    }
}

/// A reply on the request port. Salt answers with whatever the handler returned.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `{"enc": ..., "load": ..., ["sig": ...]}` — e.g. `_auth` replies and `cluster_retry`.
    Envelope {
        enc: String,
        load: Value,
        sig: Option<Vec<u8>>,
    },
    /// Bare text, e.g. `"bad load"` or `"Some exception handling minion payload"`.
    Text(String),
    /// Bare non-UTF-8 bytes: a Crypticle ciphertext (`send` replies to `aes` requests).
    Encrypted(Vec<u8>),
    /// Any other value, e.g. the echoed load of a clear `ping`.
    Plain(Value),
}

impl Reply {
    pub fn from_value(v: Value) -> Self {
        if let Some(b) = as_bytes(&v) {
            return match std::str::from_utf8(b) {
                Ok(s) => Reply::Text(s.to_owned()),
                Err(_) => Reply::Encrypted(b.to_vec()),
            };
        }
        match (get(&v, "enc").and_then(as_str), get(&v, "load")) {
            (Some(enc), Some(load)) => Reply::Envelope {
                enc: enc.to_owned(),
                load: load.clone(),
                sig: get(&v, "sig").and_then(as_bytes).map(<[u8]>::to_vec),
            },
            _ => Reply::Plain(v),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        Ok(Self::from_value(decode(bytes)?))
    }

    /// True for `{"enc":"clear","load":{"ret":False,"cluster_retry":True}}`: a 3008 cluster
    /// member that is not yet a Raft voter ("not ready").
    pub fn is_cluster_retry(&self) -> bool {
        match self {
            Reply::Envelope { load, .. } => {
                matches!(get(load, "cluster_retry"), Some(Value::Boolean(true)))
            }
            _ => false,
        }
    }
}

/// A publish on the publish port (4505): `{"enc":"aes","load":<ciphertext>,["sig_algo","sig"]}`.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishEnvelope {
    pub enc: String,
    pub load: Vec<u8>,
    pub sig: Option<Vec<u8>>,
    pub sig_algo: Option<String>,
}

impl PublishEnvelope {
    pub fn to_value(&self) -> Value {
        let mut m = vec![
            (text("enc"), text(&self.enc)),
            (text("load"), bin(&self.load)),
        ];
        if let Some(a) = &self.sig_algo {
            m.push((text("sig_algo"), text(a)));
        }
        if let Some(s) = &self.sig {
            m.push((text("sig"), bin(s)));
        }
        Value::Map(m)
    }

    pub fn encode(&self) -> Vec<u8> {
        encode(&self.to_value())
    }

    pub fn from_value(v: &Value) -> Result<Self, EnvelopeError> {
        if !v.is_map() {
            return Err(EnvelopeError::NotAMap);
        }
        let field = |k: &'static str| get(v, k).ok_or(EnvelopeError::Missing(k));
        Ok(PublishEnvelope {
            enc: as_str(field("enc")?)
                .ok_or(EnvelopeError::WrongType("enc"))?
                .to_owned(),
            load: as_bytes(field("load")?)
                .ok_or(EnvelopeError::WrongType("load"))?
                .to_vec(),
            sig: get(v, "sig").and_then(as_bytes).map(<[u8]>::to_vec),
            sig_algo: get(v, "sig_algo").and_then(as_str).map(str::to_owned),
        })
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        Self::from_value(&decode(bytes)?)
    }
}

#[cfg(test)]
#[path = "envelope_tests.rs"]
mod tests;
