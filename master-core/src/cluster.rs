//! saltgate's master cluster: masters sharing `cluster_pki_dir` (and, as in Salt's default
//! topology, `cachedir`) serve any minion any of them accepted; publishes are forwarded to the
//! peers, returns to the master whose publish waits.
//!
//! Keys (Salt 3008's layout in `cluster_pki_dir`): `cluster.pem`/`cluster.pub` (the key minions
//! see: auth replies and publishes are signed with it), `.aes` (the shared publish key),
//! `peers/<id>.pub` (each master's own key), and the minion key directories. The first master to
//! start creates them (create-if-absent via `link`, so two starting masters agree).
//!
//! The peer protocol is ours (interop with Salt's cluster is not a goal): TCP on
//! `cluster_pool_port`, frames of a 4-byte big-endian length (≤ 16 MiB) then msgpack
//! `{"peer_id","body","sig"}` where `sig` is PKCS#1 v1.5 (SHA-224) by the sender's own master key
//! over `body`, or `{"peer_id","body","mac"}` (publishes and returns, when `cluster_secret` is
//! set): HMAC-SHA256 under [`peer_mac_key`] over the peer id and `body`, and `body` carries `ts`
//! (±300 s). Forwarded frames travel on one persistent connection per peer
//! ([`crate::peerlink`]); a join on its own connection. Kinds:
//! * `join` — `{peer_id, cluster_id, pub, addr, ts, nonce, proof}`, `proof` =
//!   HMAC-SHA256(cluster_secret, the other fields), checked in constant time; `sig` is checked
//!   with the `pub` inside (possession). A known peer id with a different key is refused. The
//!   answer `join_ok` carries the receiver's `pub`/`addr` and its own proof over the joiner's
//!   nonce, signed; the joiner verifies both. Both sides then store `peers/<id>.pub`.
//! * `publish` — `{jid, job, origin}`; `return` — `{jid, minion, ret}`. Accepted only from a
//!   joined peer (`peers/<peer_id>.pub`, parsed once and cached), with a valid `sig` (checked
//!   against that key) or `mac`. A publish of a job this master already published is not
//!   published again (a replay, or a re-sent frame).
//!
//! Peer ids pass the same checks as minion ids before any path is built.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmac::{Hmac, Mac};
use saltgate_config::salt_master::ClusterConfig;
use saltgate_wire::crypticle::CrypticleKey;
use saltgate_wire::envelope::{self, as_bytes, as_str, get, map, raw_str, text, Value};
use saltgate_wire::rsa::{PrivateKey, PublicKey, KEY_BITS};
use sha2::Sha256;
use thiserror::Error;
use tokio::net::TcpStream;

use crate::id::validate_minion_id;
use crate::keys::{make_dir, same_key, KeyError, MasterKey};
use crate::metrics::{Refusals, Refused};
use crate::peerlink::{Links, PeerStats};
pub use crate::peerwire::MAX_PEER_MESSAGE;
use crate::peerwire::{read_frame_idle, write_frame, PEER_SIG};
use crate::util::unix_now;
/// Join messages (and MAC'd publishes and returns) older or newer than this are refused.
const JOIN_WINDOW_SECS: i64 = 300;
/// What the peer MAC key is derived with (from `cluster_secret`; never the cluster `.aes` key,
/// which every minion receives).
const PEER_MAC_LABEL: &[u8] = b"saltgate cluster peer mac v1";

type HmacSha256 = Hmac<Sha256>;

/// The key of publish/return MACs: HMAC-SHA256(cluster_secret, [`PEER_MAC_LABEL`]); `None`
/// for an empty secret (a MAC would prove nothing: such frames are RSA-signed).
pub fn peer_mac_key(secret: &str) -> Option<[u8; 32]> {
    if secret.is_empty() {
        return None;
    }
    let mut mac = <HmacSha256 as Mac>::new_from_slice(secret.as_bytes()).ok()?;
    mac.update(PEER_MAC_LABEL);
    Some(mac.finalize().into_bytes().into())
}

fn peer_mac(key: &[u8; 32], peer_id: &str, body: &[u8]) -> HmacSha256 {
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key).expect("any key length");
    mac.update(&(peer_id.len() as u64).to_be_bytes());
    mac.update(peer_id.as_bytes());
    mac.update(body);
    mac
}

