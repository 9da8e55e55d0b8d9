//! The per-connection driver shared by every socket role.
//!
//! One task per connection runs `drive`: it reads frames, assembles messages, answers every
//! PING with a PONG (echoing the context), optionally sends its own PINGs and closes the
//! connection when the peer stays silent past the timeout (or past the TTL the peer announced in
//! its PINGs), applies subscriptions (ZMTP 3.1 commands and legacy `0x01`/`0x00` frames), and
//! writes what the role queues for it. Roles own the queues; this module owns the protocol.
//!
//! A received message goes to the role's channel. When that channel is full (the application's
//! high-water mark) the role chooses ([`OnFull`]):
//!
//! * [`OnFull::Wait`] (ROUTER): the driver stops reading this peer's socket until the channel has
//!   room, as libzmq's engine does (`in_event` → the pipe is full → input stopped until
//!   `restart_input`): nothing is lost, the peer's further sends wait in TCP's buffers, other
//!   peers are unaffected. Meanwhile the driver still writes what the role queues (replies) and
//!   sends its own PINGs, and does not count the pause as the peer's silence. It cannot answer
//!   the peer's PINGs until it reads again (libzmq cannot either).
//! * [`OnFull::Drop`] (SUB, REQ): the message is dropped and counted, and reading (and answering
//!   PINGs) goes on. A subscriber is a broadcast's receiver, so a slow one loses rather than
//!   stalls; a REQ expects only its one reply.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::command::Command;
use super::conn::Connection;
use super::frame::{Frame, MessageAssembler, DEFAULT_MAX_MESSAGE_FRAMES};
use super::topics::TopicSet;
use super::ZmtpError;

/// ZMTP 3.1 heartbeat settings (libzmq's `ZMQ_HEARTBEAT_IVL`, `_TIMEOUT`, `_TTL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Send a PING this often.
    pub interval: Duration,
    /// Close the connection when nothing at all arrived from the peer for this long.
    pub timeout: Duration,
    /// TTL announced in our PINGs (the peer may close if it hears nothing from us for this long).
    pub ttl: Duration,
}

impl Heartbeat {
    /// A zero timeout means "the interval", as libzmq defaults `ZMQ_HEARTBEAT_TIMEOUT`.
    fn normalised(self) -> Self {
        Heartbeat {
            timeout: if self.timeout.is_zero() {
                self.interval
            } else {
                self.timeout
            },
            ..self
        }
    }

    /// What a Salt 3008 master uses: PING every 10 s, drop after 30 s of silence.
    pub fn salt_master() -> Self {
        Heartbeat {
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
            ttl: Duration::ZERO,
        }
    }
}

/// Why a connection ended.
#[derive(Debug)]
pub enum CloseReason {
    /// The peer closed the connection.
    PeerEof,
    /// Nothing arrived within the heartbeat timeout or the peer's TTL.
    HeartbeatTimeout,
    /// Our side dropped the queue feeding this connection.
    LocalClosed,
    /// I/O or protocol error.
    Error(ZmtpError),
}

/// Something a role asks the driver to write.
#[derive(Debug, Clone)]
pub(crate) enum Outbound {
    Message(Arc<[Bytes]>),
    /// A message already framed (encoded once, shared by every subscriber it goes to).
    Encoded(Bytes),
    Subscribe(Bytes),
    Cancel(Bytes),
    /// The application vouches for this peer (ROUTER: it sent a request only a key holder
    /// could): its frames may be as large as [`DriverConfig::trusted_max_frame_size`].
    Trust,
}

/// A message received from a peer, tagged with the peer's routing id (ROUTER) or empty.
#[derive(Debug)]
pub(crate) struct Delivered {
    pub peer: Bytes,
    pub frames: Vec<Bytes>,
    /// When the last frame was read off the connection.
    pub received: Instant,
    /// Its share of the untrusted budget ([`Inbound::Channel`]'s `budget`), given back when
    /// the message is taken off the channel.
    pub budget: Option<OwnedSemaphorePermit>,
    /// Bytes of that budget it still waits for before it may be queued (0: none).
    pub needs: u32,
}

/// What the driver does with a message when the role's channel is full. The counter counts
/// the messages dropped (`Drop`) or the pauses (`Wait`: how often a peer had to wait).
#[derive(Debug, Clone)]
pub(crate) enum OnFull {
    Drop(Arc<AtomicU64>),
    Wait(Arc<AtomicU64>),
}

/// A byte budget shared by connections (one semaphore permit a byte).
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    sem: Arc<Semaphore>,
    total: u32,
}

