//! One scenario: the two nodes in one mode, the minions, the job stream, the failovers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::jobs::{
    all_answered_after, misses, not_run, stream, swarm_lost_returns, swarm_ran, Jobs,
};
use crate::lab::{bin, holds_vip, in_ns, replay_counters, until, within, Lab};
use crate::masters::{Lag, Masters};
use crate::stock::{self, Restarted};
use crate::{Mode, JOB_TIMEOUT_S, PORTS, STOCK, VIP};

/// What one mode measured.
pub struct Report {
    pub mode: Mode,
    pub stock: BTreeSet<String>,
    pub swarm: BTreeSet<String>,
    pub vip_a_to_b: Duration,
    /// Until every stock minion, and every swarm minion, answered a job published after the
    /// kill (the first such job: when it was published).
    pub reconnect_a_to_b: (Duration, Duration),
    pub missed_a_dies: BTreeMap<String, usize>,
    pub vip_b_to_a: Duration,
    pub reconnect_b_to_a: (Duration, Duration),
    pub missed_b_dies: BTreeMap<String, usize>,
    /// The same, but counting for a stock minion only the jobs it did not even start to run
    /// (its log): the others reached it, and their return was lost.
    pub not_run_a_dies: BTreeMap<String, usize>,
    pub not_run_b_dies: BTreeMap<String, usize>,
    /// Replay: the stock minion killed and restarted; the stream's jobs not run per minion from
    /// B's restart to the kill (the killed one may have received a job it had not answered yet:
    /// by the rule, that one is not sent again), from the kill until both nodes closed its
    /// sessions (a job written to the dead session counts as delivered), and from then on.
    pub restarted: Option<(Restarted, [BTreeMap<String, usize>; 3])>,
    /// (jid, minion, returns) of every job a minion answered more than once.
    pub twice: Vec<(String, String, usize)>,
}

/// When the first job after `t0` was answered by all of `stock`, and by all of `swarm`.
fn reconnected(
    jobs: &Jobs,
    t0: Instant,
    stock: &BTreeSet<String>,
    swarm: &BTreeSet<String>,
) -> (Duration, Duration) {
    (
        all_answered_after(jobs, t0, stock).unwrap_or_default(),
        all_answered_after(jobs, t0, swarm).unwrap_or_default(),
    )
}

/// Waits until every one of `ids` answered a job published after `t0` (at most 90 s); if not,
/// panics naming the minions that answered none and, with real Salt, how late each minion's
/// returns came: a minion that is back but whose jobs come late (a cluster member forwarding a
/// peer's publishes behind a backlog, docs/ha.md) answers after the stream's timeout.
async fn answering_again(
    jobs: &Jobs,
    t0: Instant,
    ids: &BTreeSet<String>,
    masters: &Masters,
    mode: &str,
    how: &str,
) {
    if within(Duration::from_secs(90), || {
        all_answered_after(jobs, t0, ids).is_some()
    })
    .await
    .is_some()
    {
        return;
    }
    let answered: BTreeSet<String> = jobs
        .lock()
        .unwrap()
        .iter()
        .filter(|j| j.at >= t0)
        .filter_map(|j| j.answered.clone())
        .flatten()
        .collect();
    let silent: Vec<&String> = ids.difference(&answered).collect();
    panic!(
        "{mode}: not every minion answered a job published after the kill {how} within 90 s (within the job timeout of {JOB_TIMEOUT_S} s); answered none: {silent:?}{}",
        lag_note(masters.return_lags(ids, JOB_TIMEOUT_S).as_ref())
    );
}

/// The per-minion return lags, for a failure message (real Salt), or nothing.
fn lag_note(lags: Option<&BTreeMap<String, Lag>>) -> String {
    lags.map(|l| {
        format!("; returns per minion as master1 saw them, late ones included (late: after the job timeout): {}", show_lags(l))
    })
    .unwrap_or_default()
}

fn show_lags(lags: &BTreeMap<String, Lag>) -> String {
    lags.iter()
        .map(|(id, l)| format!("{id}: {l}"))
        .collect::<Vec<_>>()
        .join("; ")
}

