//! The server side of the codec: the upgrade request at every cut, client frames (masked) and
//! server frames through the decoders for any chunking, and hostile frames named.

use super::super::*;
use super::*;

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn request(extra: &str) -> Vec<u8> {
    // What aiohttp's `ws_connect` sends (Salt's clients), header order and case as it writes them.
    format!(
        "GET /ws HTTP/1.1\r\nHost: 127.42.0.1:4505\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\nAccept: */*\r\n\
         Accept-Encoding: gzip, deflate\r\nUser-Agent: Python/3.11 aiohttp/3.13.3\r\n{extra}\r\n"
    )
    .into_bytes()
}

#[test]
fn an_upgrade_request_at_every_cut() {
    let mut r = request("");
    let head = r.len();
    r.extend(client_frame(OP_BINARY, b"\x80"));
    for cut in 0..head {
        assert_eq!(read_upgrade(&r[..cut]), Ok(None), "cut {cut}");
    }
    let u = read_upgrade(&r).unwrap().unwrap();
    assert_eq!(u.len, head);
    assert_eq!(u.path, "/ws");
    assert_eq!(u.key, KEY);
    let resp = String::from_utf8(upgrade_response(&u.key)).unwrap();
    assert!(resp.starts_with("HTTP/1.1 101 "), "{resp}");
    // The client side of the codec accepts our answer.
    assert_eq!(read_handshake(resp.as_bytes(), KEY), Ok(Some(resp.len())));
}

#[test]
fn a_bad_upgrade_request_names_what_is_wrong() {
    let cases: &[(&[u8], &str)] = &[
        (b"\xff\x00\x00\x00\x00\x00\x00\x00\x00\x7f\x03", "GET"),
        (b"POST / HTTP/1.1\r\n\r\n", "method"),
        (b"GET / HTTP/1.0\r\n\r\n", "HTTP/1.1"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "Upgrade: websocket"),
        (
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: close\r\n\r\n",
            "Connection: upgrade",
        ),
        (
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\nSec-WebSocket-Version: 8\r\n\r\n",
            "Sec-WebSocket-Version",
        ),
        (
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n",
            "Sec-WebSocket-Key",
        ),
        (
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: abc\r\n\r\n",
            "16 bytes",
        ),
        (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", "no ':'"),
        (b"GET / HTTP/1.1\r\n\xff\xfe: x\r\n\r\n", "UTF-8"),
    ];
    for (bytes, what) in cases {
        let e = read_upgrade(bytes).unwrap_err().to_string();
        assert!(
            e.contains(what),
            "{:?}: {e}",
            String::from_utf8_lossy(bytes)
        );
    }
    let big = [b"GET /".as_slice(), &vec![b'a'; MAX_HANDSHAKE + 1]].concat();
    assert_eq!(
        read_upgrade(&big),
        Err(WsError::HandshakeTooLarge(MAX_HANDSHAKE))
    );
}

/// A stream of messages, as a peer would send them, with fragments and control frames between.
fn client_stream() -> (Vec<u8>, Vec<WsMessage>) {
    let big = vec![7u8; 70_000];
    let mut s = Vec::new();
    s.extend(client_frame(OP_BINARY, b"\x81\xa1a\x01"));
    s.extend(client_frame(OP_PING, b"hi"));
    s.extend(client_frame(OP_BINARY, &big));
    // A fragmented message with a ping between its fragments.
    let mut first = client_frame(OP_BINARY, b"ab");
    first[0] &= 0x7f;
    s.extend(first);
    s.extend(client_frame(OP_PING, b""));
    s.extend(client_frame(OP_CONT, b"cd"));
    s.extend(client_frame(OP_TEXT, b"close"));
    s.extend(client_frame(OP_CLOSE, &1000u16.to_be_bytes()));
    let want = vec![
        WsMessage::Binary(b"\x81\xa1a\x01".to_vec()),
        WsMessage::Ping(b"hi".to_vec()),
        WsMessage::Binary(big),
        WsMessage::Ping(vec![]),
        WsMessage::Binary(b"abcd".to_vec()),
        WsMessage::Text(b"close".to_vec()),
        WsMessage::Close(Some(1000)),
    ];
    (s, want)
}

fn decode_all(dec: &mut WsDecoder, stream: &[u8], cuts: &[usize]) -> Vec<WsMessage> {
    let mut out = Vec::new();
    let mut at = 0;
    for &c in cuts.iter().chain(std::iter::once(&stream.len())) {
        dec.push(&stream[at..c]).unwrap();
        at = c;
        while let Some(m) = dec.next_message().unwrap() {
            out.push(m);
        }
    }
    out
}

#[test]
fn client_frames_decode_the_same_for_any_chunking() {
    let (s, want) = client_stream();
    // Every single cut of the small head, then random chunkings of the whole.
    for cut in 0..40.min(s.len()) {
        let mut d = WsDecoder::for_client_frames(1 << 20);
        assert_eq!(decode_all(&mut d, &s, &[cut]), want, "cut {cut}");
    }
    let mut rng = rand::rng();
    for _ in 0..50 {
        use rand::Rng;
        let mut cuts: Vec<usize> = (0..rng.random_range(1..40))
            .map(|_| rng.random_range(0..s.len()))
            .collect();
        cuts.sort();
        let mut d = WsDecoder::for_client_frames(1 << 20);
        assert_eq!(decode_all(&mut d, &s, &cuts), want, "cuts {cuts:?}");
    }
}

#[test]
fn server_frames_decode_for_the_client_for_any_chunking() {
    let msgs: Vec<Vec<u8>> = vec![vec![], b"x".to_vec(), vec![1; 200], vec![2; 70_000]];
    let mut s = Vec::new();
    for m in &msgs {
        s.extend(server_frame(OP_BINARY, m));
    }
    s.extend(server_frame(OP_CLOSE, &close_payload(CLOSE_NORMAL)));
    let mut want: Vec<WsMessage> = msgs.into_iter().map(WsMessage::Binary).collect();
    want.push(WsMessage::Close(Some(1000)));
    for cut in 0..s.len().min(300) {
        let mut d = WsDecoder::new(1 << 20);
        assert_eq!(decode_all(&mut d, &s, &[cut]), want, "cut {cut}");
    }
}

fn first_error(dec: &mut WsDecoder, bytes: &[u8]) -> WsError {
    if let Err(e) = dec.push(bytes) {
        return e;
    }
    loop {
        match dec.next_message() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("no error for {bytes:02x?}"),
            Err(e) => return e,
        }
    }
}