#[derive(Debug, Error)]
pub enum ClusterError {
    #[error(transparent)]
    Keys(#[from] KeyError),
    #[error("{path}: {message}")]
    Setup { path: PathBuf, message: String },
}

/// Creates `path` with `data` unless it exists (atomic against a concurrent creator);
/// returns the content that won.
fn create_if_absent(path: &Path, data: &[u8], mode: u32) -> Result<Vec<u8>, ClusterError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(existing) = std::fs::read(path) {
        return Ok(existing);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".create.{:016x}.tmp", rand::random::<u64>()));
    let setup = |e: std::io::Error| ClusterError::Setup {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(setup)?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(setup)?;
    drop(f);
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(data.to_vec()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::read(path).map_err(setup)
        }
        Err(e) => Err(setup(e)),
    }
}

/// The cluster key pair and AES key, shared by every member.
pub fn load_cluster_keys(
    cfg: &ClusterConfig,
    own_id: &str,
    own: &MasterKey,
) -> Result<(MasterKey, CrypticleKey), ClusterError> {
    let dir = &cfg.pki_dir;
    make_dir(dir, 0o700)?;
    make_dir(&dir.join("peers"), 0o750)?;
    let bad = |path: PathBuf, message: String| ClusterError::Setup { path, message };
    let pem_path = dir.join("cluster.pem");
    let fresh = if pem_path.exists() {
        Vec::new()
    } else {
        let key =
            PrivateKey::generate(KEY_BITS).map_err(|e| bad(pem_path.clone(), e.to_string()))?;
        key.to_pem()
            .map_err(|e| bad(pem_path.clone(), e.to_string()))?
            .into_bytes()
    };
    let pem = create_if_absent(&pem_path, &fresh, 0o400)?;
    let private = PrivateKey::from_pem(&String::from_utf8_lossy(&pem))
        .map_err(|e| bad(pem_path.clone(), e.to_string()))?;
    let public = private.public_key();
    let pub_text = public
        .to_pem()
        .map_err(|e| bad(pem_path.clone(), e.to_string()))?;
    create_if_absent(&dir.join("cluster.pub"), pub_text.as_bytes(), 0o644)?;
    let aes_path = dir.join(".aes");
    let aes_text = create_if_absent(
        &aes_path,
        CrypticleKey::generate().to_key_string().as_bytes(),
        0o600,
    )?;
    let aes = CrypticleKey::from_key_string(&String::from_utf8_lossy(&aes_text))
        .map_err(|e| bad(aes_path, e.to_string()))?;
    // peers/<own id>.pub: ours, or refuse to start (Salt does the same).
    validate_minion_id(own_id).map_err(KeyError::from)?;
    let own_pub = own
        .public
        .to_pem()
        .map_err(|e| bad(dir.clone(), e.to_string()))?;
    let peer_path = dir.join("peers").join(format!("{own_id}.pub"));
    let stored = create_if_absent(&peer_path, own_pub.as_bytes(), 0o644)?;
    if !same_key(&String::from_utf8_lossy(&stored), &own_pub) {
        return Err(bad(
            peer_path,
            "holds a different key for this master id; another master uses the same id, or \
             remove the file if this master's key was replaced"
                .into(),
        ));
    }
    Ok((
        MasterKey {
            pub_pem: saltgate_wire::pem::clean_key(&pub_text),
            private,
            public,
        },
        aes,
    ))
}

/// A master's cluster membership at run time.
pub struct ClusterState {
    pub config: ClusterConfig,
    pub own_id: String,
    /// This master's own key (peer messages are signed with it).
    pub own_key: MasterKey,
    /// Where peers reach us.
    pub pool_addr: SocketAddr,
    /// Joined peers: id → pool address.
    peers: Mutex<BTreeMap<String, SocketAddr>>,
    /// Stored peer keys, parsed once (`peers/<id>.pub`).
    keys: Mutex<HashMap<String, Arc<PublicKey>>>,
    mac_key: Option<[u8; 32]>,
    links: Links,
    pub stats: Arc<PeerStats>,
}

impl std::fmt::Debug for ClusterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterState")
            .field("own_id", &self.own_id)
            .field("pool_addr", &self.pool_addr)
            .finish()
    }
}

