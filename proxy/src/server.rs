//! Running the proxy: one [`Shared`] state; [`apply`](Shared::apply) takes a configuration in force,
//! at start and at every reload (resolve masters, bind new listeners, swap the snapshot once, start
//! and stop health checks, drain removed masters, stop removed listeners). Also the admin actions
//! (drain, disable, enable) and the two-phase shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use saltgate_config::{Config, ConfigErrors, Format, OnMasterDown, Role};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::check::{self, MasterEvent, Prober, SaltProbes};
use crate::close::CloseReason;
use crate::listener::{self, Limit};
use crate::master::{Admin, Flip, Master, MasterState};
use crate::metrics::Metrics;
use crate::pump::BufPool;
use crate::snapshot::{ResolveError, Snapshot};

/// Where a reload reads the configuration from.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub path: PathBuf,
    pub format: Format,
}

/// Why a configuration could not be put in force. The running one stays.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("invalid configuration:\n{0}")]
    Invalid(ConfigErrors),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("cannot listen on {addr} ({what}): {source} (fix: free the port, or change the bind address)")]
    Bind {
        what: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("admin.token_file {path}: {reason} (fix: put the bearer token in that file, readable by saltgate)")]
    Token { path: PathBuf, reason: String },
    #[error("no configuration file to reload from (saltgate runs the embedded default)")]
    NoSource,
}

impl ApplyError {
    /// The `result` label of `saltgate_reloads_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            ApplyError::Invalid(_) | ApplyError::Token { .. } => "invalid",
            _ => "error",
        }
    }
}

/// Why an admin action was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("no master named {0:?}")]
    NoSuchMaster(String),
}

/// A running accept loop.
struct ListenerHandle {
    role: Role,
    bind: SocketAddr,
    local: SocketAddr,
    /// Shared with the accept loop, so a role change can hand it to a new loop.
    sock: Arc<TcpListener>,
    stop: CancellationToken,
    limit: Arc<Limit>,
}

impl ListenerHandle {
    /// Whether this listener serves `addr`: as configured, or as bound (port 0 resolved).
    fn serves(&self, addr: SocketAddr) -> bool {
        self.bind == addr || self.local == addr
    }
}

/// The running admin HTTP server.
struct AdminHandle {
    bind: SocketAddr,
    local: SocketAddr,
    stop: CancellationToken,
}

/// State every session, task and admin request shares.
pub(crate) struct Shared {
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    pub pool: BufPool,
    /// Parent of every session's close token; cancelled when the shutdown grace runs out.
    pub sessions_token: CancellationToken,
    pub tracker: TaskTracker,
    pub metrics: Arc<Metrics>,
    /// The admin bearer token, if configured.
    pub token: ArcSwap<Option<String>>,
    global_limit: Arc<Limit>,
    checks_stop: CancellationToken,
    events: mpsc::UnboundedSender<MasterEvent>,
    prober: Arc<dyn Prober>,
    listeners: Mutex<Vec<ListenerHandle>>,
    admin: Mutex<Option<AdminHandle>>,
    reload_lock: tokio::sync::Mutex<()>,
    /// Serialises reloads from the file (so systemd sees RELOADING/READY pairs) and holds the
    /// content last read, so the watcher does not reload what a SIGHUP already did.
    source_seen: tokio::sync::Mutex<Option<Vec<u8>>>,
    source: Option<ConfigSource>,
    override_config: Option<ConfigOverride>,
    accept_stop: CancellationToken,
}

/// Why the proxy could not start.
pub type StartError = ApplyError;

/// How the proxy runs; tests substitute their own prober.
pub struct Options {
    pub prober: Arc<dyn Prober>,
    /// Where reloads (SIGHUP, API, file watch) read the configuration from.
    pub source: Option<ConfigSource>,
    /// Poll the source file this often and reload when its content changes.
    pub watch: Option<Duration>,
    /// Applied to every configuration read from the source (command-line overrides).
    pub override_config: Option<ConfigOverride>,
}

/// A change applied to each reloaded configuration (e.g. `--admin-bind`).
pub type ConfigOverride = Arc<dyn Fn(&mut Config) + Send + Sync>;

impl Default for Options {
    fn default() -> Self {
        Self {
            prober: Arc::new(SaltProbes),
            source: None,
            watch: None,
            override_config: None,
        }
    }
}

