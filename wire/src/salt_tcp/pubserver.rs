//! Salt's `tcp` publish server (`salt/transport/tcp.py`, `PubServer` in 3008.5), the seam's
//! [`PublishServer`] for `transport: tcp`, over TCP or TLS (feature `tls`).
//!
//! Every publish is framed once, `{"head": {}, "body": <envelope as bin>}` (Salt's
//! `frame_msg(package)`), and queued for each subscriber it is for; a full queue (`hwm`) drops
//! it for that subscriber only and counts it (as the ZeroMQ [`crate::zmtp::Publisher`]; Salt
//! instead closes a subscriber whose writes do not drain within `publish_drain_timeout`, which
//! this server does for a write stalled that long, [`DRAIN_TIMEOUT`]).
//!
//! **Presence and targeting** (Salt's `presence_callback`). A minion's first message on the
//! publish port is its id, encrypted with the publish key: `{"enc": "aes", "load": {"id",
//! "tok"}}` (`AsyncPubChannel.send_id`). The [`PresenceCheck`] the server was given (the master
//! holds the keys) decrypts it and verifies the `tok` against the minion's accepted key; only
//! then is the connection tagged with the id. A publish with [`Targets::Minions`] goes only to
//! the connections tagged with one of the ids — and, as Salt's `if topic_list:`, an **empty**
//! list goes to every connection. [`Targets::All`] goes to every connection, tagged or not.
//!
//! A subscriber sends nothing else: its messages are bounded ([`MAX_HELLO`]), each must end
//! within the frame deadline of its first byte, and bytes that are not Salt's framing close it;
//! each cut is counted in [`ProtocolRefusals`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::client::Stream;
use super::frame_raw::{publish_frame, split_frame, RawError};
use super::server::{cut_of, framing_detail, handshake, until, End};
use crate::accept::{Acceptor, ConnectionPermit};
use crate::transport::{
    ProtocolRefusals, PublishReport, PublishServer, PublishServerOptions, Targets,
};
use crate::zmtp::socket::Cut;

/// Largest message a subscriber may send (a hello is a few hundred bytes).
pub const MAX_HELLO: usize = 64 * 1024;

/// A subscriber's message must end this long after its first byte.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Salt's `publish_drain_timeout` default: a write to a subscriber that makes no progress this
/// long closes it.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Reads a subscriber's hello (the `body` of its message, msgpack) and returns the minion id it
/// proves, if any: the master's `presence_callback`. It may block (RSA, a key file): the server
/// runs it on the blocking pool.
#[derive(Clone)]
pub struct PresenceCheck(pub Arc<VerifyHello>);

/// What a [`PresenceCheck`] runs: a hello's body in, the proved minion id out.
pub type VerifyHello = dyn Fn(&[u8]) -> Option<String> + Send + Sync;

impl PresenceCheck {
    pub fn new(f: impl Fn(&[u8]) -> Option<String> + Send + Sync + 'static) -> Self {
        PresenceCheck(Arc::new(f))
    }
}

impl std::fmt::Debug for PresenceCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PresenceCheck")
    }
}

struct Slot {
    tx: mpsc::Sender<Bytes>,
    /// The minion id the subscriber proved (`None` until then).
    id: Mutex<Option<String>>,
    conn: u64,
}

impl Slot {
    fn id_is(&self, ids: &[&str]) -> bool {
        self.id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_deref()
            .is_some_and(|id| ids.contains(&id))
    }
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
    presence: Option<PresenceCheck>,
    #[cfg(feature = "tls")]
    tls: Option<super::tls_server::TlsServer>,
}

/// Salt's `tcp` publish server on one port ([`PublishServer`]). Dropping it closes every
/// subscriber.
pub struct TcpPublisher {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for TcpPublisher {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.update(|s| s.clear());
    }
}

impl TcpPublisher {
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
            presence: opts.presence.clone(),
            #[cfg(feature = "tls")]
            tls: opts.tls.clone(),
        });
        let sh = shared.clone();
        let accept = acceptor.spawn_each(move |stream, peer, permit| {
            serve(stream, peer, sh.clone(), settings.clone(), permit)
        });
        Ok(TcpPublisher {
            local_addr,
            shared,
            accept,
        })
    }

    /// The minion ids subscribers have proved, one per tagged connection.
    pub fn present(&self) -> Vec<String> {
        self.shared
            .snapshot()
            .iter()
            .filter_map(|s| s.id.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .collect()
    }
}

