//! Starting and stopping the proxy: resolve masters, run the first health round, bind listeners,
//! accept, close a DOWN master's sessions, and shut down in two phases (stop accepting, then drain
//! live sessions up to the grace period, then close the rest).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use saltgate_config::{Config, OnMasterDown, Role};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::check::{self, MasterEvent, Prober, TcpConnect};
use crate::close::CloseReason;
use crate::listener;
use crate::master::{Flip, Master};
use crate::pump::BufPool;
use crate::snapshot::{ResolveError, Snapshot};

/// State every session and task shares.
pub(crate) struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub pool: BufPool,
    /// Parent of every session's close token; cancelled when the shutdown grace runs out.
    pub sessions_token: CancellationToken,
    pub tracker: TaskTracker,
}

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("cannot listen on {addr} ({role}): {source} (fix: free the port, or change listeners.{role}.bind)")]
    Bind {
        role: Role,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running proxy.
pub struct Running {
    shared: Arc<Shared>,
    addrs: [Vec<SocketAddr>; 2],
    done: JoinHandle<()>,
}

impl Running {
    /// The addresses the listeners of `role` are bound to (port 0 resolved).
    pub fn local_addrs(&self, role: Role) -> &[SocketAddr] {
        &self.addrs[role as usize]
    }

    pub fn masters(&self) -> Vec<Arc<Master>> {
        self.shared.snapshot.load().masters.clone()
    }

    pub fn master(&self, name: &str) -> Option<Arc<Master>> {
        self.shared.snapshot.load().master(name).cloned()
    }

    /// Live sessions over all listeners.
    pub fn live_sessions(&self) -> usize {
        self.shared.tracker.len()
    }

    /// Waits until the proxy has shut down.
    pub async fn wait(self) {
        let _ = self.done.await;
    }
}

/// How the proxy checks masters; tests substitute their own prober.
pub struct Options {
    pub prober: Arc<dyn Prober>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            prober: Arc::new(TcpConnect),
        }
    }
}

/// Starts the proxy; it stops when `shutdown` completes.
pub async fn start(
    config: Config,
    opts: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Running, StartError> {
    let grace = config.global.shutdown_grace;
    let global_max = config
        .global
        .maxconn
        .map(|n| Arc::new(Semaphore::new(n as usize)));
    let snap = Snapshot::build(config, 1).await?;
    let masters = snap.masters.clone();
    let shared = Arc::new(Shared {
        snapshot: ArcSwap::from_pointee(snap),
        pool: BufPool::new(1024),
        sessions_token: CancellationToken::new(),
        tracker: TaskTracker::new(),
    });

    // Health checks, and the first round before listening (so the first client finds masters UP).
    let checks_stop = CancellationToken::new();
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    for m in masters.iter().filter(|m| m.cfg.check) {
        for role in Role::ALL {
            tokio::spawn(check::run_port_checks(
                m.clone(),
                role,
                opts.prober.clone(),
                events_tx.clone(),
                checks_stop.clone(),
            ));
        }
    }
    drop(events_tx);
    let first_round_limit = masters
        .iter()
        .map(|m| m.cfg.health.timeout)
        .max()
        .unwrap_or_default()
        + Duration::from_secs(1);
    let _ = tokio::time::timeout(first_round_limit, async {
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        while !masters.iter().all(|m| m.first_round_done()) {
            tick.tick().await;
        }
    })
    .await;
    for m in &masters {
        if !m.is_up() {
            tracing::warn!(master = m.name(), "master is DOWN at start");
        }
    }

    // Listeners.
    let accept_stop = CancellationToken::new();
    let mut addrs: [Vec<SocketAddr>; 2] = Default::default();
    let snap = shared.snapshot.load_full();
    let mut bound = Vec::new();
    for role in Role::ALL {
        let l = snap.config.listener(role);
        for &addr in &l.bind {
            let sock = listener::bind(addr, l.backlog).map_err(|source| {
                checks_stop.cancel();
                StartError::Bind { role, addr, source }
            })?;
            addrs[role as usize].push(sock.local_addr().unwrap_or(addr));
            bound.push((
                role,
                sock,
                l.maxconn.map(|n| Arc::new(Semaphore::new(n as usize))),
            ));
        }
    }
    for (role, sock, maxconn) in bound {
        let shared2 = shared.clone();
        let stop = accept_stop.clone();
        let global = global_max.clone();
        tracing::info!(listener = %role, addr = ?sock.local_addr().ok(), "listening");
        tokio::spawn(listener::accept_loop(
            sock,
            role,
            maxconn,
            global,
            stop,
            move |stream, peer, permits| {
                let s = shared2.clone();
                shared2
                    .tracker
                    .spawn(crate::session::handle(s, role, stream, peer, permits));
            },
        ));
    }

    tokio::spawn(handle_events(shared.clone(), events_rx));

    let shared2 = shared.clone();
    let done = tokio::spawn(async move {
        shutdown.await;
        accept_stop.cancel();
        shared2.tracker.close();
        let live = shared2.tracker.len();
        tracing::info!(
            live_sessions = live,
            grace_ms = grace.as_millis() as u64,
            "shutting down: stopped accepting, draining sessions"
        );
        if tokio::time::timeout(grace, shared2.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                live_sessions = shared2.tracker.len(),
                "shutdown grace over; closing the remaining sessions"
            );
            shared2.sessions_token.cancel();
            shared2.tracker.wait().await;
        }
        checks_stop.cancel();
        tracing::info!("shutdown complete");
    });
    Ok(Running {
        shared,
        addrs,
        done,
    })
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
            tracing::warn!(master = ev.master.name(), listener = %role, sessions = n, rate_per_s = l.close_rate, "closing the sessions of a master marked DOWN");
            let (m, rate) = (ev.master.clone(), l.close_rate);
            tokio::spawn(async move {
                m.registry
                    .close_paced(role, rate, CloseReason::MasterDown)
                    .await;
            });
        }
    }
}
