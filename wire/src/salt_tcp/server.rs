//! Salt's `tcp` request server (`salt/transport/tcp.py`, `RequestServer` and
//! `SaltMessageServer` in 3008.5), the seam's [`RequestServer`] for `transport: tcp`, over TCP
//! or TLS (Salt's `ssl`, feature `tls`).
//!
//! A connection carries `{"head": {...}, "body": <envelope>}` msgpack maps back to back, no
//! length prefix. Each message is a request: its `body` crosses the seam as the payload (the
//! envelope's own bytes, sliced out of the frame, never re-encoded), and its reply is written as
//! `{"head": <the request's head, byte for byte>, "body": <reply>}` (Salt's
//! `frame_msg(reply, header=header)`), so the client matches it by its `mid`. A connection may
//! have several requests in flight; replies go out in the order they are made.
//!
//! The protections are the ZeroMQ ROUTER's ([`crate::zmtp::Router`]), each cut counted in
//! [`ProtocolRefusals`] and never a panic:
//! * connections hold a permit of each [`crate::accept::ConnectionLimit`] (the listener's cap,
//!   the process budget);
//! * a message is refused as soon as its declared size passes the limit (`untrusted_max_payload`
//!   until [`Replier::trust`], then `max_payload`), before it is buffered (`oversized`);
//! * a message must end within `payload_timeout` of its first byte (`frame_timeout`), and a new
//!   connection must send its first byte within the same time (`handshake_timeout`, as the TLS
//!   handshake's own deadline);
//! * bytes that are not Salt's framing (a ZeroMQ minion's greeting, garbage) close the
//!   connection (`malformed`);
//! * a reply that cannot be written within `write_timeout` closes it (`write_timeout`);
//! * the receive queue (`queue`) and the untrusted byte budget (`untrusted_queue_bytes`) are
//!   backpressure: a peer is not read while its message waits for room (nothing dropped).
//!
//! There is no heartbeat in `tcp`: an idle connection stays open (TCP keepalive finds dead ones),
//! as Salt's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::client::Stream;
use super::frame_raw::{reply_frame, split_frame, RawError};
use crate::accept::{Acceptor, ConnectionPermit};
use crate::transport::{
    Incoming, ProtocolRefusals, Replier, ReplyError, ReplyTo, Request, RequestServer,
    RequestServerOptions,
};
use crate::zmtp::socket::Cut;

/// Longest a TLS handshake may take (the ZeroMQ sockets' `handshake_timeout`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Replies queued for one connection before [`Replier::reply`] waits.
const REPLY_QUEUE: usize = 64;

/// A message received, with its share of the untrusted byte budget (given back when taken).
struct Delivered {
    request: Request,
    _budget: Option<OwnedSemaphorePermit>,
}

struct Conn {
    tx: mpsc::Sender<Bytes>,
    trusted: Arc<AtomicBool>,
}

struct Shared {
    conns: Mutex<HashMap<u64, Conn>>,
    next_conn: AtomicU64,
    paused: AtomicU64,
    refusals: Arc<ProtocolRefusals>,
    /// `untrusted_queue_bytes` (one permit a byte), with its size.
    budget: Option<(Arc<Semaphore>, usize)>,
}

impl Shared {
    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn conn_key(to: &ReplyTo) -> Option<u64> {
    <[u8; 8]>::try_from(&to.peer[..])
        .ok()
        .map(u64::from_be_bytes)
}

/// Salt's `tcp` request server on one port ([`RequestServer`]). Dropping it closes every
/// connection.
pub struct TcpRequestServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Delivered>,
    accept: JoinHandle<()>,
}

impl Drop for TcpRequestServer {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.conns().clear();
    }
}

/// What every connection of a server shares.
struct Settings {
    max: usize,
    untrusted_max: usize,
    payload_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    #[cfg(feature = "tls")]
    tls: Option<super::tls_server::TlsServer>,
}

impl TcpRequestServer {
    /// Binds `addr` with Salt's backlog and starts accepting.
    pub async fn bind(addr: SocketAddr, opts: &RequestServerOptions) -> std::io::Result<Self> {
        let (local_addr, mut acceptor) = Acceptor::bind_salt(
            addr,
            Some(crate::accept::Keepalive::salt()),
            opts.max_connections,
        )?;
        if let Some(l) = &opts.shared_limit {
            acceptor = acceptor.with_limit(l.clone());
        }
        let shared = Arc::new(Shared {
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            paused: AtomicU64::new(0),
            refusals: Arc::default(),
            budget: opts
                .untrusted_queue_bytes
                .map(|b| b.clamp(1, u32::MAX as usize))
                .map(|b| (Arc::new(Semaphore::new(b)), b)),
        });
        let settings = Arc::new(Settings {
            max: opts.max_payload,
            untrusted_max: opts
                .untrusted_max_payload
                .map_or(opts.max_payload, |u| u.min(opts.max_payload)),
            payload_timeout: opts.payload_timeout,
            write_timeout: opts.write_timeout,
            #[cfg(feature = "tls")]
            tls: opts.tls.clone(),
        });
        let (tx, rx) = mpsc::channel(opts.queue.max(1));
        let sh = shared.clone();
        let accept = acceptor.spawn_each(move |stream, peer, permit| {
            serve(
                stream,
                peer,
                sh.clone(),
                tx.clone(),
                settings.clone(),
                permit,
            )
        });
        Ok(TcpRequestServer {
            local_addr,
            shared,
            rx,
            accept,
        })
    }

