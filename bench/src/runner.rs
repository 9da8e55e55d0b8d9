//! Runs the chosen scenarios: for each scenario, `repeat` rounds, and in each round every
//! target once (the order rotated each round, so no target always goes first); records the
//! machine's background load around it all; builds the report.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::procfs;
use crate::report::{self, Meta, Report};
use crate::scenarios::{self, Ctx, Sample};
use crate::stats::median;
use crate::targets::TargetKind;
use crate::BenchError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Idle,
    Connect,
    Rr,
    Throughput,
    Storm,
    Swarm,
}

impl Scenario {
    /// What `all` runs.
    pub const ALL: [Scenario; 6] = [
        Scenario::Idle,
        Scenario::Connect,
        Scenario::Rr,
        Scenario::Throughput,
        Scenario::Storm,
        Scenario::Swarm,
    ];

    pub fn parse(s: &str) -> Option<Scenario> {
        Some(match s {
            "idle" => Scenario::Idle,
            "connect" => Scenario::Connect,
            "rr" => Scenario::Rr,
            "throughput" => Scenario::Throughput,
            "storm" => Scenario::Storm,
            "swarm" => Scenario::Swarm,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Idle => "idle",
            Scenario::Connect => "connect",
            Scenario::Rr => "rr",
            Scenario::Throughput => "throughput",
            Scenario::Storm => "storm",
            Scenario::Swarm => "swarm",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub scenarios: Vec<Scenario>,
    pub targets: Vec<TargetKind>,
    pub repeat: usize,
    pub command: String,
    pub saltgate_version: String,
    pub haproxy_version: String,
}

/// Targets in round `r`: rotated by `r`.
pub fn order(targets: &[TargetKind], r: usize) -> Vec<TargetKind> {
    let mut v = targets.to_vec();
    if !v.is_empty() {
        let k = r % v.len();
        v.rotate_left(k);
    }
    v
}

pub async fn run(ctx: &Ctx, plan: &Plan) -> Result<Report, BenchError> {
    let started = now();
    let load_before = procfs::loadavg();
    let sys_before = procfs::sys_sample()?;
    let mut samples: Vec<Sample> = Vec::new();
    for sc in &plan.scenarios {
        for r in 0..plan.repeat {
            for kind in order(&plan.targets, r) {
                eprintln!(
                    "saltgate-bench: {} round {}/{} via {} (loadavg {})",
                    sc.name(),
                    r + 1,
                    plan.repeat,
                    kind.label(),
                    procfs::loadavg()
                );
                let got = match sc {
                    Scenario::Idle => scenarios::idle::run(ctx, kind).await,
                    Scenario::Connect => scenarios::connect::run(ctx, kind).await,
                    Scenario::Rr => scenarios::rr::run(ctx, kind).await,
                    Scenario::Throughput => scenarios::throughput::run(ctx, kind).await,
                    Scenario::Storm => scenarios::storm::run(ctx, kind).await,
                    Scenario::Swarm => scenarios::swarm::run(ctx, kind).await,
                }
                .map_err(|e| {
                    BenchError::Scenario(format!("{} via {}: {e}", sc.name(), kind.label()))
                })?;
                samples.extend(got.into_iter().map(|mut s| {
                    s.repeat = r;
                    s
                }));
                // Let TIME_WAIT and the scheduler settle between runs.
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
        }
    }
    let sys_after = procfs::sys_sample()?;
    let total = sys_after.total.saturating_sub(sys_before.total).max(1);
    let idle = sys_after.idle.saturating_sub(sys_before.idle);
    let foreign: Vec<f64> = samples
        .iter()
        .filter(|s| s.secs > 0.0)
        .map(|s| s.foreign_cpu_pct)
        .collect();
    let meta = Meta {
        command: plan.command.clone(),
        started_utc: report::utc(started),
        finished_utc: report::utc(now()),
        quick: ctx.quick,
        repeat: plan.repeat,
        cpus: procfs::cpus(),
        clock_ticks_per_sec: procfs::clock_ticks_per_sec(),
        cpu_model: cpu_model(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        haproxy: plan.haproxy_version.clone(),
        saltgate: plan.saltgate_version.clone(),
        loadavg_before: load_before,
        loadavg_after: procfs::loadavg(),
        machine_idle_pct: 100.0 * idle as f64 / total as f64,
        foreign_cpu_pct_max: foreign.iter().copied().fold(0.0, f64::max),
        foreign_cpu_pct_median: median(&foreign).unwrap_or(0.0),
        settings: ctx.settings,
    };
    Ok(Report {
        rows: report::rows(&samples),
        meta,
        samples,
    })
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_rotates_the_target_order() {
        let t = TargetKind::ALL;
        assert_eq!(order(&t, 0), t.to_vec());
        assert_eq!(
            order(&t, 1),
            vec![
                TargetKind::Haproxy,
                TargetKind::Saltgate,
                TargetKind::Direct
            ]
        );
        assert_eq!(order(&t, 3), t.to_vec());
        assert!(order(&[], 2).is_empty());
    }

    #[test]
    fn scenario_names_round_trip() {
        for s in Scenario::ALL {
            assert_eq!(Scenario::parse(s.name()), Some(s));
        }
        assert_eq!(Scenario::parse("nope"), None);
    }
}
