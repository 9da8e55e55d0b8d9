//! Request-session continuity (`listeners.request.on_master_down: migrate`, issue 13): fake masters
//! built from `wire`'s ZMTP pieces (a ROUTER handshake per connection), a minion stand-in from
//! `wire`'s REQ socket (one connection while nothing fails: `dial_count`). Addresses 127.18.0.x.

mod common;

use bytes::Bytes;
use common::api::{addr, scrape};
use common::migrate_lab::{self, Lab};
use common::mode_master::{ANSWER, HOLD};
use common::router::{serve, FakeRouter};
use common::*;
use saltgate_config::transport::SaltTransport;
use saltgate_config::Role;
use saltgate_wire::zmtp::{ReqError, ReqOptions, ReqSocket};

const IDENTITY: &str = "salt-req/minion/m1/4242/0123abcd";

/// Masters a (on `ips[0]`, in `a_mode`) and b (on `ips[1]`, answering), and saltgate on
/// 127.18.0.1 over them: the shared migrate lab.
async fn lab(ips: [&str; 2], a_mode: u8, migrate_buffer: u32) -> (FakeRouter, FakeRouter, Lab) {
    migrate_lab::pair(
        "127.18.0.1",
        SaltTransport::Zeromq,
        ips,
        a_mode,
        migrate_buffer,
        serve,
    )
    .await
}

impl Lab {
    fn minion(&self) -> ReqSocket {
        ReqSocket::new(
            addr(&self.r, Role::Request),
            ReqOptions {
                identity: Bytes::from_static(IDENTITY.as_bytes()),
                ..Default::default()
            },
        )
    }
}

async fn ask(m: &mut ReqSocket, what: &str) -> Result<String, ReqError> {
    let reply = m
        .request(vec![Bytes::copy_from_slice(what.as_bytes())], T)
        .await?;
    Ok(String::from_utf8_lossy(reply.last().unwrap()).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_request_leaves_the_reply_to_another_on_the_same_connection() {
    let (a, b, lab) = lab(["127.18.0.2", "127.18.0.3"], HOLD, 1 << 20).await;
    let mut minion = lab.minion();
    let asking = tokio::spawn(async move {
        let r = ask(&mut minion, "job-1").await;
        (r, minion)
    });
    wait_for("a holds the request", || a.requests() == ["job-1"]).await;
    a.kill();
    let (reply, mut minion) = asking.await.unwrap();
    assert_eq!(
        reply.unwrap(),
        "b:job-1",
        "answered by b, on the same connection"
    );
    assert_eq!(ask(&mut minion, "job-2").await.unwrap(), "b:job-2");
    assert_eq!(minion.dial_count(), 1, "the minion connected once");
    assert_eq!(b.requests(), ["job-1", "job-2"], "job-1 re-sent once");
    let ids = b.seen.lock().unwrap().clone();
    assert!(
        ids.iter().all(|(id, _)| id == IDENTITY),
        "b saw the minion's identity"
    );
    lab.replayed_complete().await;
    let s = scrape(lab.admin()).await;
    let moved = common::api::value(&s, "saltgate_request_sessions_migrated_total", &[]);
    assert_eq!(moved, 1.0);
    drop(minion);
    lab.moved_once_to("b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_survives_its_masters_death_and_an_answered_request_is_never_replayed() {
    let (a, b, lab) = lab(["127.18.0.4", "127.18.0.5"], ANSWER, 1 << 20).await;
    let mut minion = lab.minion();
    assert_eq!(ask(&mut minion, "r1").await.unwrap(), "a:r1");
    a.kill();
    lab.migrated(&[]).await;
    assert_eq!(ask(&mut minion, "r2").await.unwrap(), "b:r2");
    assert_eq!(minion.dial_count(), 1);
    assert_eq!(b.requests(), ["r2"], "r1 was answered: never re-sent");
    let s = scrape(lab.admin()).await;
    assert!(
        !s.samples
            .iter()
            .any(|x| x.metric == "saltgate_requests_replayed_total"),
        "nothing replayed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_marked_down_has_its_requests_moved() {
    let (a, _b, lab) = lab(["127.18.0.6", "127.18.0.7"], HOLD, 1 << 20).await;
    let mut minion = lab.minion();
    let asking = tokio::spawn(async move {
        let r = ask(&mut minion, "stuck").await;
        (r, minion)
    });
    wait_for("a holds the request", || a.requests() == ["stuck"]).await;
    lab.prober.set_down(a.addr, true);
    let (reply, minion) = asking.await.unwrap();
    assert_eq!(reply.unwrap(), "b:stuck");
    assert_eq!(minion.dial_count(), 1);
    lab.migrated(&[("reason", "master-down")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_cap_is_not_replayed_and_its_session_closes_as_before() {
    let (a, b, lab) = lab(["127.18.0.8", "127.18.0.9"], HOLD, 1024).await;
    let mut minion = lab.minion();
    let big = "x".repeat(4000);
    let asking = tokio::spawn(async move { ask(&mut minion, &big).await });
    wait_for("a holds the request", || a.requests().len() == 1).await;
    a.kill();
    let r = asking.await.unwrap();
    assert!(matches!(r, Err(ReqError::Disconnected)), "{r:?}");
    lab.skipped("over-cap").await;
    assert!(b.requests().is_empty());
    lab.closed_over_cap().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_other_master_up_the_session_closes_as_before() {
    let (a, b, lab) = lab(["127.18.0.10", "127.18.0.11"], HOLD, 1 << 20).await;
    lab.prober.set_down(b.addr, true);
    wait_for("b DOWN", || !lab.r.master("b").unwrap().is_up()).await;
    let mut minion = lab.minion();
    let asking = tokio::spawn(async move { ask(&mut minion, "alone").await });
    wait_for("a holds the request", || a.requests().len() == 1).await;
    a.kill();
    let r = asking.await.unwrap();
    assert!(matches!(r, Err(ReqError::Disconnected)), "{r:?}");
    lab.skipped("no-master").await;
    assert!(b.requests().is_empty());
}
