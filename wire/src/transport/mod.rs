//! The transport seam: what proxy, master-core and minion need from a Salt transport, behind one
//! set of traits, with ZeroMQ (ZMTP 3.1, [`zeromq`]) as the first implementation.
//!
//! Salt 3008 has three transports, chosen by the `transport` option of the master and minion
//! configs ([`Transport`]). Its own seam is `salt/transport/base.py`: `RequestClient`
//! (`send(load, timeout)` → reply), `RequestServer` (a message handler whose return is the reply),
//! `PublishServer` (`publish_payload(payload, topic_list)`) and `PublishClient` (`connect`,
//! `recv`). The traits here mirror it:
//!
//! | Salt (`base.py`) | here | ZeroMQ |
//! |---|---|---|
//! | `RequestClient.send` | [`RequestClient::send`] | a REQ socket, re-dialled after a failure |
//! | `RequestServer` + `message_handler` | [`RequestServer::recv`] → [`Incoming`], [`Replier::reply`] | a ROUTER |
//! | `PublishServer.publish_payload` | [`PublishServer::publish`] with [`Targets`] | a PUB |
//! | `PublishClient.recv` | [`PublishClient::recv`] | a SUB subscribed to everything |
//! | (none; saltgate's) | [`Prober`]: Salt's clear `ping`, staged ([`ProbeStage`]) | [`crate::probe`] |
//! | (none; saltgate's) | [`Peek`]: the minion id of a request stream | [`crate::sniff`] |
//!
//! `tcp` has its clients ([`crate::salt_tcp::client::TcpRequestClient`],
//! [`crate::salt_tcp::subscriber::TcpSubscriber`]) and servers
//! ([`crate::salt_tcp::server::TcpRequestServer`], [`crate::salt_tcp::pubserver::TcpPublisher`],
//! whose targeted publishes need the master's [`PresenceCheck`]), TLS through the options' `tls`
//! (feature `tls`), and its presence peek ([`crate::salt_tcp::peek::TcpPeek`],
//! [`Transport::peeker`]); its probes through the seam are still to come (they fail with
//! [`TransportError::NotImplemented`]). `ws` has the same four roles
//! ([`crate::salt_ws::client::WsRequestClient`], [`crate::salt_ws::subscriber::WsSubscriber`],
//! [`crate::salt_ws::server::WsRequestServer`], [`crate::salt_ws::pubserver::WsPublisher`], on
//! the codec of [`crate::salt_ws`]), TLS the same way, and its presence peek
//! ([`crate::salt_ws::peek::WsPeek`]); its probes through the seam are still to come.
//!
//! Payloads cross the seam as bytes: one msgpack-encoded Salt message (see [`crate::envelope`]);
//! the framing around them is the transport's. Users pick an implementation at run time with
//! [`Transport`]'s constructors ([`Transport::request_client`], [`Transport::bind_request_server`],
//! [`Transport::bind_publish_server`], [`Transport::publish_client`], [`Transport::peeker`]),
//! which return the `Any*` types of [`any`]: enums with one variant per transport that implement
//! the traits by a `match`, so that no message is boxed and nothing outside `wire` changes when a
//! transport is added. The probes are methods of [`Transport`] itself ([`Prober`]).
//!
//! # Where `tcp` and `ws` differ (issue 27 slots them in here)
//!
//! * **`tcp`** (`salt/transport/tcp.py`, `frame.py`): one TCP stream per channel carrying
//!   msgpack maps `{"head": {...}, "body": payload}` back to back, **no length prefix** (the
//!   reader feeds a streaming msgpack unpacker). A request's `head` carries a message id
//!   (`{"mid": n}`) and its reply echoes the same `head`, so several requests may be in flight on
//!   one connection: its [`ReplyTo`] must carry the `mid` besides the connection. Its publish
//!   client sends, after connecting, an `aes` message with its `id` and `tok` (Salt's
//!   `send_id`, the master's `presence_callback`); its publish server sends a publish with a
//!   `topic_lst` only to the connections whose id is listed ([`Targets::Minions`]), all others
//!   to every connection. No heartbeat: TCP keepalive only. Optional TLS (`ssl` options).
//! * **`ws`** (`salt/transport/ws.py`): an aiohttp websocket at the path `/ws` (HTTP upgrade,
//!   `http://` or `https://` with `ssl`; a minion's requests go to `/`, any path upgrades), one
//!   **binary frame per msgpack payload**, no `head`: one request in flight per connection,
//!   replies in order (3008.5's request client dials a new websocket for every request). The
//!   publish server sends every publish to every client (no topics), each as a msgpack `bin`
//!   of the payload. Text frames are control (`"close"`).
//! * **ZeroMQ**: ZMTP 3.1 frames; a request is the REQ envelope `["", payload]`, a publish a
//!   single frame (or `[topic, payload]` with `zmq_filtering`); PING/PONG heartbeats.
//!
//! Byte-level users in the proxy (the fan-out hub, request continuity) still parse ZMTP
//! frames on raw streams through [`zeromq`]'s re-exports; docs/architecture.md describes the
//! stream-level seam (a framing codec) they will move to.

