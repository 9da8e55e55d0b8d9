//! One minion from a Salt minion config (`saltgate-minion run`): one master, hot multi-master
//! (`master` is a list, `master_type: str`: one link per master, all used at once) or failover
//! (`master_type: failover`: one active master; a dead one is left and put at the end of the
//! list, as Salt's `eval_master(failed=True)`; `master_failback` returns to the first master
//! when it answers a clear `ping` again).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::seq::SliceRandom;
use saltgate_config::salt_minion::{MasterAddr, MasterType, MinionConfig};
use saltgate_config::transport::{CertReqs as SslCertReqs, SslConfig};
use saltgate_wire::salt_tcp::client::TlsClient;
use saltgate_wire::salt_tcp::tls::{self, CertReqs, TlsSettings};
use saltgate_wire::transport::{ReconnectPolicy, Transport};
use thiserror::Error;
use tokio::sync::watch;

use crate::channel::{Identity, ReqChannel};
use crate::exec::ExecContext;
use crate::grains::HostGrains;
use crate::job::JidQueue;
use crate::keys::{KeyError, MasterKeyStore, MinionKey, SignCheck};
use crate::link::{Link, LinkConfig, ServeEnd, Stats};

#[derive(Debug, Error)]
pub enum RunError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("cannot resolve master {0}: {1}")]
    Resolve(String, String),
    #[error("key task failed: {0}")]
    Task(String),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// Salt's `ssl`, loaded once (the files are read here): the client configuration, and the name
/// each master's certificate must carry (its address, as Salt checks the `master_ip` it dials,
/// unless `ssl.server_name` says otherwise).
#[derive(Clone)]
pub struct MinionTls {
    config: Arc<tls::rustls::ClientConfig>,
    /// `ssl.server_name`, checked once at load; `None`: each master's address.
    server_name: Option<tls::rustls::pki_types::ServerName<'static>>,
}

impl MinionTls {
    pub fn load(ssl: &SslConfig) -> Result<Self, RunError> {
        let settings = TlsSettings {
            certfile: ssl.certfile.clone(),
            keyfile: ssl.keyfile.clone(),
            ca_certs: ssl.ca_certs.clone(),
            cert_reqs: match ssl.cert_reqs {
                SslCertReqs::None => CertReqs::None,
                SslCertReqs::Optional => CertReqs::Optional,
                SslCertReqs::Required => CertReqs::Required,
            },
            server_name: ssl.server_name.clone(),
        };
        // A bad `server_name` is told now, not at the first connect.
        let server_name = match settings.server_name {
            Some(_) => Some(tls::server_name(
                &settings,
                std::net::Ipv4Addr::LOCALHOST.into(),
            )?),
            None => None,
        };
        Ok(MinionTls {
            config: tls::client_config(&settings)?,
            server_name,
        })
    }

    /// The TLS client for the master at `ip` (never a fallback to plain text).
    pub fn client_for(&self, ip: std::net::IpAddr) -> TlsClient {
        TlsClient {
            config: self.config.clone(),
            server_name: self.server_name.clone().unwrap_or_else(|| ip.into()),
        }
    }
}

/// The minion's transport (`transport`), as the wire names it.
pub fn transport_of(cfg: &MinionConfig) -> Transport {
    Transport::parse(cfg.transport.as_str()).unwrap_or_default()
}

/// [`link_config`] with the TLS client for that master.
pub fn link_for(cfg: &MinionConfig, addr: SocketAddr, tls: Option<&MinionTls>) -> LinkConfig {
    let mut l = link_config(cfg, addr);
    l.tls = tls.map(|t| t.client_for(addr.ip()));
    l
}

/// The link settings a minion config implies for one master.
pub fn link_config(cfg: &MinionConfig, req_addr: SocketAddr) -> LinkConfig {
    let mut l = LinkConfig::new(req_addr);
    l.publish_port = cfg.publish_port;
    l.auth_timeout = cfg.auth_timeout;
    l.auth_tries = cfg.auth_tries;
    l.acceptance_wait_time = cfg.acceptance_wait_time;
    l.acceptance_wait_time_max = cfg.acceptance_wait_time_max;
    l.alive_interval = cfg.master_alive_interval;
    l.recon = ReconnectPolicy {
        recon_default: cfg.recon_default,
        recon_max: cfg.recon_max,
        recon_randomize: cfg.recon_randomize,
    };
    l.source = cfg.source_address;
    l.reauth_delay = cfg.random_reauth_delay;
    l.transport = transport_of(cfg);
    l
}

