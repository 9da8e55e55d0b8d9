//! Every log line of a proxied session runs in its span (`session{id listener client master}`):
//! read back from the text a real `fmt` subscriber writes (one for this binary; each test finds
//! its own lines by its client's address).

mod common;

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use common::api::{addr, run_with, wait_for_metric};
use common::logs::{session_id, Captured};
use common::router::FakeRouter;
use common::*;
use saltgate_config::{Balance, ListenerMode, OnMasterDown, Role};
use saltgate_proxy::Options;
use saltgate_wire::zmtp::{ReqOptions, ReqSocket};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The binary's subscriber (installed once) and what it wrote.
fn captured() -> Captured {
    static OUT: OnceLock<Captured> = OnceLock::new();
    OUT.get_or_init(|| {
        let out = Captured::default();
        tracing::subscriber::set_global_default(out.subscriber("info")).expect("one subscriber");
        out
    })
    .clone()
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

/// A request session that moves (`on_master_down: migrate`): its span names the master it moved
/// to from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_request_sessions_span_records_the_master_it_moved_to() {
    let out = captured();
    let a = FakeRouter::start("span-a", "127.18.0.21", true).await;
    let b = FakeRouter::start("span-b", "127.18.0.22", true).await;
    let mut cfg = config_on(
        "127.18.0.20",
        vec![a.config(), b.config()],
        scripted_health(),
    );
    cfg.request.balance = Balance::First;
    cfg.request.on_master_down = OnMasterDown::Migrate;
    let (r, _stop) = run_with(
        cfg,
        Options {
            prober: Arc::new(ScriptedProber::default()),
            ..Default::default()
        },
    )
    .await;
    for m in ["span-a", "span-b"] {
        wait_for("masters UP", || r.master(m).unwrap().is_up()).await;
    }
    let mut minion = ReqSocket::new(addr(&r, Role::Request), ReqOptions::default());
    assert_eq!(ask(&mut minion, "r1").await, "span-a:r1");
    a.kill();
    let admin = r.admin_addr().unwrap();
    wait_for_metric(admin, "saltgate_request_sessions_migrated_total", &[], 1.0).await;
    assert_eq!(ask(&mut minion, "r2").await, "span-b:r2");
    let moved = out
        .find(&["request session moved", "from=span-a to=span-b"])
        .unwrap_or_else(|| panic!("no move line:\n{}", out.lines().join("\n")));
    let id = session_id(&moved).unwrap_or_else(|| panic!("not in a session span: {moved}"));
    assert!(
        moved.contains(&format!("session{{id={id} listener=request client=")),
        "{moved}"
    );
    assert!(
        moved.contains(" master=span-b}: saltgate_proxy::replay: "),
        "the span names the master the session moved to: {moved}"
    );
}

async fn ask(m: &mut ReqSocket, what: &'static str) -> String {
    let reply = m
        .request(vec![Bytes::from_static(what.as_bytes())], T)
        .await;
    String::from_utf8_lossy(reply.unwrap().last().unwrap()).into_owned()
}
