//! The request port (`ret_port`, 4506): decode a request, refuse what must be refused, and
//! answer what a stock minion asks, byte-compatible with a Salt 3008 master.
//!
//! [`decode_request`] is pure (the fuzz target drives it): it bounds what it accepts before any
//! state is touched. Clear requests are an allowlist: `_auth` and `ping`; anything else gets
//! Salt's reply to an unknown clear command (`{}`) without touching disk. Encrypted (`aes`,
//! version 3) requests are decrypted with the minion's session key, then the load's `id` must
//! equal the envelope's, `tok` must verify against the accepted key on disk, and the nonce must
//! be fresh. Every refusal is logged with its reason and answered as Salt would (`"bad load"`
//! in most cases).

use std::time::Duration;

use saltgate_wire::crypticle::{Crypticle, CrypticleKey};
use saltgate_wire::envelope::{self, as_bytes, as_str, get, raw_str, salt_compat, text, Value};
use saltgate_wire::rsa::{EncAlgo, PublicKey, SigAlgo};

use crate::auth::{autosign_file_matches, decide, AuthDecision};
use crate::cluster::ClusterState;
use crate::convert;
use crate::id::validate_minion_id;
use crate::jobbook::{JobBook, ReturnEvent};
use crate::keyring::{KeyRing, NonceRefusal};
use crate::metrics::{Refusals, Refused};
use crate::state::Master;
use crate::util::unix_now;
use saltgate_config::salt_master::SaltMasterConfig;

/// Salt 3008's `minimum_auth_version`.
pub const MIN_VERSION: i64 = 3;

/// Clear commands we answer.
pub const CLEAR_ALLOWLIST: &[&str] = &["_auth", "ping"];

/// A decoded request that passed the structural checks.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// `_auth` or `ping`, with its load map.
    Clear { cmd: String, load: Value },
    /// A version-3 encrypted request from minion `id`.
    Aes {
        id: String,
        ciphertext: Vec<u8>,
        enc_algo: EncAlgo,
        sig_algo: SigAlgo,
    },
}

/// Why a request was refused, and Salt's reply to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// Its class: the metric's `reason` label.
    pub kind: Refused,
    pub reason: String,
    pub reply: Value,
}

impl Refusal {
    fn bad_load(kind: Refused, reason: impl Into<String>) -> Self {
        Refusal {
            kind,
            reason: reason.into(),
            reply: text("bad load"),
        }
    }
}

/// Parses one request frame. Never panics; never touches state.
pub fn decode_request(frame: &[u8]) -> Result<Request, Refusal> {
    let v = envelope::decode(frame)
        .map_err(|e| Refusal::bad_load(Refused::Malformed, format!("not msgpack: {e}")))?;
    if !v.is_map() {
        return Err(Refusal::bad_load(
            Refused::Malformed,
            "request is not a map",
        ));
    }
    let enc = get(&v, "enc").and_then(as_str);
    let load = get(&v, "load");
    let (Some(enc), Some(load)) = (enc, load) else {
        return Err(Refusal::bad_load(
            Refused::Malformed,
            "request without enc or load",
        ));
    };
    let version = get(&v, "version").and_then(Value::as_i64).unwrap_or(0);
    if version < MIN_VERSION {
        return Err(Refusal::bad_load(
            Refused::ProtocolVersion,
            format!("protocol version {version} is below the minimum {MIN_VERSION}"),
        ));
    }
    match enc {
        "clear" => {
            if !load.is_map() {
                return Err(Refusal {
                    kind: Refused::Malformed,
                    reason: "clear load is not a map".into(),
                    reply: text("payload and load must be a dict"),
                });
            }
            let cmd = get(load, "cmd").and_then(as_str).unwrap_or("");
            if !CLEAR_ALLOWLIST.contains(&cmd) {
                return Err(Refusal {
                    kind: Refused::ClearCommand,
                    reason: format!("clear command {cmd:?} is not allowed"),
                    reply: Value::Map(Vec::new()),
                });
            }
            Ok(Request::Clear {
                cmd: cmd.to_string(),
                load: load.clone(),
            })
        }
        "aes" => {
            let id = get(&v, "id")
                .and_then(as_str)
                .ok_or_else(|| Refusal::bad_load(Refused::Malformed, "aes request without id"))?;
            validate_minion_id(id)
                .map_err(|e| Refusal::bad_load(Refused::InvalidId, format!("invalid id: {e}")))?;
            let ciphertext = as_bytes(load)
                .ok_or_else(|| Refusal::bad_load(Refused::Malformed, "aes load is not bytes"))?
                .to_vec();
            let algo = |k: &str| get(&v, k).and_then(as_str);
            let malformed = |e: saltgate_wire::rsa::RsaError| {
                Refusal::bad_load(Refused::Malformed, e.to_string())
            };
            let enc_algo =
                EncAlgo::parse(algo("enc_algo").unwrap_or("OAEP-SHA1")).map_err(malformed)?;
            let sig_algo =
                SigAlgo::parse(algo("sig_algo").unwrap_or("PKCS1v15-SHA1")).map_err(malformed)?;
            Ok(Request::Aes {
                id: id.to_string(),
                ciphertext,
                enc_algo,
                sig_algo,
            })
        }
        other => Err(Refusal::bad_load(
            Refused::Malformed,
            format!("unknown enc {other:?}"),
        )),
    }
}

