//! Salt's `tcp` request client (`salt/transport/tcp.py`, `RequestClient` in 3008.5), the seam's
//! [`RequestClient`] for `transport: tcp`, over TCP or TLS (Salt's `ssl`, feature `tls`).
//!
//! A request goes out as `{"head": {"mid": <uuid4>}, "body": <envelope>}` and its reply is the
//! message whose `head` echoes that `mid` ([`super::request_frame`], [`super::FrameDecoder`]).
//! Salt's client keeps one connection and may have several requests in flight on it; the seam's
//! client has one at a time (`send` borrows it), which keeps the same wire. As the ZeroMQ client
//! ([`crate::zmtp::ReqSocket`]), after a timeout or any error the connection is dropped and the
//! next request dials afresh, so a late reply can never be taken for the next request's; an idle
//! connection the master closed is noticed before a request is written on it.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{new_mid, request_frame, FrameDecoder};
use crate::accept::Keepalive;
use crate::envelope;
use crate::transport::{PublishClientOptions, RequestClient, RequestClientOptions, RequestError};

/// The TLS side of a client (Salt's `ssl`); the same type the probes use.
#[cfg(feature = "tls")]
pub use super::probe::TlsClient;

/// Messages with another `mid` tolerated while waiting for a reply (none are expected: Salt's
/// server only answers requests).
const MAX_OTHER_MESSAGES: usize = 16;

pub(crate) use crate::salt_stream::Stream;

/// How to reach a master: where from, keepalive, TLS.
#[derive(Debug, Clone, Default)]
pub(crate) struct Dial {
    pub source: Option<IpAddr>,
    pub keepalive: Option<Keepalive>,
    #[cfg(feature = "tls")]
    pub tls: Option<TlsClient>,
}

impl From<&RequestClientOptions> for Dial {
    fn from(opts: &RequestClientOptions) -> Self {
        Dial {
            source: opts.source,
            keepalive: opts.keepalive,
            #[cfg(feature = "tls")]
            tls: opts.tls.clone(),
        }
    }
}

impl From<&PublishClientOptions> for Dial {
    fn from(opts: &PublishClientOptions) -> Self {
        Dial {
            source: opts.source,
            keepalive: opts.keepalive,
            #[cfg(feature = "tls")]
            tls: opts.tls.clone(),
        }
    }
}

/// Connects to `addr` (bound to `source` first when given), tunes the socket, and makes the TLS
/// handshake when configured, all within `timeout`.
pub(crate) async fn dial(
    addr: SocketAddr,
    how: &Dial,
    timeout: Duration,
) -> Result<Stream, std::io::Error> {
    let connect = async {
        let tcp = match how.source {
            None => TcpStream::connect(addr).await?,
            Some(ip) => {
                let sock = if ip.is_ipv4() {
                    tokio::net::TcpSocket::new_v4()?
                } else {
                    tokio::net::TcpSocket::new_v6()?
                };
                sock.bind(SocketAddr::new(ip, 0))?;
                sock.connect(addr).await?
            }
        };
        crate::accept::tune_stream(&tcp, how.keepalive.as_ref());
        #[cfg(feature = "tls")]
        if let Some(tls) = &how.tls {
            let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
            let s = connector
                .connect(tls.server_name.clone(), tcp)
                .await
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("TLS handshake: {e} (the minion's `ssl` must match the master's)"),
                    )
                })?;
            return Ok(Box::pin(s) as Stream);
        }
        Ok(Box::pin(tcp) as Stream)
    };
    tokio::time::timeout(timeout, connect).await.map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no connection within {timeout:?}"),
        )
    })?
}

