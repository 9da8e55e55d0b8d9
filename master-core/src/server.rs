//! `saltgate-master run`: binds the request and publish ports in the master file's `transport`
//! (ZeroMQ's ROUTER and PUB, or Salt's `tcp`, over TLS with `ssl`) and the local CLI socket,
//! and serves until the shutdown future resolves.
//!
//! Requests are handled on the blocking pool (RSA and small file reads), replies go back
//! through the ROUTER loop. A background task prunes the job cache every hour.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use saltgate_config::salt_master::SaltMasterConfig;
use saltgate_config::transport::{CertReqs, SaltTransport};
use saltgate_wire::salt_tcp::tls::{CertReqs as TlsReqs, TlsSettings};
use saltgate_wire::salt_tcp::tls_server::TlsServer;
use saltgate_wire::transport::{
    AnyPublishServer, AnyReplier, Incoming, PublishServer, PublishServerOptions, Replier,
    RequestServer, RequestServerOptions, Transport,
};
use thiserror::Error;

use crate::jobbook::JobBook;
use crate::keys::{make_dir, KeyError, MasterKey};
use crate::metrics::RequestCounters;
use crate::state::Master;

/// Largest request frame accepted on the request port; larger ones close the connection
/// before any allocation (the transport's codec checks the length header).
pub const MAX_REQUEST_FRAME: usize = 64 * 1024 * 1024;

/// Requests handled at once (each may do RSA work on the blocking pool). Beyond this the
/// ROUTER is not read, so the backlog stays in the sockets rather than in memory.
pub const MAX_INFLIGHT: usize = 64;
/// Requests received and waiting for a handler. Beyond it the ROUTER stops reading the peers
/// with more to deliver (backpressure: nothing is dropped), so a burst of every minion returning
/// at once waits in the sockets.
pub const INBOUND_QUEUE: usize = 1000;

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
    /// Salt's `ssl` of the master file cannot be used (the message names the key).
    #[error("{0}")]
    Tls(String),
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
    /// The metrics endpoint, when `saltgate_metrics_bind` is set.
    pub metrics: Option<SocketAddr>,
}

/// The CLI socket of a configuration.
pub fn cli_socket_path(config: &SaltMasterConfig) -> PathBuf {
    config.sock_dir.join("saltgate_master_publish.sock")
}

