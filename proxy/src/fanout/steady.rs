//! A fan-out minion session's steady state, after its handshake (`session.rs`): a hand-written
//! future ([`Steady`]), as the L4 session's pump is (`crate::data::pump`), not an `async fn`.
//!
//! An idle session is its task and little else (issue 30: a fan-out session must cost no more
//! than an L4 one), and an `async fn`'s state machine keeps room for every future it may await
//! at once (the read, the queue's pop, the timer, each write, the late-identity wait) and for
//! every local and argument that lives across one. [`Steady`] holds the socket (borrowed), the
//! session's slot (its queue), the one timer (borrowed, pinned by the caller), the read buffer
//! (freed between reads) and a few instants; what few sessions need (the rest of a write the
//! socket could not take, a replay under way, a late-identity wait, the jobs a replay sent) is
//! boxed or behind an `Option` of a shared [`Bytes`].
//!
//! Each poll, in this order (the order of the `biased` select this replaces): a replay under
//! way runs alone, then a write under way (with only the hub's stop and the write timeout
//! beside it), then the frames that came with the last read, then the socket, the queue, the
//! late-identity wait and the timer. A write is tried at once (`try_write`): a minion reads its
//! jobs as they come, so almost every message goes out whole with no timer and no waker.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use saltgate_config::{ListenerConfig, Role};
use saltgate_wire::transport::zeromq::frame::{Frame, FrameDecoder, FrameError};
use saltgate_wire::transport::zeromq::{Command, Heartbeat, TopicLimits, TopicRefusal, ZmtpError};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::hub::{Hub, Inbox, Slot};
use super::late::{Due, Late, Wake};
use super::queue::SessionQueue;
use crate::presence::Presence;

/// Why a minion session ended (logged).
#[derive(Debug)]
pub(super) enum End {
    ClientEof,
    HeartbeatTimeout,
    Shutdown,
    Error(ZmtpError),
}

impl End {
    /// The `reason` label when the session was cut for a limit (not when it simply ended).
    pub(super) fn cut(&self) -> Option<&'static str> {
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

/// What the handshake learned, for the steady state.
pub(super) struct Hello {
    pub peer: std::net::SocketAddr,
    /// The peer speaks ZMTP 3.1 (PING/PONG).
    pub peer_3_1: bool,
    /// The `Identity` of its READY (empty: none).
    pub identity: Bytes,
    /// What arrived after the READY (frames that came with it).
    pub rbuf: BytesMut,
    pub limits: SessionLimits,
    /// When the connection was accepted (the late-identity wait counts from it).
    pub opened: Instant,
}

/// Bytes read from the socket at once (on the poll's stack, not in the session).
const READ_CHUNK: usize = 2048;

/// Events handled in one poll before the task yields (a minion that floods the socket must not
/// hold a worker).
const TURNS: u32 = 32;

/// A replay under way (boxed: few sessions have one).
type Replaying<'a> = Pin<Box<dyn Future<Output = Result<Sent, End>> + Send + 'a>>;

/// A session waiting to learn its identity (`late.rs`): the wait, a future that holds the
/// [`Late`] it shares with the session (which notes its live writes there meanwhile).
struct LateWait<'a> {
    late: Arc<Late<'a>>,
    wake: Pin<Box<dyn Future<Output = Wake> + Send + 'a>>,
}

/// What a replay wrote: the sequence numbers (sorted) whose queued copies are not to be sent
/// again, up to the highest one.
#[derive(Default)]
pub(super) struct Sent {
    seqs: Vec<u64>,
    upto: u64,
}

impl Sent {
    /// A queued copy of a job the replay already wrote.
    fn has(&self, seq: u64) -> bool {
        seq <= self.upto && self.seqs.binary_search(&seq).is_ok()
    }
}