/// The payload a publish crosses the seam as, from a frame's `body`: bytes (Salt's publish
/// server frames the already serialised envelope) are the payload itself; a map is encoded.
pub(crate) fn body_payload(body: &envelope::Value) -> Option<Bytes> {
    match body {
        envelope::Value::Binary(b) => Some(Bytes::copy_from_slice(b)),
        envelope::Value::String(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
        envelope::Value::Nil => None,
        other => Some(Bytes::from(envelope::encode(other))),
    }
}

struct Conn {
    s: Stream,
    dec: FrameDecoder,
}

impl Conn {
    /// False when the peer closed (or broke) the connection while it was idle.
    async fn still_open(&mut self) -> bool {
        let mut probe = [0u8; 1024];
        match tokio::time::timeout(Duration::ZERO, self.s.read(&mut probe)).await {
            Err(_) => true,
            Ok(Ok(0)) | Ok(Err(_)) => false,
            // Bytes nobody asked for: nothing may arrive between requests; start clean.
            Ok(Ok(_)) => false,
        }
    }
}

/// Salt's `tcp` request client for one master address ([`RequestClient`]).
pub struct TcpRequestClient {
    addr: SocketAddr,
    how: Dial,
    connect_timeout: Duration,
    max_payload: usize,
    conn: Option<Conn>,
    dials: u64,
}

impl TcpRequestClient {
    /// Nothing is dialled until the first request.
    pub fn new(addr: SocketAddr, opts: &RequestClientOptions) -> Self {
        TcpRequestClient {
            addr,
            how: Dial::from(opts),
            connect_timeout: opts.connect_timeout,
            max_payload: opts.max_payload,
            conn: None,
            dials: 0,
        }
    }

    /// Connections established so far (one more per re-dial).
    pub fn dial_count(&self) -> u64 {
        self.dials
    }

    async fn exchange(
        &mut self,
        body: envelope::Value,
        timeout: Duration,
    ) -> Result<Bytes, RequestError> {
        if let Some(c) = self.conn.as_mut() {
            if !c.still_open().await {
                self.conn = None;
            }
        }
        let conn = match self.conn.take() {
            Some(c) => self.conn.insert(c),
            None => {
                let s = dial(self.addr, &self.how, self.connect_timeout.min(timeout))
                    .await
                    .map_err(|e| RequestError::Connect {
                        addr: self.addr,
                        source: Box::new(e),
                    })?;
                self.dials += 1;
                self.conn.insert(Conn {
                    s,
                    dec: FrameDecoder::new(self.max_payload),
                })
            }
        };
        let mid = new_mid();
        let frame = request_frame(&mid, body);
        conn.s
            .write_all(&frame)
            .await
            .map_err(|_| RequestError::Disconnected)?;
        conn.s
            .flush()
            .await
            .map_err(|_| RequestError::Disconnected)?;
        let mut others = 0;
        let mut chunk = vec![0u8; 16 * 1024];
        loop {
            while let Some(msg) = conn
                .dec
                .next_message()
                .map_err(|_| RequestError::Malformed("reply is not Salt's tcp framing"))?
            {
                if msg.mid() == Some(mid.as_bytes()) {
                    // The reply object itself (a dict, or the encrypted bytes of an `aes` reply):
                    // encoded, it is what a ZeroMQ reply frame holds (`salt.payload.dumps`).
                    return Ok(Bytes::from(envelope::encode(&msg.body)));
                }
                others += 1;
                if others > MAX_OTHER_MESSAGES {
                    return Err(RequestError::Malformed(
                        "no message from the master carries the request's mid",
                    ));
                }
            }
            let n = conn
                .s
                .read(&mut chunk)
                .await
                .map_err(|_| RequestError::Disconnected)?;
            if n == 0 {
                return Err(RequestError::Disconnected);
            }
            if crate::salt_tcp::looks_like_zmtp(&chunk[..n]) && conn.dec.buffered() == 0 {
                return Err(RequestError::Malformed(
                    "the master answers with a ZMTP greeting: it speaks `transport: zeromq`; set the minion's `transport` to the master's",
                ));
            }
            conn.dec
                .push(&chunk[..n])
                .map_err(|_| RequestError::Malformed("reply over the size limit"))?;
        }
    }
}

impl RequestClient for TcpRequestClient {
    fn peer_addr(&self) -> SocketAddr {
        self.addr
    }

    async fn send(&mut self, payload: Bytes, timeout: Duration) -> Result<Bytes, RequestError> {
        let body = envelope::decode(&payload)
            .map_err(|_| RequestError::Malformed("the request payload is not msgpack"))?;
        match tokio::time::timeout(timeout, self.exchange(body, timeout)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => {
                self.conn = None;
                Err(e)
            }
            Err(_) => {
                self.conn = None;
                Err(RequestError::Timeout(timeout))
            }
        }
    }
}
