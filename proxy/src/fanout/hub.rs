//! The hub: the minion sessions of the publish listener in fan-out mode and what relays to
//! them (subscriptions, bounded queues, the dedup, the upstreams' states for the admin view).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use saltgate_wire::publish_job::JobIdError;
use saltgate_wire::transport::zeromq::frame::encode_message;
use saltgate_wire::transport::zeromq::{Heartbeat, TopicLimits, TopicSet};
use tokio_util::sync::CancellationToken;

use super::dedup;
pub use super::metrics::FanoutMetrics;
use super::replay::ReplayLog;

/// Settings of a hub.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// PINGs to minions and the silence limit (a Salt 3008 master: 10 s / 30 s). Also used on
    /// the upstream connections, so a master that hangs is dropped after the timeout.
    pub heartbeat: Option<Heartbeat>,
    /// How often the set of UP masters is compared with the upstreams.
    pub watch_interval: Duration,
    /// Wait before re-dialling a master whose upstream failed; doubles per failure up to 2 s.
    pub reconnect: Duration,
    pub handshake_timeout: Duration,
    pub max_frame_size: usize,
}

impl Default for HubOptions {
    fn default() -> Self {
        HubOptions {
            heartbeat: Some(Heartbeat::salt_master()),
            watch_interval: Duration::from_millis(250),
            reconnect: Duration::from_millis(100),
            handshake_timeout: Duration::from_secs(10),
            max_frame_size: saltgate_wire::transport::zeromq::DEFAULT_MAX_FRAME_SIZE,
        }
    }
}

#[cfg(test)]
use super::queue::Empty;
#[cfg(test)]
use super::queue::Queued;
use super::queue::{Refused, SessionQueue};

/// One minion session as the fan-out sees it.
pub(crate) struct Slot {
    pub(crate) id: u64,
    /// The minion's address (the admin view lists sessions that drop).
    pub(crate) peer: SocketAddr,
    /// Who it is for replay when it opened: the ZMTP `Identity` of its READY, or the one
    /// minion id presence knew at its address (empty: neither).
    pub(crate) identity: Bytes,
    /// The id presence learned at its address after it opened (`late.rs`).
    pub(crate) late_identity: OnceLock<Bytes>,
    pub(crate) topics: Mutex<TopicSet>,
    /// What the hub gave it and its session has not written yet (`hwm` at most).
    pub(crate) queue: SessionQueue,
    pub(crate) dropped: AtomicU64,
    /// The sequence number of the last message written to the minion (replay's "delivered").
    pub(crate) delivered: AtomicU64,
}

impl Slot {
    /// Who it is for replay (empty: unknown).
    pub(crate) fn identity(&self) -> &Bytes {
        self.late_identity.get().unwrap_or(&self.identity)
    }

    /// Sets the identity learned after the session opened (once).
    pub(crate) fn set_identity(&self, id: Bytes) {
        let _ = self.late_identity.set(id);
    }

    pub(crate) fn topics(&self) -> std::sync::MutexGuard<'_, TopicSet> {
        self.topics.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What one [`Hub::publish`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FanReport {
    pub queued: usize,
    pub dropped: usize,
    /// A later copy of a job already forwarded: it went nowhere.
    pub duplicate: bool,
    /// Dedup is on but the job id could not be read: forwarded as is.
    pub unreadable: Option<JobIdError>,
}

/// What every hub of the process shares, owned by the control plane: the `saltgate_fanout_*`
/// handles (registered once per process) and which hub serves the publish listener now (set
/// when a hub starts; a reload to `fanout` starts a new one). The admin API reaches the hub
/// through the control plane, which holds this.
#[derive(Clone)]
pub struct HubHandles {
    pub metrics: Arc<FanoutMetrics>,
    current: Arc<Mutex<std::sync::Weak<Hub>>>,
}

impl HubHandles {
    pub fn new(registry: &prometheus::Registry) -> Self {
        HubHandles {
            metrics: Arc::new(FanoutMetrics::new(registry)),
            current: Default::default(),
        }
    }

    /// Records the hub that serves the publish listener now.
    pub(crate) fn set_current(&self, hub: &Arc<Hub>) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Arc::downgrade(hub);
    }

    /// The hub serving the publish listener, if one has started and still runs.
    pub(crate) fn current(&self) -> Option<Arc<Hub>> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .upgrade()
    }
}

/// The reading end of a session's queue, held by its session: dropping it closes the queue.
pub(crate) struct Inbox(Arc<Slot>);

impl Inbox {
    /// The session's slot (its queue: [`SessionQueue::poll_pop`], which says `None` once the
    /// hub stops, [`Hub::stop_sessions`]).
    pub(crate) fn slot(&self) -> &Arc<Slot> {
        &self.0
    }

