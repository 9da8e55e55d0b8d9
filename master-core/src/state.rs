//! The master's shared state: its keys, the publish and session AES keys, the replay guard,
//! the job cache and the jobs waiting for returns. Sockets live in [`crate::server`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use saltgate_config::salt_master::SaltMasterConfig;
use saltgate_wire::crypticle::{Crypticle, CrypticleKey};
use saltgate_wire::envelope::{self, text, Value};
use saltgate_wire::rsa::SigAlgo;
use saltgate_wire::transport::{AnyPublishServer, PublishServer, Targets};
use serde_json::{json, Value as Json};
use tokio::sync::mpsc;

use crate::convert;
use crate::jobs::{JidGen, JobCache, JobError};
use crate::keys::{make_dir, write_atomic, KeyStore, MasterKey};
use crate::target::{Target, TargetType};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// One minion's return, as the publish CLI sees it.
#[derive(Debug, Clone)]
pub struct ReturnEvent {
    pub minion: String,
    pub ret: Json,
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

/// A publish request (from the CLI socket or a cluster peer).
#[derive(Debug, Clone)]
pub struct PublishRequest {
    pub tgt: String,
    pub tgt_type: TargetType,
    pub fun: String,
    pub arg: Vec<Json>,
    pub user: String,
}

/// The state every request handler shares.
pub struct Master {
    pub config: SaltMasterConfig,
    /// Minion keys (`pki_dir`, or `cluster_pki_dir` in a cluster).
    pub keys: KeyStore,
    pub master_key: MasterKey,
    /// The publish key ("aes"): shared by all minions, new on every start (the cluster's in a
    /// cluster), rotated by [`crate::rotate`].
    pub aes: crate::rotate::PublishKey,
    pub sessions: Sessions,
    pub nonces: NonceGuard,
    pub jobs: JobCache,
    pub jids: JidGen,
    /// The port minions are told to subscribe to (the bound one).
    pub publish_port: u16,
    pub publisher: Option<AnyPublishServer>,
    /// Cluster membership (`cluster_id` set): the master key and `aes` above are the cluster's.
    pub cluster: Option<crate::cluster::ClusterState>,
    serial: AtomicI64,
    /// Held from a publish's serial to its place in the publisher's queues, so serials reach
    /// every minion in increasing order (a minion drops a serial lower than the last it saw as
    /// a replay: two concurrent publishes cost one of them every return without this).
    publish_order: Mutex<()>,
    waiters: Mutex<HashMap<String, mpsc::UnboundedSender<ReturnEvent>>>,
    /// The origin master of recent jobs: a cluster member looks it up for every return, and
    /// reading it from the job cache each time cost a file read and parse per return.
    origins: Mutex<RecentOrigins>,
    /// The `sig` of an `_auth` reply (X9.31 over the publish key's SHA-256) for the current
    /// publish key: one of the three RSA private operations of every `_auth`, the same for
    /// every minion until the key rotates.
    aes_sig: Mutex<Option<(String, Vec<u8>)>>,
    /// `tok`s that verified, per minion and accepted key.
    pub toks: VerifiedToks,
    /// Refusals by reason (the metrics endpoint's `saltgate_master_refusals_total`).
    pub refusals: crate::metrics::Refusals,
    /// Returns of known jobs the job cache could not take (a full disk): still passed on to
    /// the waiting `publish` and the origin master, logged, and counted here.
    pub returns_not_cached: std::sync::atomic::AtomicU64,
    /// `pub_sig` of `_auth` replies (`master_sign_pubkey`); see [`crate::signing`].
    pub pub_sig: Option<crate::signing::PubSig>,
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

/// Jobs' origin masters, the most recent [`RecentOrigins::CAP`] jobs.
#[derive(Debug, Default)]
struct RecentOrigins {
    /// jid → (the master whose publish created it, whether this master has published it).
    by_jid: HashMap<String, (String, bool)>,
    order: std::collections::VecDeque<String>,
}

impl RecentOrigins {
    const CAP: usize = 4096;