/// See the module's doc. Borrows the hub, the socket and the timer its caller owns; ends with
/// the session (its [`Drop`] detaches the session from the hub).
pub(super) struct Steady<'a> {
    hub: &'a Hub,
    io: &'a TcpStream,
    /// The one timer: the minion's silence, a frame's `frame_timeout`, the next PING, or (while
    /// a write waits) the write timeout. Armed lazily, as the L4 pump's idle timer: set once
    /// per limit's worth of traffic (a read only moves `last_rx`), checked and set again when
    /// it fires; earlier only when a nearer deadline appears.
    timer: Pin<&'a mut Sleep>,
    /// When the timer is set to fire (`None`: not armed).
    armed: Option<Instant>,
    /// The session's queue (dropping it closes the queue).
    inbox: Inbox,
    /// Bytes read and not decoded yet: empty (no allocation) between reads.
    rbuf: BytesMut,
    dec: FrameDecoder,
    /// `frame_timeout` in milliseconds (as the L4 pump's limits: a few bytes in every session).
    frame_timeout_ms: u32,
    last_rx: Instant,
    /// When the first byte of the frame now partly received arrived.
    frame_started: Option<Instant>,
    /// When the next PING is due (`interval` after the last one went out).
    next_ping: Option<Instant>,
    /// The TTL of the minion's last PING, in tenths of a second as ZMTP sends it (0: none).
    remote_ttl: u16,
    /// The rest of a write the socket could not take at once.
    pending: Option<Bytes>,
    /// The sequence number of the message `pending` ends (0: a PING or PONG).
    pending_seq: u64,
    /// When `pending` last moved (the write timeout counts from it).
    progress: Instant,
    /// Replay: the jobs owed to this session, sent once its first subscriptions are in (before
    /// any live message).
    owed: Option<Box<Due>>,
    /// Queued copies of these went out with the replay.
    sent: Option<Box<Sent>>,
    /// No identity yet: waiting for presence to learn one (`late.rs`).
    late: Option<Box<LateWait<'a>>>,
    replaying: Option<Replaying<'a>>,
    peer_3_1: bool,
    in_multipart: bool,
    /// `rbuf` holds bytes not decoded yet (a write that waited stopped the decoding).
    decode_now: bool,
}

impl<'a> Steady<'a> {
    /// Attaches the session to `hub` and returns its steady state. `timer` is the session's
    /// one timer (any deadline: it is set before it is polled).
    pub(super) fn start(
        hub: &'a Hub,
        presence: Option<&'a Presence>,
        io: &'a TcpStream,
        hello: Hello,
        timer: Pin<&'a mut Sleep>,
    ) -> Self {
        let Hello {
            peer,
            peer_3_1,
            identity,
            rbuf,
            limits,
            opened,
        } = hello;
        // Who it is, for replay: the ZMTP Identity if it sent one; else the one minion presence
        // saw `_auth` from at its address (a Salt minion's SUB socket does not send its
        // identity: libzmq sends it on REQ, DEALER and ROUTER sockets only). Several minions
        // behind one address, or none known: no identity, no replay; with none known yet, the
        // session waits (for the replay window) for presence to learn one (`late.rs`).
        let (identity, late) = super::late::at_open(hub, presence, peer.ip(), identity, opened);
        // A session this node served within the replay window is owed what followed its last job.
        let owed = hub.replay.returning(&identity).map(|after| {
            Box::new(Due {
                after,
                ..Due::default()
            })
        });
        let (_, inbox) = hub.attach(peer, identity, limits.hwm, limits.topics);
        let now = Instant::now();
        let mut s = Steady {
            hub,
            io,
            timer,
            armed: None,
            inbox,
            decode_now: !rbuf.is_empty(),
            rbuf: if rbuf.is_empty() {
                BytesMut::new()
            } else {
                rbuf
            },
            dec: FrameDecoder::new(limits.max_frame),
            frame_timeout_ms: u32::try_from(limits.frame_timeout.as_millis())
                .unwrap_or(u32::MAX)
                .max(1),
            last_rx: now,
            frame_started: None,
            next_ping: None,
            remote_ttl: 0,
            pending: None,
            pending_seq: 0,
            progress: now,
            owed,
            sent: None,
            late: late.map(LateWait::new),
            replaying: None,
            peer_3_1,
            in_multipart: false,
        };
        s.next_ping = s.heartbeat().map(|h| now + h.interval);
        s
    }

