//! Reload: [`Control::apply`] puts a configuration in force, at start and at every reload
//! (resolve masters, bind new listeners, swap the snapshot once, start and stop health checks,
//! drain removed masters, stop removed listeners, give each listener its [`Serve`]); reading the
//! configuration file off the runtime; the file watcher.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use saltgate_config::{Config, ConfigErrors, ListenerMode, Role};
use tokio::net::TcpListener;

use crate::admin::error::ApplyError;
use crate::control::state::{lock, AdminHandle, Control, ListenerHandle};
use crate::data::close::CloseReason;
use crate::data::listener::{self, Limit};
use crate::fanout::{HubHandles, PubHub};
use crate::select::check;
use crate::select::master::Admin;
use crate::select::snapshot::Snapshot;
use crate::session::l4::L4Session;
use crate::session::serve::Serve;

pub(crate) use super::readfile::{read_file, read_token};

pub use super::state::ConfigSource;

impl Control {
    /// Puts `config` (plus the masters discovery found, see [`super::discovery`]) in force.
    /// Nothing changes unless every step before the swap succeeds.
    pub(crate) async fn apply(
        self: &Arc<Self>,
        config: Config,
        first: bool,
    ) -> Result<u64, ApplyError> {
        // The token is read before the reload lock is taken: a read stuck on a hung filesystem
        // (up to its 10 s bound) must not hold up shutdown, which takes the lock first.
        let token = match &config.admin.token_file {
            None => None,
            Some(p) => Some(read_token(p).await?),
        };
        let _g = self.reload_lock.lock().await;
        if self.is_stopping() {
            return Err(ApplyError::Stopping);
        }
        if let Some((problem, fix)) = config.admin.exposure_refusal() {
            return Err(ApplyError::Exposed { problem, fix });
        }
        if config.admin.exposed_without_token() {
            tracing::warn!(bind = %config.admin.bind, "the admin API is reachable beyond loopback without a token (admin.allow_unauthenticated: true): anyone who reaches it can drain and disable masters; set admin.token_file");
        }
        if !first && config.global.threads != self.data.load().config.global.threads {
            tracing::warn!(
                from = ?self.data.load().config.global.threads,
                to = ?config.global.threads,
                "global.threads changed: it takes effect at the next restart (the worker pool is sized at start)"
            );
        }
        let file_config = config.clone();
        let (config, discovered) = self.with_discovered(&config);
        let old = self.data.load();
        let generation = old.generation + 1;
        let (snap, diff) = Snapshot::build_with(
            config,
            generation,
            Some(&old),
            &self.checks_stop,
            &self.metrics,
            self.lookup,
        )
        .await?;
        let cfg = &snap.config;
        refuse_fanout_without_cluster(&snap).await?;

        // Bind what is new before anything changes; a failure leaves the running config alone.
        let wanted: Vec<(Role, SocketAddr)> = Role::ALL
            .iter()
            .flat_map(|&r| cfg.listener(r).bind.iter().map(move |&a| (r, a)))
            .collect();
        let mut fresh = Vec::new();
        {
            let running = lock(&self.listeners);
            for &(role, addr) in &wanted {
                if running.iter().any(|h| h.serves(addr) && h.role == role) {
                    continue;
                }
                if running.iter().any(|h| h.serves(addr)) {
                    // Same address, other role: its socket is handed to the new role after the swap.
                    continue;
                }
                let l = cfg.listener(role);
                let user_timeout = cfg.global.tcp_user_timeout;
                let sock = listener::bind_sessions(
                    addr,
                    l.backlog,
                    l.reuse_port,
                    l.freebind,
                    user_timeout,
                )
                .map_err(|reason| {
                    if reason.kind() == std::io::ErrorKind::AddrNotAvailable {
                        ApplyError::NotLocal {
                            what: role.to_string(),
                            addr,
                        }
                    } else {
                        ApplyError::Bind {
                            what: role.to_string(),
                            addr,
                            reason,
                        }
                    }
                })?;
                fresh.push((role, addr, sock));
            }
        }
        let admin_sock = {
            let running = lock(&self.admin);
            let same = running.as_ref().is_some_and(|h| h.bind == cfg.admin.bind);
            if cfg.admin.enabled && !same {
                let sock = listener::bind(cfg.admin.bind, 128, false).map_err(|reason| {
                    ApplyError::Bind {
                        what: "admin".into(),
                        addr: cfg.admin.bind,
                        reason,
                    }
                })?;
                Some(sock)
            } else {
                None
            }
        };

        // Discovered masters are not presumed UP (as configured ones are): a peer's key is
        // written when it joins the cluster, maybe before it serves.
        for m in diff.added.iter().filter(|m| discovered.contains(&m.name())) {
            if m.cfg().check && !m.upstream.is_unresolved() {
                m.upstream.set_joining();
            }
        }
        // The swap: from here on new sessions see the new configuration.
        *lock(&self.file_config) = Some(file_config);
        let snap = Arc::new(snap);
        self.data.snapshot.store(snap.clone());
        self.token.store(Arc::new(token));
        self.metrics.generation.set(generation as i64);
        self.data.presence.configure(&snap.config.presence);
        self.metrics.events.in_force(generation, first);
        let cfg = &snap.config;

        for (m, new_cfg) in diff.kept {
            m.update_cfg(new_cfg);
        }
        for e in &snap.unresolved {
            tracing::warn!(master = %e.master, host = %e.host, reason = %e.reason, "master's host does not resolve: it starts DOWN (state `unresolved`) and resolution is retried");
        }
        if !snap.unresolved.is_empty() {
            tokio::spawn(retry_unresolved(self.clone(), generation));
        }
        for m in &diff.added {
            if m.cfg().check && !m.upstream.is_unresolved() {
                for role in Role::ALL {
                    tokio::spawn(check::run_port_checks(
                        m.clone(),
                        role,
                        self.prober.clone(),
                        self.events.clone(),
                        self.metrics.clone(),
                    ));
                }
            }
        }
        for m in &diff.removed {
            tracing::info!(master = %m.name(), sessions = m.book.len(), drain_ms = cfg.global.drain_timeout.as_millis() as u64, "master removed by reload: draining its sessions");
            m.checks_stop.cancel();
            let epoch = m.set_admin(Admin::Draining);
            m.close_sessions_after(
                epoch,
                cfg.global.drain_timeout,
                [cfg.publish.close_rate, cfg.request.close_rate],
                CloseReason::Drained,
            );
        }
        if first {
            // Before accepting: the first client must find the masters that are UP. (The sockets
            // are bound already; early connections wait in the backlog.)
            self.first_round(&snap).await;
        }
        if self.global_limit.max() != listener::cap(cfg.global.maxconn) {
            self.global_limit.resize(listener::cap(cfg.global.maxconn));
        }
        self.sync_listeners(cfg, &wanted, fresh);
        self.sync_admin(cfg, admin_sock);
        // Masters added, a higher maxconn: queued clients try again under the new configuration.
        self.data.wake_queues();

        tracing::info!(
            generation,
            masters = snap.masters.len(),
            added = diff.added.len(),
            removed = diff.removed.len(),
            "configuration in force"
        );
        Ok(generation)
    }

