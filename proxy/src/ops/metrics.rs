//! Every Prometheus metric saltgate exports, declared here and listed in docs/operations.md. The registry
//! is created here and passed around (never the global one).
//!
//! Counters and histograms are updated where things happen; per-master state and live-session
//! gauges are read from the current snapshot at scrape time ([`MasterCollector`]), so a removed
//! master disappears from them and nothing goes stale.

use std::sync::{Arc, OnceLock};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use saltgate_config::Role;

use crate::data::close::CloseReason;
use crate::ops::ratelimit::LogLimit;
use crate::select::master::{Master, MasterState};

pub struct Metrics {
    pub registry: Registry,
    /// `saltgate_listener_sessions_total{listener}`: client connections accepted.
    pub sessions_total: IntCounterVec,
    /// `saltgate_listener_sessions_current{listener}`: live client connections.
    pub sessions_current: IntGaugeVec,
    /// `saltgate_listener_bytes_total{listener,direction}`: `in` = client → master.
    pub bytes: IntCounterVec,
    /// `saltgate_listener_accept_errors_total{listener}`.
    pub accept_errors: IntCounterVec,
    /// `saltgate_listener_sessions_refused_total{listener,reason}`: `no-master`, `connect-failed`,
    /// `queue-timeout`, `queue-full` or `shutdown`.
    pub refused: IntCounterVec,
    /// `saltgate_listener_queue_current{listener}`: clients waiting for a master below its maxconn.
    pub queue_current: IntGaugeVec,
    /// `saltgate_listener_queued_total{listener}`: clients that had to wait in the queue.
    pub queued_total: IntCounterVec,
    /// `saltgate_master_check_duration_seconds{master,port}`.
    pub check_duration: HistogramVec,
    /// `saltgate_master_check_failures_total{master,port}`.
    pub check_failures: IntCounterVec,
    /// `saltgate_master_check_busy_total{master,port}`: checks not counted because the master
    /// answered its minions' requests meanwhile (busy, not hung): a request ping with no answer
    /// in time, a publish greeting that came late, or none within 30 s of the port's last passed
    /// check (see [`crate::select::check`]).
    pub check_busy: IntCounterVec,
    /// `saltgate_master_state_changes_total{master,to}`: health flips, `to` = up or down.
    pub state_changes: IntCounterVec,
    /// `saltgate_master_connect_errors_total{master,port}`: session connects that failed.
    pub connect_errors: IntCounterVec,
    /// `saltgate_master_sessions_closed_total{master,port,reason}`.
    pub sessions_closed: IntCounterVec,
    /// `saltgate_reloads_total{result}`: ok, invalid (refused config), error (could not apply).
    pub reloads: IntCounterVec,
    /// `saltgate_config_generation`: the configuration generation in force (1 at start).
    pub generation: IntGauge,
    /// `saltgate_local_resource_errors_total{during}`: a probe (`check`) or a session's connect
    /// (`connect`) failed for want of a local resource (EMFILE, ENFILE, ENOBUFS, ENOMEM); not
    /// counted against the master.
    pub local_resource_errors: IntCounterVec,
    /// `saltgate_master_resolve_failures_total{master}`: retried lookups of an unresolved master's
    /// host that failed again (the retry backs off from the health interval up to 60 s).
    pub resolve_failures: IntCounterVec,
    /// `saltgate_admin_connections_cut_total{reason}`: admin API connections saltgate closed:
    /// `evicted-idle` (the longest-idle one, to make room for a new connection when all slots
    /// are taken), `full` (every slot had a request in progress), `header-timeout` (no complete
    /// request headers in time).
    pub admin_cuts: IntCounterVec,
    /// Not a metric: the recent flips, reloads and checks the status page shows. Here because
    /// every task that reports something already holds the metrics.
    pub events: crate::ops::events::EventLog,
}

