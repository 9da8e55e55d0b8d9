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

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use saltgate_config::{ListenerConfig, Role};
use saltgate_wire::transport::zeromq::conn::write_all_timed;
use saltgate_wire::transport::zeromq::frame::FrameError;
use saltgate_wire::transport::zeromq::frame::{Frame, FrameDecoder};
use saltgate_wire::transport::zeromq::greeting::{self, Greeting};
use saltgate_wire::transport::zeromq::{
    Command, Heartbeat, Properties, SocketType, TopicLimits, TopicRefusal, ZmtpError,
};
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

impl End {
    /// The `reason` label when the session was cut for a limit (not when it simply ended).
    fn cut(&self) -> Option<&'static str> {
        match self {
            End::HeartbeatTimeout => Some("heartbeat_timeout"),
            End::Error(e) => match e {
                ZmtpError::Frame(FrameError::TooLarge { .. }) => Some("oversized"),
                ZmtpError::FrameTimeout(_) => Some("frame_timeout"),
                ZmtpError::WriteTimeout(_) => Some("write_timeout"),
                ZmtpError::Topics(TopicRefusal::TooMany { .. }) => Some("topics"),
                ZmtpError::Topics(TopicRefusal::TooManyBytes { .. }) => Some("topic_bytes"),
                ZmtpError::Timeout(_) => Some("handshake_timeout"),
                _ => None,
            },
            End::ClientEof | End::Shutdown => None,
        }
    }
}

/// What one minion session may make the hub hold (`listeners.publish`, read when it connects).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionLimits {
    /// Messages queued for the minion (`hwm`).
    pub hwm: usize,
    /// Largest frame the minion may send (`max_frame`).
    pub max_frame: usize,
    /// `max_topics`, `max_topic_bytes`.
    pub topics: TopicLimits,
    /// `frame_timeout`.
    pub frame_timeout: Duration,
}

impl SessionLimits {
    pub(crate) fn from_config(l: &ListenerConfig) -> Self {
        let f = &l.fanout_limits;
        SessionLimits {
            hwm: l.hwm as usize,
            max_frame: f.max_frame as usize,
            topics: TopicLimits {
                max_topics: f.max_topics as usize,
                max_bytes: f.max_topic_bytes as usize,
            },
            frame_timeout: f.frame_timeout,
        }
    }
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self::from_config(&ListenerConfig::defaults_for(Role::Publish))
    }
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

/// Writes `buf` unless the hub stops or the shutdown grace runs out first: a minion that does
/// not read must not hold the shutdown drain (a write to it can block for ever). A write that
/// makes no progress for `timeout` (the heartbeat timeout) ends the session: while it waits,
/// the minion's silence is not checked, and a minion that reads nothing is gone or hostile.
async fn write(
    io: &mut TcpStream,
    buf: &[u8],
    timeout: Option<Duration>,
    stop: &CancellationToken,
    shutdown: &CancellationToken,
) -> Result<(), End> {
    tokio::select! {
        r = write_all_timed(io, buf, timeout) => r.map_err(End::from),
        _ = stop.cancelled() => Err(End::Shutdown),
        _ = shutdown.cancelled() => Err(End::Shutdown),
    }
}