/// Longest an `_auth` may have waited in this process before it is handled: Salt's minion
/// gives up after `auth_timeout` (5 s by default) and asks again on a new connection, so an
/// older one is RSA work for nobody. Skipping it keeps an overloaded master answering the
/// requests still waited for, instead of answering each one just after its minion gave up.
pub const AUTH_MAX_WAIT: Duration = Duration::from_secs(5);
/// The same for every other request (Salt's minion waits 60 s for a `_return` or `_pillar`).
pub const REQUEST_MAX_WAIT: Duration = Duration::from_secs(60);

/// Handles one request frame that has waited `waited` since it was read and returns the encoded
/// reply; `None` (no reply: the minion has given up and retries) when that is over
/// [`AUTH_MAX_WAIT`] for an `_auth` or over [`REQUEST_MAX_WAIT`] for any other request.
pub fn handle(master: &Master, frame: &[u8], waited: Duration) -> Option<Vec<u8>> {
    handle_request(master, frame, waited).map(|h| h.reply)
}

/// What [`handle_request`] made of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// The encoded reply.
    pub reply: Vec<u8>,
    /// The request decrypted with its minion's session key: its sender holds that key (the
    /// request port may then trust its connection with larger frames).
    pub authenticated: bool,
}

/// [`handle`], saying whether the request proved its sender (see [`Handled`]). A clear request
/// over `saltgate_max_clear_load` is refused (Salt echoes a clear `ping`'s whole load: a client
/// that never reads its reply would pin it in memory).
pub fn handle_request(master: &Master, frame: &[u8], waited: Duration) -> Option<Handled> {
    let max_clear = master.config.limits.max_clear_load;
    let (ring, refusals) = (&*master.ring, &*master.refusals);
    let request = match decode_request(frame) {
        Ok(Request::Clear { cmd, .. }) if frame.len() > max_clear => Err(Refusal::bad_load(
            Refused::ClearTooLarge,
            format!(
                "clear {cmd:?} of {} bytes is over saltgate_max_clear_load ({max_clear})",
                frame.len()
            ),
        )),
        other => other,
    };
    let limit = match &request {
        Ok(Request::Clear { cmd, .. }) if cmd != "ping" => AUTH_MAX_WAIT,
        _ => REQUEST_MAX_WAIT,
    };
    if waited > limit {
        return None;
    }
    let mut authenticated = false;
    let reply = match request {
        Err(r) => refused(refusals, "", r),
        Ok(Request::Clear { cmd, load }) => match cmd.as_str() {
            // Salt echoes the load of a clear ping.
            "ping" => load,
            _ => handle_auth(ring, refusals, &master.config, &load),
        },
        Ok(Request::Aes {
            id,
            ciphertext,
            enc_algo,
            sig_algo,
        }) => match handle_aes(master, &id, &ciphertext, enc_algo, sig_algo) {
            Ok(v) => {
                authenticated = true;
                v
            }
            Err(r) => {
                // Past decryption (a stale ts, a replayed nonce, an unknown job), the sender
                // still proved it holds the session key.
                authenticated = !matches!(
                    r.kind,
                    Refused::NoSession | Refused::Undecryptable | Refused::Malformed
                );
                refused(refusals, &id, r)
            }
        },
    };
    Some(Handled {
        reply: envelope::encode(&salt_compat(reply)),
        authenticated,
    })
}

