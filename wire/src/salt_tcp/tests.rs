use super::*;
use crate::envelope::{text, RequestEnvelope};

fn ping_frame(mid: &str) -> Vec<u8> {
    request_frame(mid, RequestEnvelope::ping().to_value())
}

#[test]
fn a_stream_split_at_every_byte_boundary_decodes_the_same() {
    let mut stream = ping_frame("a");
    stream.extend(encode_message(
        map(vec![("mid", text("b"))]),
        map(vec![
            ("ret", Value::Boolean(true)),
            ("x", envelope::bin(&[7; 300])),
        ]),
    ));
    stream.extend(ping_frame("c"));
    for cut in 0..=stream.len() {
        let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE);
        let mut got = Vec::new();
        for part in [&stream[..cut], &stream[cut..]] {
            dec.push(part).unwrap();
            while let Some(m) = dec.next_message().unwrap() {
                got.push(m);
            }
        }
        let mids: Vec<_> = got.iter().map(|m| m.mid().unwrap().to_vec()).collect();
        assert_eq!(
            mids,
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()],
            "cut at {cut}"
        );
        assert_eq!(dec.buffered(), 0);
    }
    // One byte at a time too.
    let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE);
    let mut n = 0;
    for b in &stream {
        dec.push(std::slice::from_ref(b)).unwrap();
        while dec.next_message().unwrap().is_some() {
            n += 1;
        }
    }
    assert_eq!(n, 3);
}

#[test]
fn the_request_frame_is_salts_frame_msg() {
    // msgpack({"head": {"mid": "m"}, "body": {"enc": "clear", "load": {"cmd": "ping"}, "version": 3}})
    let f = ping_frame("m");
    let v = envelope::decode(&f).unwrap();
    let m = TcpMessage::from_value(v).unwrap();
    assert_eq!(m.mid(), Some(&b"m"[..]));
    let req = RequestEnvelope::from_value(m.body).unwrap();
    assert_eq!(req, RequestEnvelope::ping());
    let mid = new_mid();
    assert_eq!(mid.len(), 36);
    assert_eq!(&mid[14..15], "4", "a uuid4: {mid}");
}

#[test]
fn garbage_is_an_error_naming_the_byte() {
    let mut dec = FrameDecoder::new(1024);
    dec.push(&[0x82, 0xa4, b'h', b'e', b'a', b'd', 0xc1])
        .unwrap();
    let e = dec.next_message().unwrap_err();
    assert_eq!(
        e,
        FrameError::BadMarker {
            offset: 6,
            byte: 0xc1
        }
    );
    assert!(e.to_string().contains("byte 6"), "{e}");

    // Valid msgpack that is not the framing: each names the field.
    for (v, want) in [
        (Value::from(5), "not a map"),
        (map(vec![("body", Value::Nil)]), "no \"head\""),
        (
            map(vec![("head", Value::from(1)), ("body", Value::Nil)]),
            "\"head\" is not a map",
        ),
        (map(vec![("head", map(vec![]))]), "no \"body\""),
    ] {
        let mut dec = FrameDecoder::new(1024);
        dec.push(&envelope::encode(&v)).unwrap();
        let e = dec.next_message().unwrap_err();
        assert!(e.to_string().contains(want), "{e} / {want}");
    }
}

#[test]
fn oversized_input_is_refused_before_it_is_buffered() {
    // A declared bin32 of 4 GiB: refused from its 5-byte header.
    let mut dec = FrameDecoder::new(1024);
    dec.push(&[
        0x82, 0xa4, b'h', b'e', b'a', b'd', 0xc6, 0xff, 0xff, 0xff, 0xff,
    ])
    .unwrap();
    let e = dec.next_message().unwrap_err();
    assert!(
        matches!(
            e,
            FrameError::TooLarge {
                offset: 6,
                limit: 1024,
                ..
            }
        ),
        "{e}"
    );
    // An array32 claiming 4 billion items.
    assert!(matches!(
        scan(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01], 1024),
        Err(FrameError::TooLarge { offset: 0, .. })
    ));
    // Pushing past the buffer bound without draining.
    let mut dec = FrameDecoder::new(1024);
    assert!(dec.push(&[0u8; 70_000]).is_err());
    // Nesting.
    let deep = vec![0x91u8; MAX_DEPTH + 10];
    assert_eq!(scan(&deep, 1 << 20), Err(FrameError::TooDeep(MAX_DEPTH)));
}

#[test]
fn scan_agrees_with_rmpv_on_every_type() {
    let v = map(vec![
        ("nil", Value::Nil),
        ("t", Value::Boolean(true)),
        ("i", Value::from(-5)),
        ("u8", Value::from(200u8)),
        ("u16", Value::from(60000u16)),
        ("u32", Value::from(4_000_000_000u32)),
        ("u64", Value::from(u64::MAX)),
        ("i64", Value::from(i64::MIN)),
        ("f32", Value::F32(1.5)),
        ("f64", Value::F64(2.5)),
        ("s", text(&"x".repeat(40))),
        ("s16", text(&"y".repeat(300))),
        ("b", envelope::bin(&[1; 70_000])),
        ("a", Value::Array(vec![Value::from(1); 20])),
        ("e1", Value::Ext(5, vec![1])),
        ("e16", Value::Ext(5, vec![1; 16])),
        ("e3", Value::Ext(5, vec![1; 3])),
        ("e300", Value::Ext(5, vec![1; 300])),
    ]);
    let b = envelope::encode(&v);
    assert_eq!(scan(&b, 1 << 20), Ok(Some(b.len())));
    for cut in 0..b.len() {
        assert_eq!(scan(&b[..cut], 1 << 20), Ok(None), "cut {cut}");
    }
}

#[test]
fn zmtp_greeting_is_recognised() {
    let mut g = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 1];
    g.extend(b"NULL");
    assert!(looks_like_zmtp(&g));
    assert!(!looks_like_zmtp(&ping_frame("x")));
}

#[path = "probe_tests.rs"]
mod probe_tests;
