//! PUB: fan-out to subscribers with prefix filtering and a per-subscriber high-water mark.
//!
//! Every accepted subscriber gets its own bounded queue (`hwm` messages, Salt's `pub_hwm`
//! default is 1000). [`Publisher::publish`] never waits: when a subscriber's queue is full the
//! message is dropped for that subscriber only and counted, like libzmq, so one slow minion
//! cannot stall the others. Subscriptions arrive as ZMTP 3.1 SUBSCRIBE/CANCEL commands or as
//! legacy `0x01`/`0x00` data frames; both are handled by [`crate::zmtp::peer`].
//!
//! A publish is framed once into one shared [`Bytes`] (however many subscribers it goes to) and
//! fanned out over a snapshot of the subscriber list: the list's lock is held only to clone an
//! `Arc`, never across an await or a queue operation, so connects, disconnects and concurrent
//! publishes do not wait on each other.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::net::TcpStream;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::accept::{AcceptStats, Acceptor, ConnectionLimit, ConnectionPermit, Keepalive};
use crate::zmtp::conn::{Connection, HandshakeConfig};
use crate::zmtp::frame::{encode_message, PUB_DEFAULT_MAX_FRAME_SIZE};
use crate::zmtp::peer::{drive, DriverConfig, Heartbeat, Inbound, Outbound};
use crate::zmtp::topics::{TopicLimits, TopicSet};
use crate::zmtp::SocketType;

use super::ProtocolRefusals;

/// PUB settings.
#[derive(Debug, Clone)]
pub struct PubOptions {
    /// Per-subscriber queue length; beyond it messages are dropped for that subscriber.
    pub hwm: usize,
    /// PINGs to subscribers and the silence timeout (Salt 3008 masters: 10 s / 30 s).
    pub heartbeat: Option<Heartbeat>,
    /// Largest frame, and largest whole message, a subscriber may send (its SUBSCRIBE, CANCEL,
    /// PING and READY); checked on the frame header before anything is allocated (default
    /// [`PUB_DEFAULT_MAX_FRAME_SIZE`], 8 KiB).
    pub max_frame_size: usize,
    pub handshake_timeout: Duration,
    /// Connections served at once (handshaking or established); beyond it new ones wait in the
    /// kernel backlog. `None` (default) = no cap but the descriptor limit, where accepting backs
    /// off instead of spinning (see [`crate::accept`]).
    pub max_connections: Option<usize>,
    /// A cap shared with other listeners (a process-wide connection budget), on top of
    /// `max_connections`. `None` (default): none.
    pub shared_limit: Option<Arc<ConnectionLimit>>,
    /// TCP keepalive on accepted sockets (default: Salt's, idle 300 s); `None` = off.
    pub keepalive: Option<Keepalive>,
    /// Distinct topics, and bytes of them, one subscriber may hold; a SUBSCRIBE past either
    /// cuts it (counted in [`ProtocolRefusals::topics`]).
    pub topics: TopicLimits,
    /// Longest a frame may take from its first byte to its last (default 10 s: a subscriber's
    /// frames are a few bytes). `None`: no limit.
    pub frame_timeout: Option<Duration>,
}

impl Default for PubOptions {
    fn default() -> Self {
        PubOptions {
            hwm: 1000,
            heartbeat: Some(Heartbeat::salt_master()),
            max_frame_size: PUB_DEFAULT_MAX_FRAME_SIZE,
            handshake_timeout: Duration::from_secs(10),
            max_connections: None,
            shared_limit: None,
            keepalive: Some(Keepalive::salt()),
            topics: TopicLimits::default(),
            frame_timeout: Some(Duration::from_secs(10)),
        }
    }
}

/// What one [`Publisher::publish`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Subscribers whose queue took the message.
    pub queued: usize,
    /// Matching subscribers whose queue was full (message dropped for them).
    pub dropped: usize,
}

struct Slot {
    topics: Arc<Mutex<TopicSet>>,
    tx: mpsc::Sender<Outbound>,
    id: u64,
}

impl Slot {
    fn matches(&self, first_frame: &[u8]) -> bool {
        self.topics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .matches(first_frame)
    }
}

/// The subscriber list: replaced (copy-on-write) on connect and disconnect, cloned by publish.
type Slots = Arc<Vec<Arc<Slot>>>;

struct Shared {
    slots: Mutex<Slots>,
    changed: Arc<Notify>,
    dropped: AtomicU64,
    next_id: AtomicU64,
    closed: AtomicBool,
    refusals: Arc<ProtocolRefusals>,
}

impl Shared {
    /// The current subscribers; the lock is held only for the `Arc` clone.
    fn snapshot(&self) -> Slots {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Changes the list in place when no publish holds a snapshot, else on a copy.
    fn update(&self, f: impl FnOnce(&mut Vec<Arc<Slot>>)) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        f(Arc::make_mut(&mut slots));
    }
}

