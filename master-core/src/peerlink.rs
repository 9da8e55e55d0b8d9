//! Transport of the cluster's peer protocol: a persistent, acknowledged connection per peer
//! for forwarded publishes and returns, and the receiving loop that reads frames until EOF.
//!
//! * Sending: one task per joined peer ([`Links::send`]) owns a bounded queue
//!   ([`QUEUE_FRAMES`]) and one TCP connection. Request handlers enqueue without waiting (they run
//!   on blocking threads); a full queue drops the frame, counted in [`PeerStats::dropped`], with
//!   a warning at most every 10 s. A failed connect is retried with back-off (100 ms doubling to
//!   5 s).
//! * On each new connection the sender writes a hello ([`crate::peerproto`]) and waits up to
//!   2 s for the receiver's. With an answer, frames are written back to back (flushed when the
//!   queue is momentarily empty) and kept until the receiver acknowledges them; at most
//!   [`QUEUE_FRAMES`] are kept, and a full window stops taking from the queue. When the
//!   connection fails, the unacknowledged frames are written again first on the next one
//!   (each frame at most [`MAX_SENDS`] times; a peer may see a frame twice: a publish is then
//!   not published again, a return is stored again under the same name).
//! * Without an answer the peer is an old member: for [`REPROBE_EVERY`] each frame goes on its
//!   own connection, RSA-signed, and counts as delivered when the peer closes that connection
//!   (an old member closes once it has handled the frame); then the next connection probes again.
//! * Receiving is [`crate::peerserve`]'s; the framing is [`crate::peerwire`]'s.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use saltgate_wire::rsa::PrivateKey;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::peerproto::{
    hello_frame, send_one, signed_copy, Control, ControlReader, Peeked, HELLO_TIMEOUT, MAX_SENDS,
    REPROBE_EVERY,
};
use crate::peerwire::PEER_KEEPALIVE;
pub use crate::peerwire::{read_frame_idle, write_frame, FRAME_TIMEOUT};
use crate::util::{lock, unix_now};
use saltgate_wire::accept::tune_stream;

/// Frames queued per peer before new ones are dropped; also the most frames kept
/// unacknowledged.
pub const QUEUE_FRAMES: usize = 65_536;
/// A write (one batch) that takes longer than this fails the connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Frames written before a flush at most.
const BATCH_FRAMES: usize = 512;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Seconds between two warnings of the same kind.
const WARN_EVERY_SECS: u64 = 10;

/// Counters of the peer links (sending) and the peer port (receiving).
#[derive(Debug, Default)]
pub struct PeerStats {
    /// Frames handed to a link's queue.
    pub queued: AtomicU64,
    /// Frames dropped: the queue was full, a frame was sent [`MAX_SENDS`] times without an
    /// acknowledgement, or its link was replaced.
    pub dropped: AtomicU64,
    /// Frames written and flushed (re-sends included).
    pub sent: AtomicU64,
    /// Frames written again after a connection failed before their acknowledgement.
    pub resent: AtomicU64,
    /// Frames the peer acknowledged (on a link) or closed the connection after (one frame per
    /// connection, to an old peer).
    pub acked: AtomicU64,
    /// Outgoing link connections made (probes of an old peer included).
    pub connects: AtomicU64,
    /// Outgoing connections whose hello was answered (the peer acknowledges).
    pub hellos: AtomicU64,
    /// Probes without an answer: the peer was taken for an old member.
    pub old_peer: AtomicU64,
    /// Frames delivered one per connection to an old peer.
    pub single: AtomicU64,
    /// Connections accepted on the peer port.
    pub accepted: AtomicU64,
    /// Frames received and handled without error.
    pub handled: AtomicU64,
    /// Frames refused (bad signature or mac, unknown peer, stale, malformed…).
    pub refused: AtomicU64,
    /// Peer publishes of a job this master had already published (not published again).
    pub replayed: AtomicU64,
    last_drop_warn: AtomicU64,
}

