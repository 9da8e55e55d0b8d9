//! The data-plane context: the little a session (or any [`crate::session::serve::Serve`] implementation)
//! needs, and nothing of the control plane. A session sees the current [`Snapshot`], the buffer
//! pool, the token that closes every session when the shutdown grace runs out, metric handles
//! resolved ahead of time, and the access-log sink. It cannot reload, bind, or act on masters.
//!
//! Like mini-redis's `Handler`: the control plane ([`crate::control`]) holds an `Arc` of this and
//! hands it to every accepted connection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use saltgate_config::Role;
use tokio_util::sync::CancellationToken;

use crate::data::buf::BufPool;
use crate::data::pump::Plane;
use crate::data::queue::Queue;
use crate::ops::accesslog::AccessSink;
use crate::ops::metrics::{ListenerHandles, Metrics};
use crate::select::snapshot::Snapshot;

impl Plane for DataPlane {
    fn pool(&self) -> &BufPool {
        &self.pool
    }

    fn sessions_token(&self) -> &CancellationToken {
        &self.sessions_token
    }

    fn sessions_closing(&self) -> &AtomicBool {
        &self.sessions_closing
    }
}

/// Buffers kept free in the pool (16 KiB each).
pub const POOL_FREE: usize = 1024;

pub struct DataPlane {
    /// What sessions run from; swapped once per reload by the control plane.
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    pub pool: BufPool,
    /// Parent of every session's close token; cancelled when the shutdown grace runs out, only
    /// through [`DataPlane::close_sessions`].
    pub sessions_token: CancellationToken,
    /// Set by [`DataPlane::close_sessions`] before it cancels `sessions_token`: the pump reads
    /// this flag instead of locking its token at every wake (see [`crate::data::pump::pump`], through [`Plane`]).
    pub sessions_closing: AtomicBool,
    /// Per listener, indexed by `Role as usize`.
    listeners: [ListenerHandles; 2],
    /// Each listener's queue of clients waiting for a master below its `maxconn`, indexed by
    /// `Role as usize` (kept across reloads, as the listeners' caps).
    queues: [Arc<Queue>; 2],
    /// Session ids, unique over the process (the admin API pages by them).
    next_session: AtomicU64,
    /// Where each closed session's access record goes.
    pub access: Arc<dyn AccessSink>,
    /// Which minion is where: fed by request sessions' taps and publish sessions' guards.
    pub presence: Arc<crate::presence::Presence>,
    /// Request-session continuity counters (`on_master_down: migrate`).
    pub replay: crate::continuity::ReplayMetrics,
    /// `listeners.request.auth_limit`: each master's `_auth` gate.
    pub auth_limits: Arc<crate::continuity::auth_limit::AuthLimits>,
}

impl DataPlane {
    /// Closes every session (the shutdown grace ran out): sets `sessions_closing`, then cancels
    /// `sessions_token` (the order the pump relies on).
    pub fn close_sessions(&self) {
        self.sessions_closing.store(true, Ordering::Release);
        self.sessions_token.cancel();
    }

    pub fn new(snapshot: Snapshot, metrics: &Metrics, access: Arc<dyn AccessSink>) -> Self {
        let presence = crate::presence::Presence::new(&snapshot.config.presence, &metrics.registry);
        Self {
            snapshot: Arc::new(ArcSwap::from_pointee(snapshot)),
            pool: BufPool::new(POOL_FREE),
            sessions_token: CancellationToken::new(),
            sessions_closing: AtomicBool::new(false),
            listeners: Role::ALL.map(|r| ListenerHandles::new(metrics, r)),
            queues: Role::ALL.map(|r| {
                Arc::new(Queue::new(
                    metrics.queue_current.with_label_values(&[r.as_str()]),
                ))
            }),
            next_session: AtomicU64::new(1),
            access,
            presence,
            replay: crate::continuity::ReplayMetrics::new(&metrics.registry),
            auth_limits: Arc::new(crate::continuity::auth_limit::AuthLimits::new(
                &metrics.registry,
            )),
        }
    }

    /// The snapshot in force now.
    pub fn load(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    pub fn listener(&self, role: Role) -> &ListenerHandles {
        &self.listeners[role as usize]
    }

    pub fn queue(&self, role: Role) -> &Arc<Queue> {
        &self.queues[role as usize]
    }

    /// Wakes every queued client: the masters that can take sessions may have changed (a flip,
    /// an admin action, a reload). Each runs the selection again.
    pub fn wake_queues(&self) {
        self.queues.iter().for_each(|q| q.wake_all());
    }

    /// A new session id.
    pub fn session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }
}