/// Counts and logs a refusal (our own failures as errors); returns its reply.
fn refused(refusals: &Refusals, id: &str, r: Refusal) -> Value {
    refusals.count(r.kind);
    if r.kind == Refused::MasterError {
        tracing::error!(minion = %id, reason = %r.reason, "request failed");
    } else {
        tracing::warn!(minion = %id, reason = %r.reason, "request refused");
    }
    r.reply
}

/// Salt's signed clear reply: `{"enc":"clear","load":msgpack(inner),"sig":PKCS1v15(load)}`.
fn clear_signed(ring: &KeyRing, refusals: &Refusals, inner: Value, sig_algo: SigAlgo) -> Value {
    let load = envelope::encode(&salt_compat(inner));
    match ring.master_key.private.sign(sig_algo, &load) {
        Ok(sig) => envelope::map(vec![
            ("enc", text("clear")),
            ("load", raw_str(load)),
            ("sig", raw_str(sig)),
        ]),
        Err(e) => {
            refusals.count(Refused::MasterError);
            tracing::error!(error = %e, "cannot sign an auth reply");
            text("Some exception handling minion payload")
        }
    }
}

fn auth_ret(
    ring: &KeyRing,
    refusals: &Refusals,
    ret: Value,
    nonce: &str,
    sig_algo: SigAlgo,
) -> Value {
    clear_signed(
        ring,
        refusals,
        envelope::map(vec![("ret", ret), ("nonce", text(nonce))]),
        sig_algo,
    )
}

fn handle_auth(
    ring: &KeyRing,
    refusals: &Refusals,
    config: &SaltMasterConfig,
    load: &Value,
) -> Value {
    let field = |k: &str| get(load, k).and_then(as_str);
    let Some(nonce) = field("nonce") else {
        refusals.count(Refused::Malformed);
        tracing::warn!("_auth without a nonce refused");
        return text("bad load");
    };
    let Ok(enc_algo) = EncAlgo::parse(field("enc_algo").unwrap_or("OAEP-SHA1")) else {
        refusals.count(Refused::Malformed);
        tracing::warn!("_auth with an unknown enc_algo refused");
        return envelope::map(vec![
            ("enc", text("clear")),
            ("load", envelope::map(vec![("ret", text("bad enc algo"))])),
        ]);
    };
    let Ok(sig_algo) = SigAlgo::parse(field("sig_algo").unwrap_or("PKCS1v15-SHA1")) else {
        refusals.count(Refused::Malformed);
        tracing::warn!("_auth with an unknown sig_algo refused");
        return envelope::map(vec![
            ("enc", text("clear")),
            ("load", envelope::map(vec![("ret", text("bad sig algo"))])),
        ]);
    };
    let id = field("id").unwrap_or("");
    if let Err(e) = validate_minion_id(id) {
        refusals.count(Refused::InvalidId);
        tracing::warn!(minion = ?id, reason = %e, "_auth from an invalid id refused");
        return auth_ret(ring, refusals, Value::Boolean(false), nonce, sig_algo);
    }
    let offered = field("pub").unwrap_or("").trim().to_string();
    let minion_pub = match PublicKey::from_pem(&offered) {
        Ok(k) => k,
        Err(e) => {
            refusals.count(Refused::AuthUnusableKey);
            tracing::warn!(minion = %id, reason = %e, "_auth with an unusable public key refused");
            return auth_ret(ring, refusals, Value::Boolean(false), nonce, sig_algo);
        }
    };
    let existing = match ring.keys.fetch(id) {
        Ok(e) => e,
        Err(e) => {
            refusals.count(Refused::MasterError);
            tracing::error!(minion = %id, error = %e, "cannot read the key store");
            return auth_ret(ring, refusals, Value::Boolean(false), nonce, sig_algo);
        }
    };
    let auto_sign = config.auto_accept
        || config
            .autosign_file
            .as_deref()
            .is_some_and(|f| autosign_file_matches(f, id));
    let decision = decide(
        existing.as_ref().map(|(s, k)| (*s, k.as_str())),
        &offered,
        auto_sign,
    );
    let stored = match decision {
        AuthDecision::Pending { store: true } => {
            ring.keys
                .store(id, crate::keys::KeyState::Pending, &offered)
        }
        AuthDecision::Accept { store: true } => {
            ring.keys
                .store(id, crate::keys::KeyState::Accepted, &offered)
        }
        AuthDecision::Denied => match ring.keys.denied(id) {
            Ok(Some(d)) if crate::keys::same_key(&d, &offered) => Ok(()),
            _ => ring.keys.store_denied(id, &offered),
        },
        _ => Ok(()),
    };
    if let Err(e) = stored {
        refusals.count(Refused::MasterError);
        tracing::error!(minion = %id, error = %e, "cannot store the key");
        return auth_ret(ring, refusals, Value::Boolean(false), nonce, sig_algo);
    }
    match decision {
        AuthDecision::Accept { .. } => {}
        AuthDecision::Pending { .. } => {
            tracing::info!(minion = %id, "key pending; accept it with `saltgate-master key accept`");
            return auth_ret(ring, refusals, Value::Boolean(true), nonce, sig_algo);
        }
        AuthDecision::Rejected => {
            refusals.count(Refused::AuthRejected);
            tracing::warn!(minion = %id, "_auth refused: key rejected");
            return auth_ret(ring, refusals, Value::Boolean(false), nonce, sig_algo);
        }
        AuthDecision::Denied => {
            refusals.count(Refused::AuthDenied);
            tracing::error!(minion = %id, "_auth refused: the key differs from the stored one (denied)");
            return auth_ret(ring, refusals, Value::Boolean(false), nonce, sig_algo);
        }
    }
    match accept_reply(ring, id, load, &minion_pub, enc_algo, sig_algo) {
        Ok(inner) => {
            tracing::info!(minion = %id, "authenticated");
            clear_signed(ring, refusals, inner, sig_algo)
        }
        Err(e) => {
            refusals.count(Refused::MasterError);
            tracing::error!(minion = %id, error = %e, "cannot build the auth reply");
            auth_ret(ring, refusals, Value::Boolean(false), nonce, sig_algo)
        }
    }
}