    fn origin(&self, jid: &str) -> Option<&str> {
        self.by_jid.get(jid).map(|(o, _)| o.as_str())
    }

    /// Remembers `jid`'s origin as read from the job cache (a return arrived for it): the job
    /// is not marked published here, so its peer publish, which may come later, still goes out.
    fn learn(&mut self, jid: &str, origin: &str) {
        if !self.by_jid.contains_key(jid) {
            self.by_jid
                .insert(jid.to_string(), (origin.to_string(), false));
            self.push(jid);
        }
    }

    /// Marks `jid` published here; false when it was already (the replay guard of peer
    /// publishes).
    fn publish(&mut self, jid: &str, origin: &str) -> bool {
        match self.by_jid.get_mut(jid) {
            Some((_, true)) => false,
            Some(entry) => {
                *entry = (origin.to_string(), true);
                true
            }
            None => {
                self.by_jid
                    .insert(jid.to_string(), (origin.to_string(), true));
                self.push(jid);
                true
            }
        }
    }

    fn push(&mut self, jid: &str) {
        self.order.push_back(jid.to_string());
        while self.order.len() > Self::CAP {
            if let Some(old) = self.order.pop_front() {
                self.by_jid.remove(&old);
            }
        }
    }
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master")
            .field("id", &self.config.id)
            .finish()
    }
}

impl Master {
    pub fn new(
        config: SaltMasterConfig,
        master_key: MasterKey,
        publish_port: u16,
        publisher: Option<AnyPublishServer>,
    ) -> Self {
        let keys_root = config
            .cluster
            .as_ref()
            .map(|c| c.pki_dir.clone())
            .unwrap_or_else(|| config.pki_dir.clone());
        Master {
            keys: KeyStore::new(keys_root),
            sessions: Sessions::new(&config.cachedir),
            nonces: NonceGuard::new(Duration::from_secs(config.request_window_secs)),
            jobs: JobCache::for_master(&config.cachedir, &config.id),
            jids: JidGen::default(),
            aes: crate::rotate::PublishKey::new(CrypticleKey::generate()),
            master_key,
            publish_port,
            publisher,
            cluster: None,
            // Start from the clock so a restart with the same key never reuses a serial.
            serial: AtomicI64::new(i64::try_from(unix_now()).unwrap_or(0) * 1000),
            publish_order: Mutex::new(()),
            waiters: Mutex::new(HashMap::new()),
            origins: Mutex::default(),
            aes_sig: Mutex::default(),
            toks: VerifiedToks::default(),
            refusals: crate::metrics::Refusals::new(),
            returns_not_cached: Default::default(),
            pub_sig: None,
            config,
        }
    }

    /// Signs the master public key in `_auth` replies (MultiMaster-PKI).
    pub fn with_pub_sig(mut self, pub_sig: Option<crate::signing::PubSig>) -> Self {
        self.pub_sig = pub_sig;
        self
    }

    /// Turns this master into a cluster member: the cluster key and publish key replace its own
    /// towards minions (Salt 3008 does the same).
    pub fn with_cluster(
        mut self,
        cluster_key: MasterKey,
        cluster_aes: CrypticleKey,
        cluster: crate::cluster::ClusterState,
    ) -> Self {
        self.master_key = cluster_key;
        self.aes = crate::rotate::PublishKey::new(cluster_aes);
        self.cluster = Some(cluster);
        self
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

    /// Registers a waiter for `jid`'s returns (dropped by [`Master::unwait`]).
    pub fn wait_returns(&self, jid: &str) -> mpsc::UnboundedReceiver<ReturnEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.waiters).insert(jid.to_string(), tx);
        rx
    }

    pub fn unwait(&self, jid: &str) {
        lock(&self.waiters).remove(jid);
    }

    /// Hands a stored return to whoever waits for the job.
    pub fn notify_return(&self, jid: &str, ev: ReturnEvent) {
        if let Some(tx) = lock(&self.waiters).get(jid) {
            let _ = tx.send(ev);
        }
    }

