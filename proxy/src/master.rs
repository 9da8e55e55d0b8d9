//! A master at run time: its resolved addresses, health per port, administrative state, session
//! counters and registry. Shared (`Arc`) by the snapshot, the health checkers and the sessions.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use saltgate_config::{MasterConfig, Role};
use tokio_util::sync::CancellationToken;

use crate::registry::{Registration, SessionCtl, SessionRegistry};

/// The last check of one port, kept for logs and (later) the admin API.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug)]
pub struct Master {
    pub cfg: MasterConfig,
    /// Resolved publish and request addresses, indexed by `Role as usize`.
    pub addrs: [SocketAddr; 2],
    /// Whether each port's checks say UP.
    port_up: [AtomicBool; 2],
    /// Whether each port has completed its first check.
    port_checked: [AtomicBool; 2],
    /// Overall state: 0 not known yet, 1 UP (both ports), 2 DOWN (a port is down).
    up: AtomicU8,
    /// Serialises the aggregation of the two ports into `up`.
    flip: Mutex<()>,
    /// Live sessions per role.
    pub sessions: [AtomicU32; 2],
    pub registry: SessionRegistry,
    pub last_check: [Mutex<CheckReport>; 2],
    next_session: AtomicU64,
}

/// A change of a master's overall state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flip {
    Up,
    Down,
}

impl Master {
    pub fn new(cfg: MasterConfig, addrs: [SocketAddr; 2]) -> Self {
        // A master without checks is UP from the start, as in HAProxy.
        let unchecked = !cfg.check;
        Self {
            cfg,
            addrs,
            port_up: [AtomicBool::new(unchecked), AtomicBool::new(unchecked)],
            port_checked: [AtomicBool::new(unchecked), AtomicBool::new(unchecked)],
            up: AtomicU8::new(if unchecked { 1 } else { 0 }),
            flip: Mutex::new(()),
            sessions: [AtomicU32::new(0), AtomicU32::new(0)],
            registry: SessionRegistry::default(),
            last_check: Default::default(),
            next_session: AtomicU64::new(1),
        }
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    pub fn addr(&self, role: Role) -> SocketAddr {
        self.addrs[role as usize]
    }

    /// UP by its checks (both ports).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire) == 1
    }

    /// May take new sessions: UP and not administratively disabled.
    pub fn is_available(&self) -> bool {
        self.is_up() && !self.cfg.disabled
    }

    /// Both ports have completed at least one check.
    pub fn first_round_done(&self) -> bool {
        self.port_checked.iter().all(|c| c.load(Ordering::Acquire))
    }

    /// Below its per-port session cap on `role`.
    pub fn has_room(&self, role: Role) -> bool {
        self.cfg
            .maxconn
            .is_none_or(|m| self.sessions[role as usize].load(Ordering::Acquire) < m)
    }

    pub fn session_count(&self, role: Role) -> u32 {
        self.sessions[role as usize].load(Ordering::Acquire)
    }

    /// Records a port's state; returns the master's flip if its overall state changed.
    pub fn set_port(&self, role: Role, up: bool) -> Option<Flip> {
        let _g = self.flip.lock().unwrap_or_else(|p| p.into_inner());
        self.port_up[role as usize].store(up, Ordering::Release);
        self.port_checked[role as usize].store(true, Ordering::Release);
        let checked = |i: usize| self.port_checked[i].load(Ordering::Acquire);
        let up = |i: usize| self.port_up[i].load(Ordering::Acquire);
        let now = if (0..2).all(|i| checked(i) && up(i)) {
            1
        } else if (0..2).any(|i| checked(i) && !up(i)) {
            2
        } else {
            0
        };
        let was = self.up.swap(now, Ordering::AcqRel);
        match (was == now, now) {
            (false, 1) => Some(Flip::Up),
            (false, 2) => Some(Flip::Down),
            _ => None,
        }
    }

    pub fn port_is_up(&self, role: Role) -> bool {
        self.port_up[role as usize].load(Ordering::Acquire)
    }

    /// Registers a new session on this master; the returned guard unregisters it.
    pub fn register(
        self: &Arc<Self>,
        role: Role,
        client: SocketAddr,
        parent: &CancellationToken,
    ) -> Registration {
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let ctl = Arc::new(SessionCtl::new(id, role, client, parent));
        self.sessions[role as usize].fetch_add(1, Ordering::AcqRel);
        self.registry.insert(ctl.clone());
        Registration {
            master: self.clone(),
            ctl,
        }
    }
}
