//! Request-session continuity on Salt's plain `tcp` transport (`transport: tcp`,
//! `on_master_down: migrate`; docs/request-continuity.md, "On Salt's `tcp` transport"): fake
//! masters that read `{head: {mid}, body}` messages and answer with the head echoed, as Salt's
//! `SaltMessageServer` does, and a minion stand-in on one plain TCP connection that sends several
//! requests at once and matches replies by `mid` (Salt's `RequestClient`). The connection it
//! holds is the proof that the minion never reconnected. Addresses 127.37.0.x.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use common::api::{addr, scrape, value};
use common::migrate_lab::{self, Lab};
use common::mode_master::{ModeMaster, ANSWER, HALF_THEN_DIE, HOLD};
use common::*;
use saltgate_config::transport::SaltTransport;
use saltgate_config::Role;
use saltgate_proxy::Running;
use saltgate_wire::envelope::{self, text, Value};
use saltgate_wire::salt_tcp::{encode_message, request_frame, FrameDecoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A Salt `tcp` master's request port: answers `<name>:<body>` under the request's `head`; it
/// notes (mid, body) in arrival order, over all connections.
type TcpMaster = ModeMaster<Vec<(String, String)>>;

impl TcpMaster {
    fn bodies(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| b.clone())
            .collect()
    }
}

async fn serve(
    name: &'static str,
    mut s: TcpStream,
    mode: Arc<AtomicU8>,
    got: Arc<Mutex<Vec<(String, String)>>>,
) {
    let mut dec = FrameDecoder::new(1 << 22);
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok(n) = s.read(&mut buf).await else {
            return;
        };
        if n == 0 || dec.push(&buf[..n]).is_err() {
            return;
        }
        while let Ok(Some(m)) = dec.next_message() {
            let mid = String::from_utf8_lossy(m.mid().unwrap_or_default()).into_owned();
            let body = envelope::as_str(&m.body).unwrap_or_default().to_string();
            got.lock().unwrap().push((mid, body.clone()));
            let reply = encode_message(m.head.clone(), text(&format!("{name}:{body}")));
            match mode.load(Ordering::SeqCst) {
                ANSWER if s.write_all(&reply).await.is_err() => return,
                HALF_THEN_DIE => {
                    let _ = s.write_all(&reply[..reply.len() / 2]).await;
                    return;
                }
                _ => {}
            }
        }
    }
}

/// The minion's request connection (Salt's `RequestClient`: requests in flight matched by mid).
struct Minion {
    s: TcpStream,
    dec: FrameDecoder,
}

impl Minion {
    async fn connect(r: &Running) -> Minion {
        Minion {
            s: TcpStream::connect(addr(r, Role::Request)).await.unwrap(),
            dec: FrameDecoder::new(1 << 22),
        }
    }

    async fn send(&mut self, mid: &str, body: &str) {
        self.s
            .write_all(&request_frame(mid, text(body)))
            .await
            .unwrap();
    }

    /// The next reply as (mid, body), or `None` once saltgate closed the connection.
    async fn recv(&mut self) -> Option<(String, String)> {
        let mut buf = vec![0u8; 65536];
        loop {
            if let Some(m) = self.dec.next_message().expect("Salt's framing") {
                let mid = String::from_utf8_lossy(m.mid().unwrap()).into_owned();
                let body = match &m.body {
                    Value::String(s) => s.as_str().unwrap_or_default().to_string(),
                    other => format!("{other:?}"),
                };
                return Some((mid, body));
            }
            let n = tokio::time::timeout(T, self.s.read(&mut buf))
                .await
                .expect("a reply or a close within T")
                .unwrap_or(0);
            if n == 0 {
                return None;
            }
            self.dec.push(&buf[..n]).unwrap();
        }
    }

    /// `n` replies, by mid.
    async fn replies(&mut self, n: usize) -> HashMap<String, String> {
        let mut out = HashMap::new();
        while out.len() < n {
            let (mid, body) = self.recv().await.expect("the connection stays open");
            assert!(out.insert(mid, body).is_none(), "one reply per request");
        }
        out
    }
}

