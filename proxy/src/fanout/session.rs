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
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::hub::Hub;
use super::late::{Due, Late};
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
///
/// A minion reads its jobs as they come, so the socket almost always takes the whole message
/// at once: that is tried first, with no timer and no cancellation future (each would register
/// with a timer wheel or a token shared by every session, per message and session: issue 30's
/// profile of the fan-out path). Only the rest of a message the socket could not take waits.
async fn write(
    io: &mut TcpStream,
    buf: &[u8],
    timeout: Option<Duration>,
    stop: &CancellationToken,
    shutdown: &CancellationToken,
) -> Result<(), End> {
    let mut rest = buf;
    while !rest.is_empty() {
        match io.try_write(rest) {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into()),
            Ok(n) => rest = rest.get(n..).unwrap_or_default(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e.into()),
        }
    }
    if rest.is_empty() {
        return Ok(());
    }
    // Boxed: its timer and cancellation futures would otherwise be room reserved in every
    // session's future for a path few sessions take.
    Box::pin(write_waiting(io, rest, timeout, stop, shutdown)).await
}

/// The part of [`write`] that waits for the minion to read.
async fn write_waiting(
    io: &mut TcpStream,
    rest: &[u8],
    timeout: Option<Duration>,
    stop: &CancellationToken,
    shutdown: &CancellationToken,
) -> Result<(), End> {
    tokio::select! {
        r = write_all_timed(io, rest, timeout) => r.map_err(End::from),
        _ = stop.cancelled() => Err(End::Shutdown),
        _ = shutdown.cancelled() => Err(End::Shutdown),
    }
}

