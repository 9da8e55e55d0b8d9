//! A master at run time: its configuration and resolved addresses, its upstream state (health per
//! port, admin state: [`Upstream`]) and its session book ([`SessionBook`]). Shared (`Arc`) by
//! snapshots, health checkers and sessions; kept across reloads while its name and addresses do not
//! change, so its health and sessions carry over.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use saltgate_config::{MasterConfig, Role};
use tokio_util::sync::CancellationToken;

use crate::data::close::CloseReason;
use crate::data::registry::{Lease, SessionBook};
use crate::select::transport_probe::ProbeTransport;
pub use crate::select::upstream::{Admin, CheckReport, Flip, MasterState, Upstream};

#[derive(Debug)]
pub struct Master {
    cfg: ArcSwap<MasterConfig>,
    /// Resolved publish and request addresses, indexed by `Role as usize`.
    pub addrs: [SocketAddr; 2],
    /// Health and admin state: where new sessions may go.
    pub upstream: Upstream,
    /// The sessions this master holds.
    pub book: Arc<SessionBook>,
    /// Stops this master's health checkers (on removal or shutdown).
    pub checks_stop: CancellationToken,
    /// Its name, shared: every publish session's presence entry points at it (a reload keeps a
    /// master only under the same name).
    label: Arc<str>,
    /// The transport its checks speak (`transport:`, `ssl:`), set by each snapshot.
    transport: ArcSwap<ProbeTransport>,
}

impl Master {
    pub fn new(
        cfg: MasterConfig,
        addrs: [SocketAddr; 2],
        checks_parent: &CancellationToken,
    ) -> Self {
        let admin = if cfg.disabled {
            Admin::Disabled
        } else {
            Admin::Enabled
        };
        // A master without checks is never checked: its first round is done from the start.
        let upstream = Upstream::new(admin, !cfg.check);
        Self {
            label: Arc::from(cfg.name.as_str()),
            cfg: ArcSwap::from_pointee(cfg),
            addrs,
            upstream,
            book: Arc::default(),
            checks_stop: checks_parent.child_token(),
            transport: ArcSwap::from_pointee(ProbeTransport::default()),
        }
    }

    /// The transport its checks speak now.
    pub fn probe_transport(&self) -> Arc<ProbeTransport> {
        self.transport.load_full()
    }

