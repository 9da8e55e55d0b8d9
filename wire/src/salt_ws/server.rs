//! Salt's `ws` request server (`salt/transport/ws.py`, `RequestServer.handle_message` in
//! 3008.5), the seam's [`RequestServer`] for `transport: ws`, over TCP or TLS (Salt's `ssl`,
//! feature `tls`).
//!
//! A connection is an HTTP/1.1 upgrade on any path (Salt's aiohttp server has one handler for
//! all), then client frames. Each binary message is a request: its bytes are the envelope
//! (`salt.payload.dumps(load)`) and cross the seam as they came; its reply is one binary message
//! holding the reply payload (`salt.payload.dumps(reply)`). Replies go out in the order they are
//! made (Salt's handler answers one message after the other; its clients send one at a time). A
//! text `"close"` closes the websocket, as in Salt; other text is ignored; a ping is answered
//! with a pong; a close frame is echoed and ends the connection.
//!
//! The protections are the `tcp` server's ([`crate::salt_tcp::server`]), counted in the same
//! [`ProtocolRefusals`] classes: a message over `untrusted_max_payload` (until
//! [`Replier::trust`], then `max_payload`) is refused on its frame header, before it is
//! buffered (`oversized`, close code 1009); the upgrade and the first message are due within
//! `payload_timeout` of the accept (`handshake_timeout`), a message's last byte within it of its
//! first (`frame_timeout`); a bad upgrade (answered `400`, naming why), a ZMTP greeting, an
//! unmasked or otherwise invalid frame close it (`malformed`); a reply not written within
//! `write_timeout` closes it (`write_timeout`); the queue and `untrusted_queue_bytes` are
//! backpressure.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::conn::{read_message, ConnError, WsConn};
use super::upgrade::{server_frame, CLOSE_NORMAL, CLOSE_PROTOCOL, CLOSE_TOO_BIG};
use super::{WsDecoder, WsError, WsMessage, OP_BINARY, OP_CLOSE, OP_PONG};
use crate::accept::{Acceptor, ConnectionPermit};
use crate::salt_tcp::client::Stream;
use crate::salt_tcp::server::{handshake, End, HANDSHAKE_TIMEOUT};
use crate::transport::{
    Incoming, ProtocolRefusals, Replier, ReplyError, ReplyTo, Request, RequestServer,
    RequestServerOptions,
};
use crate::zmtp::socket::Cut;

/// Frames queued for one connection before [`Replier::reply`] waits.
const REPLY_QUEUE: usize = 64;

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

struct Settings {
    max: usize,
    untrusted_max: usize,
    payload_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    #[cfg(feature = "tls")]
    tls: Option<crate::salt_tcp::tls_server::TlsServer>,
}

/// Salt's `ws` request server on one port ([`RequestServer`]). Dropping it closes every
/// connection.
pub struct WsRequestServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Delivered>,
    accept: JoinHandle<()>,
}

impl Drop for WsRequestServer {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.conns().clear();
    }
}

impl WsRequestServer {
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
        Ok(WsRequestServer {
            local_addr,
            shared,
            rx,
            accept,
        })
    }
}

/// The cut a failed websocket start or read is counted as; `None`: the peer just went away.
pub(crate) fn cut_of(e: &ConnError, what_timeout: &str) -> Option<(Cut, String)> {
    match e {
        ConnError::Io(_) | ConnError::Eof => None,
        ConnError::Ws(WsError::TooLarge { .. }) => Some((Cut::Oversized, e.to_string())),
        ConnError::Ws(_) => Some((Cut::Malformed, e.to_string())),
        ConnError::Zmtp => Some((
            Cut::Malformed,
            "the peer sent a ZMTP greeting (it speaks `transport: zeromq`); set the minion's \
             `transport` to the master's (ws)"
                .into(),
        )),
        ConnError::Timeout(t) | ConnError::Idle(t) => Some((
            Cut::Handshake,
            format!("no websocket upgrade and {what_timeout} within {t:?} of the connect"),
        )),
        ConnError::Slow(t) => Some((
            Cut::Slow,
            format!(
                "a message was not completed within {t:?} of its first byte (raise \
                 saltgate_frame_timeout)"
            ),
        )),
    }
}

