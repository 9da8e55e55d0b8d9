use super::*;
use crate::continuity::msgpack_walk::{head_mid, Broken, Head, Walker};
use saltgate_wire::envelope::{self, bin, map, text, Value};
use saltgate_wire::salt_tcp::{encode_message, request_frame};

/// A request as Salt's `RequestClient.send` frames it, with a body of `len` bytes.
fn req(mid: &str, len: usize) -> Vec<u8> {
    request_frame(
        mid,
        map(vec![
            ("enc", text("aes")),
            ("load", bin(&vec![0x5a; len])),
            ("version", Value::from(3)),
        ]),
    )
}

/// The master's reply: the request's head echoed.
fn reply(mid: &str, len: usize) -> Vec<u8> {
    encode_message(map(vec![("mid", text(mid))]), bin(&vec![0x33; len]))
}

fn feed_chunked(t: &mut TcpTrack, up: bool, bytes: &[u8], chunk: usize) {
    for c in bytes.chunks(chunk.max(1)) {
        if up {
            t.observe_up(c);
        } else {
            t.observe_down(c);
        }
    }
}

#[test]
fn the_walker_finds_each_message_end_in_any_chunking() {
    let msgs = [
        req("a", 3),
        req("b", 300),
        req("c", 70_000),
        // Nested containers, every width of length field.
        encode_message(
            map(vec![
                ("mid", text("d")),
                ("x", Value::Array(vec![Value::Nil; 20])),
            ]),
            Value::Map(
                (0..40)
                    .map(|i| (Value::from(i), text(&"s".repeat(i * 9))))
                    .collect(),
            ),
        ),
        encode_message(map(vec![]), Value::from(-7i64)),
    ];
    let stream: Vec<u8> = msgs.concat();
    let mut ends = Vec::new();
    let mut at = 0;
    for m in &msgs {
        at += m.len();
        ends.push(at);
    }
    for chunk in [1, 2, 3, 5, 7, 64, 4096, stream.len()] {
        let mut w = Walker::new(1 << 20);
        let mut seen = Vec::new();
        let mut pos = 0;
        for c in stream.chunks(chunk) {
            let mut b = c;
            while !b.is_empty() {
                let (n, end) = w.feed(b).unwrap();
                pos += n;
                b = &b[n..];
                if end {
                    seen.push(pos);
                    assert!(w.at_boundary());
                }
            }
        }
        assert_eq!(seen, ends, "chunk {chunk}");
    }
}

#[test]
fn the_walker_refuses_what_is_not_salts_framing() {
    let zmtp_greeting = [0xffu8, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f];
    let tls_hello = [0x16u8, 3, 1, 0, 0x40];
    let bad_marker = [0x81u8, 0xa4, b'h', b'e', b'a', b'd', 0xc1];
    let mut deep = vec![0x81u8, 0xa1, b'x'];
    deep.extend(std::iter::repeat_n(0x91u8, 200));
    let huge = [0x81u8, 0xa1, b'x', 0xc6, 0x7f, 0xff, 0xff, 0xff];
    for (what, b) in [
        ("zmtp", &zmtp_greeting[..]),
        ("tls", &tls_hello[..]),
        ("0xc1", &bad_marker[..]),
        ("deep", &deep[..]),
        ("huge", &huge[..]),
    ] {
        let mut w = Walker::new(1 << 20);
        assert_eq!(w.feed(b), Err(Broken), "{what}");
        assert_eq!(w.feed(&[0x80]), Err(Broken), "{what}: stays broken");
        assert!(!w.at_boundary());
    }
}

#[test]
fn the_mid_is_read_from_a_head_written_first() {
    let r = req("1234-abcd", 10);
    for n in 0..r.len() {
        let h = head_mid(&r[..n]);
        if h != Head::More {
            assert_eq!(h, Head::Mid(b"1234-abcd".to_vec()), "{n}");
            assert!(n >= 20, "{n}");
        }
    }
    assert_eq!(head_mid(&r), Head::Mid(b"1234-abcd".to_vec()));
    // A bin-typed mid is a mid.
    let b = encode_message(map(vec![("mid", bin(b"xy"))]), Value::Nil);
    assert_eq!(head_mid(&b), Head::Mid(b"xy".to_vec()));
    for (what, bytes) in [
        (
            "body first",
            envelope::encode(&map(vec![
                ("body", Value::Nil),
                ("head", map(vec![("mid", text("m"))])),
            ])),
        ),
        ("no mid", encode_message(map(vec![]), Value::Nil)),
        (
            "int mid",
            encode_message(map(vec![("mid", Value::from(3))]), Value::Nil),
        ),
        ("not a map", envelope::encode(&text("x"))),
        (
            "head over the limit",
            encode_message(map(vec![("pad", text(&"p".repeat(2000)))]), Value::Nil),
        ),
    ] {
        assert_eq!(head_mid(&bytes), Head::Bad, "{what}");
    }
}

#[test]
fn an_unanswered_request_is_kept_and_replayed_whole_in_any_chunking() {
    let r = req("m1", 500);
    for chunk in [1, 3, 17, r.len()] {
        let mut t = TcpTrack::new(1 << 20);
        feed_chunked(&mut t, true, &r, chunk);
        assert_eq!(t.kept_len(), r.len());
        let (bytes, complete) = t.take_replay().unwrap().unwrap();
        assert_eq!(&bytes[..], &r[..]);
        assert!(complete);
    }
}

