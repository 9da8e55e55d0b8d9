//! A master at run time: its resolved addresses, health per port, administrative state (enabled,
//! draining, disabled), session counters and registry. Shared (`Arc`) by snapshots, health checkers
//! and sessions; kept across reloads while its name and addresses do not change, so its health and
//! sessions carry over.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use saltgate_config::{MasterConfig, Role};
use tokio_util::sync::CancellationToken;

use crate::registry::{Registration, SessionCtl, SessionRegistry};

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
}

impl MasterState {
    pub const ALL: [MasterState; 4] = [
        MasterState::Up,
        MasterState::Down,
        MasterState::Draining,
        MasterState::Disabled,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            MasterState::Up => "up",
            MasterState::Down => "down",
            MasterState::Draining => "draining",
            MasterState::Disabled => "disabled",
        }
    }
}

#[derive(Debug)]
pub struct Master {
    cfg: ArcSwap<MasterConfig>,
    /// Resolved publish and request addresses, indexed by `Role as usize`.
    pub addrs: [SocketAddr; 2],
    port_up: [AtomicBool; 2],
    port_checked: [AtomicBool; 2],
    /// Overall health: 1 UP (both ports), 2 DOWN (a port is down).
    up: AtomicU8,
    /// Serialises the aggregation of the two ports into `up`.
    flip: Mutex<()>,
    admin: AtomicU8,
    /// Bumped by every drain/disable/enable, so a stale drain deadline does nothing.
    admin_epoch: AtomicU64,
    /// Live sessions per role.
    pub sessions: [AtomicU32; 2],
    pub registry: SessionRegistry,
    pub last_check: [Mutex<CheckReport>; 2],
    /// Stops this master's health checkers (on removal or shutdown).
    pub checks_stop: CancellationToken,
}

/// A session slot reserved on a master before connecting; released on drop unless registered.
pub struct Slot {
    master: Arc<Master>,
    role: Role,
    armed: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.armed {
            self.master.sessions[self.role as usize].fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A change of a master's overall health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flip {
    Up,
    Down,
}

impl Master {
    pub fn new(
        cfg: MasterConfig,
        addrs: [SocketAddr; 2],
        checks_parent: &CancellationToken,
    ) -> Self {
        // A master without checks is never checked: its first round is done from the start.
        let unchecked = !cfg.check;
        let admin = if cfg.disabled {
            Admin::Disabled
        } else {
            Admin::Enabled
        };
        Self {
            cfg: ArcSwap::from_pointee(cfg),
            addrs,
            // As HAProxy: a master is UP until its checks say otherwise (`fall` failures).
            port_up: [AtomicBool::new(true), AtomicBool::new(true)],
            port_checked: [AtomicBool::new(unchecked), AtomicBool::new(unchecked)],
            up: AtomicU8::new(1),
            flip: Mutex::new(()),
            admin: AtomicU8::new(admin as u8),
            admin_epoch: AtomicU64::new(0),
            sessions: [AtomicU32::new(0), AtomicU32::new(0)],
            registry: SessionRegistry::default(),
            last_check: Default::default(),
            checks_stop: checks_parent.child_token(),
        }
    }

    /// The current configuration of this master (replaced by a reload that keeps the master).
    pub fn cfg(&self) -> Guard<Arc<MasterConfig>> {
        self.cfg.load()
    }

    /// Applies a reloaded configuration with the same name and addresses. A change of the
    /// `disabled` key applies; otherwise the operator's admin state stays.
    pub fn update_cfg(&self, new: MasterConfig) {
        let old = self.cfg.swap(Arc::new(new.clone()));
        if old.disabled != new.disabled {
            self.set_admin(if new.disabled {
                Admin::Disabled
            } else {
                Admin::Enabled
            });
        }
    }

    pub fn name(&self) -> String {
        self.cfg().name.clone()
    }

