//! A master's session book: how many sessions each port holds and which, so they can be capped
//! (`maxconn`), counted (`leastconn`, metrics), listed (admin API), and closed when the master is
//! marked DOWN (paced, with jitter, to avoid a reconnect storm on the surviving masters), drained,
//! disabled or at shutdown.
//!
//! One type owns a session's place in the book: the [`Lease`]. It is taken before connecting (so
//! concurrent accepts cannot overshoot `maxconn`, and `leastconn` sees sessions being set up),
//! entered in the book once connected ([`Lease::register`]), and gives both back on drop; giving the
//! place back wakes the first client waiting in the listener's queue ([`Lease::wake_on_release`],
//! [`crate::data::queue`]). The book knows nothing of masters' health or configuration.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use saltgate_config::Role;
use tokio_util::sync::CancellationToken;

use super::close::CloseReason;
use super::queue::Queue;

/// The handle a session listens on, and the reason it was asked to close with.
#[derive(Debug)]
pub struct SessionCtl {
    /// Unique over the process.
    pub id: u64,
    pub role: Role,
    pub client: SocketAddr,
    /// When the session began: its client was accepted.
    pub started: Instant,
    /// The task to wake when [`SessionCtl::close`] is called (registered by the pump, see
    /// [`SessionCtl::register_waker`]). A waker slot, not a child `CancellationToken`: that was
    /// a 112-byte tree node per session, plus its entry in the parent's list.
    waker: Mutex<Option<Waker>>,
    reason: AtomicU8,
    /// Bytes client → master and master → client, published by the pump (see [`crate::data::pump`]).
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Idleness as the rebalancer samples it (see [`SessionCtl::observe`]): bytes seen at the
    /// last sample, and when (ms on the caller's clock) they were last seen to change.
    seen_bytes: AtomicU64,
    last_active_ms: AtomicU64,
}

impl SessionCtl {
    pub fn new(id: u64, role: Role, client: SocketAddr) -> Self {
        Self {
            id,
            role,
            client,
            started: Instant::now(),
            waker: Mutex::new(None),
            reason: AtomicU8::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            seen_bytes: AtomicU64::new(0),
            last_active_ms: AtomicU64::new(0),
        }
    }

    /// Samples the byte counters (no cost on the data path): if bytes moved since the last
    /// sample, the session was active at `now_ms`.
    pub fn observe(&self, now_ms: u64) {
        let b = self.bytes_in.load(Ordering::Relaxed) + self.bytes_out.load(Ordering::Relaxed);
        if self.seen_bytes.swap(b, Ordering::Relaxed) != b {
            self.last_active_ms.store(now_ms, Ordering::Relaxed);
        }
    }

    /// When it was last seen active by [`SessionCtl::observe`] (0: never).
    pub fn last_active_ms(&self) -> u64 {
        self.last_active_ms.load(Ordering::Relaxed)
    }

    /// Asks the session to close. The first reason given wins. The reason is set before the
    /// registered task is woken, so the wake sees it (see [`SessionCtl::register_waker`]).
    pub fn close(&self, reason: CloseReason) {
        let _ = self
            .reason
            .compare_exchange(0, reason as u8, Ordering::AcqRel, Ordering::Acquire);
        let waker = self.lock_waker().take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn lock_waker(&self) -> std::sync::MutexGuard<'_, Option<Waker>> {
        // Holds only a waker: a panic elsewhere cannot leave it inconsistent.
        self.waker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers the task that [`SessionCtl::close`] wakes (a no-op when it is registered
    /// already). Check [`SessionCtl::close_asked`] *after* this: a close that came before the
    /// registration found no task to wake.
    pub fn register_waker(&self, waker: &Waker) {
        let mut slot = self.lock_waker();
        if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *slot = Some(waker.clone());
        }
    }

    /// Completes once the session is asked to close: by [`SessionCtl::close`], or by `all` (the
    /// data plane's `sessions_token`, cancelled by `DataPlane::close_sessions`).
    pub async fn closed(&self, all: &CancellationToken) {
        let all = all.cancelled();
        tokio::pin!(all);
        std::future::poll_fn(|cx| {
            self.register_waker(cx.waker());
            if self.close_asked() || all.as_mut().poll(cx).is_ready() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Whether [`SessionCtl::close`] was called: an atomic load, where the token's
    /// `is_cancelled` takes its lock (the pump asks at every wake).
    pub fn close_asked(&self) -> bool {
        self.reason.load(Ordering::Acquire) != 0
    }

    /// The reason it was asked to close with, if any.
    pub fn close_reason(&self) -> Option<CloseReason> {
        CloseReason::from_u8(self.reason.load(Ordering::Acquire))
    }
}

/// The sessions of one master, both ports.
#[derive(Debug, Default)]
pub struct SessionBook {
    /// Leases per port (sessions connecting or live), indexed by `Role as usize`.
    leases: [AtomicU32; 2],
    /// Live sessions by id (ordered: the admin API pages by id).
    sessions: Mutex<BTreeMap<u64, Arc<SessionCtl>>>,
}

/// A session's place in a master's book: counted from [`SessionBook::try_lease`], listed from
/// [`Lease::register`], both undone when dropped (however the session ends).
#[derive(Debug)]
pub struct Lease {
    book: Arc<SessionBook>,
    role: Role,
    ctl: Option<Arc<SessionCtl>>,
    /// The queue whose first waiter gets the place when this lease gives it back.
    wake: Option<Arc<Queue>>,
}

impl Lease {
    /// When this lease gives its place back, wakes the first client waiting in `queue`.
    pub fn wake_on_release(&mut self, queue: Arc<Queue>) {
        self.wake = Some(queue);
    }

    /// Enters the connected session in the book; returns its control handle. `started`: when
    /// the session began (its client was accepted), for its age and its access-log duration.
    pub fn register(&mut self, id: u64, client: SocketAddr, started: Instant) -> Arc<SessionCtl> {
        let ctl = Arc::new(SessionCtl {
            started,
            ..SessionCtl::new(id, self.role, client)
        });
        if let Some(old) = self.ctl.replace(ctl.clone()) {
            self.book.lock().remove(&old.id);
        }
        self.book.lock().insert(id, ctl.clone());
        ctl
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// The session's control handle, once registered.
    pub fn ctl(&self) -> Option<&Arc<SessionCtl>> {
        self.ctl.as_ref()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(ctl) = self.ctl.take() {
            self.book.lock().remove(&ctl.id);
        }
        self.book.leases[self.role as usize].fetch_sub(1, Ordering::AcqRel);
        // After the place is free, so the woken client finds it.
        if let Some(q) = &self.wake {
            q.wake_one();
        }
    }
}

impl SessionBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<SessionCtl>>> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts/removes).
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a place on `role` if fewer than `max` are taken.
    pub fn try_lease(self: &Arc<Self>, role: Role, max: Option<u32>) -> Option<Lease> {
        let max = max.unwrap_or(u32::MAX);
        self.leases[role as usize]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v < max).then_some(v + 1)
            })
            .ok()?;
        Some(Lease {
            book: self.clone(),
            role,
            ctl: None,
            wake: None,
        })
    }

