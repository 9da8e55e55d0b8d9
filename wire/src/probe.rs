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
//! Both are bounded by one overall timeout and never panic.

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
}

impl ProbeError {
    /// True only for `cluster_retry`.
    pub fn is_not_ready(&self) -> bool {
        matches!(self, ProbeError::NotReady)
    }
}

/// Connects to `addr` and reads the peer's ZMTP greeting within `timeout`.
pub async fn zmtp_greeting(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<PeerGreeting, ProbeError> {
    let start = Instant::now();
    let work = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(ProbeError::Connect)?;
        let _ = stream.set_nodelay(true);
        let g = greeting::exchange_raw(&mut stream, &Greeting::ours(false)).await?;
        // Close without READY: the peer's socket never sees us.
        drop(stream);
        Ok::<_, ProbeError>(g)
    };
    let g = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| ProbeError::Timeout(timeout))??;
    Ok(PeerGreeting {
        major: g.major,
        minor: g.minor,
        mechanism: g.mechanism.name(),
        as_server: g.as_server,
        elapsed: start.elapsed(),
    })
}

/// Sends Salt's clear `ping` to the request port at `addr` and waits for the reply, all within
/// `timeout`. PINGs from the master during the wait are answered.
pub async fn salt_ping(addr: SocketAddr, timeout: Duration) -> Result<SaltPingReply, ProbeError> {
    let start = Instant::now();
    let reply = match tokio::time::timeout(timeout, ping_inner(addr, timeout)).await {
        Err(_) | Ok(Err(ProbeError::Zmtp(ZmtpError::Timeout(_)))) => {
            return Err(ProbeError::Timeout(timeout))
        }
        Ok(r) => r?,
    };
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

/// Largest reply we accept from a ping (an echoed load is tiny).
const MAX_PING_REPLY: usize = 1024 * 1024;

async fn ping_inner(addr: SocketAddr, timeout: Duration) -> Result<Reply, ProbeError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(ProbeError::Connect)?;
    let _ = stream.set_nodelay(true);
    let mut hs = HandshakeConfig::new(SocketType::Req);
    hs.timeout = timeout;
    hs.max_frame_size = MAX_PING_REPLY;
    let mut conn = Connection::handshake(stream, &hs).await?;
    let request = Bytes::from(RequestEnvelope::ping().encode());
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
