//! A publish server's core, shared by `tcp` ([`crate::salt_tcp::pubserver`]) and `ws`
//! ([`crate::salt_ws::pubserver`]): the listener (Salt's backlog, the connection limits), the
//! subscriber list and the fan-out. The list is an `Arc<Vec<_>>` snapshot (its lock is held only
//! to clone the `Arc` or to edit the list); a publish is framed once, when the first subscriber
//! takes it, and queued for each subscriber it is for; a full queue (`hwm`) drops it for that
//! subscriber only and counts it. A transport gives the frame, which subscribers a publish is
//! for, and the connection's reading.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::accept::{Acceptor, ConnectionPermit};
use crate::transport::{ProtocolRefusals, PublishReport, PublishServerOptions};

/// One subscriber.
pub(crate) struct Slot {
    tx: mpsc::Sender<Bytes>,
    /// The minion id the subscriber proved (`None` until then; `ws` has no hello).
    id: Mutex<Option<String>>,
    conn: u64,
}

impl Slot {
    /// The proved minion id.
    pub fn id(&self) -> Option<String> {
        self.id.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_id(&self, id: String) {
        *self.id.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
    }

    /// True when the subscriber proved one of `ids`.
    pub fn id_is(&self, ids: &[&str]) -> bool {
        self.id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_deref()
            .is_some_and(|id| ids.contains(&id))
    }
}

type Slots = Arc<Vec<Arc<Slot>>>;

/// What a publish server's connections share.
pub(crate) struct Shared {
    slots: Mutex<Slots>,
    dropped: AtomicU64,
    next_conn: AtomicU64,
    pub refusals: Arc<ProtocolRefusals>,
    hwm: usize,
    #[cfg(feature = "tls")]
    tls: Option<crate::salt_tcp::tls_server::TlsServer>,
}

impl Shared {
    fn snapshot(&self) -> Slots {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn update(&self, f: impl FnOnce(&mut Vec<Arc<Slot>>)) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        f(Arc::make_mut(&mut slots));
    }

    /// The TLS handshake when configured ([`super::handshake`]); a failure is counted.
    pub async fn handshake(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        what: &str,
    ) -> Option<super::Stream> {
        super::handshake(
            tcp,
            peer,
            #[cfg(feature = "tls")]
            self.tls.as_ref(),
            &self.refusals,
            what,
        )
        .await
    }

    /// Adds a subscriber; the receiver gives the frames to write it (it ends when the server is
    /// dropped: the list holds the only strong sender). The subscriber leaves the list when the
    /// [`Joined`] is dropped.
    pub fn join(&self) -> (Joined<'_>, mpsc::Receiver<Bytes>) {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(self.hwm);
        let weak = tx.downgrade();
        let slot = Arc::new(Slot {
            tx,
            id: Mutex::new(None),
            conn,
        });
        let joined = Joined {
            shared: self,
            slot: Arc::downgrade(&slot),
            conn,
            out: weak,
        };
        self.update(|s| s.push(slot));
        (joined, rx)
    }
}

/// A subscriber in the list. It holds its slot weakly: the list holds the only strong reference
/// (and through it the queue's only sender), so that dropping the server ends the connection.
pub(crate) struct Joined<'a> {
    shared: &'a Shared,
    conn: u64,
    pub slot: Weak<Slot>,
    /// Its queue, weakly (for control frames: a pong, a close).
    pub out: mpsc::WeakSender<Bytes>,
}

impl Joined<'_> {
    /// Takes the subscriber out of the list.
    pub fn leave(&self) {
        let conn = self.conn;
        self.shared.update(|s| s.retain(|x| x.conn != conn));
    }
}

/// A bound publish server. Dropping it closes every subscriber.
pub(crate) struct Core {
    pub local_addr: SocketAddr,
    pub shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.update(|s| s.clear());
    }
}

impl Core {
    /// Binds `addr` with Salt's backlog and the options' limits, and serves each accepted
    /// connection with `serve` (given the connection, its peer, the shared state and the
    /// transport's `settings`).
    pub async fn bind<S, F, Fut>(
        addr: SocketAddr,
        opts: &PublishServerOptions,
        settings: S,
        serve: F,
    ) -> std::io::Result<Self>
    where
        S: Send + Sync + 'static,
        F: Fn(TcpStream, SocketAddr, Arc<Shared>, Arc<S>, ConnectionPermit) -> Fut
            + Send
            + Sync
            + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (local_addr, mut acceptor) =
            Acceptor::bind_salt(addr, opts.keepalive, opts.max_connections)?;
        if let Some(l) = &opts.shared_limit {
            acceptor = acceptor.with_limit(l.clone());
        }
        let shared = Arc::new(Shared {
            slots: Mutex::new(Arc::new(Vec::new())),
            dropped: AtomicU64::new(0),
            next_conn: AtomicU64::new(0),
            refusals: Arc::default(),
            hwm: opts.hwm.max(1),
            #[cfg(feature = "tls")]
            tls: opts.tls.clone(),
        });
        let settings = Arc::new(settings);
        let sh = shared.clone();
        let accept = acceptor.spawn_each(move |stream, peer, permit| {
            serve(stream, peer, sh.clone(), settings.clone(), permit)
        });
        Ok(Core {
            local_addr,
            shared,
            accept,
        })
    }

    /// Queues a publish for each subscriber `wanted` accepts, framed by `frame` (once, when the
    /// first subscriber takes it); a full queue drops it for that subscriber and counts it.
    pub fn publish(
        &self,
        frame: impl Fn() -> Bytes,
        wanted: impl Fn(&Slot) -> bool,
    ) -> PublishReport {
        let mut framed: Option<Bytes> = None;
        let mut report = PublishReport::default();
        for slot in self.shared.snapshot().iter() {
            if !wanted(slot) {
                continue;
            }
            let msg = framed.get_or_insert_with(&frame).clone();
            match slot.tx.try_send(msg) {
                Ok(()) => report.queued += 1,
                Err(mpsc::error::TrySendError::Full(_)) => report.dropped += 1,
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
        self.shared
            .dropped
            .fetch_add(report.dropped as u64, Ordering::Relaxed);
        report
    }

    /// The minion ids subscribers have proved, one per tagged connection.
    pub fn present(&self) -> Vec<String> {
        self.shared
            .snapshot()
            .iter()
            .filter_map(|s| s.id())
            .collect()
    }

    pub fn subscriber_count(&self) -> usize {
        self.shared.snapshot().len()
    }

    pub fn dropped_total(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}
