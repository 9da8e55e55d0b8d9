//! Starting the proxy ([`start`]), the admin actions the admin API calls ([`AdminOps`] for
//! [`Control`]), the checkers' events and the two-phase shutdown of a [`Running`] proxy.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use saltgate_config::{Config, OnMasterDown, Role};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::state::{lock, Control, Options, Running, StartError};
use crate::admin::error::{AdminError, ApplyError};
use crate::admin::ops::AdminOps;
use crate::data::close::CloseReason;
use crate::data::listener::{self, Limit};
use crate::ops::metrics::Metrics;
use crate::select::check::MasterEvent;
use crate::select::master::{Admin, Flip, Master, MasterState};
use crate::select::snapshot::Snapshot;
use crate::session::context::DataPlane;
use crate::session::serve::BoxFuture;

/// Starts the proxy; it stops when `shutdown` completes.
pub async fn start(
    config: Config,
    opts: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Running, StartError> {
    let metrics = Metrics::new();
    let checks_stop = CancellationToken::new();
    let (events, events_rx) = mpsc::unbounded_channel();
    let empty = Snapshot::build(
        Config {
            masters: Vec::new(),
            ..config.clone()
        },
        0,
        None,
        &checks_stop,
        &metrics,
    )
    .await?
    .0;
    let seen = match &opts.source {
        Some(s) => super::reload::read_file(s.path.clone()).await.ok(),
        None => None,
    };
    let control = Arc::new(Control {
        data: Arc::new(DataPlane::new(empty, &metrics, opts.access_log)),
        fanout: crate::fanout::HubHandles::new(&metrics.registry),
        tracker: TaskTracker::new(),
        metrics: metrics.clone(),
        token: ArcSwap::from_pointee(None),
        global_limit: Arc::new(Limit::new(listener::cap(config.global.maxconn))),
        checks_stop: checks_stop.clone(),
        events,
        prober: opts.prober,
        lookup: opts.lookup,
        listeners: Mutex::new(Vec::new()),
        admin: Mutex::new(None),
        reload_lock: tokio::sync::Mutex::new(()),
        source_seen: tokio::sync::Mutex::new(seen),
        source: opts.source,
        override_config: opts.override_config,
        accept_stop: CancellationToken::new(),
        admin_stop: CancellationToken::new(),
        stopping: AtomicBool::new(false),
        rebalance_epoch: Arc::new(AtomicU64::new(0)),
        file_config: Mutex::new(None),
        peer_files: Mutex::new(Vec::new()),
        discovery_warned: Mutex::default(),
        discovery_problem: Mutex::new(None),
    });
    let snapshot = Arc::downgrade(&control.data.snapshot);
    metrics.watch_masters(Box::new(move || {
        snapshot.upgrade().map(|s| {
            let s = s.load();
            crate::ops::metrics::InForce {
                masters: s.masters.clone(),
                global_maxconn: s.config.global.maxconn,
                listener_maxconn: Role::ALL
                    .iter()
                    .map(|r| (*r, s.config.listener(*r).maxconn))
                    .collect(),
            }
        })
    }));
    let snapshot = Arc::downgrade(&control.data.snapshot);
    crate::presence::watch(
        &metrics.registry,
        &control.data.presence,
        Box::new(move || {
            snapshot
                .upgrade()
                .map(|s| s.load().masters.iter().map(|m| m.name()).collect())
                .unwrap_or_default()
        }),
    );
    tokio::spawn(handle_events(control.clone(), events_rx));

    control.discover_at_start(&config).await;
    if let Err(e) = control.apply(config, true).await {
        control.checks_stop.cancel();
        control.accept_stop.cancel();
        control.admin_stop.cancel();
        return Err(e);
    }
    // From the configuration now in force: masters added by later reloads are rebalanced onto.
    tokio::spawn(watch_added_masters(control.clone(), control.data.load()));
    tokio::spawn(super::discovery::watch_peers(control.clone()));
    if let (Some(every), Some(src)) = (opts.watch, control.source.clone()) {
        tokio::spawn(super::reload::watch_file(control.clone(), src.path, every));
    }

    let done = CancellationToken::new();
    tokio::spawn(control.clone().shutdown_after(shutdown, done.clone()));
    Ok(Running { control, done })
}

impl Control {
    /// Waits for `signal`, then shuts down in two phases: stop accepting, then drain live sessions
    /// up to `shutdown_grace` and close the rest. Cancels `done` at the end.
    async fn shutdown_after(
        self: Arc<Self>,
        signal: impl Future<Output = ()> + Send + 'static,
        done: CancellationToken,
    ) {
        signal.await;
        crate::ops::notify::sd_notify("STOPPING=1");
        {
            // Under the reload lock: a reload in flight finishes first, and every later one sees
            // `stopping` and binds nothing (its accept loops would exit at once, leaving clients
            // in a backlog nobody serves).
            let _reloads = self.reload_lock.lock().await;
            self.stopping.store(true, Ordering::Release);
            self.accept_stop.cancel();
            // Close the listening sockets now (the accept loops let go of theirs as they stop),
            // so new connections are refused.
            lock(&self.listeners).clear();
        }
        let grace = self.data.load().config.global.shutdown_grace;
        self.tracker.close();
        tracing::info!(target: "saltgate_proxy::control", live_sessions = self.tracker.len(),
            grace_ms = grace.as_millis() as u64,
            "shutting down: stopped accepting, draining sessions"
        );
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(target: "saltgate_proxy::control", live_sessions = self.tracker.len(),
                "shutdown grace over; closing the remaining sessions"
            );
            self.data.close_sessions();
            self.tracker.wait().await;
        }
        self.checks_stop.cancel();
        self.admin_stop.cancel();
        tracing::info!(target: "saltgate_proxy::control", "shutdown complete");
        done.cancel();
    }

    pub(crate) fn find(&self, name: &str) -> Result<Arc<Master>, AdminError> {
        self.data
            .load()
            .master(name)
            .cloned()
            .ok_or_else(|| AdminError::NoSuchMaster(name.to_string()))
    }

    /// Drain: no new sessions; live ones close at `drain_timeout` (reason `drained`).
    pub(crate) fn drain(&self, name: &str) -> Result<MasterState, AdminError> {
        let m = self.find(name)?;
        let cfg = &self.data.load().config;
        let epoch = m.set_admin(Admin::Draining);
        tracing::warn!(target: "saltgate_proxy::control", master = %name, sessions = m.book.len(), drain_ms = cfg.global.drain_timeout.as_millis() as u64, "master draining (admin)");
        m.close_sessions_after(
            epoch,
            cfg.global.drain_timeout,
            [cfg.publish.close_rate, cfg.request.close_rate],
            CloseReason::Drained,
        );
        self.data.wake_queues();
        Ok(m.state())
    }

    /// Disable: as drain with no grace (reason `disabled`).
    pub(crate) fn disable(&self, name: &str) -> Result<MasterState, AdminError> {
        let m = self.find(name)?;
        let cfg = &self.data.load().config;
        let epoch = m.set_admin(Admin::Disabled);
        tracing::warn!(target: "saltgate_proxy::control", master = %name, sessions = m.book.len(), "master disabled (admin)");
        m.close_sessions_after(
            epoch,
            Duration::ZERO,
            [cfg.publish.close_rate, cfg.request.close_rate],
            CloseReason::Disabled,
        );
        self.data.wake_queues();
        Ok(m.state())
    }

    /// Enable: takes new sessions again when UP; a pending drain deadline is cancelled.
    pub(crate) fn enable(&self, name: &str) -> Result<MasterState, AdminError> {
        let m = self.find(name)?;
        m.set_admin(Admin::Enabled);
        tracing::info!(target: "saltgate_proxy::control", master = %name, "master enabled (admin)");
        self.data.wake_queues();
        Ok(m.state())
    }

    pub(crate) fn local_addrs(&self, role: Role) -> Vec<SocketAddr> {
        lock(&self.listeners)
            .iter()
            .filter(|h| h.role == role)
            .map(|h| h.local)
            .collect()
    }

    /// Shutdown has started.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    pub(crate) fn admin_addr(&self) -> Option<SocketAddr> {
        lock(&self.admin).as_ref().map(|h| h.local)
    }
}