impl ClusterState {
    pub fn new(
        config: ClusterConfig,
        own_id: &str,
        own_key: MasterKey,
        pool_addr: SocketAddr,
    ) -> Self {
        ClusterState {
            mac_key: peer_mac_key(&config.secret),
            links: Links::new(own_id, own_key.private.clone()),
            config,
            own_id: own_id.to_string(),
            own_key,
            pool_addr,
            peers: Mutex::new(BTreeMap::new()),
            keys: Mutex::default(),
            stats: Arc::default(),
        }
    }

    pub fn joined(&self) -> BTreeMap<String, SocketAddr> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn add_peer(&self, id: &str, addr: SocketAddr) {
        let mut p = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if p.insert(id.to_string(), addr) != Some(addr) {
            tracing::info!(peer = %id, %addr, "cluster peer joined");
        }
    }

    fn peer_pub_path(&self, id: &str) -> Result<PathBuf, String> {
        validate_minion_id(id).map_err(|e| format!("unsafe peer id: {e}"))?;
        Ok(self.config.pki_dir.join("peers").join(format!("{id}.pub")))
    }

    /// The stored key of a peer, if it joined (read from disk once, then cached; a peer is
    /// removed by deleting its file and restarting).
    fn peer_pub(&self, id: &str) -> Result<Arc<PublicKey>, String> {
        if let Some(k) = self.keys.lock().unwrap_or_else(|p| p.into_inner()).get(id) {
            return Ok(k.clone());
        }
        let path = self.peer_pub_path(id)?;
        let text =
            std::fs::read_to_string(&path).map_err(|_| format!("peer {id:?} has not joined"))?;
        let key =
            Arc::new(PublicKey::from_pem(&text).map_err(|e| format!("peer key unusable: {e}"))?);
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), key.clone());
        Ok(key)
    }

    /// Stores a peer's key, or refuses when a different one is already stored.
    fn remember_peer_key(&self, id: &str, pub_pem: &str) -> Result<(), String> {
        let path = self.peer_pub_path(id)?;
        let stored =
            create_if_absent(&path, pub_pem.as_bytes(), 0o644).map_err(|e| e.to_string())?;
        if same_key(&String::from_utf8_lossy(&stored), pub_pem) {
            Ok(())
        } else {
            Err(format!(
                "peer {id:?} offers a key different from peers/{id}.pub"
            ))
        }
    }

    fn proof(&self, parts: &[&str]) -> Vec<u8> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.config.secret.as_bytes())
            .unwrap_or_else(|_| <Hmac<Sha256> as Mac>::new_from_slice(b"-").expect("hmac key"));
        mac.update(b"saltgate-cluster-v1");
        for p in parts {
            mac.update(&(p.len() as u64).to_be_bytes());
            mac.update(p.as_bytes());
        }
        mac.finalize().into_bytes().to_vec()
    }

    fn proof_ok(&self, parts: &[&str], got: &[u8]) -> bool {
        let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(self.config.secret.as_bytes()) {
            Ok(m) => m,
            Err(_) => return false,
        };
        mac.update(b"saltgate-cluster-v1");
        for p in parts {
            mac.update(&(p.len() as u64).to_be_bytes());
            mac.update(p.as_bytes());
        }
        // `verify_slice` compares in constant time.
        mac.verify_slice(got).is_ok()
    }

    /// Wraps a publish or return: `{"peer_id","body","mac"}` with `ts` added to the body when
    /// `cluster_secret` is set, else [`ClusterState::seal`] (RSA).
    pub fn seal_forward(&self, body: &Value) -> Vec<u8> {
        let Some(key) = &self.mac_key else {
            return self.seal(body);
        };
        let mut body = body.clone();
        if let Value::Map(m) = &mut body {
            if !m.iter().any(|(k, _)| as_str(k) == Some("ts")) {
                m.push((text("ts"), Value::from(unix_now_i64())));
            }
        }
        let body = envelope::encode(&envelope::salt_compat(body));
        let mac = peer_mac(key, &self.own_id, &body).finalize().into_bytes();
        envelope::encode(&map(vec![
            ("peer_id", text(&self.own_id)),
            ("body", raw_str(body)),
            ("mac", raw_str(mac.to_vec())),
        ]))
    }

    /// Checks a frame's authentication: the peer must have joined (its key is stored), and
    /// the `mac` (with `ts` in the window) or the `sig` must be valid.
    fn authenticate(
        &self,
        peer_id: &str,
        body: &Value,
        body_bytes: &[u8],
        auth: &Auth,
    ) -> Result<(), String> {
        let key = self.peer_pub(peer_id)?;
        match auth {
            Auth::Sig(sig) => {
                if !key.verify(PEER_SIG, body_bytes, sig) {
                    return Err(format!("bad signature from peer {peer_id:?}"));
                }
            }
            Auth::Mac(got) => {
                let Some(k) = &self.mac_key else {
                    return Err(format!(
                        "MAC'd message from {peer_id:?} refused: our cluster_secret is empty"
                    ));
                };
                // `verify_slice` compares in constant time.
                if peer_mac(k, peer_id, body_bytes).verify_slice(got).is_err() {
                    return Err(format!("bad mac from peer {peer_id:?}"));
                }
                let ts = get(body, "ts")
                    .and_then(Value::as_i64)
                    .ok_or(format!("MAC'd message from {peer_id:?} without ts"))?;
                if (unix_now_i64() - ts).abs() > JOIN_WINDOW_SECS {
                    return Err(format!(
                        "message from {peer_id:?}: ts outside the ±{JOIN_WINDOW_SECS} s window"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Wraps a body: `{"peer_id","body","sig"}` signed by our own key.
    pub fn seal(&self, body: &Value) -> Vec<u8> {
        let body = envelope::encode(&envelope::salt_compat(body.clone()));
        let sig = self
            .own_key
            .private
            .sign(PEER_SIG, &body)
            .unwrap_or_default();
        envelope::encode(&map(vec![
            ("peer_id", text(&self.own_id)),
            ("body", raw_str(body)),
            ("sig", raw_str(sig)),
        ]))
    }

    fn join_message(&self, nonce: &str, ts: i64) -> Value {
        let pub_pem = self.own_key.pub_pem.clone();
        let addr = self.pool_addr.to_string();
        let ts_s = ts.to_string();
        let proof = self.proof(&[
            "join",
            &self.config.cluster_id,
            &self.own_id,
            &pub_pem,
            &addr,
            &ts_s,
            nonce,
        ]);
        map(vec![
            ("kind", text("join")),
            ("cluster_id", text(&self.config.cluster_id)),
            ("peer_id", text(&self.own_id)),
            ("pub", text(&pub_pem)),
            ("addr", text(&addr)),
            ("ts", Value::from(ts)),
            ("nonce", text(nonce)),
            ("proof", raw_str(proof)),
        ])
    }
}

fn unix_now_i64() -> i64 {
    i64::try_from(unix_now()).unwrap_or(i64::MAX)
}

/// How a peer message is authenticated.
#[derive(Debug, Clone)]
pub enum Auth {
    /// RSA signature by the sender's own master key.
    Sig(Vec<u8>),
    /// HMAC-SHA256 under [`peer_mac_key`].
    Mac(Vec<u8>),
}

/// One message on a peer connection: `(peer_id, body map, body bytes, auth)`.
type Opened = (String, Value, Vec<u8>, Auth);

/// Decodes a peer frame body without trusting it yet.
pub fn open_message(frame: &[u8]) -> Result<Opened, String> {
    let v = envelope::decode(frame).map_err(|e| format!("not msgpack: {e}"))?;
    let peer_id = get(&v, "peer_id")
        .and_then(as_str)
        .ok_or("no peer_id")?
        .to_string();
    validate_minion_id(&peer_id).map_err(|e| format!("unsafe peer id: {e}"))?;
    let body_bytes = get(&v, "body")
        .and_then(as_bytes)
        .ok_or("no body")?
        .to_vec();
    let auth = match (
        get(&v, "sig").and_then(as_bytes),
        get(&v, "mac").and_then(as_bytes),
    ) {
        (Some(sig), None) => Auth::Sig(sig.to_vec()),
        (None, Some(mac)) => Auth::Mac(mac.to_vec()),
        (None, None) => return Err("no sig and no mac".into()),
        (Some(_), Some(_)) => return Err("both sig and mac".into()),
    };
    let body = envelope::decode(&body_bytes).map_err(|e| format!("body not msgpack: {e}"))?;
    if !body.is_map() {
        return Err("body is not a map".into());
    }
    Ok((peer_id, body, body_bytes, auth))
}

/// The RSA signature of a join or join_ok (never MAC'd).
fn signature(auth: &Auth) -> Result<&[u8], String> {
    match auth {
        Auth::Sig(s) => Ok(s),
        Auth::Mac(_) => Err("a join must be signed, not MAC'd".into()),
    }
}

/// Sends one message to `addr` and returns the reply frame, if the peer sends one.
async fn send(addr: SocketAddr, frame: &[u8], want_reply: bool) -> Result<Option<Vec<u8>>, String> {
    let go = async {
        let mut s = TcpStream::connect(addr).await?;
        write_frame(&mut s, frame).await?;
        if want_reply {
            let reply = read_frame_idle(&mut s).await?;
            Ok::<_, std::io::Error>(Some(
                reply.ok_or(std::io::Error::other("closed without a reply"))?,
            ))
        } else {
            Ok(None)
        }
    };
    tokio::time::timeout(Duration::from_secs(10), go)
        .await
        .map_err(|_| format!("peer {addr} timed out"))?
        .map_err(|e| format!("peer {addr}: {e}"))
}

/// Where a peer's accepted publishes and returns go: the master's publishing and its job book,
/// wired by the composition root ([`crate::state::Master`]), so the cluster never reaches up
/// into them.
pub trait PeerSink: Send + Sync {
    /// Publishes a peer's job to our minions; false, and nothing done, when this master already
    /// published `jid` (a replay or a re-sent frame).
    fn publish_from_peer(&self, jid: &str, origin: &str, job: &Value) -> bool;
    /// Stores a return a peer forwarded and hands it to whoever waits for the job; `Err` when
    /// the job is unknown here.
    fn return_from_peer(
        &self,
        jid: &str,
        minion: &str,
        ret: serde_json::Value,
    ) -> Result<(), String>;
}

/// Handles one peer message; returns the reply frame for a join. A refusal is counted
/// ([`Refused::PeerJoin`] for a join, else [`Refused::PeerMessage`]); the caller logs it.
pub fn handle_message(
    cl: &ClusterState,
    sink: &dyn PeerSink,
    refusals: &Refusals,
    frame: &[u8],
) -> Result<Option<Vec<u8>>, String> {
    let r = handle_message_uncounted(cl, sink, frame);
    if r.is_err() {
        refusals.count(if is_join(frame) {
            Refused::PeerJoin
        } else {
            Refused::PeerMessage
        });
    }
    r
}

/// Whether a frame reads as a join, whatever else is wrong with it (a refusal's class).
fn is_join(frame: &[u8]) -> bool {
    envelope::decode(frame)
        .ok()
        .and_then(|v| get(&v, "body").and_then(as_bytes).map(envelope::decode))
        .and_then(Result::ok)
        .is_some_and(|b| get(&b, "kind").and_then(as_str) == Some("join"))
}

fn handle_message_uncounted(
    cl: &ClusterState,
    sink: &dyn PeerSink,
    frame: &[u8],
) -> Result<Option<Vec<u8>>, String> {
    let (peer_id, body, body_bytes, auth) = open_message(frame)?;
    if peer_id == cl.own_id {
        return Err("message claims to come from ourselves".into());
    }
    let kind = get(&body, "kind").and_then(as_str).unwrap_or("");
    if kind == "join" {
        return handle_join(cl, &peer_id, &body, &body_bytes, signature(&auth)?).map(Some);
    }
    cl.authenticate(&peer_id, &body, &body_bytes, &auth)?;
    match kind {
        "publish" => {
            let jid = get(&body, "jid")
                .and_then(as_str)
                .ok_or("publish without jid")?;
            let origin = get(&body, "origin")
                .and_then(as_str)
                .ok_or("publish without origin")?;
            let job = get(&body, "job").cloned().ok_or("publish without job")?;
            if crate::jobs::jid_time(jid).is_none() {
                return Err(format!("bad jid {jid:?}"));
            }
            if !sink.publish_from_peer(jid, origin, &job) {
                cl.stats
                    .replayed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(%jid, peer = %peer_id, "peer publish of a job already published here: not published again");
            }
            Ok(None)
        }
        "return" => {
            let jid = get(&body, "jid")
                .and_then(as_str)
                .ok_or("return without jid")?;
            let minion = get(&body, "minion")
                .and_then(as_str)
                .ok_or("return without minion")?;
            validate_minion_id(minion).map_err(|e| e.to_string())?;
            let ret = get(&body, "ret")
                .and_then(as_str)
                .ok_or("return without ret")?;
            let ret: serde_json::Value = serde_json::from_str(ret).map_err(|e| e.to_string())?;
            sink.return_from_peer(jid, minion, ret)?;
            Ok(None)
        }
        other => Err(format!("unknown cluster message kind {other:?}")),
    }
}

fn handle_join(
    cl: &ClusterState,
    peer_id: &str,
    body: &Value,
    body_bytes: &[u8],
    sig: &[u8],
) -> Result<Vec<u8>, String> {
    let f = |k: &str| {
        get(body, k)
            .and_then(as_str)
            .ok_or(format!("join without {k}"))
    };
    let (cid, pub_pem, addr, nonce) = (f("cluster_id")?, f("pub")?, f("addr")?, f("nonce")?);
    if f("peer_id")? != peer_id {
        return Err("join peer_id differs from the envelope".into());
    }
    let ts = get(body, "ts")
        .and_then(Value::as_i64)
        .ok_or("join without ts")?;
    let proof = get(body, "proof")
        .and_then(as_bytes)
        .ok_or("join without proof")?;
    if cid != cl.config.cluster_id {
        return Err(format!(
            "join for cluster {cid:?}, we are {:?}",
            cl.config.cluster_id
        ));
    }
    let now = i64::try_from(unix_now()).unwrap_or(i64::MAX);
    if (now - ts).abs() > JOIN_WINDOW_SECS {
        return Err("join timestamp outside the window".into());
    }
    if cl.config.secret.is_empty() && !cl.config.allow_insecure_empty_secret {
        return Err("empty cluster_secret: joins refused".into());
    }
    let ts_s = ts.to_string();
    if !cl.proof_ok(&["join", cid, peer_id, pub_pem, addr, &ts_s, nonce], proof) {
        return Err(format!(
            "join from {peer_id:?}: cluster_secret proof does not match"
        ));
    }
    let key = PublicKey::from_pem(pub_pem).map_err(|e| format!("join key unusable: {e}"))?;
    if !key.verify(PEER_SIG, body_bytes, sig) {
        return Err("join signature does not verify with the offered key".into());
    }
    let addr: SocketAddr = addr
        .parse()
        .map_err(|_| format!("bad peer address {addr:?}"))?;
    cl.remember_peer_key(peer_id, pub_pem)?;
    cl.add_peer(peer_id, addr);
    let my_addr = cl.pool_addr.to_string();
    let my_pub = cl.own_key.pub_pem.clone();
    let proof = cl.proof(&["join_ok", cid, &cl.own_id, &my_pub, &my_addr, nonce]);
    // The other members we know, so the joiner joins them too (and they learn of it).
    let members: Vec<Value> = cl
        .joined()
        .into_iter()
        .filter(|(id, _)| id != peer_id)
        .map(|(_, a)| text(&a.to_string()))
        .collect();
    Ok(cl.seal(&map(vec![
        ("kind", text("join_ok")),
        ("peer_id", text(&cl.own_id)),
        ("pub", text(&my_pub)),
        ("addr", text(&my_addr)),
        ("nonce", text(nonce)),
        ("proof", raw_str(proof)),
        ("members", Value::Array(members)),
    ])))
}

/// A peer's answer to our join.
#[derive(Debug)]
pub struct Joined {
    pub peer_id: String,
    /// The other members that peer knows (`join_ok`'s signed `members`): joined next, so a new
    /// master that names one member becomes a peer of all of them.
    pub members: Vec<SocketAddr>,
}

/// Joins one configured peer: sends `join`, verifies `join_ok`.
pub async fn join(cl: &ClusterState, peer: SocketAddr) -> Result<Joined, String> {
    let nonce = format!("{:032x}", rand::random::<u128>());
    let ts = i64::try_from(unix_now()).unwrap_or(0);
    let frame = cl.seal(&cl.join_message(&nonce, ts));
    let reply = send(peer, &frame, true).await?.ok_or("no join reply")?;
    let (peer_id, body, body_bytes, auth) = open_message(&reply)?;
    let sig = signature(&auth)?;
    let f = |k: &str| {
        get(&body, k)
            .and_then(as_str)
            .ok_or(format!("join_ok without {k}"))
    };
    if f("kind")? != "join_ok" || f("nonce")? != nonce || f("peer_id")? != peer_id {
        return Err("join_ok does not answer our join".into());
    }
    let (pub_pem, addr) = (f("pub")?, f("addr")?);
    let proof = get(&body, "proof")
        .and_then(as_bytes)
        .ok_or("join_ok without proof")?;
    if !cl.proof_ok(
        &[
            "join_ok",
            &cl.config.cluster_id,
            &peer_id,
            pub_pem,
            addr,
            &nonce,
        ],
        proof,
    ) {
        return Err(format!("{peer_id:?} does not know the cluster_secret"));
    }
    let key = PublicKey::from_pem(pub_pem).map_err(|e| e.to_string())?;
    if !key.verify(PEER_SIG, &body_bytes, sig) {
        return Err("join_ok signature does not verify".into());
    }
    let addr: SocketAddr = addr
        .parse()
        .map_err(|_| format!("bad peer address {addr:?}"))?;
    cl.remember_peer_key(&peer_id, pub_pem)?;
    cl.add_peer(&peer_id, addr);
    // Older peers send no `members`; unparsable entries are skipped (each is joined with the
    // full handshake anyway, so a wrong address costs a retry, never trust).
    let members = get(&body, "members")
        .and_then(|v| match v {
            Value::Array(a) => Some(a),
            _ => None,
        })
        .map(|a| {
            a.iter()
                .filter_map(as_str)
                .filter_map(|t| t.parse().ok())
                .filter(|a: &SocketAddr| *a != cl.pool_addr)
                .collect()
        })
        .unwrap_or_default();
    Ok(Joined { peer_id, members })
}

/// Keeps trying to join every configured peer until it answered once, and every member those
/// peers name.
pub async fn join_loop(cl: Arc<ClusterState>, peers: Vec<SocketAddr>) {
    let mut known: std::collections::BTreeSet<SocketAddr> = peers.iter().copied().collect();
    let mut pending = peers;
    while !pending.is_empty() {
        let mut still = Vec::new();
        for p in pending {
            match join(&cl, p).await {
                Ok(j) => {
                    tracing::info!(peer = %j.peer_id, addr = %p, "joined cluster peer");
                    let joined: Vec<SocketAddr> = cl.joined().into_values().collect();
                    for m in j.members {
                        if known.insert(m) && !joined.contains(&m) {
                            tracing::info!(addr = %m, via = %j.peer_id, "joining a member named by a peer");
                            still.push(m);
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(addr = %p, error = %e, "cluster join failed; will retry");
                    still.push(p);
                }
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
}

/// Queues a publish or return for every joined peer (or one) on its persistent link, sealed
/// once ([`ClusterState::seal_forward`]); never waits (see [`crate::peerlink`]).
pub fn forward(cl: &ClusterState, body: Value, only: Option<&str>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("no runtime to forward a cluster message");
        return;
    };
    let frame = bytes::Bytes::from(cl.seal_forward(&body));
    for (id, addr) in cl.joined() {
        if only.is_some_and(|o| o != id) {
            continue;
        }
        cl.links.send(&handle, &cl.stats, &id, addr, frame.clone());
    }
}

/// Resolves configured peers (`host` or `host:port`) to socket addresses.
pub fn peer_addrs(cfg: &ClusterConfig) -> Vec<SocketAddr> {
    use std::net::ToSocketAddrs;
    cfg.peers
        .iter()
        .filter_map(|p| {
            let with_port = if p.parse::<SocketAddr>().is_ok()
                || p.rsplit_once(':')
                    .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
            {
                p.clone()
            } else {
                format!("{p}:{}", cfg.pool_port)
            };
            match with_port.to_socket_addrs() {
                Ok(mut a) => a.next(),
                Err(e) => {
                    tracing::warn!(peer = %p, error = %e, "cluster peer does not resolve");
                    None
                }
            }
        })
        .collect()
}
