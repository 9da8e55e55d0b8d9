//! The access log, read back as typed records from a memory sink (no log text to parse, no
//! subscriber that other test threads could race).

mod common;

use std::sync::Arc;

use common::api::{addr, run_with};
use common::*;
use saltgate_config::Role;
use saltgate_proxy::accesslog::MemorySink;
use saltgate_proxy::close::CloseReason;
use saltgate_proxy::Options;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_counts_connect_attempts_and_names_the_master_that_served() {
    let log = Arc::new(MemorySink::default());
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let (r, _stop) = run_with(
        c.config(),
        Options {
            prober: Arc::new(ScriptedProber::default()),
            access_log: log.clone(),
            ..Default::default()
        },
    )
    .await;
    c.port(0, Role::Publish).stop(); // checks still say UP: the first candidate refuses
    let (mut s, name) = connect(addr(&r, Role::Publish)).await;
    assert_eq!(name, "b");
    assert_eq!(echo(&mut s, b"four").await, b"four");
    let client = s.local_addr().unwrap();
    drop(s);
    wait_for("the access record", || !log.records().is_empty()).await;
    let rec = &log.records()[0];
    assert_eq!(rec.client, client);
    assert_eq!(rec.listener, Role::Publish);
    assert_eq!(rec.master.as_deref(), Some("b"));
    assert_eq!(rec.master_addr, Some(c.port(1, Role::Publish).addr));
    assert_eq!(rec.attempts, 2);
    assert_eq!(
        (rec.bytes_in, rec.bytes_out),
        (4, 2 + 4),
        "banner \"b\\n\" then the echo"
    );
    assert_eq!(rec.reason, CloseReason::ClientEof);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_client_gets_a_record_without_a_master() {
    let log = Arc::new(MemorySink::default());
    let c = FakeCluster::start(1, Behaviour::Echo).await;
    let p = Arc::new(ScriptedProber::default());
    let (r, _stop) = run_with(
        c.config(),
        Options {
            prober: p.clone(),
            access_log: log.clone(),
            ..Default::default()
        },
    )
    .await;
    p.all_down.store(true, std::sync::atomic::Ordering::SeqCst);
    wait_for("a down", || !r.master("a").unwrap().is_up()).await;
    let mut s = tokio::net::TcpStream::connect(addr(&r, Role::Request))
        .await
        .unwrap();
    assert!(closed(&mut s).await);
    wait_for("the access record", || !log.records().is_empty()).await;
    let rec = &log.records()[0];
    assert_eq!(
        (rec.master.as_deref(), rec.attempts, rec.reason),
        (None, 0, CloseReason::NoMaster)
    );
}
