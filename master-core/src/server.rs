//! `saltgate-master run`: binds the request ROUTER, the publish PUB and the local CLI socket,
//! and serves until the shutdown future resolves.
//!
//! Requests are handled on the blocking pool (RSA and small file reads), replies go back
//! through the ROUTER loop. A background task prunes the job cache every hour.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use saltgate_config::salt_master::SaltMasterConfig;
use saltgate_wire::zmtp::{PubOptions, Publisher, Router, RouterOptions};
use thiserror::Error;
use tokio::sync::mpsc;

use crate::keys::{make_dir, KeyError, MasterKey};
use crate::state::Master;

/// Largest request frame accepted on the request port; larger ones close the connection
/// before any allocation (the ZMTP codec checks the length header).
pub const MAX_REQUEST_FRAME: usize = 64 * 1024 * 1024;

/// Requests handled at once (each may do RSA work on the blocking pool). Beyond this the
/// ROUTER is not read, so the backlog stays in the sockets rather than in memory.
pub const MAX_INFLIGHT: usize = 64;
/// Requests received and waiting for a handler. A minion's REQ socket has at most one request
/// outstanding, so this is sized above any number of connections a master holds: a burst (every
/// minion returning a job at once) waits here instead of being dropped at wire's default of 1,000
/// (a dropped `_return` is only sent again after the minion's 60 s request timeout; the bench's
/// `master` scenario lost 252 of 1,000 `test.ping` returns that way, docs/master.md). Memory is
/// taken only by what waits (the channel allocates in blocks as it fills).
pub const INBOUND_QUEUE: usize = 1 << 17;

#[derive(Debug, Error)]
pub enum ServeError {
    #[error(transparent)]
    Keys(#[from] KeyError),
    #[error("cannot bind the {what} port {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cluster setup: {0}")]
    Cluster(String),
    #[error("cannot bind the CLI socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where a running master listens.
#[derive(Debug, Clone)]
pub struct Bound {
    pub ret: SocketAddr,
    pub publish: SocketAddr,
    pub cli_socket: PathBuf,
    /// The cluster peer port, when `cluster_id` is set.
    pub cluster: Option<SocketAddr>,
}

/// The CLI socket of a configuration.
pub fn cli_socket_path(config: &SaltMasterConfig) -> PathBuf {
    config.sock_dir.join("saltgate_master_publish.sock")
}

/// Loads or creates the master key pair, binds everything, and serves until `shutdown`.
/// `on_ready` is called once with the bound addresses.
pub async fn run(
    config: SaltMasterConfig,
    shutdown: impl Future<Output = ()>,
    on_ready: impl FnOnce(&Bound),
) -> Result<(), ServeError> {
    let pki = config.pki_dir.clone();
    let master_key = tokio::task::spawn_blocking(move || MasterKey::load_or_create(&pki, "master"))
        .await
        .map_err(|e| KeyError::Io {
            path: config.pki_dir.clone(),
            source: std::io::Error::other(e.to_string()),
        })??;
    make_dir(&config.cachedir, 0o755)?;
    make_dir(&config.sock_dir, 0o700)?;
    let ret_addr = SocketAddr::new(config.interface, config.ret_port);
    let pub_addr = SocketAddr::new(config.interface, config.publish_port);
    let router_opts = RouterOptions {
        max_frame_size: MAX_REQUEST_FRAME,
        queue: INBOUND_QUEUE,
        ..RouterOptions::default()
    };
    let mut router = Router::bind(ret_addr, router_opts)
        .await
        .map_err(|source| ServeError::Bind {
            what: "request (ret_port)",
            addr: ret_addr,
            source,
        })?;
    let publisher = Publisher::bind(pub_addr, PubOptions::default())
        .await
        .map_err(|source| ServeError::Bind {
            what: "publish (publish_port)",
            addr: pub_addr,
            source,
        })?;
    let bound_pub = publisher.local_addr();
    let sock_path = cli_socket_path(&config);
    let _ = std::fs::remove_file(&sock_path);
    let listener =
        tokio::net::UnixListener::bind(&sock_path).map_err(|source| ServeError::Socket {
            path: sock_path.clone(),
            source,
        })?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&sock_path, std::fs::Permissions::from_mode(0o600));
    }
    let mut cluster_listener = None;
    let mut join_peers = Vec::new();
    let master = match config.cluster.clone() {
        None => Master::new(config, master_key, bound_pub.port(), Some(publisher)),
        Some(cc) => {
            let own = master_key.clone();
            let (cc2, id) = (cc.clone(), config.id.clone());
            let (ckey, caes) = tokio::task::spawn_blocking(move || {
                crate::cluster::load_cluster_keys(&cc2, &id, &own)
            })
            .await
            .map_err(|e| ServeError::Cluster(e.to_string()))?
            .map_err(|e| ServeError::Cluster(e.to_string()))?;
            let pool_addr = SocketAddr::new(config.interface, cc.pool_port);
            let l = tokio::net::TcpListener::bind(pool_addr)
                .await
                .map_err(|source| ServeError::Bind {
                    what: "cluster (cluster_pool_port)",
                    addr: pool_addr,
                    source,
                })?;
            let pool_addr = l.local_addr().map_err(|source| ServeError::Bind {
                what: "cluster (cluster_pool_port)",
                addr: pool_addr,
                source,
            })?;
            cluster_listener = Some(l);
            join_peers = crate::cluster::peer_addrs(&cc);
            let id = config.id.clone();
            let state = crate::cluster::ClusterState::new(cc, &id, master_key.clone(), pool_addr);
            Master::new(config, master_key, bound_pub.port(), Some(publisher))
                .with_cluster(ckey, caes, state)
        }
    };
    let master = Arc::new(master);
    master.keys.ensure_dirs()?;
    let bound = Bound {
        ret: router.local_addr(),
        publish: bound_pub,
        cli_socket: sock_path.clone(),
        cluster: master.cluster.as_ref().map(|c| c.pool_addr),
    };
    tracing::info!(ret = %bound.ret, publish = %bound.publish, socket = %sock_path.display(),
        id = %master.config.id, "saltgate-master ready");
    on_ready(&bound);