async fn serve(
    tcp: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    settings: Arc<Settings>,
    _permit: ConnectionPermit,
) {
    const WHAT: &str = "tcp publish subscriber";
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
    let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel(settings.hwm);
    let slot = Arc::new(Slot {
        tx,
        id: Mutex::new(None),
        conn,
    });
    shared.update(|s| s.push(slot.clone()));
    let (rd, wr) = tokio::io::split(stream);
    let mut writer = tokio::spawn(write_loop(wr, rx));
    let end = tokio::select! {
        end = read_loop(rd, &slot, settings.presence.as_ref(), peer) => end,
        w = &mut writer => w.unwrap_or(End::Closed),
    };
    writer.abort();
    shared.update(|s| s.retain(|x| x.conn != conn));
    match end {
        End::Closed => tracing::debug!(%peer, "tcp publish subscriber closed"),
        End::Cut(class, detail) => shared.refusals.note_cut(peer, WHAT, class, &detail),
    }
}

async fn write_loop(mut wr: tokio::io::WriteHalf<Stream>, mut rx: mpsc::Receiver<Bytes>) -> End {
    while let Some(frame) = rx.recv().await {
        let write = async {
            wr.write_all(&frame).await?;
            wr.flush().await
        };
        match tokio::time::timeout(DRAIN_TIMEOUT, write).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return End::Closed,
            Err(_) => {
                return End::Cut(
                    Cut::Stalled,
                    format!("a publish could not be written for {DRAIN_TIMEOUT:?}"),
                )
            }
        }
    }
    End::Closed
}

async fn read_loop(
    mut rd: tokio::io::ReadHalf<Stream>,
    slot: &Slot,
    presence: Option<&PresenceCheck>,
    peer: SocketAddr,
) -> End {
    let mut buf = BytesMut::with_capacity(1024);
    let mut deadline: Option<Instant> = None;
    loop {
        loop {
            match super::scan(&buf, MAX_HELLO) {
                Ok(Some(len)) => {
                    let frame = buf.split_to(len).freeze();
                    let body = match split_frame(&frame) {
                        Ok((_, body)) => body,
                        Err(e) => return End::Cut(cut_of(&e), framing_detail(&e, &frame)),
                    };
                    if let Some(check) = presence {
                        let check = check.0.clone();
                        let id = tokio::task::spawn_blocking(move || check(&body))
                            .await
                            .ok()
                            .flatten();
                        match id {
                            Some(id) => {
                                tracing::debug!(%peer, minion = %id, "tcp subscriber said its id");
                                *slot.id.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
                            }
                            None => {
                                tracing::debug!(%peer, "tcp subscriber's hello not verified")
                            }
                        }
                    }
                    deadline = (!buf.is_empty()).then(|| Instant::now() + HELLO_TIMEOUT);
                }
                Ok(None) if buf.len() > MAX_HELLO => {
                    let e = RawError::TooLarge {
                        size: buf.len(),
                        limit: MAX_HELLO,
                    };
                    return End::Cut(Cut::Oversized, e.to_string());
                }
                Ok(None) => break,
                Err(e) => {
                    let e = RawError::from(e);
                    return End::Cut(cut_of(&e), framing_detail(&e, &buf));
                }
            }
        }
        buf.reserve(4096);
        tokio::select! {
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) | Err(_) => return End::Closed,
                Ok(_) => {}
            },
            _ = until(deadline) => return End::Cut(Cut::Slow, format!(
                "a message was not completed within {HELLO_TIMEOUT:?} of its first byte"
            )),
        }
        if deadline.is_none() {
            deadline = Some(Instant::now() + HELLO_TIMEOUT);
        }
    }
}

impl PublishServer for TcpPublisher {
    fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    fn publish(&self, payload: Bytes, targets: Targets<'_>) -> PublishReport {
        let ids = match targets {
            Targets::Minions(ids) if !ids.is_empty() => Some(ids),
            _ => None,
        };
        let mut framed: Option<Bytes> = None;
        let mut report = PublishReport::default();
        for slot in self.shared.snapshot().iter() {
            if ids.is_some_and(|ids| !slot.id_is(ids)) {
                continue;
            }
            let msg = framed
                .get_or_insert_with(|| publish_frame(&payload))
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