#[test]
fn hostile_client_frames_are_errors_naming_the_byte() {
    let srv = || WsDecoder::for_client_frames(1024);
    // Unmasked, from a client.
    let e = first_error(&mut srv(), &server_frame(OP_BINARY, b"x"));
    assert!(
        e.to_string().contains("not masked") && e.to_string().contains("byte 1"),
        "{e}"
    );
    // Reserved bits (a deflate nobody agreed).
    let mut f = client_frame(OP_BINARY, b"x");
    f[0] |= 0x40;
    let e = first_error(&mut srv(), &f);
    assert!(e.to_string().contains("reserved bits"), "{e}");
    // Reserved opcode.
    let e = first_error(&mut srv(), &client_frame(0x3, b"x"));
    assert!(e.to_string().contains("reserved opcode"), "{e}");
    // A declared length over the limit: refused on the header, before any payload.
    let mut f = vec![0x82, 0x80 | 127];
    f.extend(u64::MAX.to_be_bytes());
    assert!(matches!(
        first_error(&mut srv(), &f),
        WsError::TooLarge { limit: 1024, .. }
    ));
    // Fragments adding up past the limit.
    let mut a = client_frame(OP_BINARY, &[0; 1000]);
    a[0] &= 0x7f;
    let mut s = a.clone();
    s.extend(client_frame(OP_CONT, &[0; 100]));
    assert!(matches!(
        first_error(&mut srv(), &s),
        WsError::TooLarge { .. }
    ));
    // A control frame over 125 bytes, or fragmented.
    let e = first_error(&mut srv(), &client_frame(OP_PING, &[0; 126]));
    assert!(e.to_string().contains("control frame"), "{e}");
    // A continuation with nothing to continue; a new message inside a fragmented one.
    let e = first_error(&mut srv(), &client_frame(OP_CONT, b"x"));
    assert!(e.to_string().contains("continuation"), "{e}");
    let mut s = a;
    s.extend(client_frame(OP_BINARY, b"y"));
    let e = first_error(&mut srv(), &s);
    assert!(e.to_string().contains("inside a fragmented"), "{e}");
    // And the client side refuses masked frames from a server.
    let e = first_error(&mut WsDecoder::new(1024), &client_frame(OP_BINARY, b"x"));
    assert!(e.to_string().contains("is masked"), "{e}");
}

#[test]
fn random_bytes_never_panic_either_decoder() {
    use rand::Rng;
    let mut rng = rand::rng();
    for _ in 0..2000 {
        let n = rng.random_range(0..64);
        let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        for mut d in [WsDecoder::new(256), WsDecoder::for_client_frames(256)] {
            if d.push(&bytes).is_ok() {
                while let Ok(Some(_)) = d.next_message() {}
            }
        }
        let _ = read_upgrade(&bytes);
        let mut req = request("");
        req.truncate(rng.random_range(0..req.len()));
        req.extend(&bytes);
        let _ = read_upgrade(&req);
    }
}
