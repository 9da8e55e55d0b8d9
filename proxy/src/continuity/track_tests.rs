use bytes::BytesMut;
use saltgate_wire::transport::zeromq::frame::encode_message;
use saltgate_wire::transport::zeromq::{Command, Greeting, Properties};

use super::*;

fn ready(socket_type: &str) -> Vec<u8> {
    let mut b = BytesMut::new();
    Command::Ready(
        Properties::default()
            .with("Socket-Type", socket_type.to_owned())
            .with("Identity", "salt-req/minion/m1/1/ab".to_owned()),
    )
    .encode_frame(&mut b);
    b.to_vec()
}

fn msg(parts: &[&[u8]]) -> Vec<u8> {
    let mut b = BytesMut::new();
    encode_message(&mut b, parts);
    b.to_vec()
}

fn ping() -> Vec<u8> {
    let mut b = BytesMut::new();
    Command::Ping {
        ttl: 0,
        context: Default::default(),
    }
    .encode_frame(&mut b);
    b.to_vec()
}

fn minion_handshake() -> Vec<u8> {
    let mut v = Greeting::ours(false).encode().to_vec();
    v.extend(ready("REQ"));
    v
}

fn master_handshake() -> Vec<u8> {
    let mut v = Greeting::ours(true).encode().to_vec();
    v.extend(ready("ROUTER"));
    v
}

/// Feeds `bytes` one byte at a time and in one piece: the outcome must not depend on chunking.
fn up_both(cap: usize, bytes: &[u8]) -> (Up, Up) {
    let mut a = Up::new(cap);
    a.observe(bytes);
    let mut b = Up::new(cap);
    for x in bytes {
        b.observe(std::slice::from_ref(x));
    }
    (a, b)
}

#[test]
fn an_unanswered_request_is_kept_whole_with_its_framing_in_any_chunking() {
    let req = msg(&[b"", &[7u8; 300]]);
    let mut s = minion_handshake();
    s.extend(ping());
    s.extend(&req);
    for mut up in <[Up; 2]>::from(up_both(4096, &s)) {
        assert_eq!(up.req(), Req::Waiting);
        assert_eq!(up.ready_frame(), Some(&ready("REQ")[..]));
        let (bytes, complete) = up.take_replay().unwrap().unwrap();
        assert!(complete);
        assert_eq!(&bytes[..], &req[..], "framing kept, the PING left out");
        assert_eq!(up.take_replay(), Err(Skip::ReplayedOnce), "at most once");
    }
}

#[test]
fn a_request_being_sent_is_resent_from_its_start_and_an_answered_one_never() {
    let req = msg(&[b"", b"hello"]);
    let mut s = minion_handshake();
    s.extend(&req[..4]);
    let (mut up, _) = up_both(4096, &s);
    assert_eq!(up.req(), Req::Sending);
    let (bytes, complete) = up.take_replay().unwrap().unwrap();
    assert_eq!((&bytes[..], complete), (&req[..4], false));
    up.observe(&req[4..]);
    assert_eq!(up.req(), Req::Waiting);
    up.reply_started();
    assert_eq!(up.kept_len(), 0, "dropped once the reply starts");
    assert_eq!(up.take_replay(), Ok(None));
    up.reply_done();
    assert_eq!(up.req(), Req::Idle);
    assert_eq!(up.take_replay(), Ok(None));
}

#[test]
fn over_the_cap_nothing_is_kept_and_the_session_cannot_move() {
    let mut s = minion_handshake();
    s.extend(msg(&[b"", &[1u8; 2000]]));
    let (mut up, _) = up_both(1000, &s);
    assert_eq!(up.req(), Req::OverCap { sent: true });
    assert_eq!(up.kept_len(), 0);
    assert_eq!(up.take_replay(), Err(Skip::OverCap));
    up.reply_started();
    up.reply_done();
    up.observe(&msg(&[b"", b"small"]));
    assert!(
        matches!(up.take_replay(), Ok(Some((_, true)))),
        "the next one is kept"
    );
}

#[test]
fn not_a_req_socket_or_not_zmtp_gives_up() {
    let mut s = Greeting::ours(false).encode().to_vec();
    s.extend(ready("DEALER"));
    let (mut a, mut b) = up_both(4096, &s);
    assert_eq!(a.take_replay(), Err(Skip::Protocol));
    assert_eq!(b.take_replay(), Err(Skip::Protocol));
    let (mut up, _) = up_both(4096, b"GET / HTTP/1.1\r\n\r\n");
    assert!(up.gave_up());
    assert_eq!(up.take_replay(), Err(Skip::Protocol));
    let (mut up, _) = up_both(4096, &Greeting::ours(false).encode()[..40]);
    assert_eq!(up.take_replay(), Err(Skip::Handshake));
    // Two requests without a reply between them: a DEALER in REQ's clothing.
    let mut s = minion_handshake();
    s.extend(msg(&[b"", b"a"]));
    s.extend(msg(&[b"", b"b"]));
    let (up, _) = up_both(4096, &s);
    assert!(up.gave_up());
}

#[test]
fn the_master_side_knows_where_replies_start_and_end() {
    let mut d = Down::new();
    assert_eq!(d.movable(), Err(Skip::Handshake));
    let mut s = master_handshake();
    s.extend(ping());
    let ev = d.observe(&s);
    assert_eq!(ev, ReplyEvents::default());
    assert_eq!(d.movable(), Ok(()));
    let reply = msg(&[b"", &[9u8; 400]]);
    let ev = d.observe(&reply[..3]);
    assert!(ev.started && !ev.done);
    assert_eq!(d.movable(), Err(Skip::MidReply));
    let ev = d.observe(&reply[3..]);
    assert!(!ev.started && ev.done);
    assert_eq!(d.movable(), Ok(()));
    // Part of a PING: the minion's stream is mid-frame.
    d.observe(&ping()[..1]);
    assert_eq!(d.movable(), Err(Skip::MidReply));
    let mut r = Down::resumed();
    assert_eq!(r.movable(), Ok(()));
    let ev = r.observe(&reply);
    assert!(ev.started && ev.done);
    let mut bad = Down::new();
    let mut s = Greeting::ours(true).encode().to_vec();
    s.extend(msg(&[b"x"]));
    bad.observe(&s);
    assert_eq!(bad.movable(), Err(Skip::Protocol));
}

#[test]
fn the_scanner_refuses_reserved_flags_and_frames_over_the_limit() {
    let mut sc = Scanner::new();
    let mut s = Greeting::ours(false).encode().to_vec();
    s.push(0x80);
    assert_eq!(sc.feed(&s, |_| {}), Err(Broken));
    let mut sc = Scanner::new();
    let mut s = Greeting::ours(false).encode().to_vec();
    s.push(FLAG_LONG);
    s.extend(u64::MAX.to_be_bytes());
    assert_eq!(sc.feed(&s, |_| {}), Err(Broken));
}
