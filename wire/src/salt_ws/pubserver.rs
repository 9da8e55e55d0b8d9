//! Salt's `ws` publish server (`salt/transport/ws.py`, `PublishServer` in 3008.5), the seam's
//! [`PublishServer`] for `transport: ws`, over TCP or TLS (feature `tls`).
//!
//! A subscriber upgrades on any path (Salt's client uses `/ws`). Every publish is one binary
//! message holding `salt.payload.dumps(payload)`: the serialised envelope as a msgpack `bin`,
//! encoded once and queued for **every** subscriber, whatever the targets: Salt's ws
//! `publish_payload` ignores its `topic_list` and the minions filter (there is no hello, so no
//! presence either). A full queue (`hwm`) drops the publish for that subscriber only and counts
//! it; a write stalled [`DRAIN_TIMEOUT`] closes it.
//!
//! A subscriber sends nothing but control frames: its messages are bounded ([`MAX_HELLO`] and
//! [`HELLO_TIMEOUT`] of the first byte, as on `tcp`), pings are answered, a close is echoed, a
//! text `"close"` closes (Salt's server only reads past data). A bad upgrade or invalid frames
//! close it, counted in [`ProtocolRefusals`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::conn::{read_message, WsConn};
use super::server::{close_code, close_with, cut_of, write_loop};
use super::upgrade::{server_frame, CLOSE_NORMAL};
use super::{WsDecoder, WsMessage, OP_BINARY, OP_PONG};
use crate::accept::{Acceptor, ConnectionPermit};
use crate::salt_tcp::client::Stream;
use crate::salt_tcp::server::{handshake, End};
use crate::transport::{
    ProtocolRefusals, PublishReport, PublishServer, PublishServerOptions, Targets,
};

pub use crate::salt_tcp::pubserver::{DRAIN_TIMEOUT, HELLO_TIMEOUT, MAX_HELLO};

struct Slot {
    tx: mpsc::Sender<Bytes>,
    conn: u64,
}

type Slots = Arc<Vec<Arc<Slot>>>;

struct Shared {
    slots: Mutex<Slots>,
    dropped: AtomicU64,
    next_conn: AtomicU64,
    refusals: Arc<ProtocolRefusals>,
}

impl Shared {
    fn snapshot(&self) -> Slots {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn update(&self, f: impl FnOnce(&mut Vec<Arc<Slot>>)) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        f(Arc::make_mut(&mut slots));
    }
}

struct Settings {
    hwm: usize,
    handshake_timeout: Duration,
    #[cfg(feature = "tls")]
    tls: Option<crate::salt_tcp::tls_server::TlsServer>,
}

/// Salt's `ws` publish server on one port ([`PublishServer`]). Dropping it closes every
/// subscriber.
pub struct WsPublisher {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for WsPublisher {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.update(|s| s.clear());
    }
}

impl WsPublisher {
    /// Binds `addr` with Salt's backlog and starts accepting subscribers.
    pub async fn bind(addr: SocketAddr, opts: &PublishServerOptions) -> std::io::Result<Self> {
        let (local_addr, mut acceptor) =
            Acceptor::bind_salt(addr, opts.keepalive, opts.max_connections)?;
        if let Some(l) = &opts.shared_limit {
            acceptor = acceptor.with_limit(l.clone());
        }
        let shared = Arc::new(Shared {
            slots: Mutex::new(Arc::new(Vec::new())),
            dropped: AtomicU64::new(0),
            next_conn: AtomicU64::new(0),
            refusals: Arc::default(),
        });
        let settings = Arc::new(Settings {
            hwm: opts.hwm.max(1),
            handshake_timeout: opts.handshake_timeout,
            #[cfg(feature = "tls")]
            tls: opts.tls.clone(),
        });
        let sh = shared.clone();
        let accept = acceptor.spawn_each(move |stream, peer, permit| {
            serve(stream, peer, sh.clone(), settings.clone(), permit)
        });
        Ok(WsPublisher {
            local_addr,
            shared,
            accept,
        })
    }
}