    /// The next message if one waits.
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Result<Queued, Empty> {
        self.0.queue.try_pop()
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.0.queue.close();
    }
}

/// The state shared by the hub's minion sessions and upstreams.
pub(crate) struct Hub {
    pub(crate) opts: HubOptions,
    /// The sessions by id. A lock, not a list swapped whole on each attach and detach (that
    /// cost O(sessions) per minion that connects: 10,000 minions connecting cloned 50 million
    /// `Arc`s); a job's fan-out holds it while it queues the copies.
    sessions: Mutex<HashMap<u64, Arc<Slot>>>,
    pub(crate) next_id: AtomicU64,
    /// Cancelled when the [`PubHub`] is dropped: upstreams stop, sessions close.
    pub(crate) stop: CancellationToken,
    pub(crate) started: OnceLock<Arc<FanoutMetrics>>,
    /// Forwarding the first copy of each job (`listeners.publish.dedup_cluster_pki_dir`).
    pub(crate) dedup: dedup::Dedup,
    /// The number of upstreams connected now (for tests and the docs' "what it trusts").
    pub(crate) connected: AtomicU64,
    /// Per master: its upstream's address and state, for the admin view (`view.rs`).
    pub(crate) upstreams: Mutex<std::collections::BTreeMap<String, UpstreamState>>,
    /// The last message's sequence number (each forwarded message takes the next).
    pub(crate) seq: AtomicU64,
    /// The jobs kept for returning sessions (`listeners.publish.replay_window`).
    pub(crate) replay: ReplayLog,
    /// Sessions with no identity yet, waiting for presence to learn one (`late.rs`).
    pub(crate) awaiting_identity: AtomicU64,
    /// Set by [`Hub::stop_sessions`]: a session that attaches later is stopped at once.
    stopping: AtomicBool,
}

impl Hub {
    pub(crate) fn new(opts: HubOptions) -> Self {
        Hub {
            opts,
            sessions: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            stop: CancellationToken::new(),
            started: OnceLock::new(),
            dedup: dedup::Dedup::new(),
            connected: AtomicU64::new(0),
            upstreams: Mutex::new(Default::default()),
            seq: AtomicU64::new(0),
            replay: ReplayLog::default(),
            awaiting_identity: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        }
    }

    /// The sessions attached now, by id (locked: keep it short).
    pub(crate) fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn metrics(&self) -> Option<&Arc<FanoutMetrics>> {
        self.started.get()
    }

    /// Adds a session from `peer` (ZMTP `identity`, possibly empty) whose queue holds `hwm`
    /// messages (`listeners.publish.hwm` when it attaches) and whose topics are bounded by
    /// `topics`; returns its slot and the receiving end of its queue.
    pub(crate) fn attach(
        &self,
        peer: SocketAddr,
        identity: Bytes,
        hwm: usize,
        topics: TopicLimits,
    ) -> (Arc<Slot>, Inbox) {
        let slot = Arc::new(Slot {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            peer,
            identity,
            late_identity: OnceLock::new(),
            topics: Mutex::new(TopicSet::new(topics)),
            queue: SessionQueue::new(hwm),
            dropped: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
        });
        self.sessions().insert(slot.id, slot.clone());
        // After the insert: either `stop_sessions` finds it, or it sees the flag.
        if self.stopping.load(Ordering::Acquire) {
            slot.queue.stop();
        }
        if let Some(m) = self.metrics() {
            m.sessions.inc();
        }
        (slot.clone(), Inbox(slot))
    }

    /// Ends every session (the listener is dropped, or the shutdown grace ran out): each one's
    /// queue tells its session to stop, which then closes its minion's connection.
    pub(crate) fn stop_sessions(&self) {
        self.stopping.store(true, Ordering::Release);
        for s in self.sessions().values() {
            s.queue.stop();
        }
    }

    /// Removes a session; with replay on, remembers what was written to it under its identity.
    pub(crate) fn detach(&self, slot: &Slot) {
        self.sessions().remove(&slot.id);
        self.replay
            .departed(slot.identity(), slot.delivered.load(Ordering::Relaxed));
        if let Some(m) = self.metrics() {
            m.sessions.dec();
        }
    }

    /// [`Hub::publish_from`] without a master's duplicate counter.
    #[cfg(test)]
    pub(crate) fn publish(&self, frames: &[Bytes]) -> FanReport {
        self.publish_from(frames, None)
    }

