//! The `saltgate` binary as an operator uses it: the HAProxy fixture run as it stands, imported and
//! run as YAML, checked; access-log lines; JSON logs; SIGTERM; EMFILE back-off.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_saltgate");

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

/// A running saltgate process; its stderr lines are collected; killed on drop.
struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    /// `saltgate run ARGS... FILE`, waited for until both listeners are up.
    async fn run(args: &[&str], file: &Path) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.arg("run").args(args).arg(file);
        let p = Proc::spawn(cmd);
        p.wait_log("listening", 2).await;
        p
    }

    fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn saltgate");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (err, l2) = (child.stderr.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                l2.lock().unwrap().push(line);
            }
        });
        Proc { child, lines }
    }
    fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
    async fn wait_log(&self, what: &str, n: usize) {
        let l = self.lines.clone();
        let w = what.to_string();
        wait_for(&format!("{n}× {what:?} in the log"), move || {
            l.lock().unwrap().iter().filter(|x| x.contains(&w)).count() >= n
        })
        .await;
    }
    fn term(&mut self) -> std::process::ExitStatus {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..1000 {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("saltgate did not exit after SIGTERM:\n{}", self.text());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- saltgate log ---\n{}", self.text());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three tagged echo masters rserve1..3 on 127.0.0.2-4 (same port numbers on each), and the
/// loopback fixture rewritten to those ports and to free listener ports.
struct Fixture {
    _masters: Vec<Arc<FakeMaster>>,
    text: String,
    publish: SocketAddr,
    request: SocketAddr,
}

/// rserve1..3: a publish and a request port each, the same two port numbers on 127.0.0.2-4 (as the
/// fixture wants). rserve1 binds port 0 and keeps its sockets (nothing is found free and released);
/// the others bind the same numbers, and if one is taken on their address it starts over.
async fn same_ports_on_three_ips() -> (Vec<Arc<FakeMaster>>, u16, u16) {
    'again: for _ in 0..20 {
        let first = [
            FakeMaster::start("rserve1", "127.0.0.2", Behaviour::Echo).await,
            FakeMaster::start("rserve1", "127.0.0.2", Behaviour::Echo).await,
        ];
        let (mp, mr) = (first[0].addr.port(), first[1].addr.port());
        let mut masters = first.to_vec();
        for (i, ip) in ["127.0.0.3", "127.0.0.4"].iter().enumerate() {
            for port in [mp, mr] {
                let at: SocketAddr = format!("{ip}:{port}").parse().unwrap();
                match FakeMaster::try_start_at(&format!("rserve{}", i + 2), at, Behaviour::Echo)
                    .await
                {
                    Some(m) => masters.push(m),
                    None => {
                        masters.iter().for_each(|m| m.stop());
                        continue 'again;
                    }
                }
            }
        }
        return (masters, mp, mr);
    }
    panic!("no port pair free on 127.0.0.2-4 after 20 tries");
}

async fn fixture() -> Fixture {
    let (masters, mp, mr) = same_ports_on_three_ips().await;
    // saltgate runs from a file, which must name its listener ports (the loaders refuse port 0):
    // these two are found free first, the one race left.
    let publish: SocketAddr = free_addr();
    let request: SocketAddr = free_addr();
    let text = std::fs::read_to_string(repo("examples/haproxy/salt-master-cluster-loopback.cfg"))
        .unwrap()
        .replace("bind 127.0.0.1:4505", &format!("bind {publish}"))
        .replace("bind 127.0.0.1:4506", &format!("bind {request}"))
        .replace(":4505 check", &format!(":{mp} check"))
        .replace(":4506 check", &format!(":{mr} check"));
    Fixture {
        _masters: masters,
        text,
        publish,
        request,
    }
}

impl Fixture {
    /// Writes the fixture as `dir/haproxy.cfg` and returns `saltgate import-haproxy` of it.
    fn import(&self, dir: &Path) -> String {
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(&cfg, &self.text).unwrap();
        let out = Command::new(BIN)
            .arg("import-haproxy")
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

async fn three_sessions_round_robin(addr: SocketAddr) {
    let mut names = Vec::new();
    for _ in 0..3 {
        let (mut s, n) = connect(addr).await;
        assert_eq!(echo(&mut s, b"ping").await, b"ping");
        names.push(n);
    }
    names.sort();
    assert_eq!(names, ["rserve1", "rserve2", "rserve3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_fixture_runs_as_it_stands_and_stops_cleanly_on_sigterm() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("haproxy.cfg");
    std::fs::write(&cfg, &f.text).unwrap();
    let mut p = Proc::run(
        &["--probe", "tcp", "--admin-bind", "off", "--haproxy-config"],
        &cfg,
    )
    .await;
    three_sessions_round_robin(f.publish).await;
    three_sessions_round_robin(f.request).await;
    p.wait_log("session closed", 6).await;
    let st = p.term();
    assert!(st.success(), "exit {st}:\n{}", p.text());
    let log = p.text();
    assert!(log.contains("shutdown complete"), "{log}");
    // tcplog-like access lines: client, listener, master, duration, bytes, reason.
    let line = log
        .lines()
        .find(|l| l.contains("session closed") && l.contains("listener=publish"))
        .unwrap_or_else(|| panic!("no access line:\n{log}"));
    for field in [
        "client=127.0.0.1:",
        "master=rserve",
        "master_addr=127.0.0.",
        "duration_ms=",
        "bytes_in=4",
        "bytes_out=",
        "reason=client-eof",
    ] {
        assert!(line.contains(field), "{field} missing in: {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_fixture_runs_as_yaml() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = f.import(dir.path());
    assert_eq!(
        yaml.matches("- name: rserve").count(),
        3,
        "three masters recognised as one set:\n{yaml}"
    );
    let yaml_path = dir.path().join("saltgate.yaml");
    // global.threads sizes the runtime: one worker here (the emitted file comments the key out).
    let yaml = yaml.replacen("  # threads: 2 ", "  threads: 1   ", 1);
    assert!(yaml.contains("  threads: 1 "), "{yaml}");
    std::fs::write(&yaml_path, &yaml).unwrap();
    let check = Command::new(BIN)
        .arg("check-config")
        .arg(&yaml_path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let mut p = Proc::run(
        &[
            "--probe",
            "tcp",
            "--admin-bind",
            "off",
            "--log-format",
            "json",
            "--config",
        ],
        &yaml_path,
    )
    .await;
    three_sessions_round_robin(f.request).await;
    p.wait_log("session closed", 3).await;
    assert!(p.term().success());
    // --log-format json: one JSON object per line with stable field names.
    let mut access = 0;
    let mut workers = None;
    for line in p.text().lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        if v["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("runtime started"))
        {
            workers = v["worker_threads"].as_u64();
        }
        if v["message"] == "session closed" {
            access += 1;
            assert_eq!(v["listener"], "request");
            assert_eq!(v["reason"], "client-eof");
            assert_eq!(v["bytes_in"], 4);
            assert!(v["master"].as_str().unwrap().starts_with("rserve"));
        }
    }
    assert_eq!(access, 3);
    assert_eq!(workers, Some(1), "global.threads: 1 gives one worker");
}

#[test]
fn check_config_accepts_the_fixture_and_rejects_bad_files_with_file_line_and_field() {
    let ok = Command::new(BIN)
        .args(["check-config", "--haproxy"])
        .arg(repo("examples/haproxy/salt-master-cluster.cfg"))
        .output()
        .unwrap();
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.cfg");
    let text = std::fs::read_to_string(repo("examples/haproxy/salt-master-cluster.cfg"))
        .unwrap()
        .replace("timeout client 1m", "timeout client 1 m");
    std::fs::write(&bad, text).unwrap();
    let out = Command::new(BIN)
        .args(["check-config", "--haproxy"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:20", bad.display())) && err.contains("timeout client"),
        "{err}"
    );

    let yaml = dir.path().join("bad.yaml");
    std::fs::write(&yaml, "masters:\n  - name: a\n    host: 127.0.0.2\n    weight: 999\nlisteners:\n  publish: {}\n  request: {}\n").unwrap();
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&yaml)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:4:13: masters[0].weight", yaml.display())),
        "{err}"
    );

    let missing = Command::new(BIN)
        .arg("check-config")
        .arg(dir.path().join("nope.yaml"))
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read"));
}

#[test]
fn import_haproxy_takes_the_transport_and_ssl_and_refuses_what_cannot_work() {
    let dir = tempfile::tempdir().unwrap();
    let import = |args: &[&str]| {
        Command::new(BIN)
            .arg("import-haproxy")
            .arg(repo("examples/haproxy/salt-master-cluster.cfg"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = import(&[
        "--transport",
        "tcp",
        "--ssl-ca-certs",
        "/etc/salt/pki/tls/ca.pem",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(yaml.contains("\ntransport: tcp\n"), "{yaml}");
    assert!(
        yaml.contains("ca_certs: \"/etc/salt/pki/tls/ca.pem\""),
        "{yaml}"
    );
    // What it writes, check-config takes as it stands.
    let file = dir.path().join("saltgate.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let check = Command::new(BIN)
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    // A transport Salt does not have, and ssl on ZeroMQ, are refused naming the option.
    let out = import(&["--transport", "zmq"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--transport") && err.contains("zeromq, tcp, ws"),
        "{err}"
    );
    let out = import(&["--ssl-ca-certs", "/ca.pem"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--ssl-ca-certs") && err.contains("transport: tcp or ws"),
        "{err}"
    );
    // Without the options: ZeroMQ, as before.
    let out = import(&[]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("# transport: tcp"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_backs_off_on_emfile_and_recovers() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    // raise_nofile off is not expressible in HAProxy syntax: import, then edit the YAML.
    let yaml = f
        .import(dir.path())
        .replace("raise_nofile: true", "raise_nofile: false");
    let yaml_path = dir.path().join("saltgate.yaml");
    std::fs::write(&yaml_path, yaml).unwrap();

    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!(
        "ulimit -n 48 && exec {BIN} run --probe tcp --admin-bind off --config {}",
        yaml_path.display()
    ));
    let mut p = Proc::spawn(cmd);
    p.wait_log("listening", 2).await;
    let mut held = Vec::new();
    for _ in 0..40 {
        if let Ok(s) = tokio::net::TcpStream::connect(f.publish).await {
            held.push(s);
        }
    }
    p.wait_log("out of resources; backing off", 1).await;
    assert!(
        p.child.try_wait().unwrap().is_none(),
        "saltgate died:\n{}",
        p.text()
    );
    drop(held);
    // Descriptors come back: new sessions are served again.
    let mut served = false;
    for _ in 0..200 {
        if let Ok(Ok(mut s)) = tokio::time::timeout(
            Duration::from_millis(500),
            tokio::net::TcpStream::connect(f.publish),
        )
        .await
        {
            let mut b = [0u8; 8];
            if let Ok(Ok(n)) = tokio::time::timeout(
                Duration::from_millis(500),
                tokio::io::AsyncReadExt::read(&mut s, &mut b),
            )
            .await
            {
                if n > 0 {
                    served = true;
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        served,
        "not serving after descriptors were freed:\n{}",
        p.text()
    );
    assert!(p.term().success());
}

/// A YAML configuration for the fixture's masters with the admin API on a free port.
async fn yaml_with_admin(f: &Fixture, dir: &Path) -> (PathBuf, SocketAddr, String) {
    let admin: SocketAddr = free_addr();
    let yaml = f
        .import(dir)
        .replace("bind: \"127.0.0.1:9505\"", &format!("bind: \"{admin}\""));
    assert!(yaml.contains(&admin.to_string()));
    let path = dir.join("saltgate.yaml");
    std::fs::write(&path, &yaml).unwrap();
    (path, admin, yaml)
}

fn ctl(admin: SocketAddr, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(["ctl", "--admin", &admin.to_string()])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_drives_a_live_proxy_and_fails_clearly() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, admin, _) = yaml_with_admin(&f, dir.path()).await;
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--probe", "tcp", "--config"]).arg(&path);
    let mut p = Proc::spawn(cmd);
    p.wait_log("admin API listening", 1).await;

    let (ok, out, err) = ctl(admin, &["status"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("MASTER") && lines[0].contains("STATE"),
        "{out}"
    );
    for n in ["rserve1", "rserve2", "rserve3"] {
        assert!(
            lines.iter().any(|l| l.starts_with(n) && l.contains(" up ")),
            "{n} up in:\n{out}"
        );
    }
    let (ok, out, _) = ctl(admin, &["drain", "rserve2"]);
    assert!(ok && out.contains("drain rserve2: now draining"), "{out}");
    assert!(ctl(admin, &["status"])
        .1
        .lines()
        .any(|l| l.starts_with("rserve2") && l.contains("draining")));
    for _ in 0..3 {
        assert_ne!(
            connect(f.publish).await.1,
            "rserve2",
            "a draining master gets no new sessions"
        );
    }
    let (ok, out, _) = ctl(admin, &["enable", "rserve2"]);
    assert!(ok && out.contains("now up"), "{out}");
    let (ok, out, _) = ctl(admin, &["disable", "rserve3"]);
    assert!(ok && out.contains("now disabled"), "{out}");
    let (ok, out, err) = ctl(admin, &["reload"]);
    assert!(ok && out.contains("generation 2"), "{out}{err}");

    let (ok, _, err) = ctl(admin, &["drain", "nosuch"]);
    assert!(
        !ok && err.contains("HTTP 404") && err.contains("no master named \"nosuch\""),
        "{err}"
    );
    let closed_port: SocketAddr = free_addr();
    let (ok, _, err) = ctl(closed_port, &["status"]);
    assert!(!ok && err.contains("cannot reach the admin API"), "{err}");
    assert!(p.term().success());
}

/// Receives sd_notify datagrams on a socket we own.
fn notify_socket(dir: &Path) -> (PathBuf, std::os::unix::net::UnixDatagram) {
    let path = dir.join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    (path, sock)
}

fn next_state(sock: &std::os::unix::net::UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("a notification within 10 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_and_file_changes_reload_and_systemd_is_told() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, admin, yaml) = yaml_with_admin(&f, dir.path()).await;
    let (sock_path, sock) = notify_socket(dir.path());
    let mut cmd = Command::new(BIN);
    cmd.env("NOTIFY_SOCKET", &sock_path)
        .args(["run", "--probe", "tcp", "--config"])
        .arg(&path);
    let mut p = Proc::spawn(cmd);
    assert_eq!(next_state(&sock), "READY=1");
    // READY means: listeners bound and the first health round done. A client is served at once.
    assert!(
        connect(f.publish).await.1.starts_with("rserve"),
        "served right after READY"
    );

    // SIGHUP with a changed file: RELOADING, then READY; generation 2.
    std::fs::write(&path, yaml.replace("weight: 1", "weight: 2")).unwrap();
    unsafe { libc::kill(p.child.id() as i32, libc::SIGHUP) };
    let s = next_state(&sock);
    assert!(s.starts_with("RELOADING=1\nMONOTONIC_USEC="), "{s}");
    assert_eq!(next_state(&sock), "READY=1");
    p.wait_log("trigger=\"SIGHUP\"", 1).await;

    // An invalid file is refused; the proxy keeps serving.
    std::fs::write(&path, "masters: [\n").unwrap();
    unsafe { libc::kill(p.child.id() as i32, libc::SIGHUP) };
    p.wait_log("reload refused", 1).await;
    assert_eq!(connect(f.publish).await.1.len(), 7, "still serving");

    // A valid change on disk is picked up by the watcher without any signal.
    let generation = || {
        let (ok, out, err) = ctl(admin, &["status"]);
        assert!(ok, "{err}");
        out.lines()
            .last()
            .and_then(|l| l.strip_prefix("config generation "))
            .and_then(|g| g.parse::<u64>().ok())
            .unwrap()
    };
    let before = generation();
    std::fs::write(&path, yaml.replace("weight: 1", "weight: 3")).unwrap();
    wait_for("the watcher reloads the changed file", || {
        generation() == before + 1
    })
    .await;
    assert!(ctl(admin, &["status"]).1.contains("rserve1"));

    let st = p.term();
    assert!(st.success());
    let mut last = String::new();
    while let Ok(s) = {
        sock.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 512];
        sock.recv(&mut buf)
            .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    } {
        last = s;
    }
    assert_eq!(last, "STOPPING=1");
}
