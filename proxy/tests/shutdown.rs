//! Shutdown in two phases (stop accepting, drain up to the grace) and what still works while it
//! drains: reloads are refused and bind nothing; the admin API keeps serving `/metrics` and says
//! not ready.

mod common;

use std::time::Duration;

use common::api::*;
use common::*;
use saltgate_config::Role;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_during_shutdown_is_refused_and_binds_nothing() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.global.shutdown_grace = Duration::from_secs(60);
    let (r, stop, _p) = run(cfg.clone()).await;
    // A live session keeps the shutdown in its drain phase.
    let (mut s, _) = connect(addr(&r, Role::Publish)).await;
    stop.send(()).unwrap();
    wait_for("listeners closed", || {
        r.local_addrs(Role::Publish).is_empty() && r.local_addrs(Role::Request).is_empty()
    })
    .await;
    let e = r
        .reload(cfg.clone())
        .await
        .expect_err("a reload while stopping is refused");
    assert!(e.to_string().contains("shutting down"), "{e}");
    assert!(
        r.local_addrs(Role::Publish).is_empty() && r.local_addrs(Role::Request).is_empty(),
        "no listener was bound again (its accept loop would exit at once and clients would hang in its backlog)"
    );
    assert_eq!(echo(&mut s, b"still draining").await, b"still draining");
    drop(s);
    tokio::time::timeout(T, r.wait())
        .await
        .expect("stops once the session ends");
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_serves_metrics_and_says_not_ready_through_the_drain() {
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let mut cfg = c.config();
    cfg.global.shutdown_grace = Duration::from_secs(60);
    let (r, stop, _p) = run(cfg).await;
    let admin = r.admin_addr().unwrap();
    let (s, _) = connect(addr(&r, Role::Publish)).await;
    assert_eq!(json(admin, "GET", "/readyz", None).await.0, 200);
    // The session is accepted and counted before shutdown starts (a connect can complete in the
    // backlog before the accept loop takes it, and a stopped loop takes nothing more).
    wait_for_metric(
        admin,
        "saltgate_listener_sessions_current",
        &[("listener", "publish")],
        1.0,
    )
    .await;
    stop.send(()).unwrap();
    wait_for("listeners closed", || {
        r.local_addrs(Role::Publish).is_empty()
    })
    .await;
    let (code, body) = json(admin, "GET", "/readyz", None).await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["stopping"], true, "{body}");
    let sc = scrape(admin).await;
    assert_eq!(
        value(
            &sc,
            "saltgate_listener_sessions_current",
            &[("listener", "publish")]
        ),
        1.0,
        "the drain is visible in the metrics"
    );
    drop(s);
    tokio::time::timeout(T, r.wait())
        .await
        .expect("stops once the session ends");
    // The admin task ends with the shutdown; its socket closes as that task finishes.
    let deadline = tokio::time::Instant::now() + T;
    while tokio::net::TcpStream::connect(admin).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the admin API is gone once shutdown completes"
        );
        tokio::task::yield_now().await;
    }
}
