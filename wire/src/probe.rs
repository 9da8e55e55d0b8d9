//! Health probes for the proxy.
//!
//! * [`zmtp_greeting`] — connect, exchange the greeting in libzmq's staged order and close
//!   without READY, so Salt never sees a peer. Proves the master's publisher / request-queue
//!   process is alive (not that its workers are).
//! * [`salt_ping`] — a REQ handshake and Salt's clear `{"enc":"clear","load":{"cmd":"ping"},
//!   "version":3}` on the request port. Traverses the master's worker pool end to end, costs no
//!   RSA work and creates no state. A 3008 cluster member that is not a Raft voter yet answers
//!   `cluster_retry`, reported as [`ProbeError::NotReady`].
//!
//! Both are bounded by one overall timeout and never panic. [`salt_ping_staged`] and
//! [`zmtp_greeting`] with a short deadline also tell a *stopped* master from a *busy* one: libzmq's
//! I/O thread completes the ZMTP handshake even while every Salt worker is busy, but when the master
//! process is stopped (SIGSTOP, a hung kernel task) nothing answers, although the kernel still
//! completes the TCP handshake from the listen backlog. So a connect succeeds on a hung master and
//! the handshake does not come: [`ProbeError::NoHandshake`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use thiserror::Error;
use tokio::net::TcpStream;

use crate::envelope::{EnvelopeError, Reply, RequestEnvelope};
use crate::zmtp::command::Command;
use crate::zmtp::conn::{Connection, HandshakeConfig};
use crate::zmtp::frame::{Frame, MessageAssembler};
use crate::zmtp::greeting::{self, Greeting};
use crate::zmtp::{SocketType, ZmtpError};

/// What a peer's greeting said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerGreeting {
    pub major: u8,
    pub minor: u8,
    /// E.g. `"NULL"`.
    pub mechanism: String,
    pub as_server: bool,
    /// From starting the connect to the complete greeting.
    pub elapsed: Duration,
}

/// A successful `ping`.
#[derive(Debug, Clone, PartialEq)]
pub struct SaltPingReply {
    /// The decoded reply; for a healthy master the echoed load (`{"cmd": "ping", ...}`).
    pub reply: Reply,
    pub elapsed: Duration,
}