impl AdminOps for Control {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.data.load()
    }

    fn auth_limits(&self) -> Vec<crate::continuity::auth_limit::GateView> {
        self.data.auth_limits.views()
    }

    fn token(&self) -> Arc<Option<String>> {
        self.token.load_full()
    }

    fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    fn presence(&self) -> Arc<crate::presence::Presence> {
        self.data.presence.clone()
    }

    fn fanout(&self) -> Option<Arc<crate::fanout::hub::Hub>> {
        self.fanout.current()
    }

    fn events(&self) -> &crate::ops::events::EventLog {
        &self.metrics.events
    }

    fn stopping(&self) -> bool {
        self.is_stopping()
    }

    fn listening(&self) -> bool {
        Role::ALL.iter().all(|&r| !self.local_addrs(r).is_empty())
    }

    fn listening_on(&self, role: Role) -> bool {
        !self.local_addrs(role).is_empty()
    }

    fn admin_cut(&self, reason: &'static str) {
        self.metrics.admin_cuts.with_label_values(&[reason]).inc();
    }

    fn queued(&self, role: Role) -> usize {
        self.data.queue(role).len()
    }

    fn drain(&self, name: &str) -> Result<MasterState, AdminError> {
        Control::drain(self, name)
    }

    fn disable(&self, name: &str) -> Result<MasterState, AdminError> {
        Control::disable(self, name)
    }

    fn enable(&self, name: &str) -> Result<MasterState, AdminError> {
        Control::enable(self, name)
    }

    fn reload(self: Arc<Self>) -> BoxFuture<Result<u64, ApplyError>> {
        Box::pin(async move { self.reload_from_source("admin API").await })
    }
}