    /// The job load as published (Salt's field names).
    pub fn job_load(&self, jid: &str, req: &PublishRequest) -> Value {
        envelope::map(vec![
            ("fun", text(&req.fun)),
            (
                "arg",
                Value::Array(req.arg.iter().map(convert::from_json).collect()),
            ),
            ("tgt", text(&req.tgt)),
            ("jid", text(jid)),
            ("ret", text("")),
            ("tgt_type", text(req.tgt_type.as_str())),
            ("user", text(&req.user)),
        ])
    }

    /// Seals `job` and queues it on the publish port; `None` without a publisher. Serial
    /// order and queue order are the same (see `publish_order`).
    fn seal_and_publish(
        &self,
        job: &Value,
    ) -> Result<Option<saltgate_wire::transport::PublishReport>, saltgate_wire::rsa::RsaError> {
        let _order = lock(&self.publish_order);
        let frame = self.seal_publish(job)?;
        Ok(self
            .publisher
            .as_ref()
            .map(|p| p.publish(bytes::Bytes::from(frame), Targets::All)))
    }

    /// Encrypts and signs a job for the publish port (`{"enc":"aes","load","sig_algo","sig"}`);
    /// `serial` is added for the minion's replay guard, as a non-cluster Salt master does.
    /// Publish through [`Master::seal_and_publish`], which keeps serials in order.
    fn seal_publish(&self, job: &Value) -> Result<Vec<u8>, saltgate_wire::rsa::RsaError> {
        let mut job = job.clone();
        // No serial in a cluster: members cannot share a counter (Salt omits it too).
        if let (Value::Map(m), None) = (&mut job, &self.cluster) {
            let serial = self.serial.fetch_add(1, Ordering::Relaxed) + 1;
            m.push((text("serial"), Value::from(serial)));
        }
        let load = Crypticle::new(self.aes.current()).dumps(&envelope::salt_compat(job), None);
        let sig = self.master_key.private.sign(SigAlgo::Pkcs1v15Sha1, &load)?;
        Ok(envelope::PublishEnvelope {
            enc: "aes".into(),
            load,
            sig: Some(sig),
            sig_algo: Some("PKCS1v15-SHA1".into()),
        }
        .encode())
    }

    /// Saves job `jid` (from [`Master::jids`]), publishes it, and returns the expected minions.
    /// Register with [`Master::wait_returns`] first so no return is missed.
    pub fn publish(
        &self,
        jid: &str,
        req: &PublishRequest,
        target: &Target,
    ) -> Result<Vec<String>, String> {
        let expected = self.expected_minions(target);
        let job = self.job_load(jid, req);
        let mut record = convert::to_json(&job);
        record["minions"] = json!(expected);
        record["master_id"] = json!(self.config.id);
        if let Err(e) = self.jobs.save_load(jid, &record) {
            tracing::error!(%jid, error = %e, "job load not saved; returns will not be cached");
        }
        lock(&self.origins).publish(jid, &self.config.id);
        let report = self
            .seal_and_publish(&job)
            .map_err(|e| format!("cannot sign the publish: {e}"))?;
        if let Some(r) = report {
            tracing::info!(%jid, fun = %req.fun, tgt = %req.tgt, expected = expected.len(),
                queued = r.queued, dropped = r.dropped, "published");
        }
        if self.cluster.is_some() {
            crate::cluster::forward(
                self,
                envelope::map(vec![
                    ("kind", text("publish")),
                    ("jid", text(jid)),
                    ("origin", text(&self.config.id)),
                    ("job", job),
                ]),
                None,
            );
        }
        Ok(expected)
    }