impl Budget {
    /// `bytes` (1 to 4 GiB) in all.
    pub(crate) fn new(bytes: usize) -> Budget {
        let total = bytes.clamp(1, u32::MAX as usize) as u32;
        Budget {
            sem: Arc::new(Semaphore::new(total as usize)),
            total,
        }
    }

    /// What a message of `size` bytes draws: its size, at least 1, at most the whole budget
    /// (so a message bigger than the budget waits for all of it, never for ever).
    fn share(&self, size: usize) -> u32 {
        size.clamp(1, self.total as usize) as u32
    }

    /// Bytes not drawn now.
    pub(crate) fn available(&self) -> usize {
        self.sem.available_permits()
    }
}

/// Where received traffic goes.
pub(crate) enum Inbound {
    /// Messages go to the role's channel, tagged with `peer`; `full` says what happens when it
    /// is full.
    Channel {
        tx: mpsc::Sender<Delivered>,
        peer: Bytes,
        full: OnFull,
        /// Bytes that messages from peers not yet trusted ([`Outbound::Trust`]) may hold in the
        /// channel, all peers together (one permit a byte): a message that does not fit waits,
        /// and its peer is not read meanwhile, as with `OnFull::Wait` (the only mode it is
        /// used with). `None`: no budget.
        budget: Option<Budget>,
    },
    /// A PUB's subscriber: subscriptions update `topics` (and wake `changed`); data is ignored.
    Topics {
        topics: Arc<Mutex<TopicSet>>,
        changed: Arc<Notify>,
    },
}

/// Limits and heartbeats for one connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DriverConfig {
    pub heartbeat: Option<Heartbeat>,
    pub max_message_frames: usize,
    /// Largest message (and frame) until the peer is trusted ([`Outbound::Trust`]).
    pub max_message_size: usize,
    /// Largest message once trusted (never below `max_message_size`).
    pub trusted_max_frame_size: usize,
    /// Longest a frame may take from its first byte to its last (`None`: no limit).
    pub frame_timeout: Option<Duration>,
    /// Longest a write may make no progress (`None`: no limit): a peer that does not read is
    /// cut even though its heartbeat cannot be checked while we wait to write to it.
    pub write_timeout: Option<Duration>,
}

impl DriverConfig {
    /// No frame deadline; writes bounded by the heartbeat timeout (when there is one).
    pub fn new(heartbeat: Option<Heartbeat>, max_frame_size: usize) -> Self {
        DriverConfig {
            heartbeat,
            max_message_frames: DEFAULT_MAX_MESSAGE_FRAMES,
            max_message_size: max_frame_size,
            trusted_max_frame_size: max_frame_size,
            frame_timeout: None,
            write_timeout: heartbeat
                .filter(|h| !h.interval.is_zero())
                .map(|h| h.normalised().timeout),
        }
    }
}

