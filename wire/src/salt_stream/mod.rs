//! What Salt's two stream transports, `tcp` ([`crate::salt_tcp`]) and `ws` ([`crate::salt_ws`]),
//! share: both are one TCP (or TLS, feature `tls`) connection per peer, and differ only in how a
//! message is framed on it. The framing stays in each transport's module; this one holds the
//! rest, which each transport calls with its framing:
//!
//! * this module: one served connection's life, [`handshake`] (the TLS accept within
//!   [`HANDSHAKE_TIMEOUT`]), [`write_loop`] (a queue's frames written within a deadline),
//!   [`drive`] (reader against writer) and [`End`] (why it ended, counted in
//!   [`ProtocolRefusals`]);
//! * [`request`]: a request server's connection table, limits, untrusted byte budget, receive
//!   queue and replier ([`crate::transport::RequestServer`], [`crate::transport::Replier`]);
//! * [`publish`]: a publish server's subscriber list and fan-out with a queue (`hwm`) per
//!   subscriber ([`crate::transport::PublishServer`]);
//! * [`redial`]: a publish client's dial, serve, back off and dial again loop
//!   ([`crate::transport::PublishClient`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::transport::ProtocolRefusals;
use crate::zmtp::socket::Cut;

pub(crate) mod publish;
pub(crate) mod redial;
pub(crate) mod request;

pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + Sync {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> Io for T {}
/// A plain or TLS stream.
pub(crate) type Stream = Pin<Box<dyn Io>>;

/// Longest a TLS handshake may take (the ZeroMQ sockets' `handshake_timeout`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a connection ended.
pub(crate) enum End {
    /// The peer closed it, or the server went away.
    Closed,
    /// A cut, counted.
    Cut(Cut, String),
}

/// The TLS handshake when configured, within [`HANDSHAKE_TIMEOUT`]; a failure is counted and
/// `None`.
pub(crate) async fn handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    #[cfg(feature = "tls")] tls: Option<&crate::salt_tcp::tls_server::TlsServer>,
    refusals: &ProtocolRefusals,
    what: &str,
) -> Option<Stream> {
    #[cfg(feature = "tls")]
    if let Some(tls) = tls {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
        return match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
            Ok(Ok(s)) => Some(Box::pin(s) as Stream),
            Ok(Err(e)) => {
                let detail = format!(
                    "TLS handshake: {e} (the minion's `ssl` must match the master's: a CA \
                     both trust, a client certificate when cert_reqs asks for one)"
                );
                refusals.note_cut(peer, what, Cut::Malformed, &detail);
                None
            }
            Err(_) => {
                let detail = format!("no TLS handshake within {HANDSHAKE_TIMEOUT:?}");
                refusals.note_cut(peer, what, Cut::Handshake, &detail);
                None
            }
        };
    }
    let _ = (peer, refusals, what);
    Some(Box::pin(tcp) as Stream)
}

/// Sleeps until `deadline`, or for ever without one.
pub(crate) async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// How a transport's writer treats its frames.
#[derive(Clone, Copy)]
pub(crate) struct WriteRules {
    /// A write that makes no progress this long cuts the connection (`write_timeout`).
    pub timeout: Option<Duration>,
    /// The cut's detail, given the timeout.
    pub stalled: fn(Duration) -> String,
    /// True for a frame after which the connection is shut down (a websocket close).
    pub closes: fn(&[u8]) -> bool,
}

/// Writes the frames `rx` gives, each within `rules.timeout`, until the queue closes, a write
/// fails or a closing frame is written.
pub(crate) async fn write_loop(
    mut wr: tokio::io::WriteHalf<Stream>,
    mut rx: mpsc::Receiver<Bytes>,
    rules: WriteRules,
) -> End {
    while let Some(frame) = rx.recv().await {
        let closing = (rules.closes)(&frame);
        let write = async {
            wr.write_all(&frame).await?;
            wr.flush().await
        };
        match rules.timeout {
            Some(t) => match tokio::time::timeout(t, write).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return End::Closed,
                Err(_) => return End::Cut(Cut::Stalled, (rules.stalled)(t)),
            },
            None => {
                if write.await.is_err() {
                    return End::Closed;
                }
            }
        }
        if closing {
            let _ = wr.shutdown().await;
            return End::Closed;
        }
    }
    End::Closed
}

/// Runs a connection's reader against its writer until either ends, then calls `leave` (which
/// takes the connection out of its server's table). With `linger`, the writer then has that
/// long to write what is queued (a websocket close frame); without, it is stopped at once.
pub(crate) async fn drive(
    mut writer: JoinHandle<End>,
    reader: impl Future<Output = End>,
    linger: Option<Duration>,
    leave: impl FnOnce(),
) -> End {
    let end = tokio::select! {
        end = reader => end,
        w = &mut writer => w.unwrap_or(End::Closed),
    };
    match linger {
        None => {
            writer.abort();
            leave();
        }
        Some(t) => {
            leave();
            if tokio::time::timeout(t, &mut writer).await.is_err() {
                writer.abort();
            }
        }
    }
    end
}

/// Logs a close, counts a cut.
pub(crate) fn note_end(refusals: &ProtocolRefusals, peer: SocketAddr, what: &str, end: End) {
    match end {
        End::Closed => tracing::debug!(%peer, "{what} closed"),
        End::Cut(class, detail) => refusals.note_cut(peer, what, class, &detail),
    }
}
