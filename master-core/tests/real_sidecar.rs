//! Issue 10 part 6, with real Salt: a stock `salt-minion` 3008.5 with `master: <sidecar>` behind a
//! saltgate sidecar (`examples/sidecar.yaml`'s profile: balance first, failback, salt probes) in
//! front of a two-master saltgate cluster (127.15.3.50 and .51, shared cluster_pki_dir). Its first
//! master is SIGSTOPped (TCP still accepted, nothing answered): the minion answers a job published
//! through the second master within 10 s, with no `master_type: failover`.
//!
//! Needs the `saltgate` binary beside `saltgate-master` (`cargo test --workspace` builds both).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

const MINION: &str = "sg-sidecar-minion-1";
/// The sidecar's listeners (fixed ports on this test's own loopback range).
const SIDECAR: &str = "127.15.3.1";
const SIDE_PUB: u16 = 34505;
const SIDE_RET: u16 = 34506;
const SIDE_ADMIN: u16 = 39505;

fn saltgate() -> std::path::PathBuf {
    let p = std::path::Path::new(bin()).with_file_name("saltgate");
    assert!(
        p.exists(),
        "{} is missing: build it with cargo build -p saltgate-proxy --bin saltgate (cargo test --workspace does)",
        p.display()
    );
    p
}

/// The minion's master on the sidecar, from its admin API: the master holding its publish session.
fn publish_master() -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect((SIDECAR, SIDE_ADMIN)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /api/v1/masters HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let body = resp.split("\r\n\r\n").nth(1)?;
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v["masters"]
        .as_array()?
        .iter()
        .find(|m| m["publish"]["sessions"].as_u64() == Some(1))
        .and_then(|m| m["name"].as_str().map(str::to_string))
}

#[test]
fn a_minion_behind_a_sidecar_answers_through_the_next_master_when_its_first_hangs() {
    let venv = venv();
    let root = tempfile::Builder::new()
        .prefix("sgsc")
        .tempdir_in("/tmp")
        .unwrap();
    let r = root.path();
    let d = r.display();
    let (a, b) = start_cluster_pair(r, ["127.15.3.50", "127.15.3.51"]);

    // The sidecar: the profile of examples/sidecar.yaml, on this test's addresses.
    let sidecar_conf = r.join("sidecar.yaml");
    std::fs::write(
        &sidecar_conf,
        format!(
            "global:\n  maxconn: 64\n  raise_nofile: false\n\
             health:\n  interval: 1s\n  fastinter: 500ms\n  downinter: 1s\n  timeout: 1s\n  rise: 2\n  fall: 2\n  probe: salt\n\
             masters:\n  - name: sg-a\n    host: {}\n    publish_port: {}\n    request_port: {}\n\
             \x20 - name: sg-b\n    host: {}\n    publish_port: {}\n    request_port: {}\n\
             listeners:\n  publish:\n    bind: {SIDECAR}:{SIDE_PUB}\n    balance: first\n    failback: 30s\n    close_rate: 0\n\
             \x20 request:\n    bind: {SIDECAR}:{SIDE_RET}\n    balance: first\n    failback: 30s\n    close_rate: 0\n\
             admin:\n  bind: {SIDECAR}:{SIDE_ADMIN}\n",
            a.publish.ip(),
            a.publish.port(),
            a.ret.port(),
            b.publish.ip(),
            b.publish.port(),
            b.ret.port(),
        ),
    )
    .unwrap();
    let mut cmd = Command::new(saltgate());
    cmd.arg("run")
        .arg("--config")
        .arg(&sidecar_conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(r.join("sidecar.log")).unwrap(),
        ));
    let _sidecar = ProcGuard::spawn("saltgate", cmd);

    let mconf = r.join("minion-conf");
    std::fs::create_dir_all(&mconf).unwrap();
    std::fs::write(
        mconf.join("minion"),
        format!(
            "id: {MINION}\nmaster: {SIDECAR}\nmaster_port: {SIDE_RET}\npublish_port: {SIDE_PUB}\nuser: root\n\
             pki_dir: {d}/minion/pki\ncachedir: {d}/minion/cache\nsock_dir: {d}/minion/sock\n\
             pidfile: {d}/minion/minion.pid\nlog_file: {d}/minion/minion.log\n\
             log_level_logfile: debug\nacceptance_wait_time: 1\nmultiprocessing: False\n"
        ),
    )
    .unwrap();
    let mut cmd = Command::new(venv.join("bin/salt-minion"));
    cmd.arg("-c")
        .arg(&mconf)
        .args(["-l", "warning"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _minion = ProcGuard::spawn("salt-minion", cmd);
    let logs = || {
        let read = |p: &str| std::fs::read_to_string(r.join(p)).unwrap_or_default();
        format!(
            "--- A\n{}\n--- B\n{}\n--- sidecar\n{}\n--- minion\n{}",
            read("a/master.log"),
            read("b/master.log"),
            read("sidecar.log"),
            read("minion/minion.log")
        )
    };
    let ping = |conf: &std::path::Path, timeout: &str| {
        let o = cli(
            conf,
            &[
                "publish",
                "--out",
                "json",
                "--timeout",
                timeout,
                "*",
                "test.ping",
            ],
        );
        (o.status.success() && stdout_json(&o) == json!({ MINION: true })).then_some(())
    };

    // Through the sidecar the minion is on A, the first master.
    std::panic::catch_unwind(|| {
        wait_for(
            Duration::from_secs(180),
            "the minion answers through A",
            || ping(&a.config, "5"),
        )
    })
    .unwrap_or_else(|_| panic!("no round trip through the sidecar\n{}", logs()));
    assert_eq!(publish_master().as_deref(), Some("sg-a"), "{}", logs());

    // A hangs: the minion answers a job published through B within 10 s.
    let pid = a.guard.child.id().to_string();
    let stop = |sig: &str| {
        Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success()
    };
    assert!(stop("-STOP"));
    let t0 = Instant::now();
    let answered = std::panic::catch_unwind(|| {
        wait_for(
            Duration::from_secs(30),
            "the minion answers through B",
            || ping(&b.config, "2"),
        )
    });
    let took = t0.elapsed();
    stop("-CONT");
    answered.unwrap_or_else(|_| panic!("no answer through B after A hung\n{}", logs()));
    eprintln!("answered through B {took:?} after A was SIGSTOPped");
    assert!(
        took <= Duration::from_secs(10),
        "answered through B only {took:?} after A hung\n{}",
        logs()
    );
    assert_eq!(publish_master().as_deref(), Some("sg-b"), "{}", logs());
}
