//! Salt's `ws` publish server (`salt/transport/ws.py`, `PublishServer` in 3008.5), the seam's
//! [`PublishServer`] for `transport: ws`, over TCP or TLS (feature `tls`).
//!
//! A subscriber upgrades on any path (Salt's client uses `/ws`). Every publish is one binary
//! message holding `salt.payload.dumps(payload)`: the serialised envelope as a msgpack `bin`,
//! encoded once and queued for **every** subscriber, whatever the targets: Salt's ws
//! `publish_payload` ignores its `topic_list` and the minions filter (there is no hello, so no
//! presence either). A full queue (`hwm`) drops the publish for that subscriber only and counts
//! it; a write stalled [`DRAIN_TIMEOUT`] closes it.
//!
//! A subscriber sends nothing but control frames: its messages are bounded ([`MAX_HELLO`] and
//! [`HELLO_TIMEOUT`] of the first byte, as on `tcp`), pings are answered, a close is echoed, a
//! text `"close"` closes (Salt's server only reads past data). A bad upgrade or invalid frames
//! close it, counted in [`ProtocolRefusals`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::conn::{read_message, WsConn};
use super::server::{close_code, close_with, cut_of, write_rules};
use super::upgrade::{server_frame, CLOSE_NORMAL};
use super::{WsDecoder, WsMessage, OP_BINARY, OP_PONG};
use crate::accept::ConnectionPermit;
use crate::salt_stream::publish::{Core, Shared};
use crate::salt_stream::{drive, note_end, write_loop, End, Stream};
use crate::transport::{
    ProtocolRefusals, PublishReport, PublishServer, PublishServerOptions, Targets,
};

pub use crate::salt_tcp::pubserver::{DRAIN_TIMEOUT, HELLO_TIMEOUT, MAX_HELLO};

struct Settings {
    handshake_timeout: Duration,
}

/// Salt's `ws` publish server on one port ([`PublishServer`]). Dropping it closes every
/// subscriber.
pub struct WsPublisher {
    core: Core,
}

impl WsPublisher {
    /// Binds `addr` with Salt's backlog and starts accepting subscribers.
    pub async fn bind(addr: SocketAddr, opts: &PublishServerOptions) -> std::io::Result<Self> {
        let settings = Settings {
            handshake_timeout: opts.handshake_timeout,
        };
        Ok(WsPublisher {
            core: Core::bind(addr, opts, settings, serve).await?,
        })
    }
}

/// The binary message a publish goes out as: the payload as a msgpack `bin`
/// (`salt.payload.dumps(payload)`), one frame.
pub fn publish_message(payload: &[u8]) -> Bytes {
    let mut bin = Vec::with_capacity(payload.len() + 5);
    let n = payload.len();
    if n <= 0xff {
        bin.extend_from_slice(&[0xc4, n as u8]);
    } else if n <= 0xffff {
        bin.push(0xc5);
        bin.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        // The publisher's limits are far below 4 GiB, msgpack's bound.
        bin.push(0xc6);
        bin.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
    }
    bin.extend_from_slice(payload);
    Bytes::from(server_frame(OP_BINARY, &bin))
}

async fn serve(
    tcp: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    settings: Arc<Settings>,
    _permit: ConnectionPermit,
) {
    const WHAT: &str = "ws publish subscriber";
    let Some(stream) = shared.handshake(tcp, peer, WHAT).await else {
        return;
    };
    let ws = match WsConn::accept(stream, MAX_HELLO, settings.handshake_timeout).await {
        Ok((ws, _)) => ws,
        Err(e) => {
            if let Some((class, detail)) = cut_of(&e, "nothing") {
                shared.refusals.note_cut(peer, WHAT, class, &detail);
            }
            return;
        }
    };
    let (stream, dec) = ws.into_parts();
    let (sub, rx) = shared.join();
    let (rd, wr) = tokio::io::split(stream);
    let writer = tokio::spawn(write_loop(wr, rx, write_rules(Some(DRAIN_TIMEOUT))));
    let reader = read_loop(rd, dec, &sub.out);
    let end = drive(writer, reader, Some(Duration::from_secs(1)), || sub.leave()).await;
    note_end(&shared.refusals, peer, WHAT, end);
}

async fn read_loop(
    mut rd: tokio::io::ReadHalf<Stream>,
    mut dec: WsDecoder,
    out: &mpsc::WeakSender<Bytes>,
) -> End {
    loop {
        let m = match read_message(&mut rd, &mut dec, None, Some(HELLO_TIMEOUT)).await {
            Ok(m) => m,
            Err(e) => {
                return match cut_of(&e, "nothing") {
                    None => End::Closed,
                    Some((class, detail)) => {
                        close_with(out, close_code(&e));
                        End::Cut(class, detail)
                    }
                }
            }
        };
        match m {
            WsMessage::Ping(p) => {
                // A full queue drops the pong, as it would drop a publish.
                let Some(out) = out.upgrade() else {
                    return End::Closed;
                };
                let _ = out.try_send(Bytes::from(server_frame(OP_PONG, &p)));
            }
            WsMessage::Close(code) => {
                close_with(out, code.filter(|c| *c != 1005).unwrap_or(CLOSE_NORMAL));
                return End::Closed;
            }
            WsMessage::Text(t) if t == b"close" => {
                close_with(out, CLOSE_NORMAL);
                return End::Closed;
            }
            _ => {}
        }
    }
}

impl PublishServer for WsPublisher {
    fn local_addr(&self) -> SocketAddr {
        self.core.local_addr
    }

    /// Every subscriber, whatever `targets` says (Salt's ws publisher has no topics).
    fn publish(&self, payload: Bytes, _targets: Targets<'_>) -> PublishReport {
        self.core.publish(|| publish_message(&payload), |_| true)
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