/// Why a probe failed.
#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The TCP connect went through (the kernel's backlog), but the ZMTP handshake did not come
    /// within the deadline: the master process is not running (stopped or hung), not merely busy.
    #[error("connected, but no ZMTP handshake within {0:?} (the master process answers nothing: stopped or hung?)")]
    NoHandshake(Duration),
    /// The TCP connect itself did not complete within the handshake deadline.
    #[error("connect: no answer within {0:?}")]
    ConnectTimeout(Duration),
    #[error("ZMTP: {0}")]
    Zmtp(#[from] ZmtpError),
    #[error("reply is not a Salt message: {0}")]
    BadReply(#[from] EnvelopeError),
    /// `cluster_retry`: a cluster member that is up but not yet serving requests.
    #[error("master is not ready (cluster_retry)")]
    NotReady,
    /// The master answered with an error text such as `"bad load"` (alive, but refused).
    #[error("master refused the request: {0}")]
    Refused(String),
    /// The configured transport has no probe here (see [`crate::transport`]).
    #[error(transparent)]
    Transport(#[from] crate::transport::TransportError),
}

impl ProbeError {
    /// True only for `cluster_retry`.
    pub fn is_not_ready(&self) -> bool {
        matches!(self, ProbeError::NotReady)
    }
}

/// Connects to `addr` and reads the peer's ZMTP greeting within `timeout` (connect included). A
/// connect that does not complete in time is [`ProbeError::ConnectTimeout`]; a connect that does,
/// with no greeting in time, is [`ProbeError::NoHandshake`] (the hung-master shape).
pub async fn zmtp_greeting(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<PeerGreeting, ProbeError> {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut stream = tokio::time::timeout_at(deadline, TcpStream::connect(addr))
        .await
        .map_err(|_| ProbeError::ConnectTimeout(timeout))?
        .map_err(ProbeError::Connect)?;
    let _ = stream.set_nodelay(true);
    let g = tokio::time::timeout_at(
        deadline,
        greeting::exchange_raw(&mut stream, &Greeting::ours(false)),
    )
    .await
    .map_err(|_| ProbeError::NoHandshake(timeout))??;
    // Close without READY: the peer's socket never sees us.
    drop(stream);
    Ok(PeerGreeting {
        major: g.major,
        minor: g.minor,
        mechanism: g.mechanism.name(),
        as_server: g.as_server,
        elapsed: start.elapsed(),
    })
}

/// Sends Salt's clear `ping` to the request port at `addr` and waits for the reply, all within
/// `timeout`. PINGs from the master during the wait are answered. Same as
/// [`salt_ping_staged`]`(addr, timeout, timeout)`.
pub async fn salt_ping(addr: SocketAddr, timeout: Duration) -> Result<SaltPingReply, ProbeError> {
    salt_ping_staged(addr, timeout, timeout).await
}

/// Salt's clear `ping` in two stages with their own deadlines: the connect and the ZMTP handshake
/// (greeting and READY, answered by libzmq's I/O thread) within `handshake_timeout`, and the whole
/// exchange, the ping's reply from a Salt worker included, within `timeout`. A busy master passes
/// the first stage at once and may take up to `timeout` to answer; a stopped one fails the first
/// stage ([`ProbeError::NoHandshake`]) after `handshake_timeout`.
pub async fn salt_ping_staged(
    addr: SocketAddr,
    handshake_timeout: Duration,
    timeout: Duration,
) -> Result<SaltPingReply, ProbeError> {
    let start = Instant::now();
    let reply = salt_request(addr, handshake_timeout, timeout, &RequestEnvelope::ping()).await?;
    if reply.is_cluster_retry() {
        return Err(ProbeError::NotReady);
    }
    if let Reply::Text(t) = reply {
        return Err(ProbeError::Refused(t));
    }
    Ok(SaltPingReply {
        reply,
        elapsed: start.elapsed(),
    })
}

/// Sends one clear `request` to the request port at `addr` and returns the master's reply as it
/// came, in the same two stages as [`salt_ping_staged`] (handshake within `handshake_timeout`,
/// everything within `timeout`). The caller interprets the reply.
pub async fn salt_request(
    addr: SocketAddr,
    handshake_timeout: Duration,
    timeout: Duration,
    request: &RequestEnvelope,
) -> Result<Reply, ProbeError> {
    let handshake_timeout = handshake_timeout.min(timeout);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut handshaken = false;
    let inner = request_inner(addr, handshake_timeout, &mut handshaken, request);
    match tokio::time::timeout_at(deadline, inner).await {
        Err(_) | Ok(Err(ProbeError::Zmtp(ZmtpError::Timeout(_)))) if !handshaken => {
            Err(ProbeError::NoHandshake(handshake_timeout))
        }
        Err(_) | Ok(Err(ProbeError::Zmtp(ZmtpError::Timeout(_)))) => {
            Err(ProbeError::Timeout(timeout))
        }
        Ok(r) => r,
    }
}

/// Largest reply we accept from a probe request (an echoed load or a signed refusal is tiny).
const MAX_PING_REPLY: usize = 1024 * 1024;

/// `handshaken` is set once the ZMTP handshake is done (the caller tells the two stages apart).
async fn request_inner(
    addr: SocketAddr,
    handshake_timeout: Duration,
    handshaken: &mut bool,
    request: &RequestEnvelope,
) -> Result<Reply, ProbeError> {
    let hs_deadline = tokio::time::Instant::now() + handshake_timeout;
    let stream = tokio::time::timeout_at(hs_deadline, TcpStream::connect(addr))
        .await
        .map_err(|_| ProbeError::ConnectTimeout(handshake_timeout))?
        .map_err(ProbeError::Connect)?;
    let _ = stream.set_nodelay(true);
    let mut hs = HandshakeConfig::new(SocketType::Req);
    hs.timeout = hs_deadline.saturating_duration_since(tokio::time::Instant::now());
    hs.max_frame_size = MAX_PING_REPLY;
    let mut conn = match Connection::handshake(stream, &hs).await {
        Err(ZmtpError::Timeout(_)) => return Err(ProbeError::NoHandshake(handshake_timeout)),
        r => r?,
    };
    *handshaken = true;
    let request = Bytes::from(request.encode());
    conn.send_message(&[Bytes::new(), request]).await?;
    let mut assembler = MessageAssembler::new(8, MAX_PING_REPLY);
    loop {
        match conn.read_frame().await? {
            Frame::Command(body) => match Command::parse(&body).map_err(ZmtpError::from)? {
                Command::Ping { context, .. } => {
                    conn.send_command(&Command::Pong { context }).await?
                }
                Command::Error(r) => {
                    return Err(
                        ZmtpError::PeerError(String::from_utf8_lossy(&r).into_owned()).into(),
                    )
                }
                _ => {}
            },
            Frame::Message { body, more } => {
                if let Some(frames) = assembler.push(body, more).map_err(ZmtpError::from)? {
                    let payload = match frames.as_slice() {
                        [delim, payload] if delim.is_empty() => payload,
                        _ => {
                            return Err(EnvelopeError::Decode(format!(
                                "expected [\"\", payload], got {} frames",
                                frames.len()
                            ))
                            .into())
                        }
                    };
                    let reply = Reply::decode(payload)?;
                    conn.shutdown().await;
                    return Ok(reply);
                }
            }
        }
    }
}
