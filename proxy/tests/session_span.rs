//! Every log line of a proxied session runs in its span (`session{id listener client master}`):
//! read back from the text a real `fmt` subscriber writes (one for this binary; each test finds
//! its own lines by its client's address).

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use common::api::{addr, run_with};
use common::*;
use saltgate_config::{ListenerMode, Role};
use saltgate_proxy::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The first line containing every one of `parts`.
    fn find(&self, parts: &[&str]) -> Option<String> {
        self.lines()
            .into_iter()
            .find(|l| parts.iter().all(|p| l.contains(p)))
    }
}

/// The binary's subscriber (installed once) and what it wrote.
fn captured() -> Captured {
    static OUT: OnceLock<Captured> = OnceLock::new();
    OUT.get_or_init(|| {
        let out = Captured::default();
        let w = out.clone();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(move || w.clone())
            .init();
        out
    })
    .clone()
}

/// The id in a line's `session{id=..` span, if it has one.
fn session_id(line: &str) -> Option<String> {
    line.split_once("session{id=")
        .and_then(|(_, rest)| rest.split_once(' '))
        .map(|(id, _)| id.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_lines_carry_its_id_listener_client_and_master_once_chosen() {
    let out = captured();

    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let (r, _stop) = run_with(
        c.config(),
        Options {
            prober: Arc::new(ScriptedProber::default()),
            ..Default::default()
        },
    )
    .await;
    // Checks still say UP: the first candidate refuses, logged before any master is chosen.
    c.port(0, Role::Publish).stop();
    let (mut s, name) = connect(addr(&r, Role::Publish)).await;
    assert_eq!(name, "b");
    assert_eq!(echo(&mut s, b"four").await, b"four");
    let client = s.local_addr().unwrap().to_string();
    drop(s);
    wait_for("the session's access line", || {
        out.find(&["session closed", &client]).is_some()
    })
    .await;

    let scope = format!("listener=publish client={client}");
    let failed = out
        .find(&["connect to master failed", &client])
        .unwrap_or_else(|| panic!("no connect failure line:\n{}", out.lines().join("\n")));
    let id = session_id(&failed)
        .unwrap_or_else(|| panic!("the connect failure is not in a session span: {failed}"));
    assert!(
        failed.contains(&format!(
            "session{{id={id} {scope}}}: saltgate_proxy::session:"
        )),
        "no master yet, the target kept: {failed}"
    );
    let closed = out.find(&["session closed", &client]).unwrap();
    assert!(
        closed.contains(&format!(
            "session{{id={id} {scope} master=b}}: saltgate::access:"
        )),
        "the master recorded once chosen: {closed}"
    );
    // The span replaces the per-line client and listener of the session's own lines.
    assert_eq!(failed.matches("client=").count(), 1, "{failed}");

    // The next session has its own id.
    let (s2, _) = connect(addr(&r, Role::Publish)).await;
    let client2 = s2.local_addr().unwrap().to_string();
    drop(s2);
    wait_for("the second session's access line", || {
        out.find(&["session closed", &client2]).is_some()
    })
    .await;
    let closed2 = out.find(&["session closed", &client2]).unwrap();
    assert!(closed2.contains("session{id="), "{closed2}");
    assert!(
        !closed2.contains(&format!("session{{id={id} ")),
        "{closed2}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fanout_session_runs_in_its_span_without_a_master() {
    let out = captured();
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.publish.mode = ListenerMode::Fanout;
    let (r, _stop) = run_with(
        cfg,
        Options {
            prober: Arc::new(ScriptedProber::default()),
            ..Default::default()
        },
    )
    .await;
    // Not a ZMTP greeting: the hub's session ends in error, logged at INFO (after the hub's own
    // greeting, read and dropped here).
    let mut s = tokio::net::TcpStream::connect(addr(&r, Role::Publish))
        .await
        .unwrap();
    let client = s.local_addr().unwrap().to_string();
    s.write_all(&[0u8; 64]).await.unwrap();
    let mut sink = Vec::new();
    let read = tokio::time::timeout(T, s.read_to_end(&mut sink)).await;
    assert!(read.is_ok(), "the hub closes the session");
    wait_for("the fan-out session's line", || {
        out.find(&["fanout session closed", &client]).is_some()
    })
    .await;
    let line = out.find(&["fanout session closed", &client]).unwrap();
    let id = session_id(&line).unwrap_or_else(|| panic!("not in a session span: {line}"));
    assert!(
        line.contains(&format!(
            "session{{id={id} listener=publish client={client}}}: saltgate_proxy::pubhub::session:"
        )),
        "{line}"
    );
}
