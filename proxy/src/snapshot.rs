//! One immutable view of what the proxy runs from: the configuration, the masters (with their
//! shared run-time state) and each listener's selector. The data path loads it once per accepted
//! connection and never locks; a reload builds a new one and swaps it in once.

use std::net::SocketAddr;
use std::sync::Arc;

use saltgate_config::{Config, MasterConfig, Role};
use tokio_util::sync::CancellationToken;

use crate::master::Master;
use crate::metrics::{MasterHandles, Metrics};
use crate::selection::{self, Selector};

pub struct Snapshot {
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
#[derive(Debug, thiserror::Error)]
#[error("master {master}: cannot resolve {host:?}: {reason} (fix: use an IP address or a name this host can resolve)")]
pub struct ResolveError {
    pub master: String,
    pub host: String,
    pub reason: String,
}

async fn resolve(name: &str, host: &str, port: u16) -> Result<SocketAddr, ResolveError> {
    let err = |reason: String| ResolveError {
        master: name.to_string(),
        host: host.to_string(),
        reason,
    };
    let mut addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| err(e.to_string()))?;
    addrs.next().ok_or_else(|| err("no address".to_string()))
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
    ) -> Result<(Snapshot, MasterDiff), ResolveError> {
        let mut diff = MasterDiff::default();
        let mut masters = Vec::with_capacity(config.masters.len());
        for m in &config.masters {
            let addrs = [
                resolve(&m.name, &m.host, m.publish_port).await?,
                resolve(&m.name, &m.host, m.request_port).await?,
            ];
            let same = old.and_then(|o| {
                o.masters.iter().find(|x| {
                    x.cfg().name == m.name && x.addrs == addrs && x.cfg().check == m.check
                })
            });
            match same {
                Some(x) => {
                    diff.kept.push((x.clone(), m.clone()));
                    masters.push(x.clone());
                }
                None => {
                    let x = Arc::new(Master::new(m.clone(), addrs, checks_parent));
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
        let handles = masters
            .iter()
            .map(|m| Arc::new(MasterHandles::new(metrics, &m.name())))
            .collect();
        let n = masters.len();
        let selectors = [
            selection::for_balance(config.publish.balance, n),
            selection::for_balance(config.request.balance, n),
        ];
        Ok((
            Snapshot {
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
