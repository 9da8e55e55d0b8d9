//! Cluster fan-out for the publish listener (`listeners.publish.mode: fanout`, issue 13).
//!
//! saltgate terminates ZMTP with each minion: it is the minion's PUB peer ([`session`]). It keeps
//! one upstream SUB connection, subscribed to everything, to every master that is UP in the
//! current snapshot ([`upstream`]), and relays every message from every master to every minion
//! session whose subscriptions match the first frame. A message is encoded once into a shared
//! [`Bytes`]; each session has a bounded queue (the high-water mark, Salt's `pub_hwm` default
//! 1000): a full queue drops and counts for that session only, so a stalled minion never delays
//! the others. A master that dies or goes DOWN removes one upstream; no minion session closes.
//!
//! The upstreams open with the first minion session (a hub with no minion has nothing to relay)
//! and stop when the hub is dropped (a reload to `mode: l4`) or at shutdown.

pub mod cluster_check;
pub mod metrics;
mod session;
mod upstream;

use std::collections::hash_map::DefaultHasher;
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use saltgate_wire::zmtp::frame::encode_message;
use saltgate_wire::zmtp::Heartbeat;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::dataplane::DataPlane;
use crate::serve::{BoxFuture, Serve};
pub use metrics::FanoutMetrics;

/// Settings of a hub.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// Per-session queue length in messages; beyond it copies are dropped for that session.
    pub hwm: usize,
    /// PINGs to minions and the silence limit (a Salt 3008 master: 10 s / 30 s). Also used on
    /// the upstream connections, so a master that hangs is dropped after the timeout.
    pub heartbeat: Option<Heartbeat>,
    /// Suppress a message byte-identical to one relayed within this window (off by default:
    /// the masters' copies of a job differ, see docs/fanout.md).
    pub dedup_window: Option<Duration>,
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
            hwm: 1000,
            heartbeat: Some(Heartbeat::salt_master()),
            dedup_window: None,
            watch_interval: Duration::from_millis(250),
            reconnect: Duration::from_millis(100),
            handshake_timeout: Duration::from_secs(10),
            max_frame_size: saltgate_wire::zmtp::DEFAULT_MAX_FRAME_SIZE,
        }
    }
}

/// A minion's subscriptions: a multiset of prefixes, as libzmq keeps it per subscriber.
#[derive(Debug, Default)]
pub(crate) struct Topics(Vec<(Bytes, usize)>);

impl Topics {
    pub fn subscribe(&mut self, t: Bytes) {
        match self.0.iter_mut().find(|(x, _)| *x == t) {
            Some((_, n)) => *n += 1,
            None => self.0.push((t, 1)),
        }
    }

    pub fn cancel(&mut self, t: &[u8]) {
        if let Some(i) = self.0.iter().position(|(x, _)| x == t) {
            self.0[i].1 -= 1;
            if self.0[i].1 == 0 {
                self.0.swap_remove(i);
            }
        }
    }

    pub fn matches(&self, first: &[u8]) -> bool {
        self.0.iter().any(|(t, _)| first.starts_with(t))
    }
}

/// One minion session as the fan-out sees it.
pub(crate) struct Slot {
    id: u64,
    topics: Mutex<Topics>,
    tx: mpsc::Sender<Bytes>,
    dropped: AtomicU64,
}

