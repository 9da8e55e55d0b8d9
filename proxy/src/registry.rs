//! Every live session of a master, so they can be closed when the master is marked DOWN (paced,
//! with jitter, to avoid a reconnect storm on the surviving masters) or at shutdown.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use saltgate_config::Role;
use tokio_util::sync::CancellationToken;

use crate::close::CloseReason;

/// The handle a session listens on, and the reason it was asked to close with.
#[derive(Debug)]
pub struct SessionCtl {
    pub id: u64,
    pub role: Role,
    pub client: SocketAddr,
    pub started: Instant,
    /// Cancelled to ask the session to close; a child of the process-wide session token.
    pub cancel: CancellationToken,
    reason: AtomicU8,
    /// Bytes client → master and master → client, updated by the pump.
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

impl SessionCtl {
    pub fn new(id: u64, role: Role, client: SocketAddr, parent: &CancellationToken) -> Self {
        Self {
            id,
            role,
            client,
            started: Instant::now(),
            cancel: parent.child_token(),
            reason: AtomicU8::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
        }
    }

    /// Asks the session to close. The first reason given wins.
    pub fn close(&self, reason: CloseReason) {
        let _ = self
            .reason
            .compare_exchange(0, reason as u8, Ordering::AcqRel, Ordering::Acquire);
        self.cancel.cancel();
    }

    /// The reason it was asked to close with, if any.
    pub fn close_reason(&self) -> Option<CloseReason> {
        CloseReason::from_u8(self.reason.load(Ordering::Acquire))
    }
}

/// The live sessions of one master, both roles.
#[derive(Debug, Default)]
pub struct SessionRegistry {
    sessions: Mutex<HashMap<u64, Arc<SessionCtl>>>,
}

/// Removes the session from its registry when the session ends.
pub struct Registration {
    pub(crate) master: Arc<crate::master::Master>,
    pub ctl: Arc<SessionCtl>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.master.registry.remove(self.ctl.id);
        self.master.sessions[self.ctl.role as usize].fetch_sub(1, Ordering::AcqRel);
    }
}

impl SessionRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<SessionCtl>>> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts/removes).
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, ctl: Arc<SessionCtl>) {
        self.lock().insert(ctl.id, ctl);
    }

    pub fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

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
