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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::conn::{read_message, ConnError, WsConn};
use super::upgrade::{server_frame, CLOSE_NORMAL, CLOSE_PROTOCOL, CLOSE_TOO_BIG};
use super::{WsDecoder, WsError, WsMessage, OP_BINARY, OP_CLOSE, OP_PONG};
use crate::salt_stream::request::{Accepted, Core, Delivered, ReplierCore, Settings, Shared};
use crate::salt_stream::{drive, note_end, write_loop, End, Stream, WriteRules, HANDSHAKE_TIMEOUT};
use crate::transport::{
    Incoming, ProtocolRefusals, Replier, ReplyError, ReplyTo, Request, RequestServer,
    RequestServerOptions,
};
use crate::zmtp::socket::Cut;

/// Salt's `ws` request server on one port ([`RequestServer`]). Dropping it closes every
/// connection.
pub struct WsRequestServer {
    core: Core,
}

impl WsRequestServer {
    /// Binds `addr` with Salt's backlog and starts accepting.
    pub async fn bind(addr: SocketAddr, opts: &RequestServerOptions) -> std::io::Result<Self> {
        Ok(WsRequestServer {
            core: Core::bind(addr, opts, serve).await?,
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

async fn serve(tcp: TcpStream, c: Accepted) {
    const WHAT: &str = "ws request peer";
    let start = Instant::now();
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
    let (conn, out_rx) = shared.register();
    let (rd, wr) = tokio::io::split(stream);
    let writer = tokio::spawn(write_loop(wr, out_rx, write_rules(settings.write_timeout)));
    // The first message is due within the limit of the accept, as on `tcp`.
    let first = settings
        .payload_timeout
        .map(|t| t.saturating_sub(start.elapsed()));
    let reader = read_loop(
        rd,
        dec,
        conn.peer_key(),
        &shared,
        &tx,
        &settings,
        &conn.trusted,
        &conn.out,
        first,
    );
    // The writer may send what is queued (a close frame) for a moment.
    let end = drive(writer, reader, Some(Duration::from_secs(1)), || {
        conn.leave()
    })
    .await;
    note_end(&shared.refusals, peer, WHAT, end);
}

/// How a websocket's frames are written: a close frame is the last.
pub(crate) fn write_rules(timeout: Option<Duration>) -> WriteRules {
    WriteRules {
        timeout,
        stalled: |t| format!("the peer read nothing for {t:?} (a frame could not be written)"),
        closes: |frame| frame.first().is_some_and(|b| b & 0x0f == OP_CLOSE),
    }
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
    key: Bytes,
    shared: &Shared,
    tx: &mpsc::Sender<Delivered>,
    settings: &Settings,
    trusted: &AtomicBool,
    out: &mpsc::WeakSender<Bytes>,
    first: Option<Duration>,
) -> End {
    let mut idle = first;
    loop {
        dec.set_max(settings.max_for(trusted.load(Ordering::Relaxed)));
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
                peer: key.clone(),
                head: Bytes::new(),
            },
            payload: Bytes::from(data),
            received: Instant::now(),
        };
        let is_trusted = trusted.load(Ordering::Relaxed);
        if shared.deliver(tx, request, len, is_trusted).await.is_err() {
            return End::Closed;
        }
    }
}

impl RequestServer for WsRequestServer {
    type Replier = WsReplier;

    fn local_addr(&self) -> SocketAddr {
        self.core.local_addr
    }

    async fn recv(&mut self) -> Option<Incoming> {
        self.core.recv().await
    }

    fn replier(&self) -> WsReplier {
        WsReplier(ReplierCore(self.core.shared.clone()))
    }

    fn refusals(&self) -> Arc<ProtocolRefusals> {
        self.core.shared.refusals.clone()
    }
}

/// Replies to a [`WsRequestServer`]'s connections ([`Replier`]).
#[derive(Clone)]
pub struct WsReplier(ReplierCore);

impl Replier for WsReplier {
    async fn reply(&self, to: &ReplyTo, payload: Bytes) -> Result<(), ReplyError> {
        self.0
            .send(to, Bytes::from(server_frame(OP_BINARY, &payload)))
            .await
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

#[cfg(all(test, feature = "tls"))]
#[path = "tls_tests.rs"]
mod tls_tests;
