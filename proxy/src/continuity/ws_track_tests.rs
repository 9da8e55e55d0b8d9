use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use saltgate_wire::salt_ws::{accept_key, handshake_request, OP_PING, OP_PONG, OP_TEXT};

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn upgrade() -> Vec<u8> {
    handshake_request("127.40.0.1:4506", "/", KEY)
}

fn answer() -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\nDate: x\r\n\r\n",
        accept_key(KEY)
    )
    .into_bytes()
}

/// One frame; masked as a client's, or not as a server's.
fn frame(fin: bool, opcode: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mut out = vec![(u8::from(fin) << 7) | opcode];
    let m = if masked { 0x80 } else { 0 };
    let n = payload.len();
    if n < 126 {
        out.push(m | n as u8);
    } else if n <= 0xffff {
        out.push(m | 126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(m | 127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    let key = [0x11, 0x22, 0x33, 0x44];
    if masked {
        out.extend_from_slice(&key);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

fn req(payload: &[u8]) -> Vec<u8> {
    frame(true, OP_BINARY, payload, true)
}

fn reply(payload: &[u8]) -> Vec<u8> {
    frame(true, OP_BINARY, payload, false)
}

/// The binary messages of a client frame stream (what a master would read), control frames
/// skipped; `None` when the stream is not valid or ends mid-frame.
fn messages(mut s: &[u8]) -> Option<Vec<Vec<u8>>> {
    let (mut out, mut cur): (Vec<Vec<u8>>, Option<Vec<u8>>) = (Vec::new(), None);
    while !s.is_empty() {
        let mut w = FrameWalker::new(true);
        let Ok(Step::Head { n, info, .. }) = w.feed(s) else {
            return None;
        };
        let key: Vec<u8> = s[n - 4..n].to_vec();
        let end = n + info.payload as usize;
        let body: Vec<u8> = s
            .get(n..end)?
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ key[i % 4])
            .collect();
        s = &s[end..];
        if info.control() {
            continue;
        }
        let mut m = match (info.opcode, cur.take()) {
            (OP_BINARY, None) => Vec::new(),
            (OP_CONT, Some(m)) => m,
            _ => return None,
        };
        m.extend_from_slice(&body);
        if info.fin {
            out.push(m);
        } else {
            cur = Some(m);
        }
    }
    cur.is_none().then_some(out)
}

fn feed(t: &mut WsTrack, up: bool, bytes: &[u8], rng: &mut StdRng) {
    let mut b = bytes;
    while !b.is_empty() {
        let n = rng.random_range(1..=b.len().min(40));
        if up {
            t.observe_up(&b[..n]);
        } else {
            t.observe_down(&b[..n]);
        }
        b = &b[n..];
    }
}

/// A tracker that has seen the upgrade and its `101`.
fn open(cap: usize) -> WsTrack {
    let mut t = WsTrack::new(cap);
    t.observe_up(&upgrade());
    t.observe_down(&answer());
    t
}

#[test]
fn every_cut_of_a_fragmented_request_replays_into_a_valid_stream() {
    // A request in three fragments, a ping and a pong between them, and 300 bytes of payload
    // across 16-bit lengths.
    let payload: Vec<u8> = (0..700u32).map(|i| (i * 7) as u8).collect();
    let mut frames = frame(false, OP_BINARY, &payload[..100], true);
    frames.extend(frame(true, OP_PING, b"hi", true));
    frames.extend(frame(false, OP_CONT, &payload[100..400], true));
    frames.extend(frame(true, OP_PONG, b"", true));
    frames.extend(frame(true, OP_CONT, &payload[400..], true));
    let up = [upgrade(), frames.clone()].concat();
    let head = upgrade().len();
    let mut rng = StdRng::seed_from_u64(27);
    for cut in 0..=up.len() {
        let mut t = WsTrack::new(1 << 20);
        feed(&mut t, true, &up[..cut], &mut rng);
        t.observe_down(&answer());
        let r = t.take_replay();
        if cut < head {
            assert_eq!(r, Err(Skip::Handshake), "cut {cut}");
            continue;
        }
        assert_eq!(
            t.upgrade().map(|(u, k)| (u.to_vec(), k)),
            Some((upgrade(), KEY))
        );
        let replay = r.unwrap().map(|(b, c)| {
            assert_eq!(c, cut == up.len(), "cut {cut}");
            b.to_vec()
        });
        let replay = replay.unwrap_or_default();
        // What the new master reads: the replay, then the rest from the minion.
        let stream = [replay.as_slice(), &up[cut..]].concat();
        assert_eq!(messages(&stream), Some(vec![payload.clone()]), "cut {cut}");
        // Held: the upgrade and at most the request's frames.
        assert!(t.kept_len() <= head + frames.len(), "cut {cut}");
    }
}

#[test]
fn random_chunking_gives_the_same_replay_as_one_piece() {
    let reqs: Vec<Vec<u8>> = [3usize, 125, 126, 65_535, 65_536, 70_000]
        .iter()
        .map(|&n| req(&vec![0x5a; n]))
        .collect();
    let up = [upgrade(), reqs.concat()].concat();
    let mut whole = open(1 << 20);
    whole.observe_up(&reqs.concat());
    let want = whole.take_replay().unwrap().unwrap();
    assert_eq!(want.0.as_ref(), reqs.concat().as_slice());
    assert!(want.1);
    for seed in 0..20 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut t = WsTrack::new(1 << 20);
        feed(&mut t, true, &up, &mut rng);
        feed(&mut t, false, &answer(), &mut rng);
        assert_eq!(t.unanswered(), reqs.len());
        assert_eq!(t.take_replay().unwrap().unwrap(), want, "seed {seed}");
    }
}

#[test]
fn an_answered_request_is_dropped_and_never_re_sent() {
    let mut t = open(1 << 20);
    t.observe_up(&req(b"first"));
    assert_eq!(t.unanswered(), 1);
    // The start of the reply reaching the minion answers it.
    let r = reply(b"answer");
    // Its header whole (2 bytes).
    let ev = t.observe_down(&r[..2]);
    assert!(ev.started && !ev.done);
    assert_eq!(t.unanswered(), 0);
    assert_eq!(t.kept_len(), upgrade().len());
    // Mid-reply: cannot move.
    assert_eq!(t.take_replay(), Err(Skip::MidReply));
    assert!(t.observe_down(&r[2..]).done);
    assert_eq!(t.take_replay(), Ok(None));
    // A fragmented reply with a ping inside is one answer, done at its last fragment.
    t.observe_up(&req(b"second"));
    t.observe_down(&frame(false, OP_BINARY, b"a", false));
    t.observe_down(&frame(true, OP_PING, b"", false));
    assert_eq!(t.take_replay(), Err(Skip::MidReply));
    assert!(t.observe_down(&frame(true, OP_CONT, b"b", false)).done);
    assert_eq!(t.take_replay(), Ok(None));
}

#[test]
fn requests_in_flight_are_answered_oldest_first() {
    let mut t = open(1 << 20);
    let (a, b) = (req(b"a"), req(b"bb"));
    t.observe_up(&[a.clone(), b.clone()].concat());
    t.observe_down(&reply(b"for a"));
    assert_eq!(t.take_replay().unwrap().unwrap(), (Bytes::from(b), true));
}

#[test]
fn the_answer_to_the_upgrade_decides_what_the_minion_is_given() {
    // No byte of the 101 reached the minion: movable, the next master's 101 goes to it.
    let mut t = WsTrack::new(1024);
    t.observe_up(&upgrade());
    assert!(t.pass_answer());
    assert_eq!(t.take_replay(), Ok(None));
    t.resumed();
    assert!(t.pass_answer());
    // Part of it: the minion's stream is broken.
    t.observe_down(&answer()[..10]);
    assert_eq!(t.take_replay(), Err(Skip::MidReply));
    t.observe_down(&answer()[10..]);
    assert!(!t.pass_answer());
    assert_eq!(t.take_replay(), Ok(None));
    // After a move the new master's 101 is kept from the minion: frames follow.
    t.resumed();
    assert!(!t.pass_answer());
    t.observe_up(&req(b"x"));
    assert!(t.observe_down(&reply(b"y")).done);
    assert!(!t.gave_up());
}

#[test]
fn the_cap_covers_every_request_in_flight() {
    let mut t = open(100);
    t.observe_up(&req(&[1; 60]));
    t.observe_up(&req(&[2; 60]));
    assert_eq!(t.take_replay(), Err(Skip::OverCap));
    assert!(t.kept_len() <= upgrade().len() + 100);
    // Once the one that did not fit is answered, the rest moves again.
    t.observe_down(&reply(b"1"));
    t.observe_down(&reply(b"2"));
    assert_eq!(t.take_replay(), Ok(None));
    t.observe_up(&req(&[3; 60]));
    assert_eq!(t.take_replay().unwrap().unwrap().0.len(), 62 + 4);
}

#[test]
fn a_request_is_re_sent_once() {
    let mut t = open(1024);
    t.observe_up(&req(b"r"));
    assert!(t.take_replay().unwrap().is_some());
    t.resumed();
    assert_eq!(t.take_replay(), Err(Skip::ReplayedOnce));
    // Its answer from the new master clears it.
    t.observe_down(&reply(b"ok"));
    assert_eq!(t.take_replay(), Ok(None));
}

#[test]
fn a_close_frame_either_way_ends_the_websocket() {
    let mut t = open(1024);
    t.observe_up(&frame(true, OP_CLOSE, &[3, 232], true));
    assert!(t.finished());
    let mut t = open(1024);
    t.observe_down(&frame(true, OP_CLOSE, &[3, 233], false));
    assert!(t.finished());
    assert_eq!(t.take_replay(), Err(Skip::Protocol));
}

#[test]
fn hostile_or_unknown_streams_give_up_and_hold_nothing() {
    let text = frame(true, OP_TEXT, b"close", true);
    let mut unmasked = req(b"x");
    unmasked[1] &= 0x7f;
    let mut rsv = req(b"x");
    rsv[0] |= 0x40;
    let mut reserved = req(b"x");
    reserved[0] = 0x83;
    let mut long_ping = frame(true, OP_PING, &[0; 126], true);
    long_ping[1] = 0x80 | 126;
    let mut huge = vec![0x82, 0xff];
    huge.extend_from_slice(&u64::MAX.to_be_bytes());
    huge.extend_from_slice(&[0; 4]);
    let too_big = {
        let mut h = vec![0x82, 0xff];
        h.extend_from_slice(&(MAX_MESSAGE + 1).to_be_bytes());
        h.extend_from_slice(&[0; 4]);
        h
    };
    let cont_of_nothing = frame(true, OP_CONT, b"x", true);
    let frames_bad = [
        text,
        unmasked,
        rsv,
        reserved,
        long_ping,
        huge,
        too_big,
        cont_of_nothing,
    ];
    for (i, bad) in frames_bad.iter().enumerate() {
        let mut t = open(1 << 20);
        t.observe_up(&req(b"fine"));
        t.observe_up(bad);
        assert!(t.gave_up(), "#{i}");
        assert_eq!(t.kept_len(), 0, "#{i}");
        assert_eq!(t.take_replay(), Err(Skip::Protocol), "#{i}");
    }
    let upgrades_bad: [&[u8]; 6] = [
        b"POST / HTTP/1.1\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n",
        b"GET / HTTP/1.1\r\nSec-WebSocket-Key: k\r\n\r\n",
        b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
        b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n",
        b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\nContent-Length: 5\r\n\r\n",
        b"\xff\x00\x01\x7f",
    ];
    for (i, bad) in upgrades_bad.iter().enumerate() {
        let mut t = WsTrack::new(1024);
        t.observe_up(bad);
        assert!(t.gave_up(), "upgrade #{i}");
        assert_eq!(t.kept_len(), 0);
    }
    // An upgrade request that never ends: given up at the limit, nothing held.
    let mut t = WsTrack::new(1024);
    t.observe_up(b"GET / HTTP/1.1\r\n");
    for _ in 0..MAX_HTTP_HEAD / 10 + 1 {
        t.observe_up(b"X-Pad: 12\r");
    }
    assert!(t.gave_up());
    assert_eq!(t.kept_len(), 0);
    // Answers: refused, an extension, a reply to nothing, an unmasked-expected masked frame.
    let answers_bad: [Vec<u8>; 4] = [
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
        [
            &answer()[..answer().len() - 2],
            b"Sec-WebSocket-Extensions: x\r\n\r\n",
        ]
        .concat(),
        [answer(), reply(b"unasked")].concat(),
        [answer(), req(b"masked")].concat(),
    ];
    for (i, bad) in answers_bad.iter().enumerate() {
        let mut t = WsTrack::new(1024);
        t.observe_up(&upgrade());
        t.observe_down(bad);
        assert!(t.gave_up(), "answer #{i}");
        assert_eq!(t.take_replay(), Err(Skip::Protocol));
    }
    // Too many requests in flight.
    let mut t = open(1 << 20);
    for _ in 0..=MAX_PENDING {
        t.observe_up(&req(b"p"));
    }
    assert!(t.gave_up());
}

#[test]
fn random_bytes_never_panic_and_hold_at_most_the_cap() {
    let mut rng = StdRng::seed_from_u64(6455);
    for round in 0..300 {
        let cap = rng.random_range(0..4096);
        let mut t = if round % 2 == 0 {
            open(cap)
        } else {
            WsTrack::new(cap)
        };
        for _ in 0..20 {
            let n = rng.random_range(1..200);
            let mut b: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            if rng.random_bool(0.5) {
                // Valid-looking frames now and then, to get past the first byte.
                b = [req(&b), b].concat();
            }
            if rng.random_bool(0.5) {
                t.observe_up(&b);
            } else {
                t.observe_down(&b);
            }
            assert!(t.kept_len() <= cap + MAX_HTTP_HEAD, "round {round}");
            let _ = t.movable();
        }
        let _ = t.take_replay();
    }
}