async fn tick(t: &mut Option<Interval>) {
    match t {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Runs one connection until it closes; returns why.
pub(crate) async fn drive<S>(
    mut conn: Connection<S>,
    mut out_rx: mpsc::Receiver<Outbound>,
    inbound: Inbound,
    cfg: DriverConfig,
) -> CloseReason
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let peer_3_1 = conn.peer().greeting.supports_3_1();
    // A ZMTP 3.0 peer (e.g. the `zeromq` crate) does not understand PING: never send it one.
    // A zero interval means no heartbeats (as `ZMQ_HEARTBEAT_IVL=0`).
    let hb = cfg
        .heartbeat
        .filter(|h| peer_3_1 && !h.interval.is_zero())
        .map(Heartbeat::normalised);
    let mut ping_tick = hb.and_then(|h| {
        let start = Instant::now().checked_add(h.interval)?;
        let mut t = tokio::time::interval_at(start, h.interval);
        t.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Some(t)
    });
    let mut remote_ttl: Option<Duration> = None;
    let mut assembler = MessageAssembler::new(cfg.max_message_frames, cfg.max_message_size);
    let mut max_frame_size = conn.max_frame_size().min(cfg.max_message_size);
    conn.set_write_timeout(cfg.write_timeout);
    conn.set_frame_timeout(cfg.frame_timeout);
    // A message waiting for room in the role's channel (`OnFull::Wait`): no reads meanwhile.
    let mut held: Option<Delivered> = None;
    // Silence is counted from the last byte received or the end of the last pause, whichever
    // is later: a peer we did not read is not silent.
    let mut resumed = Instant::now();
    let (wait_tx, budget) = match &inbound {
        Inbound::Channel {
            tx,
            full: OnFull::Wait(_),
            budget,
            ..
        } => (Some(tx.clone()), budget.clone()),
        _ => (None, None),
    };
    // Until the role vouches for the peer, its messages draw on the untrusted budget.
    let mut trusted = false;

    loop {
        let silence_limit = match (hb.map(|h| h.timeout), remote_ttl) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        // An unrepresentable deadline (absurdly long limit) means none; none while paused.
        let since = conn.last_received().max(resumed);
        let deadline = silence_limit
            .filter(|_| held.is_none())
            .and_then(|l| since.checked_add(l));
        // A message's frames share its size limit: the next frame's header is checked against
        // what is left of it, so a message never holds more than the limit.
        conn.set_max_frame_size(max_frame_size.min(assembler.remaining()));
        let result = tokio::select! {
            frame = conn.read_frame(), if held.is_none() => {
                match frame {
                    Ok(frame) => {
                        let budget = budget.as_ref().filter(|_| !trusted);
                        on_frame(&mut conn, frame, &inbound, budget, &mut assembler, &mut remote_ttl)
                            .await
                            .map(|step| match step {
                                Step::Go => true,
                                Step::Closed => false,
                                Step::Hold(d) => {
                                    held = Some(d);
                                    true
                                }
                            })
                    }
                    Err(ZmtpError::Eof) => return CloseReason::PeerEof,
                    Err(e) => Err(e),
                }
            }
            permit = admit(held.as_mut(), budget.as_ref(), wait_tx.as_ref()), if held.is_some() => match permit {
                Some(permit) => {
                    if let Some(d) = held.take() {
                        permit.send(d);
                    }
                    resumed = Instant::now();
                    // A frame under way must end in time; our pause does not count against it.
                    conn.restart_frame_clock();
                    Ok(true)
                }
                None => Ok(false),
            },
            out = out_rx.recv() => match out {
                None => {
                    conn.shutdown().await;
                    return CloseReason::LocalClosed;
                }
                Some(Outbound::Trust) => {
                    trusted = true;
                    max_frame_size = cfg.trusted_max_frame_size.max(cfg.max_message_size);
                    assembler.set_max_size(max_frame_size);
                    Ok(true)
                }
                Some(out) => write_outbound(&mut conn, out, peer_3_1).await,
            },
            _ = tick(&mut ping_tick) => {
                let ttl = hb.map(|h| (h.ttl.as_millis() / 100).min(u128::from(u16::MAX)) as u16);
                conn.send_command(&Command::Ping { ttl: ttl.unwrap_or(0), context: Bytes::new() })
                    .await
                    .map(|()| true)
            }
            _ = sleep_until(deadline) => {
                // Bytes of a large frame may have arrived meanwhile: only silence counts.
                let still_silent = silence_limit
                    .and_then(|l| conn.last_received().max(resumed).checked_add(l))
                    .is_some_and(|d| d <= Instant::now());
                if still_silent {
                    return CloseReason::HeartbeatTimeout;
                }
                Ok(true)
            }
        };
        match result {
            Ok(true) => {}
            Ok(false) => return CloseReason::LocalClosed,
            Err(e) => return CloseReason::Error(e),
        }
    }
}

/// The held message's share of the untrusted budget, if it waits for one, then room in the
/// role's channel. Cancel-safe: a share once granted stays with the message.
async fn admit<'t>(
    held: Option<&mut Delivered>,
    budget: Option<&Budget>,
    tx: Option<&'t mpsc::Sender<Delivered>>,
) -> Option<mpsc::Permit<'t, Delivered>> {
    if let (Some(d), Some(b)) = (held, budget) {
        if d.needs > 0 {
            d.budget = Some(b.sem.clone().acquire_many_owned(d.needs).await.ok()?);
            d.needs = 0;
        }
    }
    reserve(tx).await
}

/// Room in the role's channel (`None` when the role went away, or never without a channel).
async fn reserve(tx: Option<&mpsc::Sender<Delivered>>) -> Option<mpsc::Permit<'_, Delivered>> {
    match tx {
        Some(tx) => tx.reserve().await.ok(),
        None => std::future::pending().await,
    }
}

/// What the driver does after a frame.
enum Step {
    Go,
    /// The role went away.
    Closed,
    /// The role's channel is full (`OnFull::Wait`): hold this message and stop reading.
    Hold(Delivered),
}