    /// Waits (bounded) for every master's first check, so the first client finds masters UP.
    async fn first_round(&self, snap: &Snapshot) {
        let limit = snap
            .masters
            .iter()
            .map(|m| m.cfg().health.timeout)
            .max()
            .unwrap_or_default()
            + Duration::from_secs(1);
        let _ = tokio::time::timeout(limit, async {
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            while !snap.masters.iter().all(|m| m.first_round_done()) {
                tick.tick().await;
            }
        })
        .await;
        for m in &snap.masters {
            for role in Role::ALL {
                let c = m.last_check(role);
                if m.cfg().check && !c.ok && m.is_up() {
                    tracing::warn!(master = %m.name(), port = %role, result = %c.detail, fall = m.cfg().health.fall, "first check failed; the master takes sessions until `fall` checks in a row fail (as HAProxy)");
                }
            }
        }
    }

    fn sync_listeners(
        self: &Arc<Self>,
        cfg: &Config,
        wanted: &[(Role, SocketAddr)],
        fresh: Vec<(Role, SocketAddr, TcpListener)>,
    ) {
        let mut running = lock(&self.listeners);
        let mut handed_over = Vec::new();
        // Stop what is no longer wanted (sessions it accepted carry on). An address that changed
        // role keeps its socket: a new accept loop takes it over, nothing is rebound.
        running.retain(|h| {
            // A listener whose role stays but whose kind of `Serve` changes is handed over too.
            let same_serve = || h.serve.kind() == for_listener(h.role, cfg, &self.fanout).kind();
            if wanted.iter().any(|&(r, a)| r == h.role && h.serves(a)) && same_serve() {
                return true;
            }
            h.stop.cancel();
            match wanted.iter().find(|(_, a)| h.serves(*a)) {
                Some(&(role, _)) => {
                    tracing::info!(from = %h.role, to = %role, addr = %h.local, "listener changes role (or kind of serve): a new accept loop takes its socket");
                    // Fresh sockets got the session options at bind; this one had the old ones.
                    listener::tune_listener(&h.sock, cfg.global.tcp_user_timeout);
                    handed_over.push((role, h.bind, h.sock.clone()));
                }
                None => tracing::info!(listener = %h.role, addr = %h.local, "listener removed by reload"),
            }
            false
        });
        for h in running.iter() {
            // Accepted sockets inherit these from the listener (see listener::bind_sessions).
            listener::tune_listener(&h.sock, cfg.global.tcp_user_timeout);
            let max = cfg.listener(h.role).maxconn;
            if h.limit.max() != listener::cap(max) {
                h.limit.resize(listener::cap(max));
            }
        }
        let socks = fresh
            .into_iter()
            .map(|(role, bind, sock)| (role, bind, Arc::new(sock)))
            .chain(handed_over);
        for (role, bind, sock) in socks {
            let local = sock.local_addr().unwrap_or(bind);
            let stop = self.accept_stop.child_token();
            let limit = Arc::new(Limit::new(listener::cap(cfg.listener(role).maxconn)));
            let serve: Arc<dyn Serve> = for_listener(role, cfg, &self.fanout);
            serve.prepare(&self.data);
            tracing::info!(listener = %role, addr = %local, serve = serve.kind(), "listening");
            let (data, tracker, to_serve) =
                (self.data.clone(), self.tracker.clone(), serve.clone());
            let errors = self
                .metrics
                .accept_errors
                .with_label_values(&[role.as_str()]);
            tokio::spawn(listener::accept_loop(
                sock.clone(),
                role,
                limit.clone(),
                self.global_limit.clone(),
                errors,
                stop.clone(),
                move |stream, peer, permits| {
                    // nodelay, keepalive and TCP_USER_TIMEOUT came from the listening socket.
                    // The permits are held for the session's whole life.
                    to_serve.spawn(&tracker, data.clone(), stream, peer, permits);
                },
            ));
            running.push(ListenerHandle {
                role,
                bind,
                local,
                sock,
                stop,
                limit,
                serve,
            });
        }
    }