fn accept_reply(
    ring: &KeyRing,
    id: &str,
    load: &Value,
    minion_pub: &PublicKey,
    enc_algo: EncAlgo,
    sig_algo: SigAlgo,
) -> Result<Value, saltgate_wire::rsa::RsaError> {
    let aes = ring.aes.current().to_key_string();
    let session = ring.sessions.get_or_create(id).to_key_string();
    let mut m = vec![
        ("enc", text("pub")),
        ("pub_key", text(&ring.master_key.pub_pem)),
        ("publish_port", Value::from(ring.publish_port)),
    ];
    if let Some(ps) = &ring.pub_sig {
        m.push(("pub_sig", ps.value(&ring.master_key.pub_pem, sig_algo)?));
    }
    if let Some(token) = get(load, "token").and_then(as_bytes) {
        // Proves we hold the private key the minion pinned: decrypt its token, send it back.
        match ring.master_key.private.decrypt(enc_algo, token) {
            Ok(t) => m.push(("token", raw_str(minion_pub.encrypt(enc_algo, &t)?))),
            Err(e) => tracing::warn!(minion = %id, error = %e, "auth token did not decrypt"),
        }
    }
    m.push((
        "aes",
        raw_str(minion_pub.encrypt(enc_algo, aes.as_bytes())?),
    ));
    m.push((
        "session",
        raw_str(minion_pub.encrypt(enc_algo, session.as_bytes())?),
    ));
    m.push(("sig", raw_str(ring.aes_key_sig(&aes)?)));
    m.push(("nonce", get(load, "nonce").cloned().unwrap_or(Value::Nil)));
    Ok(envelope::map(m))
}

/// Removes `key` from a map and returns its value.
fn pop(load: &mut Value, key: &str) -> Option<Value> {
    let Value::Map(m) = load else { return None };
    let i = m
        .iter()
        .position(|(k, _)| as_bytes(k) == Some(key.as_bytes()))?;
    Some(m.remove(i).1)
}