/// A running proxy.
pub struct Running {
    pub(crate) shared: Arc<Shared>,
    /// Cancelled when shutdown is complete.
    done: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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
    )
    .await?
    .0;
    let shared = Arc::new(Shared {
        snapshot: Arc::new(ArcSwap::from_pointee(empty)),
        pool: BufPool::new(1024),
        sessions_token: CancellationToken::new(),
        tracker: TaskTracker::new(),
        metrics: metrics.clone(),
        token: ArcSwap::from_pointee(None),
        global_limit: Arc::new(Limit::new(config.global.maxconn)),
        checks_stop: checks_stop.clone(),
        events,
        prober: opts.prober,
        listeners: Mutex::new(Vec::new()),
        admin: Mutex::new(None),
        reload_lock: tokio::sync::Mutex::new(()),
        source_seen: tokio::sync::Mutex::new(
            opts.source
                .as_ref()
                .and_then(|s| std::fs::read(&s.path).ok()),
        ),
        source: opts.source,
        override_config: opts.override_config,
        accept_stop: CancellationToken::new(),
    });
    metrics.watch_snapshot(Arc::downgrade(&shared.snapshot));
    tokio::spawn(handle_events(shared.clone(), events_rx));

    if let Err(e) = shared.apply(config, true).await {
        shared.checks_stop.cancel();
        shared.accept_stop.cancel();
        return Err(e);
    }
    if let (Some(every), Some(src)) = (opts.watch, shared.source.clone()) {
        tokio::spawn(watch_file(shared.clone(), src.path, every));
    }

    let s = shared.clone();
    let done = CancellationToken::new();
    let finished = done.clone();
    tokio::spawn(async move {
        shutdown.await;
        crate::notify::sd_notify("STOPPING=1");
        let grace = s.snapshot.load().config.global.shutdown_grace;
        s.accept_stop.cancel();
        // Close the listening sockets now (the accept loops let go of theirs as they stop), so
        // new connections are refused rather than left in a backlog nobody serves.
        lock(&s.listeners).clear();
        s.tracker.close();
        tracing::info!(
            live_sessions = s.tracker.len(),
            grace_ms = grace.as_millis() as u64,
            "shutting down: stopped accepting, draining sessions"
        );
        if tokio::time::timeout(grace, s.tracker.wait()).await.is_err() {
            tracing::warn!(
                live_sessions = s.tracker.len(),
                "shutdown grace over; closing the remaining sessions"
            );
            s.sessions_token.cancel();
            s.tracker.wait().await;
        }
        s.checks_stop.cancel();
        tracing::info!("shutdown complete");
        finished.cancel();
    });
    Ok(Running { shared, done })
}

