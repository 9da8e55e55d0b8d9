//! The control plane's state: the [`Control`] that owns the listeners, the admin socket, the
//! checkers and the data-plane context, the options [`crate::control::start`] takes, and the
//! [`Running`] handle it returns. The modules beside this one act on it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use saltgate_config::{Config, Format, Role};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::error::ApplyError;
use crate::data::listener::Limit;
use crate::ops::accesslog::{AccessSink, TracingSink};
use crate::ops::metrics::Metrics;
use crate::select::check::{MasterEvent, Prober, SaltProbes};
use crate::select::snapshot::Lookup;
use crate::session::context::DataPlane;
use crate::session::serve::Serve;

/// Where a reload reads the configuration from.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub path: PathBuf,
    pub format: Format,
}

/// A running accept loop.
pub(crate) struct ListenerHandle {
    pub role: Role,
    pub bind: SocketAddr,
    pub local: SocketAddr,
    /// Shared with the accept loop, so a role change can hand it to a new loop.
    pub sock: Arc<TcpListener>,
    pub stop: CancellationToken,
    pub limit: Arc<Limit>,
    /// What the accept loop does with each connection.
    pub serve: Arc<dyn Serve>,
}

impl ListenerHandle {
    /// Whether this listener serves `addr`: as configured, or as bound (port 0 resolved).
    pub fn serves(&self, addr: SocketAddr) -> bool {
        self.bind == addr || self.local == addr
    }
}

/// The running admin HTTP server.
pub(crate) struct AdminHandle {
    pub bind: SocketAddr,
    pub local: SocketAddr,
    pub stop: CancellationToken,
}

/// The control plane's state. Sessions never see it.
pub(crate) struct Control {
    /// What sessions get.
    pub data: Arc<DataPlane>,
    /// Every session task, for the shutdown drain.
    pub tracker: TaskTracker,
    pub metrics: Arc<Metrics>,
    /// The admin bearer token, if configured.
    pub token: ArcSwap<Option<String>>,
    pub global_limit: Arc<Limit>,
    pub checks_stop: CancellationToken,
    pub events: mpsc::UnboundedSender<MasterEvent>,
    pub prober: Arc<dyn Prober>,
    /// How masters' hosts are looked up (the system resolver unless a test injects one).
    pub lookup: Lookup,
    pub listeners: Mutex<Vec<ListenerHandle>>,
    pub admin: Mutex<Option<AdminHandle>>,
    pub reload_lock: tokio::sync::Mutex<()>,
    /// Serialises reloads from the file (so systemd sees RELOADING/READY pairs) and holds the
    /// content last read, so the watcher does not reload what a SIGHUP already did.
    pub source_seen: tokio::sync::Mutex<Option<Vec<u8>>>,
    pub source: Option<ConfigSource>,
    pub override_config: Option<ConfigOverride>,
    /// Cancelled at the start of shutdown: accept loops and the file watcher stop.
    pub accept_stop: CancellationToken,
    /// Cancelled when shutdown is complete: the admin API serves `/metrics` and `/readyz` (503)
    /// through the drain.
    pub admin_stop: CancellationToken,
    /// Set (under `reload_lock`) when shutdown starts: no reload may bind listeners after it.
    pub stopping: AtomicBool,
    /// Bumped by every master event: the rebalancer run holding the current value is the only
    /// one that moves sessions (see [`crate::select::rebalance`]).
    pub rebalance_epoch: Arc<AtomicU64>,
    /// What the fan-out hubs share: their metrics (registered once per process) and the hub
    /// serving the publish listener now (the admin API's `/api/v1/fanout` reads it here).
    pub fanout: crate::fanout::HubHandles,
    /// The configuration last put in force as given (the file's), before the discovered masters
    /// are added to it.
    pub file_config: Mutex<Option<Config>>,
    /// The file names last listed in the cluster's `peers/` directory (see [`discovery`]).
    pub peer_files: Mutex<Vec<String>>,
    /// Peer files already warned about (warned once).
    pub discovery_warned: Mutex<std::collections::BTreeSet<String>>,
    /// The last listing error (logged once per kind).
    pub discovery_problem: Mutex<Option<std::io::ErrorKind>>,
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
    /// Where access records go (default: the `saltgate::access` tracing target).
    pub access_log: Arc<dyn AccessSink>,
    /// How masters' hosts are looked up, at start, at every reload and while a host stays
    /// unresolved (default: the system resolver, [`crate::select::snapshot::system_lookup`]).
    pub lookup: Lookup,
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
            access_log: Arc::new(TracingSink),
            lookup: crate::select::snapshot::system_lookup,
        }
    }
}

/// A running proxy.
pub struct Running {
    pub(crate) control: Arc<Control>,
    /// Cancelled when shutdown is complete.
    pub(crate) done: CancellationToken,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
