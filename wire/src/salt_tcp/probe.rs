//! Salt-aware health probes for the `tcp` and `ws` transports, TLS included (feature `tls`): what
//! [`crate::probe::salt_ping_staged`] does over ZMTP. Request port: connect, (TLS handshake),
//! (websocket upgrade on `/ws`), Salt's clear `ping` framed for the transport, its reply read within
//! the deadline; a 3008 cluster member answering `cluster_retry` is [`SaltProbeError::NotReady`].
//! Publish port: connect, (TLS handshake), (websocket upgrade), then a clean close: nothing is sent
//! that Salt's publish server would have to parse. On plain `tcp`, [`reads_check`] (below): Salt's
//! `tcp` publish server reads every subscriber's bytes (`PublishServer._stream_read`, minions'
//! presence messages, into an `Unpacker` of 1 MiB), so a stopped one is told there as well, and
//! a hung master is DOWN within `interval + fall x handshake_timeout` even when it stopped while
//! a request-port check waited for its `ping`'s answer (up to `timeout`).
//!
//! Two stages, as for ZeroMQ: the connect and the handshakes within `handshake_timeout`, the
//! whole exchange within `timeout`. A TLS handshake and the websocket upgrade are answered by the
//! master's event loop even while its workers are busy, so they tell a stopped master at once.
//!
//! Plain `tcp` has no handshake: Salt's server sends nothing before the reply. Its stage is
//! [`reads_check`] instead: **the master's process reads what it is sent.** In Salt 3008 the
//! request port of a `tcp` master is served by the `PoolRouter` process (worker pools, the
//! default: `channel/server.py` `PoolRoutingChannel._run_pool_router`), an asyncio loop that
//! reads every connection and forwards whole requests to the workers over IPC; it keeps reading
//! while every worker is busy. A stopped master reads nothing, and its kernel takes only what fits
//! in the connection's receive buffer (about 170 KiB with Linux's default `tcp_rmem`). So the
//! stage writes [`READ_STAGE_BYTES`] of a message that never ends (the start of
//! `{"head": {...}, "body": <bin>}`; Salt's `Unpacker` just buffers it), from a socket with the
//! smallest send buffer, and passes when all of it was taken within `handshake_timeout`. It then
//! resets the connection: Salt logs a reset stream at `trace` ("req client disconnected"), and
//! nothing else, since no request was ever complete. The `ping` follows on a connection of its own.
//!
//! A master that speaks another transport is named: a ZMTP greeting is `zeromq`, an HTTP answer is
//! `ws`. Nothing here sends bytes Salt's `tcp` server fails to parse (the ZMTP greeting the ZeroMQ
//! probe sends makes a `tcp` master log a `TypeError` traceback per check).

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant as Deadline;

use super::{encode_message, looks_like_zmtp, new_mid, request_frame, FrameDecoder, FrameError};
use crate::envelope::{self, EnvelopeError, Reply, RequestEnvelope};
use crate::salt_ws::{self as ws, WsDecoder, WsError, WsMessage};

/// Largest reply a probe reads.
pub const MAX_REPLY: usize = 1024 * 1024;
/// Messages with another `mid` (or websocket pings) tolerated before the reply.
const MAX_OTHER_MESSAGES: usize = 16;

/// Salt's `transport` (the probes here serve the two that are not ZeroMQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Ws,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Ws => "ws",
        }
    }
}

/// The TLS client a probe uses: the configuration and the name the master's certificate must hold.
#[cfg(feature = "tls")]
#[derive(Clone)]
pub struct TlsClient {
    pub config: std::sync::Arc<tokio_rustls::rustls::ClientConfig>,
    pub server_name: tokio_rustls::rustls::pki_types::ServerName<'static>,
}

#[cfg(feature = "tls")]
impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsClient({:?})", self.server_name)
    }
}

/// What to probe and how.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub transport: Transport,
    #[cfg(feature = "tls")]
    pub tls: Option<TlsClient>,
}

