//! An admitted `_auth` whose minion left before its master answered (`auth_limit`).
//!
//! A Salt master cannot cancel a request: once an `_auth` is in its queue, a worker decrypts it
//! and signs the reply even if the minion that sent it has given up (its REQ socket timed out
//! and closed). If the gate gave the place back when the minion left, it would let one more
//! `_auth` in while the master still works on the old one, and a master that slows down would
//! be sent more work exactly when it can least take it: the collapse the limit exists to
//! prevent. Its latency figure would also see only the answers that came in time (the slow
//! ones' minions left first) and read the master as faster than it is.
//!
//! So the place stays taken until the master answers: saltgate keeps the connection to the
//! master open (a second descriptor of it; the session itself ends as before), reads until the
//! reply is complete, and gives the place back then, with the reply's latency fed to
//! `max_in_flight: auto` like any other answer. The reply is dropped. A master that sends
//! nothing within [`DRAIN_LIMIT`], closes, or breaks the framing gives the place back at that
//! point. Each such `_auth` is counted (`saltgate_auth_orphaned_total`): the master's work the
//! gate could not save. At most `max_in_flight` of them exist per master: each holds a place.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::auth_limit::AuthPermit;
use super::track::Down;

/// The longest a place is kept for an answer nobody waits for. Past it the master is hung or
/// dropped the request; its health checks decide the rest.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// Keeps `permit` until the master behind `master` completes the reply `down` is part way
/// into (or [`DRAIN_LIMIT`] passes). Without a second descriptor (out of descriptors), the place
/// is given back at once, as before.
pub(super) fn spawn(master: &TcpStream, down: Down, permit: AuthPermit) {
    permit.orphaned();
    let Ok(dup) = socket2::SockRef::from(master).try_clone() else {
        return;
    };
    let std: std::net::TcpStream = dup.into();
    if std.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(stream) = TcpStream::from_std(std) else {
        return;
    };
    tokio::spawn(drain(stream, down, permit, DRAIN_LIMIT));
}

async fn drain(mut stream: TcpStream, mut down: Down, permit: AuthPermit, limit: Duration) {
    let until = tokio::time::Instant::now() + limit;
    let mut buf = [0u8; 2048];
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                if down.observe(&buf[..n]).done {
                    permit.answered();
                    return;
                }
            }
            // Closed, reset, or no answer in time: the place goes back now.
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::continuity::auth_limit::{AuthLimits, Entry};
    use saltgate_config::auth_limit::{AuthLimit, MaxInFlight};
    use saltgate_wire::transport::zeromq::frame::encode_message;
    use tokio::io::AsyncWriteExt;

    fn limit_one() -> AuthLimit {
        AuthLimit {
            max_in_flight: MaxInFlight::Fixed(1),
            ..AuthLimit::default()
        }
    }

    /// A connected pair: saltgate's end, the master's end.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn the_place_is_kept_until_the_master_answers_a_minion_that_left() {
        let limits = AuthLimits::new(&prometheus::Registry::new());
        let gate = limits.gate("m1", &limit_one());
        let Ok(Entry::Admitted(p)) = gate.enter(10) else {
            panic!("the first _auth is admitted");
        };
        let (ours, mut master) = pair().await;
        // The master's side of the handshake has passed already.
        spawn(&ours, Down::resumed(), p);
        // The session's own descriptor goes (the session ended): the connection stays open.
        drop(ours);
        assert_eq!(gate.in_flight(), 1, "the master still works on it");
        assert!(matches!(gate.enter(10), Ok(Entry::Queued(_))));
        assert_eq!(gate.view().orphaned, 1);
        // The master's reply: the REQ envelope's empty delimiter, then the payload.
        let mut reply = bytes::BytesMut::new();
        encode_message(&mut reply, &[&b""[..], &b"answer"[..]]);
        master.write_all(&reply[..3]).await.unwrap();
        master.write_all(&reply[3..]).await.unwrap();
        saltgate_test_support::wait_until("the place given back", Duration::from_secs(5), || {
            gate.in_flight() == 0
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_master_that_never_answers_gets_the_place_back_after_the_limit() {
        let limits = AuthLimits::new(&prometheus::Registry::new());
        let gate = limits.gate("m1", &limit_one());
        let Ok(Entry::Admitted(p)) = gate.enter(10) else {
            panic!("the first _auth is admitted");
        };
        let (ours, _master) = pair().await;
        let dup: std::net::TcpStream = socket2::SockRef::from(&ours).try_clone().unwrap().into();
        let stream = TcpStream::from_std(dup).unwrap();
        let task = tokio::spawn(drain(stream, Down::resumed(), p, DRAIN_LIMIT));
        tokio::time::sleep(DRAIN_LIMIT - Duration::from_secs(1)).await;
        assert_eq!(gate.in_flight(), 1);
        task.await.unwrap();
        assert_eq!(gate.in_flight(), 0);
    }
}
