//! Tests of the `tcp` presence peek (split out to keep peek.rs short). Its request envelopes
//! (`auth_envelope`, `ping_envelope`, `aes_envelope`) serve the `ws` peek's tests too.

use bytes::BytesMut;
use rand::{Rng, SeedableRng};

use super::*;
use crate::envelope::{bin, map, salt_compat, text, RequestEnvelope, Value};
use crate::salt_tcp::{encode_message, request_frame};
use crate::sniff::{self, Sighting, Source, DEFAULT_BUDGET};

/// A clear `_auth` envelope shaped as a Salt 3008 minion's (`minion_sign_in_payload`, every
/// string str-typed), about 1 KiB like the real one.
pub(crate) fn auth_envelope(id: &str) -> Value {
    let load = map(vec![
        ("cmd", text("_auth")),
        ("id", text(id)),
        ("nonce", text("5f0c1b8e9a7d4c3b2a1908f7e6d5c4b3")),
        ("enc_algo", text("OAEP-SHA1")),
        ("sig_algo", text("PKCS1v15-SHA1")),
        (
            "pub",
            text(&format!(
                "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
                "A".repeat(392)
            )),
        ),
        ("token", bin(&[0x5a; 256])),
    ]);
    salt_compat(RequestEnvelope::clear(load).to_value())
}

pub(crate) fn ping_envelope() -> Value {
    RequestEnvelope::clear(map(vec![("cmd", text("ping"))])).to_value()
}

pub(crate) fn aes_envelope(id: &str) -> Value {
    envelope::decode(&RequestEnvelope::aes(id, &[0x9c; 180]).encode()).expect("aes envelope")
}

/// One request as Salt's tcp `RequestClient` frames it.
fn frame(body: Value) -> Vec<u8> {
    request_frame(&super::super::new_mid(), body)
}

fn stream(bodies: Vec<Value>) -> Vec<u8> {
    bodies.into_iter().flat_map(frame).collect()
}

fn found(id: &str, source: Source) -> Verdict {
    Verdict::Found(Sighting {
        id: id.into(),
        source,
    })
}

fn gave_up(g: GiveUp) -> Verdict {
    Verdict::GaveUp(g)
}

#[test]
fn a_clear_auth_gives_the_minion_id() {
    let s = stream(vec![auth_envelope("web-01.example.com")]);
    assert!(s.len() > 700 && s.len() < 2048, "{}", s.len());
    assert_eq!(
        peek(&s, DEFAULT_BUDGET),
        found("web-01.example.com", Source::Auth)
    );
}

#[test]
fn an_aes_request_gives_the_id_of_its_envelope() {
    let s = stream(vec![aes_envelope("db-7")]);
    assert_eq!(peek(&s, DEFAULT_BUDGET), found("db-7", Source::Aes));
    let no_id = map(vec![("enc", text("aes")), ("load", bin(&[1; 64]))]);
    assert_eq!(
        peek(&stream(vec![no_id]), DEFAULT_BUDGET),
        gave_up(GiveUp::Encrypted)
    );
}

#[test]
fn pings_are_read_past_until_the_auth() {
    let s = stream(vec![ping_envelope(), ping_envelope(), auth_envelope("m1")]);
    assert_eq!(peek(&s, DEFAULT_BUDGET), found("m1", Source::Auth));
    // A stream of pings alone stays pending.
    let s = stream(vec![ping_envelope(), ping_envelope()]);
    assert_eq!(peek(&s, DEFAULT_BUDGET), Verdict::Pending);
}