    fn slot(&self) -> &Arc<Slot> {
        self.inbox.slot()
    }

    /// PINGs and the silence limit: a ZMTP 3.0 peer does not know PING, it is never sent one
    /// and never timed out.
    fn heartbeat(&self) -> Option<&'a Heartbeat> {
        let hub: &'a Hub = self.hub;
        hub.opts
            .heartbeat
            .as_ref()
            .filter(|h| self.peer_3_1 && !h.interval.is_zero())
    }

    /// A write that makes no progress for this long (the heartbeat timeout) ends the session,
    /// PINGs or not (a 3.0 peer that does not read is no better).
    fn write_timeout(&self) -> Option<Duration> {
        write_timeout(self.hub)
    }

    /// Handles what is ready, at most [`TURNS`] events; `Err`: the session ends.
    fn turn(&mut self, cx: &mut Context<'_>) -> Result<(), End> {
        for _ in 0..TURNS {
            if !self.step(cx)? {
                return Ok(());
            }
        }
        cx.waker().wake_by_ref();
        Ok(())
    }

    /// Handles one event; `Ok(false)`: nothing is ready (every source it waits on will wake
    /// the task).
    fn step(&mut self, cx: &mut Context<'_>) -> Result<bool, End> {
        // A replay runs alone, as the await it replaces did.
        if let Some(r) = self.replaying.as_mut() {
            let Poll::Ready(r) = r.as_mut().poll(cx) else {
                return Ok(false);
            };
            self.replaying = None;
            let sent = r?;
            self.sent = (!sent.seqs.is_empty()).then(|| Box::new(sent));
            return Ok(true);
        }
        // So does a write the socket could not take at once, but for the hub's stop and the
        // write timeout: while it waits, the minion's silence is not checked (a minion that
        // reads nothing is gone or hostile).
        if self.pending.is_some() {
            return self.poll_pending(cx);
        }
        if self.decode_now {
            self.decode()?;
            return Ok(true);
        }
        if self.poll_read(cx)?.is_ready() {
            self.decode_now = true;
            return Ok(true);
        }
        // `None`: the hub stops (`Hub::stop_sessions`: the listener was dropped, or the
        // shutdown grace ran out).
        if let Poll::Ready(msg) = self.slot().queue.poll_pop(cx) {
            let Some((seq, m)) = msg else {
                return Err(End::Shutdown);
            };
            if !self.sent.as_ref().is_some_and(|s| s.has(seq)) {
                self.write(m, seq)?;
            }
            return Ok(true);
        }
        // Presence may have learned who this session is: what it is owed, but the jobs it
        // already had live, goes out now (after those live ones), or with its first
        // subscriptions if none are in yet.
        if let Some(l) = self.late.as_mut() {
            if let Poll::Ready(wake) = l.wake.as_mut().poll(cx) {
                self.woken(wake);
                return Ok(true);
            }
        }
        self.poll_timer(cx)
    }

    /// Reads what the socket has into `rbuf`: `Ready` when bytes came.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Result<Poll<()>, End> {
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            match self.io.try_read(&mut chunk) {
                Ok(0) => return Err(End::ClientEof),
                Ok(n) => {
                    self.rbuf
                        .extend_from_slice(chunk.get(..n).unwrap_or_default());
                    self.last_rx = Instant::now();
                    return Ok(Poll::Ready(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    match self.io.poll_read_ready(cx) {
                        Poll::Ready(Ok(())) => continue,
                        Poll::Ready(Err(e)) => return Err(e.into()),
                        Poll::Pending => return Ok(Poll::Pending),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Handles the frames in `rbuf` (those that came with the handshake, or with the last
    /// read); stops at a write that waits (the rest is decoded once it is done).
    fn decode(&mut self) -> Result<(), End> {
        while self.pending.is_none() {
            let frame = match self.dec.decode(&mut self.rbuf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return Err(End::Error(e.into())),
            };
            self.frame_started = None;
            self.frame(frame)?;
        }
        if self.pending.is_some() {
            return Ok(());
        }
        self.decode_now = false;
        // A returning session's replay goes out once the subscriptions that came with this
        // read are in (a Salt minion sends them all at once after READY), before any live
        // message.
        if self.owed.is_some() && !self.slot().topics().is_empty() {
            let due = self.owed.take().map(|d| *d).unwrap_or_default();
            self.replay(due);
        }
        if self.rbuf.is_empty() {
            // Keep no buffer on an idle session.
            self.rbuf = BytesMut::new();
        } else if self.frame_started.is_none() {
            // What is left is the start of the next frame: it arrived with the last read.
            self.frame_started = Some(self.last_rx);
        }
        Ok(())
    }

    /// One frame from the minion.
    fn frame(&mut self, frame: Frame) -> Result<(), End> {
        // A topic is copied: a slice would keep the whole read buffer it came in alive for as
        // long as the subscription.
        let refused = |e: TopicRefusal| End::Error(e.into());
        match frame {
            Frame::Command(body) => {
                match Command::parse(&body).map_err(|e| End::Error(e.into()))? {
                    Command::Ping { ttl, context } => {
                        self.remote_ttl = ttl;
                        let mut w = BytesMut::new();
                        Command::Pong { context }.encode_frame(&mut w);
                        self.write(w.freeze(), 0)?;
                    }
                    Command::Subscribe(t) => self
                        .slot()
                        .topics()
                        .subscribe(Bytes::copy_from_slice(&t))
                        .map_err(refused)?,
                    Command::Cancel(t) => self.slot().topics().cancel(&t),
                    Command::Error(r) => {
                        return Err(End::Error(ZmtpError::PeerError(
                            String::from_utf8_lossy(&r).into_owned(),
                        )))
                    }
                    _ => {}
                }
            }
            Frame::Message { body, more } => {
                // Legacy subscriptions are single-frame messages; a SUB sends nothing else.
                if !self.in_multipart && !more {
                    let topic = body.get(1..).unwrap_or_default();
                    match body.first() {
                        Some(1) => self
                            .slot()
                            .topics()
                            .subscribe(Bytes::copy_from_slice(topic))
                            .map_err(refused)?,
                        Some(0) => self.slot().topics().cancel(topic),
                        _ => {}
                    }
                }
                self.in_multipart = more;
            }
        }
        Ok(())
    }

    /// Writes `buf` (message `seq`; 0: a PING or PONG): what the socket does not take now is
    /// kept in `pending`, written as the socket drains.
    fn write(&mut self, mut buf: Bytes, seq: u64) -> Result<(), End> {
        if try_write_all(self.io, &mut buf)? {
            self.written(seq);
        } else {
            self.pending = Some(buf);
            self.pending_seq = seq;
            self.progress = Instant::now();
        }
        Ok(())
    }

    /// Message `seq` (0: none) went out whole.
    fn written(&self, seq: u64) {
        if seq == 0 {
            return;
        }
        self.slot().delivered.store(seq, Ordering::Relaxed);
        if let Some(l) = &self.late {
            l.late.written(seq);
        }
    }

    /// Moves the write under way on; `Ok(true)` once it is done (or the timer fired early).
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Result<bool, End> {
        let Some(buf) = self.pending.as_mut() else {
            return Ok(true);
        };
        let before = buf.len();
        let r = poll_write(self.io, cx, buf);
        if buf.len() < before {
            self.progress = Instant::now();
        }
        match r {
            Poll::Ready(Ok(())) => {
                self.pending = None;
                let seq = std::mem::take(&mut self.pending_seq);
                self.written(seq);
                return Ok(true);
            }
            Poll::Ready(Err(e)) => return Err(e.into()),
            Poll::Pending => {}
        }
        // A minion that does not read must not hold the shutdown drain.
        if self.slot().queue.poll_stopped(cx).is_ready() {
            return Err(End::Shutdown);
        }
        let Some(t) = self.write_timeout() else {
            return Ok(false);
        };
        let due = self.progress + t;
        if !self.timer_fired(cx, Some(due)) {
            return Ok(false);
        }
        if Instant::now() >= due {
            return Err(End::Error(ZmtpError::WriteTimeout(t)));
        }
        // Armed again on the next step.
        Ok(true)
    }

    /// The frame deadline, the silence limit and the next PING; `Ok(true)` when the timer fired.
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Result<bool, End> {
        let frame_timeout = Duration::from_millis(self.frame_timeout_ms.into());
        let frame_deadline = self
            .frame_started
            .and_then(|t| t.checked_add(frame_timeout));
        let hb = self.heartbeat();
        let remote_ttl =
            (self.remote_ttl > 0).then(|| Duration::from_millis(u64::from(self.remote_ttl) * 100));
        let limit = match (hb.map(|h| h.timeout.max(h.interval)), remote_ttl) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let deadline = limit.and_then(|l| self.last_rx.checked_add(l));
        let due = [frame_deadline, deadline, self.next_ping]
            .into_iter()
            .flatten()
            .min();
        if !self.timer_fired(cx, due) {
            return Ok(false);
        }
        let now = Instant::now();
        if frame_deadline.is_some_and(|d| now >= d) {
            return Err(End::Error(ZmtpError::FrameTimeout(frame_timeout)));
        }
        if deadline.is_some_and(|d| now >= d) {
            return Err(End::HeartbeatTimeout);
        }
        if let (Some(h), true) = (hb, self.next_ping.is_some_and(|p| now >= p)) {
            // As a `Delay` interval: the next one `interval` after this one.
            self.next_ping = Some(now + h.interval);
            let ttl = (h.ttl.as_millis() / 100).min(u128::from(u16::MAX)) as u16;
            let mut w = BytesMut::new();
            Command::Ping {
                ttl,
                context: Bytes::new(),
            }
            .encode_frame(&mut w);
            self.write(w.freeze(), 0)?;
        }
        // Traffic moved the deadline on, a frame completed, or a PING went: armed again on the
        // next step.
        Ok(true)
    }

    /// Sets the timer for `due` unless it is set to fire earlier; `true` when it fired (then it
    /// is disarmed: the caller checks its deadlines, and the next step arms it again).
    fn timer_fired(&mut self, cx: &mut Context<'_>, due: Option<Instant>) -> bool {
        if let Some(d) = due.filter(|d| self.armed.is_none_or(|a| *d < a)) {
            self.timer.as_mut().reset(d);
            self.armed = Some(d);
        }
        if self.armed.is_none() || self.timer.as_mut().poll(cx).is_pending() {
            return false;
        }
        self.armed = None;
        true
    }

    /// The late-identity wait ended.
    fn woken(&mut self, wake: Wake) {
        let Some(l) = self.late.take() else {
            return;
        };
        let LateWait {
            late,
            wake: waiting,
        } = *l;
        // The wait's own reference goes with it: the `Late` is this session's alone again.
        drop(waiting);
        let Ok(late) = Arc::try_unwrap(late) else {
            return;
        };
        let Some(due) = late.decide(self.hub, self.slot(), wake) else {
            return;
        };
        if self.slot().topics().is_empty() {
            self.owed = Some(Box::new(due));
        } else {
            self.replay(due);
        }
    }

    /// Starts sending the kept jobs `due` (boxed: a future of its own, polled alone).
    fn replay(&mut self, due: Due) {
        let (hub, io, slot) = (self.hub, self.io, self.slot().clone());
        let t = self.write_timeout();
        self.replaying = Some(Box::pin(
            async move { replay(hub, &slot, due, io, t).await },
        ));
    }
}

impl Future for Steady<'_> {
    type Output = End;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<End> {
        match self.get_mut().turn(cx) {
            Ok(()) => Poll::Pending,
            Err(end) => Poll::Ready(end),
        }
    }
}

impl Drop for Steady<'_> {
    /// The session leaves the hub (its queue closes after, with `inbox`).
    fn drop(&mut self) {
        self.hub.detach(self.slot());
    }
}

impl<'a> LateWait<'a> {
    fn new(late: Late<'a>) -> Box<Self> {
        let late = Arc::new(late);
        let l = late.clone();
        Box::new(LateWait {
            late,
            wake: Box::pin(async move { l.wake().await }),
        })
    }
}

/// See [`Steady::write_timeout`].
fn write_timeout(hub: &Hub) -> Option<Duration> {
    hub.opts
        .heartbeat
        .filter(|h| !h.interval.is_zero())
        .map(|h| h.timeout.max(h.interval))
}

/// Writes what the socket takes of `buf` (advancing it); `Ready(Ok)` once all of it is out,
/// `Pending` (woken when the socket is writable again) when the socket is full.
fn poll_write(io: &TcpStream, cx: &mut Context<'_>, buf: &mut Bytes) -> Poll<std::io::Result<()>> {
    loop {
        match try_write_all(io, buf) {
            Ok(true) => return Poll::Ready(Ok(())),
            Ok(false) => match io.poll_write_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            },
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

/// Writes what the socket takes now of `buf` (advancing it), registering nothing: `true` once
/// all of it is out, `false` when the socket is full.
fn try_write_all(io: &TcpStream, buf: &mut Bytes) -> std::io::Result<bool> {
    while !buf.is_empty() {
        match io.try_write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf.advance(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Writes all of `buf` unless the hub stops first (a minion that does not read must not hold
/// the shutdown drain), or no byte moves for `timeout` (a write timeout).
async fn write_all(
    io: &TcpStream,
    buf: &Bytes,
    timeout: Option<Duration>,
    queue: &SessionQueue,
) -> Result<(), End> {
    let mut rest = buf.clone();
    // Set before it is polled; polled only with a timeout.
    let timer = tokio::time::sleep(timeout.unwrap_or_default());
    tokio::pin!(timer);
    std::future::poll_fn(|cx| {
        let before = rest.len();
        if let Poll::Ready(r) = poll_write(io, cx, &mut rest) {
            return Poll::Ready(r.map_err(End::from));
        }
        if queue.poll_stopped(cx).is_ready() {
            return Poll::Ready(Err(End::Shutdown));
        }
        let Some(t) = timeout else {
            return Poll::Pending;
        };
        if rest.len() < before {
            timer.as_mut().reset(Instant::now() + t);
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(End::Error(ZmtpError::WriteTimeout(t)))),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// Sends the kept jobs `due` to the session (those its subscriptions match), in order.
async fn replay(
    hub: &Hub,
    slot: &Slot,
    due: Due,
    io: &TcpStream,
    write_timeout: Option<Duration>,
) -> Result<Sent, End> {
    let (jobs, _) = hub.replay.batch(due.after, |seq, t| {
        due.except.binary_search(&seq).is_err() && slot.topics().matches(t)
    });
    for (_, job) in &jobs {
        write_all(io, job, write_timeout, &slot.queue).await?;
    }
    let seqs: Vec<u64> = jobs.iter().map(|(seq, _)| *seq).collect();
    let upto = seqs.last().copied().unwrap_or(0);
    slot.delivered.fetch_max(upto, Ordering::Relaxed);
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

#[cfg(test)]
#[path = "steady_tests.rs"]
mod tests;