    /// Sets the transport of its checks (each snapshot, at load and reload).
    pub fn set_probe_transport(&self, t: Arc<ProbeTransport>) {
        self.transport.store(t);
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

    /// Its name, without a copy.
    pub fn label(&self) -> &Arc<str> {
        &self.label
    }

    pub fn addr(&self, role: Role) -> SocketAddr {
        self.addrs[role as usize]
    }

    /// UP by its checks (both ports).
    pub fn is_up(&self) -> bool {
        self.upstream.is_up()
    }

    pub fn admin(&self) -> Admin {
        self.upstream.admin()
    }

    /// Sets the admin state; returns the new epoch (see [`Upstream::set_admin`]).
    pub fn set_admin(&self, a: Admin) -> u64 {
        self.upstream.set_admin(a)
    }

    pub fn admin_epoch(&self) -> u64 {
        self.upstream.admin_epoch()
    }

    pub fn state(&self) -> MasterState {
        self.upstream.state()
    }

    /// May take new sessions: UP and enabled.
    pub fn is_available(&self) -> bool {
        self.upstream.is_available()
    }

    /// Both ports have completed at least one check.
    pub fn first_round_done(&self) -> bool {
        self.upstream.first_round_done()
    }

    /// Below its per-port session cap on `role`.
    pub fn has_room(&self, role: Role) -> bool {
        self.cfg().maxconn.is_none_or(|m| self.book.count(role) < m)
    }

    /// Sessions on `role`, connecting or live.
    pub fn session_count(&self, role: Role) -> u32 {
        self.book.count(role)
    }

    /// Records a port's state; returns the master's flip if its overall health changed.
    pub fn set_port(&self, role: Role, up: bool) -> Option<Flip> {
        self.upstream.set_port(role, up)
    }

    pub fn port_is_up(&self, role: Role) -> bool {
        self.upstream.port_is_up(role)
    }

    pub fn last_check(&self, role: Role) -> CheckReport {
        self.upstream.last_check(role)
    }

    /// Takes a session place on `role` if the master is below its `maxconn`, before connecting.
    pub fn try_reserve(&self, role: Role) -> Option<Lease> {
        self.book.try_lease(role, self.cfg().maxconn)
    }

    /// Closes this master's sessions while it stays DOWN, at `rates[role]` per second on the roles
    /// given (`None`: that listener keeps its sessions). Stops when the master comes back UP, and
    /// when a newer call takes over: one paced close per master at a time, so a flapping master
    /// does not multiply the close rate (the epoch pattern drain uses).
    pub fn close_while_down(self: &Arc<Self>, rates: [Option<u32>; 2], reason: CloseReason) {
        let epoch = self.upstream.next_down_epoch();
        for role in Role::ALL {
            let Some(rate) = rates[role as usize] else {
                continue;
            };
            let m = self.clone();
            tokio::spawn(async move {
                let current = || m.upstream.down_epoch() == epoch && !m.is_up();
                m.book.close_paced(role, rate, reason, current).await;
            });
        }
    }

    /// Closes this master's sessions of both roles after `grace` (at `rates[role]` per second),
    /// as long as its admin state is still the one set at `epoch` (see [`Master::set_admin`]); an
    /// `enable` in between, even mid-way, stops it. Used by drain, disable and removal.
    pub fn close_sessions_after(
        self: &Arc<Self>,
        epoch: u64,
        grace: Duration,
        rates: [u32; 2],
        reason: CloseReason,
    ) {
        let m = self.clone();
        tokio::spawn(async move {
            if !grace.is_zero() {
                tokio::time::sleep(grace).await;
            }
            if m.admin_epoch() != epoch {
                return;
            }
            let n = m.book.len();
            if n > 0 {
                tracing::info!(target: "saltgate_proxy::master", master = %m.name(), sessions = n, reason = %reason, "closing the master's remaining sessions");
            }
            let same = || m.admin_epoch() == epoch;
            let (a, b) = (
                m.book.close_paced(Role::Publish, rates[0], reason, same),
                m.book.close_paced(Role::Request, rates[1], reason, same),
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

    #[tokio::test(start_paused = true)]
    async fn a_flapping_master_has_one_paced_close_at_a_time() {
        let m = master(None);
        let client: SocketAddr = "10.0.0.1:5".parse().unwrap();
        let leases: Vec<_> = (0..100)
            .map(|id| {
                let mut l = m.try_reserve(Role::Publish).unwrap();
                l.register(id, client, std::time::Instant::now());
                l
            })
            .collect();
        // DOWN, UP, DOWN, UP, ... faster than the pace: every DOWN flip starts a paced close.
        for _ in 0..4 {
            m.set_port(Role::Publish, true);
            assert_eq!(m.set_port(Role::Publish, false), Some(Flip::Down));
            m.close_while_down([Some(10), None], CloseReason::MasterDown);
        }
        tokio::time::sleep(Duration::from_millis(1050)).await;
        let closed = leases
            .iter()
            .filter(|l| l.ctl().is_some_and(|c| c.close_asked()))
            .count();
        assert!(
            (10..=12).contains(&closed),
            "10 per second for about a second, whatever the flaps: {closed} closed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_paced_close_stops_when_the_master_comes_back_up() {
        let m = master(None);
        let client: SocketAddr = "10.0.0.1:5".parse().unwrap();
        let leases: Vec<_> = (0..40)
            .map(|id| {
                let mut l = m.try_reserve(Role::Publish).unwrap();
                l.register(id, client, std::time::Instant::now());
                l
            })
            .collect();
        let closed = || {
            leases
                .iter()
                .filter(|l| l.ctl().is_some_and(|c| c.close_asked()))
                .count()
        };
        m.set_port(Role::Publish, false);
        m.close_while_down([Some(10), None], CloseReason::MasterDown);
        tokio::time::sleep(Duration::from_millis(250)).await;
        let before = closed();
        assert!((2..=4).contains(&before), "{before}");
        m.set_port(Role::Publish, true);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(closed(), before, "no more sessions closed once it is UP");
    }

    #[test]
    fn a_masters_maxconn_caps_its_leases_per_port() {
        let m = master(Some(2));
        let a = m.try_reserve(Role::Publish).unwrap();
        let _b = m.try_reserve(Role::Publish).unwrap();
        assert!(m.try_reserve(Role::Publish).is_none());
        assert!(!m.has_room(Role::Publish));
        assert!(m.has_room(Role::Request));
        drop(a);
        assert_eq!(m.session_count(Role::Publish), 1);
        assert!(m.has_room(Role::Publish));
    }
}