    /// Drops a later copy of a job already forwarded (dedup on, counted in `duplicates`, the
    /// sending master's handle); otherwise encodes `frames` once and queues it for every session
    /// whose subscriptions match the first frame. Never waits: a full queue drops that
    /// session's copy and counts it.
    pub(crate) fn publish_from(
        &self,
        frames: &[Bytes],
        duplicates: Option<&prometheus::IntCounter>,
    ) -> FanReport {
        let mut report = FanReport::default();
        match self.dedup.check(frames) {
            dedup::Verdict::Duplicate => {
                report.duplicate = true;
                if let Some(c) = duplicates {
                    c.inc();
                }
                return report;
            }
            dedup::Verdict::Unreadable(e) => {
                report.unreadable = Some(e);
                if let Some(m) = self.metrics() {
                    m.unreadable(e).inc();
                }
            }
            dedup::Verdict::Off | dedup::Verdict::First => {}
        }
        let mut buf = BytesMut::new();
        encode_message(&mut buf, frames);
        let encoded = buf.freeze();
        let first: &[u8] = frames.first().map(|b| &b[..]).unwrap_or_default();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(topic) = frames.first() {
            self.replay.keep(seq, topic, &encoded);
        }
        for s in self.sessions().values() {
            if !s.topics().matches(first) {
                continue;
            }
            match s.queue.push((seq, encoded.clone())) {
                Ok(()) => report.queued += 1,
                Err(Refused::Full) => {
                    s.dropped.fetch_add(1, Ordering::Relaxed);
                    report.dropped += 1;
                }
                Err(Refused::Closed) => {}
            }
        }
        if let Some(m) = self.metrics() {
            m.fanned.inc_by(report.queued as u64);
            m.dropped.inc_by(report.dropped as u64);
        }
        report
    }
}

/// One upstream as the admin view shows it.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamState {
    pub addr: SocketAddr,
    pub connected: bool,
    /// When `connected` last changed.
    pub since: SystemTime,
    /// Why the last connection ended or the last dial failed.
    pub last_error: Option<String>,
}

impl Hub {
    /// Records the state of `name`'s upstream (`since` moves only when `connected` changes).
    pub(crate) fn upstream_state(
        &self,
        name: &str,
        addr: SocketAddr,
        connected: bool,
        last_error: Option<String>,
    ) {
        let mut map = self.upstreams.lock().unwrap_or_else(|p| p.into_inner());
        let now = SystemTime::now();
        let e = map.entry(name.to_string()).or_insert(UpstreamState {
            addr,
            connected,
            since: now,
            last_error: None,
        });
        if e.connected != connected || e.addr != addr {
            e.since = now;
        }
        e.addr = addr;
        e.connected = connected;
        if last_error.is_some() || connected {
            e.last_error = last_error;
        }
    }