/// Serves fan-out session `id`; the caller runs it in the session's span
/// ([`crate::session::span`]).
pub(super) async fn run(
    hub: Arc<Hub>,
    ctx: Arc<DataPlane>,
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
) {
    let handles = ctx.listener(Role::Publish);
    handles.accepted.inc();
    handles.live.inc();
    // Presence pairs a minion with its publish session by address; here every master is its
    // publish master (`None`: fan-out).
    let _presence = ctx
        .presence
        .enabled()
        .then(|| ctx.presence.publish_opened(id, peer, None));
    let limits = SessionLimits::from_config(&ctx.snapshot.load().config.publish);
    let end = serve(
        &hub,
        ctx.sessions_token.clone(),
        Some(&ctx.presence),
        stream,
        peer,
        limits,
    )
    .await;
    handles.live.dec();
    if let (Some(reason), Some(m)) = (end.cut(), hub.metrics()) {
        m.cut(reason).inc();
    }
    match &end {
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

async fn serve(
    hub: &Arc<Hub>,
    shutdown: CancellationToken,
    presence: Option<&crate::presence::Presence>,
    mut io: TcpStream,
    peer: SocketAddr,
    limits: SessionLimits,
) -> End {
    let opts = &hub.opts;
    let dec = FrameDecoder::new(limits.max_frame);
    let mut rbuf = BytesMut::new();
    let stop = hub.stop.clone();
    let hs = tokio::select! {
        r = tokio::time::timeout(opts.handshake_timeout, handshake(&mut io, &mut rbuf, &dec)) => r,
        _ = stop.cancelled() => return End::Shutdown,
        _ = shutdown.cancelled() => return End::Shutdown,
    };
    let (peer_3_1, identity) = match hs {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return e.into(),
        Err(_) => return End::Error(ZmtpError::Timeout("handshake")),
    };
    // Who it is, for replay: the ZMTP Identity if it sent one; else the one minion presence
    // saw `_auth` from at its address (a Salt minion's SUB socket does not send its identity:
    // libzmq sends it on REQ, DEALER and ROUTER sockets only). Several minions behind one
    // address, or none known: no identity, no replay.
    let identity = if identity.is_empty() && hub.replay.enabled() {
        presence
            .and_then(|p| p.sole_id_at(peer.ip()))
            .map(Bytes::from)
            .unwrap_or_default()
    } else {
        identity
    };
    // A session this node served within the replay window is owed what followed its last job.
    let owed = hub.replay.returning(&identity);
    let (slot, mut rx) = hub.attach(peer, identity, limits.hwm, limits.topics);
    let end = drive(
        hub,
        &slot,
        &mut rx,
        &mut io,
        rbuf,
        &dec,
        Flow {
            peer_3_1,
            frame_timeout: limits.frame_timeout,
            owed,
        },
        &stop,
        &shutdown,
    )
    .await;
    hub.detach(&slot);
    let _ = io.shutdown().await;
    end
}

/// What a session's loop needs to know of its peer.
struct Flow {
    /// The peer speaks ZMTP 3.1 (PING/PONG).
    peer_3_1: bool,
    frame_timeout: Duration,
    /// Replay: the sequence number after which the kept jobs are owed to this session, sent
    /// once its first subscriptions are in (before any live message).
    owed: Option<u64>,
}

/// Sends the kept jobs owed to a returning session (those its subscriptions match), in order;
/// returns the sequence number up to which queued copies are not to be sent again.
async fn replay(
    hub: &Hub,
    slot: &super::hub::Slot,
    after: u64,
    io: &mut TcpStream,
    write_timeout: Option<Duration>,
    stop: &CancellationToken,
    shutdown: &CancellationToken,
) -> Result<u64, End> {
    let (jobs, done) = hub.replay.batch(after, |t| slot.topics().matches(t));
    for job in &jobs {
        write(io, job, write_timeout, stop, shutdown).await?;
    }
    slot.delivered
        .fetch_max(done.upto, std::sync::atomic::Ordering::Relaxed);
    if let Some(m) = hub.metrics() {
        if done.jobs > 0 {
            m.replays.inc();
            m.replayed_jobs.inc_by(done.jobs as u64);
        }
    }
    if done.jobs > 0 {
        tracing::debug!(target: "saltgate_proxy::pubhub::session", client = %slot.peer, identity = %String::from_utf8_lossy(&slot.identity), jobs = done.jobs, "fanout: returning session sent the jobs it missed");
    }
    Ok(done.upto)
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    hub: &Hub,
    slot: &super::hub::Slot,
    rx: &mut tokio::sync::mpsc::Receiver<super::hub::Queued>,
    io: &mut TcpStream,
    mut rbuf: BytesMut,
    dec: &FrameDecoder,
    flow: Flow,
    stop: &CancellationToken,
    shutdown: &CancellationToken,
) -> End {
    let Flow {
        peer_3_1,
        frame_timeout,
        mut owed,
    } = flow;
    // Queued copies up to this sequence number went out with the replay.
    let mut replayed_upto = 0u64;
    // A ZMTP 3.0 peer does not know PING: never send it one, never time it out.
    let hb: Option<Heartbeat> = hub
        .opts
        .heartbeat
        .filter(|h| peer_3_1 && !h.interval.is_zero());
    // A write that makes no progress for the heartbeat timeout ends the session, PINGs or not
    // (a 3.0 peer that does not read is no better).
    let write_timeout = hub
        .opts
        .heartbeat
        .filter(|h| !h.interval.is_zero())
        .map(|h| h.timeout.max(h.interval));
    // When the first byte of the frame now partly received arrived.
    let mut frame_started: Option<Instant> = None;
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
                frame_started = None;
                match frame {
                    Frame::Command(body) => match Command::parse(&body) {
                        Ok(Command::Ping { ttl, context }) => {
                            remote_ttl =
                                (ttl > 0).then(|| Duration::from_millis(u64::from(ttl) * 100));
                            w.clear();
                            Command::Pong { context }.encode_frame(&mut w);
                            if let Err(end) = write(io, &w, write_timeout, stop, shutdown).await {
                                return end;
                            }
                        }
                        Ok(Command::Subscribe(t)) => {
                            if let Err(e) = slot.topics().subscribe(t) {
                                return End::Error(e.into());
                            }
                        }
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
                            let refused = match body.first() {
                                Some(1) => slot.topics().subscribe(body.slice(1..)).err(),
                                Some(0) => {
                                    slot.topics().cancel(&body[1..]);
                                    None
                                }
                                _ => None,
                            };
                            if let Some(e) = refused {
                                return End::Error(e.into());
                            }
                        }
                        in_multipart = more;
                    }
                }
            }
            // A returning session's replay goes out once the subscriptions that came with this
            // read are in (a Salt minion sends them all at once after READY), before any live
            // message.
            if let Some(after) = owed.filter(|_| !slot.topics().is_empty()) {
                owed = None;
                match replay(hub, slot, after, io, write_timeout, stop, shutdown).await {
                    Ok(upto) => replayed_upto = upto,
                    Err(end) => return end,
                }
            }
            // Keep no buffer on an idle session.
            if rbuf.is_empty() && rbuf.capacity() > 4096 {
                rbuf = BytesMut::new();
            }
            // What is left is the start of the next frame: it arrived with the last read.
            if !rbuf.is_empty() && frame_started.is_none() {
                frame_started = Some(last_rx);
            }
        }
        let frame_deadline = frame_started.and_then(|t| t.checked_add(frame_timeout));
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
                Some((seq, _)) if seq <= replayed_upto => {}
                Some((seq, m)) => {
                    if let Err(end) = write(io, &m, write_timeout, stop, shutdown).await {
                        return end;
                    }
                    slot.delivered.store(seq, std::sync::atomic::Ordering::Relaxed);
                }
                None => return End::Shutdown,
            },
            _ = async { match ping.as_mut() { Some(t) => { t.tick().await; } None => std::future::pending().await } } => {
                let ttl = hb.map(|h| (h.ttl.as_millis() / 100).min(u128::from(u16::MAX)) as u16).unwrap_or(0);
                w.clear();
                Command::Ping { ttl, context: Bytes::new() }.encode_frame(&mut w);
                if let Err(end) = write(io, &w, write_timeout, stop, shutdown).await {
                    return end;
                }
            }
            _ = async { match frame_deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {
                return End::Error(ZmtpError::FrameTimeout(frame_timeout));
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
    use saltgate_wire::transport::zeromq::{Connection, HandshakeConfig, TopicLimits};

    async fn hub_and_minion(
        opts: HubOptions,
    ) -> (Arc<Hub>, Connection, tokio::task::JoinHandle<End>) {
        hub_and_minion_with(opts, SessionLimits::default()).await
    }

    async fn hub_and_minion_with(
        opts: HubOptions,
        limits: SessionLimits,
    ) -> (Arc<Hub>, Connection, tokio::task::JoinHandle<End>) {
        let (hub, addr, task) = hub_listening(opts, limits).await;
        let c = Connection::connect(addr, &HandshakeConfig::new(SocketType::Sub))
            .await
            .unwrap();
        (hub, c, task)
    }

    /// A hub serving one session on a loopback port: the session's end comes out of the task.
    async fn hub_listening(
        opts: HubOptions,
        limits: SessionLimits,
    ) -> (Arc<Hub>, SocketAddr, tokio::task::JoinHandle<End>) {
        let hub = Arc::new(Hub::new(opts));
        let l = tokio::net::TcpListener::bind("127.0.5.20:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let h = hub.clone();
        let task = tokio::spawn(async move {
            let (s, peer) = l.accept().await.unwrap();
            serve(&h, CancellationToken::new(), None, s, peer, limits).await
        });
        (hub, addr, task)
    }

    /// The session's end, which must come within 10 s (a hostile minion that is never cut
    /// fails here).
    async fn ends(task: tokio::task::JoinHandle<End>) -> End {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the hub never cut this minion")
            .unwrap()
    }

    /// A raw client past the greeting and READY as a SUB: what follows is up to the test.
    async fn raw_sub(addr: SocketAddr) -> TcpStream {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let mut out = BytesMut::new();
        out.extend_from_slice(&Greeting::ours(false).encode());
        Command::Ready(Properties::default().with("Socket-Type", "SUB")).encode_frame(&mut out);
        c.write_all(&out).await.unwrap();
        c
    }

    /// Issue 31 item 1: a 60 MiB frame header used to be accepted and its body held for ever.
    #[tokio::test]
    async fn a_frame_over_max_frame_is_cut_at_its_header() {
        let (_hub, addr, task) =
            hub_listening(HubOptions::default(), SessionLimits::default()).await;
        let mut c = raw_sub(addr).await;
        let mut hdr = vec![0x02u8];
        hdr.extend_from_slice(&(60u64 << 20).to_be_bytes());
        c.write_all(&hdr).await.unwrap();
        c.write_all(&[0u8; 1024]).await.unwrap();
        let end = ends(task).await;
        assert_eq!(end.cut(), Some("oversized"), "{end:?}");
    }

    /// Issue 31 item 1: one byte every so often kept a half-sent frame (and its buffer) alive:
    /// each byte is traffic, so the heartbeat never fired.
    #[tokio::test]
    async fn a_frame_trickled_a_byte_at_a_time_is_cut_at_frame_timeout() {
        let limits = SessionLimits {
            frame_timeout: Duration::from_millis(300),
            ..SessionLimits::default()
        };
        let (_hub, addr, task) = hub_listening(HubOptions::default(), limits).await;
        let mut c = raw_sub(addr).await;
        // A SUBSCRIBE of 200 bytes, one byte every 20 ms: 4 s in all, 13 x the deadline.
        let mut f = BytesMut::new();
        Command::Subscribe(Bytes::from(vec![b'x'; 190])).encode_frame(&mut f);
        let trickle = tokio::spawn(async move {
            for b in f.iter() {
                if c.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            std::future::pending::<()>().await;
        });
        let end = ends(task).await;
        trickle.abort();
        assert_eq!(end.cut(), Some("frame_timeout"), "{end:?}");
    }

    /// Issue 31 items 1 and 4: any number of SUBSCRIBEs used to be kept (in a Vec scanned per
    /// SUBSCRIBE: quadratic CPU).
    #[tokio::test]
    async fn subscribing_past_max_topics_or_max_topic_bytes_cuts_the_session() {
        for (limits, topic_len, reason) in [
            (
                TopicLimits {
                    max_topics: 8,
                    max_bytes: 1 << 20,
                },
                4,
                "topics",
            ),
            (
                TopicLimits {
                    max_topics: 1000,
                    max_bytes: 256,
                },
                100,
                "topic_bytes",
            ),
        ] {
            let limits = SessionLimits {
                topics: limits,
                ..SessionLimits::default()
            };
            let (_hub, addr, task) = hub_listening(HubOptions::default(), limits).await;
            let mut c = raw_sub(addr).await;
            let mut out = BytesMut::new();
            for i in 0..2000u32 {
                let mut t = format!("{i:0>width$}", width = topic_len).into_bytes();
                t.truncate(topic_len.max(4));
                Command::Subscribe(Bytes::from(t)).encode_frame(&mut out);
            }
            // The hub may close while we write: that is the point.
            let _ = c.write_all(&out).await;
            let end = ends(task).await;
            assert_eq!(end.cut(), Some(reason), "{end:?}");
        }
    }

    /// Issue 31 item 6: a blocked write stopped the heartbeat check, and a minion that neither
    /// reads nor speaks lived until the kernel gave up (65 s), not the heartbeat timeout.
    #[tokio::test]
    async fn a_minion_that_neither_reads_nor_speaks_is_closed_within_the_heartbeat_timeout() {
        let timeout = Duration::from_millis(400);
        let (hub, mut c, task) = hub_and_minion(HubOptions {
            heartbeat: Some(Heartbeat {
                interval: Duration::from_millis(100),
                timeout,
                ttl: Duration::ZERO,
            }),
            ..HubOptions::default()
        })
        .await;
        c.send_command(&Command::Subscribe(Bytes::new()))
            .await
            .unwrap();
        // Never read, never answer: fill the kernel's buffers both ways (1 MiB messages).
        let big = Bytes::from(vec![7u8; 1 << 20]);
        let started = Instant::now();
        let deadline = started + Duration::from_secs(10);
        let mut queued = 0;
        while queued < 64 && Instant::now() < deadline {
            queued += hub.publish(std::slice::from_ref(&big)).queued;
            tokio::task::yield_now().await;
        }
        let end = ends(task).await;
        assert!(
            matches!(end.cut(), Some("heartbeat_timeout" | "write_timeout")),
            "{end:?}"
        );
        drop(c);
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
            serve(
                &h,
                CancellationToken::new(),
                None,
                s,
                peer,
                SessionLimits::default(),
            )
            .await
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
