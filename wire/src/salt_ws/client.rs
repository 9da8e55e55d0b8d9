//! Salt's `ws` request client (`salt/transport/ws.py`, `RequestClient` in 3008.5), the seam's
//! [`RequestClient`] for `transport: ws`, over TCP or TLS (Salt's `ssl`, feature `tls`).
//!
//! A request is one binary message holding the envelope's msgpack bytes as they are
//! (`salt.payload.dumps(load)`), and its reply is the next data message on the same websocket
//! (`salt.payload.dumps(reply)`), which crosses the seam as it came. The upgrade is
//! `GET / HTTP/1.1` (Salt's client turns the minion's `master_uri`, `tcp://ip:port`, into
//! `http://ip:port`; with `ssl`, `https://`), `Host: ip:port`.
//!
//! Salt 3008.5's client dials a new websocket for every request (and leaves the old one open).
//! This one keeps its websocket between requests, which Salt's server serves the same (it reads
//! messages in a loop and answers each), and, as the other clients of the seam, drops it after a
//! timeout or any error so the next request dials afresh; an idle websocket the master closed (or
//! wrote anything on) is noticed before a request is written on it. Pings from the master are
//! answered while waiting; a text message is skipped (Salt sends none; its `"close"` is a client
//! word).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;

use super::conn::{ConnError, WsConn};
use super::{WsMessage, OP_BINARY};
use crate::salt_tcp::client::{dial, Dial};
use crate::transport::{RequestClient, RequestClientOptions, RequestError};

/// The path a minion's request client upgrades on (its `master_uri` has none).
pub const REQUEST_PATH: &str = "/";

/// Text and pong messages tolerated while waiting for a reply.
const MAX_OTHER_MESSAGES: usize = 16;

/// Salt's `ws` request client for one master address ([`RequestClient`]).
pub struct WsRequestClient {
    addr: SocketAddr,
    how: Dial,
    connect_timeout: Duration,
    max_payload: usize,
    conn: Option<WsConn>,
    dials: u64,
}

/// `Host:` for `addr` (an IPv6 address in brackets).
pub(crate) fn host_of(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}

/// Dials `addr` and makes the websocket handshake on `path`, all within `timeout`.
pub(crate) async fn open(
    addr: SocketAddr,
    how: &Dial,
    path: &str,
    max: usize,
    timeout: Duration,
) -> Result<WsConn, ConnError> {
    let start = tokio::time::Instant::now();
    let s = dial(addr, how, timeout).await?;
    let left = timeout.saturating_sub(start.elapsed());
    WsConn::connect(s, &host_of(addr), path, max, left).await
}

impl WsRequestClient {
    /// Nothing is dialled until the first request.
    pub fn new(addr: SocketAddr, opts: &RequestClientOptions) -> Self {
        WsRequestClient {
            addr,
            how: Dial::from(opts),
            connect_timeout: opts.connect_timeout,
            max_payload: opts.max_payload,
            conn: None,
            dials: 0,
        }
    }

    /// Websockets opened so far (one more per re-dial).
    pub fn dial_count(&self) -> u64 {
        self.dials
    }

    async fn exchange(&mut self, payload: &[u8], timeout: Duration) -> Result<Bytes, RequestError> {
        if let Some(c) = self.conn.as_mut() {
            if !c.still_open().await {
                self.conn = None;
            }
        }
        let conn = match self.conn.take() {
            Some(c) => self.conn.insert(c),
            None => {
                let c = open(
                    self.addr,
                    &self.how,
                    REQUEST_PATH,
                    self.max_payload,
                    self.connect_timeout.min(timeout),
                )
                .await
                .map_err(|e| match e {
                    ConnError::Zmtp => RequestError::Malformed(
                        "the master answers with a ZMTP greeting: it speaks `transport: zeromq`; set the minion's `transport` to the master's",
                    ),
                    e => RequestError::Connect {
                        addr: self.addr,
                        source: Box::new(e),
                    },
                })?;
                self.dials += 1;
                self.conn.insert(c)
            }
        };
        conn.send(OP_BINARY, payload)
            .await
            .map_err(|_| RequestError::Disconnected)?;
        let mut others = 0;
        loop {
            let m = conn.recv().await.map_err(|e| match e {
                ConnError::Ws(super::WsError::TooLarge { .. }) => {
                    RequestError::Malformed("reply over the size limit")
                }
                ConnError::Ws(_) => RequestError::Malformed("reply is not a valid websocket frame"),
                _ => RequestError::Disconnected,
            })?;
            match m {
                WsMessage::Binary(b) => return Ok(Bytes::from(b)),
                WsMessage::Close(_) => {
                    conn.close(1000).await;
                    return Err(RequestError::Disconnected);
                }
                other => {
                    conn.answer(&other)
                        .await
                        .map_err(|_| RequestError::Disconnected)?;
                    others += 1;
                    if others > MAX_OTHER_MESSAGES {
                        return Err(RequestError::Malformed(
                            "the master sent no binary reply to the request",
                        ));
                    }
                }
            }
        }
    }
}

impl RequestClient for WsRequestClient {
    fn peer_addr(&self) -> SocketAddr {
        self.addr
    }

    async fn send(&mut self, payload: Bytes, timeout: Duration) -> Result<Bytes, RequestError> {
        match tokio::time::timeout(timeout, self.exchange(&payload, timeout)).await {
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
