//! Unit and property tests of the request-port sniffer (split out to keep sniff.rs short).

use std::sync::OnceLock;

use bytes::{BufMut, BytesMut};
use rand::{Rng, SeedableRng};

use super::*;
use crate::envelope::{bin, map, salt_compat, text, RequestEnvelope};
use crate::rsa::{EncAlgo, PrivateKey};
use crate::zmtp::command::{Command, Properties};
use crate::zmtp::frame::{encode_frame, encode_message, FLAG_COMMAND};
use crate::zmtp::greeting::Greeting;

/// A minion key and a master key (2048 bits, as Salt's): generated once.
fn keys() -> &'static (PrivateKey, PrivateKey) {
    static KEYS: OnceLock<(PrivateKey, PrivateKey)> = OnceLock::new();
    KEYS.get_or_init(|| {
        (
            PrivateKey::generate(2048).expect("keygen"),
            PrivateKey::generate(2048).expect("keygen"),
        )
    })
}

/// A clear `_auth` envelope as a Salt 3008 minion packs it (`crypt.py` `minion_sign_in_payload`,
/// msgpack with `use_bin_type=False`: every string and blob str-typed), with the token
/// OAEP-encrypted to the cached master key.
fn auth_payload(id: &str) -> Vec<u8> {
    let (minion, master) = keys();
    let token = master
        .public_key()
        .encrypt(EncAlgo::OaepSha1, b"0123456789abcdef0123456789abcdef")
        .expect("oaep");
    let load = map(vec![
        ("cmd", text("_auth")),
        ("id", text(id)),
        ("nonce", text("5f0c1b8e9a7d4c3b2a1908f7e6d5c4b3")),
        ("enc_algo", text("OAEP-SHA1")),
        ("sig_algo", text("PKCS1v15-SHA1")),
        (
            "pub",
            text(&minion.public_key().to_clean_pem().expect("pem")),
        ),
        ("token", bin(&token)),
    ]);
    envelope::encode(&salt_compat(RequestEnvelope::clear(load).to_value()))
}

/// An `aes` request as a minion's long-lived request socket sends it.
fn aes_payload(id: &str) -> Vec<u8> {
    RequestEnvelope::aes(id, &[0x9c; 180]).encode()
}

/// The greeting and READY a libzmq REQ sends on connect (ZMTP 3.1, NULL).
fn req_handshake() -> BytesMut {
    let mut out = BytesMut::new();
    out.put_slice(&Greeting::ours(false).encode());
    Command::Ready(
        Properties::default()
            .with("Socket-Type", "REQ")
            .with("Identity", ""),
    )
    .encode_frame(&mut out);
    out
}

/// What a REQ client sends: handshake, then each request as `["", payload]`.
fn req_stream(payloads: &[&[u8]]) -> Vec<u8> {
    let mut out = req_handshake();
    for p in payloads {
        encode_message(&mut out, &[&b""[..], p]);
    }
    out.to_vec()
}

fn found(id: &str, source: Source) -> Verdict {
    Verdict::Found(Sighting {
        id: id.into(),
        source,
    })
}

/// Feeds `stream` cut at `cuts` (sorted offsets).
fn feed_cut(stream: &[u8], cuts: &[usize], budget: usize) -> Sniffer {
    let mut s = Sniffer::new(budget);
    let mut from = 0;
    for &c in cuts.iter().chain(std::iter::once(&stream.len())) {
        s.feed(&stream[from..c]);
        from = c;
    }
    s
}

#[test]
fn a_real_auth_is_read_cut_at_every_byte_boundary() {
    let stream = req_stream(&[&auth_payload("web-01.example.com")]);
    assert!(stream.len() > 700, "a real _auth is about 1 KiB");
    let want = found("web-01.example.com", Source::Auth);
    for cut in 0..=stream.len() {
        let s = feed_cut(&stream, &[cut], DEFAULT_BUDGET);
        assert_eq!(s.verdict(), &want, "cut at {cut}");
        assert_eq!(s.buffered(), 0, "the buffer is freed once the id is known");
    }
    let mut s = Sniffer::new(DEFAULT_BUDGET);
    for (i, b) in stream.iter().enumerate() {
        let v = s.feed(std::slice::from_ref(b)).clone();
        assert_eq!(v.is_final(), i + 1 == stream.len(), "byte {i}");
    }
    assert_eq!(s.verdict(), &want);
}

/// Bytes a real libzmq REQ (pyzmq 27.3, libzmq 4.3.5) sent for Salt 3008.5's `salt.payload.dumps`
/// of an `_auth`, an `aes` request and a clear `ping` (the fuzz seeds; their first two bytes are
/// the fuzz target's knobs).
const CAPTURED_AUTH: &[u8] = include_bytes!("../../fuzz/seeds/presence_sniffer/salt_auth");
const CAPTURED_AES: &[u8] = include_bytes!("../../fuzz/seeds/presence_sniffer/salt_aes");
const CAPTURED_PING: &[u8] = include_bytes!("../../fuzz/seeds/presence_sniffer/salt_clear_ping");

