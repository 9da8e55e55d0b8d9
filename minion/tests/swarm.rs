//! A swarm of 50 minions with one shared key against a real salt-master (auto_accept) on
//! 127.0.2.6: `salt '*' test.ping` gets all 50 answers, and a rerun reuses the cached key.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{tempdir, wait_for, Master, ProcGuard};

const IP: &str = "127.0.2.6";
const N: usize = 50;

fn swarm(master: &Master, pki: &std::path::Path, log: &std::path::Path) -> ProcGuard {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_saltgate-minion"));
    cmd.args(["swarm", "--count", &N.to_string()])
        .args(["--master", &format!("{IP}:{}", master.ret_port)])
        .args(["--id-prefix", "sw-", "--shared-key", "--json"])
        .args(["--acceptance-wait-time", "1"])
        .arg("--pki-dir")
        .arg(pki)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::fs::File::create(log).expect("log")))
        .stderr(Stdio::null());
    ProcGuard::spawn("saltgate-minion swarm", cmd)
}

#[test]
fn swarm_of_50_with_a_shared_key_answers_a_real_master() {
    let tmp = tempdir();
    let mut master = Master::start(IP, &tmp.path().join("master"), "auto_accept: True\n");
    master.wait_ready();
    let pki = tmp.path().join("swarm-pki");
    let log = tmp.path().join("swarm.jsonl");
    let s = swarm(&master, &pki, &log);
    let answers = wait_for(Duration::from_secs(180), "50 answers to test.ping", || {
        let v = master.salt(10, &["sw-*", "test.ping"]);
        let n = v
            .as_object()
            .map(|m| {
                m.values()
                    .filter(|x| **x == serde_json::json!(true))
                    .count()
            })
            .unwrap_or(0);
        (n == N).then_some(v)
    });
    for i in 0..N {
        assert_eq!(answers[format!("sw-{i}")], serde_json::json!(true));
    }
    // Progress lines are JSON with the counters. The line that counts the answers comes at the
    // swarm's next report, after the salt CLI has them: wait for it.
    let last_line = || -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(&log).ok()?;
        text.lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
    };
    let last = wait_for(
        Duration::from_secs(30),
        "a progress line counting the answers",
        || last_line().filter(|l| l["jobs_answered"].as_u64().unwrap_or(0) >= N as u64),
    );
    assert_eq!(last["minions"], serde_json::json!(N));
    drop(s);
    // The key pair is cached: a rerun does not generate another one.
    let pem = std::fs::read(pki.join("shared.pem")).expect("cached key");
    let s = swarm(&master, &pki, &log);
    wait_for(Duration::from_secs(120), "answers after the rerun", || {
        let v = master.salt(10, &["sw-1", "test.ping"]);
        (v == serde_json::json!({"sw-1": true})).then_some(())
    });
    assert_eq!(std::fs::read(pki.join("shared.pem")).expect("key"), pem);
    drop(s);
}