    fn sync_admin(self: &Arc<Self>, cfg: &Config, sock: Option<TcpListener>) {
        let mut running = lock(&self.admin);
        let keep = cfg.admin.enabled && running.as_ref().is_some_and(|h| h.bind == cfg.admin.bind);
        if !keep {
            if let Some(h) = running.take() {
                h.stop.cancel();
            }
        }
        if let Some(sock) = sock {
            let local = sock.local_addr().unwrap_or(cfg.admin.bind);
            let stop = self.admin_stop.child_token();
            tracing::info!(addr = %local, "admin API listening");
            tokio::spawn(crate::admin::api::serve(sock, self.clone(), stop.clone()));
            *running = Some(AdminHandle {
                bind: cfg.admin.bind,
                local,
                stop,
            });
        }
    }

    /// Reloads from the configuration source; logs and counts the result.
    pub(crate) async fn reload_from_source(
        self: &Arc<Self>,
        trigger: &str,
    ) -> Result<u64, ApplyError> {
        let mut seen = self.source_seen.lock().await;
        if self.is_stopping() {
            // No RELOADING/READY to systemd after STOPPING.
            tracing::warn!(trigger, "reload ignored: saltgate is shutting down");
            return Err(ApplyError::Stopping);
        }
        crate::ops::notify::sd_notify_reloading();
        let result = match &self.source {
            None => Err(ApplyError::NoSource),
            Some(src) => match read_source_off_runtime(src.clone(), &mut seen).await {
                Err(e) => Err(ApplyError::Invalid(e)),
                Ok(mut l) => {
                    for w in &l.warnings {
                        tracing::warn!("{w}");
                    }
                    if let Some(o) = &self.override_config {
                        o(&mut l.config);
                    }
                    self.apply(l.config, false).await
                }
            },
        };
        crate::ops::notify::sd_notify("READY=1");
        self.metrics.events.reload(
            trigger,
            result.as_ref().map(|g| *g).map_err(|e| e.to_string()),
        );
        match &result {
            Ok(g) => {
                self.metrics.reloads.with_label_values(&["ok"]).inc();
                tracing::info!(trigger, generation = g, "reload done");
            }
            Err(e) => {
                self.metrics.reloads.with_label_values(&[e.kind()]).inc();
                tracing::error!(trigger, error = %e, "reload refused; the running configuration stays");
            }
        }
        result
    }
}

