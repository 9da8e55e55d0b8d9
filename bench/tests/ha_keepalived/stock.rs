//! Stock salt-minion 3008.5 processes (the venv's) beside the swarm, each in its own namespace,
//! and the proof that a killed and restarted one does not run a job again (issue 24, 3.4).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use saltgate_test_support::{venv, write_minion_config};
use serde_json::Value;

use crate::lab::{established_with, in_ns, until, Lab};
use crate::masters::Masters;
use crate::{PORTS, STOCK, STOCK_IPS, VIP};

/// The stock minions' ids in a scenario whose ids start with `prefix`.
pub fn stock_ids(prefix: &str) -> Vec<String> {
    (0..STOCK).map(|i| format!("{prefix}stock{i}")).collect()
}

/// Starts stock minion `i` of `prefix` (`stock-{i}`) in namespace `s{i}`; its master is the VIP.
/// Its state (keys made on its first start, accepted by the masters' `auto_accept`) and log are
/// under the lab's `<id>/`. The same call restarts it with the same keys.
pub fn start(lab: &mut Lab, prefix: &str, i: usize) {
    let id = &stock_ids(prefix)[i];
    let conf = write_minion_config(&lab.dir, id, VIP, PORTS.request, PORTS.publish);
    // The namespaces have no DNS: the fqdns grain's reverse lookups would only slow the start.
    let file = conf.join("minion");
    let text = std::fs::read_to_string(&file).unwrap();
    if !text.contains("enable_fqdns_grains") {
        std::fs::write(&file, format!("{text}enable_fqdns_grains: False\n")).unwrap();
    }
    let log = lab.dir.join(format!("{id}.stderr"));
    let g = in_ns(
        &lab.ns(&format!("s{i}")),
        &format!("stock-{i}"),
        &venv().join("bin/salt-minion"),
        &["-c", conf.to_str().unwrap(), "-l", "warning"],
        &log,
    );
    lab.procs.insert(format!("stock-{i}"), g);
}

/// What the killed-and-restarted minion did.
pub struct Restarted {
    pub id: String,
    /// The file its jobs append their word to.
    pub file: PathBuf,
    /// The job it had started when it was killed; the job published while it was away.
    pub started: String,
    pub while_away: String,
    /// When it was killed.
    pub killed: Instant,
    /// When both nodes had closed its sessions: until then a job written to its old session
    /// counts as delivered (docs/ha.md, "What can still be lost").
    pub closed: Instant,
    /// From the kill to the return of the job published while it was away.
    pub answered_after: Duration,
}

impl Restarted {
    /// How many times each of the two jobs ran: (started, while away).
    pub fn runs(&self) -> (usize, usize) {
        let text = std::fs::read_to_string(&self.file).unwrap_or_default();
        let n = |w: &str| text.lines().filter(|l| l.trim() == w).count();
        (n(&self.started), n(&self.while_away))
    }
}

/// Stock minion 0 receives a job (`cmd.run`: append a word to a file in its own directory, then
/// sleep) and is SIGKILLed once the word is there, before it returns; a second job is published
/// while it is away; it is started again at once (within the replay window). The caller checks,
/// at the end of the scenario, that each word is in the file exactly once ([`Restarted::runs`]).
pub async fn kill_and_restart(lab: &mut Lab, prefix: &str, masters: &Masters) -> Restarted {
    let id = stock_ids(prefix).remove(0);
    let file = lab.dir.join(&id).join("ran");
    let started = format!("started-{}", std::process::id());
    let while_away = format!("while-away-{}", std::process::id());
    let cmd = format!("echo {started} >> {}; sleep 5", file.display());
    let (m, t) = (masters.clone(), id.clone());
    tokio::spawn(async move { m.publish(&t, "cmd.run", &[Value::from(cmd)], 20).await });
    until(
        Duration::from_secs(30),
        "the stock minion starting its job",
        || std::fs::read_to_string(&file).is_ok_and(|t| t.contains(&started)),
    )
    .await;
    let killed = Instant::now();
    lab.kill("stock-0");
    // Both nodes have closed its sessions before the next job is published (a job written to a
    // session the node has not yet seen close counts as delivered, docs/ha.md).
    let (na, nb) = (lab.ns("a"), lab.ns("b"));
    until(
        Duration::from_secs(10),
        "the nodes closing the killed minion's sessions",
        || established_with(&na, STOCK_IPS[0]) + established_with(&nb, STOCK_IPS[0]) == 0,
    )
    .await;
    let closed = Instant::now();
    let cmd = format!("echo {while_away} >> {}", file.display());
    let (m, t) = (masters.clone(), id.clone());
    let away = tokio::spawn(async move { m.publish(&t, "cmd.run", &[Value::from(cmd)], 40).await });
    until(
        Duration::from_secs(10),
        "the job published while away",
        || masters.published(&while_away),
    )
    .await;
    // Salt's claim of "responsibility" (pid and start time of the killed process) refused the
    // restart in the first run ("An instance is already running"): the killed process was
    // still listed (a zombie not yet reaped, as it seemed). A service manager's restart would
    // face the same; the file is the killed instance's, so it goes.
    let _ = std::fs::remove_file(lab.dir.join(&id).join("process_responsibility_minion.pid"));
    start(lab, prefix, 0);
    let p = away.await.unwrap().expect("the job published while away");
    assert!(
        p.returns.contains_key(&id),
        "{id}: the job published while it was away (jid {}) did not reach the restarted minion",
        p.jid
    );
    Restarted {
        id,
        file,
        started,
        while_away,
        killed,
        closed,
        answered_after: killed.elapsed(),
    }
}

/// The jids stock minion `id` started to run (its log file: "Executing command ... with jid
/// JID"): it received them, whether or not its return reached a master.
pub fn ran_jids(dir: &Path, id: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(dir.join(id).join("minion.log")).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("Executing command"))
        .filter_map(|l| {
            l.split_once(" with jid ")
                .map(|(_, j)| j.trim().to_string())
        })
        .collect()
}

/// The stock ids of `prefix` as a set.
pub fn stock_set(prefix: &str) -> BTreeSet<String> {
    stock_ids(prefix).into_iter().collect()
}