impl PeerStats {
    /// Every counter with its `event` label (the metrics endpoint's).
    pub fn snapshot(&self) -> [(&'static str, u64); 13] {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("queued", g(&self.queued)),
            ("dropped", g(&self.dropped)),
            ("sent", g(&self.sent)),
            ("resent", g(&self.resent)),
            ("acked", g(&self.acked)),
            ("connects", g(&self.connects)),
            ("hellos", g(&self.hellos)),
            ("old_peer", g(&self.old_peer)),
            ("single", g(&self.single)),
            ("accepted", g(&self.accepted)),
            ("handled", g(&self.handled)),
            ("refused", g(&self.refused)),
            ("replayed", g(&self.replayed)),
        ]
    }

    /// Counts a drop; warns at most every [`WARN_EVERY_SECS`].
    fn drop_frames(&self, peer: &str, n: u64, why: &str) {
        if n == 0 {
            return;
        }
        let total = self.dropped.fetch_add(n, Ordering::Relaxed) + n;
        let now = unix_now();
        let last = self.last_drop_warn.load(Ordering::Relaxed);
        if now >= last + WARN_EVERY_SECS
            && self
                .last_drop_warn
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(%peer, dropped_total = total, reason = why, "cluster frames dropped");
        }
    }
}

fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

struct Link {
    addr: SocketAddr,
    tx: mpsc::Sender<Bytes>,
}

/// What every link of this master shares: its hello, and its own key for the RSA-signed copy
/// an old peer needs.
struct LinkCtx {
    hello: Vec<u8>,
    key: PrivateKey,
}

/// The sending side: one link (task + queue + connection) per peer.
pub struct Links {
    links: Mutex<HashMap<String, Link>>,
    ctx: Arc<LinkCtx>,
}

impl Links {
    /// The links of master `own_id`, whose own key is `key`.
    pub fn new(own_id: &str, key: PrivateKey) -> Self {
        Links {
            links: Mutex::default(),
            ctx: Arc::new(LinkCtx {
                hello: hello_frame(own_id),
                key,
            }),
        }
    }

    /// Queues `frame` for `peer` at `addr` without waiting; starts (or restarts, when the
    /// address changed or its task ended) the peer's link on `rt`.
    pub fn send(
        &self,
        rt: &tokio::runtime::Handle,
        stats: &Arc<PeerStats>,
        peer: &str,
        addr: SocketAddr,
        frame: Bytes,
    ) {
        let mut links = lock(&self.links);
        let fresh = |links: &mut HashMap<String, Link>| {
            let (tx, rx) = mpsc::channel(QUEUE_FRAMES);
            let task = run_link(peer.to_string(), addr, rx, stats.clone(), self.ctx.clone());
            rt.spawn(task);
            links.insert(peer.to_string(), Link { addr, tx });
        };
        match links.get(peer) {
            Some(l) if l.addr == addr && !l.tx.is_closed() => {}
            _ => fresh(&mut links),
        }
        let Some(link) = links.get(peer) else { return };
        match link.tx.try_send(frame) {
            Ok(()) => {
                stats.queued.fetch_add(1, Ordering::Relaxed);
            }
            Err(mpsc::error::TrySendError::Full(_)) => stats.drop_frames(peer, 1, "queue full"),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                stats.drop_frames(peer, 1, "link task ended")
            }
        }
    }
}

/// Why a connection's pump ended.
enum Ended {
    /// The queue's sender is gone (the peer was replaced or the master stops).
    Closed,
    Failed(String),
}

/// A frame waiting to be sent or acknowledged.
struct Item {
    frame: Bytes,
    /// Times written so far.
    sends: u8,
}

/// Frames a link holds: not yet written (or to be written again), in order.
type Pending = VecDeque<Item>;

/// Takes what is queued, while fewer than [`BATCH_FRAMES`] are pending and fewer than
/// [`QUEUE_FRAMES`] are held in all (`held` are written and unacknowledged).
fn take_queued(rx: &mut mpsc::Receiver<Bytes>, q: &mut Pending, held: usize) {
    while q.len() < BATCH_FRAMES && q.len() + held < QUEUE_FRAMES {
        match rx.try_recv() {
            Ok(frame) => q.push_back(Item { frame, sends: 0 }),
            Err(_) => break,
        }
    }
}

