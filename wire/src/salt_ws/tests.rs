use super::*;

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn response(accept: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\nServer: Python/3.11 aiohttp/3.13\r\n\r\n"
    )
    .into_bytes()
}

#[test]
fn accept_key_is_rfc_6455s_example() {
    assert_eq!(accept_key(KEY), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    let req = String::from_utf8(handshake_request("127.0.0.1:4506", WS_PATH, KEY)).unwrap();
    assert!(
        req.starts_with("GET /ws HTTP/1.1\r\nHost: 127.0.0.1:4506\r\n"),
        "{req}"
    );
    assert!(req.contains("Sec-WebSocket-Version: 13\r\n") && req.ends_with("\r\n\r\n"));
    assert_eq!(new_key().len(), 24);
}

#[test]
fn the_handshake_response_split_anywhere() {
    let mut r = response(&accept_key(KEY));
    let head = r.len();
    r.extend([0x82, 0x01, 0x07]); // a frame right behind it
    for cut in 0..head {
        assert_eq!(read_handshake(&r[..cut], KEY), Ok(None), "cut {cut}");
    }
    assert_eq!(read_handshake(&r, KEY), Ok(Some(head)));
}

#[test]
fn a_bad_handshake_names_what_is_wrong() {
    let wrong = read_handshake(&response("AAAA"), KEY).unwrap_err();
    assert!(
        wrong.to_string().contains("Sec-WebSocket-Accept"),
        "{wrong}"
    );
    let refused =
        read_handshake(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", KEY).unwrap_err();
    assert!(
        matches!(refused, WsError::Refused(ref s) if s.contains("404")),
        "{refused}"
    );
    let no_upgrade = read_handshake(
        format!(
            "HTTP/1.1 101 OK\r\nSec-WebSocket-Accept: {}\r\n\r\n",
            accept_key(KEY)
        )
        .as_bytes(),
        KEY,
    )
    .unwrap_err();
    assert!(no_upgrade.to_string().contains("Upgrade"), "{no_upgrade}");
    let binary = read_handshake(&[0x82, 0xa4, 1, 2], KEY).unwrap_err();
    assert!(binary.to_string().contains("0x82"), "{binary}");
    let endless = vec![b'H'; 0]
        .into_iter()
        .chain(b"HTTP/1.1 101 ".iter().copied())
        .chain(std::iter::repeat_n(b'x', MAX_HANDSHAKE + 1))
        .collect::<Vec<u8>>();
    assert_eq!(
        read_handshake(&endless, KEY),
        Err(WsError::HandshakeTooLarge(MAX_HANDSHAKE))
    );
}

#[test]
fn client_frames_are_masked() {
    let f = encode_frame(OP_BINARY, b"abc", [1, 2, 3, 4]);
    assert_eq!(
        f,
        vec![0x82, 0x83, 1, 2, 3, 4, b'a' ^ 1, b'b' ^ 2, b'c' ^ 3]
    );
    let long = encode_frame(OP_BINARY, &[0; 300], [0; 4]);
    assert_eq!(&long[..4], &[0x82, 0x80 | 126, 0x01, 0x2c]);
    let huge = encode_frame(OP_BINARY, &[0; 70_000], [0; 4]);
    assert_eq!(huge[1], 0x80 | 127);
    assert_eq!(huge.len(), 70_000 + 14);
}

#[test]
fn bad_server_frames_are_errors_naming_the_byte() {
    let cases: &[(&[u8], &str)] = &[
        (&[0x82, 0x81, 0, 0, 0, 0, 1], "masked"),
        (&[0xc2, 0x00], "reserved bits"),
        (&[0x83, 0x00], "reserved opcode"),
        (&[0x09, 0x00], "control frame"),
        (&[0x80, 0x00], "continuation"),
        (&[0x02, 0x00, 0x02, 0x00], "inside a fragmented"),
    ];
    for (bytes, want) in cases {
        let mut d = WsDecoder::new(1024);
        d.push(bytes).unwrap();
        let e = d.next_message().unwrap_err();
        assert!(e.to_string().contains(want), "{bytes:?}: {e}");
        assert!(e.to_string().contains("at byte"), "{e}");
    }
    // A 2^63-byte frame is refused from its header.
    let mut d = WsDecoder::new(1024);
    d.push(&[0x82, 127, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
        .unwrap();
    assert!(matches!(
        d.next_message(),
        Err(WsError::TooLarge { limit: 1024, .. })
    ));
    // Fragments that add up past the limit.
    let mut d = WsDecoder::new(100);
    d.push(&[0x02, 60]).unwrap();
    d.push(&[0; 60]).unwrap();
    d.push(&[0x80, 60]).unwrap();
    d.push(&[0; 60]).unwrap();
    assert!(matches!(d.next_message(), Err(WsError::TooLarge { .. })));
    // Buffering without draining is bounded.
    let mut d = WsDecoder::new(100);
    assert!(d.push(&[0; 70_000]).is_err());
}
