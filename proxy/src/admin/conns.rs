//! The admin API's connection slots, so that probes keep answering under a flood of idle
//! connections (issue 31 item 5).
//!
//! - A new connection holds no slot until it has sent its first byte: a probe sends its request
//!   at once, so connections that send nothing never stand in its way. At most
//!   `admin.max_waiting` connections wait so; one more evicts the longest-waiting one.
//! - At most `admin.max_connections` connections are open at once. When all are taken, a new
//!   connection evicts the one that has been idle longest (no request in progress); only when
//!   every connection has a request in progress is the new one closed at once. A client that
//!   opens idle connections over and over therefore evicts its own, oldest ones, and a probe that
//!   sends its request as soon as it connects is served.
//! - A connection that has not yet sent a request with the valid bearer token (every connection
//!   when no token is configured) must complete its request headers within
//!   `admin.unauthenticated_header_timeout` of connecting (then of sending its first byte), and of
//!   its previous answer.
//!
//! Every cut is counted in `saltgate_admin_connections_cut_total{reason}`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a connection that has not shown the token may take to send a request's headers,
/// from its connect and from its previous answer, by default
/// (`admin.unauthenticated_header_timeout`).
pub const UNAUTHENTICATED_HEADER_TIMEOUT: Duration =
    saltgate_config::defaults::ADMIN_UNAUTHENTICATED_HEADER_TIMEOUT;

/// Why saltgate closed an admin connection (the metric's `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// Evicted, as the longest-idle connection, to make room for a new one.
    EvictedIdle,
    /// Every slot had a request in progress: the new connection was closed at once.
    Full,
    /// Its request headers did not complete in time.
    HeaderTimeout,
}

impl Cut {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Cut::EvictedIdle => "evicted-idle",
            Cut::Full => "full",
            Cut::HeaderTimeout => "header-timeout",
        }
    }
}

/// One open admin connection's state.
pub(crate) struct Conn {
    in_flight: AtomicU32,
    authenticated: AtomicBool,
    /// Its header deadline until it shows the token (`admin.unauthenticated_header_timeout`).
    unauthenticated_timeout: Duration,
    /// Since when no request is in progress (its connect, or its last answer).
    idle_since: Mutex<Instant>,
    changed: Notify,
    /// Cancelled when the connection is evicted.
    pub(crate) evicted: CancellationToken,
}

impl Conn {
    fn new(unauthenticated_timeout: Duration) -> Conn {
        Conn {
            in_flight: AtomicU32::new(0),
            authenticated: AtomicBool::new(false),
            unauthenticated_timeout,
            idle_since: Mutex::new(Instant::now()),
            changed: Notify::new(),
            evicted: CancellationToken::new(),
        }
    }

    fn idle_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(*self.idle_since.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A request has arrived (its headers are complete); `authenticated` when it carries the
    /// valid token. The guard marks its end when dropped.
    pub(crate) fn start(self: &Arc<Self>, authenticated: bool) -> Busy {
        if authenticated {
            self.authenticated.store(true, Ordering::Release);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
        Busy(self.clone())
    }

    /// When the connection is cut for want of request headers: `None` while a request is in
    /// progress or once it has shown the token (hyper's own header timeout applies then).
    pub(crate) fn header_deadline(&self) -> Option<Instant> {
        if self.authenticated.load(Ordering::Acquire) {
            return None;
        }
        self.idle_since().map(|t| t + self.unauthenticated_timeout)
    }

    /// Completes when a request starts or ends (the deadline may have moved).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await
    }
}

/// A request in progress; dropping it marks the connection idle again.
pub(crate) struct Busy(Arc<Conn>);

impl Drop for Busy {
    fn drop(&mut self) {
        let c = &self.0;
        *c.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        c.in_flight.fetch_sub(1, Ordering::AcqRel);
        c.changed.notify_one();
    }
}

/// The open connections.
pub(crate) struct Slots {
    max: AtomicUsize,
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
}

/// A connection's place; dropping it frees the place.
pub(crate) struct Slot {
    slots: Arc<Slots>,
    id: u64,
    pub(crate) conn: Arc<Conn>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().remove(&self.id);
    }
}

