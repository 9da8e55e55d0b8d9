//! saltgate with `on_master_down: migrate` over masters whose health the test scripts: the
//! request-continuity tests' lab, on ZeroMQ (request_continuity.rs), plain `tcp`
//! (request_continuity_tcp.rs) and `ws` (request_continuity_ws.rs).

use std::net::SocketAddr;
use std::sync::Arc;

use saltgate_config::transport::SaltTransport;
use saltgate_config::{Balance, MasterConfig, OnMasterDown};
use saltgate_proxy::accesslog::{AccessRecord, MemorySink};
use saltgate_proxy::{Options, Running};

use super::api::{run_with, wait_for_metric};
use super::mode_master::{health, ModeMaster};
use super::{config_on, wait_for, ScriptedProber};

/// [`lab`] over fake masters.
pub async fn lab_of<S>(
    ip: &str,
    masters: &[&ModeMaster<S>],
    transport: SaltTransport,
    migrate_buffer: u32,
) -> Lab {
    let configs = masters.iter().map(|m| m.config()).collect();
    lab(ip, configs, transport, migrate_buffer).await
}

pub struct Lab {
    pub r: Running,
    pub _stop: tokio::sync::oneshot::Sender<()>,
    pub prober: Arc<ScriptedProber>,
    pub log: Arc<MemorySink>,
}

/// saltgate on `ip` over `masters` on `transport` (balance first: a session starts on the
/// first), `on_master_down: migrate` with `migrate_buffer` bytes; returns once every master is UP.
pub async fn lab(
    ip: &str,
    masters: Vec<MasterConfig>,
    transport: SaltTransport,
    migrate_buffer: u32,
) -> Lab {
    let names: Vec<String> = masters.iter().map(|m| m.name.clone()).collect();
    let mut cfg = config_on(ip, masters, health());
    cfg.global.transport = transport;
    cfg.request.balance = Balance::First;
    cfg.request.on_master_down = OnMasterDown::Migrate;
    cfg.request.migrate_buffer = migrate_buffer;
    let prober = Arc::new(ScriptedProber::default());
    let log = Arc::new(MemorySink::default());
    let (r, stop) = run_with(
        cfg,
        Options {
            prober: prober.clone(),
            access_log: log.clone(),
            ..Default::default()
        },
    )
    .await;
    for n in &names {
        wait_for("masters UP", || r.master(n).unwrap().is_up()).await;
    }
    Lab {
        r,
        _stop: stop,
        prober,
        log,
    }
}

impl Lab {
    pub fn admin(&self) -> SocketAddr {
        self.r.admin_addr().unwrap()
    }

    pub async fn metric(&self, name: &str, labels: &[(&str, &str)], want: f64) {
        wait_for_metric(self.admin(), name, labels, want).await
    }

    /// The session's access record, once written.
    pub async fn record(&self) -> AccessRecord {
        wait_for("the access record", || !self.log.records().is_empty()).await;
        self.log.records()[0].clone()
    }
}
