//! A master's upstream state: what its health checks say (per port and overall) and what an
//! operator asked for (enabled, draining, disabled). Apart from its session book
//! ([`crate::data::registry::SessionBook`]): health and admin state decide where new sessions go; the
//! book holds the sessions that are there.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use saltgate_config::Role;

/// The last check of one port, for the logs and the admin API.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CheckReport {
    pub ok: bool,
    pub detail: String,
    /// Milliseconds the check took.
    pub duration_ms: u64,
}

/// What an operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Admin {
    Enabled = 0,
    /// No new sessions; live ones end by themselves or at the drain deadline.
    Draining = 1,
    /// No new sessions; live ones were closed.
    Disabled = 2,
}

/// A master's state as operators see it (admin API, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MasterState {
    Up,
    Down,
    Draining,
    Disabled,
    /// Its host does not resolve (DOWN, never selected; resolution is retried).
    Unresolved,
    /// Discovered, and not UP yet: takes no session until its checks pass.
    Joining,
}

impl MasterState {
    pub const ALL: [MasterState; 6] = [
        MasterState::Up,
        MasterState::Down,
        MasterState::Draining,
        MasterState::Disabled,
        MasterState::Unresolved,
        MasterState::Joining,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            MasterState::Up => "up",
            MasterState::Down => "down",
            MasterState::Draining => "draining",
            MasterState::Disabled => "disabled",
            MasterState::Unresolved => "unresolved",
            MasterState::Joining => "joining",
        }
    }
}

/// A change of a master's overall health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flip {
    Up,
    Down,
}

/// Health per port and overall, admin state, and the epochs that let a newer decision stop an
/// older background task (a drain deadline, a paced close).
#[derive(Debug)]
pub struct Upstream {
    port_up: [AtomicBool; 2],
    port_checked: [AtomicBool; 2],
    /// Overall health: 1 UP (both ports), 2 DOWN (a port is down).
    up: AtomicU8,
    /// Serialises the aggregation of the two ports into `up`.
    flip: Mutex<()>,
    admin: AtomicU8,
    /// Bumped by every drain/disable/enable, so a stale drain deadline does nothing.
    admin_epoch: AtomicU64,
    /// Bumped by every DOWN flip, so only the newest paced close of a DOWN master runs.
    down_epoch: AtomicU64,
    last_check: [Mutex<CheckReport>; 2],
    /// Its host did not resolve: DOWN for good (this master object is replaced once it resolves).
    unresolved: AtomicBool,
    /// Discovered and not UP yet (see [`Upstream::set_joining`]).
    joining: AtomicBool,
    /// When it last came back UP (`None`: UP from the start, or DOWN): `balance: first` holds it
    /// behind the others for the listener's `failback` delay from then.
    up_since: Mutex<Option<tokio::time::Instant>>,
    /// The failback hold was given up early: it took sessions because nothing ahead of it could.
    hold_released: AtomicBool,
    /// Passive signals from sessions (a connect refused or timed out, the master reset or closed a
    /// session): the port's next check comes `fastinter` after the last one began, not `interval`.
    nudge: [tokio::sync::Notify; 2],
    /// A nudge not yet served by a check that began after it (a burst wakes the checker once).
    nudge_pending: [AtomicBool; 2],
    /// When a request session last saw this master complete a reply (see
    /// [`Upstream::saw_answer`]): nanoseconds after `born`, plus one (0: never). An atomic, not a
    /// lock: every reply the relay follows stores it.
    last_answer: AtomicU64,
    born: tokio::time::Instant,
}

