//! Issue 10 part 6: `reuse_port: true` lets several saltgate processes share a port (the kernel
//! spreads connections over them); without it, a second process gets a clear "address in use".
//! Two real `saltgate` processes on 127.15.2.1 (fixed ports: this range is the test's own).

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use common::api::http;
use common::*;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_saltgate");
const IP: &str = "127.15.2.1";
const PUBLISH: u16 = 24505;
const REQUEST: u16 = 24506;

struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(file: &Path) -> Proc {
        let mut child = Command::new(BIN)
            .arg("run")
            .arg("--config")
            .arg(file)
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
    async fn listening(&self) {
        let l = self.lines.clone();
        wait_for("admin API listening", move || {
            l.lock()
                .unwrap()
                .iter()
                .any(|x| x.contains("admin API listening"))
        })
        .await;
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- saltgate {} log ---\n{}", self.child.id(), self.text());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(
    dir: &Path,
    name: &str,
    admin: u16,
    reuse: bool,
    master: &FakeCluster,
) -> std::path::PathBuf {
    let (p, r) = (&master.masters[0].0, &master.masters[0].1);
    let text = format!(
        "global:\n  raise_nofile: false\nhealth:\n  interval: 100ms\n  probe: tcp\nmasters:\n  - name: a\n    host: {}\n    publish_port: {}\n    request_port: {}\nlisteners:\n  publish:\n    bind: {IP}:{PUBLISH}\n    reuse_port: {reuse}\n  request:\n    bind: {IP}:{REQUEST}\n    reuse_port: {reuse}\nadmin:\n  bind: {IP}:{admin}\n",
        p.addr.ip(),
        p.addr.port(),
        r.addr.port()
    );
    let f = dir.join(name);
    std::fs::write(&f, text).unwrap();
    f
}

/// Live publish sessions on master a, as one process's admin API says.
async fn sessions(admin: u16) -> u64 {
    let a: SocketAddr = format!("{IP}:{admin}").parse().unwrap();
    let (status, body) = http(a, "GET", "/api/v1/masters", None).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["masters"][0]["publish"]["sessions"].as_u64().unwrap()
}

/// A publish connection through the shared port, answered by the master (its banner read).
async fn connect() -> TcpStream {
    let mut s = TcpStream::connect((IP, PUBLISH)).await.expect("connect");
    let mut b = [0u8; 2];
    tokio::time::timeout(T, s.read_exact(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&b, b"a\n");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_a_port_and_one_serves_alone_when_the_other_dies() {
    let m = FakeCluster {
        masters: vec![(
            FakeMaster::start("a", "127.15.2.2", Behaviour::Echo).await,
            FakeMaster::start("a", "127.15.2.2", Behaviour::Echo).await,
        )],
    };
    let dir = tempfile::tempdir().unwrap();
    let mut one = Proc::spawn(&config(dir.path(), "one.yaml", 29501, true, &m));
    one.listening().await;
    let two = Proc::spawn(&config(dir.path(), "two.yaml", 29502, true, &m));
    two.listening().await;

    // Both accept: the kernel spreads new connections over the two sockets.
    let mut held = Vec::new();
    for _ in 0..40 {
        held.push(connect().await);
    }
    let (n1, n2) = (sessions(29501).await, sessions(29502).await);
    assert_eq!(n1 + n2, 40, "every session is in one of the two processes");
    assert!(n1 >= 5 && n2 >= 5, "spread over both: {n1} + {n2}");

    // A third without reuse_port is refused with the fix.
    let third = Proc::spawn(&config(dir.path(), "three.yaml", 29503, false, &m));
    let mut third = third;
    let st = tokio::task::spawn_blocking(move || {
        let st = third.child.wait().unwrap();
        (st, third)
    });
    let (st, third) = tokio::time::timeout(T, st).await.unwrap().unwrap();
    assert!(!st.success());
    let log = third.text();
    assert!(
        log.contains("already in use") && log.contains("reuse_port: true"),
        "{log}"
    );
    // The OS error is printed once (issue 12 item 8: it used to come twice, through the chain).
    assert_eq!(log.matches("already in use").count(), 1, "{log}");

    // One dies: the other serves every new connection.
    one.child.kill().unwrap();
    one.child.wait().unwrap();
    drop(held);
    for _ in 0..20 {
        held = vec![connect().await];
        drop(held);
    }
    let mut last = Vec::new();
    for _ in 0..10 {
        last.push(connect().await);
    }
    let n = sessions(29502).await;
    assert_eq!(n, 10, "the surviving process serves them all");
    drop(two);
}
