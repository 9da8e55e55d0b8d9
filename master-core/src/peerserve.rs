//! The receiving side of the cluster's peer protocol: the peer port (`cluster_pool_port`).
//!
//! * [`serve`]: frames are read in a loop until EOF. A connection that starts with
//!   a hello is answered and acknowledged (a frame counts once [`crate::cluster::handle_message`] returned:
//!   stored and published, or refused); any other is an old sender's, never written to. A
//!   healthy connection may be idle for hours (TCP keepalive finds a vanished peer); once a
//!   frame's first byte arrived, the rest must arrive within [`FRAME_TIMEOUT`]. Each frame is
//!   limited to [`MAX_PEER_MESSAGE`], its buffer growing as its bytes arrive.
//! * Until a connection has delivered a frame that authenticates (one [`crate::cluster::handle_message`]
//!   accepted: only a member knows the cluster key), it is *unauthenticated*: it must do so
//!   within `saltgate_cluster_auth_timeout` (10 s) of its accept, and at most
//!   `saltgate_cluster_max_unauthenticated` (64) such connections are served at once; one over
//!   the cap is closed at once. Both cuts are counted (`reason`: `auth_timeout`,
//!   `unauthenticated_cap`). So a flood of silent connections holds at most that many
//!   descriptors for at most that long, and the request port and the CLI keep theirs.
//!
//! What it needs of the master is a [`PeerPort`]: the cluster membership, where accepted
//! publishes and returns go (a [`PeerSink`], wired by the master's composition root), the
//! refusal counters and the two limits above.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::cluster::{handle_message, ClusterState, PeerSink};
use crate::metrics::{Refusals, Refused};
use crate::peerproto::{ack_frame, hello_frame, is_hello, peek, Peeked, ACK_EVERY};
use crate::peerwire::{read_frame_idle, write_frame, FRAME_TIMEOUT, PEER_KEEPALIVE};
use saltgate_wire::accept::{AcceptOptions, Acceptor};

/// What the peer port needs of the master.
pub struct PeerPort {
    pub cluster: Arc<ClusterState>,
    /// Where accepted publishes and returns go.
    pub sink: Arc<dyn PeerSink>,
    pub refusals: Arc<Refusals>,
    /// `saltgate_cluster_max_unauthenticated`.
    pub max_unauthenticated: usize,
    /// `saltgate_cluster_auth_timeout`.
    pub auth_timeout: Duration,
}

impl std::fmt::Debug for PeerPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerPort")
            .field("cluster", &self.cluster)
            .field("max_unauthenticated", &self.max_unauthenticated)
            .field("auth_timeout", &self.auth_timeout)
            .finish()
    }
}

/// Accepts peer connections and handles their frames, each connection until EOF. wire's
/// acceptor sets `TCP_NODELAY` and the keepalive, and backs off on descriptor exhaustion.
pub async fn serve(listener: TcpListener, port: Arc<PeerPort>) {
    let mut acceptor = Acceptor::new(
        listener,
        AcceptOptions {
            keepalive: Some(PEER_KEEPALIVE),
            ..AcceptOptions::default()
        },
    );
    let unauthenticated = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let cap = port.max_unauthenticated;
    loop {
        let (s, from, _permit) = acceptor.accept().await;
        port.cluster.stats.accepted.fetch_add(1, Ordering::Relaxed);
        if unauthenticated.fetch_add(1, Ordering::AcqRel) >= cap {
            unauthenticated.fetch_sub(1, Ordering::AcqRel);
            port.refusals.count(Refused::PeerUnauthenticatedCap);
            tracing::debug!(%from, cap, "cluster connection closed: too many unauthenticated");
            drop(s);
            continue;
        }
        let slot = Unauthenticated(Some(unauthenticated.clone()));
        tokio::spawn(serve_guarded(s, from, port.clone(), slot));
    }
}

/// A connection's place among the unauthenticated ones, given back when it authenticates or
/// ends.
struct Unauthenticated(Option<Arc<std::sync::atomic::AtomicUsize>>);