/// A bound PUB socket. Dropping it closes every subscriber connection.
pub struct Publisher {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
    accept_stats: Arc<AcceptStats>,
}

impl Publisher {
    /// Binds `addr` and starts accepting subscribers.
    pub async fn bind(addr: SocketAddr, opts: PubOptions) -> std::io::Result<Self> {
        let (local_addr, mut acceptor) =
            Acceptor::bind_salt(addr, opts.keepalive, opts.max_connections)?;
        if let Some(l) = &opts.shared_limit {
            acceptor = acceptor.with_limit(l.clone());
        }
        let accept_stats = acceptor.stats();
        let shared = Arc::new(Shared {
            slots: Mutex::new(Arc::new(Vec::new())),
            changed: Arc::new(Notify::new()),
            dropped: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            refusals: Arc::default(),
        });
        let (sh, opts) = (shared.clone(), Arc::new(opts));
        let accept = acceptor.spawn_each(move |stream, peer, permit| {
            serve(stream, peer, sh.clone(), opts.clone(), permit)
        });
        Ok(Publisher {
            local_addr,
            shared,
            accept,
            accept_stats,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Queues `parts` for every subscriber whose subscriptions prefix-match the first frame.
    /// Never blocks; full queues drop and count. The message is framed once, on the first
    /// match, and shared by every queue it goes to.
    pub fn publish(&self, parts: Vec<Bytes>) -> PublishReport {
        let first = parts.first().cloned().unwrap_or_default();
        let mut framed: Option<Bytes> = None;
        let mut report = PublishReport::default();
        for slot in self.shared.snapshot().iter() {
            if !slot.matches(&first) {
                continue;
            }
            let msg = framed.get_or_insert_with(|| frame_once(&parts)).clone();
            match slot.tx.try_send(Outbound::Encoded(msg)) {
                Ok(()) => report.queued += 1,
                Err(mpsc::error::TrySendError::Full(_)) => report.dropped += 1,
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
        self.shared
            .dropped
            .fetch_add(report.dropped as u64, Ordering::Relaxed);
        report
    }

    /// Connected subscribers (handshake done), subscribed or not.
    pub fn subscriber_count(&self) -> usize {
        self.shared.snapshot().len()
    }

    /// Subscribers with at least one subscription.
    pub fn subscribed_count(&self) -> usize {
        self.shared
            .snapshot()
            .iter()
            .filter(|s| {
                !s.topics
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_empty()
            })
            .count()
    }

    /// The accept loop's counters (accepted, exhaustion errors and episodes), shared: keep the
    /// `Arc` to export them.
    pub fn accept_stats(&self) -> Arc<AcceptStats> {
        self.accept_stats.clone()
    }

    /// Connections closed for breaking the protocol (oversized or malformed), shared: keep the
    /// `Arc` to export them.
    pub fn refusals(&self) -> Arc<ProtocolRefusals> {
        self.shared.refusals.clone()
    }

    /// Messages dropped so far because a subscriber's queue was full.
    pub fn dropped_total(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` subscribers have subscribed to something; false on timeout.
    pub async fn wait_for_subscribed(&self, n: usize, timeout: Duration) -> bool {
        let now = tokio::time::Instant::now();
        // An unrepresentable deadline (absurd timeout) is capped at one day.
        let deadline = now
            .checked_add(timeout)
            .unwrap_or(now + Duration::from_secs(86_400));
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.subscribed_count() >= n {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.subscribed_count() >= n;
            }
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.closed.store(true, Ordering::SeqCst);
        // Dropping the senders ends every connection's driver.
        self.shared.update(|slots| slots.clear());
    }
}

/// Frames a whole message into one buffer, sized up front.
fn frame_once(parts: &[Bytes]) -> Bytes {
    let size: usize = parts.iter().map(|p| 9 + p.len()).sum();
    let mut buf = BytesMut::with_capacity(size.max(2));
    encode_message(&mut buf, parts);
    buf.freeze()
}

async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    opts: Arc<PubOptions>,
    _permit: ConnectionPermit,
) {
    let mut hs = HandshakeConfig::new(SocketType::Pub);
    hs.as_server = true;
    hs.max_frame_size = opts.max_frame_size;
    hs.timeout = opts.handshake_timeout;
    let conn = match Connection::handshake(stream, &hs).await {
        Ok(c) => c,
        Err(e) => {
            shared.refusals.note_handshake(peer, "pub handshake", &e);
            return;
        }
    };
    let (tx, rx) = mpsc::channel(opts.hwm.max(1));
    let topics = Arc::new(Mutex::new(TopicSet::new(opts.topics)));
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let slot = Arc::new(Slot {
        topics: topics.clone(),
        tx,
        id,
    });
    let mut closed = false;
    shared.update(|slots| {
        // Checked under the list's lock: Drop clears the list under it too.
        closed = shared.closed.load(Ordering::SeqCst);
        if !closed {
            slots.push(slot);
        }
    });
    if closed {
        return;
    }
    shared.changed.notify_waiters();
    let inbound = Inbound::Topics {
        topics,
        changed: shared.changed.clone(),
    };
    let mut cfg = DriverConfig::new(opts.heartbeat, opts.max_frame_size);
    cfg.frame_timeout = opts.frame_timeout;
    let reason = drive(conn, rx, inbound, cfg).await;
    shared.refusals.note_close(peer, "pub subscriber", &reason);
    shared.update(|slots| slots.retain(|s| s.id != id));
    shared.changed.notify_waiters();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(publisher: &Publisher, id: u64, cap: usize) -> mpsc::Receiver<Outbound> {
        let (tx, rx) = mpsc::channel(cap);
        let mut topics = TopicSet::default();
        topics.subscribe(Bytes::new()).unwrap();
        let slot = Arc::new(Slot {
            topics: Arc::new(Mutex::new(topics)),
            tx,
            id,
        });
        publisher.shared.update(|s| s.push(slot));
        rx
    }

    fn framed(out: Outbound) -> Bytes {
        match out {
            Outbound::Encoded(b) => b,
            other => panic!("expected an encoded message, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn publish_frames_once_for_all_subscribers_and_a_full_queue_only_drops_its_own() {
        let publisher = Publisher::bind("127.0.0.1:0".parse().unwrap(), PubOptions::default())
            .await
            .unwrap();
        let mut a = slot(&publisher, 1001, 8);
        let mut stalled = slot(&publisher, 1002, 1);
        let mut b = slot(&publisher, 1003, 8);
        let payload = Bytes::from(vec![5u8; 300]);
        let r = publisher.publish(vec![Bytes::from_static(b"topic"), payload.clone()]);
        assert_eq!(
            r,
            PublishReport {
                queued: 3,
                dropped: 0
            }
        );
        // The stalled subscriber's queue is now full; the others still get the next one.
        let r = publisher.publish(vec![Bytes::from_static(b"topic"), payload]);
        assert_eq!(
            r,
            PublishReport {
                queued: 2,
                dropped: 1
            }
        );
        assert_eq!(publisher.dropped_total(), 1);

        let (a1, b1) = (framed(a.try_recv().unwrap()), framed(b.try_recv().unwrap()));
        let s1 = framed(stalled.try_recv().unwrap());
        assert_eq!(a1.as_ptr(), b1.as_ptr(), "framed once, shared");
        assert_eq!(a1.as_ptr(), s1.as_ptr());
        let mut expect = BytesMut::new();
        encode_message(&mut expect, &[&b"topic"[..], &[5u8; 300][..]]);
        assert_eq!(a1, expect.freeze());
        assert!(a.try_recv().is_ok() && b.try_recv().is_ok());
        assert!(stalled.try_recv().is_err());
    }

    #[tokio::test]
    async fn publish_with_no_matching_subscriber_frames_nothing() {
        let publisher = Publisher::bind("127.0.0.1:0".parse().unwrap(), PubOptions::default())
            .await
            .unwrap();
        let r = publisher.publish(vec![Bytes::from_static(b"x")]);
        assert_eq!(r, PublishReport::default());
    }

    /// Issue 31: a subscriber used to keep any number of topics of any size (and each
    /// SUBSCRIBE scanned them all). Past `topics` it is cut and counted.
    #[tokio::test]
    async fn a_subscriber_past_its_topic_limit_is_cut_and_counted() {
        use crate::zmtp::{Command, TopicLimits};
        let p = Publisher::bind(
            "127.0.0.1:0".parse().unwrap(),
            PubOptions {
                topics: TopicLimits {
                    max_topics: 2,
                    max_bytes: 1024,
                },
                ..PubOptions::default()
            },
        )
        .await
        .unwrap();
        let cfg = HandshakeConfig::new(SocketType::Sub);
        let mut c = Connection::connect(p.local_addr(), &cfg).await.unwrap();
        for t in [&b"a"[..], b"b", b"c"] {
            // The third may meet a closed connection: that is the point.
            let _ = c
                .send_command(&Command::Subscribe(Bytes::copy_from_slice(t)))
                .await;
        }
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            while c.read_frame().await.is_ok() {}
        })
        .await;
        assert!(closed.is_ok(), "a third topic was kept");
        let refusals = p.refusals();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while refusals.topics() == 0 && tokio::time::Instant::now() < deadline {
            tokio::task::yield_now().await;
        }
        assert_eq!(refusals.topics(), 1);
    }
}
