//! Tests of the `ws` presence peek, on hand-built frames (the envelopes are the `tcp` peek's
//! tests', so both transports are tested on the same requests).

use rand::{Rng, SeedableRng};

use super::*;
use crate::envelope::{bin, map, text, Value};
use crate::salt_tcp::peek::tests::{aes_envelope, auth_envelope, ping_envelope};
use crate::sniff::{Sighting, Source, DEFAULT_BUDGET};

/// The upgrade request of aiohttp 3.14.5's `ws_connect` (Salt 3008.5's), as captured on the wire,
/// for `/ws` (the publish client's path; the request client's is `/`).
const UPGRADE: &[u8] = b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:35541\r\nUpgrade: websocket\r\n\
Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: D2YEbg66NJJgJQe3WYEd3g==\r\n\
Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nUser-Agent: Python/3.11 aiohttp/3.14.5\r\n\r\n";

const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// How a frame's length is written.
#[derive(Clone, Copy)]
enum Len {
    /// The shortest form (RFC 6455: 7, 16 or 64 bits by size).
    Shortest,
    /// Always 16 bits, always 64 bits (longer than needed; receivers take it).
    Bits16,
    Bits64,
}

/// One masked client frame.
fn frame_with(fin: bool, opcode: u8, payload: &[u8], len: Len) -> Vec<u8> {
    let n = payload.len();
    let len = match len {
        Len::Shortest if n < 126 => Len::Shortest,
        Len::Shortest if n <= 0xffff => Len::Bits16,
        Len::Shortest => Len::Bits64,
        l => l,
    };
    let mut out = vec![u8::from(fin) << 7 | opcode];
    match len {
        Len::Shortest => out.push(0x80 | n as u8),
        Len::Bits16 => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        Len::Bits64 => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&MASK);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
    out
}

fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    frame_with(fin, opcode, payload, Len::Shortest)
}

/// A request as Salt's `ws` `RequestClient` sends it: one binary frame, the bare envelope.
fn request(v: Value) -> Vec<u8> {
    frame(true, OP_BINARY, &envelope::encode(&v))
}

/// The upgrade followed by `frames`.
fn stream(frames: Vec<Vec<u8>>) -> Vec<u8> {
    let mut s = UPGRADE.to_vec();
    s.extend(frames.into_iter().flatten());
    s
}

/// `payload` in `parts` data frames (a binary first frame, then continuations), with `between`
/// inserted after each but the last.
fn fragmented(payload: &[u8], parts: usize, between: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let size = payload.len().div_ceil(parts);
    let chunks: Vec<&[u8]> = payload.chunks(size).collect();
    let mut out = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let op = if i == 0 { OP_BINARY } else { OP_CONT };
        let last = i + 1 == chunks.len();
        out.push(frame(last, op, c));
        if !last {
            out.extend(between.iter().cloned());
        }
    }
    out
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