impl Running {
    /// The addresses the listeners of `role` are bound to (port 0 resolved).
    pub fn local_addrs(&self, role: Role) -> Vec<SocketAddr> {
        self.control.local_addrs(role)
    }

    /// Where the admin API listens, if enabled.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.control.admin_addr()
    }

    pub fn masters(&self) -> Vec<Arc<Master>> {
        self.control.data.load().masters.clone()
    }

    pub fn master(&self, name: &str) -> Option<Arc<Master>> {
        self.control.data.load().master(name).cloned()
    }

    pub fn generation(&self) -> u64 {
        self.control.data.load().generation
    }

    /// Live sessions over all listeners.
    pub fn live_sessions(&self) -> usize {
        self.control.tracker.len()
    }

    /// Pump buffers held by sessions right now (sessions hold none while idle).
    pub fn buffers_in_use(&self) -> u64 {
        self.control.data.pool.in_use()
    }

    /// Puts `config` in force (as a reload would). Counted in `saltgate_reloads_total`.
    pub async fn reload(&self, config: Config) -> Result<u64, ApplyError> {
        let r = self.control.apply(config, false).await;
        self.control.metrics.events.reload(
            "library call",
            r.as_ref().map(|g| *g).map_err(|e| e.to_string()),
        );
        self.control
            .metrics
            .reloads
            .with_label_values(&[r.as_ref().map(|_| "ok").unwrap_or_else(|e| e.kind())])
            .inc();
        r
    }

    /// Reloads from the configuration file, as SIGHUP does.
    pub async fn reload_from_source(&self, trigger: &str) -> Result<u64, ApplyError> {
        self.control.reload_from_source(trigger).await
    }

    pub fn drain(&self, name: &str) -> Result<MasterState, AdminError> {
        self.control.drain(name)
    }

    pub fn disable(&self, name: &str) -> Result<MasterState, AdminError> {
        self.control.disable(name)
    }

    pub fn enable(&self, name: &str) -> Result<MasterState, AdminError> {
        self.control.enable(name)
    }

    /// Waits until the proxy has shut down.
    pub async fn wait(&self) {
        self.done.cancelled().await;
    }
}