impl Target {
    pub fn plain(addr: SocketAddr, transport: Transport) -> Self {
        Target {
            addr,
            transport,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

#[derive(Debug, Error)]
pub enum SaltProbeError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("connect: no answer within {0:?}")]
    ConnectTimeout(Duration),
    /// Connected (the kernel's backlog), but the handshake did not come: stopped or hung.
    #[error("connected, but no {what} within {after:?} (the master process answers nothing: stopped or hung?{hint})")]
    NoHandshake {
        what: &'static str,
        after: Duration,
        hint: &'static str,
    },
    #[error("no reply within {0:?} (master busy, or its workers stuck)")]
    Timeout(Duration),
    #[error("TLS handshake failed: {0} (saltgate's `ssl` must match the masters' `ssl`)")]
    Tls(String),
    /// The peer closed without a reply.
    #[error("the master closed the connection without answering: does it speak `transport: {0}`? set `transport` to the masters' own (zeromq, tcp or ws)")]
    Closed(&'static str),
    #[error("the master answers with {sign}: it speaks `transport: {heard}`, not `{configured}`; set `transport: {heard}` (the masters' own `transport`)")]
    WrongTransport {
        heard: &'static str,
        sign: &'static str,
        configured: &'static str,
    },
    #[error("tcp framing: {0}")]
    Frame(#[from] FrameError),
    #[error("{0}")]
    Ws(#[from] WsError),
    #[error("i/o: {0}")]
    Io(std::io::Error),
    #[error("reply is not a Salt message: {0}")]
    BadReply(#[from] EnvelopeError),
    #[error("master is not ready (cluster_retry)")]
    NotReady,
    #[error("master refused the request: {0}")]
    Refused(String),
}

impl SaltProbeError {
    pub fn is_not_ready(&self) -> bool {
        matches!(self, SaltProbeError::NotReady)
    }
}

/// A successful `ping`.
#[derive(Debug, Clone, PartialEq)]
pub struct PingReply {
    pub reply: Reply,
    pub elapsed: Duration,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}
type Stream = Pin<Box<dyn Io>>;

/// The publish port's check: connect, TLS handshake, websocket upgrade (as configured) within
/// `handshake_timeout`, then a clean close.
pub async fn publish_check(
    target: &Target,
    handshake_timeout: Duration,
) -> Result<Duration, SaltProbeError> {
    let start = Instant::now();
    if target.transport == Transport::Tcp && !has_tls(target) {
        // Nothing to handshake: the publish server's process reads what minions send (their
        // presence messages), so the same stage as the request port's tells a stopped one.
        reads_check(target.addr, handshake_timeout).await?;
        return Ok(start.elapsed());
    }
    let hs = Deadline::now() + handshake_timeout;
    let (mut s, _rest) = open(target, hs, handshake_timeout).await?;
    if target.transport == Transport::Ws {
        let _ = s
            .write_all(&ws::client_frame(ws::OP_CLOSE, &1000u16.to_be_bytes()))
            .await;
    }
    close(&mut s, hs).await;
    Ok(start.elapsed())
}

/// Salt's clear `ping` on the request port, in two stages (see the module). On plain `tcp` the
/// handshake stage is [`reads_check`], then the `ping` within what is left of `timeout`.
pub async fn salt_ping_staged(
    target: &Target,
    handshake_timeout: Duration,
    timeout: Duration,
) -> Result<PingReply, SaltProbeError> {
    let start = Instant::now();
    let handshake_timeout = handshake_timeout.min(timeout);
    let mut left = timeout;
    if target.transport == Transport::Tcp && !has_tls(target) {
        reads_check(target.addr, handshake_timeout).await?;
        left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(SaltProbeError::Timeout(timeout));
        }
    }
    let reply = salt_request(
        target,
        handshake_timeout.min(left),
        left,
        &RequestEnvelope::ping(),
    )
    .await
    .map_err(|e| match e {
        SaltProbeError::Timeout(_) => SaltProbeError::Timeout(timeout),
        e => e,
    })?;
    if reply.is_cluster_retry() {
        return Err(SaltProbeError::NotReady);
    }
    if let Reply::Text(t) = reply {
        return Err(SaltProbeError::Refused(t));
    }
    Ok(PingReply {
        reply,
        elapsed: start.elapsed(),
    })
}

fn has_tls(target: &Target) -> bool {
    #[cfg(feature = "tls")]
    return target.tls.is_some();
    #[cfg(not(feature = "tls"))]
    {
        let _ = target;
        false
    }
}

/// Bytes [`reads_check`] writes: three times what a stopped Linux master's kernel takes with the
/// default `net.ipv4.tcp_rmem` (131072: about 170 KiB measured on loopback), well under what
/// Salt's `Unpacker` buffers (100 MiB). A master whose `tcp_rmem` default (its middle value) is
/// over about 400 KiB could take it all while stopped: there, a stopped master is told by
/// `timeout` again, as before this stage.
pub const READ_STAGE_BYTES: usize = 512 * 1024;

/// The handshake stage of plain `tcp` (see the module): connect, then write
/// [`READ_STAGE_BYTES`] of an unfinished Salt message within `handshake_timeout`; reset. Bytes
/// from the master (a ZMTP greeting, an HTTP answer) or a close also pass the stage: the process
/// is there, and the `ping` that follows names what it speaks.
pub async fn reads_check(
    addr: SocketAddr,
    handshake_timeout: Duration,
) -> Result<(), SaltProbeError> {
    let hs = Deadline::now() + handshake_timeout;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(SaltProbeError::Connect)?;
    // The smallest send buffer (Linux rounds it up to about 4.6 KiB): what the stage counts is
    // what the master's side took, not what ours holds.
    let _ = socket.set_send_buffer_size(1);
    let mut tcp = tokio::time::timeout_at(hs, socket.connect(addr))
        .await
        .map_err(|_| SaltProbeError::ConnectTimeout(handshake_timeout))?
        .map_err(SaltProbeError::Connect)?;
    // Reset on close (linger 0, which never blocks the drop): no orphaned socket holding unsent
    // bytes to a stopped master.
    let _ = socket2::SockRef::from(&tcp).set_linger(Some(Duration::ZERO));
    let payload = unfinished_message(READ_STAGE_BYTES);
    let (mut r, mut w) = tcp.split();
    let mut answer = [0u8; 64];
    let stage = async {
        tokio::select! {
            written = w.write_all(&payload) => written.map(|_| ()),
            // Anything from the master, or its close: the process is alive.
            _ = r.read(&mut answer) => Ok(()),
        }
    };
    match tokio::time::timeout_at(hs, stage).await {
        Ok(Ok(())) => Ok(()),
        // Reset by the master while we wrote: its process acted.
        Ok(Err(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ) =>
        {
            Ok(())
        }
        Ok(Err(e)) => Err(SaltProbeError::Io(e)),
        Err(_) => Err(SaltProbeError::NoHandshake {
            what: "read of the check's bytes",
            after: handshake_timeout,
            hint: "; a running tcp master reads them even while its workers are busy",
        }),
    }
}

/// `len` bytes of `{"head": {"mid": ...}, "body": <bin32 of twice len>}`: the start of a message
/// that never ends.
fn unfinished_message(len: usize) -> Vec<u8> {
    let mut out = encode_message(
        envelope::map(vec![("mid", envelope::text(&new_mid()))]),
        envelope::Value::Nil,
    );
    out.pop(); // the body's nil
    out.push(0xc6);
    out.extend_from_slice(&((2 * len) as u32).to_be_bytes());
    out.resize(len, 0);
    out
}

#[cfg(test)]
pub(crate) fn unfinished_message_for_tests(len: usize) -> Vec<u8> {
    unfinished_message(len)
}

/// One clear request and its reply as it came (the caller interprets it).
pub async fn salt_request(
    target: &Target,
    handshake_timeout: Duration,
    timeout: Duration,
    request: &RequestEnvelope,
) -> Result<Reply, SaltProbeError> {
    let handshake_timeout = handshake_timeout.min(timeout);
    let hs = Deadline::now() + handshake_timeout;
    let deadline = Deadline::now() + timeout;
    let (mut s, rest) = open(target, hs, handshake_timeout).await?;
    let exchange = async {
        let reply = match target.transport {
            Transport::Tcp => tcp_exchange(&mut s, request).await?,
            Transport::Ws => ws_exchange(&mut s, rest, request).await?,
        };
        close(&mut s, deadline).await;
        Ok(reply)
    };
    tokio::time::timeout_at(deadline, exchange)
        .await
        .map_err(|_| SaltProbeError::Timeout(timeout))?
}

/// Connect, TLS, websocket upgrade, all by `hs`. Returns the stream and any bytes read past the
/// upgrade's response.
async fn open(
    target: &Target,
    hs: Deadline,
    hs_timeout: Duration,
) -> Result<(Stream, Vec<u8>), SaltProbeError> {
    let tcp = tokio::time::timeout_at(hs, TcpStream::connect(target.addr))
        .await
        .map_err(|_| SaltProbeError::ConnectTimeout(hs_timeout))?
        .map_err(SaltProbeError::Connect)?;
    let _ = tcp.set_nodelay(true);
    #[cfg(feature = "tls")]
    let mut s: Stream = match &target.tls {
        Some(tls) => {
            let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
            let tls_stream =
                tokio::time::timeout_at(hs, connector.connect(tls.server_name.clone(), tcp))
                    .await
                    .map_err(|_| SaltProbeError::NoHandshake {
                        what: "TLS handshake",
                        after: hs_timeout,
                        hint: "",
                    })?
                    .map_err(|e| tls_error(e, target.transport))?;
            Box::pin(tls_stream)
        }
        None => Box::pin(tcp),
    };
    #[cfg(not(feature = "tls"))]
    let mut s: Stream = Box::pin(tcp);
    if target.transport == Transport::Tcp {
        return Ok((s, Vec::new()));
    }
    let key = ws::new_key();
    let host = target.addr.to_string();
    let upgrade = async {
        s.write_all(&ws::handshake_request(&host, ws::WS_PATH, &key))
            .await
            .map_err(SaltProbeError::Io)?;
        let mut buf = Vec::with_capacity(1024);
        loop {
            if looks_like_zmtp(&buf) && !buf.is_empty() {
                return Err(SaltProbeError::WrongTransport {
                    heard: "zeromq",
                    sign: "a ZMTP greeting",
                    configured: "ws",
                });
            }
            if let Some(n) = ws::read_handshake(&buf, &key)? {
                return Ok(buf.split_off(n));
            }
            if read_some(&mut s, &mut buf, ws::MAX_HANDSHAKE).await? == 0 {
                return Err(SaltProbeError::Closed("ws"));
            }
        }
    };
    let rest =
        tokio::time::timeout_at(hs, upgrade)
            .await
            .map_err(|_| SaltProbeError::NoHandshake {
                what: "websocket upgrade",
                after: hs_timeout,
                hint: " or it does not speak `transport: ws`",
            })??;
    Ok((s, rest))
}

#[cfg(feature = "tls")]
fn tls_error(e: std::io::Error, transport: Transport) -> SaltProbeError {
    let text = e.to_string();
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        return SaltProbeError::Tls(format!(
            "{text}: the master closed the connection (does it have `ssl` on, and `transport: {}`?)",
            transport.as_str()
        ));
    }
    SaltProbeError::Tls(text)
}

async fn read_some(
    s: &mut Stream,
    buf: &mut Vec<u8>,
    limit: usize,
) -> Result<usize, SaltProbeError> {
    let mut chunk = [0u8; 8192];
    let n = s.read(&mut chunk).await.map_err(SaltProbeError::Io)?;
    if buf.len() + n > limit + chunk.len() {
        return Err(FrameError::TooLarge {
            offset: 0,
            size: (buf.len() + n) as u64,
            limit,
        }
        .into());
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// A bounded clean close: TLS close_notify where there is TLS, then FIN.
async fn close(s: &mut Stream, by: Deadline) {
    let by = by.min(Deadline::now() + Duration::from_millis(200));
    let _ = tokio::time::timeout_at(by, s.shutdown()).await;
}

async fn tcp_exchange(s: &mut Stream, request: &RequestEnvelope) -> Result<Reply, SaltProbeError> {
    let mid = new_mid();
    s.write_all(&request_frame(&mid, request.to_value()))
        .await
        .map_err(SaltProbeError::Io)?;
    let mut dec = FrameDecoder::new(MAX_REPLY);
    let mut first = true;
    let mut others = 0;
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk).await.map_err(SaltProbeError::Io)?;
        if n == 0 {
            return Err(SaltProbeError::Closed("tcp"));
        }
        let got = &chunk[..n];
        if first {
            first = false;
            if looks_like_zmtp(got) {
                return Err(SaltProbeError::WrongTransport {
                    heard: "zeromq",
                    sign: "a ZMTP greeting",
                    configured: "tcp",
                });
            }
            if got.starts_with(b"HTTP/") {
                return Err(SaltProbeError::WrongTransport {
                    heard: "ws",
                    sign: "HTTP",
                    configured: "tcp",
                });
            }
        }
        dec.push(got)?;
        while let Some(msg) = dec.next_message()? {
            if msg.mid() == Some(mid.as_bytes()) {
                return Ok(Reply::from_value(msg.body));
            }
            others += 1;
            if others > MAX_OTHER_MESSAGES {
                return Err(FrameError::NotFraming("no message carries the request's mid").into());
            }
        }
    }
}

async fn ws_exchange(
    s: &mut Stream,
    rest: Vec<u8>,
    request: &RequestEnvelope,
) -> Result<Reply, SaltProbeError> {
    s.write_all(&ws::client_frame(ws::OP_BINARY, &request.encode()))
        .await
        .map_err(SaltProbeError::Io)?;
    let mut dec = WsDecoder::new(MAX_REPLY);
    dec.push(&rest)?;
    let mut others = 0;
    let mut chunk = [0u8; 8192];
    loop {
        while let Some(msg) = dec.next_message()? {
            match msg {
                WsMessage::Binary(b) => {
                    let reply = Reply::from_value(envelope::decode(&b)?);
                    let _ = s
                        .write_all(&ws::client_frame(ws::OP_CLOSE, &1000u16.to_be_bytes()))
                        .await;
                    return Ok(reply);
                }
                WsMessage::Close(_) => return Err(SaltProbeError::Closed("ws")),
                WsMessage::Ping(p) => s
                    .write_all(&ws::client_frame(ws::OP_PONG, &p))
                    .await
                    .map_err(SaltProbeError::Io)?,
                WsMessage::Text(_) | WsMessage::Pong(_) => {}
            }
            others += 1;
            if others > MAX_OTHER_MESSAGES {
                return Err(WsError::Frame {
                    offset: 0,
                    problem: "no binary reply among the first messages".into(),
                }
                .into());
            }
        }
        let n = s.read(&mut chunk).await.map_err(SaltProbeError::Io)?;
        if n == 0 {
            return Err(SaltProbeError::Closed("ws"));
        }
        dec.push(&chunk[..n])?;
    }
}