#[test]
fn the_verdict_does_not_depend_on_how_the_stream_is_split() {
    let s = stream(vec![
        ping_envelope(),
        auth_envelope("m1"),
        aes_envelope("x"),
    ]);
    let whole = peek(&s, DEFAULT_BUDGET);
    assert_eq!(whole, found("m1", Source::Auth));
    for cut in 0..=s.len() {
        let mut p = TcpPeek::new(DEFAULT_BUDGET);
        p.feed(&s[..cut]);
        assert_eq!(p.feed(&s[cut..]), &whole, "cut at {cut}");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(27);
    for _ in 0..200 {
        let mut p = TcpPeek::new(DEFAULT_BUDGET);
        let mut at = 0;
        while at < s.len() {
            let n = rng.random_range(1..=64).min(s.len() - at);
            p.feed(&s[at..at + n]);
            at += n;
        }
        assert_eq!(p.verdict(), &whole);
    }
}

#[test]
fn a_message_declared_past_the_budget_gives_up_before_its_bytes_arrive() {
    // {"head": {"mid": ..}, "body": {"enc": "clear", "load": <bin32 of 1 MiB>}}: the size is
    // known from the first bytes of the blob.
    let body = map(vec![
        ("enc", text("clear")),
        ("load", bin(&vec![0; 1 << 20])),
    ]);
    let s = frame(body);
    let mut p = TcpPeek::new(4096);
    assert_eq!(p.feed(&s[..120]), &gave_up(GiveUp::OverBudget));
    assert_eq!(p.buffered(), 0);
    // Pings filling the budget without an id: over budget when it is spent.
    let pings = stream((0..200).map(|_| ping_envelope()).collect());
    assert_eq!(peek(&pings, 1024), gave_up(GiveUp::OverBudget));
    // The budget counts from the start of the stream: an auth after 900 bytes of pings does
    // not fit in 1 KiB.
    let mut s = stream((0..12).map(|_| ping_envelope()).collect());
    assert!(s.len() > 900, "{}", s.len());
    s.extend(frame(auth_envelope("late")));
    assert_eq!(peek(&s, 1024), gave_up(GiveUp::OverBudget));
    assert_eq!(peek(&s, DEFAULT_BUDGET), found("late", Source::Auth));
}

#[test]
fn what_is_not_salts_tcp_framing_is_given_up_on() {
    let zmtp_greeting = [0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 1];
    let tls_hello = [
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    let no_head = envelope::encode(&map(vec![("body", ping_envelope())]));
    let head_not_map = envelope::encode(&map(vec![("head", text("x")), ("body", ping_envelope())]));
    let cases: Vec<(&str, Vec<u8>, GiveUp)> = vec![
        ("a ZMTP greeting", zmtp_greeting.to_vec(), GiveUp::Framing),
        ("a TLS ClientHello", tls_hello.to_vec(), GiveUp::Framing),
        (
            "HTTP (a websocket upgrade)",
            b"GET /ws HTTP/1.1\r\n".to_vec(),
            GiveUp::Framing,
        ),
        (
            "the never-valid byte 0xc1",
            vec![0xc1, 0, 0],
            GiveUp::Framing,
        ),
        ("a map without head", no_head, GiveUp::Framing),
        ("a head that is not a map", head_not_map, GiveUp::Framing),
        (
            "a body that is not a map",
            frame(text("hello")),
            GiveUp::Malformed,
        ),
        (
            "a body without enc",
            frame(map(vec![("load", text("x"))])),
            GiveUp::Malformed,
        ),
    ];
    for (what, bytes, want) in cases {
        assert_eq!(peek(&bytes, DEFAULT_BUDGET), gave_up(want), "{what}");
    }
}

#[test]
fn ids_salt_would_refuse_are_not_reported() {
    for bad in ["", ".", "..", "a/b", "a\\b", "a\0b", &"x".repeat(256)] {
        let s = stream(vec![auth_envelope(bad)]);
        assert_eq!(peek(&s, DEFAULT_BUDGET), gave_up(GiveUp::BadId), "{bad:?}");
    }
}

#[test]
fn deep_nesting_and_huge_counts_are_refused_without_allocating() {
    // 200 nested one-element arrays inside head.
    let mut deep = vec![0x82, 0xa4];
    deep.extend_from_slice(b"head");
    deep.extend(std::iter::repeat_n(0x91, 200));
    assert_eq!(peek(&deep, DEFAULT_BUDGET), gave_up(GiveUp::Framing));
    // A map32 declaring 2^32-1 entries.
    let huge = [0xdf, 0xff, 0xff, 0xff, 0xff];
    let mut p = TcpPeek::new(DEFAULT_BUDGET);
    assert_eq!(p.feed(&huge), &gave_up(GiveUp::OverBudget));
}

#[test]
fn hostile_bytes_never_panic_and_never_exceed_the_budget() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4506);
    let real = stream(vec![ping_envelope(), auth_envelope("m")]);
    for i in 0..2000 {
        let mut bytes: Vec<u8> = if i % 2 == 0 {
            (0..rng.random_range(0..3000))
                .map(|_| rng.random())
                .collect()
        } else {
            // A real stream with a few bytes flipped.
            let mut b = real.clone();
            for _ in 0..rng.random_range(1..6) {
                let at = rng.random_range(0..b.len());
                b[at] = rng.random();
            }
            b
        };
        bytes.truncate(3000);
        let budget = rng.random_range(0..2048);
        let mut p = TcpPeek::new(budget);
        let mut at = 0;
        while at < bytes.len() && !p.verdict().is_final() {
            let n = rng.random_range(1..200).min(bytes.len() - at);
            p.feed(&bytes[at..at + n]);
            assert!(
                p.buffered() <= p.budget(),
                "holds {} of {}",
                p.buffered(),
                p.budget()
            );
            at += n;
        }
    }
}

#[test]
fn tcp_and_zeromq_peeks_agree_on_the_same_requests() {
    use crate::zmtp::command::{Command, Properties};
    use crate::zmtp::frame::encode_message as zmtp_message;
    use crate::zmtp::greeting::Greeting;

    let bodies = [
        vec![auth_envelope("same-id")],
        vec![ping_envelope(), aes_envelope("aes-id")],
        vec![auth_envelope("../bad")],
        vec![map(vec![("enc", text("rot13"))])],
    ];
    for b in bodies {
        let mut z = BytesMut::new();
        z.extend_from_slice(&Greeting::ours(false).encode());
        Command::Ready(Properties::default().with("Socket-Type", "REQ")).encode_frame(&mut z);
        for v in &b {
            zmtp_message(&mut z, &[&b""[..], &envelope::encode(v)]);
        }
        assert_eq!(
            peek(&stream(b.clone()), DEFAULT_BUDGET),
            sniff::sniff(&z, DEFAULT_BUDGET),
            "{b:?}"
        );
    }
}

#[test]
fn a_frame_written_by_encode_message_with_extra_head_keys_is_read() {
    // Salt's reply head echoes the request's; a head with more keys is still framing.
    let head = map(vec![("mid", text("1")), ("x", Value::Nil)]);
    let s = encode_message(head, auth_envelope("m2"));
    assert_eq!(peek(&s, DEFAULT_BUDGET), found("m2", Source::Auth));
}
