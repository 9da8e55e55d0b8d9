//! Tests of the steady state's poll future (`steady.rs`), driven on a loopback socket with no
//! ZMTP handshake (the session starts past it): a write the socket cannot take at once, the
//! hub's stop while it waits, the write timeout, the silence limit.

use super::*;
use crate::fanout::hub::HubOptions;
use saltgate_test_support::wait_until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

/// More than loopback's send and receive buffers hold together (`tcp_wmem` and `tcp_rmem`
/// top out at 4 and 6 MiB by default): a session cannot write it at once to a minion that does
/// not read.
const BIG: usize = 32 << 20;

/// A connected loopback pair: (the session's side, the minion's).
async fn pair() -> (TcpStream, TcpStream) {
    let l = tokio::net::TcpListener::bind("127.0.5.21:0").await.unwrap();
    let minion = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (session, _) = l.accept().await.unwrap();
    (session, minion)
}

fn hub(heartbeat: Option<Heartbeat>) -> Arc<Hub> {
    Arc::new(Hub::new(HubOptions {
        heartbeat,
        ..HubOptions::default()
    }))
}

/// Runs a session's steady state on `io` (a peer speaking ZMTP 3.1 or not): its end comes out.
fn steady(hub: &Arc<Hub>, io: TcpStream, peer_3_1: bool) -> JoinHandle<End> {
    let hub = hub.clone();
    tokio::spawn(async move {
        let hello = Hello {
            peer: io.peer_addr().unwrap(),
            peer_3_1,
            identity: Bytes::new(),
            rbuf: BytesMut::new(),
            limits: SessionLimits::default(),
            opened: Instant::now(),
        };
        let timer = tokio::time::sleep_until(hello.opened);
        tokio::pin!(timer);
        Steady::start(&hub, None, &io, hello, timer.as_mut()).await
    })
}

/// The minion subscribes to everything; returns once the hub has the subscription.
async fn subscribe(hub: &Hub, minion: &mut TcpStream) -> Arc<Slot> {
    let mut f = BytesMut::new();
    Command::Subscribe(Bytes::new()).encode_frame(&mut f);
    minion.write_all(&f).await.unwrap();
    let sub = || {
        hub.sessions()
            .values()
            .find(|s| !s.topics().is_empty())
            .cloned()
    };
    wait_until("the subscription", Duration::from_secs(10), || {
        sub().is_some()
    })
    .await;
    sub().unwrap()
}