    /// Bytes of `untrusted_queue_bytes` not drawn now (`None` without a budget).
    pub fn untrusted_budget_available(&self) -> Option<usize> {
        self.shared
            .budget
            .as_ref()
            .map(|(s, _)| s.available_permits())
    }
}

/// The TLS handshake when configured, within [`HANDSHAKE_TIMEOUT`]; a failure is counted and
/// `None`.
pub(crate) async fn handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    #[cfg(feature = "tls")] tls: Option<&super::tls_server::TlsServer>,
    refusals: &ProtocolRefusals,
    what: &str,
) -> Option<Stream> {
    #[cfg(feature = "tls")]
    if let Some(tls) = tls {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
        return match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
            Ok(Ok(s)) => Some(Box::pin(s) as Stream),
            Ok(Err(e)) => {
                let detail = format!(
                    "TLS handshake: {e} (the minion's `ssl` must match the master's: a CA \
                     both trust, a client certificate when cert_reqs asks for one)"
                );
                refusals.note_cut(peer, what, Cut::Malformed, &detail);
                None
            }
            Err(_) => {
                let detail = format!("no TLS handshake within {HANDSHAKE_TIMEOUT:?}");
                refusals.note_cut(peer, what, Cut::Handshake, &detail);
                None
            }
        };
    }
    let _ = (peer, refusals, what);
    Some(Box::pin(tcp) as Stream)
}

/// The cut a [`RawError`] is counted as.
pub(crate) fn cut_of(e: &RawError) -> Cut {
    match e {
        RawError::TooLarge { .. } => Cut::Oversized,
        _ => Cut::Malformed,
    }
}

async fn serve(
    tcp: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Delivered>,
    settings: Arc<Settings>,
    _permit: ConnectionPermit,
) {
    const WHAT: &str = "tcp request peer";
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
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(REPLY_QUEUE);
    let trusted = Arc::new(AtomicBool::new(false));
    shared.conns().insert(
        id,
        Conn {
            tx: out_tx,
            trusted: trusted.clone(),
        },
    );
    let (rd, wr) = tokio::io::split(stream);
    let mut writer = tokio::spawn(write_loop(wr, out_rx, settings.write_timeout));
    let reader = read_loop(rd, id, &shared, &tx, &settings, &trusted);
    let end = tokio::select! {
        end = reader => end,
        w = &mut writer => w.unwrap_or(End::Closed),
    };
    writer.abort();
    shared.conns().remove(&id);
    match end {
        End::Closed => tracing::debug!(%peer, "tcp request peer closed"),
        End::Cut(class, detail) => shared.refusals.note_cut(peer, WHAT, class, &detail),
    }
}

/// Why a connection ended.
pub(crate) enum End {
    /// The peer closed it, or the server went away.
    Closed,
    /// A cut, counted.
    Cut(Cut, String),
}

async fn write_loop(
    mut wr: tokio::io::WriteHalf<Stream>,
    mut rx: mpsc::Receiver<Bytes>,
    write_timeout: Option<Duration>,
) -> End {
    while let Some(frame) = rx.recv().await {
        let write = async {
            wr.write_all(&frame).await?;
            wr.flush().await
        };
        match write_timeout {
            Some(t) => match tokio::time::timeout(t, write).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return End::Closed,
                Err(_) => {
                    return End::Cut(
                        Cut::Stalled,
                        format!("the peer read nothing for {t:?} (a reply could not be written)"),
                    )
                }
            },
            None => {
                if write.await.is_err() {
                    return End::Closed;
                }
            }
        }
    }
    End::Closed
}