impl Slot {
    fn topics(&self) -> std::sync::MutexGuard<'_, Topics> {
        self.topics.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What one [`Hub::publish`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FanReport {
    pub queued: usize,
    pub dropped: usize,
    /// The message was a duplicate within the dedup window and went nowhere.
    pub duplicate: bool,
}

/// The state shared by the hub's minion sessions and upstreams.
pub(crate) struct Hub {
    opts: HubOptions,
    /// The sessions, swapped whole on attach/detach: the fan-out reads it without a lock.
    sessions: ArcSwap<Vec<Arc<Slot>>>,
    next_id: AtomicU64,
    /// Cancelled when the [`PubHub`] is dropped: upstreams stop, sessions close.
    stop: CancellationToken,
    started: OnceLock<Arc<FanoutMetrics>>,
    recent: Mutex<VecDeque<(Instant, u64, Bytes)>>,
    /// The number of upstreams connected now (for tests and the docs' "what it trusts").
    connected: AtomicU64,
}

/// Entries kept for the dedup window at most.
const DEDUP_MAX: usize = 4096;

impl Hub {
    fn new(opts: HubOptions) -> Self {
        Hub {
            opts,
            sessions: ArcSwap::from_pointee(Vec::new()),
            next_id: AtomicU64::new(1),
            stop: CancellationToken::new(),
            started: OnceLock::new(),
            recent: Mutex::new(VecDeque::new()),
            connected: AtomicU64::new(0),
        }
    }

    fn metrics(&self) -> Option<&Arc<FanoutMetrics>> {
        self.started.get()
    }

    /// Starts the upstream manager once, with the first session's context.
    fn ensure_started(self: &Arc<Self>, ctx: &Arc<DataPlane>) {
        let mut first = false;
        self.started.get_or_init(|| {
            first = true;
            ctx.fanout.clone()
        });
        if first {
            let stop = self.stop.clone();
            let shutdown = ctx.sessions_token.clone();
            let (hub, snapshot) = (self.clone(), ctx.snapshot.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = upstream::manage(hub, snapshot) => {}
                    _ = stop.cancelled() => {}
                    _ = shutdown.cancelled() => {}
                }
            });
        }
    }

    /// Adds a session; returns its slot and the receiving end of its queue.
    pub(crate) fn attach(&self) -> (Arc<Slot>, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(self.opts.hwm.max(1));
        let slot = Arc::new(Slot {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            topics: Mutex::new(Topics::default()),
            tx,
            dropped: AtomicU64::new(0),
        });
        self.sessions.rcu(|v| {
            let mut v = Vec::clone(v);
            v.push(slot.clone());
            v
        });
        if let Some(m) = self.metrics() {
            m.sessions.inc();
        }
        (slot, rx)
    }

    pub(crate) fn detach(&self, id: u64) {
        self.sessions
            .rcu(|v| v.iter().filter(|s| s.id != id).cloned().collect::<Vec<_>>());
        if let Some(m) = self.metrics() {
            m.sessions.dec();
        }
    }