/// Feeds `s` cut at every byte, and in random chunks: the verdict must be the one-piece one.
fn assert_any_chunking_gives(s: &[u8], budget: usize, want: &Verdict) {
    assert_eq!(&peek(s, budget), want, "in one piece");
    for cut in 0..=s.len() {
        let mut p = WsPeek::new(budget);
        p.feed(&s[..cut]);
        assert_eq!(p.feed(&s[cut..]), want, "cut at {cut}");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(8080);
    for _ in 0..100 {
        let mut p = WsPeek::new(budget);
        let mut at = 0;
        while at < s.len() {
            let n = rng.random_range(1..=48).min(s.len() - at);
            p.feed(&s[at..at + n]);
            assert!(p.buffered() <= p.budget());
            at += n;
        }
        assert_eq!(p.verdict(), want);
    }
}

#[test]
fn a_clear_auth_after_the_upgrade_gives_the_minion_id() {
    let s = stream(vec![request(auth_envelope("web-01.example.com"))]);
    // A real-sized `_auth` (~1 KiB) has a 16-bit length.
    assert_eq!(s[UPGRADE.len()..][..2], [0x82, 0x80 | 126]);
    assert_eq!(
        peek(&s, DEFAULT_BUDGET),
        found("web-01.example.com", Source::Auth)
    );
}

#[test]
fn an_aes_request_gives_the_id_of_its_envelope() {
    let s = stream(vec![request(aes_envelope("db-7"))]);
    assert_eq!(peek(&s, DEFAULT_BUDGET), found("db-7", Source::Aes));
    let no_id = map(vec![("enc", text("aes")), ("load", bin(&[1; 64]))]);
    assert_eq!(
        peek(&stream(vec![request(no_id)]), DEFAULT_BUDGET),
        gave_up(GiveUp::Encrypted)
    );
}

#[test]
fn seven_sixteen_and_sixty_four_bit_lengths_are_read() {
    // A small aes request fits a 7-bit length.
    let small = envelope::encode(&map(vec![
        ("enc", text("aes")),
        ("load", bin(&[7; 32])),
        ("id", text("m7")),
    ]));
    assert!(small.len() < 126, "{}", small.len());
    let auth = envelope::encode(&auth_envelope("m16"));
    for (payload, want) in [
        (small, found("m7", Source::Aes)),
        (auth, found("m16", Source::Auth)),
    ] {
        for len in [Len::Shortest, Len::Bits16, Len::Bits64] {
            let s = stream(vec![frame_with(true, OP_BINARY, &payload, len)]);
            assert_any_chunking_gives(&s, DEFAULT_BUDGET, &want);
        }
    }
    // A message over 64 KiB takes the 64-bit form; read when the budget holds it.
    let big = map(vec![
        ("enc", text("clear")),
        (
            "load",
            map(vec![
                ("cmd", text("_auth")),
                ("id", text("m64")),
                ("pad", bin(&vec![0x11; 70_000])),
            ]),
        ),
    ]);
    let s = stream(vec![request(big)]);
    assert_eq!(s[UPGRADE.len() + 1], 0x80 | 127);
    assert_eq!(peek(&s, 128 * 1024), found("m64", Source::Auth));
}

#[test]
fn a_fragmented_message_with_control_frames_between_its_parts_is_read() {
    let payload = envelope::encode(&auth_envelope("frag-1"));
    let controls = [
        frame(true, OP_PING, b"are you there"),
        frame(true, OP_PONG, b""),
    ];
    for parts in [2, 3, 7] {
        for between in [&[][..], &controls[..1], &controls[..]] {
            let s = stream(fragmented(&payload, parts, between));
            assert_eq!(
                peek(&s, DEFAULT_BUDGET),
                found("frag-1", Source::Auth),
                "{parts} parts, {} control frames between",
                between.len()
            );
        }
    }
    // Empty fragments are fragments too.
    let mut frames = vec![frame(false, OP_BINARY, b"")];
    frames.extend(fragmented(&payload, 2, &[]).into_iter().map(|mut f| {
        f[0] = (f[0] & 0x80) | OP_CONT;
        f
    }));
    assert_eq!(
        peek(&stream(frames), DEFAULT_BUDGET),
        found("frag-1", Source::Auth)
    );
}

#[test]
fn the_verdict_does_not_depend_on_how_the_stream_is_split() {
    let mut frames = vec![
        frame(true, OP_PING, b"p"),
        request(ping_envelope()),
        frame(true, OP_TEXT, b"hello"),
    ];
    frames.extend(fragmented(
        &envelope::encode(&auth_envelope("split-1")),
        3,
        &[frame(true, OP_PONG, b"x")],
    ));
    frames.push(request(aes_envelope("not-this-one")));
    let s = stream(frames);
    assert_any_chunking_gives(&s, DEFAULT_BUDGET, &found("split-1", Source::Auth));
}

#[test]
fn pings_texts_and_closes_are_read_past_until_an_id() {
    let s = stream(vec![
        request(ping_envelope()),
        frame(false, OP_TEXT, b"clo"),
        frame(true, OP_CONT, b"se"),
        frame(true, OP_CLOSE, &1000u16.to_be_bytes()),
        request(ping_envelope()),
        request(aes_envelope("late-id")),
    ]);
    assert_eq!(peek(&s, DEFAULT_BUDGET), found("late-id", Source::Aes));
    // The upgrade alone, and clear pings alone, stay pending.
    assert_eq!(peek(UPGRADE, DEFAULT_BUDGET), Verdict::Pending);
    let s = stream(vec![request(ping_envelope()), request(ping_envelope())]);
    assert_eq!(peek(&s, DEFAULT_BUDGET), Verdict::Pending);
}

#[test]
fn a_final_verdict_ignores_later_bytes_and_frees_its_buffer() {
    let s = stream(vec![request(auth_envelope("first"))]);
    let mut p = WsPeek::new(DEFAULT_BUDGET);
    assert_eq!(p.feed(&s), &found("first", Source::Auth));
    assert_eq!(p.buffered(), 0);
    assert_eq!(p.feed(&[0xff; 64]), &found("first", Source::Auth));
    assert_eq!(p.buffered(), 0);
}

#[test]
fn what_is_not_a_websocket_upgrade_is_given_up_on() {
    let zmtp_greeting = [0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 1];
    let tls_hello = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01];
    let tcp_request = crate::salt_tcp::request_frame("1", auth_envelope("m"));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("a ZMTP greeting", zmtp_greeting.to_vec()),
        ("a TLS ClientHello", tls_hello.to_vec()),
        ("Salt's tcp framing", tcp_request),
        ("a POST", b"POST /ws HTTP/1.1\r\n".to_vec()),
        ("lower-case get", b"get /ws HTTP/1.1\r\n".to_vec()),
        (
            "a GET without Upgrade",
            b"GET /ws HTTP/1.1\r\nHost: m\r\nConnection: keep-alive\r\n\r\n".to_vec(),
        ),
        (
            "an upgrade to another protocol",
            b"GET /ws HTTP/1.1\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n".to_vec(),
        ),
        (
            "HTTP/1.0",
            b"GET /ws HTTP/1.0\r\nUpgrade: websocket\r\n\r\n".to_vec(),
        ),
        (
            "a header line without a colon",
            b"GET /ws HTTP/1.1\r\nUpgrade websocket\r\n\r\n".to_vec(),
        ),
    ];
    for (what, bytes) in cases {
        assert_eq!(
            peek(&bytes, DEFAULT_BUDGET),
            gave_up(GiveUp::Framing),
            "{what}"
        );
    }
    // Header names and the token are case-insensitive; the path is not checked (Salt's master
    // serves its websocket on any path).
    let other = b"GET /x HTTP/1.1\r\nUPGRADE: keep, WebSocket\r\n\r\n";
    let mut s = other.to_vec();
    s.extend(request(auth_envelope("m")));
    assert_eq!(peek(&s, DEFAULT_BUDGET), found("m", Source::Auth));
}