impl Shared {
    /// Puts `config` in force. Nothing changes unless every step before the swap succeeds.
    pub(crate) async fn apply(
        self: &Arc<Self>,
        config: Config,
        first: bool,
    ) -> Result<u64, ApplyError> {
        let _g = self.reload_lock.lock().await;
        let old = self.snapshot.load_full();
        let generation = old.generation + 1;
        let token = match &config.admin.token_file {
            None => None,
            Some(p) => Some(read_token(p)?),
        };
        let (snap, diff) =
            Snapshot::build(config, generation, Some(&old), &self.checks_stop).await?;
        let cfg = &snap.config;

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
                let sock = listener::bind(addr, cfg.listener(role).backlog).map_err(|source| {
                    ApplyError::Bind {
                        what: role.to_string(),
                        addr,
                        source,
                    }
                })?;
                fresh.push((role, addr, sock));
            }
        }
        let admin_sock = {
            let running = lock(&self.admin);
            let same = running.as_ref().is_some_and(|h| h.bind == cfg.admin.bind);
            if cfg.admin.enabled && !same {
                let sock =
                    listener::bind(cfg.admin.bind, 128).map_err(|source| ApplyError::Bind {
                        what: "admin".into(),
                        addr: cfg.admin.bind,
                        source,
                    })?;
                Some(sock)
            } else {
                None
            }
        };

        // The swap: from here on new sessions see the new configuration.
        let snap = Arc::new(snap);
        self.snapshot.store(snap.clone());
        self.token.store(Arc::new(token));
        self.metrics.generation.set(generation as i64);
        self.metrics.events.in_force(generation, first);
        let cfg = &snap.config;

        for (m, new_cfg) in diff.kept {
            m.update_cfg(new_cfg);
        }
        for m in &diff.added {
            if m.cfg().check {
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
            tracing::info!(master = %m.name(), sessions = m.registry.len(), drain_ms = cfg.global.drain_timeout.as_millis() as u64, "master removed by reload: draining its sessions");
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
        if self.global_limit.max() != cfg.global.maxconn {
            self.global_limit.resize(cfg.global.maxconn);
        }
        self.sync_listeners(cfg, &wanted, fresh);
        self.sync_admin(cfg, admin_sock);

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
            if wanted.iter().any(|&(r, a)| r == h.role && h.serves(a)) {
                return true;
            }
            h.stop.cancel();
            match wanted.iter().find(|(_, a)| h.serves(*a)) {
                Some(&(role, _)) => {
                    tracing::info!(from = %h.role, to = %role, addr = %h.local, "listener changes role");
                    handed_over.push((role, h.bind, h.sock.clone()));
                }
                None => tracing::info!(listener = %h.role, addr = %h.local, "listener removed by reload"),
            }
            false
        });
        for h in running.iter() {
            let max = cfg.listener(h.role).maxconn;
            if h.limit.max() != max {
                h.limit.resize(max);
            }
        }
        let socks = fresh
            .into_iter()
            .map(|(role, bind, sock)| (role, bind, Arc::new(sock)))
            .chain(handed_over);
        for (role, bind, sock) in socks {
            let local = sock.local_addr().unwrap_or(bind);
            let stop = self.accept_stop.child_token();
            let limit = Arc::new(Limit::new(cfg.listener(role).maxconn));
            tracing::info!(listener = %role, addr = %local, "listening");
            let shared = self.clone();
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
                    let s = shared.clone();
                    shared
                        .tracker
                        .spawn(crate::session::handle(s, role, stream, peer, permits));
                },
            ));
            running.push(ListenerHandle {
                role,
                bind,
                local,
                sock,
                stop,
                limit,
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
            let stop = self.accept_stop.child_token();
            tracing::info!(addr = %local, "admin API listening");
            tokio::spawn(crate::admin::serve(sock, self.clone(), stop.clone()));
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
        crate::notify::sd_notify_reloading();
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
        crate::notify::sd_notify("READY=1");
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

    pub(crate) fn find(&self, name: &str) -> Result<Arc<Master>, AdminError> {
        self.snapshot
            .load()
            .master(name)
            .cloned()
            .ok_or_else(|| AdminError::NoSuchMaster(name.to_string()))
    }

    /// Drain: no new sessions; live ones close at `drain_timeout` (reason `drained`).
    pub(crate) fn drain(&self, name: &str) -> Result<MasterState, AdminError> {
        let m = self.find(name)?;
        let cfg = &self.snapshot.load().config;
        let epoch = m.set_admin(Admin::Draining);
        tracing::warn!(master = %name, sessions = m.registry.len(), drain_ms = cfg.global.drain_timeout.as_millis() as u64, "master draining (admin)");
        m.close_sessions_after(
            epoch,
            cfg.global.drain_timeout,
            [cfg.publish.close_rate, cfg.request.close_rate],
            CloseReason::Drained,
        );
        Ok(m.state())
    }

    /// Disable: as drain with no grace (reason `disabled`).
    pub(crate) fn disable(&self, name: &str) -> Result<MasterState, AdminError> {
        let m = self.find(name)?;
        let cfg = &self.snapshot.load().config;
        let epoch = m.set_admin(Admin::Disabled);
        tracing::warn!(master = %name, sessions = m.registry.len(), "master disabled (admin)");
        m.close_sessions_after(
            epoch,
            Duration::ZERO,
            [cfg.publish.close_rate, cfg.request.close_rate],
            CloseReason::Disabled,
        );
        Ok(m.state())
    }

    /// Enable: takes new sessions again when UP; a pending drain deadline is cancelled.
    pub(crate) fn enable(&self, name: &str) -> Result<MasterState, AdminError> {
        let m = self.find(name)?;
        m.set_admin(Admin::Enabled);
        tracing::info!(master = %name, "master enabled (admin)");
        Ok(m.state())
    }

    pub(crate) fn local_addrs(&self, role: Role) -> Vec<SocketAddr> {
        lock(&self.listeners)
            .iter()
            .filter(|h| h.role == role)
            .map(|h| h.local)
            .collect()
    }

    pub(crate) fn admin_addr(&self) -> Option<SocketAddr> {
        lock(&self.admin).as_ref().map(|h| h.local)
    }
}

/// How long reading the configuration file may take (a hung network filesystem must not stall
/// a runtime worker, nor reloads forever).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads a file on the blocking pool, bounded by [`READ_TIMEOUT`].
async fn read_file(path: PathBuf) -> std::io::Result<Vec<u8>> {
    match tokio::time::timeout(
        READ_TIMEOUT,
        tokio::task::spawn_blocking(move || std::fs::read(path)),
    )
    .await
    {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(std::io::Error::other(e)),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {READ_TIMEOUT:?}"),
        )),
    }
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
            "check the path and its permissions",
        ))
    })?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    *seen = Some(bytes);
    saltgate_config::parse(&text, Some(&src.path), src.format)
}

