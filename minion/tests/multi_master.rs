//! Hot multi-master and failover against two real salt-masters each.
//!
//! Both masters of a pair present the same master key (copied before the second starts), as
//! Salt's multi-master setup requires: a minion trusts one `minion_master.pub`. Everything
//! else is independent: key stores, AES keys, job caches.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{start_minion, tempdir, wait_for, Master};
use serde_json::json;

fn pair(tmp: &Path, a_ip: &str, b_ip: &str, extra: &str) -> (Master, Master) {
    let mut a = Master::start(a_ip, &tmp.join("a"), extra);
    a.wait_ready();
    Master::share_key(&tmp.join("a"), &tmp.join("b"));
    let mut b = Master::start(b_ip, &tmp.join("b"), extra);
    b.wait_ready();
    (a, b)
}

/// A cold master's workers take tens of seconds (on a busy test machine) to serve their first
/// pillar: warm them with a few throwaway minions so that the failover time measured is ours.
fn warm_up(m: &Master, pki: &Path) {
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_saltgate-minion"))
        .args([
            "swarm",
            "--count",
            "4",
            "--pillar",
            "--shared-key",
            "--json",
        ])
        .args(["--master", &format!("{}:{}", m.ip, m.ret_port)])
        .args(["--id-prefix", "warm-", "--duration", "25"])
        .arg("--pki-dir")
        .arg(pki)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("warm-up swarm");
    assert!(st.success());
}

fn answers(m: &Master, id: &str) -> bool {
    m.salt(4, &[id, "test.ping"]) == json!({ id: true })
}

#[test]
fn hot_multi_master_both_real_masters_command_the_minion() {
    let tmp = tempdir();
    let (a, b) = pair(tmp.path(), "127.0.2.2", "127.0.2.3", "");
    let id = "sg-multi";
    let mdir = tmp.path().join("minion");
    let _minion = start_minion(
        &mdir,
        &format!(
            "id: {id}\nmaster:\n  - {}:{}\n  - {}:{}\nmaster_type: str\npki_dir: {}/pki\n\
             acceptance_wait_time: 1\n",
            a.ip,
            a.ret_port,
            b.ip,
            b.ret_port,
            mdir.display()
        ),
    );
    a.accept_when_pending(id);
    b.accept_when_pending(id);
    wait_for(Duration::from_secs(60), "master A's job answered", || {
        answers(&a, id).then_some(())
    });
    wait_for(Duration::from_secs(60), "master B's job answered", || {
        answers(&b, id).then_some(())
    });
    // Each return goes to the master that sent the job.
    assert_eq!(
        a.salt(10, &[id, "test.echo", "from-a"]),
        json!({ id: "from-a" })
    );
    assert_eq!(
        b.salt(10, &[id, "test.echo", "from-b"]),
        json!({ id: "from-b" })
    );
}

#[test]
fn failover_leaves_a_killed_master_and_a_stopped_master() {
    let tmp = tempdir();
    let (mut a, b) = pair(tmp.path(), "127.0.2.4", "127.0.2.5", "auto_accept: True\n");
    let id = "sg-failover";
    let alive = 2;
    warm_up(&b, &tmp.path().join("warm"));
    let mdir = tmp.path().join("minion");
    let _minion = start_minion(
        &mdir,
        &format!(
            "id: {id}\nmaster:\n  - {}:{}\n  - {}:{}\nmaster_type: failover\n\
             master_alive_interval: {alive}\npki_dir: {}/pki\nacceptance_wait_time: 1\n\
             recon_default: 100\nrecon_max: 400\n",
            a.ip,
            a.ret_port,
            b.ip,
            b.ret_port,
            mdir.display()
        ),
    );
    wait_for(Duration::from_secs(90), "A answers first", || {
        answers(&a, id).then_some(())
    });
    assert!(
        !answers(&b, id),
        "failover: only the active master may command the minion"
    );

    // SIGKILL the active master: B takes over within the alive interval plus reconnect.
    a.guard.as_ref().expect("a runs").signal_group("-KILL");
    let killed = Instant::now();
    wait_for(
        Duration::from_secs(60),
        "B answers after A was killed",
        || answers(&b, id).then_some(()),
    );
    let took = killed.elapsed();
    eprintln!("failover after SIGKILL: answered through B after {took:?}");
    assert!(
        took < Duration::from_secs(alive + 20),
        "failover after SIGKILL took {took:?}"
    );

    // Bring A back, then SIGSTOP B (its TCP ports stay open): the minion leaves B for A.
    drop(a.guard.take());
    a.spawn();
    a.wait_ready();
    warm_up(&a, &tmp.path().join("warm"));
    b.guard.as_ref().expect("b runs").signal_group("-STOP");
    let stopped = Instant::now();
    wait_for(
        Duration::from_secs(60),
        "A answers after B was stopped",
        || answers(&a, id).then_some(()),
    );
    let took = stopped.elapsed();
    eprintln!("failover after SIGSTOP: answered through A after {took:?}");
    assert!(
        took < Duration::from_secs(alive + 20),
        "failover after SIGSTOP took {took:?}"
    );
    // The guards send SIGCONT before killing B.
}