    /// Sessions on `role`, connecting or live.
    pub fn count(&self, role: Role) -> u32 {
        self.leases[role as usize].load(Ordering::Acquire)
    }

    /// Live (registered) sessions, both roles.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The live sessions of one role.
    pub fn of_role(&self, role: Role) -> Vec<Arc<SessionCtl>> {
        self.lock()
            .values()
            .filter(|s| s.role == role)
            .cloned()
            .collect()
    }

    /// Up to `limit` live sessions with an id above `after`, of `role` if given, by id.
    pub fn page(&self, role: Option<Role>, after: u64, limit: usize) -> Vec<Arc<SessionCtl>> {
        self.lock()
            .range(after.saturating_add(1)..)
            .map(|(_, s)| s)
            .filter(|s| role.is_none_or(|r| r == s.role))
            .take(limit)
            .cloned()
            .collect()
    }

    /// Closes the sessions of `role` at `rate` per second (0: all at once), in random order so no
    /// group of minions is always last. Returns when all have been asked to close.
    ///
    /// `keep_going` is asked before every batch: when it says no (the master came back UP, the
    /// operator re-enabled it), the remaining sessions are left alone. Returns how many were closed.
    pub async fn close_paced(
        &self,
        role: Role,
        rate: u32,
        reason: CloseReason,
        keep_going: impl Fn() -> bool,
    ) -> usize {
        let mut victims = self.of_role(role);
        victims.shuffle(&mut rand::rng());
        if !keep_going() {
            return 0;
        }
        if rate == 0 {
            victims.iter().for_each(|s| s.close(reason));
            return victims.len();
        }
        // Close in batches every 10 ms, so high rates do not need a timer per session.
        let tick = Duration::from_millis(10);
        let per_tick = (rate as usize).div_ceil(100).max(1);
        let mut interval =
            tokio::time::interval(tick.max(Duration::from_secs_f64(per_tick as f64 / rate as f64)));
        let mut closed = 0;
        for batch in victims.chunks(per_tick) {
            interval.tick().await;
            if !keep_going() {
                break;
            }
            batch.iter().for_each(|s| s.close(reason));
            closed += batch.len();
        }
        closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> SocketAddr {
        "10.0.0.1:5".parse().unwrap()
    }

    #[test]
    fn leases_are_capped_per_port_and_given_back_on_drop_registered_or_not() {
        let book = Arc::new(SessionBook::default());
        let a = book.try_lease(Role::Publish, Some(2)).unwrap();
        let mut b = book.try_lease(Role::Publish, Some(2)).unwrap();
        assert!(
            book.try_lease(Role::Publish, Some(2)).is_none(),
            "cap reached before any connect completes"
        );
        assert!(
            book.try_lease(Role::Request, Some(2)).is_some(),
            "the cap is per port"
        );
        drop(a); // connect failed
        assert_eq!(book.count(Role::Publish), 1);
        b.register(7, client(), Instant::now());
        assert_eq!(
            book.count(Role::Publish),
            1,
            "registering takes no second place"
        );
        assert_eq!(book.len(), 1);
        drop(b);
        assert_eq!(book.count(Role::Publish), 0);
        assert!(book.is_empty());
    }

    #[test]
    fn pages_follow_ids_and_filter_by_role() {
        let book = Arc::new(SessionBook::default());
        let mut leases = Vec::new();
        for id in 1..=5u64 {
            let role = if id == 3 {
                Role::Request
            } else {
                Role::Publish
            };
            let mut l = book.try_lease(role, None).unwrap();
            l.register(id, client(), Instant::now());
            leases.push(l);
        }
        let ids = |v: Vec<Arc<SessionCtl>>| v.iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(book.page(None, 0, 2)), [1, 2]);
        assert_eq!(ids(book.page(None, 2, 2)), [3, 4]);
        assert_eq!(ids(book.page(Some(Role::Publish), 2, 10)), [4, 5]);
        assert!(book.page(None, 5, 10).is_empty());
    }
}
