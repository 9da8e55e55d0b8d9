//! The access log, read back through a subscriber. Its own test binary: a thread-local
//! subscriber in a binary whose other tests log from other threads can lose events to tracing's
//! callsite-interest cache.

mod common;

use std::sync::Arc;

use common::api::{addr, run_with};
use common::*;
use saltgate_config::Role;
use saltgate_proxy::Options;

/// Collects what a tracing subscriber writes, for assertions on the access log.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn access_log_counts_connect_attempts_and_names_the_master_that_served() {
    let log = Captured::default();
    let w = log.clone();
    let sub = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || w.clone())
        .finish();
    // The test runtime is single-threaded: every task of the proxy logs through this subscriber.
    let _guard = tracing::subscriber::set_default(sub);
    let c = FakeCluster::start(2, Behaviour::Echo).await;
    let (r, _stop) = run_with(
        c.config(),
        Options {
            prober: Arc::new(ScriptedProber::default()),
            ..Default::default()
        },
    )
    .await;
    c.port(0, Role::Publish).stop(); // checks still say UP: the first candidate refuses
    let (s, name) = connect(addr(&r, Role::Publish)).await;
    assert_eq!(name, "b");
    drop(s);
    wait_for("the access line", || {
        String::from_utf8_lossy(&log.0.lock().unwrap()).contains("session closed")
    })
    .await;
    let text = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    let line = text.lines().find(|l| l.contains("session closed")).unwrap();
    assert!(
        line.contains("attempts=2") && line.contains("master=b"),
        "{line}"
    );
}
