//! One immutable view of what the proxy runs from: the configuration, the masters (with their
//! shared run-time state) and each listener's selector, built here ([`for_listener`]). The data path loads it once per accepted
//! connection and never locks; a reload builds a new one and swaps it in once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use saltgate_config::{Balance, Config, ListenerConfig, MasterConfig, Role};
use tokio_util::sync::CancellationToken;

use crate::data::future::BoxFuture;
use crate::ops::metrics::{MasterHandles, Metrics};
use crate::select::failback::First;
use crate::select::master::Master;
use crate::select::selection::{self, Selector};
use crate::select::transport_probe::ProbeTransport;

/// Builds the selector for a listener's `balance`.
pub fn for_balance(b: Balance, n_masters: usize) -> Box<dyn Selector> {
    match b {
        Balance::First => Box::new(First {
            failback: saltgate_config::Failback::After(std::time::Duration::ZERO),
        }),
        Balance::RoundRobin => Box::new(selection::RoundRobin::new(n_masters)),
        Balance::LeastConn => Box::new(selection::LeastConn),
        Balance::Source => Box::new(selection::SourceHash),
    }
}

/// Builds a listener's selector: as its `balance` says, except that while rebalancing is on (see
/// [`crate::select::rebalance`]) the publish listener places each new session on the least loaded master
/// (weights respected), so moved minions land where they are wanted. `source` keeps its affinity.
pub fn for_listener(l: &ListenerConfig, n_masters: usize) -> Box<dyn Selector> {
    if l.balance == Balance::First {
        Box::new(First {
            failback: l.failback,
        })
    } else if l.role == Role::Publish && selection::applies(&l.rebalance, l.balance) {
        Box::new(selection::LeastLoaded {
            rr: selection::RoundRobin::new(n_masters),
        })
    } else {
        for_balance(l.balance, n_masters)
    }
}

pub struct Snapshot {
    /// The masters whose host did not resolve (they are in `masters`, DOWN in state `unresolved`).
    pub unresolved: Vec<ResolveError>,
    /// Increases by one with every configuration applied (1 at start).
    pub generation: u64,
    pub config: Config,
    pub masters: Vec<Arc<Master>>,
    /// The session metrics of `masters[i]`, resolved once per snapshot (not per session).
    pub handles: Vec<Arc<MasterHandles>>,
    /// Indexed by `Role as usize`.
    pub selectors: [Box<dyn Selector>; 2],
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("generation", &self.generation)
            .field("masters", &self.masters.len())
            .finish()
    }
}

/// A master's host could not be resolved.
#[derive(Debug, Clone, thiserror::Error)]
#[error("master {master}: cannot resolve {host:?}: {reason}; use an IP address or a name this host can resolve")]
pub struct ResolveError {
    pub master: String,
    pub host: String,
    pub reason: String,
}

/// No master at all resolved: nothing to serve. (Some unresolved masters beside resolved ones are
/// not an error: they start DOWN in state `unresolved` and are retried.)
#[derive(Debug, thiserror::Error)]
#[error("no master resolves:\n{}", .0.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
pub struct NoMasterResolves(pub Vec<ResolveError>);

/// How long the lookup of one master's host may take (a reload holds the reload lock meanwhile).
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Looks a host up; the first address, port 0.
pub type Lookup = fn(String) -> BoxFuture<Result<SocketAddr, String>>;

pub fn system_lookup(host: String) -> BoxFuture<Result<SocketAddr, String>> {
    Box::pin(async move {
        tokio::net::lookup_host((host.as_str(), 0))
            .await
            .map_err(|e| e.to_string())?
            .next()
            .ok_or_else(|| "no address".to_string())
    })
}

/// Resolves every master's host, all at once (each distinct host once), each lookup bounded by
/// `timeout`. Returns `[publish, request]` or the failure per master, in order.
pub async fn resolve_all(
    masters: &[MasterConfig],
    timeout: Duration,
    lookup: Lookup,
) -> Vec<Result<[SocketAddr; 2], ResolveError>> {
    let mut lookups = tokio::task::JoinSet::new();
    let mut hosts: HashMap<String, Result<SocketAddr, String>> = HashMap::new();
    for m in masters {
        if hosts.contains_key(&m.host) {
            continue;
        }
        hosts.insert(m.host.clone(), Err("not looked up".into()));
        let host = m.host.clone();
        let fut = lookup(host.clone());
        lookups.spawn(async move {
            let r = tokio::time::timeout(timeout, fut)
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")));
            (host, r)
        });
    }
    while let Some(done) = lookups.join_next().await {
        if let Ok((host, r)) = done {
            hosts.insert(host, r);
        }
    }
    masters
        .iter()
        .map(|m| match &hosts[&m.host] {
            Ok(a) => Ok([m.publish_port, m.request_port].map(|p| {
                let mut a = *a;
                a.set_port(p);
                a
            })),
            Err(reason) => Err(ResolveError {
                master: m.name.clone(),
                host: m.host.clone(),
                reason: reason.clone(),
            }),
        })
        .collect()
}