/// The binary message a publish goes out as: the payload as a msgpack `bin`
/// (`salt.payload.dumps(payload)`), one frame.
pub fn publish_message(payload: &[u8]) -> Bytes {
    let mut bin = Vec::with_capacity(payload.len() + 5);
    let n = payload.len();
    if n <= 0xff {
        bin.extend_from_slice(&[0xc4, n as u8]);
    } else if n <= 0xffff {
        bin.push(0xc5);
        bin.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        // The publisher's limits are far below 4 GiB, msgpack's bound.
        bin.push(0xc6);
        bin.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
    }
    bin.extend_from_slice(payload);
    Bytes::from(server_frame(OP_BINARY, &bin))
}

async fn serve(
    tcp: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    settings: Arc<Settings>,
    _permit: ConnectionPermit,
) {
    const WHAT: &str = "ws publish subscriber";
    let Some(stream) = handshake(
        tcp,
        peer,
        #[cfg(feature = "tls")]
        settings.tls.as_ref(),
        &shared.refusals,
        WHAT,
    )
    .await
    else {
        return;
    };
    let ws = match WsConn::accept(stream, MAX_HELLO, settings.handshake_timeout).await {
        Ok((ws, _)) => ws,
        Err(e) => {
            if let Some((class, detail)) = cut_of(&e, "nothing") {
                shared.refusals.note_cut(peer, WHAT, class, &detail);
            }
            return;
        }
    };
    let (stream, dec) = ws.into_parts();
    let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel(settings.hwm);
    // The slot holds the only strong sender: dropping the publisher (which clears the slots)
    // ends the writer, and with it the connection.
    let weak = tx.downgrade();
    let slot = Arc::new(Slot { tx, conn });
    shared.update(|s| s.push(slot));
    let (rd, wr) = tokio::io::split(stream);
    let mut writer = tokio::spawn(write_loop(wr, rx, Some(DRAIN_TIMEOUT)));
    let end = tokio::select! {
        end = read_loop(rd, dec, &weak) => end,
        w = &mut writer => w.unwrap_or(End::Closed),
    };
    shared.update(|s| s.retain(|x| x.conn != conn));
    if tokio::time::timeout(Duration::from_secs(1), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    match end {
        End::Closed => tracing::debug!(%peer, "ws publish subscriber closed"),
        End::Cut(class, detail) => shared.refusals.note_cut(peer, WHAT, class, &detail),
    }
}

async fn read_loop(
    mut rd: tokio::io::ReadHalf<Stream>,
    mut dec: WsDecoder,
    out: &mpsc::WeakSender<Bytes>,
) -> End {
    loop {
        let m = match read_message(&mut rd, &mut dec, None, Some(HELLO_TIMEOUT)).await {
            Ok(m) => m,
            Err(e) => {
                return match cut_of(&e, "nothing") {
                    None => End::Closed,
                    Some((class, detail)) => {
                        close_with(out, close_code(&e));
                        End::Cut(class, detail)
                    }
                }
            }
        };
        match m {
            WsMessage::Ping(p) => {
                // A full queue drops the pong, as it would drop a publish.
                let Some(out) = out.upgrade() else {
                    return End::Closed;
                };
                let _ = out.try_send(Bytes::from(server_frame(OP_PONG, &p)));
            }
            WsMessage::Close(code) => {
                close_with(out, code.filter(|c| *c != 1005).unwrap_or(CLOSE_NORMAL));
                return End::Closed;
            }
            WsMessage::Text(t) if t == b"close" => {
                close_with(out, CLOSE_NORMAL);
                return End::Closed;
            }
            _ => {}
        }
    }
}

impl PublishServer for WsPublisher {
    fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Every subscriber, whatever `targets` says (Salt's ws publisher has no topics).
    fn publish(&self, payload: Bytes, _targets: Targets<'_>) -> PublishReport {
        let mut framed: Option<Bytes> = None;
        let mut report = PublishReport::default();
        for slot in self.shared.snapshot().iter() {
            let msg = framed
                .get_or_insert_with(|| publish_message(&payload))
                .clone();
            match slot.tx.try_send(msg) {
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

    fn subscriber_count(&self) -> usize {
        self.shared.snapshot().len()
    }

    fn dropped_total(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    fn refusals(&self) -> Arc<ProtocolRefusals> {
        self.shared.refusals.clone()
    }
}

#[cfg(test)]
#[path = "pubserver_tests.rs"]
mod tests;