/// The close code for a cut.
pub(crate) fn close_code(e: &ConnError) -> u16 {
    match e {
        ConnError::Ws(WsError::TooLarge { .. }) => CLOSE_TOO_BIG,
        _ => CLOSE_PROTOCOL,
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
    const WHAT: &str = "ws request peer";
    let start = Instant::now();
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
    let limit = settings.payload_timeout.unwrap_or(HANDSHAKE_TIMEOUT);
    let ws = match WsConn::accept(stream, settings.untrusted_max, limit).await {
        Ok((ws, _)) => ws,
        Err(e) => {
            if let Some((class, detail)) = cut_of(&e, "no request") {
                shared.refusals.note_cut(peer, WHAT, class, &detail);
            }
            return;
        }
    };
    let (stream, dec) = ws.into_parts();
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(REPLY_QUEUE);
    let trusted = Arc::new(AtomicBool::new(false));
    // The table holds the only strong sender: dropping the server (which clears it) ends the
    // writer, and with it the connection.
    let out = out_tx.downgrade();
    shared.conns().insert(
        id,
        Conn {
            tx: out_tx,
            trusted: trusted.clone(),
        },
    );
    let (rd, wr) = tokio::io::split(stream);
    let mut writer = tokio::spawn(write_loop(wr, out_rx, settings.write_timeout));
    // The first message is due within the limit of the accept, as on `tcp`.
    let first = settings
        .payload_timeout
        .map(|t| t.saturating_sub(start.elapsed()));
    let reader = read_loop(rd, dec, id, &shared, &tx, &settings, &trusted, &out, first);
    let end = tokio::select! {
        end = reader => end,
        w = &mut writer => w.unwrap_or(End::Closed),
    };
    shared.conns().remove(&id);
    // Let the writer send what is queued (a close frame) for a moment.
    if tokio::time::timeout(Duration::from_secs(1), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    match end {
        End::Closed => tracing::debug!(%peer, "ws request peer closed"),
        End::Cut(class, detail) => shared.refusals.note_cut(peer, WHAT, class, &detail),
    }
}

pub(crate) async fn write_loop(
    mut wr: tokio::io::WriteHalf<Stream>,
    mut rx: mpsc::Receiver<Bytes>,
    write_timeout: Option<Duration>,
) -> End {
    while let Some(frame) = rx.recv().await {
        let closing = frame.first().is_some_and(|b| b & 0x0f == OP_CLOSE);
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
                        format!("the peer read nothing for {t:?} (a frame could not be written)"),
                    )
                }
            },
            None => {
                if write.await.is_err() {
                    return End::Closed;
                }
            }
        }
        if closing {
            let _ = wr.shutdown().await;
            return End::Closed;
        }
    }
    End::Closed
}

/// Queues a close frame (best effort: a full queue is skipped).
pub(crate) fn close_with(out: &mpsc::WeakSender<Bytes>, code: u16) {
    if let Some(out) = out.upgrade() {
        let _ = out.try_send(Bytes::from(server_frame(OP_CLOSE, &code.to_be_bytes())));
    }
}

#[allow(clippy::too_many_arguments)]
async fn read_loop(
    mut rd: tokio::io::ReadHalf<Stream>,
    mut dec: WsDecoder,
    id: u64,
    shared: &Shared,
    tx: &mpsc::Sender<Delivered>,
    settings: &Settings,
    trusted: &AtomicBool,
    out: &mpsc::WeakSender<Bytes>,
    first: Option<Duration>,
) -> End {
    let mut idle = first;
    loop {
        let is_trusted = trusted.load(Ordering::Relaxed);
        dec.set_max(if is_trusted {
            settings.max
        } else {
            settings.untrusted_max
        });
        let m = match read_message(&mut rd, &mut dec, idle, settings.payload_timeout).await {
            Ok(m) => m,
            Err(e) => {
                return match cut_of(&e, "no request") {
                    None => End::Closed,
                    Some((class, detail)) => {
                        close_with(out, close_code(&e));
                        End::Cut(class, detail)
                    }
                };
            }
        };
        idle = None;
        let data = match m {
            WsMessage::Binary(data) => data,
            WsMessage::Text(t) => {
                if t == b"close" {
                    close_with(out, CLOSE_NORMAL);
                    return End::Closed;
                }
                continue;
            }
            WsMessage::Ping(p) => {
                let Some(out) = out.upgrade() else {
                    return End::Closed;
                };
                if out
                    .send(Bytes::from(server_frame(OP_PONG, &p)))
                    .await
                    .is_err()
                {
                    return End::Closed;
                }
                continue;
            }
            WsMessage::Pong(_) => continue,
            WsMessage::Close(code) => {
                close_with(out, code.filter(|c| *c != 1005).unwrap_or(CLOSE_NORMAL));
                return End::Closed;
            }
        };
        let len = data.len();
        let request = Request {
            reply_to: ReplyTo {
                peer: Bytes::copy_from_slice(&id.to_be_bytes()),
                head: Bytes::new(),
            },
            payload: Bytes::from(data),
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
    }
}

impl RequestServer for WsRequestServer {
    type Replier = WsReplier;

    fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    async fn recv(&mut self) -> Option<Incoming> {
        self.rx.recv().await.map(|d| Incoming::Request(d.request))
    }

    fn replier(&self) -> WsReplier {
        WsReplier {
            shared: self.shared.clone(),
        }
    }

    fn refusals(&self) -> Arc<ProtocolRefusals> {
        self.shared.refusals.clone()
    }
}

/// Replies to a [`WsRequestServer`]'s connections ([`Replier`]).
#[derive(Clone)]
pub struct WsReplier {
    shared: Arc<Shared>,
}

impl Replier for WsReplier {
    async fn reply(&self, to: &ReplyTo, payload: Bytes) -> Result<(), ReplyError> {
        let tx = conn_key(to)
            .and_then(|k| self.shared.conns().get(&k).map(|c| c.tx.clone()))
            .ok_or(ReplyError::UnknownPeer)?;
        tx.send(Bytes::from(server_frame(OP_BINARY, &payload)))
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

#[cfg(all(test, feature = "tls"))]
#[path = "tls_tests.rs"]
mod tls_tests;
