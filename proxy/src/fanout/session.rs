//! One minion on the publish port in fanout mode: saltgate is its PUB peer. Greeting (as
//! server, NULL mechanism), READY with `Socket-Type: PUB`, then the minion's SUBSCRIBE/CANCEL
//! (ZMTP 3.1 commands or legacy `0x01`/`0x00` frames), PING/PONG both ways, and the hub's
//! messages written from the session's bounded queue. The session ends when the minion leaves,
//! breaks the protocol, stays silent past the heartbeat timeout, or at shutdown: never because
//! a master went away.
//!
//! What a minion (authenticated by nobody: the publish port is open to anyone) can make a
//! session hold is bounded ([`SessionLimits`], `listeners.publish`): frames of `max_frame`
//! bytes, `max_topics` topics of `max_topic_bytes` together, a frame no longer than
//! `frame_timeout` from its first byte to its last, and a write that makes no progress for the
//! heartbeat timeout (a minion that does not read) closes the session. Each cut is counted in
//! `saltgate_fanout_sessions_cut_total{reason}`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use saltgate_config::Role;
use saltgate_wire::transport::zeromq::frame::{Frame, FrameDecoder};
use saltgate_wire::transport::zeromq::greeting::{self, Greeting};
use saltgate_wire::transport::zeromq::{Command, Properties, SocketType, ZmtpError};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::hub::Hub;
pub(crate) use super::steady::SessionLimits;
use super::steady::{End, Hello, Steady};
use crate::data::listener::Permits;
use crate::session::context::DataPlane;

/// Minion sessions closed on an error: at most one line per interval (a network blip can close
/// thousands at once).
static CLOSED_LOG: crate::ops::ratelimit::LogLimit =
    crate::ops::ratelimit::LogLimit::new(crate::ops::ratelimit::LOG_EVERY);

/// Reads until one whole frame is decoded.
async fn read_frame(
    io: &mut TcpStream,
    rbuf: &mut BytesMut,
    dec: &FrameDecoder,
) -> Result<Frame, ZmtpError> {
    loop {
        if let Some(f) = dec.decode(rbuf)? {
            return Ok(f);
        }
        if io.read_buf(rbuf).await? == 0 {
            return Err(ZmtpError::Eof);
        }
    }
}

/// Greeting and READY exchange as the PUB side; returns whether the peer speaks ZMTP 3.1, and
/// the `Identity` of its READY (a Salt minion's id; empty when none).
async fn handshake(
    io: &mut TcpStream,
    rbuf: &mut BytesMut,
    dec: &FrameDecoder,
) -> Result<(bool, Bytes), ZmtpError> {
    let mut w = BytesMut::new();
    Command::Ready(Properties::default().with("Socket-Type", SocketType::Pub.as_str()))
        .encode_frame(&mut w);
    let peer = greeting::exchange_then(io, &Greeting::ours(true), &w).await?;
    let props = match read_frame(io, rbuf, dec).await? {
        Frame::Command(body) => match Command::parse(&body)? {
            Command::Ready(p) => p,
            Command::Error(r) => {
                return Err(ZmtpError::PeerError(
                    String::from_utf8_lossy(&r).into_owned(),
                ))
            }
            other => {
                return Err(ZmtpError::ExpectedReady(
                    String::from_utf8_lossy(other.name()).into_owned(),
                ))
            }
        },
        Frame::Message { .. } => return Err(ZmtpError::ExpectedReady("a message".into())),
    };
    let raw = props.get("Socket-Type").cloned().unwrap_or_default();
    if SocketType::parse(&raw).is_none_or(|t| !SocketType::Pub.compatible_with(t)) {
        return Err(ZmtpError::IncompatibleSocketType {
            ours: SocketType::Pub,
            peer: String::from_utf8_lossy(&raw).into_owned(),
        });
    }
    let identity = props.get("Identity").cloned().unwrap_or_default();
    Ok((peer.supports_3_1(), identity))
}

/// The handshake, bounded by `handshake_timeout`, and ended early by the hub's stop or
/// `shutdown`.
async fn greet(
    hub: &Hub,
    shutdown: &CancellationToken,
    io: &mut TcpStream,
    peer: SocketAddr,
    limits: SessionLimits,
) -> Result<Hello, End> {
    let opened = Instant::now();
    let dec = FrameDecoder::new(limits.max_frame);
    let mut rbuf = BytesMut::new();
    let hs = tokio::select! {
        r = tokio::time::timeout(hub.opts.handshake_timeout, handshake(io, &mut rbuf, &dec)) => r,
        _ = hub.stop.cancelled() => return Err(End::Shutdown),
        _ = shutdown.cancelled() => return Err(End::Shutdown),
    };
    let (peer_3_1, identity) = match hs {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => return Err(End::Error(ZmtpError::Timeout("handshake"))),
    };
    Ok(Hello {
        peer,
        peer_3_1,
        // Copied: a slice would keep the handshake's read buffer alive with the session.
        identity: Bytes::copy_from_slice(&identity),
        rbuf,
        limits,
        opened,
    })
}

