//! One side of the demo: a saltgate (L4 or fan-out) in front of the shared master cluster and
//! its own swarm of minions, and what the demo reads from that saltgate's admin API and
//! `/metrics`. It does not publish jobs (`stream` does) nor judge them (`report`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Result};
use saltgate_bench::lab::{
    get_json, http_get, master_states, publish_sessions, start_saltgate_in, wait_until, Backend,
    Gate, GateMode,
};
use saltgate_config::salt_minion::MasterAddr;
use saltgate_minion::swarm::{minion_id, run_swarm, SwarmOptions};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// The publish listener's mode on a side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    L4,
    Fanout,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::L4 => "L4",
            Mode::Fanout => "fan-out",
        }
    }

    /// The swarm's id prefix: `demo-l4-0`, `demo-fo-0`, ...; `demo-*` targets both sides.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Mode::L4 => "demo-l4-",
            Mode::Fanout => "demo-fo-",
        }
    }
}

pub struct Side {
    pub mode: Mode,
    pub gate: Gate,
    pub ids: BTreeSet<String>,
    /// Stops saltgate when dropped.
    _gate_stop: oneshot::Sender<()>,
    swarm: Option<(watch::Sender<bool>, JoinHandle<()>)>,
}

impl Side {
    /// Starts saltgate on `addrs` (publish, request, admin) in front of `masters`. Fan-out
    /// forwards the first copy of each job: `cluster_pki_dir` is the masters' shared one.
    pub async fn start(
        mode: Mode,
        addrs: [SocketAddr; 3],
        masters: &[Backend],
        cluster_pki_dir: &Path,
    ) -> Result<Self> {
        let gate_mode = match mode {
            Mode::L4 => GateMode::L4,
            Mode::Fanout => GateMode::Fanout {
                dedup: Some(cluster_pki_dir.to_path_buf()),
            },
        };
        let (stop, stop_rx) = oneshot::channel::<()>();
        let gate = start_saltgate_in(addrs, masters, gate_mode, stop_rx)
            .await
            .map_err(|e| anyhow!("{} saltgate: {e:#}", mode.label()))?;
        Ok(Side {
            mode,
            gate,
            ids: BTreeSet::new(),
            _gate_stop: stop,
            swarm: None,
        })
    }