/// Drops the frames already written [`MAX_SENDS`] times, counted and warned as `why`.
fn drop_exhausted(q: &mut Pending, st: &PeerStats, peer: &str, why: &str) {
    let before = q.len();
    q.retain(|i| i.sends < MAX_SENDS);
    st.drop_frames(peer, (before - q.len()) as u64, why);
}

async fn sleep_backoff(backoff: &mut Duration) {
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(BACKOFF_MAX);
}

async fn run_link(
    peer: String,
    addr: SocketAddr,
    mut rx: mpsc::Receiver<Bytes>,
    st: Arc<PeerStats>,
    ctx: Arc<LinkCtx>,
) {
    let mut q = Pending::new();
    let mut backoff = BACKOFF_MIN;
    // Set while the peer is taken for an old member: until then, one frame per connection.
    let mut old_until: Option<Instant> = None;
    loop {
        if q.is_empty() {
            // No connection is kept for a link with nothing to send after a failure.
            match rx.recv().await {
                Some(frame) => q.push_back(Item { frame, sends: 0 }),
                None => return,
            }
        }
        if let Some(until) = old_until.filter(|t| Instant::now() < *t) {
            match send_old(addr, &mut q, &mut rx, &st, &ctx, until).await {
                Ok(()) => backoff = BACKOFF_MIN,
                Err(e) => {
                    tracing::debug!(%peer, %addr, error = %e, "cluster frame to an old peer failed");
                    sleep_backoff(&mut backoff).await;
                }
            }
            drop_exhausted(&mut q, &st, &peer, "sent 3 times, never handled");
            continue;
        }
        let stream = match tokio::time::timeout(FRAME_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(%peer, %addr, error = %e, "cluster link connect failed");
                sleep_backoff(&mut backoff).await;
                continue;
            }
            Err(_) => {
                tracing::debug!(%peer, %addr, "cluster link connect timed out");
                sleep_backoff(&mut backoff).await;
                continue;
            }
        };
        tune_stream(&stream, Some(&PEER_KEEPALIVE));
        st.connects.fetch_add(1, Ordering::Relaxed);
        let (rd, wr) = stream.into_split();
        let mut rd = ControlReader::new(rd);
        let mut w = BufWriter::with_capacity(64 * 1024, wr);
        if !probe(&mut rd, &mut w, &ctx.hello).await {
            st.old_peer.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, %addr, "cluster peer does not answer the link hello (an older \
                saltgate-master?): one frame per connection for 60 s, then it is asked again");
            old_until = Some(Instant::now() + REPROBE_EVERY);
            continue;
        }
        old_until = None;
        st.hellos.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%peer, %addr, "cluster link connected");
        let (ended, progressed) = pump(rd, w, &mut rx, &mut q, &st).await;
        match ended {
            Ended::Closed => {
                st.drop_frames(&peer, q.len() as u64, "link replaced or stopped");
                return;
            }
            Ended::Failed(e) => {
                tracing::info!(%peer, %addr, error = %e, pending = q.len(), "cluster link lost; reconnecting");
                drop_exhausted(&mut q, &st, &peer, "sent 3 times, never acknowledged");
                if progressed {
                    backoff = BACKOFF_MIN;
                } else {
                    sleep_backoff(&mut backoff).await;
                }
            }
        }
    }
}

async fn put_frame(w: &mut BufWriter<OwnedWriteHalf>, f: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(f.len()).map_err(std::io::Error::other)?;
    w.write_all(&len.to_be_bytes()).await?;
    w.write_all(f).await
}