pub async fn scenario(lab: &mut Lab, how: Mode, masters: &Masters) -> Report {
    let mode = how.name();
    println!("== {mode}");
    lab.nonlocal_bind(how == Mode::Haproxy);
    for n in ["a", "b"] {
        lab.start_proxy(n, how);
    }
    for n in ["a", "b"] {
        lab.wait_ready(n, how).await;
    }
    lab.start_keepalived("a", how);
    until(Duration::from_secs(30), "the VIP on A", || {
        holds_vip(&lab.ns("a"))
    })
    .await;
    lab.start_keepalived("b", how);

    // The minions: the stock ones (each in its own namespace) and the swarm, all at once.
    let prefix = how.prefix();
    for i in 0..STOCK {
        stock::start(lab, prefix, i);
    }
    let swarm_log = lab.dir.join(format!("swarm-{prefix}.log"));
    let pki = lab.dir.join("swarm");
    let swarm = in_ns(
        &lab.ns("c"),
        "swarm",
        &bin("saltgate-minion"),
        &[
            "swarm",
            "--count",
            &lab.swarm.to_string(),
            "--master",
            &format!("{VIP}:{}", PORTS.request),
            "--publish-port",
            &PORTS.publish.to_string(),
            "--id-prefix",
            prefix,
            "--pki-dir",
            pki.to_str().unwrap(),
            "--shared-key",
            "--acceptance-wait-time",
            "1",
            "--report-every",
            "3600",
            "--json",
        ],
        &swarm_log,
    );
    lab.procs.insert("swarm".into(), swarm);
    let swarm_ids: BTreeSet<String> = (0..lab.swarm)
        .map(|i| saltgate_minion::swarm::minion_id(prefix, i))
        .collect();
    let stock_ids = stock::stock_set(prefix);
    let ids: BTreeSet<String> = swarm_ids.union(&stock_ids).cloned().collect();

    // Warm-up: one job answered by every minion.
    let t0 = Instant::now();
    let mut tries = tokio::time::interval(Duration::from_secs(1));
    loop {
        // At most one try a second: a real master answers at once while no key matches yet.
        tries.tick().await;
        let p = masters
            .publish(&format!("{prefix}*"), "test.ping", &[], 5)
            .await;
        if p.is_ok_and(|p| p.returns.keys().cloned().collect::<BTreeSet<_>>() == ids) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{mode}: not every minion answered within 120 s; see {} and the lab's {prefix}stock*.stderr",
            swarm_log.display()
        );
    }

    let jobs: Jobs = Arc::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    stream(masters.clone(), format!("{prefix}*"), jobs.clone(), stop_rx);
    tokio::time::sleep(Duration::from_secs(3)).await;

    // 1. Node A dies: its load balancer and keepalived SIGKILLed.
    let killed_a = Instant::now();
    lab.kill("proxy-a");
    lab.kill("keepalived-a");
    let nb = lab.ns("b");
    let vip_a_to_b = until(Duration::from_secs(20), "the VIP on B", || holds_vip(&nb)).await;
    answering_again(&jobs, killed_a, &ids, masters, mode, "through B").await;
    let reconnect_a_to_b = reconnected(&jobs, killed_a, &stock_ids, &swarm_ids);
    println!("{mode}: A killed; the VIP moved to B in {vip_a_to_b:.1?}; every stock / swarm minion answered a job published {:.1?} / {:.1?} after", reconnect_a_to_b.0, reconnect_a_to_b.1);
    if how == Mode::Replay {
        println!("{mode}: B: {}", replay_counters(&nb));
    }

    // 2. A comes back: its load balancer first, keepalived once it is ready. The VIP stays on B.
    lab.start_proxy("a", how);
    lab.wait_ready("a", how).await;
    // Its log is appended to: only what the new keepalived wrote counts.
    let klog = lab.dir.join("keepalived-a.log");
    let from = std::fs::metadata(&klog).map_or(0, |m| m.len() as usize);
    lab.start_keepalived("a", how);
    until(Duration::from_secs(30), "A's keepalived in BACKUP", || {
        std::fs::read(&klog).is_ok_and(|t| {
            String::from_utf8_lossy(t.get(from..).unwrap_or_default())
                .contains("Entering BACKUP STATE")
        })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        holds_vip(&lab.ns("b")) && !holds_vip(&lab.ns("a")),
        "{mode}: nopreempt: the VIP stays on B when A returns"
    );

    // 3. B's load balancer alone dies: B's track_script fails and keepalived moves the VIP to A.
    let killed_b = Instant::now();
    lab.kill("proxy-b");
    let na = lab.ns("a");
    let vip_b_to_a = until(Duration::from_secs(20), "the VIP back on A", || {
        holds_vip(&na)
    })
    .await;
    answering_again(&jobs, killed_b, &ids, masters, mode, "through A").await;
    let reconnect_b_to_a = reconnected(&jobs, killed_b, &stock_ids, &swarm_ids);
    println!("{mode}: B's load balancer killed; the VIP moved to A in {vip_b_to_a:.1?}; every stock / swarm minion answered a job published {:.1?} / {:.1?} after", reconnect_b_to_a.0, reconnect_b_to_a.1);
    if how == Mode::Replay {
        println!("{mode}: A: {}", replay_counters(&na));
    }

    // 4. B's load balancer is restarted (its keepalived stays BACKUP: nopreempt).
    lab.start_proxy("b", how);
    lab.wait_ready("b", how).await;

    // 5. Replay: a stock minion killed while it runs a job, restarted within the window.
    let mut restarted = None;
    let b_window_end = Instant::now();
    if how == Mode::Replay {
        let r = stock::kill_and_restart(lab, prefix, masters).await;
        println!(
            "{mode}: {} killed while running a job and restarted; the job published while it was away returned {:.1?} after the kill",
            r.id, r.answered_after
        );
        restarted = Some((r, b_window_end));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = stop_tx.send(true);
    let last = Instant::now();
    let j2 = jobs.clone();
    until(
        Duration::from_secs(JOB_TIMEOUT_S + 20),
        "the last jobs to finish",
        || j2.lock().unwrap().iter().all(|j| j.answered.is_some()),
    )
    .await;
    let missed_a_dies = misses(&jobs, killed_a, killed_b, &ids);
    let missed_b_dies = misses(&jobs, killed_b, b_window_end, &ids);
    // The jobs each minion received even if its return was lost: a stock minion's log, the
    // swarm's failed returns.
    let mut ran: BTreeMap<String, BTreeSet<String>> = stock_ids
        .iter()
        .map(|id| (id.clone(), stock::ran_jids(&lab.dir, id)))
        .collect();
    ran.extend(swarm_ran(
        &jobs,
        &swarm_ids,
        &swarm_lost_returns(&swarm_log),
    ));
    let not_run_a_dies = not_run(&jobs, killed_a, killed_b, &ids, &ran);
    let not_run_b_dies = not_run(&jobs, killed_b, b_window_end, &ids, &ran);
    let restarted = restarted.map(|(r, from)| {
        let m = [
            not_run(&jobs, from, r.killed, &ids, &ran),
            not_run(&jobs, r.killed, r.closed, &ids, &ran),
            not_run(&jobs, r.closed, last, &ids, &ran),
        ];
        (r, m)
    });
    // After both failovers every minion answers again: the last job.
    let final_ok = jobs
        .lock()
        .unwrap()
        .last()
        .is_some_and(|j| j.answered.as_ref() == Some(&ids));
    let lags = masters.return_lags(&ids, JOB_TIMEOUT_S);
    assert!(
        final_ok,
        "{mode}: the last job was not answered by every minion{}",
        lag_note(lags.as_ref())
    );
    if let Some(l) = &lags {
        println!("{mode}: returns per minion as master1 saw them (late: more than {JOB_TIMEOUT_S} s after the publish, a job the stream counts as missed): {}", show_lags(l));
    }
    let twice = masters.returned_twice(&ids);

    let mut names = vec![
        "swarm".to_string(),
        "keepalived-a".into(),
        "keepalived-b".into(),
        "proxy-a".into(),
        "proxy-b".into(),
    ];
    names.extend((0..STOCK).map(|i| format!("stock-{i}")));
    for name in names {
        lab.kill(&name);
    }
    Report {
        mode: how,
        stock: stock_ids,
        swarm: swarm_ids,
        vip_a_to_b,
        reconnect_a_to_b,
        missed_a_dies,
        vip_b_to_a,
        reconnect_b_to_a,
        missed_b_dies,
        not_run_a_dies,
        not_run_b_dies,
        restarted,
        twice,
    }
}
