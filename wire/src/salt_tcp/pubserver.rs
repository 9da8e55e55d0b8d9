//! Salt's `tcp` publish server (`salt/transport/tcp.py`, `PubServer` in 3008.5), the seam's
//! [`PublishServer`] for `transport: tcp`, over TCP or TLS (feature `tls`).
//!
//! Every publish is framed once, `{"head": {}, "body": <envelope as bin>}` (Salt's
//! `frame_msg(package)`), and queued for each subscriber it is for; a full queue (`hwm`) drops
//! it for that subscriber only and counts it (as the ZeroMQ [`crate::zmtp::Publisher`]; Salt
//! instead closes a subscriber whose writes do not drain within `publish_drain_timeout`, which
//! this server does for a write stalled that long, [`DRAIN_TIMEOUT`]).
//!
//! **Presence and targeting** (Salt's `presence_callback`). A minion's first message on the
//! publish port is its id, encrypted with the publish key: `{"enc": "aes", "load": {"id",
//! "tok"}}` (`AsyncPubChannel.send_id`). The [`PresenceCheck`] the server was given (the master
//! holds the keys) decrypts it and verifies the `tok` against the minion's accepted key; only
//! then is the connection tagged with the id. A publish with [`Targets::Minions`] goes only to
//! the connections tagged with one of the ids — and, as Salt's `if topic_list:`, an **empty**
//! list goes to every connection. [`Targets::All`] goes to every connection, tagged or not.
//!
//! A subscriber sends nothing else: its messages are bounded ([`MAX_HELLO`]), each must end
//! within the frame deadline of its first byte, and bytes that are not Salt's framing close it;
//! each cut is counted in [`ProtocolRefusals`].

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::client::Stream;
use super::frame_raw::{publish_frame, split_frame, RawError};
use super::server::{cut_of, framing_detail};
use crate::accept::ConnectionPermit;
use crate::salt_stream::publish::{Core, Shared, Slot};
use crate::salt_stream::{drive, note_end, until, write_loop, End, WriteRules};
use crate::transport::{
    ProtocolRefusals, PublishReport, PublishServer, PublishServerOptions, Targets,
};
use crate::zmtp::socket::Cut;

/// Largest message a subscriber may send (a hello is a few hundred bytes).
pub const MAX_HELLO: usize = 64 * 1024;

/// A subscriber's message must end this long after its first byte.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Salt's `publish_drain_timeout` default: a write to a subscriber that makes no progress this
/// long closes it.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Reads a subscriber's hello (the `body` of its message, msgpack) and returns the minion id it
/// proves, if any: the master's `presence_callback`. It may block (RSA, a key file): the server
/// runs it on the blocking pool.
#[derive(Clone)]
pub struct PresenceCheck(pub Arc<VerifyHello>);

/// What a [`PresenceCheck`] runs: a hello's body in, the proved minion id out.
pub type VerifyHello = dyn Fn(&[u8]) -> Option<String> + Send + Sync;

impl PresenceCheck {
    pub fn new(f: impl Fn(&[u8]) -> Option<String> + Send + Sync + 'static) -> Self {
        PresenceCheck(Arc::new(f))
    }
}

impl std::fmt::Debug for PresenceCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PresenceCheck")
    }
}

struct Settings {
    presence: Option<PresenceCheck>,
}

/// Salt's `tcp` publish server on one port ([`PublishServer`]). Dropping it closes every
/// subscriber.
pub struct TcpPublisher {
    core: Core,
}

impl TcpPublisher {
    /// Binds `addr` with Salt's backlog and starts accepting subscribers.
    pub async fn bind(addr: SocketAddr, opts: &PublishServerOptions) -> std::io::Result<Self> {
        let settings = Settings {
            presence: opts.presence.clone(),
        };
        Ok(TcpPublisher {
            core: Core::bind(addr, opts, settings, serve).await?,
        })
    }

    /// The minion ids subscribers have proved, one per tagged connection.
    pub fn present(&self) -> Vec<String> {
        self.core.present()
    }
}

