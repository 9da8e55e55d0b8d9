//! A request server's core, shared by `tcp` ([`crate::salt_tcp::server`]) and `ws`
//! ([`crate::salt_ws::server`]): the listener (Salt's backlog, the connection limits), the table
//! of connections with their reply queues and trust, the untrusted byte budget and the receive
//! queue (both backpressure: a peer is not read while its message waits), and the replier's
//! side of the table. A transport gives the connection's reading (its framing) and the reply's
//! frame.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::accept::{Acceptor, ConnectionPermit};
use crate::transport::{
    Incoming, ProtocolRefusals, ReplyError, ReplyTo, Request, RequestServerOptions,
};

/// Replies (frames) queued for one connection before [`crate::transport::Replier::reply`] waits.
pub(crate) const REPLY_QUEUE: usize = 64;

/// A message received, with its share of the untrusted byte budget (given back when taken).
pub(crate) struct Delivered {
    request: Request,
    _budget: Option<OwnedSemaphorePermit>,
}

struct Conn {
    tx: mpsc::Sender<Bytes>,
    trusted: Arc<AtomicBool>,
}

/// What a server's connections and its replier share.
pub(crate) struct Shared {
    conns: Mutex<HashMap<u64, Conn>>,
    next_conn: AtomicU64,
    paused: AtomicU64,
    pub refusals: Arc<ProtocolRefusals>,
    /// `untrusted_queue_bytes` (one permit a byte), with its size.
    budget: Option<(Arc<Semaphore>, usize)>,
}

/// What every connection of a server reads by.
pub(crate) struct Settings {
    pub max: usize,
    pub untrusted_max: usize,
    pub payload_timeout: Option<Duration>,
    pub write_timeout: Option<Duration>,
    #[cfg(feature = "tls")]
    pub tls: Option<crate::salt_tcp::tls_server::TlsServer>,
}

impl Settings {
    /// The size limit for a peer, trusted or not.
    pub fn max_for(&self, trusted: bool) -> usize {
        if trusted {
            self.max
        } else {
            self.untrusted_max
        }
    }
}

/// One accepted connection's entry in the table, removed when dropped.
pub(crate) struct Registered<'a> {
    shared: &'a Shared,
    pub id: u64,
    pub trusted: Arc<AtomicBool>,
    /// The reply queue, weakly: the table holds the only strong sender, so dropping the server
    /// (which clears it) ends the writer, and with it the connection.
    pub out: mpsc::WeakSender<Bytes>,
}

impl Registered<'_> {
    /// The table entry's key, as [`ReplyTo::peer`] holds it.
    pub fn peer_key(&self) -> Bytes {
        Bytes::copy_from_slice(&self.id.to_be_bytes())
    }

    /// Takes the connection out of the table.
    pub fn leave(&self) {
        self.shared.conns().remove(&self.id);
    }
}

impl Shared {
    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enters a new connection in the table; the receiver gives the replies to write (it ends
    /// when the server is dropped).
    pub fn register(&self) -> (Registered<'_>, mpsc::Receiver<Bytes>) {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (out_tx, out_rx) = mpsc::channel::<Bytes>(REPLY_QUEUE);
        let trusted = Arc::new(AtomicBool::new(false));
        let out = out_tx.downgrade();
        self.conns().insert(
            id,
            Conn {
                tx: out_tx,
                trusted: trusted.clone(),
            },
        );
        let conn = Registered {
            shared: self,
            id,
            trusted,
            out,
        };
        (conn, out_rx)
    }

    /// Hands a request to the server's receive queue, first drawing `len` bytes of the untrusted
    /// budget when the peer is not trusted; waits (and counts a pause) while either is full.
    /// `Err`: the server is gone.
    pub async fn deliver(
        &self,
        tx: &mpsc::Sender<Delivered>,
        request: Request,
        len: usize,
        trusted: bool,
    ) -> Result<(), ()> {
        let budget = match (&self.budget, trusted) {
            (Some((sem, total)), false) => {
                let share = len.clamp(1, *total) as u32;
                let permit = match sem.clone().try_acquire_many_owned(share) {
                    Ok(p) => p,
                    Err(_) => {
                        self.paused.fetch_add(1, Ordering::Relaxed);
                        sem.clone()
                            .acquire_many_owned(share)
                            .await
                            .map_err(|_| ())?
                    }
                };
                Some(permit)
            }
            _ => None,
        };
        let d = Delivered {
            request,
            _budget: budget,
        };
        match tx.try_send(d) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(d)) => {
                self.paused.fetch_add(1, Ordering::Relaxed);
                tx.send(d).await.map_err(|_| ())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
        }
    }
}