/// A message body the minion can check byte for byte.
fn body(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Reads frames until `n` messages came; returns their bodies (PINGs are skipped).
async fn messages(minion: &mut TcpStream, n: usize) -> Vec<Bytes> {
    let dec = FrameDecoder::new(2 * BIG);
    let (mut buf, mut out) = (BytesMut::new(), Vec::new());
    while out.len() < n {
        match dec.decode(&mut buf).unwrap() {
            Some(Frame::Message { body, .. }) => out.push(body),
            Some(Frame::Command(_)) => {}
            None => assert!(minion.read_buf(&mut buf).await.unwrap() > 0, "closed"),
        }
    }
    out
}

/// The session took the message from its queue and could not write all of it.
async fn write_waits(slot: &Slot) {
    wait_until("the message popped", Duration::from_secs(10), || {
        slot.queue.len() == 0
    })
    .await;
    assert_eq!(slot.delivered.load(Ordering::Relaxed), 0, "written whole?");
}

#[tokio::test]
async fn a_write_the_socket_cannot_take_waits_then_completes_in_order() {
    let h = hub(None);
    let (io, mut minion) = pair().await;
    let task = steady(&h, io, true);
    let slot = subscribe(&h, &mut minion).await;
    let big = body(BIG);
    assert_eq!(h.publish(std::slice::from_ref(&big)).queued, 1);
    write_waits(&slot).await;
    // Queued behind the write that waits.
    assert_eq!(h.publish(&[Bytes::from_static(b"next")]).queued, 1);
    let got = messages(&mut minion, 2).await;
    assert!(got[0] == big, "the big message arrived whole");
    assert_eq!(got[1], Bytes::from_static(b"next"));
    wait_until("delivered", Duration::from_secs(10), || {
        slot.delivered.load(Ordering::Relaxed) == 2
    })
    .await;
    assert!(!task.is_finished());
    drop(minion);
    assert!(matches!(
        task.await.unwrap(),
        End::ClientEof | End::Error(_)
    ));
    assert!(h.sessions().is_empty(), "detached when it ended");
}

#[tokio::test]
async fn the_hubs_stop_ends_a_session_whose_write_waits() {
    let h = hub(None);
    let (io, mut minion) = pair().await;
    let task = steady(&h, io, true);
    let slot = subscribe(&h, &mut minion).await;
    h.publish(&[body(BIG)]);
    write_waits(&slot).await;
    h.stop_sessions();
    let end = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the stop ends it")
        .unwrap();
    assert!(matches!(end, End::Shutdown), "{end:?}");
    assert!(h.sessions().is_empty());
}

/// No byte moves for the write timeout (the heartbeat timeout): cut. Bytes that move, however
/// slowly, set it back: a minion that reads is not cut while it reads.
#[tokio::test(start_paused = true)]
async fn a_write_is_cut_after_the_write_timeout_without_progress_only() {
    let hb = Heartbeat {
        interval: Duration::from_secs(1),
        timeout: Duration::from_secs(3),
        ttl: Duration::ZERO,
    };
    let h = hub(Some(hb));
    let (io, mut minion) = pair().await;
    // A ZMTP 3.0 peer: no PINGs, no silence limit; the write timeout still holds.
    let task = steady(&h, io, false);
    let slot = subscribe(&h, &mut minion).await;
    h.publish(&[body(BIG)]);
    write_waits(&slot).await;
    // Read 2 MiB every 2 s (less than the timeout) for longer than the timeout. The kernel
    // lets the session write again in steps (a window update, then room in the send buffer):
    // 2 MiB is one.
    let started = Instant::now();
    let mut chunk = vec![0u8; 2 << 20];
    while started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!task.is_finished(), "cut while the minion reads");
        minion.read_exact(&mut chunk).await.unwrap();
    }
    // Then nothing: cut within the timeout of the last byte that moved.
    let stalled = Instant::now();
    let end = task.await.unwrap();
    assert_eq!(end.cut(), Some("write_timeout"), "{end:?}");
    let after = stalled.elapsed();
    assert!(after <= Duration::from_secs(3), "{after:?}");
}

/// PINGs every interval; a minion that sends nothing for the timeout is cut then, one that
/// sends a byte sets the limit back (the lazily armed timer is set again when it fires).
#[tokio::test(start_paused = true)]
async fn a_silent_minion_is_pinged_and_cut_at_the_heartbeat_timeout() {
    let hb = Heartbeat {
        interval: Duration::from_secs(10),
        timeout: Duration::from_secs(30),
        ttl: Duration::ZERO,
    };
    let h = hub(Some(hb));
    let (io, mut minion) = pair().await;
    let task = steady(&h, io, true);
    subscribe(&h, &mut minion).await;
    // At 25 s the minion speaks (a PING of its own): the limit moves to 55 s.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let spoke = Instant::now();
    let mut f = BytesMut::new();
    Command::Ping {
        ttl: 0,
        context: Bytes::new(),
    }
    .encode_frame(&mut f);
    minion.write_all(&f).await.unwrap();
    let end = task.await.unwrap();
    assert!(matches!(end, End::HeartbeatTimeout), "{end:?}");
    let silent = spoke.elapsed();
    assert!(
        silent >= Duration::from_secs(30) && silent < Duration::from_secs(31),
        "{silent:?}"
    );
    // What the hub sent: a PING every 10 s, and the PONG to the minion's PING.
    let mut buf = BytesMut::new();
    while minion.read_buf(&mut buf).await.unwrap() > 0 {}
    let (dec, mut pings, mut pongs) = (FrameDecoder::default(), 0, 0);
    while let Some(Frame::Command(c)) = dec.decode(&mut buf).unwrap() {
        match Command::parse(&c).unwrap() {
            Command::Ping { .. } => pings += 1,
            Command::Pong { .. } => pongs += 1,
            _ => {}
        }
    }
    assert_eq!((pings, pongs), (5, 1));
}