#[test]
fn frames_that_break_rfc_6455_for_a_client_are_given_up_on() {
    let auth = envelope::encode(&auth_envelope("m"));
    // FIN, binary, not masked, one byte.
    let unmasked = vec![0x82, 0x01, 0x80];
    let with_bit = |bit: u8| {
        let mut f = request(auth_envelope("m"));
        f[0] |= bit;
        f
    };
    let top_bit_64 = {
        let mut f = vec![0x82, 0x80 | 127, 0x80];
        f.extend([0; 7]);
        f.extend(MASK);
        f
    };
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("an unmasked frame", vec![unmasked]),
        ("RSV1 (a deflated frame)", vec![with_bit(0x40)]),
        ("RSV2", vec![with_bit(0x20)]),
        ("RSV3", vec![with_bit(0x10)]),
        ("reserved data opcode 0x3", vec![frame(true, 0x3, b"x")]),
        ("reserved control opcode 0xb", vec![frame(true, 0xb, b"")]),
        (
            "a continuation with nothing to continue",
            vec![frame(true, OP_CONT, &auth)],
        ),
        (
            "a new message inside a fragmented one",
            vec![
                frame(false, OP_BINARY, &auth[..10]),
                request(ping_envelope()),
            ],
        ),
        (
            "a fragmented control frame",
            vec![frame(false, OP_PING, b"x")],
        ),
        (
            "a control frame over 125 bytes",
            vec![frame(true, OP_PING, &[0; 126])],
        ),
        ("a 64-bit length with its top bit set", vec![top_bit_64]),
    ];
    for (what, frames) in cases {
        assert_eq!(
            peek(&stream(frames), DEFAULT_BUDGET),
            gave_up(GiveUp::Framing),
            "{what}"
        );
    }
}

#[test]
fn a_binary_message_that_is_not_a_request_envelope_is_malformed() {
    for (what, payload) in [
        ("empty", vec![]),
        ("not msgpack", vec![0xc1, 0, 0]),
        ("a string", envelope::encode(&text("hello"))),
        (
            "a map without enc",
            envelope::encode(&map(vec![("load", text("x"))])),
        ),
        (
            "a tcp {head, body} map",
            crate::salt_tcp::request_frame("1", auth_envelope("m")),
        ),
    ] {
        let s = stream(vec![frame(true, OP_BINARY, &payload)]);
        assert_eq!(
            peek(&s, DEFAULT_BUDGET),
            gave_up(GiveUp::Malformed),
            "{what}"
        );
    }
}

#[test]
fn ids_salt_would_refuse_are_not_reported() {
    for bad in ["", ".", "..", "a/b", "a\\b", "a\0b", &"x".repeat(256)] {
        let s = stream(vec![request(auth_envelope(bad))]);
        assert_eq!(peek(&s, DEFAULT_BUDGET), gave_up(GiveUp::BadId), "{bad:?}");
    }
}