/// Masters a (on `ips[0]`, in `a_mode`) and b (on `ips[1]`, answering), and saltgate on
/// 127.37.0.1 over them: the shared migrate lab.
async fn lab(ips: [&str; 2], a_mode: u8, migrate_buffer: u32) -> (TcpMaster, TcpMaster, Lab) {
    migrate_lab::pair(
        "127.37.0.1",
        SaltTransport::Tcp,
        ips,
        a_mode,
        migrate_buffer,
        serve,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_master_killed_with_requests_in_flight_leaves_every_reply_to_another_on_the_same_connection(
) {
    let (a, b, lab) = lab(["127.37.0.2", "127.37.0.3"], HOLD, 1 << 20).await;
    let mut minion = Minion::connect(&lab.r).await;
    minion.send("mid-1", "job-1").await;
    minion.send("mid-2", "job-2").await;
    wait_for("a holds both requests", || a.bodies() == ["job-1", "job-2"]).await;
    a.kill();
    let got = minion.replies(2).await;
    assert_eq!(got["mid-1"], "b:job-1", "answered by b under its own mid");
    assert_eq!(got["mid-2"], "b:job-2");
    // The same connection goes on, to b.
    minion.send("mid-3", "job-3").await;
    assert_eq!(
        minion.recv().await,
        Some(("mid-3".into(), "b:job-3".into()))
    );
    assert_eq!(
        b.bodies(),
        ["job-1", "job-2", "job-3"],
        "each unanswered request re-sent once, in order"
    );
    lab.replayed_complete().await;
    let s = scrape(lab.admin()).await;
    assert_eq!(
        value(&s, "saltgate_request_sessions_migrated_total", &[]),
        1.0
    );
    drop(minion);
    lab.moved_once_to("b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_unanswered_tcp_request_moves_an_answered_one_never_does() {
    let (a, b, lab) = lab(["127.37.0.4", "127.37.0.5"], ANSWER, 1 << 20).await;
    let mut minion = Minion::connect(&lab.r).await;
    minion.send("r1", "first").await;
    assert_eq!(minion.recv().await, Some(("r1".into(), "a:first".into())));
    a.mode.store(HOLD, Ordering::SeqCst);
    minion.send("r2", "second").await;
    wait_for("a holds r2", || a.bodies().len() == 2).await;
    a.kill();
    assert_eq!(minion.recv().await, Some(("r2".into(), "b:second".into())));
    assert_eq!(b.bodies(), ["second"], "r1 was answered: never re-sent");
    // A kill is a reset or an EOF, whichever the kernel delivers: the total counts either.
    lab.migrated(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_tcp_master_marked_down_has_its_requests_moved() {
    let (a, _b, lab) = lab(["127.37.0.6", "127.37.0.7"], HOLD, 1 << 20).await;
    let mut minion = Minion::connect(&lab.r).await;
    minion.send("stuck", "return").await;
    wait_for("a holds the request", || a.bodies().len() == 1).await;
    lab.prober.set_down(a.addr, true);
    assert_eq!(
        minion.recv().await,
        Some(("stuck".into(), "b:return".into()))
    );
    lab.migrated(&[("reason", "master-down")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_master_dying_mid_reply_closes_the_session_rather_than_splice_two_replies() {
    let (_a, b, lab) = lab(["127.37.0.8", "127.37.0.9"], HALF_THEN_DIE, 1 << 20).await;
    let mut minion = Minion::connect(&lab.r).await;
    minion.send("m", &"x".repeat(3000)).await;
    assert_eq!(minion.recv().await, None, "closed: the minion reconnects");
    lab.skipped("mid-reply").await;
    assert!(b.bodies().is_empty(), "nothing re-sent");
    assert_eq!(lab.record().await.migrate_skip, Some("mid-reply"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_requests_over_the_cap_are_not_kept_and_their_session_closes_as_before() {
    let (a, b, lab) = lab(["127.37.0.10", "127.37.0.11"], HOLD, 1024).await;
    let mut minion = Minion::connect(&lab.r).await;
    minion.send("small", "s").await;
    minion.send("big", &"x".repeat(4000)).await;
    wait_for("a holds both", || a.bodies().len() == 2).await;
    a.kill();
    assert_eq!(minion.recv().await, None, "closed: the minion reconnects");
    lab.skipped("over-cap").await;
    assert!(b.bodies().is_empty());
    lab.closed_over_cap().await;
}