impl Upstream {
    /// `checked`: whether the ports count as checked from the start (a master without checks).
    pub fn new(admin: Admin, checked: bool) -> Self {
        Self {
            // As HAProxy: a master is UP until its checks say otherwise (`fall` failures).
            port_up: [AtomicBool::new(true), AtomicBool::new(true)],
            port_checked: [AtomicBool::new(checked), AtomicBool::new(checked)],
            up: AtomicU8::new(1),
            flip: Mutex::new(()),
            admin: AtomicU8::new(admin as u8),
            admin_epoch: AtomicU64::new(0),
            down_epoch: AtomicU64::new(0),
            last_check: Default::default(),
            unresolved: AtomicBool::new(false),
            joining: AtomicBool::new(false),
            up_since: Mutex::new(None),
            hold_released: AtomicBool::new(false),
            nudge: [tokio::sync::Notify::new(), tokio::sync::Notify::new()],
            nudge_pending: [AtomicBool::new(false), AtomicBool::new(false)],
            last_answer: AtomicU64::new(0),
            born: tokio::time::Instant::now(),
        }
    }

    /// A request session saw this master complete a reply to a minion (the continuity relay,
    /// which runs with `on_master_down: migrate` or `auth_limit`, follows each request): its
    /// workers answer, so a health ping that waits behind their work is a busy master's, not a
    /// hung one's (see [`crate::select::check`]).
    pub fn saw_answer(&self) {
        let at = self.born.elapsed().as_nanos().min(u64::MAX as u128 - 1) as u64 + 1;
        self.last_answer.fetch_max(at, Ordering::Relaxed);
    }

    /// Whether a reply was seen at or after `t`.
    pub fn answered_since(&self, t: tokio::time::Instant) -> bool {
        match self.last_answer.load(Ordering::Relaxed) {
            0 => false,
            at => u128::from(at - 1) >= t.saturating_duration_since(self.born).as_nanos(),
        }
    }

    /// A discovered master: DOWN (state `joining`) until its checks pass, instead of presumed UP
    /// as a configured one is. Call before it can be selected.
    pub fn set_joining(&self) {
        self.joining.store(true, Ordering::Release);
        let _g = self.flip.lock().unwrap_or_else(|p| p.into_inner());
        for p in &self.port_up {
            p.store(false, Ordering::Release);
        }
        self.up.store(2, Ordering::Release);
    }

    /// When it last came back UP, if it went DOWN (or joined) before; `None` while DOWN.
    pub fn up_since(&self) -> Option<tokio::time::Instant> {
        *self.up_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the failback hold was given up (see [`crate::select::failback`]).
    pub fn hold_released(&self) -> bool {
        self.hold_released.load(Ordering::Acquire)
    }

    pub fn release_hold(&self) {
        self.hold_released.store(true, Ordering::Release);
    }

    /// Marks the master's host unresolved: both ports DOWN and checked (no check runs), `reason`
    /// as the last check of both.
    pub fn set_unresolved(&self, reason: &str) {
        self.unresolved.store(true, Ordering::Release);
        for role in Role::ALL {
            self.set_port(role, false);
            self.set_last_check(
                role,
                CheckReport {
                    ok: false,
                    detail: format!("unresolved: {reason}"),
                    duration_ms: 0,
                },
            );
        }
    }

    pub fn is_unresolved(&self) -> bool {
        self.unresolved.load(Ordering::Acquire)
    }

    /// UP by its checks (both ports).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire) == 1
    }

    pub fn admin(&self) -> Admin {
        match self.admin.load(Ordering::Acquire) {
            1 => Admin::Draining,
            2 => Admin::Disabled,
            _ => Admin::Enabled,
        }
    }

