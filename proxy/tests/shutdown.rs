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