fn reg<C: Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    // Names are fixed and distinct: registering cannot fail.
    let _ = r.register(Box::new(c.clone()));
    c
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let r = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &r,
                IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        let m = Metrics {
            sessions_total: counter(
                "saltgate_listener_sessions_total",
                "Client connections accepted.",
                &["listener"],
            ),
            sessions_current: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "saltgate_listener_sessions_current",
                        "Live client connections.",
                    ),
                    &["listener"],
                )
                .expect("valid metric"),
            ),
            bytes: counter(
                "saltgate_listener_bytes_total",
                "Bytes forwarded; direction in = client to master, out = master to client.",
                &["listener", "direction"],
            ),
            accept_errors: counter(
                "saltgate_listener_accept_errors_total",
                "accept() failures.",
                &["listener"],
            ),
            refused: counter(
                "saltgate_listener_sessions_refused_total",
                "Client connections closed without a master (no-master, connect-failed, queue-timeout, queue-full, shutdown).",
                &["listener", "reason"],
            ),
            queue_current: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "saltgate_listener_queue_current",
                        "Clients waiting in the listener's queue for a master below its maxconn.",
                    ),
                    &["listener"],
                )
                .expect("valid metric"),
            ),
            queued_total: counter(
                "saltgate_listener_queued_total",
                "Clients that waited in the listener's queue (every master at its maxconn).",
                &["listener"],
            ),
            check_duration: reg(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "saltgate_master_check_duration_seconds",
                        "Health check duration.",
                    )
                    .buckets(vec![
                        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                        5.0,
                    ]),
                    &["master", "port"],
                )
                .expect("valid metric"),
            ),
            check_failures: counter(
                "saltgate_master_check_failures_total",
                "Failed health checks.",
                &["master", "port"],
            ),
            check_busy: counter(
                "saltgate_master_check_busy_total",
                "Checks not counted: the request ping got no answer in time, or the publish greeting came late, but the master answered minions' requests meanwhile (busy, not hung).",
                &["master", "port"],
            ),
            state_changes: counter(
                "saltgate_master_state_changes_total",
                "Health flips of a master (to = up or down).",
                &["master", "to"],
            ),
            connect_errors: counter(
                "saltgate_master_connect_errors_total",
                "Failed connects to a master for a session.",
                &["master", "port"],
            ),
            sessions_closed: counter(
                "saltgate_master_sessions_closed_total",
                "Sessions closed, by master, port and close reason.",
                &["master", "port", "reason"],
            ),
            reloads: counter(
                "saltgate_reloads_total",
                "Configuration reloads by result (ok, invalid, error).",
                &["result"],
            ),
            generation: reg(
                &r,
                IntGauge::new(
                    "saltgate_config_generation",
                    "Configuration generation in force.",
                )
                .expect("valid metric"),
            ),
            local_resource_errors: counter(
                "saltgate_local_resource_errors_total",
                "Probes (during=check) and session connects (during=connect) that failed for want of a local resource (descriptors, buffers, memory); not counted against the master.",
                &["during"],
            ),
            admin_cuts: counter(
                "saltgate_admin_connections_cut_total",
                "Admin API connections closed by saltgate (evicted-idle, full, header-timeout).",
                &["reason"],
            ),
            resolve_failures: counter(
                "saltgate_master_resolve_failures_total",
                "Retried lookups of an unresolved master's host that failed again.",
                &["master"],
            ),
            registry: r,
            events: crate::ops::events::EventLog::new(),
        };
        let build = IntGaugeVec::new(
            Opts::new("saltgate_build_info", "Build information."),
            &["version"],
        )
        .expect("valid metric");
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let _ = m.registry.register(Box::new(build));
        for role in Role::ALL {
            m.sessions_current.with_label_values(&[role.as_str()]);
            m.sessions_total.with_label_values(&[role.as_str()]);
            m.queue_current.with_label_values(&[role.as_str()]);
            m.queued_total.with_label_values(&[role.as_str()]);
            for d in ["in", "out"] {
                m.bytes.with_label_values(&[role.as_str(), d]);
            }
        }
        for r in ["ok", "invalid", "error"] {
            m.reloads.with_label_values(&[r]);
        }
        Arc::new(m)
    }

    /// Adds the collector of per-master gauges; `masters` gives the masters in force at scrape
    /// time (`None` once the proxy is gone).
    pub fn watch_masters(&self, masters: MasterSource) {
        let _ = self
            .registry
            .register(Box::new(MasterCollector::new(masters)));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// A listener's session metrics, resolved once (its labels never change): a session never looks a
/// label up.
pub struct ListenerHandles {
    role: Role,
    /// `saltgate_listener_sessions_total`.
    pub accepted: IntCounter,
    /// `saltgate_listener_sessions_current`.
    pub live: IntGauge,
    /// `saltgate_listener_bytes_total`, `in` (client → master) and `out`.
    pub bytes: [IntCounter; 2],
    refused_vec: IntCounterVec,
    refused: [OnceLock<IntCounter>; CloseReason::ALL.len()],
    /// The "no master available" line.
    pub no_master_log: LogLimit,
    /// `saltgate_listener_queued_total`.
    pub queued: IntCounter,
    /// The "client queued" line.
    pub queue_log: LogLimit,
}

impl ListenerHandles {
    pub fn new(m: &Metrics, role: Role) -> Self {
        let l = role.as_str();
        Self {
            role,
            accepted: m.sessions_total.with_label_values(&[l]),
            live: m.sessions_current.with_label_values(&[l]),
            bytes: [
                m.bytes.with_label_values(&[l, "in"]),
                m.bytes.with_label_values(&[l, "out"]),
            ],
            refused_vec: m.refused.clone(),
            refused: Default::default(),
            no_master_log: LogLimit::default(),
            queued: m.queued_total.with_label_values(&[l]),
            queue_log: LogLimit::default(),
        }
    }

    /// `saltgate_listener_sessions_refused_total{reason}` (resolved on first use, so the exposition
    /// lists only reasons that happened).
    pub fn refused(&self, reason: CloseReason) -> &IntCounter {
        self.refused[reason.index()].get_or_init(|| {
            self.refused_vec
                .with_label_values(&[self.role.as_str(), reason.as_str()])
        })
    }
}

/// A master's session metrics, resolved when a snapshot is built.
pub struct MasterHandles {
    name: String,
    /// `saltgate_master_connect_errors_total`, per port.
    pub connect_errors: [IntCounter; 2],
    closed_vec: IntCounterVec,
    closed: [[OnceLock<IntCounter>; CloseReason::ALL.len()]; 2],
    /// The "connect to master failed" line.
    pub connect_log: LogLimit,
    /// `saltgate_local_resource_errors_total{during="connect"}`.
    pub local_resource_errors: IntCounter,
}

impl MasterHandles {
    pub fn new(m: &Metrics, name: &str) -> Self {
        Self {
            name: name.to_string(),
            connect_errors: Role::ALL
                .map(|r| m.connect_errors.with_label_values(&[name, r.as_str()])),
            closed_vec: m.sessions_closed.clone(),
            closed: Default::default(),
            connect_log: LogLimit::default(),
            local_resource_errors: m.local_resource_errors.with_label_values(&["connect"]),
        }
    }

    /// `saltgate_master_sessions_closed_total{port,reason}` (resolved on first use).
    pub fn closed(&self, role: Role, reason: CloseReason) -> &IntCounter {
        self.closed[role as usize][reason.index()].get_or_init(|| {
            self.closed_vec
                .with_label_values(&[self.name.as_str(), role.as_str(), reason.as_str()])
        })
    }
}

/// `saltgate_master_state{master,state}` (1 for the current state of up, down, draining, disabled, unresolved, joining),
/// `saltgate_master_port_up{master,port}`, `saltgate_master_sessions_current{master,port}`, and
/// the configured session caps (only those set: `saltgate_master_maxconn{master}` per port,
/// `saltgate_listener_maxconn{listener}`, `saltgate_global_maxconn`), read from the snapshot at
/// scrape time.
pub struct MasterCollector {
    masters: MasterSource,
    descs: Vec<Desc>,
}

/// Where the collector finds the masters and caps in force (the control plane's snapshot).
pub type MasterSource = Box<dyn Fn() -> Option<InForce> + Send + Sync>;

/// What the per-master collector reads at scrape time.
pub struct InForce {
    pub masters: Vec<Arc<Master>>,
    /// `global.maxconn`.
    pub global_maxconn: Option<u32>,
    /// Each listener's `maxconn`.
    pub listener_maxconn: Vec<(Role, Option<u32>)>,
}

impl MasterCollector {
    fn new(masters: MasterSource) -> Self {
        let descs = Self::vecs()
            .iter()
            .flat_map(|v| v.desc().into_iter().cloned())
            .collect();
        Self { masters, descs }
    }

    fn vecs() -> [IntGaugeVec; 6] {
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        [
            IntGaugeVec::new(
                Opts::new(
                    "saltgate_master_state",
                    "1 for the master's current state (up, down, draining, disabled, unresolved, joining).",
                ),
                &["master", "state"],
            )
            .expect("valid metric"),
            IntGaugeVec::new(
                Opts::new(
                    "saltgate_master_port_up",
                    "1 when the port's health checks say UP.",
                ),
                &["master", "port"],
            )
            .expect("valid metric"),
            IntGaugeVec::new(
                Opts::new(
                    "saltgate_master_sessions_current",
                    "Live sessions on a master port.",
                ),
                &["master", "port"],
            )
            .expect("valid metric"),
            gauge(
                "saltgate_master_maxconn",
                "Configured cap on sessions per port of a master (only when set).",
                &["master"],
            ),
            gauge(
                "saltgate_listener_maxconn",
                "Configured cap on live sessions of a listener (only when set).",
                &["listener"],
            ),
            gauge(
                "saltgate_global_maxconn",
                "Configured cap on client sessions over all listeners (only when set).",
                &[],
            ),
        ]
    }
}

impl Collector for MasterCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let [state, port_up, sessions, master_max, listener_max, global_max] = Self::vecs();
        if let Some(in_force) = (self.masters)() {
            if let Some(n) = in_force.global_maxconn {
                global_max.with_label_values::<&str>(&[]).set(i64::from(n));
            }
            for (role, cap) in &in_force.listener_maxconn {
                if let Some(n) = cap {
                    listener_max
                        .with_label_values(&[role.as_str()])
                        .set(i64::from(*n));
                }
            }
            for m in &in_force.masters {
                if let Some(n) = m.cfg().maxconn {
                    master_max
                        .with_label_values(&[m.name().as_str()])
                        .set(i64::from(n));
                }
                let name = m.name();
                let now = m.state();
                for s in MasterState::ALL {
                    state
                        .with_label_values(&[name.as_str(), s.as_str()])
                        .set(i64::from(s == now));
                }
                for role in Role::ALL {
                    port_up
                        .with_label_values(&[name.as_str(), role.as_str()])
                        .set(i64::from(m.port_is_up(role)));
                    sessions
                        .with_label_values(&[name.as_str(), role.as_str()])
                        .set(i64::from(m.session_count(role)));
                }
            }
        }
        [
            state,
            port_up,
            sessions,
            master_max,
            listener_max,
            global_max,
        ]
        .iter()
        .flat_map(|v| v.collect())
        .collect()
    }
}