impl Slots {
    pub(crate) fn new(max: usize) -> Arc<Slots> {
        Arc::new(Slots {
            max: AtomicUsize::new(max.max(1)),
            next: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// Changes the bound for later admissions (a reload); connections over it stay until they
    /// end or are evicted.
    pub(crate) fn set_max(&self, max: usize) {
        self.max.store(max.max(1), Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new connection: `Ok((slot, evicted))`, where `evicted` tells that the
    /// longest-idle connection was evicted to make room; `Err(Cut::Full)` when every open
    /// connection has a request in progress.
    /// The new connection's header deadline, until it shows the token, is
    /// `unauthenticated_timeout`.
    pub(crate) fn admit(
        self: &Arc<Self>,
        unauthenticated_timeout: Duration,
    ) -> Result<(Slot, bool), Cut> {
        let mut open = self.lock();
        let mut evicted = false;
        if open.len() >= self.max.load(Ordering::Relaxed) {
            let victim = open
                .iter()
                .filter_map(|(id, c)| c.idle_since().map(|t| (t, *id)))
                .min()
                .map(|(_, id)| id);
            let Some(id) = victim else {
                return Err(Cut::Full);
            };
            if let Some(c) = open.remove(&id) {
                c.evicted.cancel();
            }
            evicted = true;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(unauthenticated_timeout));
        open.insert(id, conn.clone());
        drop(open);
        Ok((
            Slot {
                slots: self.clone(),
                id,
                conn,
            },
            evicted,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_longest_idle_connection_is_evicted_and_a_busy_one_never() {
        let slots = Slots::new(2);
        let (a, _) = slots.admit(UNAUTHENTICATED_HEADER_TIMEOUT).unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
        let (b, _) = slots.admit(UNAUTHENTICATED_HEADER_TIMEOUT).unwrap();
        // a is older and idle: it goes first.
        let (c, evicted) = slots.admit(UNAUTHENTICATED_HEADER_TIMEOUT).unwrap();
        assert!(evicted);
        assert!(a.conn.evicted.is_cancelled() && !b.conn.evicted.is_cancelled());
        drop(a);
        // b busy, c idle: c goes even though it is newer.
        let busy = b.conn.start(false);
        let (_d, evicted) = slots.admit(UNAUTHENTICATED_HEADER_TIMEOUT).unwrap();
        assert!(evicted && c.conn.evicted.is_cancelled());
        assert!(!b.conn.evicted.is_cancelled());
        drop(c);
        // b busy and _d busy: the next is refused.
        let _busy_d = _d.conn.start(false);
        assert_eq!(
            slots.admit(UNAUTHENTICATED_HEADER_TIMEOUT).err(),
            Some(Cut::Full)
        );
        drop(busy);
        assert!(slots.admit(UNAUTHENTICATED_HEADER_TIMEOUT).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_connection_without_the_token_has_the_short_header_deadline() {
        let slots = Slots::new(4);
        let (a, _) = slots.admit(UNAUTHENTICATED_HEADER_TIMEOUT).unwrap();
        let t0 = Instant::now();
        assert_eq!(
            a.conn.header_deadline(),
            Some(t0 + UNAUTHENTICATED_HEADER_TIMEOUT)
        );
        let busy = a.conn.start(false);
        assert_eq!(a.conn.header_deadline(), None, "a request is in progress");
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(busy);
        assert_eq!(
            a.conn.header_deadline(),
            Some(t0 + Duration::from_secs(1) + UNAUTHENTICATED_HEADER_TIMEOUT),
            "counted again from the answer"
        );
        drop(a.conn.start(true));
        assert_eq!(a.conn.header_deadline(), None, "shown the token");
    }
}