/// The master's state; with `cluster_id`, also its cluster keys and bound cluster port (not
/// served yet: [`crate::peerserve::serve`]) and the configured peers to join.
pub async fn build_master(
    config: SaltMasterConfig,
    master_key: MasterKey,
    publish_port: u16,
    publisher: Option<AnyPublishServer>,
    pub_sig: Option<crate::signing::PubSig>,
) -> Result<(Master, Option<tokio::net::TcpListener>, Vec<SocketAddr>), ServeError> {
    let Some(cc) = config.cluster.clone() else {
        return Ok((
            Master::builder(config, master_key, publish_port, publisher)
                .with_pub_sig(pub_sig)
                .build(),
            None,
            Vec::new(),
        ));
    };
    let own = master_key.clone();
    let (cc2, id) = (cc.clone(), config.id.clone());
    let (ckey, caes) =
        tokio::task::spawn_blocking(move || crate::cluster::load_cluster_keys(&cc2, &id, &own))
            .await
            .map_err(|e| ServeError::Cluster(e.to_string()))?
            .map_err(|e| ServeError::Cluster(e.to_string()))?;
    let bind_err = |addr| {
        move |source| ServeError::Bind {
            what: "cluster (cluster_pool_port)",
            addr,
            source,
        }
    };
    let pool_addr = SocketAddr::new(config.interface, cc.pool_port);
    let l = tokio::net::TcpListener::bind(pool_addr)
        .await
        .map_err(bind_err(pool_addr))?;
    let pool_addr = l.local_addr().map_err(bind_err(pool_addr))?;
    let join_peers = crate::cluster::peer_addrs(&cc);
    let id = config.id.clone();
    let state = crate::cluster::ClusterState::new(cc, &id, master_key.clone(), pool_addr);
    let master = Master::builder(config, master_key, publish_port, publisher)
        .with_pub_sig(pub_sig)
        .with_cluster(ckey, caes, state)
        .build();
    Ok((master, Some(l), join_peers))
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
    let sign_config = config.clone();
    let pub_sig = tokio::task::spawn_blocking(move || crate::signing::PubSig::load(&sign_config))
        .await
        .map_err(|e| KeyError::Io {
            path: config.pki_dir.clone(),
            source: std::io::Error::other(e.to_string()),
        })??;
    make_dir(&config.cachedir, 0o755)?;
    make_dir(&config.sock_dir, 0o700)?;
    let ret_addr = SocketAddr::new(config.interface, config.ret_port);
    let pub_addr = SocketAddr::new(config.interface, config.publish_port);
    let lim = config.limits;
    // The request and publish ports together hold at most the descriptor limit less a
    // headroom: a flood of connections then waits in the kernel backlog instead of taking the
    // descriptors the job cache, the key files and the CLI socket need.
    let budget = saltgate_wire::accept::descriptor_budget();
    let shared_limit = Arc::new(saltgate_wire::accept::ConnectionLimit::new(budget));
    tracing::info!(
        connections = budget.map_or("unlimited".to_string(), |b| b.to_string()),
        "request and publish ports: connection budget from the open-file limit"
    );
    let (transport, tls) = transport_of(&config)?;
    let presence = crate::presence::LateRing::default();
    let router_opts = RequestServerOptions {
        max_payload: MAX_REQUEST_FRAME,
        untrusted_max_payload: Some(lim.untrusted_max_frame),
        untrusted_queue_bytes: Some(lim.untrusted_queue_bytes),
        max_connections: lim.request_max_connections,
        shared_limit: Some(shared_limit.clone()),
        payload_timeout: Some(Duration::from_secs(lim.frame_timeout_secs)),
        write_timeout: Some(Duration::from_secs(lim.write_timeout_secs)),
        queue: INBOUND_QUEUE,
        tls: tls.clone(),
    };
    let mut router = transport
        .bind_request_server(ret_addr, &router_opts)
        .await
        .map_err(|source| ServeError::Bind {
            what: "request (ret_port)",
            addr: ret_addr,
            source,
        })?;
    let pub_opts = PublishServerOptions {
        max_connections: lim.publish_max_connections,
        shared_limit: Some(shared_limit),
        presence: Some(presence.check()),
        tls,
        ..PublishServerOptions::default()
    };
    let publisher = transport
        .bind_publish_server(pub_addr, &pub_opts)
        .await
        .map_err(|source| ServeError::Bind {
            what: "publish (publish_port)",
            addr: pub_addr,
            source,
        })?;
    let bound_pub = publisher.local_addr();
    let metrics_listener = match config.metrics_bind {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind {
                    what: "metrics (saltgate_metrics_bind)",
                    addr,
                    source,
                })?,
        ),
        None => None,
    };
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
    let (master, cluster_listener, join_peers) = build_master(
        config,
        master_key,
        bound_pub.port(),
        Some(publisher),
        pub_sig,
    )
    .await?;
    let master = Arc::new(master);
    presence.set(master.ring.clone());
    master.ring.keys.ensure_dirs()?;
    let bound = Bound {
        ret: router.local_addr(),
        publish: bound_pub,
        cli_socket: sock_path.clone(),
        cluster: master.cluster.as_ref().map(|c| c.pool_addr),
        metrics: metrics_listener.as_ref().and_then(|l| l.local_addr().ok()),
    };
    tracing::info!(ret = %bound.ret, publish = %bound.publish, socket = %sock_path.display(),
        metrics = ?bound.metrics, id = %master.config.id, transport = %transport,
        tls = master.config.transport.ssl.is_some(), "saltgate-master ready");
    on_ready(&bound);

    let cli_task = tokio::spawn(crate::cli::serve(
        listener,
        master.publish.clone(),
        master.jobs.clone(),
    ));
    let prune_task = tokio::spawn(prune_loop(
        master.jobs.clone(),
        Duration::from_secs(master.config.keep_jobs_secs),
    ));
    let rotate_task = tokio::spawn(crate::rotate::run(
        master.ring.aes.clone(),
        master.config.clone(),
    ));
    let cluster_tasks = match (cluster_listener, &master.peers) {
        (Some(l), Some(port)) => Some((
            tokio::spawn(crate::peerserve::serve(l, port.clone())),
            tokio::spawn(crate::cluster::join_loop(port.cluster.clone(), join_peers)),
        )),
        _ => None,
    };
    let counters = Arc::new(RequestCounters::default());
    let sender = router.replier();
    let report_task = tokio::spawn(report_loop(counters.clone(), sender.clone()));
    let metrics_task = metrics_listener.map(|l| {
        let sources = crate::metrics::Sources {
            refusals: master.refusals.clone(),
            publisher: master.publish.publisher().cloned(),
            jobs: master.jobs.clone(),
            peers: master.cluster.as_ref().map(|c| c.stats.clone()),
            requests: counters.clone(),
            router: sender.clone(),
            router_refusals: router.refusals(),
        };
        tokio::spawn(crate::metrics::serve(l, Arc::new(sources)))
    });
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT));
    tokio::pin!(shutdown);
    loop {
        // Only receiving waits for a free handler slot; handlers reply on their own
        // (the `Replier`), so a full set of handlers never waits for this loop. (It used to:
        // replies went through a bounded channel this loop drained, and this loop waited for a
        // permit inside the receive branch, so once that channel filled, handlers waited on the
        // loop and the loop on them: the master stopped answering, docs/master.md.)
        let msg = tokio::select! {
            _ = &mut shutdown => break,
            msg = router.recv() => msg,
        };
        let Some(msg) = msg else { break };
        counters.received.fetch_add(1, Ordering::Relaxed);
        // A REQ peer sends ["", request]; anything else is not a Salt request.
        let msg = match msg {
            Incoming::Request(r) => r,
            Incoming::NotRequest { parts } => {
                counters.not_req.fetch_add(1, Ordering::Relaxed);
                master.refusals.count(crate::metrics::Refused::NotReq);
                tracing::warn!(frames = parts, "request without the REQ envelope ignored");
                continue;
            }
        };
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        // A minion that gave up waiting (its request timed out) has closed the connection and
        // will send the request again: answering this copy would be wasted work (RSA for an
        // `_auth`), and Salt's workers do it anyway.
        if !sender.is_connected(&msg.reply_to) {
            counters.sender_gone.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let (m, tx, c, peer, body, received) = (
            master.clone(),
            sender.clone(),
            counters.clone(),
            msg.reply_to,
            msg.payload,
            msg.received,
        );
        tokio::spawn(async move {
            let _permit = permit;
            // Its age is taken when a blocking thread runs it: the last moment before the work.
            let reply = tokio::task::spawn_blocking(move || {
                crate::request::handle_request(&m, &body, received.elapsed())
            })
            .await;
            match reply {
                Ok(None) => c.expired.fetch_add(1, Ordering::Relaxed),
                Ok(Some(h)) => {
                    if h.authenticated {
                        // It holds a session key: its next frames may be full size.
                        tx.trust(&peer);
                    }
                    match tx.reply(&peer, Bytes::from(h.reply)).await {
                        Ok(()) => c.replied.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            tracing::debug!(error = %e, "reply not delivered (peer gone)");
                            c.undelivered.fetch_add(1, Ordering::Relaxed)
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "request handler failed");
                    c.failed.fetch_add(1, Ordering::Relaxed)
                }
            };
        });
    }
    report_task.abort();
    if let Some(t) = metrics_task {
        t.abort();
    }
    counters.log(sender.paused_inbound());
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

/// The transport of the master file, and its TLS server side (Salt's `ssl`, read once here).
fn transport_of(config: &SaltMasterConfig) -> Result<(Transport, Option<TlsServer>), ServeError> {
    let t = &config.transport;
    let transport = match t.kind {
        SaltTransport::Zeromq => Transport::Zeromq,
        SaltTransport::Tcp => Transport::Tcp,
        SaltTransport::Ws => Transport::Ws,
    };
    let tls = match &t.ssl {
        None => None,
        Some(ssl) => {
            let settings = TlsSettings {
                certfile: ssl.certfile.clone(),
                keyfile: ssl.keyfile.clone(),
                ca_certs: ssl.ca_certs.clone(),
                cert_reqs: match ssl.cert_reqs {
                    CertReqs::None => TlsReqs::None,
                    CertReqs::Optional => TlsReqs::Optional,
                    CertReqs::Required => TlsReqs::Required,
                },
                server_name: None,
            };
            Some(TlsServer::new(&settings).map_err(|e| ServeError::Tls(e.to_string()))?)
        }
    };
    Ok((transport, tls))
}

async fn report_loop(c: Arc<RequestCounters>, router: AnyReplier) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    let mut last = 0;
    loop {
        tick.tick().await;
        let now = c.total();
        if now != last {
            last = now;
            c.log(router.paused_inbound());
        }
    }
}

async fn prune_loop(jobs: Arc<JobBook>, keep: Duration) {
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tick.tick().await;
        let j = jobs.clone();
        let r = tokio::task::spawn_blocking(move || j.cache.prune(keep, SystemTime::now())).await;
        match r {
            Ok(Ok(removed)) if !removed.is_empty() => {
                tracing::info!(removed = removed.len(), "job cache pruned")
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "job cache prune failed"),
            _ => {}
        }
    }
}