#[test]
fn bytes_captured_from_libzmq_and_salt_are_read_cut_at_every_byte_boundary() {
    for (stream, want) in [
        (
            &CAPTURED_AUTH[2..],
            found("web-01.example.com", Source::Auth),
        ),
        (&CAPTURED_AES[2..], found("web-01.example.com", Source::Aes)),
        (&CAPTURED_PING[2..], Verdict::Pending),
    ] {
        for cut in 0..=stream.len() {
            assert_eq!(
                feed_cut(stream, &[cut], DEFAULT_BUDGET).verdict(),
                &want,
                "cut at {cut}"
            );
        }
    }
}

#[test]
fn an_aes_request_gives_the_id_of_its_envelope() {
    let stream = req_stream(&[&aes_payload("db1")]);
    for cut in 0..=stream.len() {
        assert_eq!(
            feed_cut(&stream, &[cut], DEFAULT_BUDGET).verdict(),
            &found("db1", Source::Aes)
        );
    }
}

#[test]
fn a_clear_ping_is_read_past_and_heartbeats_are_skipped() {
    let mut stream = req_stream(&[&RequestEnvelope::ping().encode()]);
    let mut pong = BytesMut::new();
    Command::Pong {
        context: bytes::Bytes::new(),
    }
    .encode_frame(&mut pong);
    stream.extend_from_slice(&pong);
    let mut rest = BytesMut::new();
    encode_message(&mut rest, &[&b""[..], &auth_payload("m1")]);
    stream.extend_from_slice(&rest);
    assert_eq!(sniff(&stream, DEFAULT_BUDGET), found("m1", Source::Auth));
    // Without the _auth: still pending, holding only what it has not parsed.
    let head = req_stream(&[&RequestEnvelope::ping().encode()]);
    let mut s = Sniffer::new(DEFAULT_BUDGET);
    assert_eq!(s.feed(&head), &Verdict::Pending);
}

#[test]
fn other_protocols_are_given_up_at_once() {
    // Salt's TCP transport: a msgpack map, no greeting.
    let tcp = RequestEnvelope::ping().encode();
    let mut s = Sniffer::new(DEFAULT_BUDGET);
    assert_eq!(s.feed(&tcp[..1]), &Verdict::GaveUp(GiveUp::NotZmtp));
    assert_eq!(
        sniff(b"GET / HTTP/1.1\r\n", DEFAULT_BUDGET),
        Verdict::GaveUp(GiveUp::NotZmtp)
    );
    let mut g = Greeting::ours(false).encode();
    g[10] = 2;
    assert_eq!(
        sniff(&g[..11], DEFAULT_BUDGET),
        Verdict::GaveUp(GiveUp::NotZmtp)
    );
    let mut g = Greeting::ours(false).encode();
    g[12..17].copy_from_slice(b"CURVE");
    assert_eq!(
        sniff(&g, DEFAULT_BUDGET),
        Verdict::GaveUp(GiveUp::Mechanism)
    );
}

#[test]
fn an_aes_envelope_without_an_id_is_given_up() {
    let mut env = RequestEnvelope::aes("x", &[1, 2, 3]);
    env.id = None;
    assert_eq!(
        sniff(&req_stream(&[&env.encode()]), DEFAULT_BUDGET),
        Verdict::GaveUp(GiveUp::Encrypted)
    );
}

#[test]
fn ids_salt_would_refuse_are_given_up() {
    let long = "a".repeat(MAX_ID_LEN + 1);
    for bad in [
        "",
        ".",
        "..",
        "../etc",
        "a/b",
        "a\\b",
        "a\0b",
        "a\nb",
        long.as_str(),
    ] {
        assert_eq!(
            sniff(&req_stream(&[&auth_payload(bad)]), DEFAULT_BUDGET),
            Verdict::GaveUp(GiveUp::BadId),
            "{bad:?}"
        );
    }
    let ok = "a".repeat(MAX_ID_LEN);
    assert_eq!(
        sniff(&req_stream(&[&auth_payload(&ok)]), DEFAULT_BUDGET),
        found(&ok, Source::Auth)
    );
    // Not UTF-8, or not a string.
    let load = map(vec![("cmd", text("_auth")), ("id", bin(&[0xff, 0xfe]))]);
    let p = salt_compat(RequestEnvelope::clear(load).to_value());
    assert_eq!(
        sniff(&req_stream(&[&envelope::encode(&p)]), DEFAULT_BUDGET),
        Verdict::GaveUp(GiveUp::BadId)
    );
    let load = map(vec![("cmd", text("_auth")), ("id", Value::from(7))]);
    assert_eq!(
        sniff(
            &req_stream(&[&RequestEnvelope::clear(load).encode()]),
            DEFAULT_BUDGET
        ),
        Verdict::GaveUp(GiveUp::BadId)
    );
}

