//! The run-time choice of transport: one enum per role with a variant per implemented transport,
//! each implementing its trait by a `match` (no boxing, no `dyn` on the per-message paths). Built
//! by [`Transport`]'s constructors. A new transport adds a variant to each enum and an arm to each
//! constructor here; the users do not change.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::zeromq::{self, Zeromq};
use super::{
    Incoming, Peek, PeerGreeting, ProbeError, Prober, ProtocolRefusals, PublishClient,
    PublishClientOptions, PublishReport, PublishServer, PublishServerOptions, Replier, ReplyError,
    ReplyTo, RequestClient, RequestClientOptions, RequestError, RequestServer,
    RequestServerOptions, SaltPingReply, Targets, Transport, TransportError, Verdict,
};
use crate::envelope::{Reply, RequestEnvelope};
use crate::salt_tcp::client::TcpRequestClient;
use crate::salt_tcp::peek::TcpPeek;
use crate::salt_tcp::pubserver::TcpPublisher;
use crate::salt_tcp::server::{TcpReplier, TcpRequestServer};
use crate::salt_tcp::subscriber::TcpSubscriber;
use crate::salt_ws::client::WsRequestClient;
use crate::salt_ws::peek::WsPeek;
use crate::salt_ws::pubserver::WsPublisher;
use crate::salt_ws::server::{WsReplier, WsRequestServer};
use crate::salt_ws::subscriber::WsSubscriber;

/// A [`RequestClient`] of any transport.
pub enum AnyRequestClient {
    Zeromq(zeromq::ReqSocket),
    Tcp(TcpRequestClient),
    Ws(WsRequestClient),
}

/// A [`RequestServer`] of any transport.
pub enum AnyRequestServer {
    Zeromq(zeromq::Router),
    Tcp(TcpRequestServer),
    Ws(WsRequestServer),
}

/// A [`Replier`] of any transport.
#[derive(Clone)]
pub enum AnyReplier {
    Zeromq(zeromq::RouterSender),
    Tcp(TcpReplier),
    Ws(WsReplier),
}

/// A [`PublishServer`] of any transport.
pub enum AnyPublishServer {
    Zeromq(zeromq::Publisher),
    Tcp(TcpPublisher),
    Ws(WsPublisher),
}

/// A [`PublishClient`] of any transport.
pub enum AnyPublishClient {
    Zeromq(zeromq::Subscriber),
    Tcp(TcpSubscriber),
    Ws(WsSubscriber),
}

/// A [`Peek`] of any transport.
pub enum AnyPeeker {
    Zeromq(zeromq::Sniffer),
    Tcp(TcpPeek),
    Ws(WsPeek),
}

#[cfg(feature = "tls")]
fn tls_unsupported() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        TransportError::TlsUnsupported(Transport::Zeromq),
    )
}

impl Transport {
    /// A request client for the server at `addr`; nothing is dialled before the first request.
    pub fn request_client(
        self,
        addr: SocketAddr,
        opts: &RequestClientOptions,
    ) -> Result<AnyRequestClient, TransportError> {
        match self {
            Transport::Zeromq => {
                #[cfg(feature = "tls")]
                if opts.tls.is_some() {
                    return Err(TransportError::TlsUnsupported(Transport::Zeromq));
                }
                Ok(AnyRequestClient::Zeromq(zeromq::ReqSocket::new(
                    addr,
                    opts.into(),
                )))
            }
            Transport::Tcp => Ok(AnyRequestClient::Tcp(TcpRequestClient::new(addr, opts))),
            Transport::Ws => Ok(AnyRequestClient::Ws(WsRequestClient::new(addr, opts))),
        }
    }