/// What a new snapshot changes in the master set.
#[derive(Default)]
pub struct MasterDiff {
    /// Masters carried over (same name, addresses and `check`), with their new configuration to apply
    /// once the snapshot is in force.
    pub kept: Vec<(Arc<Master>, MasterConfig)>,
    /// New masters: their checks start once the snapshot is in force.
    pub added: Vec<Arc<Master>>,
    /// Masters of the old snapshot that are gone: no new sessions, live ones drained.
    pub removed: Vec<Arc<Master>>,
}

impl Snapshot {
    /// Resolves every master and builds the snapshot, reusing the masters of `old` whose name,
    /// resolved addresses and `check` setting are unchanged (their health and sessions carry over).
    pub async fn build(
        config: Config,
        generation: u64,
        old: Option<&Snapshot>,
        checks_parent: &CancellationToken,
        metrics: &Metrics,
    ) -> Result<(Snapshot, MasterDiff), NoMasterResolves> {
        Self::build_with(
            config,
            generation,
            old,
            checks_parent,
            metrics,
            system_lookup,
        )
        .await
    }

    /// [`Snapshot::build`] with the given host lookup.
    pub async fn build_with(
        config: Config,
        generation: u64,
        old: Option<&Snapshot>,
        checks_parent: &CancellationToken,
        metrics: &Metrics,
        lookup: Lookup,
    ) -> Result<(Snapshot, MasterDiff), NoMasterResolves> {
        let mut diff = MasterDiff::default();
        let mut masters = Vec::with_capacity(config.masters.len());
        let resolved = resolve_all(&config.masters, RESOLVE_TIMEOUT, lookup).await;
        let unresolved: Vec<ResolveError> = resolved
            .iter()
            .filter_map(|r| r.as_ref().err().cloned())
            .collect();
        if !resolved.is_empty() && unresolved.len() == resolved.len() {
            return Err(NoMasterResolves(unresolved));
        }
        for (m, addrs) in config.masters.iter().zip(resolved) {
            let same = old.and_then(|o| {
                o.masters.iter().find(|x| {
                    x.cfg().name == m.name
                        && x.cfg().check == m.check
                        && match &addrs {
                            Ok(a) => !x.upstream.is_unresolved() && x.addrs == *a,
                            Err(_) => x.upstream.is_unresolved(),
                        }
                })
            });
            match same {
                Some(x) => {
                    diff.kept.push((x.clone(), m.clone()));
                    masters.push(x.clone());
                }
                None => {
                    let x = match addrs {
                        Ok(a) => Master::new(m.clone(), a, checks_parent),
                        Err(e) => {
                            // Placeholder addresses: an unresolved master is never selected nor checked.
                            let a = [m.publish_port, m.request_port]
                                .map(|p| SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, p)));
                            let x = Master::new(m.clone(), a, checks_parent);
                            x.upstream.set_unresolved(&e.reason);
                            x
                        }
                    };
                    let x = Arc::new(x);
                    diff.added.push(x.clone());
                    masters.push(x);
                }
            }
        }
        if let Some(o) = old {
            diff.removed = o
                .masters
                .iter()
                .filter(|x| !masters.iter().any(|m| Arc::ptr_eq(m, x)))
                .cloned()
                .collect();
        }
        let probe_transport = ProbeTransport::prepare(&config.global);
        for m in &masters {
            m.set_probe_transport(probe_transport.clone());
        }
        let handles = masters
            .iter()
            .map(|m| Arc::new(MasterHandles::new(metrics, &m.name())))
            .collect();
        let n = masters.len();
        let selectors = [
            for_listener(&config.publish, n),
            for_listener(&config.request, n),
        ];
        Ok((
            Snapshot {
                unresolved,
                generation,
                config,
                masters,
                handles,
                selectors,
            },
            diff,
        ))
    }

    pub fn selector(&self, role: Role) -> &dyn Selector {
        self.selectors[role as usize].as_ref()
    }

    pub fn master(&self, name: &str) -> Option<&Arc<Master>> {
        self.masters.iter().find(|m| m.cfg().name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use saltgate_config::HealthSettings;

    fn masters(hosts: &[&str]) -> Vec<MasterConfig> {
        hosts
            .iter()
            .enumerate()
            .map(|(i, h)| MasterConfig {
                name: format!("m{i}"),
                host: h.to_string(),
                publish_port: 4505,
                request_port: 4506,
                weight: 1,
                maxconn: None,
                backup: false,
                disabled: false,
                check: false,
                health: HealthSettings::default(),
            })
            .collect()
    }

    /// "slow-N" answers 10.0.0.N after a second; "hang" never answers.
    fn scripted(host: String) -> BoxFuture<Result<SocketAddr, String>> {
        Box::pin(async move {
            match host.strip_prefix("slow-") {
                Some(n) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let n: u8 = n.parse().map_err(|_| "bad name".to_string())?;
                    Ok(SocketAddr::from(([10, 0, 0, n], 0)))
                }
                None => std::future::pending().await,
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn masters_resolve_at_once_not_one_after_another() {
        let hosts: Vec<String> = (1..=10).map(|i| format!("slow-{i}")).collect();
        let refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let t0 = tokio::time::Instant::now();
        let r: Vec<_> = resolve_all(&masters(&refs), RESOLVE_TIMEOUT, scripted)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert_eq!(r[9][0], "10.0.0.10:4505".parse().unwrap());
        assert_eq!(r[9][1], "10.0.0.10:4506".parse().unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lookup_that_never_answers_fails_at_the_timeout_naming_the_master() {
        let t0 = tokio::time::Instant::now();
        let r = resolve_all(&masters(&["slow-1", "hang"]), RESOLVE_TIMEOUT, scripted).await;
        assert!(r[0].is_ok());
        let e = r[1].clone().unwrap_err();
        assert_eq!(t0.elapsed(), RESOLVE_TIMEOUT);
        assert_eq!((e.master.as_str(), e.host.as_str()), ("m1", "hang"));
        assert!(e.to_string().contains("no answer within"), "{e}");
    }

    fn dns_down(host: String) -> BoxFuture<Result<SocketAddr, String>> {
        Box::pin(async move {
            match host.as_str() {
                "ghost" => Err("Name or service not known".to_string()),
                _ => Ok(SocketAddr::from(([127, 0, 7, 9], 0))),
            }
        })
    }

    fn dns_up(_host: String) -> BoxFuture<Result<SocketAddr, String>> {
        Box::pin(async move { Ok(SocketAddr::from(([127, 0, 7, 9], 0))) })
    }

    fn config(hosts: &[&str]) -> Config {
        let mut c = saltgate_config::parse(
            saltgate_config::EMBEDDED_DEFAULT,
            None,
            saltgate_config::Format::Yaml,
        )
        .unwrap()
        .config;
        c.masters = masters(hosts);
        c
    }

    #[tokio::test]
    async fn an_unresolved_master_is_down_and_replaced_once_it_resolves_others_kept() {
        let stop = CancellationToken::new();
        let metrics = Metrics::new();
        let cfg = config(&["ok", "ghost"]);
        let (first, diff) = Snapshot::build_with(cfg.clone(), 1, None, &stop, &metrics, dns_down)
            .await
            .unwrap();
        assert_eq!(diff.added.len(), 2);
        assert_eq!(first.unresolved.len(), 1);
        assert_eq!(
            first.masters[1].state(),
            crate::select::master::MasterState::Unresolved
        );
        assert!(!first.masters[1].is_available());
        assert!(first.masters[0].is_available());
        // Still down: the unresolved master is carried over, not rebuilt.
        let (again, _) =
            Snapshot::build_with(cfg.clone(), 2, Some(&first), &stop, &metrics, dns_down)
                .await
                .unwrap();
        assert!(Arc::ptr_eq(&first.masters[1], &again.masters[1]));
        // It resolves: a new master replaces it; the other one is kept with its health.
        let (next, diff) = Snapshot::build_with(cfg, 3, Some(&again), &stop, &metrics, dns_up)
            .await
            .unwrap();
        assert!(next.unresolved.is_empty());
        assert!(Arc::ptr_eq(&again.masters[0], &next.masters[0]));
        assert_eq!(diff.added.len(), 1);
        assert_eq!(
            next.masters[1].state(),
            crate::select::master::MasterState::Up
        );
    }

    #[tokio::test]
    async fn no_master_resolving_is_an_error_listing_each_host() {
        let e = Snapshot::build_with(
            config(&["ghost", "ghost"]),
            1,
            None,
            &CancellationToken::new(),
            &Metrics::new(),
            dns_down,
        )
        .await
        .err()
        .unwrap();
        assert_eq!(e.0.len(), 2);
        assert!(
            e.to_string().contains("m0") && e.to_string().contains("m1"),
            "{e}"
        );
    }
}