/// Writes our hello and waits up to [`HELLO_TIMEOUT`] for the peer's; false when none came.
async fn probe(rd: &mut ControlReader, w: &mut BufWriter<OwnedWriteHalf>, hello: &[u8]) -> bool {
    let go = async {
        put_frame(w, hello).await.map_err(|e| e.to_string())?;
        w.flush().await.map_err(|e| e.to_string())?;
        rd.next().await
    };
    matches!(
        tokio::time::timeout(HELLO_TIMEOUT, go).await,
        Ok(Ok(Control::Hello))
    )
}

/// Sends the pending frames to an old peer, each on its own connection, until none is left or
/// `until` (then the caller probes again).
async fn send_old(
    addr: SocketAddr,
    q: &mut Pending,
    rx: &mut mpsc::Receiver<Bytes>,
    st: &PeerStats,
    ctx: &Arc<LinkCtx>,
    until: Instant,
) -> Result<(), String> {
    while let Some(item) = q.front_mut() {
        if Instant::now() >= until {
            return Ok(());
        }
        let (frame, c) = (item.frame.clone(), ctx.clone());
        let signed = tokio::task::spawn_blocking(move || signed_copy(&c.key, &frame))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        let signed = match signed {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cluster frame cannot be signed for an old peer");
                item.sends = MAX_SENDS;
                return Err(e);
            }
        };
        match send_one(addr, &signed).await {
            Ok(()) => {
                if item.sends > 0 {
                    st.resent.fetch_add(1, Ordering::Relaxed);
                }
                q.pop_front();
                for c in [&st.sent, &st.single, &st.acked] {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                if e.written {
                    item.sends += 1;
                }
                return Err(e.error);
            }
        }
        take_queued(rx, q, 0);
    }
    Ok(())
}

/// Writes frames on one link connection and takes the peer's acknowledgements until it fails
/// or the queue closes. Unacknowledged frames go back to the front of `q`. Also says whether
/// the peer acknowledged anything on this connection.
async fn pump(
    mut rd: ControlReader,
    mut w: BufWriter<OwnedWriteHalf>,
    rx: &mut mpsc::Receiver<Bytes>,
    q: &mut Pending,
    st: &PeerStats,
) -> (Ended, bool) {
    // Written on this connection and not yet acknowledged, in order; `acked` counts the rest.
    let mut inflight = Pending::new();
    let mut acked: u64 = 0;
    let ended = loop {
        if !q.is_empty() {
            if rd.peek() == Peeked::Closed {
                break Ended::Failed("peer closed the connection".into());
            }
            let n = q.len().min(BATCH_FRAMES);
            let start = inflight.len();
            for mut item in q.drain(..n) {
                if item.sends > 0 {
                    st.resent.fetch_add(1, Ordering::Relaxed);
                }
                item.sends += 1;
                inflight.push_back(item);
            }
            let write = async {
                for item in inflight.range(start..) {
                    put_frame(&mut w, &item.frame).await?;
                }
                w.flush().await
            };
            match tokio::time::timeout(WRITE_TIMEOUT, write).await {
                Ok(Ok(())) => add(&st.sent, n),
                Ok(Err(e)) => break Ended::Failed(e.to_string()),
                Err(_) => break Ended::Failed("write timed out".into()),
            }
        }
        let room = q.len() + inflight.len() < QUEUE_FRAMES;
        tokio::select! {
            f = rx.recv(), if room => match f {
                Some(frame) => q.push_back(Item { frame, sends: 0 }),
                None => break Ended::Closed,
            },
            c = rd.next() => match c {
                Ok(Control::Ack(k)) => {
                    let Some(n) = k
                        .checked_sub(acked)
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|n| *n <= inflight.len())
                    else {
                        break Ended::Failed(format!("ack of {k} frames, {} written", acked + inflight.len() as u64));
                    };
                    inflight.drain(..n);
                    acked = k;
                    add(&st.acked, n);
                }
                Ok(Control::Hello) => {}
                Err(e) => break Ended::Failed(e),
            },
        }
        take_queued(rx, q, inflight.len());
    };
    while let Some(item) = inflight.pop_back() {
        q.push_front(item);
    }
    (ended, acked > 0)
}