    /// Encodes `frames` once and queues it for every session whose subscriptions match the
    /// first frame. Never waits: a full queue drops that session's copy and counts it.
    pub(crate) fn publish(&self, frames: &[Bytes]) -> FanReport {
        let mut buf = BytesMut::new();
        encode_message(&mut buf, frames);
        let encoded = buf.freeze();
        let mut report = FanReport::default();
        if let Some(window) = self.opts.dedup_window {
            if self.seen_recently(&encoded, window) {
                report.duplicate = true;
                if let Some(m) = self.metrics() {
                    m.duplicates.inc();
                }
                return report;
            }
        }
        let first: &[u8] = frames.first().map(|b| &b[..]).unwrap_or_default();
        let sessions = self.sessions.load();
        for s in sessions.iter() {
            if !s.topics().matches(first) {
                continue;
            }
            match s.tx.try_send(encoded.clone()) {
                Ok(()) => report.queued += 1,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    s.dropped.fetch_add(1, Ordering::Relaxed);
                    report.dropped += 1;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
        if let Some(m) = self.metrics() {
            m.fanned.inc_by(report.queued as u64);
            m.dropped.inc_by(report.dropped as u64);
        }
        report
    }

    /// Whether `encoded` was relayed within `window`; remembers it otherwise.
    fn seen_recently(&self, encoded: &Bytes, window: Duration) -> bool {
        let mut h = DefaultHasher::new();
        encoded.hash(&mut h);
        let hash = h.finish();
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        while recent
            .front()
            .is_some_and(|(t, _, _)| now.duration_since(*t) > window)
        {
            recent.pop_front();
        }
        if recent.iter().any(|(_, x, b)| *x == hash && b == encoded) {
            return true;
        }
        if recent.len() >= DEDUP_MAX {
            recent.pop_front();
        }
        recent.push_back((now, hash, encoded.clone()));
        false
    }
}

/// The publish listener's [`Serve`] in fanout mode.
pub struct PubHub {
    hub: Arc<Hub>,
    _stop: DropGuard,
}

impl PubHub {
    pub fn new(opts: HubOptions) -> Self {
        let hub = Arc::new(Hub::new(opts));
        let guard = hub.stop.clone().drop_guard();
        PubHub { hub, _stop: guard }
    }

    /// Minion sessions attached now.
    pub fn session_count(&self) -> usize {
        self.hub.sessions.load().len()
    }

    /// Upstream connections up now.
    pub fn upstreams_connected(&self) -> u64 {
        self.hub.connected.load(Ordering::Relaxed)
    }
}

impl Serve for PubHub {
    fn serve(&self, ctx: Arc<DataPlane>, stream: TcpStream, peer: SocketAddr) -> BoxFuture<()> {
        self.hub.ensure_started(&ctx);
        Box::pin(session::run(self.hub.clone(), ctx, stream, peer))
    }

    fn kind(&self) -> &'static str {
        "fanout"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(hwm: usize, dedup: Option<Duration>) -> Hub {
        Hub::new(HubOptions {
            hwm,
            dedup_window: dedup,
            ..HubOptions::default()
        })
    }

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    #[test]
    fn topics_match_by_prefix_and_count_duplicates() {
        let mut t = Topics::default();
        assert!(!t.matches(b"x"));
        t.subscribe(b("min"));
        t.subscribe(b("min"));
        assert!(t.matches(b"minion1"));
        t.cancel(b"min");
        assert!(t.matches(b"minion1"));
        t.cancel(b"min");
        assert!(!t.matches(b"minion1"));
        t.subscribe(Bytes::new());
        assert!(t.matches(b"") && t.matches(b"anything"));
    }

    #[tokio::test]
    async fn a_full_queue_drops_for_that_session_only() {
        let h = hub(2, None);
        let (slow, _slow_rx) = h.attach();
        let (fast, mut fast_rx) = h.attach();
        slow.topics().subscribe(Bytes::new());
        fast.topics().subscribe(Bytes::new());
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
        let h = hub(10, None);
        let (a, mut a_rx) = h.attach();
        let (c, mut c_rx) = h.attach();
        a.topics().subscribe(b("minion-a"));
        c.topics().subscribe(b("minion-c"));
        let r = h.publish(&[b("minion-a"), b("payload")]);
        assert_eq!((r.queued, r.dropped), (1, 0));
        let got = a_rx.try_recv().unwrap();
        let mut want = BytesMut::new();
        encode_message(&mut want, &[b("minion-a"), b("payload")]);
        assert_eq!(got, want.freeze());
        assert!(c_rx.try_recv().is_err());
        h.detach(a.id);
        assert_eq!(h.sessions.load().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn dedup_suppresses_identical_bytes_within_the_window_only() {
        let h = hub(10, Some(Duration::from_secs(5)));
        let (s, mut rx) = h.attach();
        s.topics().subscribe(Bytes::new());
        assert!(!h.publish(&[b("job")]).duplicate);
        assert!(h.publish(&[b("job")]).duplicate);
        assert!(!h.publish(&[b("other job")]).duplicate);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(!h.publish(&[b("job")]).duplicate);
        let mut n = 0;
        while rx.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, 3);
        // Off by default: every copy goes through.
        let h = hub(10, None);
        assert!(!h.publish(&[b("job")]).duplicate && !h.publish(&[b("job")]).duplicate);
    }
}
