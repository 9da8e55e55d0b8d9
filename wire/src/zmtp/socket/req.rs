//! REQ: one request in flight, with a timeout, re-dialling after any failure.
//!
//! `request(&mut self, ..)` enforces one request at a time by borrowing. A request goes out as
//! `["", parts...]` (the REQ delimiter); the reply's leading empty frame is stripped. On a
//! timeout or a broken connection the connection is torn down and the next request dials
//! afresh — what Salt does with its REQ sockets (`zeromq.py` recreates the socket), and what
//! keeps a late reply from being taken for the answer to the next request. While connected, a
//! background driver answers the ROUTER's PINGs (Salt 3008 pooled ROUTERs send them every 10 s).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::accept::Keepalive;
use crate::zmtp::conn::{Connection, HandshakeConfig};
use crate::zmtp::frame::DEFAULT_MAX_FRAME_SIZE;
use crate::zmtp::peer::{drive, Delivered, DriverConfig, Heartbeat, Inbound, OnFull, Outbound};
use crate::zmtp::{SocketType, ZmtpError};

/// REQ settings.
#[derive(Debug, Clone)]
pub struct ReqOptions {
    /// Sent as the `Identity` property (Salt 3008 minions send none).
    pub identity: Bytes,
    pub heartbeat: Option<Heartbeat>,
    pub max_frame_size: usize,
    /// Bound on connect + handshake (also bounded by the request timeout).
    pub connect_timeout: Duration,
    /// TCP keepalive on the dialled socket (default: Salt's minion `tcp_keepalive*`, idle
    /// 300 s); `None` = off.
    pub keepalive: Option<Keepalive>,
    /// Local address to dial from (Salt's minion `source_address`); `None` = the kernel's choice.
    pub source: Option<std::net::IpAddr>,
}

impl Default for ReqOptions {
    fn default() -> Self {
        ReqOptions {
            identity: Bytes::new(),
            heartbeat: None,
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            connect_timeout: Duration::from_secs(5),
            keepalive: Some(Keepalive::salt()),
            source: None,
        }
    }
}

/// Why a request failed. After any of these the next request re-dials.
#[derive(Debug, Error)]
pub enum ReqError {
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: ZmtpError,
    },
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    #[error("connection lost before the reply")]
    Disconnected,
    #[error("reply without the REQ delimiter frame")]
    MissingDelimiter,
}

struct Link {
    out: mpsc::Sender<Outbound>,
    rx: mpsc::Receiver<Delivered>,
    task: JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A REQ socket for one peer address.
pub struct ReqSocket {
    addr: SocketAddr,
    opts: ReqOptions,
    link: Option<Link>,
    dials: u64,
}

impl ReqSocket {
    /// Creates the socket; nothing is dialled until the first request.
    pub fn new(addr: SocketAddr, opts: ReqOptions) -> Self {
        ReqSocket {
            addr,
            opts,
            link: None,
            dials: 0,
        }
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many times a connection was established (grows by one per re-dial).
    pub fn dial_count(&self) -> u64 {
        self.dials
    }

    /// Sends one request and waits for its reply, all within `timeout`.
    pub async fn request(
        &mut self,
        parts: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<Vec<Bytes>, ReqError> {
        match tokio::time::timeout(timeout, self.request_inner(parts)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => {
                self.link = None;
                Err(e)
            }
            Err(_) => {
                self.link = None;
                Err(ReqError::Timeout(timeout))
            }
        }
    }

    async fn request_inner(&mut self, parts: Vec<Bytes>) -> Result<Vec<Bytes>, ReqError> {
        if self.link.as_ref().is_some_and(|l| l.task.is_finished()) {
            self.link = None;
        }
        let link = match self.link.take() {
            Some(link) => link,
            None => self.dial().await?,
        };
        let link = self.link.insert(link);
        // Nothing may arrive between requests; drop anything that did so it is not taken for
        // this request's reply.
        while link.rx.try_recv().is_ok() {}
        let mut msg = Vec::with_capacity(parts.len() + 1);
        msg.push(Bytes::new());
        msg.extend(parts);
        link.out
            .send(Outbound::Message(msg.into()))
            .await
            .map_err(|_| ReqError::Disconnected)?;
        let reply = link.rx.recv().await.ok_or(ReqError::Disconnected)?;
        let mut frames = reply.frames.into_iter();
        match frames.next() {
            Some(delim) if delim.is_empty() => Ok(frames.collect()),
            _ => Err(ReqError::MissingDelimiter),
        }
    }

    async fn dial(&mut self) -> Result<Link, ReqError> {
        let mut hs = HandshakeConfig::new(SocketType::Req);
        hs.identity = self.opts.identity.clone();
        hs.max_frame_size = self.opts.max_frame_size;
        hs.timeout = self.opts.connect_timeout;
        let keepalive = self.opts.keepalive.as_ref();
        let conn = Connection::connect_from(self.addr, self.opts.source, &hs, keepalive)
            .await
            .map_err(|source| ReqError::Connect {
                addr: self.addr,
                source,
            })?;
        self.dials += 1;
        let (out, out_rx) = mpsc::channel(1);
        let (tx, rx) = mpsc::channel(1);
        let cfg = DriverConfig::new(self.opts.heartbeat, self.opts.max_frame_size);
        let addr = self.addr;
        let task = tokio::spawn(async move {
            let inbound = Inbound::Channel {
                tx,
                peer: Bytes::new(),
                // Only the reply is expected; anything unsolicited beyond it is dropped.
                full: OnFull::Drop(Default::default()),
                budget: None,
            };
            let reason = drive(conn, out_rx, inbound, cfg).await;
            tracing::debug!(%addr, ?reason, "req connection closed");
        });
        Ok(Link { out, rx, task })
    }
}