fn handle_aes(
    master: &Master,
    id: &str,
    ciphertext: &[u8],
    enc_algo: EncAlgo,
    sig_algo: SigAlgo,
) -> Result<Value, Refusal> {
    let ring = &*master.ring;
    let session = ring.sessions.get(id).ok_or_else(|| {
        Refusal::bad_load(
            Refused::NoSession,
            "no session key for this id (re-auth needed)",
        )
    })?;
    let mut load = Crypticle::new(session.clone())
        .loads(ciphertext, None)
        .map_err(|e| {
            Refusal::bad_load(
                Refused::Undecryptable,
                format!("does not decrypt with the session key: {e}"),
            )
        })?;
    if !load.is_map() {
        return Err(Refusal {
            kind: Refused::Malformed,
            reason: "decrypted load is not a map".into(),
            reply: text("payload and load must be a dict"),
        });
    }
    let nonce = pop(&mut load, "nonce");
    let nonce = nonce
        .as_ref()
        .and_then(as_str)
        .filter(|n| n.len() == 32 && n.bytes().all(|b| b.is_ascii_alphanumeric()))
        .ok_or_else(|| Refusal::bad_load(Refused::BadNonce, "missing or malformed nonce"))?
        .to_string();
    if get(&load, "id").and_then(as_str) != Some(id) {
        return Err(Refusal::bad_load(
            Refused::IdMismatch,
            "load id differs from the envelope id",
        ));
    }
    let tok = pop(&mut load, "tok");
    let tok = tok
        .as_ref()
        .and_then(as_bytes)
        .ok_or_else(|| Refusal::bad_load(Refused::BadTok, "no tok"))?;
    let accepted = match ring.keys.accepted(id) {
        Ok(Some(k)) => k,
        Ok(None) => {
            return Err(Refusal::bad_load(
                Refused::NotAccepted,
                "no accepted key for this id",
            ))
        }
        // Our own failure (the key store), not the minion's.
        Err(e) => {
            return Err(Refusal::bad_load(
                Refused::MasterError,
                format!("cannot read the key store: {e}"),
            ))
        }
    };
    let pubkey = || {
        PublicKey::from_pem(&accepted).map_err(|e| {
            Refusal::bad_load(
                Refused::MasterError,
                format!("the accepted key on disk does not parse: {e}"),
            )
        })
    };
    // A minion's `tok` is deterministic (X9.31 over "salt"): once it verified against the
    // accepted key, the same pair is known good without the RSA operation (it was a third of
    // the master's CPU per return). The key file is still read per request, so a deleted or
    // changed key refuses at once.
    if let Err(digest) = ring.toks.known_good(id, &accepted, tok) {
        if pubkey()?.public_decrypt_x931(tok).ok().as_deref() != Some(b"salt") {
            return Err(Refusal::bad_load(
                Refused::BadTok,
                "tok does not verify against the accepted key",
            ));
        }
        ring.toks.remember(id, digest);
    }
    let ts = get(&load, "ts").and_then(Value::as_i64);
    ring.nonces
        .check(id, &nonce, ts, unix_now())
        .map_err(|r| match r {
            NonceRefusal::Stale => {
                Refusal::bad_load(Refused::Stale, "ts outside the request window (stale)")
            }
            NonceRefusal::Replay => {
                Refusal::bad_load(Refused::Replayed, "nonce already seen (replay)")
            }
        })?;
    let cmd = get(&load, "cmd").and_then(as_str).unwrap_or("").to_string();
    let session = Crypticle::new(session);
    let send = |v: Value| raw_str(session.dumps(&salt_compat(v), Some(&nonce)));
    Ok(match cmd.as_str() {
        "_pillar" => pillar_reply(
            ring,
            &master.config,
            id,
            &pubkey()?,
            &nonce,
            enc_algo,
            sig_algo,
        )?,
        "_return" => {
            store_return(
                &master.jobs,
                master.cluster.as_deref(),
                &master.refusals,
                id,
                &load,
            );
            send(Value::Nil)
        }
        "_minion_event" | "_register_resources" | "_master_tops" => send(Value::Map(Vec::new())),
        other => match crate::fileserver::handle(
            &master.config.file_roots,
            &master.refusals,
            id,
            other,
            &load,
        ) {
            Some(v) => send(v),
            None if other.starts_with("__") => send(Value::Map(Vec::new())),
            None => {
                tracing::debug!(minion = %id, cmd = %other, "command not available on this master");
                send(Value::Boolean(false))
            }
        },
    })
}

