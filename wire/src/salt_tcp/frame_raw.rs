//! The servers' side of Salt's `tcp` framing, on raw bytes: a frame `{"head": map, "body": any}`
//! is split into its `head` and `body` **as they were encoded** (slices of the frame, nothing
//! decoded but the two keys), and a reply or publish is framed around bytes that are already
//! msgpack. So a 60 MiB return crosses the request server without being decoded or copied, and
//! the reply's `head` is the request's byte for byte (its `mid`, and anything else a client put
//! there).

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

use super::{scan, FrameError};
use crate::envelope::{self, as_bytes};

/// Why a frame is not `{"head": map, "body": any}`.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RawError {
    #[error("message of {size} bytes or more, over the {limit}-byte limit")]
    TooLarge { size: usize, limit: usize },
    #[error("not Salt's tcp framing: {0}")]
    NotFraming(&'static str),
    #[error("not Salt's tcp framing: {0}")]
    Frame(FrameError),
}

impl From<FrameError> for RawError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::TooLarge { size, limit, .. } => RawError::TooLarge {
                size: usize::try_from(size).unwrap_or(usize::MAX),
                limit,
            },
            other => RawError::Frame(other),
        }
    }
}

/// The number of entries of the map whose header starts `b`, and the header's length.
fn map_header(b: &[u8]) -> Option<(usize, usize)> {
    match *b.first()? {
        m @ 0x80..=0x8f => Some((usize::from(m & 0x0f), 1)),
        0xde => Some((
            usize::from(u16::from_be_bytes(b.get(1..3)?.try_into().ok()?)),
            3,
        )),
        0xdf => Some((
            usize::try_from(u32::from_be_bytes(b.get(1..5)?.try_into().ok()?)).ok()?,
            5,
        )),
        _ => None,
    }
}

/// Splits one whole frame (as [`scan`] delimits it) into the raw `head` (a map) and `body`.
pub fn split_frame(frame: &Bytes) -> Result<(Bytes, Bytes), RawError> {
    let (n, mut pos) = map_header(frame).ok_or(RawError::NotFraming("the message is not a map"))?;
    let (mut head, mut body) = (None, None);
    let item = |pos: usize| -> Result<usize, RawError> {
        match scan(&frame[pos..], frame.len())? {
            Some(len) => Ok(len),
            None => Err(RawError::NotFraming("the message ends inside an entry")),
        }
    };
    for _ in 0..n {
        let klen = item(pos)?;
        let key = envelope::decode(&frame[pos..pos + klen])
            .map_err(|_| RawError::NotFraming("a key of the message is not msgpack"))?;
        pos += klen;
        let vlen = item(pos)?;
        let value = frame.slice(pos..pos + vlen);
        pos += vlen;
        match as_bytes(&key) {
            Some(b"head") => head = Some(value),
            Some(b"body") => body = Some(value),
            _ => {}
        }
    }
    let head = head.ok_or(RawError::NotFraming("the message has no \"head\""))?;
    if map_header(&head).is_none() {
        return Err(RawError::NotFraming("the message's \"head\" is not a map"));
    }
    let body = body.ok_or(RawError::NotFraming("the message has no \"body\""))?;
    Ok((head, body))
}

/// `{"head": head, "body": body}` around two values already encoded.
pub fn reply_frame(head: &[u8], body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(head.len() + body.len() + 12);
    out.put_u8(0x82);
    out.put_slice(b"\xa4head");
    if head.is_empty() {
        out.put_u8(0x80);
    } else {
        out.put_slice(head);
    }
    out.put_slice(b"\xa4body");
    out.put_slice(body);
    out.freeze()
}

/// A publish as Salt's `PubServer.publish_payload` frames it: `{"head": {}, "body": <the
/// serialised envelope, as bin>}`.
pub fn publish_frame(payload: &[u8]) -> Bytes {
    let mut bin = BytesMut::with_capacity(payload.len() + 5);
    match u32::try_from(payload.len()) {
        Ok(n) if n <= 0xff => {
            bin.put_u8(0xc4);
            bin.put_u8(n as u8);
        }
        Ok(n) if n <= 0xffff => {
            bin.put_u8(0xc5);
            bin.put_u16(n as u16);
        }
        Ok(n) => {
            bin.put_u8(0xc6);
            bin.put_u32(n);
        }
        // Over 4 GiB: msgpack cannot say it (the publisher's limits are far below).
        Err(_) => bin.put_u8(0xc0),
    }
    bin.put_slice(payload);
    reply_frame(&[], &bin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{map, text, Value};
    use crate::salt_tcp::{encode_message, request_frame, FrameDecoder};

    #[test]
    fn a_request_splits_into_its_head_and_body_as_encoded() {
        let body = map(vec![("enc", text("clear")), ("load", map(vec![]))]);
        let frame = Bytes::from(request_frame("1234-abcd", body.clone()));
        let (head, b) = split_frame(&frame).unwrap();
        assert_eq!(&b[..], &envelope::encode(&body)[..]);
        assert_eq!(
            envelope::decode(&head).unwrap(),
            map(vec![("mid", text("1234-abcd"))])
        );
        // The reply echoes the head byte for byte; Salt's reader takes it.
        let reply = reply_frame(&head, &envelope::encode(&text("pong")));
        let mut dec = FrameDecoder::new(1 << 20);
        dec.push(&reply).unwrap();
        let m = dec.next_message().unwrap().unwrap();
        assert_eq!(m.mid(), Some(&b"1234-abcd"[..]));
        assert_eq!(m.body, text("pong"));
        // Key order and extra keys do not matter; bin-typed keys are keys.
        let odd = envelope::encode(&Value::Map(vec![
            (Value::Binary(b"body".to_vec()), Value::from(7)),
            (text("x"), Value::Nil),
            (text("head"), Value::Map(vec![])),
        ]));
        let (h, b) = split_frame(&Bytes::from(odd)).unwrap();
        assert_eq!((&h[..], &b[..]), (&[0x80u8][..], &[7u8][..]));
    }

    #[test]
    fn what_is_not_salts_framing_is_refused_by_name() {
        for (bytes, what) in [
            (envelope::encode(&text("x")), "not a map"),
            (
                encode_message(text("h"), Value::Nil),
                "\"head\" is not a map",
            ),
            (
                envelope::encode(&map(vec![("head", map(vec![]))])),
                "no \"body\"",
            ),
            (
                envelope::encode(&map(vec![("body", Value::Nil)])),
                "no \"head\"",
            ),
        ] {
            let e = split_frame(&Bytes::from(bytes)).unwrap_err().to_string();
            assert!(e.contains(what), "{e} / {what}");
        }
    }

    #[test]
    fn a_publish_is_the_envelope_as_bin_under_an_empty_head() {
        for len in [0usize, 10, 300, 70_000] {
            let payload = vec![0x5a; len];
            let f = publish_frame(&payload);
            let mut dec = FrameDecoder::new(1 << 20);
            dec.push(&f).unwrap();
            let m = dec.next_message().unwrap().unwrap();
            assert_eq!(m.head, Value::Map(vec![]));
            assert_eq!(m.body, Value::Binary(payload));
        }
    }
}