    let cli_task = tokio::spawn(crate::cli::serve(listener, master.clone()));
    let prune_task = tokio::spawn(prune_loop(master.clone()));
    let rotate_task = tokio::spawn(crate::rotate::run(master.clone()));
    let cluster_tasks = cluster_listener.map(|l| {
        (
            tokio::spawn(crate::cluster::serve(l, master.clone())),
            tokio::spawn(crate::cluster::join_loop(master.clone(), join_peers)),
        )
    });
    // Larger than MAX_INFLIGHT, so a finished handler never waits for the loop.
    let (reply_tx, mut reply_rx) = mpsc::channel::<(Bytes, Vec<u8>)>(4 * MAX_INFLIGHT);
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            msg = router.recv() => {
                let Some(msg) = msg else { break };
                // A REQ peer sends ["", request]; anything else is not a Salt request.
                let frames = msg.frames;
                if frames.len() != 2 || !frames[0].is_empty() {
                    tracing::warn!(frames = frames.len(), "request without the REQ envelope ignored");
                    continue;
                }
                let m = master.clone();
                let tx = reply_tx.clone();
                let body = frames[1].clone();
                let Ok(permit) = permits.clone().acquire_owned().await else { break };
                tokio::spawn(async move {
                    let _permit = permit;
                    let reply = tokio::task::spawn_blocking(move || crate::request::handle(&m, &body)).await;
                    match reply {
                        Ok(r) => { let _ = tx.send((msg.peer, r)).await; }
                        Err(e) => tracing::error!(error = %e, "request handler failed"),
                    }
                });
            }
            Some((peer, reply)) = reply_rx.recv() => {
                if let Err(e) = router.reply(&peer, vec![Bytes::from(reply)]).await {
                    tracing::debug!(error = %e, "reply not delivered (peer gone)");
                }
            }
        }
    }
    cli_task.abort();
    prune_task.abort();
    rotate_task.abort();
    if let Some((a, b)) = cluster_tasks {
        a.abort();
        b.abort();
    }
    let _ = std::fs::remove_file(&sock_path);
    tracing::info!("saltgate-master stopped");
    Ok(())
}

async fn prune_loop(master: Arc<Master>) {
    let keep = Duration::from_secs(master.config.keep_jobs_secs);
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tick.tick().await;
        let m = master.clone();
        let r = tokio::task::spawn_blocking(move || m.jobs.prune(keep, SystemTime::now())).await;
        match r {
            Ok(Ok(removed)) if !removed.is_empty() => {
                tracing::info!(removed = removed.len(), "job cache pruned")
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "job cache prune failed"),
            _ => {}
        }
    }
}
