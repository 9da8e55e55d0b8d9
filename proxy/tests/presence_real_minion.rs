//! Presence with stock Salt 3008.5: a real `salt-minion` authenticates through saltgate to a real
//! `salt-master` (`auto_accept`), subscribes and keeps its request socket; `/api/v1/minions` must
//! list it with that master on both ports. The master listens on 127.14.0.20, saltgate on
//! 127.14.0.21, both on Salt's own ports (the minion connects its publish session to the port the
//! master announces in its `_auth` reply, on saltgate's address). Needs `SALTGATE_VENV` (set by
//! ./scripts/test.sh).

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::api::*;
use common::salt_real::real_master;
use common::*;
use saltgate_config::{HealthSettings, Probe, Role};

const MASTER_IP: &str = "127.14.0.20";
const PROXY_IP: &str = "127.14.0.21";
const MINION: &str = "presence-real-minion";

fn venv() -> PathBuf {
    let venv = std::env::var_os("SALTGATE_VENV").unwrap_or_else(|| {
        panic!("SALTGATE_VENV is not set: run ./scripts/test.sh (it exports the Salt 3008.5 venv)")
    });
    PathBuf::from(venv)
}

/// A process started in its own process group, stopped (group TERM, then KILL) on drop.
struct Proc(Child);

impl Proc {
    fn spawn(mut cmd: Command, log: &Path) -> Proc {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(log).unwrap()));
        Proc(cmd.spawn().expect("spawn a Salt daemon"))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let pgid = -(self.0.id() as i32);
        // SAFETY: kill(2) on the process group this test started.
        unsafe { libc::kill(pgid, libc::SIGTERM) };
        for _ in 0..100 {
            if let Ok(Some(_)) = self.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        unsafe { libc::kill(pgid, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_salt_minion_through_saltgate_is_listed_with_its_master() {
    let venv = venv();
    let dir = tempfile::Builder::new()
        .prefix("sg-presence")
        .tempdir_in("/tmp")
        .unwrap();
    let d = dir.path().display().to_string();

    // The master, on Salt's ports on its own address.
    std::fs::create_dir_all(dir.path().join("master")).unwrap();
    std::fs::write(
        dir.path().join("master/master"),
        format!(
            "id: presence-master\ninterface: {MASTER_IP}\npublish_port: 4505\nret_port: 4506\n\
             user: root\nauto_accept: True\npki_dir: {d}/m/pki\ncachedir: {d}/m/cache\n\
             sock_dir: {d}/m/sock\nsqlite_queue_dir: {d}/m/queues\npidfile: {d}/m/master.pid\n\
             log_file: {d}/m/master.log\nkey_logfile: {d}/m/key.log\nlog_level_logfile: info\n\
             worker_threads: 2\nfile_roots: {{base: [{d}/srv/salt]}}\n\
             pillar_roots: {{base: [{d}/srv/pillar]}}\n"
        ),
    )
    .unwrap();
    let mut master_cmd = Command::new(venv.join("bin/salt-master"));
    master_cmd
        .arg("-c")
        .arg(dir.path().join("master"))
        .args(["-l", "warning"]);
    let _master = Proc::spawn(master_cmd, &dir.path().join("master.stderr"));

    // saltgate in front of it, on the same ports of its own address.
    let health = HealthSettings {
        interval: Duration::from_millis(200),
        fastinter: Duration::from_millis(200),
        downinter: Duration::from_millis(200),
        rise: 1,
        fall: 3,
        timeout: Duration::from_secs(2),
        handshake_timeout: Duration::from_secs(1),
        probe: Probe::Tcp,
    };
    let mut cfg = config_on(
        PROXY_IP,
        vec![real_master("real", MASTER_IP, health)],
        health,
    );
    cfg.publish.bind = vec![format!("{PROXY_IP}:4505").parse().unwrap()];
    cfg.request.bind = vec![format!("{PROXY_IP}:4506").parse().unwrap()];
    let (r, _stop, _) = run(cfg).await;
    let admin = r.admin_addr().unwrap();
    let master_req: SocketAddr = format!("{MASTER_IP}:4506").parse().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while saltgate_wire::probe::salt_ping(master_req, Duration::from_secs(2))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "salt-master not ready\n{}\n{}",
            tail(&dir.path().join("master.stderr")),
            tail(&dir.path().join("m/master.log"))
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The minion knows only saltgate's address.
    std::fs::create_dir_all(dir.path().join("minion")).unwrap();
    std::fs::write(
        dir.path().join("minion/minion"),
        format!(
            "id: {MINION}\nmaster: {PROXY_IP}\nmaster_port: 4506\nuser: root\n\
             pki_dir: {d}/n/pki\ncachedir: {d}/n/cache\nsock_dir: {d}/n/sock\n\
             pidfile: {d}/n/minion.pid\nlog_file: {d}/n/minion.log\nlog_level_logfile: info\n\
             acceptance_wait_time: 1\nrandom_reauth_delay: 1\nauth_timeout: 10\n\
             multiprocessing: False\n"
        ),
    )
    .unwrap();
    let mut minion_cmd = Command::new(venv.join("bin/salt-minion"));
    minion_cmd
        .arg("-c")
        .arg(dir.path().join("minion"))
        .args(["-l", "warning"]);
    let _minion = Proc::spawn(minion_cmd, &dir.path().join("minion.stderr"));

    // Listed, with the master on both ports, connected (its publish session is open).
    listed_by_address(
        admin,
        MINION,
        "real",
        Duration::from_secs(120),
        "the minion never showed with its publish master",
        || {
            format!(
                "--- minion\n{}\n{}",
                tail(&dir.path().join("minion.stderr")),
                tail(&dir.path().join("n/minion.log"))
            )
        },
    )
    .await;
    let s = scrape(admin).await;
    let auth = value(
        &s,
        "saltgate_presence_inspections_total",
        &[("result", "auth")],
    );
    assert!(auth >= 1.0, "the real _auth was read: {auth}");
    assert_eq!(
        value(
            &s,
            "saltgate_master_minions",
            &[("master", "real"), ("port", "publish")]
        ),
        1.0
    );
    assert!(r.local_addrs(Role::Publish)[0].port() == 4505);
}