fn read_token(path: &std::path::Path) -> Result<String, ApplyError> {
    let err = |reason: String| ApplyError::Token {
        path: path.to_path_buf(),
        reason,
    };
    let t = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let t = t.trim();
    if t.is_empty() {
        return Err(err("the file is empty".into()));
    }
    Ok(t.to_string())
}

impl Running {
    /// The addresses the listeners of `role` are bound to (port 0 resolved).
    pub fn local_addrs(&self, role: Role) -> Vec<SocketAddr> {
        self.shared.local_addrs(role)
    }

    /// Where the admin API listens, if enabled.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.shared.admin_addr()
    }

    pub fn masters(&self) -> Vec<Arc<Master>> {
        self.shared.snapshot.load().masters.clone()
    }

    pub fn master(&self, name: &str) -> Option<Arc<Master>> {
        self.shared.snapshot.load().master(name).cloned()
    }

    pub fn generation(&self) -> u64 {
        self.shared.snapshot.load().generation
    }

    /// Live sessions over all listeners.
    pub fn live_sessions(&self) -> usize {
        self.shared.tracker.len()
    }

    /// Pump buffers held by sessions right now (sessions hold none while idle).
    pub fn buffers_in_use(&self) -> u64 {
        self.shared.pool.in_use()
    }

    /// Puts `config` in force (as a reload would). Counted in `saltgate_reloads_total`.
    pub async fn reload(&self, config: Config) -> Result<u64, ApplyError> {
        let r = self.shared.apply(config, false).await;
        self.shared.metrics.events.reload(
            "library call",
            r.as_ref().map(|g| *g).map_err(|e| e.to_string()),
        );
        self.shared
            .metrics
            .reloads
            .with_label_values(&[r.as_ref().map(|_| "ok").unwrap_or_else(|e| e.kind())])
            .inc();
        r
    }

    /// Reloads from the configuration file, as SIGHUP does.
    pub async fn reload_from_source(&self, trigger: &str) -> Result<u64, ApplyError> {
        self.shared.reload_from_source(trigger).await
    }

    pub fn drain(&self, name: &str) -> Result<MasterState, AdminError> {
        self.shared.drain(name)
    }

    pub fn disable(&self, name: &str) -> Result<MasterState, AdminError> {
        self.shared.disable(name)
    }

    pub fn enable(&self, name: &str) -> Result<MasterState, AdminError> {
        self.shared.enable(name)
    }

    /// Waits until the proxy has shut down.
    pub async fn wait(&self) {
        self.done.cancelled().await;
    }
}

/// Acts on master flips: closes a DOWN master's sessions on listeners configured to.
async fn handle_events(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<MasterEvent>) {
    while let Some(ev) = rx.recv().await {
        if ev.flip != Flip::Down {
            continue;
        }
        let snap = shared.snapshot.load_full();
        for role in Role::ALL {
            let l = snap.config.listener(role);
            if l.on_master_down != OnMasterDown::Close {
                continue;
            }
            let n = ev.master.session_count(role);
            if n == 0 {
                continue;
            }
            tracing::warn!(master = %ev.master.name(), listener = %role, sessions = n, rate_per_s = l.close_rate, "closing the sessions of a master marked DOWN");
            let (m, rate) = (ev.master.clone(), l.close_rate);
            tokio::spawn(async move {
                m.registry
                    .close_paced(role, rate, CloseReason::MasterDown, || !m.is_up())
                    .await;
            });
        }
    }
}

/// Reloads when the configuration file's content changes (polled: robust to editors that replace
/// the file, and to files on network filesystems where inotify is unreliable).
async fn watch_file(shared: Arc<Shared>, path: PathBuf, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shared.accept_stop.cancelled() => return,
        }
        let Ok(now) = read_file(path.clone()).await else {
            continue;
        };
        let changed = match shared.source_seen.try_lock() {
            Ok(seen) => seen.as_deref() != Some(now.as_slice()),
            Err(_) => false, // a reload is running; look again next tick
        };
        if changed {
            let _ = shared.reload_from_source("file change").await;
        }
    }
}
