//! saltgate with `on_master_down: migrate` over masters whose health the test scripts: the
//! request-continuity tests' lab, on ZeroMQ (request_continuity.rs), plain `tcp`
//! (request_continuity_tcp.rs) and `ws` (request_continuity_ws.rs).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex};

use saltgate_config::transport::SaltTransport;
use saltgate_config::{Balance, Config, MasterConfig, OnMasterDown};
use saltgate_proxy::accesslog::{AccessRecord, MemorySink};
use saltgate_proxy::close::CloseReason;
use saltgate_proxy::{Options, Running};
use tokio::net::TcpStream;

use super::api::{run_with, wait_for_metric};
use super::mode_master::{ModeMaster, ANSWER};
use super::{config_on, scripted_health, wait_for, ScriptedProber};

/// Fake masters `a` (on `ips[0]`, in `a_mode`) and `b` (on `ips[1]`, answering), each
/// connection served by `serve`, and the [`lab`] on `gate` over them.
pub async fn pair<S, F, Fut>(
    gate: &str,
    transport: SaltTransport,
    ips: [&str; 2],
    a_mode: u8,
    migrate_buffer: u32,
    serve: F,
) -> (ModeMaster<S>, ModeMaster<S>, Lab)
where
    S: Default + Send + 'static,
    F: Fn(&'static str, TcpStream, Arc<AtomicU8>, Arc<Mutex<S>>) -> Fut + Copy + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let a = ModeMaster::serving("a", ips[0], a_mode, serve).await;
    let b = ModeMaster::serving("b", ips[1], ANSWER, serve).await;
    let lab = lab_of(gate, &[&a, &b], transport, migrate_buffer).await;
    (a, b, lab)
}

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
    let mut cfg = config_on(ip, masters, scripted_health());
    cfg.global.transport = transport;
    cfg.request.balance = Balance::First;
    cfg.request.on_master_down = OnMasterDown::Migrate;
    cfg.request.migrate_buffer = migrate_buffer;
    let lab = run_scripted(cfg).await;
    for n in &names {
        wait_for("masters UP", || lab.r.master(n).unwrap().is_up()).await;
    }
    lab
}

/// saltgate on `cfg` with a scripted prober and an in-memory access log; returns at once.
pub async fn run_scripted(cfg: Config) -> Lab {
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

    /// One request session moved (`saltgate_request_sessions_migrated_total{labels}` is 1).
    pub async fn migrated(&self, labels: &[(&str, &str)]) {
        self.metric("saltgate_request_sessions_migrated_total", labels, 1.0)
            .await
    }

    /// One whole request re-sent (`saltgate_requests_replayed_total{request="complete"}` is 1).
    pub async fn replayed_complete(&self) {
        self.metric(
            "saltgate_requests_replayed_total",
            &[("request", "complete")],
            1.0,
        )
        .await
    }

    /// One migration skipped for `reason` (`saltgate_request_migrations_skipped_total`).
    pub async fn skipped(&self, reason: &str) {
        self.metric(
            "saltgate_request_migrations_skipped_total",
            &[("reason", reason)],
            1.0,
        )
        .await
    }

    /// The session (its minion gone) moved once, to `master`, and closed with no skip.
    pub async fn moved_once_to(&self, master: &str) {
        let rec = self.record().await;
        assert_eq!(rec.master.as_deref(), Some(master));
        assert_eq!((rec.migrations, rec.migrate_skip), (1, None));
    }

    /// The session closed as before a migration (the master's EOF or reset), its requests over
    /// the cap (`migrate_skip: over-cap`).
    pub async fn closed_over_cap(&self) {
        let rec = self.record().await;
        assert!(matches!(
            rec.reason,
            CloseReason::MasterEof | CloseReason::MasterReset
        ));
        assert_eq!(rec.migrate_skip, Some("over-cap"));
    }

    /// The session's access record, once written.
    pub async fn record(&self) -> AccessRecord {
        wait_for("the access record", || !self.log.records().is_empty()).await;
        self.log.records()[0].clone()
    }
}