/// Handles one received frame.
async fn on_frame<S>(
    conn: &mut Connection<S>,
    frame: Frame,
    inbound: &Inbound,
    budget: Option<&Budget>,
    assembler: &mut MessageAssembler,
    remote_ttl: &mut Option<Duration>,
) -> Result<Step, ZmtpError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match frame {
        Frame::Command(body) => match Command::parse(&body)? {
            Command::Ping { ttl, context } => {
                *remote_ttl = (ttl > 0).then(|| Duration::from_millis(u64::from(ttl) * 100));
                conn.send_command(&Command::Pong { context }).await?;
            }
            Command::Subscribe(topic) => apply_subscription(inbound, true, topic)?,
            Command::Cancel(topic) => apply_subscription(inbound, false, topic)?,
            Command::Error(reason) => {
                return Err(ZmtpError::PeerError(
                    String::from_utf8_lossy(&reason).into_owned(),
                ))
            }
            // PONG only needs to count as traffic; unknown commands are ignored (RFC 37).
            Command::Pong { .. } | Command::Ready(_) | Command::Unknown { .. } => {}
        },
        Frame::Message { body, more } => {
            let Some(frames) = assembler.push(body, more)? else {
                return Ok(Step::Go);
            };
            match inbound {
                Inbound::Channel { tx, peer, full, .. } => {
                    let mut delivered = Delivered {
                        peer: peer.clone(),
                        frames,
                        received: Instant::now(),
                        budget: None,
                        needs: 0,
                    };
                    if let Some(b) = budget {
                        let size: usize = delivered.frames.iter().map(Bytes::len).sum();
                        let need = b.share(size);
                        match b.sem.clone().try_acquire_many_owned(need) {
                            Ok(p) => delivered.budget = Some(p),
                            Err(_) => {
                                delivered.needs = need;
                                if let OnFull::Wait(paused) = full {
                                    paused.fetch_add(1, Ordering::Relaxed);
                                }
                                return Ok(Step::Hold(delivered));
                            }
                        }
                    }
                    match (tx.try_send(delivered), full) {
                        (Ok(()), _) => {}
                        (Err(mpsc::error::TrySendError::Full(d)), OnFull::Wait(paused)) => {
                            paused.fetch_add(1, Ordering::Relaxed);
                            return Ok(Step::Hold(d));
                        }
                        (Err(mpsc::error::TrySendError::Full(_)), OnFull::Drop(dropped)) => {
                            let n = dropped.fetch_add(1, Ordering::Relaxed);
                            if n.is_power_of_two() || n == 0 {
                                tracing::warn!(
                                    dropped = n + 1,
                                    "application queue full: message dropped"
                                );
                            }
                        }
                        (Err(mpsc::error::TrySendError::Closed(_)), _) => return Ok(Step::Closed),
                    }
                }
                Inbound::Topics { .. } => {
                    // Legacy (ZMTP 3.0) subscriptions: one frame, 0x01/0x00 + topic.
                    if let [only] = frames.as_slice() {
                        match only.first() {
                            Some(1) => apply_subscription(inbound, true, only.slice(1..))?,
                            Some(0) => apply_subscription(inbound, false, only.slice(1..))?,
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    Ok(Step::Go)
}

/// Applies a SUBSCRIBE or CANCEL; a SUBSCRIBE past the topic limits cuts the peer.
fn apply_subscription(inbound: &Inbound, subscribe: bool, topic: Bytes) -> Result<(), ZmtpError> {
    if let Inbound::Topics { topics, changed } = inbound {
        // A poisoned lock only means another task panicked mid-update; the set is still usable.
        let mut set = topics.lock().unwrap_or_else(|p| p.into_inner());
        if subscribe {
            set.subscribe(topic)?;
        } else {
            set.cancel(&topic);
        }
        drop(set);
        changed.notify_waiters();
    }
    Ok(())
}

async fn write_outbound<S>(
    conn: &mut Connection<S>,
    out: Outbound,
    peer_3_1: bool,
) -> Result<bool, ZmtpError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match out {
        Outbound::Message(parts) => conn.send_message(&parts).await?,
        Outbound::Encoded(framed) => conn.send_encoded(&framed).await?,
        Outbound::Subscribe(topic) if peer_3_1 => {
            conn.send_command(&Command::Subscribe(topic)).await?
        }
        Outbound::Cancel(topic) if peer_3_1 => conn.send_command(&Command::Cancel(topic)).await?,
        Outbound::Subscribe(topic) => conn.send_message(&[legacy(1, &topic)]).await?,
        Outbound::Cancel(topic) => conn.send_message(&[legacy(0, &topic)]).await?,
        Outbound::Trust => {}
    }
    Ok(true)
}

fn legacy(flag: u8, topic: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(1 + topic.len());
    b.put_u8(flag);
    b.put_slice(topic);
    b.freeze()
}
