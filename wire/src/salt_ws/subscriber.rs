//! Salt's `ws` publish client (`salt/transport/ws.py`, `PublishClient` in 3008.5), the seam's
//! [`PublishClient`] for `transport: ws`, over TCP or TLS (feature `tls`).
//!
//! A background task opens a websocket on the publish port at `/ws` (`http(s)://ip:port/ws`),
//! re-opens it after a loss with Salt's reconnect policy ([`ReconnectPolicy`]), and hands over
//! every binary message: Salt's ws publisher sends each publish as `salt.payload.dumps(payload)`
//! of the already serialised envelope, a msgpack `bin`, whose bytes are the payload (a map is
//! encoded, as on `tcp`). The client sends nothing: `ws` has no hello (Salt's ws publisher sends
//! every publish to every client, and the minion filters). A text `"close"` closes the
//! websocket (Salt's client does the same), pings are answered; there is no heartbeat of our own
//! (Salt's aiohttp client has none either).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::client::open;
use super::conn::{ConnError, WsConn};
use super::{WsMessage, WS_PATH};
use crate::envelope;
use crate::salt_stream::redial::{self, AbortOnDrop, Link};
use crate::salt_tcp::client::{body_payload, Dial};
use crate::salt_tcp::subscriber::MAX_PUBLISH;
use crate::transport::{PublishClient, PublishClientOptions, ReconnectPolicy};

/// Salt's `ws` publish client for one master ([`PublishClient`]).
pub struct WsSubscriber {
    rx: mpsc::Receiver<Bytes>,
    link: Arc<Link>,
    _task: AbortOnDrop,
}

impl WsSubscriber {
    /// Starts dialling `addr` in the background (call from within a Tokio runtime).
    pub fn connect(addr: SocketAddr, opts: &PublishClientOptions) -> Self {
        let link = Arc::new(Link::default());
        let (tx, rx) = mpsc::channel(opts.queue.max(1));
        let how = Dial::from(opts);
        let task = tokio::spawn(run(
            addr,
            how,
            opts.reconnect,
            opts.connect_timeout,
            tx,
            link.clone(),
        ));
        WsSubscriber {
            rx,
            link,
            _task: AbortOnDrop(task),
        }
    }

    /// Publishes dropped so far because the receive queue was full.
    pub fn dropped_inbound(&self) -> u64 {
        self.link.dropped()
    }
}

async fn run(
    addr: SocketAddr,
    how: Dial,
    policy: ReconnectPolicy,
    connect_timeout: Duration,
    tx: mpsc::Sender<Bytes>,
    link: Arc<Link>,
) {
    let (how, tx, link) = (&how, &tx, &*link);
    let open = || async move {
        match open(addr, how, WS_PATH, MAX_PUBLISH, connect_timeout).await {
            Ok(ws) => Some(ws),
            Err(ConnError::Zmtp) => {
                tracing::warn!(%addr, "the publish port answers with a ZMTP greeting: the master \
                    speaks `transport: zeromq`; set the minion's `transport` to the master's");
                None
            }
            Err(e) => {
                tracing::debug!(%addr, error = %e, "ws publish connect failed");
                None
            }
        }
    };
    let serve = |ws| serve(ws, tx, link);
    redial::run(addr, "ws publish connection", policy, tx, link, open, serve).await;
}

/// The payload a publish message carries (its msgpack `bin`), `None` if it is not msgpack.
pub(crate) fn publish_payload(data: &[u8]) -> Option<Bytes> {
    let v = envelope::decode(data).ok()?;
    body_payload(&v)
}

/// Reads one websocket until it ends; returns why.
async fn serve(mut ws: WsConn, tx: &mpsc::Sender<Bytes>, link: &Link) -> &'static str {
    loop {
        let m = tokio::select! {
            m = ws.recv() => m,
            _ = tx.closed() => {
                ws.close(1000).await;
                return "client dropped";
            }
        };
        let m = match m {
            Ok(m) => m,
            Err(ConnError::Ws(e)) => {
                tracing::debug!(error = %e, "ws publish stream broke the protocol");
                ws.close(super::upgrade::CLOSE_PROTOCOL).await;
                return "not a valid websocket stream";
            }
            Err(_) => return "closed by the master",
        };
        match m {
            WsMessage::Binary(data) => {
                let Some(payload) = publish_payload(&data) else {
                    tracing::debug!(len = data.len(), "ws publish that is not msgpack, skipped");
                    continue;
                };
                if link.hand_over(tx, payload).is_err() {
                    return "client dropped";
                }
            }
            WsMessage::Text(t) if t == b"close" => {
                ws.close(1000).await;
                return "the master asked to close";
            }
            other => match ws.answer(&other).await {
                Ok(true) => return "closed by the master",
                Ok(false) => {}
                Err(_) => return "write error",
            },
        }
    }
}

impl PublishClient for WsSubscriber {
    async fn recv(&mut self) -> Option<Bytes> {
        self.rx.recv().await
    }

    fn is_connected(&self) -> bool {
        self.link.is_connected()
    }

    fn connect_count(&self) -> u64 {
        self.link.connect_count()
    }

    /// `ws` has no hello: ignored.
    fn set_hello(&self, _hello: Bytes) {}
}