async fn serve(
    tcp: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    settings: Arc<Settings>,
    _permit: ConnectionPermit,
) {
    const WHAT: &str = "tcp publish subscriber";
    let Some(stream) = shared.handshake(tcp, peer, WHAT).await else {
        return;
    };
    let (sub, rx) = shared.join();
    let (rd, wr) = tokio::io::split(stream);
    let rules = WriteRules {
        timeout: Some(DRAIN_TIMEOUT),
        stalled: |t| format!("a publish could not be written for {t:?}"),
        closes: |_| false,
    };
    let writer = tokio::spawn(write_loop(wr, rx, rules));
    let reader = read_loop(rd, &sub.slot, settings.presence.as_ref(), peer);
    let end = drive(writer, reader, None, || sub.leave()).await;
    note_end(&shared.refusals, peer, WHAT, end);
}

async fn read_loop(
    mut rd: tokio::io::ReadHalf<Stream>,
    slot: &Weak<Slot>,
    presence: Option<&PresenceCheck>,
    peer: SocketAddr,
) -> End {
    let mut buf = BytesMut::with_capacity(1024);
    let mut deadline: Option<Instant> = None;
    loop {
        loop {
            match super::scan(&buf, MAX_HELLO) {
                Ok(Some(len)) => {
                    let frame = buf.split_to(len).freeze();
                    let body = match split_frame(&frame) {
                        Ok((_, body)) => body,
                        Err(e) => return End::Cut(cut_of(&e), framing_detail(&e, &frame)),
                    };
                    if let Some(check) = presence {
                        let check = check.0.clone();
                        let id = tokio::task::spawn_blocking(move || check(&body))
                            .await
                            .ok()
                            .flatten();
                        match id {
                            Some(id) => {
                                tracing::debug!(%peer, minion = %id, "tcp subscriber said its id");
                                if let Some(slot) = slot.upgrade() {
                                    slot.set_id(id);
                                }
                            }
                            None => {
                                tracing::debug!(%peer, "tcp subscriber's hello not verified")
                            }
                        }
                    }
                    deadline = (!buf.is_empty()).then(|| Instant::now() + HELLO_TIMEOUT);
                }
                Ok(None) if buf.len() > MAX_HELLO => {
                    let e = RawError::TooLarge {
                        size: buf.len(),
                        limit: MAX_HELLO,
                    };
                    return End::Cut(Cut::Oversized, e.to_string());
                }
                Ok(None) => break,
                Err(e) => {
                    let e = RawError::from(e);
                    return End::Cut(cut_of(&e), framing_detail(&e, &buf));
                }
            }
        }
        buf.reserve(4096);
        tokio::select! {
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) | Err(_) => return End::Closed,
                Ok(_) => {}
            },
            _ = until(deadline) => return End::Cut(Cut::Slow, format!(
                "a message was not completed within {HELLO_TIMEOUT:?} of its first byte"
            )),
        }
        if deadline.is_none() {
            deadline = Some(Instant::now() + HELLO_TIMEOUT);
        }
    }
}

impl PublishServer for TcpPublisher {
    fn local_addr(&self) -> SocketAddr {
        self.core.local_addr
    }

    fn publish(&self, payload: Bytes, targets: Targets<'_>) -> PublishReport {
        let ids = match targets {
            Targets::Minions(ids) if !ids.is_empty() => Some(ids),
            _ => None,
        };
        self.core.publish(
            || publish_frame(&payload),
            |slot| ids.is_none_or(|ids| slot.id_is(ids)),
        )
    }

    fn subscriber_count(&self) -> usize {
        self.core.subscriber_count()
    }

    fn dropped_total(&self) -> u64 {
        self.core.dropped_total()
    }

    fn refusals(&self) -> Arc<ProtocolRefusals> {
        self.core.shared.refusals.clone()
    }
}

#[cfg(test)]
#[path = "pubserver_tests.rs"]
mod tests;