/// The longest wait between two lookups of an unresolved master's host.
const RESOLVE_RETRY_MAX: Duration = Duration::from_secs(60);

/// While the configuration of `generation` is in force, looks up the hosts of its unresolved
/// masters again, first after their health `interval`, then doubling up to [`RESOLVE_RETRY_MAX`].
/// Once one resolves, the configuration in force is applied again (as a reload: masters that did
/// not change keep their health and sessions); that apply starts its own retry if some remain.
async fn retry_unresolved(control: Arc<Control>, generation: u64) {
    let snap = control.data.load();
    let pending: Vec<saltgate_config::MasterConfig> = snap
        .unresolved
        .iter()
        .filter_map(|e| snap.config.masters.iter().find(|m| m.name == e.master))
        .cloned()
        .collect();
    let Some(mut wait) = pending.iter().map(|m| m.health.interval).min() else {
        return;
    };
    drop(snap);
    wait = wait.max(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = control.accept_stop.cancelled() => return,
        }
        if control.is_stopping() || control.data.load().generation != generation {
            return; // a newer configuration took over (with its own retry if needed)
        }
        let now = crate::select::snapshot::resolve_all(
            &pending,
            crate::select::snapshot::RESOLVE_TIMEOUT,
            control.lookup,
        )
        .await;
        for e in now.iter().filter_map(|r| r.as_ref().err()) {
            control
                .metrics
                .resolve_failures
                .with_label_values(&[e.master.as_str()])
                .inc();
            tracing::debug!(master = %e.master, host = %e.host, reason = %e.reason, retry_in_ms = (wait * 2).min(RESOLVE_RETRY_MAX).as_millis() as u64, "master's host still does not resolve");
        }
        if now.iter().any(Result::is_ok) {
            let Some(config) = lock(&control.file_config).clone() else {
                return;
            };
            if control.data.load().generation != generation {
                return;
            }
            match reapply(&control, config).await {
                Ok(g) => tracing::info!(
                    generation = g,
                    "a master's host resolves now: configuration applied again"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "a master's host resolves now, but applying the configuration again failed")
                }
            }
            return;
        }
        wait = (wait * 2).min(RESOLVE_RETRY_MAX);
    }
}

/// [`Control::apply`] behind a named `Send` future (it is called from a task that `apply` spawns).
fn reapply(
    control: &Arc<Control>,
    config: Config,
) -> crate::session::serve::BoxFuture<Result<u64, ApplyError>> {
    let control = control.clone();
    Box::pin(async move { control.apply(config, false).await })
}

async fn read_source_off_runtime(
    src: ConfigSource,
    seen: &mut Option<Vec<u8>>,
) -> Result<saltgate_config::Loaded, ConfigErrors> {
    let read = read_file(src.path.clone()).await;
    read_source(&src, read, seen)
}

/// Validates the source file's bytes, remembering them.
fn read_source(
    src: &ConfigSource,
    read: std::io::Result<Vec<u8>>,
    seen: &mut Option<Vec<u8>>,
) -> Result<saltgate_config::Loaded, ConfigErrors> {
    let bytes = read.map_err(|e| {
        ConfigErrors::one(saltgate_config::ConfigError::new(
            saltgate_config::Position::new(Some(&src.path), 0, 0),
            "",
            format!("cannot read the file: {e}"),
            "check the path and its permissions, and that it is a regular file",
        ))
    })?;
    let loaded = saltgate_config::parse_bytes(&bytes, Some(&src.path), src.format);
    *seen = Some(bytes);
    loaded
}