    /// A job a cluster peer published: recorded (unless the shared cache has it) and sent to
    /// our own minions. False, and nothing done, when this master already published `jid` (its
    /// own job, a replayed or re-sent peer publish): one of the [`RecentOrigins::CAP`] newest.
    pub fn publish_from_peer(&self, jid: &str, origin: &str, job: &Value) -> bool {
        if !lock(&self.origins).publish(jid, origin) {
            return false;
        }
        if !self.jobs.exists(jid) {
            let mut record = convert::to_json(job);
            record["master_id"] = json!(origin);
            if let Err(e) = self.jobs.save_load(jid, &record) {
                tracing::warn!(%jid, error = %e, "peer job not recorded; its returns will be dropped");
            }
        }
        match self.seal_and_publish(job) {
            Ok(Some(r)) => {
                tracing::info!(%jid, %origin, queued = r.queued, "published for a cluster peer");
            }
            Ok(None) => {}
            Err(e) => tracing::error!(%jid, error = %e, "cannot sign a peer publish"),
        }
        true
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

    /// Whether this master published `jid` (its own job or a peer's), one of the
    /// [`RecentOrigins::CAP`] newest and not yet pruned at `keep_jobs`: such a job is known
    /// even where the job cache could not save it.
    pub fn published_here(&self, jid: &str) -> bool {
        let keep = Duration::from_secs(self.config.keep_jobs_secs);
        crate::jobs::jid_time(jid).is_some()
            && !crate::jobs::expired(jid, keep, SystemTime::now())
            && lock(&self.origins)
                .by_jid
                .get(jid)
                .is_some_and(|(_, published)| *published)
    }

    /// Stores `minion`'s return of `jid` in the job cache. A job neither in the cache nor
    /// [`Master::published_here`] is unknown: `Err`, nothing stored. The return of a known job
    /// that the cache cannot take (a full disk) is logged and counted (`returns_not_cached`)
    /// and is `Ok`: it must still reach the waiting `publish` and the origin master.
    pub fn cache_return(&self, jid: &str, minion: &str, ret: &Json) -> Result<(), JobError> {
        match self.jobs.save_return(jid, minion, ret) {
            Ok(()) => tracing::info!(%minion, %jid, "return stored"),
            Err(e @ (JobError::NotFound(_) | JobError::BadJid(_))) if !self.published_here(jid) => {
                return Err(e)
            }
            Err(e) => {
                self.returns_not_cached.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%minion, %jid, error = %e, "return not stored in the job cache; passed on");
            }
        }
        Ok(())
    }

    /// The master whose publish created `jid`: remembered for recent jobs, else read from the
    /// job cache (the job's load only).
    pub fn job_origin(&self, jid: &str) -> Option<String> {
        if let Some(o) = lock(&self.origins).origin(jid) {
            return Some(o.to_string());
        }
        let load = self.jobs.load(jid).ok()?;
        let origin = load["master_id"].as_str()?.to_string();
        lock(&self.origins).learn(jid, &origin);
        Some(origin)
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

    #[test]
    fn recent_origins_keep_the_newest_jobs_up_to_the_cap() {
        let mut o = RecentOrigins::default();
        for n in 0..RecentOrigins::CAP + 10 {
            o.publish(&format!("{n:020}"), if n % 2 == 0 { "m1" } else { "m2" });
        }
        // Publishing a known job again is refused and changes nothing.
        assert!(!o.publish(&format!("{:020}", RecentOrigins::CAP + 9), "m2"));
        assert_eq!(o.by_jid.len(), RecentOrigins::CAP);
        assert_eq!(o.order.len(), RecentOrigins::CAP);
        assert_eq!(o.origin(&format!("{:020}", 9)), None);
        assert_eq!(o.origin(&format!("{:020}", 10)), Some("m1"));
    }

    /// At 9,000 minions a member got returns for a job before its origin's peer publish
    /// reached it: the origin, learned from the job cache for those returns, made the publish
    /// look like a replay, and the member's 3,000 minions never got the job.
    #[test]
    fn a_jobs_origin_learned_from_a_return_does_not_stop_its_peer_publish() {
        let mut o = RecentOrigins::default();
        o.learn("20261123085539677852", "m1");
        assert_eq!(o.origin("20261123085539677852"), Some("m1"));
        assert!(
            o.publish("20261123085539677852", "m1"),
            "first publish here"
        );
        assert!(!o.publish("20261123085539677852", "m1"), "a replay");
        o.learn("20261123085539677852", "m1");
        assert!(!o.publish("20261123085539677852", "m1"), "still a replay");
        assert_eq!(o.order.len(), 1);
    }
}
