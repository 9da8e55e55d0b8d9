//! Transport of the cluster's peer protocol: a persistent connection per peer for forwarded
//! publishes and returns, and the receiving loop that reads frames until EOF.
//!
//! * Sending: one task per joined peer ([`Links::send`]) owns a bounded queue
//!   ([`QUEUE_FRAMES`]) and one TCP connection. Request handlers enqueue without waiting (they run
//!   on blocking threads); a full queue drops the frame, counted in [`PeerStats::dropped`], with
//!   a warning at most every 10 s. The task writes whatever is queued back to back and flushes
//!   when the queue is momentarily empty. A failed connect is retried with back-off (100 ms
//!   doubling to 5 s). A failed write is retried once on the next connection, for the whole batch
//!   that failed (so a peer may see a frame twice: a publish is then not published again, a return
//!   is stored again under the same name).
//! * What can be lost: there are no acknowledgements, so frames the peer had received but not
//!   handled when it died, and frames written after the peer closed and before its FIN or RST
//!   reached us (the task watches the connection for EOF and checks again before each batch).
//!   A queue that is full drops too.
//! * Receiving ([`serve`]): frames are read in a loop until EOF, so an old
//!   one-message-per-connection sender still works. A healthy connection may be idle for hours
//!   (TCP keepalive finds a vanished peer); once a frame's first byte arrived, the rest must
//!   arrive within [`FRAME_TIMEOUT`]. Each frame is limited to [`MAX_PEER_MESSAGE`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::cluster::{handle_message, MAX_PEER_MESSAGE};
use crate::state::{lock, unix_now, Master};
use saltgate_wire::accept::{tune_stream, AcceptOptions, Acceptor, Keepalive};