#[test]
fn a_request_whose_reply_started_is_dropped_and_never_replayed() {
    let (r1, r2) = (req("m1", 40), req("m2", 40));
    let a2 = reply("m2", 5000);
    let mut t = TcpTrack::new(1 << 20);
    t.observe_up(&r1);
    t.observe_up(&r2);
    assert_eq!(t.unanswered(), 2);
    // The reply's head has passed: m2 is answered, but the minion has part of a reply.
    t.observe_down(&a2[..100]);
    assert_eq!(t.unanswered(), 1);
    assert_eq!(t.kept_len(), r1.len());
    assert_eq!(t.take_replay(), Err(Skip::MidReply));
    let ev = t.observe_down(&a2[100..]);
    assert!(ev.done);
    let (bytes, complete) = t.take_replay().unwrap().unwrap();
    assert_eq!((&bytes[..], complete), (&r1[..], true));
}

#[test]
fn replies_answer_their_requests_by_mid_in_any_order() {
    let mut t = TcpTrack::new(1 << 20);
    let ids = ["a", "b", "c", "d"];
    for id in ids {
        t.observe_up(&req(id, 20));
    }
    let down: Vec<u8> = [reply("c", 1), reply("a", 1)].concat();
    feed_chunked(&mut t, false, &down, 7);
    let (bytes, _) = t.take_replay().unwrap().unwrap();
    assert_eq!(&bytes[..], &[req("b", 20), req("d", 20)].concat()[..]);
    // A reply to a mid not in flight changes nothing.
    let mut u = TcpTrack::new(1 << 20);
    u.observe_up(&req("x", 20));
    u.observe_down(&reply("nobody", 3));
    assert_eq!((u.unanswered(), u.gave_up()), (1, false));
}

#[test]
fn a_request_cut_short_is_replayed_as_far_as_it_got() {
    let (r1, r2) = (req("m1", 40), req("m2", 4000));
    let mut t = TcpTrack::new(1 << 20);
    t.observe_up(&r1);
    t.observe_up(&r2[..1000]);
    let (bytes, complete) = t.take_replay().unwrap().unwrap();
    assert_eq!(&bytes[..], &[&r1[..], &r2[..1000]].concat()[..]);
    assert!(!complete);
    // The rest follows from the minion, then the new master answers both.
    t.resumed();
    t.observe_up(&r2[1000..]);
    t.observe_down(&reply("m2", 1));
    t.observe_down(&reply("m1", 1));
    assert_eq!((t.unanswered(), t.kept_len()), (0, 0));
    assert_eq!(t.take_replay(), Ok(None));
}

#[test]
fn the_cap_counts_every_unanswered_request_and_one_over_it_blocks_the_move() {
    let small = req("s1", 100);
    let big = req("b", 1000);
    let cap = small.len() * 2 + 10;
    let mut t = TcpTrack::new(cap);
    t.observe_up(&small);
    t.observe_up(&req("s2", 100));
    assert_eq!(small.len(), req("s2", 100).len());
    assert_eq!(t.kept_len(), small.len() * 2);
    // Does not fit beside them: not kept (nothing held for it), and the move is refused.
    feed_chunked(&mut t, true, &big, 64);
    assert_eq!(t.kept_len(), small.len() * 2);
    assert_eq!(t.take_replay(), Err(Skip::OverCap));
    // Once it is answered, the others move.
    t.observe_down(&reply("b", 1));
    let (bytes, _) = t.take_replay().unwrap().unwrap();
    assert_eq!(bytes.len(), small.len() * 2);
}

#[test]
fn a_request_replayed_once_is_not_replayed_again() {
    let mut t = TcpTrack::new(1 << 20);
    t.observe_up(&req("m", 10));
    assert!(t.take_replay().unwrap().is_some());
    t.resumed();
    assert_eq!(t.take_replay(), Err(Skip::ReplayedOnce));
    // Answered by the second master: the next one moves again.
    t.observe_down(&reply("m", 1));
    t.observe_up(&req("n", 10));
    assert!(t.take_replay().unwrap().is_some());
}

#[test]
fn what_the_tracker_cannot_follow_makes_it_give_up_for_good() {
    let zmtp = [0xffu8, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 1];
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("zmtp from the minion", vec![zmtp.to_vec()]),
        ("a mid twice in flight", vec![req("m", 1), req("m", 1)]),
        ("no mid", vec![encode_message(map(vec![]), Value::Nil)]),
        (
            "too many unanswered",
            (0..=MAX_PENDING).map(|i| req(&i.to_string(), 1)).collect(),
        ),
    ];
    for (what, up) in cases {
        let mut t = TcpTrack::new(1 << 20);
        for b in &up {
            t.observe_up(b);
        }
        assert!(t.gave_up(), "{what}");
        assert_eq!(t.kept_len(), 0, "{what}: nothing held");
        assert_eq!(t.take_replay(), Err(Skip::Protocol), "{what}");
        t.observe_up(&req("later", 1));
        assert_eq!(t.take_replay(), Err(Skip::Protocol), "{what}: for good");
    }
    let mut t = TcpTrack::new(1 << 20);
    t.observe_up(&req("m", 1));
    t.observe_down(b"\x16\x03\x01");
    assert_eq!(t.movable(), Err(Skip::Protocol));
}

#[test]
fn an_idle_session_moves_with_nothing_to_replay_and_holds_nothing() {
    let mut t = TcpTrack::new(1 << 20);
    for i in 0..50 {
        let id = format!("m{i}");
        t.observe_up(&req(&id, 200));
        t.observe_down(&reply(&id, 200));
    }
    assert_eq!((t.unanswered(), t.kept_len()), (0, 0));
    assert_eq!(t.movable(), Ok(()));
    assert_eq!(t.take_replay(), Ok(None));
}