fn conn_key(to: &ReplyTo) -> Option<u64> {
    <[u8; 8]>::try_from(&to.peer[..])
        .ok()
        .map(u64::from_be_bytes)
}

/// A bound request server: its listener's task, its table, its receive queue. Dropping it
/// closes every connection.
pub(crate) struct Core {
    pub local_addr: SocketAddr,
    pub shared: Arc<Shared>,
    rx: mpsc::Receiver<Delivered>,
    accept: JoinHandle<()>,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.conns().clear();
    }
}

impl Core {
    /// Binds `addr` with Salt's backlog and the options' limits, and serves each accepted
    /// connection with `serve`.
    pub async fn bind<F, Fut>(
        addr: SocketAddr,
        opts: &RequestServerOptions,
        serve: F,
    ) -> std::io::Result<Self>
    where
        F: Fn(TcpStream, Accepted) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (local_addr, mut acceptor) = Acceptor::bind_salt(
            addr,
            Some(crate::accept::Keepalive::salt()),
            opts.max_connections,
        )?;
        if let Some(l) = &opts.shared_limit {
            acceptor = acceptor.with_limit(l.clone());
        }
        let shared = Arc::new(Shared {
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            paused: AtomicU64::new(0),
            refusals: Arc::default(),
            budget: opts
                .untrusted_queue_bytes
                .map(|b| b.clamp(1, u32::MAX as usize))
                .map(|b| (Arc::new(Semaphore::new(b)), b)),
        });
        let settings = Arc::new(Settings {
            max: opts.max_payload,
            untrusted_max: opts
                .untrusted_max_payload
                .map_or(opts.max_payload, |u| u.min(opts.max_payload)),
            payload_timeout: opts.payload_timeout,
            write_timeout: opts.write_timeout,
            #[cfg(feature = "tls")]
            tls: opts.tls.clone(),
        });
        let (tx, rx) = mpsc::channel(opts.queue.max(1));
        let sh = shared.clone();
        let accept = acceptor.spawn_each(move |stream, peer, permit| {
            let conn = Accepted {
                peer,
                shared: sh.clone(),
                tx: tx.clone(),
                settings: settings.clone(),
                permit,
            };
            serve(stream, conn)
        });
        Ok(Core {
            local_addr,
            shared,
            rx,
            accept,
        })
    }

    /// The next request ([`crate::transport::RequestServer::recv`]).
    pub async fn recv(&mut self) -> Option<Incoming> {
        self.rx.recv().await.map(|d| Incoming::Request(d.request))
    }

    /// Bytes of `untrusted_queue_bytes` not drawn now (`None` without a budget).
    pub fn untrusted_budget_available(&self) -> Option<usize> {
        self.shared
            .budget
            .as_ref()
            .map(|(s, _)| s.available_permits())
    }
}

/// What serving an accepted connection needs.
pub(crate) struct Accepted {
    pub peer: SocketAddr,
    pub shared: Arc<Shared>,
    pub tx: mpsc::Sender<Delivered>,
    pub settings: Arc<Settings>,
    /// Held for the connection's life (the connection limits).
    pub permit: ConnectionPermit,
}

impl Accepted {
    /// The TLS handshake when configured ([`super::handshake`]); a failure is counted.
    pub async fn handshake(&self, tcp: TcpStream, what: &str) -> Option<super::Stream> {
        super::handshake(
            tcp,
            self.peer,
            #[cfg(feature = "tls")]
            self.settings.tls.as_ref(),
            &self.shared.refusals,
            what,
        )
        .await
    }
}

/// The replier's side of the table ([`crate::transport::Replier`]), the reply's frame aside.
#[derive(Clone)]
pub(crate) struct ReplierCore(pub Arc<Shared>);

impl ReplierCore {
    /// Queues `frame` for the connection `to` names.
    pub async fn send(&self, to: &ReplyTo, frame: Bytes) -> Result<(), ReplyError> {
        let tx = conn_key(to)
            .and_then(|k| self.0.conns().get(&k).map(|c| c.tx.clone()))
            .ok_or(ReplyError::UnknownPeer)?;
        tx.send(frame).await.map_err(|_| ReplyError::PeerGone)
    }

    pub fn trust(&self, to: &ReplyTo) {
        if let Some(c) =
            conn_key(to).and_then(|k| self.0.conns().get(&k).map(|c| c.trusted.clone()))
        {
            c.store(true, Ordering::Relaxed);
        }
    }

    pub fn is_connected(&self, to: &ReplyTo) -> bool {
        conn_key(to).is_some_and(|k| self.0.conns().contains_key(&k))
    }

    pub fn paused_inbound(&self) -> u64 {
        self.0.paused.load(Ordering::Relaxed)
    }

    pub fn peer_count(&self) -> usize {
        self.0.conns().len()
    }
}
