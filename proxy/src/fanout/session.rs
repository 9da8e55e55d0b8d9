//! One minion on the publish port in fanout mode: saltgate is its PUB peer. Greeting (as
//! server, NULL mechanism), READY with `Socket-Type: PUB`, then the minion's SUBSCRIBE/CANCEL
//! (ZMTP 3.1 commands or legacy `0x01`/`0x00` frames), PING/PONG both ways, and the hub's
//! messages written from the session's bounded queue. The session ends when the minion leaves,
//! breaks the protocol, stays silent past the heartbeat timeout, or at shutdown: never because
//! a master went away.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use saltgate_config::Role;
use saltgate_wire::zmtp::frame::{Frame, FrameDecoder};
use saltgate_wire::zmtp::greeting::{self, Greeting};
use saltgate_wire::zmtp::{Command, Heartbeat, Properties, SocketType, ZmtpError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::hub::Hub;
use crate::session::context::DataPlane;

/// Minion sessions closed on an error: at most one line per interval (a network blip can close
/// thousands at once).
static CLOSED_LOG: crate::ops::ratelimit::LogLimit =
    crate::ops::ratelimit::LogLimit::new(crate::ops::ratelimit::LOG_EVERY);

/// Why a minion session ended (logged).
#[derive(Debug)]
enum End {
    ClientEof,
    HeartbeatTimeout,
    Shutdown,
    Error(ZmtpError),
}

impl From<ZmtpError> for End {
    fn from(e: ZmtpError) -> Self {
        match e {
            ZmtpError::Eof => End::ClientEof,
            e => End::Error(e),
        }
    }
}

impl From<std::io::Error> for End {
    fn from(e: std::io::Error) -> Self {
        End::Error(ZmtpError::Io(e))
    }
}

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

/// Greeting and READY exchange as the PUB side; returns whether the peer speaks ZMTP 3.1.
async fn handshake(
    io: &mut TcpStream,
    rbuf: &mut BytesMut,
    dec: &FrameDecoder,
) -> Result<bool, ZmtpError> {
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
    Ok(peer.supports_3_1())
}

/// Writes `buf` unless the hub stops or the shutdown grace runs out first: a minion that does
/// not read must not hold the shutdown drain (a write to it can block for ever).
async fn write(
    io: &mut TcpStream,
    buf: &[u8],
    stop: &CancellationToken,
    shutdown: &CancellationToken,
) -> Result<(), End> {
    tokio::select! {
        r = io.write_all(buf) => r.map_err(End::from),
        _ = stop.cancelled() => Err(End::Shutdown),
        _ = shutdown.cancelled() => Err(End::Shutdown),
    }
}

pub(super) async fn run(hub: Arc<Hub>, ctx: Arc<DataPlane>, stream: TcpStream, peer: SocketAddr) {
    let handles = ctx.listener(Role::Publish);
    handles.accepted.inc();
    handles.live.inc();
    // Presence pairs a minion with its publish session by address; here every master is its
    // publish master (`None`: fan-out).
    let _presence = ctx
        .presence
        .enabled()
        .then(|| ctx.presence.publish_opened(ctx.session_id(), peer, None));
    let hwm = ctx.snapshot.load().config.publish.hwm as usize;
    let end = serve(&hub, ctx.sessions_token.clone(), stream, peer, hwm).await;
    handles.live.dec();
    match &end {
        End::Error(e) => {
            if let Some(left_out) = CLOSED_LOG.allow() {
                tracing::info!(target: "saltgate_proxy::pubhub::session", client = %peer, error = %e, left_out, "fanout session closed (one line per 5 s, left_out: how many since the last)")
            }
        }
        other => {
            tracing::debug!(target: "saltgate_proxy::pubhub::session", client = %peer, reason = ?other, "fanout session closed")
        }
    }
}

async fn serve(
    hub: &Arc<Hub>,
    shutdown: CancellationToken,
    mut io: TcpStream,
    peer: SocketAddr,
    hwm: usize,
) -> End {
    let opts = &hub.opts;
    let dec = FrameDecoder::new(opts.max_frame_size);
    let mut rbuf = BytesMut::new();
    let stop = hub.stop.clone();
    let hs = tokio::select! {
        r = tokio::time::timeout(opts.handshake_timeout, handshake(&mut io, &mut rbuf, &dec)) => r,
        _ = stop.cancelled() => return End::Shutdown,
        _ = shutdown.cancelled() => return End::Shutdown,
    };
    let peer_3_1 = match hs {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return e.into(),
        Err(_) => return End::Error(ZmtpError::Timeout("handshake")),
    };
    let (slot, mut rx) = hub.attach(peer, hwm);
    let end = drive(
        hub, &slot, &mut rx, &mut io, rbuf, &dec, peer_3_1, &stop, &shutdown,
    )
    .await;
    hub.detach(slot.id);
    let _ = io.shutdown().await;
    end
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    hub: &Hub,
    slot: &super::hub::Slot,
    rx: &mut tokio::sync::mpsc::Receiver<Bytes>,
    io: &mut TcpStream,
    mut rbuf: BytesMut,
    dec: &FrameDecoder,
    peer_3_1: bool,
    stop: &CancellationToken,
    shutdown: &CancellationToken,
) -> End {
    // A ZMTP 3.0 peer does not know PING: never send it one, never time it out.
    let hb: Option<Heartbeat> = hub
        .opts
        .heartbeat
        .filter(|h| peer_3_1 && !h.interval.is_zero());
    let mut ping = hb.map(|h| {
        let mut t = tokio::time::interval_at(Instant::now() + h.interval, h.interval);
        t.set_missed_tick_behavior(MissedTickBehavior::Delay);
        t
    });
    let mut last_rx = Instant::now();
    let mut remote_ttl: Option<Duration> = None;
    let mut in_multipart = false;
    let mut w = BytesMut::new();
    let mut decode_now = !rbuf.is_empty();
    loop {
        // Frames that arrived with the handshake, or with the last read.
        if decode_now {
            decode_now = false;
            loop {
                let frame = match dec.decode(&mut rbuf) {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => return End::Error(e.into()),
                };
                match frame {
                    Frame::Command(body) => match Command::parse(&body) {
                        Ok(Command::Ping { ttl, context }) => {
                            remote_ttl =
                                (ttl > 0).then(|| Duration::from_millis(u64::from(ttl) * 100));
                            w.clear();
                            Command::Pong { context }.encode_frame(&mut w);
                            if let Err(end) = write(io, &w, stop, shutdown).await {
                                return end;
                            }
                        }
                        Ok(Command::Subscribe(t)) => slot.topics().subscribe(t),
                        Ok(Command::Cancel(t)) => slot.topics().cancel(&t),
                        Ok(Command::Error(r)) => {
                            return End::Error(ZmtpError::PeerError(
                                String::from_utf8_lossy(&r).into_owned(),
                            ))
                        }
                        Ok(_) => {}
                        Err(e) => return End::Error(e.into()),
                    },
                    Frame::Message { body, more } => {
                        // Legacy subscriptions are single-frame messages; a SUB sends nothing else.
                        if !in_multipart && !more {
                            match body.first() {
                                Some(1) => slot.topics().subscribe(body.slice(1..)),
                                Some(0) => slot.topics().cancel(&body[1..]),
                                _ => {}
                            }
                        }
                        in_multipart = more;
                    }
                }
            }
            // Keep no buffer on an idle session.
            if rbuf.is_empty() && rbuf.capacity() > 4096 {
                rbuf = BytesMut::new();
            }
        }
        let limit = match (hb.map(|h| h.timeout.max(h.interval)), remote_ttl) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let deadline = limit.and_then(|l| last_rx.checked_add(l));
        tokio::select! {
            _ = stop.cancelled() => return End::Shutdown,
            _ = shutdown.cancelled() => return End::Shutdown,
            n = io.read_buf(&mut rbuf) => {
                match n {
                    Ok(0) => return End::ClientEof,
                    Ok(_) => last_rx = Instant::now(),
                    Err(e) => return e.into(),
                }
                decode_now = true;
            }
            msg = rx.recv() => match msg {
                Some(m) => {
                    if let Err(end) = write(io, &m, stop, shutdown).await {
                        return end;
                    }
                }
                None => return End::Shutdown,
            },
            _ = async { match ping.as_mut() { Some(t) => { t.tick().await; } None => std::future::pending().await } } => {
                let ttl = hb.map(|h| (h.ttl.as_millis() / 100).min(u128::from(u16::MAX)) as u16).unwrap_or(0);
                w.clear();
                Command::Ping { ttl, context: Bytes::new() }.encode_frame(&mut w);
                if let Err(end) = write(io, &w, stop, shutdown).await {
                    return end;
                }
            }
            _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {
                return End::HeartbeatTimeout;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fanout::hub::HubOptions;
    use saltgate_wire::zmtp::{Connection, HandshakeConfig};

    async fn hub_and_minion(
        opts: HubOptions,
    ) -> (Arc<Hub>, Connection, tokio::task::JoinHandle<End>) {
        let hub = Arc::new(Hub::new(opts));
        let l = tokio::net::TcpListener::bind("127.0.5.20:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let h = hub.clone();
        let task = tokio::spawn(async move {
            let (s, peer) = l.accept().await.unwrap();
            serve(&h, CancellationToken::new(), s, peer, 1000).await
        });
        let c = Connection::connect(addr, &HandshakeConfig::new(SocketType::Sub))
            .await
            .unwrap();
        (hub, c, task)
    }

    #[tokio::test]
    async fn the_hub_pings_a_minion_and_closes_it_when_it_stays_silent() {
        let (_hub, mut c, task) = hub_and_minion(HubOptions {
            heartbeat: Some(Heartbeat {
                interval: Duration::from_millis(50),
                timeout: Duration::from_millis(200),
                ttl: Duration::ZERO,
            }),
            ..HubOptions::default()
        })
        .await;
        let t = Duration::from_secs(10);
        let mut pinged = false;
        // Read (never answer) until the hub closes the connection.
        let end = tokio::time::timeout(t, async {
            loop {
                match c.read_frame().await {
                    Ok(Frame::Command(body)) => {
                        if matches!(Command::parse(&body), Ok(Command::Ping { .. })) {
                            pinged = true;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => return e,
                }
            }
        })
        .await
        .expect("the hub closes a silent minion");
        assert!(pinged, "PINGs came first; then: {end}");
        let why = tokio::time::timeout(t, task).await.unwrap().unwrap();
        assert!(matches!(why, End::HeartbeatTimeout), "{why:?}");
    }

    #[tokio::test]
    async fn a_minion_gets_only_what_its_subscriptions_match() {
        let (hub, mut c, _task) = hub_and_minion(HubOptions::default()).await;
        c.send_command(&Command::Subscribe(Bytes::from_static(b"top")))
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while hub
            .publish(&[Bytes::from_static(b"topic"), Bytes::from_static(b"x")])
            .queued
            == 0
        {
            assert!(Instant::now() < deadline, "the subscription never applied");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(hub.publish(&[Bytes::from_static(b"other")]).queued, 0);
        let f = tokio::time::timeout(Duration::from_secs(10), c.read_frame())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            f,
            Frame::Message {
                body: Bytes::from_static(b"topic"),
                more: true
            }
        );
    }

    #[tokio::test]
    async fn a_subscribe_in_the_same_segment_as_ready_applies_at_once() {
        let hub = Arc::new(Hub::new(HubOptions::default()));
        let l = tokio::net::TcpListener::bind("127.0.5.20:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let h = hub.clone();
        tokio::spawn(async move {
            let (s, peer) = l.accept().await.unwrap();
            serve(&h, CancellationToken::new(), s, peer, 1000).await
        });
        // What libzmq often does: greeting, READY and SUBSCRIBE in one write, then nothing.
        let mut out = BytesMut::new();
        out.extend_from_slice(&Greeting::ours(false).encode());
        Command::Ready(Properties::default().with("Socket-Type", "SUB")).encode_frame(&mut out);
        Command::Subscribe(Bytes::new()).encode_frame(&mut out);
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&out).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while hub.publish(&[Bytes::from_static(b"job")]).queued == 0 {
            assert!(
                Instant::now() < deadline,
                "the SUBSCRIBE that came with READY was never applied"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