pub mod any;
pub mod zeromq;

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;

pub use crate::accept::{ConnectionLimit, Keepalive};
pub use crate::probe::{PeerGreeting, ProbeError, SaltPingReply};
/// Bytes a [`Peek`] buffers by default before giving up (Salt's `_auth` fits well within).
pub use crate::sniff::DEFAULT_BUDGET as DEFAULT_PEEK_BUDGET;
pub use crate::sniff::{GiveUp, Sighting, Source, Verdict};
/// Liveness settings of a connection (ZeroMQ: ZMTP 3.1 PING/PONG; `tcp` and `ws` have none and
/// rely on TCP keepalive).
pub use crate::zmtp::Heartbeat;
/// Connections a server closed for breaking the protocol, by reason (any transport).
pub use crate::zmtp::ProtocolRefusals;
/// What one publish did: how many subscribers' queues took it, how many dropped it.
pub use crate::zmtp::PublishReport;
/// How a client re-dials (Salt's `recon_default`, `recon_max`, `recon_randomize`).
pub use crate::zmtp::ReconnectPolicy;

/// The master's `presence_callback` for the `tcp` publish server.
pub use crate::salt_tcp::pubserver::PresenceCheck;

pub use any::{
    AnyPeeker, AnyPublishClient, AnyPublishServer, AnyReplier, AnyRequestClient, AnyRequestServer,
};

/// One of Salt's transports: the value of the `transport` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Transport {
    /// ZeroMQ (ZMTP 3.1): Salt's default.
    #[default]
    Zeromq,
    /// Salt's `tcp`: msgpack `{head, body}` maps on a TCP (or TLS) stream.
    Tcp,
    /// Salt's `ws`: a websocket at `/ws`, one binary frame per payload.
    Ws,
}

impl Transport {
    /// Every transport, in Salt's order (`salt.transport.base.TRANSPORTS`).
    pub const ALL: [Transport; 3] = [Transport::Zeromq, Transport::Tcp, Transport::Ws];

    /// Salt's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Zeromq => "zeromq",
            Transport::Tcp => "tcp",
            Transport::Ws => "ws",
        }
    }

    /// Reads the `transport` option's value (exactly Salt's spellings).
    pub fn parse(value: &str) -> Result<Self, TransportError> {
        Transport::ALL
            .into_iter()
            .find(|t| t.as_str() == value)
            .ok_or_else(|| TransportError::Unknown(value.to_string()))
    }

    fn unsupported(self) -> TransportError {
        TransportError::NotImplemented(self)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Transport {
    type Err = TransportError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Transport::parse(s)
    }
}