/// Serves fan-out session `id`, holding `permits` until it ends; the caller runs it in the
/// session's span ([`crate::session::span`]).
///
/// The task's future is what an idle session costs in memory (issue 30), so it holds only what
/// the steady state needs: [`Open`], the timer and [`Steady`] (a hand-written future). The
/// handshake runs in a boxed future of its own, freed when it is done. Not an `async fn`: its
/// arguments would stay in the future after the handshake took them.
pub(super) fn run(
    hub: Arc<Hub>,
    ctx: Arc<DataPlane>,
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    permits: Permits,
) -> impl Future<Output = ()> + Send + 'static {
    let setup = Box::pin(open(hub, ctx, stream, peer, id));
    async move {
        let _permits = permits;
        let Some((open, hello)) = setup.await else {
            return;
        };
        // Any deadline: `Steady` sets it before it is polled.
        let timer = tokio::time::sleep_until(hello.opened);
        tokio::pin!(timer);
        let presence = Some(&*open.ctx.presence);
        let end = Steady::start(&open.hub, presence, &open.io, hello, timer.as_mut()).await;
        open.finish(end);
    }
}

/// A session past its handshake: what its steady state borrows, and what ends with it.
struct Open {
    hub: Arc<Hub>,
    ctx: Arc<DataPlane>,
    io: TcpStream,
    /// Presence pairs a minion with its publish session by address; here every master is its
    /// publish master (`None`: fan-out). Boxed: 48 B less in the task, which puts it in a
    /// smaller size class (`a_fanout_sessions_future_stays_small`).
    _presence: Option<Box<crate::presence::Guard>>,
}

impl Open {
    fn finish(self, end: End) {
        shutdown(&self.io);
        closed(&self.hub, &self.ctx, &end);
    }
}

/// Accept to the end of the handshake; `None`: the session is over already (counted and logged).
async fn open(
    hub: Arc<Hub>,
    ctx: Arc<DataPlane>,
    mut io: TcpStream,
    peer: SocketAddr,
    id: u64,
) -> Option<(Open, Hello)> {
    let handles = ctx.listener(Role::Publish);
    handles.accepted.inc();
    handles.live.inc();
    let presence = ctx
        .presence
        .enabled()
        .then(|| Box::new(ctx.presence.publish_opened(id, peer, None)));
    let limits = SessionLimits::from_config(&ctx.snapshot.load().config.publish);
    match greet(&hub, &ctx.sessions_token, &mut io, peer, limits).await {
        Ok(hello) => Some((
            Open {
                hub,
                ctx,
                io,
                _presence: presence,
            },
            hello,
        )),
        Err(end) => {
            closed(&hub, &ctx, &end);
            None
        }
    }
}

/// Sends the minion our FIN (best effort; the socket closes when dropped).
fn shutdown(io: &TcpStream) {
    let _ = socket2::SockRef::from(io).shutdown(std::net::Shutdown::Write);
}

/// Counts and logs a session's end.
fn closed(hub: &Hub, ctx: &DataPlane, end: &End) {
    ctx.listener(Role::Publish).live.dec();
    if let (Some(reason), Some(m)) = (end.cut(), hub.metrics()) {
        m.cut(reason).inc();
    }
    match end {
        End::Error(e) => {
            if let Some(left_out) = CLOSED_LOG.allow() {
                tracing::info!(target: "saltgate_proxy::pubhub::session", error = %e, left_out, "fanout session closed (one line per 5 s, left_out: how many since the last)")
            }
        }
        other => {
            tracing::debug!(target: "saltgate_proxy::pubhub::session", reason = ?other, "fanout session closed")
        }
    }
}

/// One whole session on `io` (the handshake, then the steady state), for tests: [`run`] is
/// the same, with its task's memory in mind.
#[cfg(test)]
async fn serve(
    hub: &Arc<Hub>,
    shutdown_token: CancellationToken,
    presence: Option<&crate::presence::Presence>,
    io: &mut TcpStream,
    peer: SocketAddr,
    limits: &SessionLimits,
) -> End {
    let hello = match Box::pin(greet(hub, &shutdown_token, io, peer, *limits)).await {
        Ok(h) => h,
        Err(end) => return end,
    };
    let timer = tokio::time::sleep_until(hello.opened);
    tokio::pin!(timer);
    let end = Steady::start(hub, presence, io, hello, timer.as_mut()).await;
    shutdown(io);
    end
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
