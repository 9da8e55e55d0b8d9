//! The proxy's health probes against scripted masters (our ROUTER answering like Salt does).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use saltgate_wire::envelope::{self, map, text, Reply, RequestEnvelope, Value};
use saltgate_wire::probe::{salt_ping, salt_ping_staged, zmtp_greeting, ProbeError};
use saltgate_wire::zmtp::{PubOptions, Publisher, Router, RouterOptions};

/// A ROUTER that answers every request with `answer` and checks it was Salt's clear ping.
async fn scripted_master(answer: Value) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let mut router = Router::bind("127.0.0.1:0".parse().unwrap(), RouterOptions::default())
        .await
        .unwrap();
    let addr = router.local_addr();
    let task = tokio::spawn(async move {
        while let Some(m) = router.recv().await {
            let req = RequestEnvelope::decode(&m.frames[1]).expect("request envelope");
            assert_eq!(req, RequestEnvelope::ping());
            let _ = router
                .reply(&m.peer, vec![Bytes::from(envelope::encode(&answer))])
                .await;
        }
    });
    (addr, task)
}

#[tokio::test]
async fn salt_ping_returns_the_echoed_load() {
    let (addr, _t) = scripted_master(map(vec![("cmd", text("ping"))])).await;
    let ok = salt_ping(addr, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(ok.reply, Reply::Plain(_)));
}

#[tokio::test]
async fn salt_ping_reports_cluster_retry_as_not_ready() {
    let answer = map(vec![
        ("enc", text("clear")),
        (
            "load",
            map(vec![
                ("ret", Value::Boolean(false)),
                ("cluster_retry", Value::Boolean(true)),
            ]),
        ),
    ]);
    let (addr, _t) = scripted_master(answer).await;
    let err = salt_ping(addr, Duration::from_secs(5)).await.unwrap_err();
    assert!(err.is_not_ready(), "{err}");
}

#[tokio::test]
async fn salt_ping_reports_bad_load_as_refused_not_as_not_ready() {
    let (addr, _t) = scripted_master(text("bad load")).await;
    let err = salt_ping(addr, Duration::from_secs(5)).await.unwrap_err();
    assert!(
        matches!(&err, ProbeError::Refused(t) if t == "bad load"),
        "{err}"
    );
    assert!(!err.is_not_ready());
}

#[tokio::test]
async fn salt_ping_on_a_publish_port_fails_the_handshake() {
    let publisher = Publisher::bind("127.0.0.1:0".parse().unwrap(), PubOptions::default())
        .await
        .unwrap();
    let err = salt_ping(publisher.local_addr(), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, ProbeError::Zmtp(_)), "{err}");
    // ...while the greeting probe is happy there: it never sends READY.
    let g = zmtp_greeting(publisher.local_addr(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((g.major, g.minor, g.mechanism.as_str()), (3, 1, "NULL"));
}

#[tokio::test]
async fn probes_time_out_on_a_listener_that_never_speaks() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let t = Duration::from_millis(200);
    let g = zmtp_greeting(addr, t).await;
    assert!(matches!(g, Err(ProbeError::NoHandshake(_))), "{g:?}");
    let p = salt_ping(addr, t).await;
    assert!(
        matches!(p, Err(ProbeError::NoHandshake(_) | ProbeError::Timeout(_))),
        "{p:?}"
    );
}

/// The hung-master shape (the kernel accepts, nothing answers) fails the staged ping after the
/// short handshake deadline, not after the long overall timeout.
#[tokio::test]
async fn staged_ping_gives_up_on_a_silent_peer_at_the_handshake_deadline() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let t0 = std::time::Instant::now();
    let err = salt_ping_staged(addr, Duration::from_millis(200), Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(matches!(err, ProbeError::NoHandshake(_)), "{err}");
    assert!(
        err.to_string().contains("no ZMTP handshake within 200ms"),
        "{err}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
}

/// A busy master (handshake at once, the ping's answer late) passes the staged ping as long as the
/// answer comes within the overall timeout, however short the handshake deadline.
#[tokio::test]
async fn staged_ping_waits_for_a_slow_answer_after_a_prompt_handshake() {
    let mut router = Router::bind("127.0.0.1:0".parse().unwrap(), RouterOptions::default())
        .await
        .unwrap();
    let addr = router.local_addr();
    let (delayed_tx, mut delayed_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(m) = router.recv().await {
            let req = RequestEnvelope::decode(&m.frames[1]).expect("request envelope");
            // The worker is busy: the answer comes 600 ms later (the handshake came at once).
            tokio::time::sleep(Duration::from_millis(600)).await;
            let _ = router
                .reply(&m.peer, vec![Bytes::from(envelope::encode(&req.load))])
                .await;
            let _ = delayed_tx.send(());
        }
    });
    let ok = salt_ping_staged(addr, Duration::from_millis(100), Duration::from_secs(10))
        .await
        .expect("a slow answer within the timeout passes");
    assert!(ok.elapsed >= Duration::from_millis(600), "{:?}", ok.elapsed);
    delayed_rx
        .recv()
        .await
        .expect("the answer was the delayed one");
    let err = salt_ping_staged(addr, Duration::from_millis(100), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, ProbeError::Timeout(_)), "{err}");
}

#[tokio::test]
async fn greeting_probe_rejects_a_non_zmtp_peer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        if let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let err = zmtp_greeting(addr, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ProbeError::Zmtp(saltgate_wire::zmtp::ZmtpError::BadSignature)
        ),
        "{err}"
    );
}
