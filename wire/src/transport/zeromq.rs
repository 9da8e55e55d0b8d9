//! ZeroMQ (ZMTP 3.1 with the NULL mechanism): the seam's first implementation, over the sockets
//! of [`crate::zmtp`], the probes of [`crate::probe`] and the sniffer of [`crate::sniff`].
//!
//! | trait | type | how |
//! |---|---|---|
//! | [`RequestClient`] | [`ReqSocket`] | the request goes out as `["", payload]`; the reply's one frame after the delimiter |
//! | [`RequestServer`] | [`Router`] | `["", payload]` is a request, anything else [`Incoming::NotRequest`] |
//! | [`Replier`] | [`RouterSender`] | `["", payload]` to the peer's routing id |
//! | [`PublishServer`] | [`Publisher`] | one frame to every subscriber (Salt without `zmq_filtering`) |
//! | [`PublishClient`] | [`Subscriber`] | subscribed to everything; the payload is the last frame |
//! | [`Prober`] | [`Zeromq`] | [`crate::probe`]: the greeting, Salt's clear `ping` over REQ |
//! | [`Peek`] | [`Sniffer`] | [`crate::sniff`]: ZMTP frames of the client's first bytes |
//!
//! The proxy's byte-level users (the fan-out hub, request continuity) frame and parse ZMTP on raw
//! streams themselves: they take the codec from here (everything of [`crate::zmtp`] is
//! re-exported), so that outside `wire` only this module is named.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub use crate::sniff::Sniffer;
pub use crate::zmtp::*;

use super::{
    Incoming, Peek, PeerGreeting, ProbeError, Prober, PublishClient, PublishClientOptions,
    PublishServer, PublishServerOptions, Replier, ReplyError, ReplyTo, Request, RequestClient,
    RequestClientOptions, RequestError, RequestServer, RequestServerOptions, SaltPingReply,
    Targets, Verdict,
};
use crate::envelope::{Reply, RequestEnvelope};

/// The ZeroMQ probes ([`Prober`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Zeromq;

impl From<&RequestClientOptions> for ReqOptions {
    fn from(o: &RequestClientOptions) -> Self {
        ReqOptions {
            connect_timeout: o.connect_timeout,
            keepalive: o.keepalive,
            source: o.source,
            max_frame_size: o.max_payload,
            ..ReqOptions::default()
        }
    }
}

impl From<&RequestServerOptions> for RouterOptions {
    fn from(o: &RequestServerOptions) -> Self {
        RouterOptions {
            max_frame_size: o.max_payload,
            untrusted_max_frame_size: o.untrusted_max_payload,
            untrusted_queue_bytes: o.untrusted_queue_bytes,
            max_connections: o.max_connections,
            shared_limit: o.shared_limit.clone(),
            frame_timeout: o.payload_timeout,
            write_timeout: o.write_timeout,
            queue: o.queue,
            ..RouterOptions::default()
        }
    }
}

impl From<&PublishServerOptions> for PubOptions {
    fn from(o: &PublishServerOptions) -> Self {
        PubOptions {
            hwm: o.hwm,
            handshake_timeout: o.handshake_timeout,
            max_connections: o.max_connections,
            shared_limit: o.shared_limit.clone(),
            keepalive: o.keepalive,
            ..PubOptions::default()
        }
    }
}

impl From<&PublishClientOptions> for SubOptions {
    fn from(o: &PublishClientOptions) -> Self {
        SubOptions {
            reconnect: o.reconnect,
            heartbeat: o.heartbeat,
            handshake_timeout: o.connect_timeout,
            keepalive: o.keepalive,
            queue: o.queue,
            source: o.source,
            identity: o.identity.clone(),
            ..SubOptions::default()
        }
    }
}

impl From<ReqError> for RequestError {
    fn from(e: ReqError) -> Self {
        match e {
            ReqError::Connect { addr, source } => RequestError::Connect {
                addr,
                source: Box::new(source),
            },
            ReqError::Timeout(t) => RequestError::Timeout(t),
            ReqError::Disconnected => RequestError::Disconnected,
            ReqError::MissingDelimiter => {
                RequestError::Malformed("reply without the REQ delimiter frame")
            }
        }
    }
}

impl RequestClient for ReqSocket {
    fn peer_addr(&self) -> SocketAddr {
        ReqSocket::peer_addr(self)
    }

    async fn send(&mut self, payload: Bytes, timeout: Duration) -> Result<Bytes, RequestError> {
        let mut frames = self.request(vec![payload], timeout).await?.into_iter();
        frames.next().ok_or(RequestError::Malformed("empty reply"))
    }
}

/// Splits a ROUTER message into a request (the REQ envelope `["", payload]`) or not.
pub(crate) fn incoming(msg: RouterMessage) -> Incoming {
    let mut frames = msg.frames;
    if frames.len() != 2 || !frames[0].is_empty() {
        return Incoming::NotRequest {
            parts: frames.len(),
        };
    }
    let payload = frames.pop().unwrap_or_default();
    Incoming::Request(Request {
        reply_to: ReplyTo {
            peer: msg.peer,
            head: Bytes::new(),
        },
        payload,
        received: msg.received,
    })
}

impl RequestServer for Router {
    type Replier = RouterSender;

    fn local_addr(&self) -> SocketAddr {
        Router::local_addr(self)
    }