    /// Sets the admin state; returns the new admin epoch.
    pub fn set_admin(&self, a: Admin) -> u64 {
        self.admin.store(a as u8, Ordering::Release);
        self.admin_epoch.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub fn admin_epoch(&self) -> u64 {
        self.admin_epoch.load(Ordering::Acquire)
    }

    /// Starts a new DOWN epoch (a paced close of an older one stops); returns it.
    pub fn next_down_epoch(&self) -> u64 {
        self.down_epoch.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub fn down_epoch(&self) -> u64 {
        self.down_epoch.load(Ordering::Acquire)
    }

    pub fn state(&self) -> MasterState {
        match (self.admin(), self.is_up()) {
            (Admin::Disabled, _) => MasterState::Disabled,
            (Admin::Draining, _) => MasterState::Draining,
            _ if self.is_unresolved() => MasterState::Unresolved,
            (Admin::Enabled, false) if self.joining.load(Ordering::Acquire) => MasterState::Joining,
            (Admin::Enabled, true) => MasterState::Up,
            (Admin::Enabled, false) => MasterState::Down,
        }
    }

    /// May take new sessions: UP and enabled.
    pub fn is_available(&self) -> bool {
        self.is_up() && self.admin() == Admin::Enabled
    }

    /// Both ports have completed at least one check.
    pub fn first_round_done(&self) -> bool {
        self.port_checked.iter().all(|c| c.load(Ordering::Acquire))
    }

    /// Records a port's state; returns the flip if the overall health changed.
    pub fn set_port(&self, role: Role, up: bool) -> Option<Flip> {
        let _g = self.flip.lock().unwrap_or_else(|p| p.into_inner());
        self.port_up[role as usize].store(up, Ordering::Release);
        self.port_checked[role as usize].store(true, Ordering::Release);
        let now = if self.port_up.iter().all(|p| p.load(Ordering::Acquire)) {
            1
        } else {
            2
        };
        let was = self.up.swap(now, Ordering::AcqRel);
        if was != now {
            let mut since = self.up_since.lock().unwrap_or_else(|p| p.into_inner());
            *since = (now == 1).then(tokio::time::Instant::now);
            self.hold_released.store(false, Ordering::Release);
            if now == 1 {
                self.joining.store(false, Ordering::Release);
            }
        }
        match (was == now, now) {
            (false, 1) => Some(Flip::Up),
            (false, 2) => Some(Flip::Down),
            _ => None,
        }
    }

    /// Records that a check of `role` completed (whatever its result).
    pub fn mark_checked(&self, role: Role) {
        self.port_checked[role as usize].store(true, Ordering::Release);
    }

    pub fn port_is_up(&self, role: Role) -> bool {
        self.port_up[role as usize].load(Ordering::Acquire)
    }

    pub fn last_check(&self, role: Role) -> CheckReport {
        self.last_check[role as usize]
            .lock()
            .map(|g| g.clone())
            .unwrap_or_default()
    }

    /// A session saw a sign of trouble on this port: check it soon. A burst of signals before the
    /// next check begins costs one early check.
    pub fn nudge_check(&self, role: Role) {
        if !self.nudge_pending[role as usize].swap(true, Ordering::AcqRel) {
            self.nudge[role as usize].notify_one();
        }
    }

    /// A check of `role` begins: it serves every nudge made so far.
    pub fn check_begins(&self, role: Role) {
        self.nudge_pending[role as usize].store(false, Ordering::Release);
    }

    /// Resolves at the next [`Upstream::nudge_check`] of `role` (or at once for one made meanwhile).
    pub fn nudged(&self, role: Role) -> tokio::sync::futures::Notified<'_> {
        self.nudge[role as usize].notified()
    }

    pub fn set_last_check(&self, role: Role, report: CheckReport) {
        if let Ok(mut last) = self.last_check[role as usize].lock() {
            *last = report;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_enable_stops_a_drain_set_before_it() {
        let u = Upstream::new(Admin::Enabled, true);
        let drain = u.set_admin(Admin::Draining);
        let enable = u.set_admin(Admin::Enabled);
        assert_ne!(drain, enable);
        assert_eq!(u.admin_epoch(), enable);
    }

    #[test]
    fn a_master_is_down_while_either_port_is_down() {
        let u = Upstream::new(Admin::Enabled, false);
        assert!(u.is_up() && !u.first_round_done());
        assert_eq!(u.set_port(Role::Publish, false), Some(Flip::Down));
        assert_eq!(u.set_port(Role::Request, true), None);
        assert_eq!(u.set_port(Role::Publish, true), Some(Flip::Up));
        assert!(u.first_round_done());
    }
}
