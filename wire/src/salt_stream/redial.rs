//! A publish client's life, shared by `tcp` ([`crate::salt_tcp::subscriber`]) and `ws`
//! ([`crate::salt_ws::subscriber`]): a background task dials, reads the connection until it
//! ends, and dials again after Salt's reconnect delay ([`ReconnectPolicy`]), until the client is
//! dropped. A transport gives the dial (its handshake) and the reading (its framing).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::transport::ReconnectPolicy;

/// Aborts the background task when the client is dropped.
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the client sees of its task.
#[derive(Default)]
pub(crate) struct Link {
    connected: AtomicBool,
    connects: AtomicU64,
    dropped: AtomicU64,
}

impl Link {
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    /// Connections made so far.
    pub fn connect_count(&self) -> u64 {
        self.connects.load(Ordering::SeqCst)
    }

    /// Publishes dropped so far because the receive queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Hands a publish to the client's queue; a full queue drops (and counts) it. `Err`: the
    /// client is gone.
    pub fn hand_over(&self, tx: &mpsc::Sender<Bytes>, payload: Bytes) -> Result<(), ()> {
        match tx.try_send(payload) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
        }
    }
}

/// Dials with `open` (which logs its own failure and gives `None`) and reads each connection
/// with `serve` (which gives why it ended), backing off after failures, until `tx` closes.
pub(crate) async fn run<C, O, OF, S, SF>(
    addr: SocketAddr,
    what: &str,
    policy: ReconnectPolicy,
    tx: &mpsc::Sender<Bytes>,
    link: &Link,
    mut open: O,
    mut serve: S,
) where
    O: FnMut() -> OF,
    OF: Future<Output = Option<C>>,
    S: FnMut(C) -> SF,
    SF: Future<Output = &'static str>,
{
    let ivl = policy.initial_interval(&mut rand::rng());
    let mut failures = 0u32;
    loop {
        match open().await {
            Some(c) => {
                failures = 0;
                link.connects.fetch_add(1, Ordering::SeqCst);
                link.connected.store(true, Ordering::SeqCst);
                let why = serve(c).await;
                link.connected.store(false, Ordering::SeqCst);
                tracing::debug!(%addr, reason = why, "{what} closed");
                if tx.is_closed() {
                    return;
                }
            }
            None => failures = failures.saturating_add(1),
        }
        tokio::time::sleep(policy.delay(ivl, failures)).await;
    }
}