    pub fn label(&self) -> &'static str {
        self.mode.label()
    }

    pub fn admin(&self) -> SocketAddr {
        self.gate.admin
    }

    /// Starts `n` minions pointed at this saltgate, keys in `pki_dir` (one shared key).
    pub fn start_swarm(&mut self, n: usize, pki_dir: PathBuf) {
        let prefix = self.mode.id_prefix();
        let opts = SwarmOptions {
            count: n,
            master: MasterAddr {
                host: self.gate.request.ip().to_string(),
                port: self.gate.request.port(),
            },
            id_prefix: prefix.to_string(),
            id_start: 0,
            pki_dir,
            shared_key: true,
            report_every: Duration::from_secs(24 * 3600),
            json: false,
            duration: None,
            start_rate: 500,
            acceptance_wait_time: Duration::from_secs(1),
            publish_port: Some(self.gate.publish.port()),
            pillar: false,
            transport: Default::default(),
        };
        self.ids = (0..n).map(|i| minion_id(prefix, i)).collect();
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            if let Err(e) = run_swarm(opts, stop_rx).await {
                println!("  swarm ended: {e}");
            }
        });
        self.swarm = Some((stop, task));
    }

    /// Stops the swarm and waits (up to 5 s) for it to end.
    pub async fn stop_swarm(&mut self) {
        if let Some((stop, task)) = self.swarm.take() {
            let _ = stop.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }

    /// Waits until saltgate's health checks pass on every master.
    pub async fn wait_healthy(&self, limit: Duration) -> Result<()> {
        let admin = self.admin();
        wait_until(
            limit,
            &format!(
                "{} saltgate's health checks pass on every master",
                self.label()
            ),
            move || async move {
                let v = get_json(admin, "/api/v1/masters").await?;
                let list = v["masters"].as_array().cloned().unwrap_or_default();
                Ok(!list.is_empty()
                    && list.iter().all(|m| {
                        m["state"] == "up"
                            && m["publish"]["last_check"]["ok"] == true
                            && m["request"]["last_check"]["ok"] == true
                    }))
            },
        )
        .await
    }

    /// Waits until every minion of the side holds a publish session.
    pub async fn wait_connected(&self, limit: Duration) -> Result<()> {
        let (admin, n) = (self.admin(), self.ids.len() as u64);
        wait_until(
            limit,
            &format!("every {} minion holds a publish session", self.label()),
            move || async move {
                Ok(publish_metric(admin, "saltgate_listener_sessions_current").await? >= n)
            },
        )
        .await
    }

    /// L4: every publish session is on a master other than `victim` (the minions that were on
    /// it have reconnected). Fan-out sessions sit on no master: always true.
    pub async fn sessions_off(&self, victim: &str) -> Result<bool> {
        if self.mode == Mode::Fanout {
            return Ok(true);
        }
        let s = publish_sessions(self.admin()).await?;
        let on_victim = s.get(victim).map_or(0, Vec::len);
        let total: usize = s.values().map(Vec::len).sum();
        Ok(on_victim == 0 && total >= self.ids.len())
    }

    /// Publish sessions this saltgate has accepted since it started.
    pub async fn publish_sessions_accepted(&self) -> Result<u64> {
        publish_metric(self.admin(), "saltgate_listener_sessions_total").await
    }

    /// Where the minions' publish sessions are: per master (L4, from `/api/v1/sessions`) or the
    /// hub's upstreams and sessions (fan-out, from `/api/v1/fanout`).
    pub async fn print_placement(&self) {
        let admin = self.admin();
        match self.mode {
            Mode::L4 => match (publish_sessions(admin).await, master_states(admin).await) {
                (Ok(s), Ok(states)) => {
                    println!("  L4: minion publish sessions per master (http://{admin}/api/v1/sessions):");
                    for (name, state) in &states {
                        let n = s.get(name).map_or(0, Vec::len);
                        println!("    {name:<8} {state:<6} {n:>4} minions, each tunnelled to this one master");
                    }
                }
                (Err(e), _) | (_, Err(e)) => println!("  L4: sessions unavailable: {e:#}"),
            },
            Mode::Fanout => match get_json(admin, "/api/v1/fanout").await {
                Ok(v) => {
                    let ups: Vec<String> = v["upstreams"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|u| {
                            format!(
                                "{} {}",
                                u["master"].as_str().unwrap_or("?"),
                                if u["connected"] == true { "up" } else { "down" }
                            )
                        })
                        .collect();
                    println!(
                        "  fan-out: {} minion sessions on saltgate itself, which subscribes to every master \
                         (http://{admin}/api/v1/fanout): {}",
                        v["sessions"],
                        ups.join(", ")
                    );
                }
                Err(e) => println!("  fan-out: hub unavailable: {e:#}"),
            },
        }
    }
}

/// The value of `name{listener="publish"}` on saltgate's `/metrics`.
async fn publish_metric(admin: SocketAddr, name: &str) -> Result<u64> {
    let text = http_get(admin, "/metrics").await?;
    metric_value(&text, name, "listener=\"publish\"")
        .ok_or_else(|| anyhow!("no {name}{{listener=\"publish\"}} on http://{admin}/metrics"))
}

/// The value of the sample of `name` whose labels contain `label`, from Prometheus text.
fn metric_value(text: &str, name: &str, label: &str) -> Option<u64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') && rest.contains(label))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_read_by_name_and_label_not_by_prefix() {
        let text = "# HELP saltgate_listener_sessions_total x\n\
                    saltgate_listener_sessions_total_other{listener=\"publish\"} 9\n\
                    saltgate_listener_sessions_total{listener=\"request\"} 7\n\
                    saltgate_listener_sessions_total{listener=\"publish\"} 50\n";
        assert_eq!(
            metric_value(
                text,
                "saltgate_listener_sessions_total",
                "listener=\"publish\""
            ),
            Some(50)
        );
        assert_eq!(
            metric_value(
                text,
                "saltgate_listener_sessions_current",
                "listener=\"publish\""
            ),
            None
        );
    }
}