    /// Binds the request port (`ret_port`). An unsupported transport is an
    /// [`std::io::ErrorKind::Unsupported`] error naming it.
    pub async fn bind_request_server(
        self,
        addr: SocketAddr,
        opts: &RequestServerOptions,
    ) -> std::io::Result<AnyRequestServer> {
        match self {
            Transport::Zeromq => {
                #[cfg(feature = "tls")]
                if opts.tls.is_some() {
                    return Err(tls_unsupported());
                }
                Ok(AnyRequestServer::Zeromq(
                    zeromq::Router::bind(addr, opts.into()).await?,
                ))
            }
            Transport::Tcp => Ok(AnyRequestServer::Tcp(
                TcpRequestServer::bind(addr, opts).await?,
            )),
            Transport::Ws => Ok(AnyRequestServer::Ws(
                WsRequestServer::bind(addr, opts).await?,
            )),
        }
    }

    /// Binds the publish port (`publish_port`).
    pub async fn bind_publish_server(
        self,
        addr: SocketAddr,
        opts: &PublishServerOptions,
    ) -> std::io::Result<AnyPublishServer> {
        match self {
            Transport::Zeromq => {
                #[cfg(feature = "tls")]
                if opts.tls.is_some() {
                    return Err(tls_unsupported());
                }
                Ok(AnyPublishServer::Zeromq(
                    zeromq::Publisher::bind(addr, opts.into()).await?,
                ))
            }
            Transport::Tcp => Ok(AnyPublishServer::Tcp(TcpPublisher::bind(addr, opts).await?)),
            Transport::Ws => Ok(AnyPublishServer::Ws(WsPublisher::bind(addr, opts).await?)),
        }
    }

    /// A publish client of the server at `addr`, connecting (and re-connecting) in the
    /// background and receiving every publish meant for it.
    pub fn publish_client(
        self,
        addr: SocketAddr,
        opts: &PublishClientOptions,
    ) -> Result<AnyPublishClient, TransportError> {
        match self {
            Transport::Zeromq => {
                #[cfg(feature = "tls")]
                if opts.tls.is_some() {
                    return Err(TransportError::TlsUnsupported(Transport::Zeromq));
                }
                Ok(AnyPublishClient::Zeromq(zeromq::subscribe_all(addr, opts)))
            }
            Transport::Tcp => Ok(AnyPublishClient::Tcp(TcpSubscriber::connect(addr, opts))),
            Transport::Ws => Ok(AnyPublishClient::Ws(WsSubscriber::connect(addr, opts))),
        }
    }

    /// A presence peek that buffers at most `budget` bytes. Plain streams only: under TLS
    /// (`tcp` or `ws` with `ssl`) there is nothing to read, and the caller attaches none.
    pub fn peeker(self, budget: usize) -> Result<AnyPeeker, TransportError> {
        match self {
            Transport::Zeromq => Ok(AnyPeeker::Zeromq(zeromq::Sniffer::new(budget))),
            Transport::Tcp => Ok(AnyPeeker::Tcp(TcpPeek::new(budget))),
            Transport::Ws => Ok(AnyPeeker::Ws(WsPeek::new(budget))),
        }
    }
}

impl RequestClient for AnyRequestClient {
    fn peer_addr(&self) -> SocketAddr {
        match self {
            AnyRequestClient::Zeromq(s) => RequestClient::peer_addr(s),
            AnyRequestClient::Tcp(s) => RequestClient::peer_addr(s),
            AnyRequestClient::Ws(s) => RequestClient::peer_addr(s),
        }
    }

    async fn send(&mut self, payload: Bytes, timeout: Duration) -> Result<Bytes, RequestError> {
        match self {
            AnyRequestClient::Zeromq(s) => RequestClient::send(s, payload, timeout).await,
            AnyRequestClient::Tcp(s) => RequestClient::send(s, payload, timeout).await,
            AnyRequestClient::Ws(s) => RequestClient::send(s, payload, timeout).await,
        }
    }
}

impl RequestServer for AnyRequestServer {
    type Replier = AnyReplier;

