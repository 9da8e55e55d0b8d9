//! PUB: fan-out to subscribers with prefix filtering and a per-subscriber high-water mark.
//!
//! Every accepted subscriber gets its own bounded queue (`hwm` messages, Salt's `pub_hwm`
//! default is 1000). [`Publisher::publish`] never waits: when a subscriber's queue is full the
//! message is dropped for that subscriber only and counted, like libzmq, so one slow minion
//! cannot stall the others. Subscriptions arrive as ZMTP 3.1 SUBSCRIBE/CANCEL commands or as
//! legacy `0x01`/`0x00` data frames; both are handled by [`crate::zmtp::peer`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::zmtp::conn::{Connection, HandshakeConfig};
use crate::zmtp::frame::DEFAULT_MAX_FRAME_SIZE;
use crate::zmtp::peer::{drive, DriverConfig, Heartbeat, Inbound, Outbound, TopicSet};
use crate::zmtp::SocketType;

/// PUB settings.
#[derive(Debug, Clone)]
pub struct PubOptions {
    /// Per-subscriber queue length; beyond it messages are dropped for that subscriber.
    pub hwm: usize,
    /// PINGs to subscribers and the silence timeout (Salt 3008 masters: 10 s / 30 s).
    pub heartbeat: Option<Heartbeat>,
    pub max_frame_size: usize,
    pub handshake_timeout: Duration,
}

impl Default for PubOptions {
    fn default() -> Self {
        PubOptions {
            hwm: 1000,
            heartbeat: Some(Heartbeat::salt_master()),
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            handshake_timeout: Duration::from_secs(10),
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

struct Shared {
    slots: Mutex<Vec<Slot>>,
    changed: Arc<Notify>,
    dropped: AtomicU64,
    next_id: AtomicU64,
    closed: AtomicBool,
}

impl Shared {
    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A bound PUB socket. Dropping it closes every subscriber connection.
pub struct Publisher {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Publisher {
    /// Binds `addr` and starts accepting subscribers.
    pub async fn bind(addr: SocketAddr, opts: PubOptions) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            slots: Mutex::new(Vec::new()),
            changed: Arc::new(Notify::new()),
            dropped: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone(), opts));
        Ok(Publisher {
            local_addr,
            shared,
            accept,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Queues `parts` for every subscriber whose subscriptions prefix-match the first frame.
    /// Never blocks; full queues drop and count.
    pub fn publish(&self, parts: Vec<Bytes>) -> PublishReport {
        let first = parts.first().cloned().unwrap_or_default();
        let msg: Arc<[Bytes]> = parts.into();
        let mut report = PublishReport::default();
        let slots = self.shared.slots();
        for slot in slots.iter() {
            let matches = slot
                .topics
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .matches(&first);
            if !matches {
                continue;
            }
            match slot.tx.try_send(Outbound::Message(msg.clone())) {
                Ok(()) => report.queued += 1,
                Err(mpsc::error::TrySendError::Full(_)) => report.dropped += 1,
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
        drop(slots);
        self.shared
            .dropped
            .fetch_add(report.dropped as u64, Ordering::Relaxed);
        report
    }

    /// Connected subscribers (handshake done), subscribed or not.
    pub fn subscriber_count(&self) -> usize {
        self.shared.slots().len()
    }

    /// Subscribers with at least one subscription.
    pub fn subscribed_count(&self) -> usize {
        self.shared
            .slots()
            .iter()
            .filter(|s| {
                !s.topics
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_empty()
            })
            .count()
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
        self.shared.slots().clear();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, opts: PubOptions) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tokio::spawn(serve(stream, peer, shared.clone(), opts.clone()));
            }
            Err(e) => {
                // EMFILE/ENFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "pub accept failed; backing off");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>, opts: PubOptions) {
    super::tune(&stream);
    let mut hs = HandshakeConfig::new(SocketType::Pub);
    hs.as_server = true;
    hs.max_frame_size = opts.max_frame_size;
    hs.timeout = opts.handshake_timeout;
    let conn = match Connection::handshake(stream, &hs).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "pub handshake failed");
            return;
        }
    };
    let (tx, rx) = mpsc::channel(opts.hwm.max(1));
    let topics = Arc::new(Mutex::new(TopicSet::default()));
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    {
        let mut slots = shared.slots();
        if shared.closed.load(Ordering::SeqCst) {
            return;
        }
        slots.push(Slot {
            topics: topics.clone(),
            tx,
            id,
        });
    }
    shared.changed.notify_waiters();
    let inbound = Inbound::Topics {
        topics,
        changed: shared.changed.clone(),
    };
    let reason = drive(
        conn,
        rx,
        inbound,
        DriverConfig::new(opts.heartbeat, opts.max_frame_size),
    )
    .await;
    tracing::debug!(%peer, ?reason, "pub subscriber closed");
    shared.slots().retain(|s| s.id != id);
    shared.changed.notify_waiters();
}