impl Control {
    /// Starts a rebalancing run for `trigger` (a master that came UP or was added), superseding
    /// the one in progress, if the publish listener rebalances.
    fn start_rebalance(&self, trigger: String) {
        let epoch = self.rebalance_epoch.fetch_add(1, Ordering::AcqRel) + 1;
        let l = &self.data.load().config.publish;
        if let Some(mode) = crate::select::rebalance::mode_for(l) {
            tokio::spawn(crate::select::rebalance::run(
                self.data.snapshot.clone(),
                self.rebalance_epoch.clone(),
                epoch,
                self.accept_stop.clone(),
                trigger,
                mode,
            ));
        }
    }

    /// The publish listener fails back (`balance: first`): every master event and reload
    /// restarts the run that waits for the failback holds.
    fn fails_back(&self) -> bool {
        crate::select::rebalance::mode_for(&self.data.load().config.publish)
            == Some(crate::select::rebalance::Mode::Failback)
    }
}

/// Masters added by a reload start UP (as HAProxy) without a flip: this notices them (the
/// snapshot generation, checked twice a second) and rebalances onto them.
async fn watch_added_masters(control: Arc<Control>, mut seen: Arc<Snapshot>) {
    let mut every = tokio::time::interval(Duration::from_millis(500));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = control.accept_stop.cancelled() => return,
        }
        let now = control.data.load();
        if now.generation == seen.generation {
            continue;
        }
        let added: Vec<String> = now
            .masters
            .iter()
            .filter(|m| !seen.masters.iter().any(|o| Arc::ptr_eq(o, m)))
            .map(|m| m.name())
            .collect();
        if !added.is_empty() {
            control.start_rebalance(added.join(","));
        } else if control.fails_back() {
            control.start_rebalance("reload".into());
        }
        seen = now;
    }
}

/// Acts on master flips: closes a DOWN master's sessions on listeners configured to; rebalances
/// publish sessions onto a master that came UP. Every flip ends the rebalancing run in progress.
async fn handle_events(control: Arc<Control>, mut rx: mpsc::UnboundedReceiver<MasterEvent>) {
    while let Some(ev) = rx.recv().await {
        // Queued clients try again: a master back UP has room; with one DOWN, the others may be
        // all that is left (or nothing, and they are refused rather than left waiting).
        control.data.wake_queues();
        if ev.flip == Flip::Up {
            control.start_rebalance(ev.master.name());
            continue;
        }
        // DOWN: the run in progress stops (failback: a new one keeps waiting for the holds).
        if control.fails_back() {
            control.start_rebalance(ev.master.name());
        } else {
            control.rebalance_epoch.fetch_add(1, Ordering::AcqRel);
        }
        let snap = control.data.load();
        let rates = Role::ALL.map(|role| {
            let l = snap.config.listener(role);
            // `migrate` moves them at the same pace.
            (l.on_master_down != OnMasterDown::Keep).then_some(l.close_rate)
        });
        for role in Role::ALL {
            let n = ev.master.session_count(role);
            if let (Some(rate), true) = (rates[role as usize], n > 0) {
                tracing::warn!(target: "saltgate_proxy::control", master = %ev.master.name(), listener = %role, sessions = n, rate_per_s = rate, "closing the sessions of a master marked DOWN");
            }
        }
        ev.master.close_while_down(rates, CloseReason::MasterDown);
    }
}