    fn local_addr(&self) -> SocketAddr {
        match self {
            AnyRequestServer::Zeromq(s) => RequestServer::local_addr(s),
            AnyRequestServer::Tcp(s) => RequestServer::local_addr(s),
            AnyRequestServer::Ws(s) => RequestServer::local_addr(s),
        }
    }

    async fn recv(&mut self) -> Option<Incoming> {
        match self {
            AnyRequestServer::Zeromq(s) => RequestServer::recv(s).await,
            AnyRequestServer::Tcp(s) => RequestServer::recv(s).await,
            AnyRequestServer::Ws(s) => RequestServer::recv(s).await,
        }
    }

    fn replier(&self) -> AnyReplier {
        match self {
            AnyRequestServer::Zeromq(s) => AnyReplier::Zeromq(s.replier()),
            AnyRequestServer::Tcp(s) => AnyReplier::Tcp(s.replier()),
            AnyRequestServer::Ws(s) => AnyReplier::Ws(s.replier()),
        }
    }

    fn refusals(&self) -> Arc<ProtocolRefusals> {
        match self {
            AnyRequestServer::Zeromq(s) => RequestServer::refusals(s),
            AnyRequestServer::Tcp(s) => RequestServer::refusals(s),
            AnyRequestServer::Ws(s) => RequestServer::refusals(s),
        }
    }
}

impl Replier for AnyReplier {
    async fn reply(&self, to: &ReplyTo, payload: Bytes) -> Result<(), ReplyError> {
        match self {
            AnyReplier::Zeromq(s) => Replier::reply(s, to, payload).await,
            AnyReplier::Tcp(s) => Replier::reply(s, to, payload).await,
            AnyReplier::Ws(s) => Replier::reply(s, to, payload).await,
        }
    }

    fn trust(&self, to: &ReplyTo) {
        match self {
            AnyReplier::Zeromq(s) => Replier::trust(s, to),
            AnyReplier::Tcp(s) => Replier::trust(s, to),
            AnyReplier::Ws(s) => Replier::trust(s, to),
        }
    }

    fn is_connected(&self, to: &ReplyTo) -> bool {
        match self {
            AnyReplier::Zeromq(s) => Replier::is_connected(s, to),
            AnyReplier::Tcp(s) => Replier::is_connected(s, to),
            AnyReplier::Ws(s) => Replier::is_connected(s, to),
        }
    }

    fn paused_inbound(&self) -> u64 {
        match self {
            AnyReplier::Zeromq(s) => Replier::paused_inbound(s),
            AnyReplier::Tcp(s) => Replier::paused_inbound(s),
            AnyReplier::Ws(s) => Replier::paused_inbound(s),
        }
    }

    fn peer_count(&self) -> usize {
        match self {
            AnyReplier::Zeromq(s) => Replier::peer_count(s),
            AnyReplier::Tcp(s) => Replier::peer_count(s),
            AnyReplier::Ws(s) => Replier::peer_count(s),
        }
    }
}

impl PublishServer for AnyPublishServer {
    fn local_addr(&self) -> SocketAddr {
        match self {
            AnyPublishServer::Zeromq(s) => PublishServer::local_addr(s),
            AnyPublishServer::Tcp(s) => PublishServer::local_addr(s),
            AnyPublishServer::Ws(s) => PublishServer::local_addr(s),
        }
    }

    fn publish(&self, payload: Bytes, targets: Targets<'_>) -> PublishReport {
        match self {
            AnyPublishServer::Zeromq(s) => PublishServer::publish(s, payload, targets),
            AnyPublishServer::Tcp(s) => PublishServer::publish(s, payload, targets),
            AnyPublishServer::Ws(s) => PublishServer::publish(s, payload, targets),
        }
    }

    fn subscriber_count(&self) -> usize {
        match self {
            AnyPublishServer::Zeromq(s) => PublishServer::subscriber_count(s),
            AnyPublishServer::Tcp(s) => PublishServer::subscriber_count(s),
            AnyPublishServer::Ws(s) => PublishServer::subscriber_count(s),
        }
    }