/// Sleeps until `deadline`, or for ever without one.
pub(crate) async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn read_loop(
    mut rd: tokio::io::ReadHalf<Stream>,
    id: u64,
    shared: &Shared,
    tx: &mpsc::Sender<Delivered>,
    settings: &Settings,
    trusted: &AtomicBool,
) -> End {
    let mut buf = BytesMut::with_capacity(8 * 1024);
    // The first byte is due within `payload_timeout` of the accept; a message's last within it
    // of its first.
    let mut first = true;
    let mut deadline = settings.payload_timeout.map(|t| Instant::now() + t);
    loop {
        let max = if trusted.load(Ordering::Relaxed) {
            settings.max
        } else {
            settings.untrusted_max
        };
        // Whole messages first.
        loop {
            match super::scan(&buf, max) {
                Ok(Some(len)) => {
                    let frame = buf.split_to(len).freeze();
                    let (head, body) = match split_frame(&frame) {
                        Ok(x) => x,
                        Err(e) => return End::Cut(cut_of(&e), framing_detail(&e, &frame)),
                    };
                    let request = Request {
                        reply_to: ReplyTo {
                            peer: Bytes::copy_from_slice(&id.to_be_bytes()),
                            head,
                        },
                        payload: body,
                        received: Instant::now(),
                    };
                    let budget = match (&shared.budget, trusted.load(Ordering::Relaxed)) {
                        (Some((sem, total)), false) => {
                            let share = len.clamp(1, *total) as u32;
                            let permit = match sem.clone().try_acquire_many_owned(share) {
                                Ok(p) => p,
                                Err(_) => {
                                    shared.paused.fetch_add(1, Ordering::Relaxed);
                                    match sem.clone().acquire_many_owned(share).await {
                                        Ok(p) => p,
                                        Err(_) => return End::Closed,
                                    }
                                }
                            };
                            Some(permit)
                        }
                        _ => None,
                    };
                    let d = Delivered {
                        request,
                        _budget: budget,
                    };
                    match tx.try_send(d) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(d)) => {
                            shared.paused.fetch_add(1, Ordering::Relaxed);
                            if tx.send(d).await.is_err() {
                                return End::Closed;
                            }
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => return End::Closed,
                    }
                    first = false;
                    // The next message's clock starts at its first byte.
                    deadline = match (buf.is_empty(), settings.payload_timeout) {
                        (false, Some(t)) => Some(Instant::now() + t),
                        _ => None,
                    };
                }
                Ok(None) if buf.len() > max => {
                    let e = RawError::TooLarge {
                        size: buf.len(),
                        limit: max,
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
        buf.reserve(16 * 1024);
        tokio::select! {
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) | Err(_) => return End::Closed,
                Ok(_) => {}
            },
            _ = until(deadline) => {
                let t = settings.payload_timeout.unwrap_or_default();
                return if first && buf.is_empty() {
                    End::Cut(Cut::Handshake, format!("no request within {t:?} of the connect"))
                } else {
                    End::Cut(Cut::Slow, format!(
                        "a request was not completed within {t:?} of its first byte \
                         (raise saltgate_frame_timeout)"
                    ))
                };
            }
        };
        // A new message's first byte (the first message's clock started at the accept).
        if deadline.is_none() {
            deadline = settings.payload_timeout.map(|t| Instant::now() + t);
        }
    }
}

/// A framing error's message, with a hint when the peer speaks ZeroMQ.
pub(crate) fn framing_detail(e: &RawError, first_bytes: &[u8]) -> String {
    if super::looks_like_zmtp(first_bytes) {
        format!(
            "{e}: the peer sent a ZMTP greeting (it speaks `transport: zeromq`); set the \
             minion's `transport` to the master's (tcp)"
        )
    } else {
        e.to_string()
    }
}

impl RequestServer for TcpRequestServer {
    type Replier = TcpReplier;

    fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    async fn recv(&mut self) -> Option<Incoming> {
        self.rx.recv().await.map(|d| Incoming::Request(d.request))
    }

    fn replier(&self) -> TcpReplier {
        TcpReplier {
            shared: self.shared.clone(),
        }
    }

    fn refusals(&self) -> Arc<ProtocolRefusals> {
        self.shared.refusals.clone()
    }
}

/// Replies to a [`TcpRequestServer`]'s connections ([`Replier`]).
#[derive(Clone)]
pub struct TcpReplier {
    shared: Arc<Shared>,
}

impl Replier for TcpReplier {
    async fn reply(&self, to: &ReplyTo, payload: Bytes) -> Result<(), ReplyError> {
        let tx = conn_key(to)
            .and_then(|k| self.shared.conns().get(&k).map(|c| c.tx.clone()))
            .ok_or(ReplyError::UnknownPeer)?;
        tx.send(reply_frame(&to.head, &payload))
            .await
            .map_err(|_| ReplyError::PeerGone)
    }

    fn trust(&self, to: &ReplyTo) {
        if let Some(c) =
            conn_key(to).and_then(|k| self.shared.conns().get(&k).map(|c| c.trusted.clone()))
        {
            c.store(true, Ordering::Relaxed);
        }
    }

    fn is_connected(&self, to: &ReplyTo) -> bool {
        conn_key(to).is_some_and(|k| self.shared.conns().contains_key(&k))
    }

    fn paused_inbound(&self) -> u64 {
        self.shared.paused.load(Ordering::Relaxed)
    }

    fn peer_count(&self) -> usize {
        self.shared.conns().len()
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
