//! One immutable view of what the proxy runs from: the configuration, the masters (with their
//! shared run-time state) and each listener's selector. The data path loads it once per accepted
//! connection and never locks; a reload (issue 4) builds a new one and swaps it in once.

use std::net::SocketAddr;
use std::sync::Arc;

use saltgate_config::{Config, Role};

use crate::master::Master;
use crate::selection::{self, Selector};

pub struct Snapshot {
    /// Increases by one with every configuration applied.
    pub generation: u64,
    pub config: Config,
    pub masters: Vec<Arc<Master>>,
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

impl Snapshot {
    /// Resolves every master and builds the snapshot.
    pub async fn build(config: Config, generation: u64) -> Result<Snapshot, ResolveError> {
        let mut masters = Vec::with_capacity(config.masters.len());
        for m in &config.masters {
            let publish = resolve(&m.name, &m.host, m.publish_port).await?;
            let request = resolve(&m.name, &m.host, m.request_port).await?;
            masters.push(Arc::new(Master::new(m.clone(), [publish, request])));
        }
        let n = masters.len();
        let selectors = [
            selection::for_balance(config.publish.balance, n),
            selection::for_balance(config.request.balance, n),
        ];
        Ok(Snapshot {
            generation,
            config,
            masters,
            selectors,
        })
    }

    pub fn selector(&self, role: Role) -> &dyn Selector {
        self.selectors[role as usize].as_ref()
    }

    pub fn master(&self, name: &str) -> Option<&Arc<Master>> {
        self.masters.iter().find(|m| m.name() == name)
    }
}