    fn dropped_total(&self) -> u64 {
        match self {
            AnyPublishServer::Zeromq(s) => PublishServer::dropped_total(s),
            AnyPublishServer::Tcp(s) => PublishServer::dropped_total(s),
            AnyPublishServer::Ws(s) => PublishServer::dropped_total(s),
        }
    }

    fn refusals(&self) -> Arc<ProtocolRefusals> {
        match self {
            AnyPublishServer::Zeromq(s) => PublishServer::refusals(s),
            AnyPublishServer::Tcp(s) => PublishServer::refusals(s),
            AnyPublishServer::Ws(s) => PublishServer::refusals(s),
        }
    }
}

impl PublishClient for AnyPublishClient {
    async fn recv(&mut self) -> Option<Bytes> {
        match self {
            AnyPublishClient::Zeromq(s) => PublishClient::recv(s).await,
            AnyPublishClient::Tcp(s) => PublishClient::recv(s).await,
            AnyPublishClient::Ws(s) => PublishClient::recv(s).await,
        }
    }

    fn is_connected(&self) -> bool {
        match self {
            AnyPublishClient::Zeromq(s) => PublishClient::is_connected(s),
            AnyPublishClient::Tcp(s) => PublishClient::is_connected(s),
            AnyPublishClient::Ws(s) => PublishClient::is_connected(s),
        }
    }

    fn connect_count(&self) -> u64 {
        match self {
            AnyPublishClient::Zeromq(s) => PublishClient::connect_count(s),
            AnyPublishClient::Tcp(s) => PublishClient::connect_count(s),
            AnyPublishClient::Ws(s) => PublishClient::connect_count(s),
        }
    }

    fn set_hello(&self, hello: Bytes) {
        match self {
            AnyPublishClient::Zeromq(s) => PublishClient::set_hello(s, hello),
            AnyPublishClient::Tcp(s) => PublishClient::set_hello(s, hello),
            AnyPublishClient::Ws(s) => PublishClient::set_hello(s, hello),
        }
    }
}

impl Peek for AnyPeeker {
    fn feed(&mut self, bytes: &[u8]) -> &Verdict {
        match self {
            AnyPeeker::Zeromq(s) => Peek::feed(s, bytes),
            AnyPeeker::Tcp(s) => Peek::feed(s, bytes),
            AnyPeeker::Ws(s) => Peek::feed(s, bytes),
        }
    }

    fn budget(&self) -> usize {
        match self {
            AnyPeeker::Zeromq(s) => Peek::budget(s),
            AnyPeeker::Tcp(s) => Peek::budget(s),
            AnyPeeker::Ws(s) => Peek::budget(s),
        }
    }
}

/// The probes of the transport itself: ZeroMQ's for `zeromq`; the others fail with
/// [`ProbeError::Transport`] naming the `transport` key until they are implemented.
impl Prober for Transport {
    async fn greeting(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<PeerGreeting, ProbeError> {
        match self {
            Transport::Zeromq => Zeromq.greeting(addr, timeout).await,
            t => Err(t.unsupported().into()),
        }
    }

    async fn ping(
        &self,
        addr: SocketAddr,
        handshake_timeout: Duration,
        timeout: Duration,
    ) -> Result<SaltPingReply, ProbeError> {
        match self {
            Transport::Zeromq => Zeromq.ping(addr, handshake_timeout, timeout).await,
            t => Err(t.unsupported().into()),
        }
    }

    async fn request(
        &self,
        addr: SocketAddr,
        handshake_timeout: Duration,
        timeout: Duration,
        request: &RequestEnvelope,
    ) -> Result<Reply, ProbeError> {
        match self {
            Transport::Zeromq => {
                Zeromq
                    .request(addr, handshake_timeout, timeout, request)
                    .await
            }
            t => Err(t.unsupported().into()),
        }
    }
}