/// Salt's `send_private` for `_pillar`: a fresh key K wrapped to the minion, and the pillar
/// signed together with that wrapped key and the request nonce, encrypted under K.
fn pillar_reply(
    ring: &KeyRing,
    config: &SaltMasterConfig,
    id: &str,
    minion_pub: &PublicKey,
    nonce: &str,
    enc_algo: EncAlgo,
    sig_algo: SigAlgo,
) -> Result<Value, Refusal> {
    let roots = config.pillar_roots.get("base").cloned().unwrap_or_default();
    let pillar = convert::from_json(&crate::pillar::compile(&roots, id));
    let k = CrypticleKey::generate();
    let internal = |e: saltgate_wire::rsa::RsaError| Refusal {
        kind: Refused::MasterError,
        reason: format!("pillar reply: {e}"),
        reply: text("Some exception handling minion payload"),
    };
    let key_blob = minion_pub
        .encrypt(enc_algo, k.to_key_string().as_bytes())
        .map_err(internal)?;
    let tosign = envelope::encode(&salt_compat(envelope::map(vec![
        ("key", raw_str(key_blob.clone())),
        ("pillar", pillar),
        ("nonce", text(nonce)),
    ])));
    let sig = ring
        .master_key
        .private
        .sign(sig_algo, &tosign)
        .map_err(internal)?;
    let signed = envelope::map(vec![("data", raw_str(tosign)), ("sig", raw_str(sig))]);
    Ok(envelope::map(vec![
        ("key", raw_str(key_blob)),
        (
            "pillar",
            raw_str(Crypticle::new(k).dumps(&salt_compat(signed), None)),
        ),
    ]))
}