#[test]
fn a_frame_declared_past_the_budget_gives_up_before_its_bytes_arrive() {
    for len in [Len::Bits16, Len::Bits64] {
        let f = frame_with(true, OP_BINARY, &[0; 5000], len);
        let s = stream(vec![f]);
        let mut p = WsPeek::new(4096);
        // The upgrade and the frame's header (up to its mask key) are enough.
        let head = UPGRADE.len() + if matches!(len, Len::Bits16) { 8 } else { 14 };
        assert_eq!(p.feed(&s[..head - 1]), &Verdict::Pending);
        assert_eq!(p.feed(&s[head - 1..head]), &gave_up(GiveUp::OverBudget));
        assert_eq!(p.buffered(), 0);
    }
    // A 64-bit length of 2^62 bytes: no overflow, no allocation.
    let mut huge = vec![0x82, 0x80 | 127, 0x40, 0, 0, 0, 0, 0, 0, 0];
    huge.extend(MASK);
    assert_eq!(
        peek(&stream(vec![huge]), DEFAULT_BUDGET),
        gave_up(GiveUp::OverBudget)
    );
    // The budget counts from the first byte of the upgrade.
    let s = stream(vec![request(auth_envelope("late"))]);
    assert_eq!(peek(&s, s.len() - 1), gave_up(GiveUp::OverBudget));
    assert_eq!(peek(&s, s.len()), found("late", Source::Auth));
}

#[test]
fn an_upgrade_or_pings_filling_the_budget_give_up_when_it_is_spent() {
    let mut long = b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n".to_vec();
    long.extend(b"X-Pad: ".iter().chain(&[b'a'; 2000]));
    assert_eq!(peek(&long, 1024), gave_up(GiveUp::OverBudget));
    let pings = stream((0..200).map(|_| frame(true, OP_PING, b"hb")).collect());
    assert_eq!(peek(&pings, 1024), gave_up(GiveUp::OverBudget));
    let clear = stream((0..200).map(|_| request(ping_envelope())).collect());
    assert_eq!(peek(&clear, 1024), gave_up(GiveUp::OverBudget));
}

#[test]
fn hostile_bytes_never_panic_and_never_exceed_the_budget() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4506);
    let real = stream(fragmented(
        &envelope::encode(&auth_envelope("m")),
        3,
        &[frame(true, OP_PING, b"")],
    ));
    for i in 0..3000 {
        let mut bytes: Vec<u8> = match i % 3 {
            // Random bytes behind a real upgrade (frames), or alone.
            0 => UPGRADE
                .iter()
                .copied()
                .chain((0..rng.random_range(0..3000)).map(|_| rng.random()))
                .collect(),
            1 => (0..rng.random_range(0..3000))
                .map(|_| rng.random())
                .collect(),
            // A real stream with a few bytes flipped.
            _ => {
                let mut b = real.clone();
                for _ in 0..rng.random_range(1..6) {
                    let at = rng.random_range(0..b.len());
                    b[at] = rng.random();
                }
                b
            }
        };
        bytes.truncate(4000);
        let budget = rng.random_range(0..3000);
        let mut p = WsPeek::new(budget);
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
        assert_eq!(p.verdict(), &peek(&bytes, budget), "case {i}");
    }
}

#[test]
fn ws_and_tcp_peeks_agree_on_the_same_requests() {
    let requests = [
        vec![auth_envelope("same-id")],
        vec![ping_envelope(), aes_envelope("aes-id")],
        vec![auth_envelope("../bad")],
        vec![map(vec![("enc", text("rot13"))])],
        vec![map(vec![("enc", text("aes")), ("load", bin(&[1; 8]))])],
        vec![ping_envelope()],
    ];
    for r in requests {
        let tcp: Vec<u8> = r
            .iter()
            .flat_map(|v| crate::salt_tcp::request_frame("1", v.clone()))
            .collect();
        let ws = stream(r.iter().cloned().map(request).collect());
        assert_eq!(
            peek(&ws, DEFAULT_BUDGET),
            crate::salt_tcp::peek::peek(&tcp, DEFAULT_BUDGET),
            "{r:?}"
        );
    }
}

/// Bytes Salt 3008.5's `ws` `RequestClient` sent (aiohttp 3.14.5), one connection per request
/// (`captured/capture.py`).
const CAPTURED_AUTH: &[u8] = include_bytes!("captured/salt_ws_auth.bin");
const CAPTURED_AES: &[u8] = include_bytes!("captured/salt_ws_aes.bin");

#[test]
fn bytes_captured_from_salts_ws_client_are_read_cut_at_every_byte() {
    // A minion's request client asks for `/` (from `master_uri`), not `/ws`.
    assert!(CAPTURED_AUTH.starts_with(b"GET / HTTP/1.1\r\n"));
    assert_any_chunking_gives(
        CAPTURED_AUTH,
        DEFAULT_BUDGET,
        &found("captured-ws-minion", Source::Auth),
    );
    assert_any_chunking_gives(
        CAPTURED_AES,
        DEFAULT_BUDGET,
        &found("captured-ws-minion", Source::Aes),
    );
}