/// A transport that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TransportError {
    #[error("transport: unknown value {0:?}; use zeromq, tcp or ws (Salt's transports)")]
    Unknown(String),
    #[error("transport: {0} is not supported yet; use transport: zeromq")]
    NotImplemented(Transport),
    #[error("ssl: Salt's `ssl` applies to the tcp and ws transports, not {0}; set transport: tcp (the master's own) or remove ssl")]
    TlsUnsupported(Transport),
}

/// Why a request got no reply. After any of these a client re-dials on its next request.
#[derive(Debug, Error)]
pub enum RequestError {
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    #[error("connection lost before the reply")]
    Disconnected,
    /// The reply broke the transport's framing (ZeroMQ: no REQ delimiter).
    #[error("{0}")]
    Malformed(&'static str),
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// Settings of a [`RequestClient`] (Salt's minion options, resolved).
#[derive(Debug, Clone)]
pub struct RequestClientOptions {
    /// Bound on connect and handshake (also bounded by the request's timeout).
    pub connect_timeout: Duration,
    /// TCP keepalive on the dialled socket; `None` = off.
    pub keepalive: Option<Keepalive>,
    /// Local address to dial from (Salt's `source_address`); `None` = the kernel's choice.
    pub source: Option<IpAddr>,
    /// Largest reply accepted.
    pub max_payload: usize,
    /// TLS (Salt's `ssl`; `tcp` and `ws`, feature `tls`); `None` = plain.
    #[cfg(feature = "tls")]
    pub tls: Option<crate::salt_tcp::probe::TlsClient>,
}

impl Default for RequestClientOptions {
    fn default() -> Self {
        let z = crate::zmtp::ReqOptions::default();
        RequestClientOptions {
            connect_timeout: z.connect_timeout,
            keepalive: z.keepalive,
            source: z.source,
            max_payload: z.max_frame_size,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

/// The client side of the request channel (Salt's `RequestClient`): one request in flight.
pub trait RequestClient: Send {
    /// The server's address.
    fn peer_addr(&self) -> SocketAddr;
    /// Sends one request payload and waits for its reply payload, all within `timeout`
    /// (dialling first when not connected). On any error the connection is dropped.
    fn send(
        &mut self,
        payload: Bytes,
        timeout: Duration,
    ) -> impl Future<Output = Result<Bytes, RequestError>> + Send;
}

/// Settings of a [`RequestServer`].
#[derive(Debug, Clone)]
pub struct RequestServerOptions {
    /// Largest request a trusted peer may send (checked before anything is allocated).
    pub max_payload: usize,
    /// Largest request of a peer not yet vouched for ([`Replier::trust`]); `None`: `max_payload`.
    pub untrusted_max_payload: Option<usize>,
    /// Bytes of received requests from peers not yet vouched for, all together, held in the
    /// queue; over it such a peer is not read until handled requests give their share back.
    /// `None`: no budget but `queue`.
    pub untrusted_queue_bytes: Option<usize>,
    /// Connections served at once; `None`: the descriptor limit.
    pub max_connections: Option<usize>,
    /// A connection budget shared with other servers (the request and publish ports together).
    pub shared_limit: Option<Arc<ConnectionLimit>>,
    /// Longest a request may take from its first byte to its last; `None`: no limit.
    pub payload_timeout: Option<Duration>,
    /// Longest a write to a peer may make no progress; `None`: no limit.
    pub write_timeout: Option<Duration>,
    /// Requests received and not yet taken by [`RequestServer::recv`]; beyond it peers are not
    /// read (backpressure, nothing dropped).
    pub queue: usize,
    /// TLS (Salt's `ssl`; `tcp` and `ws`, feature `tls`); `None` = plain.
    #[cfg(feature = "tls")]
    pub tls: Option<crate::salt_tcp::tls_server::TlsServer>,
}

impl Default for RequestServerOptions {
    fn default() -> Self {
        let z = crate::zmtp::RouterOptions::default();
        RequestServerOptions {
            max_payload: z.max_frame_size,
            untrusted_max_payload: z.untrusted_max_frame_size,
            untrusted_queue_bytes: z.untrusted_queue_bytes,
            max_connections: z.max_connections,
            shared_limit: z.shared_limit,
            payload_timeout: z.frame_timeout,
            write_timeout: z.write_timeout,
            queue: z.queue,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

/// Where a reply goes: the connection a request came on (and, for `tcp`, its message id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReplyTo {
    /// ZeroMQ: the ROUTER's routing id of the peer; `tcp`: the connection's number.
    pub(crate) peer: Bytes,
    /// `tcp`: the request's `head` as it came (msgpack), echoed by the reply; else empty.
    pub(crate) head: Bytes,
}

/// A request as the server received it.
#[derive(Debug, Clone)]
pub struct Request {
    pub reply_to: ReplyTo,
    /// The request payload (a msgpack Salt envelope).
    pub payload: Bytes,
    /// When it was read off the connection (its age in this process).
    pub received: tokio::time::Instant,
}

/// What a [`RequestServer`] hands over.
#[derive(Debug, Clone)]
pub enum Incoming {
    Request(Request),
    /// A message that is not a request in the transport's framing (ZeroMQ: not the REQ
    /// envelope `["", payload]`); `parts` is how many frames it had.
    NotRequest {
        parts: usize,
    },
}

/// Why a reply was not delivered.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ReplyError {
    #[error("no connected peer for this reply")]
    UnknownPeer,
    #[error("the peer disconnected")]
    PeerGone,
}

/// The server side of the request channel (Salt's `RequestServer`).
pub trait RequestServer: Send {
    type Replier: Replier;
    fn local_addr(&self) -> SocketAddr;
    /// The next request from any peer; `None` once the server is closed.
    fn recv(&mut self) -> impl Future<Output = Option<Incoming>> + Send;
    /// A handle that replies from any task.
    fn replier(&self) -> Self::Replier;
    /// Connections closed for breaking the protocol.
    fn refusals(&self) -> Arc<ProtocolRefusals>;
}

/// Replies to a [`RequestServer`]'s peers; cheap to clone.
pub trait Replier: Clone + Send + Sync + 'static {
    /// Sends `payload` as the reply to the request `to` answers; waits if the peer's queue is full.
    fn reply(
        &self,
        to: &ReplyTo,
        payload: Bytes,
    ) -> impl Future<Output = Result<(), ReplyError>> + Send;
    /// Vouches for the peer (it proved a key): its requests may reach `max_payload`. Never waits.
    fn trust(&self, to: &ReplyTo);
    /// Whether the peer is still connected (its reply could be delivered).
    fn is_connected(&self, to: &ReplyTo) -> bool;
    /// How often a peer was not read because the server's queue was full.
    fn paused_inbound(&self) -> u64;
    /// Connected peers.
    fn peer_count(&self) -> usize;
}

/// Settings of a [`PublishServer`].
#[derive(Debug, Clone)]
pub struct PublishServerOptions {
    /// Per-subscriber queue; beyond it a publish is dropped for that subscriber.
    pub hwm: usize,
    pub handshake_timeout: Duration,
    /// Connections served at once; `None`: the descriptor limit.
    pub max_connections: Option<usize>,
    /// A connection budget shared with other servers (the request and publish ports together).
    pub shared_limit: Option<Arc<ConnectionLimit>>,
    pub keepalive: Option<Keepalive>,
    /// Reads a subscriber's hello into the minion id it proves (`tcp`: Salt's
    /// `presence_callback`, which targeted publishes need); `None`: no subscriber is tagged, and
    /// a targeted publish reaches none (ZeroMQ ignores it).
    pub presence: Option<PresenceCheck>,
    /// TLS (Salt's `ssl`; `tcp` and `ws`, feature `tls`); `None` = plain.
    #[cfg(feature = "tls")]
    pub tls: Option<crate::salt_tcp::tls_server::TlsServer>,
}

impl Default for PublishServerOptions {
    fn default() -> Self {
        let z = crate::zmtp::PubOptions::default();
        PublishServerOptions {
            hwm: z.hwm,
            handshake_timeout: z.handshake_timeout,
            max_connections: z.max_connections,
            shared_limit: z.shared_limit,
            keepalive: z.keepalive,
            presence: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

/// Who a publish is for (Salt's `topic_list`).
#[derive(Debug, Clone, Copy)]
pub enum Targets<'a> {
    /// Every subscriber.
    All,
    /// Only these minions, where the transport can tell them apart (`tcp`: by the id each
    /// connection proved, [`PresenceCheck`]; an empty list is every connection, as Salt's `if
    /// topic_list:`). Transports that cannot send to all, and each minion filters (Salt does
    /// the same).
    Minions(&'a [&'a str]),
}

/// The server side of the publish channel (Salt's `PublishServer`).
pub trait PublishServer: Send + Sync {
    fn local_addr(&self) -> SocketAddr;
    /// Queues `payload` for the targeted subscribers. Never blocks; a full queue drops and counts.
    fn publish(&self, payload: Bytes, targets: Targets<'_>) -> PublishReport;
    /// Connected subscribers.
    fn subscriber_count(&self) -> usize;
    /// Publishes dropped so far because a subscriber's queue was full.
    fn dropped_total(&self) -> u64;
    /// Connections closed for breaking the protocol.
    fn refusals(&self) -> Arc<ProtocolRefusals>;
}

/// Settings of a [`PublishClient`].
#[derive(Debug, Clone)]
pub struct PublishClientOptions {
    pub reconnect: ReconnectPolicy,
    /// Our own liveness checks, where the transport has them; `None` = none (Salt's minion).
    pub heartbeat: Option<Heartbeat>,
    /// Bound on connect and handshake.
    pub connect_timeout: Duration,
    pub keepalive: Option<Keepalive>,
    /// Publishes buffered for [`PublishClient::recv`]; beyond it they are dropped and counted.
    pub queue: usize,
    /// Local address to dial from (`source_address`).
    pub source: Option<IpAddr>,
    /// The minion's id, sent where the transport can carry it (ZeroMQ: the SUB's READY
    /// `Identity`, which libzmq leaves out); empty: none.
    pub identity: Bytes,
    /// A message sent to the publisher on each connect, where the transport has one (`tcp`:
    /// Salt's `send_id`, a msgpack Salt message; ZeroMQ: none); `None`: nothing is sent.
    pub hello: Option<Bytes>,
    /// TLS (Salt's `ssl`; `tcp` and `ws`, feature `tls`); `None` = plain.
    #[cfg(feature = "tls")]
    pub tls: Option<crate::salt_tcp::probe::TlsClient>,
}

impl Default for PublishClientOptions {
    fn default() -> Self {
        let z = crate::zmtp::SubOptions::default();
        PublishClientOptions {
            reconnect: z.reconnect,
            heartbeat: z.heartbeat,
            connect_timeout: z.handshake_timeout,
            keepalive: z.keepalive,
            queue: z.queue,
            source: z.source,
            identity: Bytes::new(),
            hello: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

/// The client side of the publish channel (Salt's `PublishClient`): connects, re-connects and
/// receives every publish meant for it.
pub trait PublishClient: Send {
    /// The next publish payload; `None` once the client is closed.
    fn recv(&mut self) -> impl Future<Output = Option<Bytes>> + Send;
    /// Whether a connection is up now.
    fn is_connected(&self) -> bool;
    /// Connections made so far (1 after the first, one more per reconnect).
    fn connect_count(&self) -> u64;
    /// Replaces the hello ([`PublishClientOptions::hello`]) and sends it at once when connected
    /// (`tcp`: after a re-authentication, whose new key the hello is encrypted with). A
    /// transport without a hello ignores it.
    fn set_hello(&self, hello: Bytes);
}

/// How far a probe got: the stages of [`ProbeError`], each a different diagnosis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeStage {
    /// The TCP connect failed or did not complete: nothing listens, or the path is down.
    Connect,
    /// Connected, but the transport's handshake did not come (a stopped or hung master), or
    /// the peer does not speak this transport.
    Handshake,
    /// Handshaken, but no (valid) reply to the request: a busy master, or one refusing it.
    Reply,
    /// A 3008 cluster member that is up and not serving yet (`cluster_retry`).
    NotReady,
}

impl ProbeError {
    /// The stage this failure belongs to.
    pub fn stage(&self) -> ProbeStage {
        match self {
            ProbeError::Connect(_) | ProbeError::ConnectTimeout(_) => ProbeStage::Connect,
            ProbeError::NoHandshake(_) => ProbeStage::Handshake,
            ProbeError::NotReady => ProbeStage::NotReady,
            _ => ProbeStage::Reply,
        }
    }
}

/// Health probes of a master (saltgate's, not Salt's): each bounded by its deadlines, never
/// panicking, and creating no state on the master.
pub trait Prober {
    /// The publish port is alive: connect and the transport's handshake within `timeout`, then
    /// close before the master's application sees a peer (ZeroMQ: the greeting).
    fn greeting(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> impl Future<Output = Result<PeerGreeting, ProbeError>> + Send;
    /// Salt's clear `ping` on the request port: connect and handshake within
    /// `handshake_timeout`, the reply within `timeout`; `cluster_retry` is
    /// [`ProbeError::NotReady`], a text reply [`ProbeError::Refused`].
    fn ping(
        &self,
        addr: SocketAddr,
        handshake_timeout: Duration,
        timeout: Duration,
    ) -> impl Future<Output = Result<SaltPingReply, ProbeError>> + Send;
    /// One clear request, staged as [`Prober::ping`]; the reply as it came.
    fn request(
        &self,
        addr: SocketAddr,
        handshake_timeout: Duration,
        timeout: Duration,
        request: &crate::envelope::RequestEnvelope,
    ) -> impl Future<Output = Result<crate::envelope::Reply, ProbeError>> + Send;
}

/// Reads the minion id from a request connection's client bytes, passively and bounded
/// (presence): a clear `_auth`, or the envelope of an `aes` request.
pub trait Peek: Send {
    /// Feeds the next bytes; a final verdict stays final.
    fn feed(&mut self, bytes: &[u8]) -> &Verdict;
    /// Bytes it may buffer before giving up.
    fn budget(&self) -> usize;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_reads_salts_spellings_and_names_the_key_otherwise() {
        for t in Transport::ALL {
            assert_eq!(t.as_str().parse::<Transport>(), Ok(t));
            assert_eq!(t.to_string(), t.as_str());
        }
        assert_eq!(Transport::default(), Transport::Zeromq);
        let e = Transport::parse("ZeroMQ").unwrap_err().to_string();
        assert!(e.starts_with("transport: "), "{e}");
        assert!(e.contains("zeromq, tcp or ws"), "{e}");
        assert!(Transport::parse("").is_err());
    }

    #[test]
    fn probe_errors_name_their_stage() {
        let io = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let d = Duration::from_secs(1);
        assert_eq!(ProbeError::Connect(io()).stage(), ProbeStage::Connect);
        assert_eq!(ProbeError::ConnectTimeout(d).stage(), ProbeStage::Connect);
        assert_eq!(ProbeError::NoHandshake(d).stage(), ProbeStage::Handshake);
        assert_eq!(ProbeError::Timeout(d).stage(), ProbeStage::Reply);
        assert_eq!(ProbeError::NotReady.stage(), ProbeStage::NotReady);
    }
}