impl Unauthenticated {
    fn authenticated(&mut self) {
        if let Some(n) = self.0.take() {
            n.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Unauthenticated {
    fn drop(&mut self) {
        self.authenticated();
    }
}

/// [`serve_connection`] holding `slot` until the connection authenticates.
async fn serve_guarded(
    s: TcpStream,
    from: SocketAddr,
    m: Arc<PeerPort>,
    mut slot: Unauthenticated,
) {
    serve_with(s, from, m, &mut slot).await
}

/// Handles the frames of one accepted peer connection until EOF. A connection that starts with
/// a hello is answered and acknowledged; any other (an old sender's, or a join) is only
/// answered where a frame has a reply (a join's `join_ok`).
pub async fn serve_connection(s: TcpStream, from: SocketAddr, m: Arc<PeerPort>) {
    serve_with(s, from, m, &mut Unauthenticated(None)).await
}

async fn serve_with(
    mut s: TcpStream,
    from: SocketAddr,
    m: Arc<PeerPort>,
    slot: &mut Unauthenticated,
) {
    let cl = &m.cluster;
    // Until a frame authenticates, everything must happen by this deadline.
    let auth_timeout = m.auth_timeout;
    let auth_deadline = Instant::now() + auth_timeout;
    let mut authenticated = false;
    // A frame of this connection was refused (and counted as such).
    let mut refused_here = false;
    let st = cl.stats.clone();
    // Frames handled on this connection, and how many of them were acknowledged.
    let (mut handled, mut acked) = (0u64, 0u64);
    let mut acking = false;
    loop {
        let read = if authenticated {
            read_frame_idle(&mut s).await
        } else {
            match tokio::time::timeout_at(auth_deadline, read_frame_idle(&mut s)).await {
                Ok(r) => r,
                Err(_) => {
                    // A connection whose frame was refused is counted once, for that refusal.
                    if !refused_here {
                        m.refusals.count(Refused::PeerAuthTimeout);
                    }
                    tracing::debug!(%from, ?auth_timeout, "cluster connection closed: nothing authenticated in time");
                    return;
                }
            }
        };
        let frame = match read {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                if e.kind() == std::io::ErrorKind::InvalidData {
                    m.refusals.count(Refused::PeerOversized);
                }
                tracing::warn!(%from, error = %e, "cluster connection closed");
                return;
            }
        };
        if handled == 0 && !acking && is_hello(&frame) {
            if write_frame(&mut s, &hello_frame(&cl.own_id)).await.is_err() {
                return;
            }
            acking = true;
            continue;
        }
        let m2 = m.clone();
        let reply = tokio::task::spawn_blocking(move || {
            handle_message(&m2.cluster, &*m2.sink, &m2.refusals, &frame)
        })
        .await;
        handled += 1;
        match reply {
            Ok(Ok(r)) => {
                st.handled.fetch_add(1, Ordering::Relaxed);
                if !authenticated {
                    authenticated = true;
                    slot.authenticated();
                }
                if let Some(r) = r {
                    if write_frame(&mut s, &r).await.is_err() {
                        return;
                    }
                }
            }
            Ok(Err(e)) => {
                st.refused.fetch_add(1, Ordering::Relaxed);
                refused_here = true;
                tracing::warn!(%from, reason = %e, "cluster message refused");
            }
            Err(e) => {
                // Acknowledged all the same: sent again, it would fail again.
                st.refused.fetch_add(1, Ordering::Relaxed);
                m.refusals.count(Refused::PeerMasterError);
                tracing::error!(%from, error = %e, "cluster handler failed");
            }
        }
        let waiting = peek(socket2::SockRef::from(&s)) == Peeked::Data;
        if acking && (handled - acked >= ACK_EVERY || !waiting) {
            let ack = ack_frame(handled);
            let wrote = tokio::time::timeout(FRAME_TIMEOUT, write_frame(&mut s, &ack)).await;
            if !matches!(wrote, Ok(Ok(()))) {
                return;
            }
            acked = handled;
        }
    }
}