#[test]
fn a_frame_ending_past_the_budget_is_given_up_before_its_body_arrives() {
    let mut stream = req_handshake();
    stream.put_slice(&[0x03, 0, 0, 0, 0, 0, 0, 0, 0]); // delimiter, MORE, long form
    stream.put_slice(&[0x02, 0, 0, 0, 0, 0, 0, 0x40, 0]); // a 16 KiB payload announced
    let mut s = Sniffer::new(DEFAULT_BUDGET);
    assert_eq!(s.feed(&stream), &Verdict::GaveUp(GiveUp::OverBudget));
    // 64 MiB announced: over the frame limit itself.
    let mut stream = req_handshake();
    stream.put_slice(&[0x02, 0, 0, 0, 0, 4, 0, 0, 0]);
    assert_eq!(
        sniff(&stream, DEFAULT_BUDGET),
        Verdict::GaveUp(GiveUp::OverBudget)
    );
    // A budget too small for the _auth that follows.
    let auth = req_stream(&[&auth_payload("m")]);
    assert_eq!(sniff(&auth, 512), Verdict::GaveUp(GiveUp::OverBudget));
    // Many small pings: the budget runs out.
    let ping = RequestEnvelope::ping().encode();
    let pings: Vec<&[u8]> = std::iter::repeat_n(ping.as_slice(), 2000).collect();
    let mut s = Sniffer::new(4096);
    assert_eq!(
        s.feed(&req_stream(&pings)),
        &Verdict::GaveUp(GiveUp::OverBudget)
    );
    assert_eq!(s.buffered(), 0);
}

#[test]
fn framing_errors_and_messages_before_ready_are_given_up() {
    let mut g = BytesMut::from(&Greeting::ours(false).encode()[..]);
    encode_message(&mut g, &[&b""[..], b"x"]);
    assert_eq!(sniff(&g, DEFAULT_BUDGET), Verdict::GaveUp(GiveUp::Framing));
    let mut g = req_handshake();
    g.put_slice(&[0x08, 0]);
    assert_eq!(sniff(&g, DEFAULT_BUDGET), Verdict::GaveUp(GiveUp::Framing));
    let mut g = BytesMut::from(&Greeting::ours(false).encode()[..]);
    encode_frame(&mut g, FLAG_COMMAND, b"\x04PING\x00\x00");
    assert_eq!(sniff(&g, DEFAULT_BUDGET), Verdict::GaveUp(GiveUp::Framing));
    // A payload that is not an envelope.
    assert_eq!(
        sniff(&req_stream(&[b"\xc1"]), DEFAULT_BUDGET),
        Verdict::GaveUp(GiveUp::Malformed)
    );
    assert_eq!(
        sniff(
            &req_stream(&[&envelope::encode(&text("hi"))]),
            DEFAULT_BUDGET
        ),
        Verdict::GaveUp(GiveUp::Malformed)
    );
}

#[test]
fn a_final_verdict_ignores_later_bytes() {
    let stream = req_stream(&[&auth_payload("first")]);
    let mut s = Sniffer::new(DEFAULT_BUDGET);
    s.feed(&stream);
    s.feed(&req_stream(&[&auth_payload("second")]));
    assert_eq!(s.verdict(), &found("first", Source::Auth));
    assert_eq!(s.buffered(), 0);
}

/// Random streams (noise, and real streams with bytes flipped, cut or added) in random
/// chunkings: no panic, the verdict is the one-piece verdict, the buffer stays within the
/// budget, and any id found is one Salt would accept.
#[test]
fn random_streams_in_random_chunks_never_panic_and_agree_with_one_piece() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5a17_6a7e);
    let real = [
        req_stream(&[&auth_payload("minion-a")]),
        req_stream(&[&RequestEnvelope::ping().encode(), &aes_payload("minion-b")]),
    ];
    for round in 0..3000 {
        let mut stream = match round % 3 {
            0 => (0..rng.random_range(0..600))
                .map(|_| rng.random())
                .collect(),
            _ => real[round % 2].clone(),
        };
        if round % 3 != 0 {
            for _ in 0..rng.random_range(0..4) {
                let i = rng.random_range(0..stream.len());
                stream[i] = rng.random();
            }
            if rng.random_bool(0.3) {
                stream.truncate(rng.random_range(0..stream.len()));
            }
        }
        let budget = [MIN_BUDGET, 700, 1100, DEFAULT_BUDGET][rng.random_range(0..4)];
        let whole = sniff(&stream, budget);
        let mut s = Sniffer::new(budget);
        let mut at = 0;
        while at < stream.len() {
            let n = rng.random_range(1..=64).min(stream.len() - at);
            s.feed(&stream[at..at + n]);
            assert!(
                s.buffered() <= budget,
                "round {round}: holds {}",
                s.buffered()
            );
            at += n;
        }
        assert_eq!(s.verdict(), &whole, "round {round}");
        if let Verdict::Found(f) = &whole {
            assert!(
                valid_id(&text(&f.id)).is_some(),
                "round {round}: {:?}",
                f.id
            );
        }
    }
}