/// Frames queued per peer before new ones are dropped.
pub const QUEUE_FRAMES: usize = 65_536;
/// Once a frame has started, the rest of it must arrive within this.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// A write (one batch) that takes longer than this fails the connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Frames written before a flush at most (a batch is also what a failed write re-sends).
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
    /// Frames dropped: the queue was full, or a re-sent batch failed again.
    pub dropped: AtomicU64,
    /// Frames written and flushed.
    pub sent: AtomicU64,
    /// Outgoing link connections made.
    pub connects: AtomicU64,
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
    /// Counts a drop; warns at most every [`WARN_EVERY_SECS`].
    fn drop_frames(&self, peer: &str, n: u64, why: &str) {
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

struct Link {
    addr: SocketAddr,
    tx: mpsc::Sender<Bytes>,
}

/// The sending side: one link (task + queue + connection) per peer.
#[derive(Default)]
pub struct Links {
    links: Mutex<HashMap<String, Link>>,
}

impl Links {
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
            rt.spawn(run_link(peer.to_string(), addr, rx, stats.clone()));
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

/// TCP keepalive on peer links, both ends (60 s idle, then 3 probes 10 s apart), so a peer that
/// vanished without a FIN is found on an idle link.
const PEER_KEEPALIVE: Keepalive = Keepalive {
    time: Duration::from_secs(60),
    interval: Some(Duration::from_secs(10)),
    retries: Some(3),
};

/// Why a connection's pump ended.
enum Ended {
    /// The queue's sender is gone (the peer was replaced or the master stops).
    Closed,
    Failed(String),
}

async fn run_link(
    peer: String,
    addr: SocketAddr,
    mut rx: mpsc::Receiver<Bytes>,
    st: Arc<PeerStats>,
) {
    // The batch being written; after a failed write it is re-sent once on the next connection.
    let mut batch: Vec<Bytes> = Vec::new();
    let mut retried = false;
    let mut backoff = BACKOFF_MIN;
    loop {
        if batch.is_empty() {
            // No connection is kept for a link with nothing to send after a failure.
            match rx.recv().await {
                Some(f) => batch.push(f),
                None => return,
            }
        }
        let stream = match tokio::time::timeout(FRAME_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(%peer, %addr, error = %e, "cluster link connect failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
            Err(_) => {
                tracing::debug!(%peer, %addr, "cluster link connect timed out");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_MIN;
        tune_stream(&stream, Some(&PEER_KEEPALIVE));
        st.connects.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%peer, %addr, "cluster link connected");
        match pump(stream, &mut rx, &mut batch, &mut retried, &st).await {
            Ended::Closed => return,
            Ended::Failed(e) => {
                tracing::info!(%peer, %addr, error = %e, pending = batch.len(), "cluster link lost; reconnecting");
                if retried && !batch.is_empty() {
                    st.drop_frames(&peer, batch.len() as u64, "write failed twice");
                    batch.clear();
                }
                retried = !batch.is_empty();
            }
        }
    }
}

/// True when the peer has closed the connection (or it failed), without waiting: a
/// non-blocking peek on the socket itself (tokio's `try_read` trusts the reactor's cached
/// readiness, which may not have seen the FIN yet).
fn peer_closed(rd: &tokio::net::tcp::OwnedReadHalf) -> bool {
    let sock = socket2::SockRef::from(rd.as_ref());
    let mut b = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    match sock.peek(&mut b) {
        Ok(0) => true,
        // A peer sends nothing on a link; bytes are ignored.
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// Writes batches on one connection until it fails or the queue closes.
async fn pump(
    stream: TcpStream,
    rx: &mut mpsc::Receiver<Bytes>,
    batch: &mut Vec<Bytes>,
    retried: &mut bool,
    st: &PeerStats,
) -> Ended {
    let (mut rd, wr) = stream.into_split();
    let mut w = BufWriter::with_capacity(64 * 1024, wr);
    loop {
        if !batch.is_empty() {
            if peer_closed(&rd) {
                return Ended::Failed("peer closed the connection".into());
            }
            let write = async {
                for f in batch.iter() {
                    let len = u32::try_from(f.len()).map_err(std::io::Error::other)?;
                    w.write_all(&len.to_be_bytes()).await?;
                    w.write_all(f).await?;
                }
                w.flush().await
            };
            match tokio::time::timeout(WRITE_TIMEOUT, write).await {
                Ok(Ok(())) => {
                    st.sent.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    batch.clear();
                    *retried = false;
                }
                Ok(Err(e)) => return Ended::Failed(e.to_string()),
                Err(_) => return Ended::Failed("write timed out".into()),
            }
        }
        let mut b = [0u8; 64];
        tokio::select! {
            f = rx.recv() => match f {
                Some(f) => batch.push(f),
                None => return Ended::Closed,
            },
            r = rd.read(&mut b) => match r {
                Ok(0) => return Ended::Failed("peer closed the connection".into()),
                Ok(_) => continue,
                Err(e) => return Ended::Failed(e.to_string()),
            },
        }
        while batch.len() < BATCH_FRAMES {
            match rx.try_recv() {
                Ok(f) => batch.push(f),
                Err(_) => break,
            }
        }
    }
}

/// Reads one frame; `Ok(None)` at a clean EOF between frames. Waits for the first byte without a
/// time limit, then [`FRAME_TIMEOUT`] for the rest.
pub async fn read_frame_idle(s: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut hdr = [0u8; 4];
    if s.read(&mut hdr[..1]).await? == 0 {
        return Ok(None);
    }
    let rest = async {
        s.read_exact(&mut hdr[1..]).await?;
        let len = u32::from_be_bytes(hdr) as usize;
        if len > MAX_PEER_MESSAGE {
            return Err(std::io::Error::other(format!(
                "peer message of {len} bytes is over the limit"
            )));
        }
        let mut buf = vec![0u8; len];
        s.read_exact(&mut buf).await?;
        Ok(buf)
    };
    match tokio::time::timeout(FRAME_TIMEOUT, rest).await {
        Ok(r) => r.map(Some),
        Err(_) => Err(std::io::Error::other("partial peer frame timed out")),
    }
}

pub(crate) async fn write_frame(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(data.len()).map_err(|_| std::io::Error::other("message too large"))?;
    s.write_u32(len).await?;
    s.write_all(data).await?;
    s.flush().await
}

/// Accepts peer connections and handles their frames, each connection until EOF. wire's
/// acceptor sets `TCP_NODELAY` and the keepalive, and backs off on descriptor exhaustion.
pub async fn serve(listener: TcpListener, master: Arc<Master>) {
    let mut acceptor = Acceptor::new(
        listener,
        AcceptOptions {
            keepalive: Some(PEER_KEEPALIVE),
            ..AcceptOptions::default()
        },
    );
    loop {
        let (s, from, _permit) = acceptor.accept().await;
        if let Some(cl) = &master.cluster {
            cl.stats.accepted.fetch_add(1, Ordering::Relaxed);
        }
        tokio::spawn(connection(s, from, master.clone()));
    }
}

async fn connection(mut s: TcpStream, from: SocketAddr, m: Arc<Master>) {
    loop {
        let frame = match read_frame_idle(&mut s).await {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(%from, error = %e, "cluster connection closed");
                return;
            }
        };
        let m2 = m.clone();
        let reply = tokio::task::spawn_blocking(move || handle_message(&m2, &frame)).await;
        let stats = m.cluster.as_ref().map(|c| &c.stats);
        match reply {
            Ok(Ok(r)) => {
                if let Some(st) = stats {
                    st.handled.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(r) = r {
                    if write_frame(&mut s, &r).await.is_err() {
                        return;
                    }
                }
            }
            Ok(Err(e)) => {
                if let Some(st) = stats {
                    st.refused.fetch_add(1, Ordering::Relaxed);
                }
                tracing::warn!(%from, reason = %e, "cluster message refused");
            }
            Err(e) => {
                tracing::error!(error = %e, "cluster handler failed");
                return;
            }
        }
    }
}