    /// `name`'s upstream stopped (its publish port failed its checks, or it left the configuration).
    pub(crate) fn upstream_stopped(&self, name: &str) {
        self.upstreams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hub and a function attaching sessions whose queues hold `hwm` messages.
    fn hub(hwm: usize) -> (Hub, impl Fn(&Hub) -> (Arc<Slot>, Inbox)) {
        let peer: SocketAddr = "127.0.5.1:1".parse().unwrap();
        (Hub::new(HubOptions::default()), move |h: &Hub| {
            h.attach(peer, Bytes::new(), hwm, TopicLimits::default())
        })
    }

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    #[tokio::test]
    async fn a_full_queue_drops_for_that_session_only() {
        let (h, attach) = hub(2);
        let (slow, _slow_rx) = attach(&h);
        let (fast, mut fast_rx) = attach(&h);
        slow.topics().subscribe(Bytes::new()).unwrap();
        fast.topics().subscribe(Bytes::new()).unwrap();
        for i in 0..5u8 {
            let r = h.publish(&[Bytes::from(vec![i])]);
            assert!(!r.duplicate);
            // The fast session reads everything as it comes.
            assert!(fast_rx.try_recv().is_ok());
            if i >= 2 {
                assert_eq!((r.queued, r.dropped), (1, 1), "message {i}");
            }
        }
        assert_eq!(slow.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(fast.dropped.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn only_matching_subscriptions_get_a_copy_encoded_once() {
        let (h, attach) = hub(10);
        let (a, mut a_rx) = attach(&h);
        let (c, mut c_rx) = attach(&h);
        a.topics().subscribe(b("minion-a")).unwrap();
        c.topics().subscribe(b("minion-c")).unwrap();
        let r = h.publish(&[b("minion-a"), b("payload")]);
        assert_eq!((r.queued, r.dropped), (1, 0));
        let (_, got) = a_rx.try_recv().unwrap();
        let mut want = BytesMut::new();
        encode_message(&mut want, &[b("minion-a"), b("payload")]);
        assert_eq!(got, want.freeze());
        assert!(c_rx.try_recv().is_err());
        h.detach(&a);
        assert_eq!(h.sessions().len(), 1);
    }

    mod dedup {
        use super::*;
        use crate::fanout::dedup::tests::publish as job;
        use saltgate_wire::crypticle::CrypticleKey;

        fn aes(dir: &std::path::Path, k: &CrypticleKey) {
            let tmp = dir.join("aes.tmp");
            std::fs::write(&tmp, k.to_key_string()).unwrap();
            std::fs::rename(&tmp, dir.join(".aes")).unwrap();
        }

        async fn hub_with(dir: &std::path::Path) -> (Hub, Inbox) {
            let (h, attach) = hub(100);
            h.dedup.key.sync(Some(dir), false, None).await;
            let (s, rx) = attach(&h);
            s.topics().subscribe(Bytes::new()).unwrap();
            (h, rx)
        }

        fn delivered(rx: &mut Inbox) -> usize {
            std::iter::from_fn(|| rx.try_recv().ok()).count()
        }

        #[tokio::test]
        async fn copies_of_one_job_from_three_masters_are_delivered_once() {
            let d = tempfile::tempdir().unwrap();
            let k = CrypticleKey::generate();
            aes(d.path(), &k);
            let (h, mut rx) = hub_with(d.path()).await;
            let copies: Vec<Bytes> = (0..3).map(|_| job(&k, "20261123020000000001")).collect();
            assert!(copies[0] != copies[1], "each master's copy has its own IV");
            let r: Vec<FanReport> = copies
                .iter()
                .map(|c| h.publish(std::slice::from_ref(c)))
                .collect();
            assert_eq!((r[0].queued, r[0].duplicate), (1, false));
            assert!(r[1].duplicate && r[2].duplicate && r[1].queued == 0);
            assert!(!h.publish(&[job(&k, "20261123020000000002")]).duplicate);
            assert_eq!(delivered(&mut rx), 2, "one copy of each job");
        }

        #[tokio::test]
        async fn one_jid_under_different_topics_passes_once_per_topic() {
            // zmq_filtering: one message per target minion (hashed id), same jid.
            let d = tempfile::tempdir().unwrap();
            let k = CrypticleKey::generate();
            aes(d.path(), &k);
            let (h, mut rx) = hub_with(d.path()).await;
            for _master in 0..2 {
                for topic in ["aaaa", "bbbb", "broadcast"] {
                    h.publish(&[Bytes::from_static(topic.as_bytes()), job(&k, "j")]);
                }
            }
            assert_eq!(
                delivered(&mut rx),
                3,
                "each topic once, the second master's copies dropped"
            );
        }

        #[tokio::test]
        async fn a_wrong_key_or_no_key_forwards_every_copy_and_counts_it() {
            let d = tempfile::tempdir().unwrap();
            let (k, wrong) = (CrypticleKey::generate(), CrypticleKey::generate());
            let (h, mut rx) = hub_with(d.path()).await;
            let r = h.publish(&[job(&k, "j")]);
            assert_eq!(r.unreadable, Some(JobIdError::NoKey));
            aes(d.path(), &wrong);
            h.dedup.key.sync(Some(d.path()), false, None).await;
            for _ in 0..2 {
                let r = h.publish(&[job(&k, "j")]);
                assert_eq!((r.queued, r.unreadable), (1, Some(JobIdError::BadMac)));
            }
            let r = h.publish(&[Bytes::from_static(b"not msgpack \xc1")]);
            assert_eq!((r.queued, r.unreadable), (1, Some(JobIdError::NotAes)));
            assert_eq!(delivered(&mut rx), 4, "fail open: everything forwarded");
            // Off (no directory configured): nothing is read or counted.
            let (off, _) = hub(10);
            let r = off.publish(&[job(&k, "j")]);
            assert!(r.unreadable.is_none() && !r.duplicate);
        }

        #[tokio::test]
        async fn after_a_rotation_the_new_key_is_used_and_the_old_one_still_matches_copies() {
            let d = tempfile::tempdir().unwrap();
            let (k1, k2) = (CrypticleKey::generate(), CrypticleKey::generate());
            aes(d.path(), &k1);
            let (h, mut rx) = hub_with(d.path()).await;
            assert!(!h.publish(&[job(&k1, "j1")]).duplicate);
            aes(d.path(), &k2);
            assert!(
                h.dedup.key.sync(Some(d.path()), false, None).await,
                "the change is seen"
            );
            assert!(!h.publish(&[job(&k2, "j2")]).duplicate);
            assert!(
                h.publish(&[job(&k2, "j2")]).duplicate,
                "new key reads the copies"
            );
            assert!(
                h.publish(&[job(&k1, "j2")]).duplicate,
                "a slower master's old-key copy"
            );
            assert!(h.publish(&[job(&k1, "j1")]).duplicate);
            assert_eq!(delivered(&mut rx), 2);
        }
    }
}