/// What `check-config` finds beyond the file itself: the checks `run` makes before binding.
#[derive(Debug, Default)]
pub struct Preflight {
    /// `run` would refuse to start.
    pub errors: Vec<String>,
    /// `run` would start, degraded (such as a master that does not resolve).
    pub warnings: Vec<String>,
}

/// Runs the checks `run` makes before binding: the admin exposure, the token file, the
/// resolution of every master's host (a master that does not resolve is a warning: it starts DOWN
/// as `unresolved`; none resolving is an error).
pub async fn preflight(config: &Config) -> Preflight {
    let mut out = Preflight::default();
    if let Some((problem, fix)) = config.admin.exposure_refusal() {
        out.errors.push(format!("admin: {problem}; {fix}"));
    } else if config.admin.exposed_without_token() {
        out.warnings.push(format!(
            "admin: the admin API on {} is reachable beyond loopback without a token (allow_unauthenticated: true); set admin.token_file",
            config.admin.bind
        ));
    }
    if config.admin.enabled {
        if let Some(p) = &config.admin.token_file {
            if let Err(e) = read_token(p).await {
                out.errors.push(e.to_string());
            }
        }
    }
    let resolved = crate::select::snapshot::resolve_all(
        &config.masters,
        crate::select::snapshot::RESOLVE_TIMEOUT,
        crate::select::snapshot::system_lookup,
    )
    .await;
    let failed: Vec<_> = resolved.into_iter().filter_map(Result::err).collect();
    if !config.masters.is_empty() && failed.len() == config.masters.len() {
        out.errors
            .push(crate::select::snapshot::NoMasterResolves(failed).to_string());
    } else {
        out.warnings.extend(failed.iter().map(|e| {
            format!("{e} (saltgate starts with this master DOWN, state `unresolved`, and retries)")
        }));
    }
    out
}

/// Reloads when the configuration file's content changes (polled: robust to editors that replace
/// the file, and to files on network filesystems where inotify is unreliable).
pub(crate) async fn watch_file(control: Arc<Control>, path: PathBuf, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = control.accept_stop.cancelled() => return,
        }
        let Ok(now) = read_file(path.clone()).await else {
            continue;
        };
        let changed = match control.source_seen.try_lock() {
            Ok(seen) => seen.as_deref() != Some(now.as_slice()),
            Err(_) => false, // a reload is running; look again next tick
        };
        if changed {
            let _ = control.reload_from_source("file change").await;
        }
    }
}

/// `mode: fanout` relays every master's publishes to every minion, so the masters must be one Salt
/// cluster: refused when two of them sign with different keys (see `pubhub::cluster_check`); the
/// masters that could not be asked are logged.
async fn refuse_fanout_without_cluster(
    snap: &crate::select::snapshot::Snapshot,
) -> Result<(), ApplyError> {
    let cfg = &snap.config;
    if cfg.listener(Role::Publish).mode != ListenerMode::Fanout {
        return Ok(());
    }
    let masters: Vec<(String, SocketAddr)> = snap
        .masters
        .iter()
        .filter(|m| !m.upstream.is_unresolved())
        .map(|m| (m.name(), m.addrs[Role::Request as usize]))
        .collect();
    let notes = crate::fanout::cluster_check::check(
        &masters,
        cfg.health.handshake_timeout,
        cfg.health.timeout,
    )
    .await
    .map_err(ApplyError::NotOneCluster)?;
    for n in notes {
        tracing::warn!("listeners.publish.mode: fanout: {n}; the cluster check compares only the masters that answer");
    }
    Ok(())
}

/// The [`Serve`] for a listener of `role` under `config` (built here, by the control plane): the fan-out hub for a publish listener
/// in `mode: fanout`, the L4 session otherwise. Cheap: the hub starts its upstreams with its
/// first session (a reload calls this to compare kinds).
pub(crate) fn for_listener(role: Role, config: &Config, fanout: &HubHandles) -> Arc<dyn Serve> {
    match (role, config.listener(role).mode) {
        (Role::Publish, ListenerMode::Fanout) => {
            Arc::new(PubHub::new(Default::default(), fanout.clone()))
        }
        _ => Arc::new(L4Session { role }),
    }
}
