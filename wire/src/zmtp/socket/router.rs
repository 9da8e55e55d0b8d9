//! ROUTER: many peers, each with a routing id; replies go to the peer they name.
//!
//! The routing id is the peer's `Identity` property when it sent a non-empty one, otherwise a
//! generated 5-byte id (`0x00` + 32-bit counter, libzmq's form). A second peer claiming an id in
//! use takes it over (Salt sets `ROUTER_HANDOVER=1`). [`Router::send`] to an unknown id is an
//! error (`ROUTER_MANDATORY` semantics) rather than a silent drop, so callers can count it.
//!
//! Inbound flow control is libzmq's: when the receive queue is full, each peer with a message to
//! deliver stops being read until there is room (its further requests wait in TCP's buffers);
//! nothing received is dropped. [`Router::sender`] gives handles that reply from any task, so
//! replying never waits for the task that receives.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;
use tokio::net::TcpStream;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::accept::{AcceptStats, Acceptor, ConnectionLimit, ConnectionPermit, Keepalive};
use crate::zmtp::conn::{Connection, HandshakeConfig};
use crate::zmtp::frame::ROUTER_DEFAULT_MAX_FRAME_SIZE;
use crate::zmtp::peer::{
    drive, Budget, Delivered, DriverConfig, Heartbeat, Inbound, OnFull, Outbound,
};
use crate::zmtp::SocketType;

use super::ProtocolRefusals;

/// ROUTER settings.
#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// Salt 3008 pooled ROUTERs: PING every 10 s, drop after 30 s of silence.
    pub heartbeat: Option<Heartbeat>,
    /// Largest frame, and largest whole message, a peer may send; checked on the frame header
    /// before anything is allocated (default [`ROUTER_DEFAULT_MAX_FRAME_SIZE`], 16 MiB).
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
    /// Per-peer outgoing queue.
    pub hwm: usize,
    /// Received messages (from all peers) buffered for [`Router::recv`]; when it is full, a peer
    /// with another message stops being read until there is room (libzmq's `ZMQ_RCVHWM`:
    /// backpressure, no loss; counted in [`Router::paused_inbound`]).
    pub queue: usize,
    /// Largest frame (and message) of a peer the application has not vouched for with
    /// [`RouterSender::trust`]: what an unauthenticated client can make a connection hold.
    /// `None` (default): `max_frame_size` from the start.
    pub untrusted_max_frame_size: Option<usize>,
    /// Bytes that received messages of peers not yet trusted may hold in the receive queue,
    /// all peers together: a message that does not fit waits (its peer is not read meanwhile)
    /// until handled messages make room. Bounds what unauthenticated senders can queue, which
    /// `queue` alone bounds only in messages (1000 x `untrusted_max_frame_size`). `None`
    /// (default): no byte budget.
    pub untrusted_queue_bytes: Option<usize>,
    /// Longest a frame may take from its first byte to its last (a peer trickling one byte
    /// now and then is not silent, so the heartbeat alone never cuts it). `None`: no limit.
    pub frame_timeout: Option<Duration>,
    /// Longest a write to a peer may make no progress: a peer that does not read its replies
    /// is cut (its heartbeat cannot be checked while a write to it waits). Default: the
    /// heartbeat timeout (30 s); `None`: no limit.
    pub write_timeout: Option<Duration>,
}

impl Default for RouterOptions {
    fn default() -> Self {
        RouterOptions {
            heartbeat: Some(Heartbeat::salt_master()),
            max_frame_size: ROUTER_DEFAULT_MAX_FRAME_SIZE,
            handshake_timeout: Duration::from_secs(10),
            max_connections: None,
            shared_limit: None,
            keepalive: Some(Keepalive::salt()),
            hwm: 1000,
            queue: 1000,
            untrusted_max_frame_size: None,
            untrusted_queue_bytes: None,
            frame_timeout: Some(DEFAULT_FRAME_TIMEOUT),
            write_timeout: Some(Heartbeat::salt_master().timeout),
        }
    }
}

/// Default [`RouterOptions::frame_timeout`]: a Salt minion waits 60 s for the reply to a
/// request, so a request still arriving after that is sent for nobody.
pub const DEFAULT_FRAME_TIMEOUT: Duration = Duration::from_secs(60);