/// Resolves a master entry (first address; Salt also uses the first).
pub async fn resolve(m: &MasterAddr) -> Result<SocketAddr, RunError> {
    let mut addrs = tokio::net::lookup_host((m.host.as_str(), m.port))
        .await
        .map_err(|e| RunError::Resolve(m.to_string(), e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| RunError::Resolve(m.to_string(), "no address".into()))
}

/// The host name Salt would use as the id when none is configured.
pub fn default_id() -> String {
    let g = HostGrains::collect();
    let v = g.for_minion("", &[]);
    saltgate_wire::envelope::get(&v, "fqdn")
        .and_then(saltgate_wire::envelope::as_str)
        .unwrap_or("localhost")
        .to_owned()
}

/// Runs the minion until `stop` fires.
pub async fn run(
    cfg: MinionConfig,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), RunError> {
    let id: Arc<str> = cfg.id.clone().unwrap_or_else(default_id).into();
    let tls = cfg.ssl.as_ref().map(MinionTls::load).transpose()?;
    let pki = cfg.pki_dir.clone();
    let key = tokio::task::spawn_blocking(move || MinionKey::load_or_create(&pki, "minion"))
        .await
        .map_err(|e| RunError::Task(e.to_string()))??;
    let store =
        MasterKeyStore::open(&cfg.pki_dir, cfg.master_finger.clone())?.with_sign_check(SignCheck {
            verify: cfg.verify_master_pubkey_sign,
            always: cfg.always_verify_signature,
            key_name: cfg.master_sign_key_name.clone(),
        });
    let ident = Identity {
        id: id.clone(),
        key: Arc::new(key),
        store: Arc::new(store),
    };
    let ctx = ExecContext {
        id: id.clone(),
        host: Arc::new(HostGrains::collect()),
        statics: Arc::new(cfg.grains.clone()),
    };
    let jids = Arc::new(Mutex::new(JidQueue::new(cfg.minion_jid_queue_hwm)));
    let mut masters = cfg.masters.clone();
    if cfg.random_master {
        // With failover + failback only the tail is shuffled (Salt keeps the first master first).
        let from = usize::from(cfg.master_type == MasterType::Failover && cfg.master_failback);
        if let Some(tail) = masters.get_mut(from..) {
            tail.shuffle(&mut rand::rng());
        }
    }
    let mut addrs = Vec::new();
    for m in &masters {
        addrs.push(resolve(m).await?);
    }
    tracing::info!(%id, masters = ?addrs, mode = ?cfg.master_type,
        transport = %transport_of(&cfg), tls = tls.is_some(), "minion starting");
    // Type=notify: the key is loaded and every master resolved; from here the minion connects
    // and reconnects by itself. READY does not wait for a master to answer, so a master that
    // is down does not fail the unit's start (docs/install.md).
    saltgate_wire::sd_notify::notify("READY=1");
    match cfg.master_type {
        MasterType::Str => {
            let mut tasks = tokio::task::JoinSet::new();
            for addr in addrs {
                let lc = Arc::new(link_for(&cfg, addr, tls.as_ref()));
                let mut link =
                    Link::new(lc, ident.clone(), ctx.clone(), jids.clone(), stats.clone());
                let mut stop = stop.clone();
                tasks.spawn(async move {
                    loop {
                        let est = tokio::select! {
                            est = Box::pin(link.establish(false)) => est,
                            _ = stop.changed() => return,
                        };
                        let Ok(est) = est else { continue };
                        if Box::pin(link.serve(est, &mut stop, false)).await == ServeEnd::Stopped {
                            return;
                        }
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
        }
        MasterType::Failover => {
            failover(
                &cfg,
                tls.as_ref(),
                addrs,
                ident,
                ctx,
                jids,
                stats,
                &mut stop,
            )
            .await;
        }
    }
    Ok(())
}

/// Failover: one active master at a time.
#[allow(clippy::too_many_arguments)]
async fn failover(
    cfg: &MinionConfig,
    tls: Option<&MinionTls>,
    mut order: Vec<SocketAddr>,
    ident: Identity,
    ctx: ExecContext,
    jids: Arc<Mutex<JidQueue>>,
    stats: Arc<Stats>,
    stop: &mut watch::Receiver<bool>,
) {
    let first = order.first().copied();
    loop {
        if *stop.borrow() {
            return;
        }
        let mut connected = false;
        for i in 0..order.len() {
            let addr = order[i];
            let lc = Arc::new(link_for(cfg, addr, tls));
            let mut link = Link::new(lc, ident.clone(), ctx.clone(), jids.clone(), stats.clone());
            let est = tokio::select! {
                est = link.establish(true) => est,
                _ = stop.changed() => return,
            };
            let Ok(est) = est else {
                tracing::warn!(master = %addr, "failover: master unavailable, trying the next");
                continue;
            };
            tracing::info!(master = %addr, "failover: connected");
            connected = true;
            let is_first = Some(addr) == first;
            let end = if cfg.master_failback && !is_first && !cfg.master_failback_interval.is_zero()
            {
                let fb = first.unwrap_or(addr);
                tokio::select! {
                    end = link.serve(est, stop, true) => Some(end),
                    _ = failback_ready(ident.clone(), link_for(cfg, fb, tls), cfg) => None,
                }
            } else {
                Some(link.serve(est, stop, true).await)
            };
            match end {
                Some(ServeEnd::Stopped) => return,
                Some(ServeEnd::Dead(why)) => {
                    tracing::warn!(master = %addr, reason = why, "failover: master is dead, leaving it");
                    // Salt moves the failed master to the end of the list.
                    let failed = order.remove(i);
                    order.push(failed);
                }
                None => {
                    tracing::info!(master = ?first, "failback: the first master answers again");
                    if let Some(f) = first {
                        order.retain(|a| *a != f);
                        order.insert(0, f);
                    }
                }
            }
            break;
        }
        if !connected {
            tokio::select! {
                _ = tokio::time::sleep(cfg.acceptance_wait_time) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// Resolves once `master` answers a clear `ping` (checked every `interval`), as Salt's
/// `status.ping_master` failback job.
async fn failback_ready(ident: Identity, master: LinkConfig, cfg: &MinionConfig) {
    let interval = cfg.master_failback_interval;
    let mut chan = ReqChannel::new(ident, master.req_addr, false)
        .with_source(cfg.source_address)
        .with_transport(master.transport)
        .with_tls(master.tls);
    loop {
        tokio::time::sleep(interval).await;
        if chan.ping(interval.max(Duration::from_secs(1))).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::reauth_wait;

    #[test]
    fn random_reauth_delay_reaches_the_link_and_bounds_a_random_wait() {
        let cfg = saltgate_config::salt_minion::parse_minion(
            "master: 127.0.0.1\nrandom_reauth_delay: 3\n",
            None,
        )
        .unwrap()
        .config;
        let lc = link_config(&cfg, "127.0.0.1:4506".parse().unwrap());
        assert_eq!(lc.reauth_delay, Duration::from_secs(3));
        let d = MinionConfig::default();
        assert_eq!(
            link_config(&d, "127.0.0.1:4506".parse().unwrap()).reauth_delay,
            Duration::from_secs(10),
            "Salt's default"
        );
        assert_eq!(reauth_wait(Duration::ZERO), Duration::ZERO);
        let max = Duration::from_millis(200);
        let waits: Vec<Duration> = (0..200).map(|_| reauth_wait(max)).collect();
        assert!(waits.iter().all(|w| *w <= max), "{waits:?}");
        let distinct: std::collections::BTreeSet<_> = waits.iter().collect();
        assert!(distinct.len() > 20, "the wait is random: {distinct:?}");
    }

    #[test]
    fn transport_and_ssl_reach_every_link() {
        let cfg = saltgate_config::salt_minion::parse_minion(
            "master: 127.0.0.1\ntransport: tcp\nssl: {cert_reqs: CERT_NONE}\n",
            None,
        )
        .unwrap()
        .config;
        let tls = MinionTls::load(cfg.ssl.as_ref().unwrap()).unwrap();
        let lc = link_for(&cfg, "127.0.0.1:4506".parse().unwrap(), Some(&tls));
        assert_eq!(lc.transport, Transport::Tcp);
        assert!(lc.tls.is_some());
        let d = link_config(&MinionConfig::default(), "127.0.0.1:4506".parse().unwrap());
        assert_eq!(d.transport, Transport::Zeromq);
        assert!(d.tls.is_none());
        // A file that is not there is told at start, naming the key.
        let missing = SslConfig {
            ca_certs: Some("/nonexistent/ca.pem".into()),
            ..SslConfig::default()
        };
        let e = MinionTls::load(&missing).err().unwrap().to_string();
        assert!(e.contains("ssl.ca_certs"), "{e}");
    }
}