/// Serves fan-out session `id`; the caller runs it in the session's span
/// ([`crate::session::span`]).
pub(super) async fn run(
    hub: Arc<Hub>,
    ctx: Arc<DataPlane>,
    mut stream: TcpStream,
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
        &mut stream,
        peer,
        &limits,
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
    io: &mut TcpStream,
    peer: SocketAddr,
    limits: &SessionLimits,
) -> End {
    let opts = &hub.opts;
    let dec = FrameDecoder::new(limits.max_frame);
    let mut rbuf = BytesMut::new();
    let stop = hub.stop.clone();
    let opened = Instant::now();
    let hs = tokio::select! {
        // Boxed: once per session, freed before the session's long wait.
        r = Box::pin(tokio::time::timeout(opts.handshake_timeout, handshake(io, &mut rbuf, &dec))) => r,
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
    // address, or none known: no identity, no replay; with none known yet, the session waits
    // (for the replay window) for presence to learn one (`late.rs`).
    let (identity, late) = super::late::at_open(hub, presence, peer.ip(), identity, opened);
    // A session this node served within the replay window is owed what followed its last job.
    let owed = hub.replay.returning(&identity).map(|after| {
        Box::new(Due {
            after,
            ..Due::default()
        })
    });
    let (slot, mut rx) = hub.attach(peer, identity, limits.hwm, limits.topics);
    let end = drive(
        hub,
        &slot,
        &mut rx,
        io,
        rbuf,
        &dec,
        Flow {
            peer_3_1,
            frame_timeout: limits.frame_timeout,
            owed,
            late: late.map(Box::new),
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
struct Flow<'a> {
    /// The peer speaks ZMTP 3.1 (PING/PONG).
    peer_3_1: bool,
    frame_timeout: Duration,
    /// Replay: the jobs owed to this session, sent once its first subscriptions are in (before
    /// any live message). Boxed, as `late`: few sessions have either, and every session's
    /// future would hold room for them (twice: as `drive`'s argument and as its local).
    owed: Option<Box<Due>>,
    /// No identity yet: waiting for presence to learn one (`late.rs`).
    late: Option<Box<Late<'a>>>,
}

/// What a replay wrote: the sequence numbers (sorted) whose queued copies are not to be sent
/// again, up to the highest one.
#[derive(Default)]
struct Sent {
    seqs: Vec<u64>,
    upto: u64,
}

impl Sent {
    /// A queued copy of a job the replay already wrote.
    fn has(&self, seq: u64) -> bool {
        seq <= self.upto && self.seqs.binary_search(&seq).is_ok()
    }
}

/// Sends the kept jobs `due` to the session (those its subscriptions match), in order.
async fn replay(
    hub: &Hub,
    slot: &super::hub::Slot,
    due: Due,
    io: &mut TcpStream,
    write_timeout: Option<Duration>,
    stop: &CancellationToken,
    shutdown: &CancellationToken,
) -> Result<Sent, End> {
    let (jobs, _) = hub.replay.batch(due.after, |seq, t| {
        due.except.binary_search(&seq).is_err() && slot.topics().matches(t)
    });
    for (_, job) in &jobs {
        write(io, job, write_timeout, stop, shutdown).await?;
    }
    let seqs: Vec<u64> = jobs.iter().map(|(seq, _)| *seq).collect();
    let upto = seqs.last().copied().unwrap_or(0);
    slot.delivered
        .fetch_max(upto, std::sync::atomic::Ordering::Relaxed);
    if let (Some(m), false) = (hub.metrics(), seqs.is_empty()) {
        m.replays.inc();
        m.replayed_jobs.inc_by(seqs.len() as u64);
        if due.late {
            m.late_replays.inc();
        }
    }
    if !seqs.is_empty() {
        tracing::debug!(target: "saltgate_proxy::pubhub::session", client = %slot.peer, identity = %String::from_utf8_lossy(slot.identity()), jobs = seqs.len(), late = due.late, "fanout: returning session sent the jobs it missed");
    }
    Ok(Sent { seqs, upto })
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    hub: &Hub,
    slot: &super::hub::Slot,
    rx: &mut super::hub::Inbox,
    io: &mut TcpStream,
    mut rbuf: BytesMut,
    dec: &FrameDecoder,
    flow: Flow<'_>,
    stop: &CancellationToken,
    shutdown: &CancellationToken,
) -> End {
    let Flow {
        peer_3_1,
        frame_timeout,
        mut owed,
        mut late,
    } = flow;
    // Queued copies of these went out with the replay.
    let mut sent = Sent::default();
    // A ZMTP 3.0 peer does not know PING: never send it one, never time it out.
    let hb: Option<&Heartbeat> = hub
        .opts
        .heartbeat
        .as_ref()
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
    // When the next PING is due (`interval` after the last one went out).
    let mut next_ping = hb.map(|h| Instant::now() + h.interval);
    let mut last_rx = Instant::now();
    // The session's one timer (the minion's silence, a frame's `frame_timeout`, the next PING;
    // no `Interval` of its own, which is a boxed timer per session), armed lazily as
    // the L4 pump's idle timer is: set once per limit's worth of traffic (a read only moves
    // `last_rx`), checked and set again when it fires. Not a new `sleep_until` per loop turn:
    // that registers with the timer wheel for every message.
    let silence = tokio::time::sleep_until(last_rx);
    let mut armed: Option<Instant> = None;
    tokio::pin!(silence);
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
            if owed.is_some() && !slot.topics().is_empty() {
                let due = owed.take().map(|d| *d).unwrap_or_default();
                match Box::pin(replay(hub, slot, due, io, write_timeout, stop, shutdown)).await {
                    Ok(s) => sent = s,
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
        // One timer for the three deadlines (frame, silence, next PING). Armed earlier than it is
        // when a frame began arriving or the limit shrank (the minion's PING asked a shorter
        // TTL); a later deadline waits until the timer fires (lazy).
        let due = [frame_deadline, deadline, next_ping]
            .into_iter()
            .flatten()
            .min();
        if let Some(d) = due.filter(|d| armed.is_none_or(|a| *d < a)) {
            silence.as_mut().reset(d);
            armed = Some(d);
        }
        tokio::select! {
            // The socket, then the queue (which also says when the hub stops), then the timer.
            biased;
            n = io.read_buf(&mut rbuf) => {
                match n {
                    Ok(0) => return End::ClientEof,
                    Ok(_) => last_rx = Instant::now(),
                    Err(e) => return e.into(),
                }
                decode_now = true;
            }
            // `None`: the hub stops (`Hub::stop_sessions`: the listener was dropped, or the
            // shutdown grace ran out).
            msg = rx.recv() => {
                let Some((seq, m)) = msg else {
                    return End::Shutdown;
                };
                if !sent.has(seq) {
                    if let Err(end) = write(io, &m, write_timeout, stop, shutdown).await {
                        return end;
                    }
                    slot.delivered.store(seq, std::sync::atomic::Ordering::Relaxed);
                    if let Some(l) = late.as_mut() {
                        l.written(seq);
                    }
                }
            }
            // Presence may have learned who this session is: what it is owed, but the jobs it
            // already had live, goes out now (after those live ones), or with its first
            // subscriptions if none are in yet.
            wake = async { match late.as_ref() { Some(l) => Box::pin(l.wake()).await, None => std::future::pending().await } }, if late.is_some() => {
                if let Some(due) = late.take().and_then(|l| l.decide(hub, slot, wake)) {
                    if slot.topics().is_empty() {
                        owed = Some(Box::new(due));
                    } else {
                        match Box::pin(replay(hub, slot, due, io, write_timeout, stop, shutdown)).await {
                            Ok(s) => sent = s,
                            Err(end) => return end,
                        }
                    }
                }
            }
            _ = &mut silence, if armed.is_some() => {
                let now = Instant::now();
                if frame_deadline.is_some_and(|d| now >= d) {
                    return End::Error(ZmtpError::FrameTimeout(frame_timeout));
                }
                if deadline.is_some_and(|d| now >= d) {
                    return End::HeartbeatTimeout;
                }
                if let (Some(h), true) = (hb, next_ping.is_some_and(|p| now >= p)) {
                    // As a `Delay` interval: the next one `interval` after this one.
                    next_ping = Some(now + h.interval);
                    let ttl = (h.ttl.as_millis() / 100).min(u128::from(u16::MAX)) as u16;
                    w.clear();
                    Command::Ping { ttl, context: Bytes::new() }.encode_frame(&mut w);
                    if let Err(end) = write(io, &w, write_timeout, stop, shutdown).await {
                        return end;
                    }
                }
                // Traffic moved the deadline on, a frame completed, or a PING went: armed again
                // at the top.
                armed = None;
            }
        }
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