/// A message from one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterMessage {
    /// The routing id to answer to.
    pub peer: Bytes,
    /// The frames as sent (for a REQ peer: `""`, then the request parts).
    pub frames: Vec<Bytes>,
    /// When it was read off the peer's connection: how long it has waited since is its age in
    /// this process (a server under overload can skip what its sender has given up on).
    pub received: tokio::time::Instant,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RouterError {
    #[error("no connected peer with routing id {0:?}")]
    UnknownPeer(Bytes),
    #[error("peer {0:?} disconnected")]
    PeerGone(Bytes),
}

struct PeerSlot {
    tx: mpsc::Sender<Outbound>,
    /// Distinguishes a handed-over id's new owner from the old one when the old one closes.
    conn_id: u64,
}

struct Shared {
    peers: Mutex<HashMap<Bytes, PeerSlot>>,
    next_id: AtomicU32,
    next_conn: AtomicU64,
    paused: Arc<AtomicU64>,
    refusals: Arc<ProtocolRefusals>,
    /// `RouterOptions::untrusted_queue_bytes`.
    untrusted_budget: Option<Budget>,
}

impl Shared {
    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<Bytes, PeerSlot>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A bound ROUTER socket. Dropping it closes every connection.
pub struct Router {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Delivered>,
    accept: JoinHandle<()>,
    accept_stats: Arc<AcceptStats>,
}

impl Router {
    pub async fn bind(addr: SocketAddr, opts: RouterOptions) -> std::io::Result<Self> {
        let (local_addr, mut acceptor) =
            Acceptor::bind_salt(addr, opts.keepalive, opts.max_connections)?;
        if let Some(l) = &opts.shared_limit {
            acceptor = acceptor.with_limit(l.clone());
        }
        let accept_stats = acceptor.stats();
        let shared = Arc::new(Shared {
            peers: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(rand::random()),
            next_conn: AtomicU64::new(0),
            paused: Arc::default(),
            refusals: Arc::default(),
            untrusted_budget: opts.untrusted_queue_bytes.map(Budget::new),
        });
        let (tx, rx) = mpsc::channel(opts.queue.max(1));
        let (sh, opts) = (shared.clone(), Arc::new(opts));
        let accept = acceptor.spawn_each(move |stream, peer, permit| {
            serve(stream, peer, sh.clone(), tx.clone(), opts.clone(), permit)
        });
        Ok(Router {
            local_addr,
            shared,
            rx,
            accept,
            accept_stats,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The next message from any peer.
    pub async fn recv(&mut self) -> Option<RouterMessage> {
        self.rx.recv().await.map(|d| RouterMessage {
            peer: d.peer,
            frames: d.frames,
            received: d.received,
        })
    }

    /// A handle that sends to this ROUTER's peers from any task.
    pub fn sender(&self) -> RouterSender {
        RouterSender {
            shared: self.shared.clone(),
        }
    }

    /// Sends `frames` to the peer with routing id `peer`; waits if its queue is full.
    pub async fn send(&self, peer: &Bytes, frames: Vec<Bytes>) -> Result<(), RouterError> {
        self.sender().send(peer, frames).await
    }

    /// Answers a REQ peer: `["", parts...]` to `peer`.
    pub async fn reply(&self, peer: &Bytes, parts: Vec<Bytes>) -> Result<(), RouterError> {
        self.sender().reply(peer, parts).await
    }

    /// Bytes of `untrusted_queue_bytes` not drawn now (`None` without a budget).
    pub fn untrusted_budget_available(&self) -> Option<usize> {
        self.shared.untrusted_budget.as_ref().map(Budget::available)
    }

    /// How many times a peer had to stop being read because the receive queue (`queue`) was
    /// full (or, for a peer not yet trusted, `untrusted_queue_bytes` was drawn) (nothing is dropped: it is read again when there is room).
    pub fn paused_inbound(&self) -> u64 {
        self.sender().paused_inbound()
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

    pub fn peer_count(&self) -> usize {
        self.sender().peer_count()
    }
}

/// Sends to a [`Router`]'s peers; cheap to clone, usable while another task receives.
#[derive(Clone)]
pub struct RouterSender {
    shared: Arc<Shared>,
}

impl RouterSender {
    /// Sends `frames` to the peer with routing id `peer`; waits if its queue is full.
    pub async fn send(&self, peer: &Bytes, frames: Vec<Bytes>) -> Result<(), RouterError> {
        let tx = self
            .shared
            .peers()
            .get(peer)
            .map(|s| s.tx.clone())
            .ok_or_else(|| RouterError::UnknownPeer(peer.clone()))?;
        tx.send(Outbound::Message(frames.into()))
            .await
            .map_err(|_| RouterError::PeerGone(peer.clone()))
    }

    /// Answers a REQ peer: `["", parts...]` to `peer`.
    pub async fn reply(&self, peer: &Bytes, parts: Vec<Bytes>) -> Result<(), RouterError> {
        let mut frames = Vec::with_capacity(parts.len() + 1);
        frames.push(Bytes::new());
        frames.extend(parts);
        self.send(peer, frames).await
    }

    /// Vouches for the peer with this routing id (it sent what only a key holder could): from
    /// now on its frames may reach `max_frame_size` instead of `untrusted_max_frame_size`.
    /// Never waits; a no-op for a peer gone or whose queue is full (it stays untrusted).
    pub fn trust(&self, peer: &Bytes) {
        if let Some(s) = self.shared.peers().get(peer) {
            let _ = s.tx.try_send(Outbound::Trust);
        }
    }

    /// Whether a peer with this routing id is connected (a request whose sender has gone need
    /// not be handled: its reply could not be delivered).
    pub fn is_connected(&self, peer: &Bytes) -> bool {
        self.shared.peers().contains_key(peer)
    }

    /// See [`Router::paused_inbound`].
    pub fn paused_inbound(&self) -> u64 {
        self.shared.paused.load(Ordering::Relaxed)
    }

    /// Connected peers (handshake done).
    pub fn peer_count(&self) -> usize {
        self.shared.peers().len()
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.peers().clear();
    }
}

fn generated_id(n: u32) -> Bytes {
    let mut b = BytesMut::with_capacity(5);
    b.put_u8(0);
    b.put_u32(n);
    b.freeze()
}

async fn serve(
    stream: TcpStream,
    addr: SocketAddr,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Delivered>,
    opts: Arc<RouterOptions>,
    _permit: ConnectionPermit,
) {
    let untrusted = opts
        .untrusted_max_frame_size
        .map_or(opts.max_frame_size, |u| u.min(opts.max_frame_size));
    let mut hs = HandshakeConfig::new(SocketType::Router);
    hs.as_server = true;
    hs.max_frame_size = untrusted;
    hs.timeout = opts.handshake_timeout;
    let conn = match Connection::handshake(stream, &hs).await {
        Ok(c) => c,
        Err(e) => {
            shared.refusals.note_handshake(addr, "router handshake", &e);
            return;
        }
    };
    // libzmq reserves ids starting with 0x00 for generated ones.
    let id = match conn.peer().identity.clone() {
        id if !id.is_empty() && id.first() != Some(&0) => id,
        _ => generated_id(shared.next_id.fetch_add(1, Ordering::Relaxed)),
    };
    let conn_id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let (out_tx, out_rx) = mpsc::channel(opts.hwm.max(1));
    // Handover: a newcomer with the same identity replaces the old connection.
    shared.peers().insert(
        id.clone(),
        PeerSlot {
            tx: out_tx,
            conn_id,
        },
    );
    let inbound = Inbound::Channel {
        tx,
        peer: id.clone(),
        full: OnFull::Wait(shared.paused.clone()),
        budget: shared.untrusted_budget.clone(),
    };
    let mut cfg = DriverConfig::new(opts.heartbeat, untrusted);
    cfg.trusted_max_frame_size = opts.max_frame_size;
    cfg.frame_timeout = opts.frame_timeout;
    cfg.write_timeout = opts.write_timeout;
    let reason = drive(conn, out_rx, inbound, cfg).await;
    shared.refusals.note_close(addr, "router peer", &reason);
    let mut peers = shared.peers();
    if peers.get(&id).is_some_and(|s| s.conn_id == conn_id) {
        peers.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::zmtp::conn::{Connection, HandshakeConfig};

    /// Issue 31 item 2: before the application vouches for a peer its frames are capped at
    /// `untrusted_max_frame_size`; after [`RouterSender::trust`], at `max_frame_size`.
    #[tokio::test]
    async fn a_peer_gets_the_full_frame_limit_only_once_trusted() {
        let mut router = Router::bind(
            "127.0.0.1:0".parse().unwrap(),
            RouterOptions {
                max_frame_size: 1 << 20,
                untrusted_max_frame_size: Some(1024),
                ..RouterOptions::default()
            },
        )
        .await
        .unwrap();
        let addr = router.local_addr();
        let big = vec![7u8; 100 * 1024];
        let t = Duration::from_secs(10);
        let cfg = HandshakeConfig::new(SocketType::Req);

        let mut trusted = Connection::connect(addr, &cfg).await.unwrap();
        trusted.send_message(&[&b""[..], b"hello"]).await.unwrap();
        let first = tokio::time::timeout(t, router.recv())
            .await
            .unwrap()
            .unwrap();
        router.sender().trust(&first.peer);
        trusted.send_message(&[&b""[..], &big[..]]).await.unwrap();
        let second = tokio::time::timeout(t, router.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(second.frames.last().map(|f| f.len()), Some(big.len()));

        let mut stranger = Connection::connect(addr, &cfg).await.unwrap();
        stranger.send_message(&[&b""[..], &big[..]]).await.unwrap();
        let cut = tokio::time::timeout(t, async {
            loop {
                if stranger.read_frame().await.is_err() {
                    return;
                }
            }
        })
        .await;
        assert!(cut.is_ok(), "an untrusted 100 KiB frame was taken");
        assert_eq!(router.refusals().oversized(), 1);
    }

    /// What unauthenticated senders can queue is bounded in bytes, not only in messages: a
    /// message that does not fit `untrusted_queue_bytes` waits (its peer unread) until handled
    /// messages give their share back; a trusted peer draws nothing.
    #[tokio::test]
    async fn untrusted_messages_queue_within_a_byte_budget() {
        let mut router = Router::bind(
            "127.0.0.1:0".parse().unwrap(),
            RouterOptions {
                untrusted_queue_bytes: Some(10_000),
                ..RouterOptions::default()
            },
        )
        .await
        .unwrap();
        let addr = router.local_addr();
        let t = Duration::from_secs(10);
        let cfg = HandshakeConfig::new(SocketType::Req);
        let body = vec![1u8; 6000];
        let mut a = Connection::connect(addr, &cfg).await.unwrap();
        let mut b = Connection::connect(addr, &cfg).await.unwrap();
        a.send_message(&[&b""[..], &body[..]]).await.unwrap();
        // The first 6000 bytes are queued; the second 6000 do not fit the 4000 left.
        let budget = |r: &Router| r.untrusted_budget_available();
        saltgate_test_support::wait_until("the first message queued", t, || {
            budget(&router) == Some(4000)
        })
        .await;
        b.send_message(&[&b""[..], &body[..]]).await.unwrap();
        saltgate_test_support::wait_until("the second sender paused", t, || {
            router.paused_inbound() >= 1
        })
        .await;
        assert_eq!(
            router.rx.len(),
            1,
            "the second message was queued over the budget"
        );
        // Taking the first message gives its share back: the second is queued.
        let first = tokio::time::timeout(t, router.recv())
            .await
            .unwrap()
            .unwrap();
        let second = tokio::time::timeout(t, router.recv())
            .await
            .unwrap()
            .unwrap();
        assert_ne!(first.peer, second.peer);
        assert_eq!(budget(&router), Some(10_000));

        // Once trusted, a peer's messages draw nothing: two of them queue at once.
        let mut c = Connection::connect(addr, &cfg).await.unwrap();
        c.send_message(&[&b""[..], b"hi"]).await.unwrap();
        let hi = tokio::time::timeout(t, router.recv())
            .await
            .unwrap()
            .unwrap();
        router.sender().trust(&hi.peer);
        // The reply follows the trust on the peer's queue: once it arrives, the trust is in force.
        router
            .reply(&hi.peer, vec![Bytes::from_static(b"ok")])
            .await
            .unwrap();
        let _ = tokio::time::timeout(t, c.read_frame())
            .await
            .unwrap()
            .unwrap();
        let _ = tokio::time::timeout(t, c.read_frame())
            .await
            .unwrap()
            .unwrap();
        c.send_message(&[&b""[..], &body[..]]).await.unwrap();
        c.send_message(&[&b""[..], &body[..]]).await.unwrap();
        saltgate_test_support::wait_until("both trusted messages queued", t, || {
            router.rx.len() == 2
        })
        .await;
        assert_eq!(budget(&router), Some(10_000));
        drop(a);
    }

    #[test]
    fn generated_ids_are_five_bytes_starting_with_zero() {
        assert_eq!(&generated_id(0x0102_0304)[..], &[0, 1, 2, 3, 4]);
    }
}