    pub fn addr(&self, role: Role) -> SocketAddr {
        self.addrs[role as usize]
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

    /// Sets the admin state; returns the new epoch (see [`Master::admin_epoch`]).
    pub fn set_admin(&self, a: Admin) -> u64 {
        self.admin.store(a as u8, Ordering::Release);
        self.admin_epoch.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub fn admin_epoch(&self) -> u64 {
        self.admin_epoch.load(Ordering::Acquire)
    }

    pub fn state(&self) -> MasterState {
        match (self.admin(), self.is_up()) {
            (Admin::Disabled, _) => MasterState::Disabled,
            (Admin::Draining, _) => MasterState::Draining,
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

    /// Below its per-port session cap on `role`.
    pub fn has_room(&self, role: Role) -> bool {
        self.cfg()
            .maxconn
            .is_none_or(|m| self.sessions[role as usize].load(Ordering::Acquire) < m)
    }

    pub fn session_count(&self, role: Role) -> u32 {
        self.sessions[role as usize].load(Ordering::Acquire)
    }

    /// Records a port's state; returns the master's flip if its overall health changed.
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

    /// Registers a new session on this master; the returned guard unregisters it.
    /// Takes a session slot on `role` if the master is below its `maxconn`, before connecting, so
    /// concurrent accepts cannot overshoot the cap and `leastconn` sees sessions being set up.
    pub fn try_reserve(self: &Arc<Self>, role: Role) -> Option<Slot> {
        let max = self.cfg().maxconn.unwrap_or(u32::MAX);
        let n = &self.sessions[role as usize];
        n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            (v < max).then_some(v + 1)
        })
        .ok()?;
        Some(Slot {
            master: self.clone(),
            role,
            armed: true,
        })
    }

    /// Registers a session in a reserved slot; the returned guard unregisters it.
    pub fn register(
        mut slot: Slot,
        id: u64,
        client: SocketAddr,
        parent: &CancellationToken,
    ) -> Registration {
        slot.armed = false;
        let (master, role) = (slot.master.clone(), slot.role);
        let ctl = Arc::new(SessionCtl::new(id, role, client, parent));
        master.registry.insert(ctl.clone());
        Registration { master, ctl }
    }

    /// Closes this master's sessions of both roles after `grace` (at `rates[role]` per second),
    /// as long as its admin state is still the one set at `epoch` (see [`Master::set_admin`]); an
    /// `enable` in between, even mid-way, stops it. Used by drain, disable and removal.
    pub fn close_sessions_after(
        self: &Arc<Self>,
        epoch: u64,
        grace: Duration,
        rates: [u32; 2],
        reason: crate::close::CloseReason,
    ) {
        let m = self.clone();
        tokio::spawn(async move {
            if !grace.is_zero() {
                tokio::time::sleep(grace).await;
            }
            if m.admin_epoch() != epoch {
                return;
            }
            let n = m.registry.len();
            if n > 0 {
                tracing::info!(master = %m.name(), sessions = n, reason = %reason, "closing the master's remaining sessions");
            }
            let same = || m.admin_epoch() == epoch;
            let (a, b) = (
                m.registry
                    .close_paced(Role::Publish, rates[0], reason, same),
                m.registry
                    .close_paced(Role::Request, rates[1], reason, same),
            );
            tokio::join!(a, b);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use saltgate_config::HealthSettings;

    fn master(maxconn: Option<u32>) -> Arc<Master> {
        let cfg = MasterConfig {
            name: "m".into(),
            host: "127.0.0.1".into(),
            publish_port: 1,
            request_port: 2,
            weight: 1,
            maxconn,
            backup: false,
            disabled: false,
            check: false,
            health: HealthSettings::default(),
        };
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        Arc::new(Master::new(cfg, [a, a], &CancellationToken::new()))
    }

    #[test]
    fn slots_are_reserved_under_maxconn_and_released_unless_registered() {
        let m = master(Some(2));
        let a = m.try_reserve(Role::Publish).unwrap();
        let b = m.try_reserve(Role::Publish).unwrap();
        assert!(
            m.try_reserve(Role::Publish).is_none(),
            "cap reached before any connect completes"
        );
        assert!(
            m.try_reserve(Role::Request).is_some(),
            "the cap is per port"
        );
        drop(a); // connect failed
        assert_eq!(m.session_count(Role::Publish), 1);
        let client: SocketAddr = "10.0.0.1:5".parse().unwrap();
        let reg = Master::register(b, 1, client, &CancellationToken::new());
        assert_eq!(
            m.session_count(Role::Publish),
            1,
            "registering keeps the reserved slot"
        );
        assert_eq!(m.registry.len(), 1);
        drop(reg);
        assert_eq!(m.session_count(Role::Publish), 0);
        assert!(m.registry.is_empty());
    }

    #[test]
    fn an_enable_stops_a_drain_set_before_it() {
        let m = master(None);
        let drain = m.set_admin(Admin::Draining);
        let enable = m.set_admin(Admin::Enabled);
        assert_ne!(drain, enable);
        assert_eq!(m.admin_epoch(), enable);
    }
}