/// Stores a `_return` in the job book, forwards it to its job's origin master when that is a
/// cluster peer, and hands it to whoever waits for the job.
fn store_return(
    jobs: &JobBook,
    cluster: Option<&ClusterState>,
    refusals: &Refusals,
    id: &str,
    load: &Value,
) {
    let Some(jid) = get(load, "jid").and_then(as_str) else {
        refusals.count(Refused::UnknownJob);
        tracing::warn!(minion = %id, "_return without a jid dropped");
        return;
    };
    let mut jid = jid.to_string();
    if jid == "req" {
        // A minion-initiated job (salt-call with a returner): give it a JID, as Salt does.
        jid = jobs.jids.next();
        let rec = serde_json::json!({
            "fun": get(load, "fun").map(convert::to_json),
            "minions": [id], "tgt": id, "tgt_type": "list", "origin": "minion",
        });
        if let Err(e) = jobs.cache.save_load(&jid, &rec) {
            tracing::warn!(minion = %id, error = %e, "minion-initiated job not saved");
            return;
        }
    }
    let mut ret = serde_json::Map::new();
    for k in ["return", "retcode", "success", "fun", "fun_args", "out"] {
        if let Some(v) = get(load, k) {
            ret.insert(k.to_string(), convert::to_json(v));
        }
    }
    let ret = serde_json::Value::Object(ret);
    if let Err(e) = jobs.cache_return(&jid, id, &ret) {
        refusals.count(Refused::UnknownJob);
        tracing::warn!(minion = %id, %jid, error = %e, "return refused");
        return;
    }
    if let Some(cl) = cluster {
        match jobs.job_origin(&jid) {
            Some(origin) if origin != cl.own_id => crate::cluster::forward(
                cl,
                envelope::map(vec![
                    ("kind", text("return")),
                    ("jid", text(&jid)),
                    ("minion", text(id)),
                    ("ret", text(&ret.to_string())),
                ]),
                Some(&origin),
            ),
            _ => {}
        }
    }
    jobs.notify_return(
        &jid,
        ReturnEvent {
            minion: id.to_string(),
            ret,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::MasterKey;
    use saltgate_config::salt_master::parse_salt_master;
    use saltgate_wire::envelope::{map, RequestEnvelope};
    use std::sync::atomic::Ordering;

    fn master(dir: &std::path::Path) -> Master {
        let pem = std::process::Command::new("openssl")
            .args(["genrsa", "-traditional", "2048"])
            .output()
            .expect("openssl genrsa");
        std::fs::create_dir_all(dir.join("pki")).unwrap();
        std::fs::write(dir.join("pki/master.pem"), pem.stdout).unwrap();
        let d = dir.display();
        let text = format!("id: aged\npki_dir: {d}/pki\ncachedir: {d}/cache\nsock_dir: {d}/sock\n");
        let config = parse_salt_master(&text, None).unwrap().config;
        let key = MasterKey::load_or_create(&dir.join("pki"), "master").unwrap();
        Master::new(config, key, 4505, None)
    }

    fn clear(cmd: &str) -> Vec<u8> {
        RequestEnvelope::clear(map(vec![("cmd", text(cmd)), ("id", text("m1"))])).encode()
    }

    #[test]
    fn an_auth_older_than_the_minions_timeout_is_skipped_other_requests_wait_longer() {
        let dir = tempfile::tempdir().unwrap();
        let m = master(dir.path());
        let just_over = AUTH_MAX_WAIT + Duration::from_millis(1);
        assert!(handle(&m, &clear("_auth"), AUTH_MAX_WAIT).is_some());
        assert_eq!(handle(&m, &clear("_auth"), just_over), None);
        // A clear ping is cheap and a health check: answered up to the general limit.
        assert!(handle(&m, &clear("ping"), just_over).is_some());
        let aes = RequestEnvelope::aes("m1", b"not really encrypted").encode();
        assert!(handle(&m, &aes, just_over).is_some());
        assert_eq!(
            handle(&m, &aes, REQUEST_MAX_WAIT + Duration::from_millis(1)),
            None
        );
        // Undecodable bytes get Salt's error reply at any age below the general limit.
        assert!(handle(&m, b"\xc1", just_over).is_some());
    }

    #[test]
    fn a_return_the_cache_cannot_store_still_reaches_the_waiting_publish_and_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let m = master(dir.path());
        let load = |jid: &str| {
            map(vec![
                ("jid", text(jid)),
                ("return", Value::Boolean(true)),
                ("fun", text("test.ping")),
            ])
        };
        let (ok, broken) = (m.jobs.jids.next(), m.jobs.jids.next());
        for jid in [&ok, &broken] {
            m.jobs.cache.save_load(jid, &serde_json::json!({})).unwrap();
        }
        // A returns log that cannot be opened for writing (as a full or read-only disk).
        std::fs::create_dir(
            m.jobs
                .cache
                .dir()
                .join(&broken)
                .join(m.jobs.cache.log_name()),
        )
        .unwrap();
        let mut rx_ok = m.jobs.wait_returns(&ok);
        let mut rx_broken = m.jobs.wait_returns(&broken);
        store_return(&m.jobs, None, &m.refusals, "m1", &load(&ok));
        store_return(&m.jobs, None, &m.refusals, "m1", &load(&broken));
        assert_eq!(rx_ok.try_recv().unwrap().minion, "m1");
        let ev = rx_broken.try_recv().expect("the waiting publish gets it");
        assert_eq!(ev.ret["return"], serde_json::json!(true));
        assert_eq!(m.jobs.returns_not_cached.load(Ordering::Relaxed), 1);
        assert_eq!(
            m.jobs.cache.show(&ok).unwrap()["returns"]["m1"]["return"],
            serde_json::json!(true)
        );
        // A job this master published whose load the cache could not save is still known.
        let unsaved = m.jobs.jids.next();
        assert!(m.publish.publish_from_peer(
            &unsaved,
            "peer",
            &map(vec![("fun", text("test.ping"))])
        ));
        std::fs::remove_file(m.jobs.cache.dir().join(&unsaved).join("load.json")).unwrap();
        let mut rx_unsaved = m.jobs.wait_returns(&unsaved);
        store_return(&m.jobs, None, &m.refusals, "m1", &load(&unsaved));
        assert_eq!(rx_unsaved.try_recv().unwrap().minion, "m1");
        assert_eq!(m.jobs.returns_not_cached.load(Ordering::Relaxed), 2);
        // A job neither in the cache nor published here is refused, not passed on; so is one
        // published here but older than `keep_jobs` (pruned, not lost).
        let old = crate::jobs::jid_at(
            std::time::SystemTime::now() - Duration::from_secs(m.config.keep_jobs_secs + 60),
        );
        assert!(m
            .publish
            .publish_from_peer(&old, "peer", &map(vec![("fun", text("test.ping"))])));
        std::fs::remove_file(m.jobs.cache.dir().join(&old).join("load.json")).unwrap();
        for (i, jid) in ["20260101000000000000", old.as_str()].iter().enumerate() {
            let mut rx = m.jobs.wait_returns(jid);
            store_return(&m.jobs, None, &m.refusals, "m1", &load(jid));
            assert!(rx.try_recv().is_err(), "{jid}");
            assert_eq!(m.refusals.get(Refused::UnknownJob), i as u64 + 1);
        }
        assert_eq!(m.jobs.returns_not_cached.load(Ordering::Relaxed), 2);
    }
}
