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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::client::Stream;
use super::frame_raw::{reply_frame, split_frame, RawError};
use crate::salt_stream::request::{Accepted, Core, Delivered, ReplierCore, Settings, Shared};
use crate::salt_stream::{drive, note_end, until, write_loop, End, WriteRules};
use crate::transport::{
    Incoming, ProtocolRefusals, Replier, ReplyError, ReplyTo, Request, RequestServer,
    RequestServerOptions,
};
use crate::zmtp::socket::Cut;

pub use crate::salt_stream::HANDSHAKE_TIMEOUT;

/// Salt's `tcp` request server on one port ([`RequestServer`]). Dropping it closes every
/// connection.
pub struct TcpRequestServer {
    core: Core,
}

impl TcpRequestServer {
    /// Binds `addr` with Salt's backlog and starts accepting.
    pub async fn bind(addr: SocketAddr, opts: &RequestServerOptions) -> std::io::Result<Self> {
        Ok(TcpRequestServer {
            core: Core::bind(addr, opts, serve).await?,
        })
    }

    /// Bytes of `untrusted_queue_bytes` not drawn now (`None` without a budget).
    pub fn untrusted_budget_available(&self) -> Option<usize> {
        self.core.untrusted_budget_available()
    }
}

/// The cut a [`RawError`] is counted as.
pub(crate) fn cut_of(e: &RawError) -> Cut {
    match e {
        RawError::TooLarge { .. } => Cut::Oversized,
        _ => Cut::Malformed,
    }
}

async fn serve(tcp: TcpStream, c: Accepted) {
    const WHAT: &str = "tcp request peer";
    let Some(stream) = c.handshake(tcp, WHAT).await else {
        return;
    };
    let Accepted {
        peer,
        shared,
        tx,
        settings,
        permit: _permit,
    } = c;
    let (conn, out_rx) = shared.register();
    let (rd, wr) = tokio::io::split(stream);
    let rules = WriteRules {
        timeout: settings.write_timeout,
        stalled: |t| format!("the peer read nothing for {t:?} (a reply could not be written)"),
        closes: |_| false,
    };
    let writer = tokio::spawn(write_loop(wr, out_rx, rules));
    let reader = read_loop(rd, conn.peer_key(), &shared, &tx, &settings, &conn.trusted);
    let end = drive(writer, reader, None, || conn.leave()).await;
    note_end(&shared.refusals, peer, WHAT, end);
}

async fn read_loop(
    mut rd: tokio::io::ReadHalf<Stream>,
    key: Bytes,
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
        let max = settings.max_for(trusted.load(Ordering::Relaxed));
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
                            peer: key.clone(),
                            head,
                        },
                        payload: body,
                        received: Instant::now(),
                    };
                    let is_trusted = trusted.load(Ordering::Relaxed);
                    if shared.deliver(tx, request, len, is_trusted).await.is_err() {
                        return End::Closed;
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
        self.core.local_addr
    }

    async fn recv(&mut self) -> Option<Incoming> {
        self.core.recv().await
    }

    fn replier(&self) -> TcpReplier {
        TcpReplier(ReplierCore(self.core.shared.clone()))
    }

    fn refusals(&self) -> Arc<ProtocolRefusals> {
        self.core.shared.refusals.clone()
    }
}

/// Replies to a [`TcpRequestServer`]'s connections ([`Replier`]).
#[derive(Clone)]
pub struct TcpReplier(ReplierCore);

impl Replier for TcpReplier {
    async fn reply(&self, to: &ReplyTo, payload: Bytes) -> Result<(), ReplyError> {
        self.0.send(to, reply_frame(&to.head, &payload)).await
    }

    fn trust(&self, to: &ReplyTo) {
        self.0.trust(to)
    }

    fn is_connected(&self, to: &ReplyTo) -> bool {
        self.0.is_connected(to)
    }

    fn paused_inbound(&self) -> u64 {
        self.0.paused_inbound()
    }

    fn peer_count(&self) -> usize {
        self.0.peer_count()
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