    async fn recv(&mut self) -> Option<Incoming> {
        Router::recv(self).await.map(incoming)
    }

    fn replier(&self) -> RouterSender {
        self.sender()
    }

    fn refusals(&self) -> Arc<ProtocolRefusals> {
        Router::refusals(self)
    }
}

impl Replier for RouterSender {
    async fn reply(&self, to: &ReplyTo, payload: Bytes) -> Result<(), ReplyError> {
        RouterSender::reply(self, &to.peer, vec![payload])
            .await
            .map_err(|e| match e {
                RouterError::UnknownPeer(_) => ReplyError::UnknownPeer,
                RouterError::PeerGone(_) => ReplyError::PeerGone,
            })
    }

    fn trust(&self, to: &ReplyTo) {
        RouterSender::trust(self, &to.peer)
    }

    fn is_connected(&self, to: &ReplyTo) -> bool {
        RouterSender::is_connected(self, &to.peer)
    }

    fn paused_inbound(&self) -> u64 {
        RouterSender::paused_inbound(self)
    }

    fn peer_count(&self) -> usize {
        RouterSender::peer_count(self)
    }
}

impl PublishServer for Publisher {
    fn local_addr(&self) -> SocketAddr {
        Publisher::local_addr(self)
    }

    /// Without `zmq_filtering` (saltgate-master does not filter) a targeted publish goes to every
    /// subscriber and each minion checks its target, as Salt's ZeroMQ publisher does.
    fn publish(&self, payload: Bytes, _targets: Targets<'_>) -> PublishReport {
        Publisher::publish(self, vec![payload])
    }

    fn subscriber_count(&self) -> usize {
        Publisher::subscriber_count(self)
    }

    fn dropped_total(&self) -> u64 {
        Publisher::dropped_total(self)
    }

    fn refusals(&self) -> Arc<ProtocolRefusals> {
        Publisher::refusals(self)
    }
}

/// A SUB to `addr` subscribed to every publish (Salt's minion subscribes to `""`).
pub fn subscribe_all(addr: SocketAddr, opts: &PublishClientOptions) -> Subscriber {
    let sub = Subscriber::connect(addr, opts.into());
    sub.subscribe(Bytes::new());
    sub
}

impl PublishClient for Subscriber {
    /// With `zmq_filtering` the topic comes first; the payload is always the last frame.
    async fn recv(&mut self) -> Option<Bytes> {
        loop {
            if let Some(payload) = Subscriber::recv(self).await?.pop() {
                return Some(payload);
            }
        }
    }

    fn is_connected(&self) -> bool {
        Subscriber::is_connected(self)
    }

    fn connect_count(&self) -> u64 {
        Subscriber::connect_count(self)
    }

    /// ZeroMQ has no hello (the SUB's READY carries the identity).
    fn set_hello(&self, _hello: Bytes) {}
}

impl Prober for Zeromq {
    async fn greeting(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<PeerGreeting, ProbeError> {
        crate::probe::zmtp_greeting(addr, timeout).await
    }

    async fn ping(
        &self,
        addr: SocketAddr,
        handshake_timeout: Duration,
        timeout: Duration,
    ) -> Result<SaltPingReply, ProbeError> {
        crate::probe::salt_ping_staged(addr, handshake_timeout, timeout).await
    }

    async fn request(
        &self,
        addr: SocketAddr,
        handshake_timeout: Duration,
        timeout: Duration,
        request: &RequestEnvelope,
    ) -> Result<Reply, ProbeError> {
        crate::probe::salt_request(addr, handshake_timeout, timeout, request).await
    }
}

impl Peek for Sniffer {
    fn feed(&mut self, bytes: &[u8]) -> &Verdict {
        Sniffer::feed(self, bytes)
    }

    fn budget(&self) -> usize {
        Sniffer::budget(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Transport;

    fn msg(frames: &[&'static [u8]]) -> RouterMessage {
        RouterMessage {
            peer: Bytes::from_static(b"peer-1"),
            frames: frames.iter().map(|f| Bytes::from_static(f)).collect(),
            received: tokio::time::Instant::now(),
        }
    }

    #[test]
    fn only_the_req_envelope_is_a_request() {
        match incoming(msg(&[b"", b"payload"])) {
            Incoming::Request(r) => {
                assert_eq!(&r.payload[..], b"payload");
                assert_eq!(&r.reply_to.peer[..], b"peer-1");
            }
            other => panic!("{other:?}"),
        }
        for frames in [
            &[b"x" as &[u8], b"payload"][..],
            &[b"payload"],
            &[b"", b"a", b"b"],
        ] {
            match incoming(msg(frames)) {
                Incoming::NotRequest { parts } => assert_eq!(parts, frames.len()),
                other => panic!("{other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn every_transport_has_its_clients_and_a_missing_probe_names_the_key() {
        use crate::transport::Prober;
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        for t in Transport::ALL {
            assert!(
                t.request_client(addr, &RequestClientOptions::default())
                    .is_ok(),
                "{t}"
            );
            // Presence reads every transport's plain requests (under TLS the proxy attaches none).
            assert!(t.peeker(16).is_ok(), "{t}");
        }
        // The probes through the seam are ZeroMQ's only (the proxy calls salt_tcp::probe).
        let d = std::time::Duration::from_millis(100);
        let e = Transport::Ws.ping(addr, d, d).await.unwrap_err();
        assert!(e.to_string().contains("transport"), "{e}");
    }
}
