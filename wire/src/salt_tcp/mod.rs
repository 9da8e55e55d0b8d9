//! Salt's `tcp` transport (`salt/transport/tcp.py`, `frame.py` in 3008.5): both channels are a
//! plain byte stream of msgpack maps `{"head": {...}, "body": ...}` with **no length prefix**
//! (`salt.transport.frame.frame_msg`); a reader feeds a streaming `Unpacker`. A request's `head`
//! carries `{"mid": <str(uuid4)>}` and the master's reply echoes that `head`, so a client matches a
//! reply to its request by `mid` (`MessageClient._stream_return`). The `body` of a request is the
//! envelope itself (`{"enc", "load", "version"}`), not a msgpack string holding it.
//!
//! * [`FrameDecoder`] — bytes in, [`TcpMessage`]s out, for any split of the stream; every buffer is
//!   bounded and bad input is an error naming the byte offset or field, never a panic.
//! * [`encode_message`] / [`request_frame`] — the frames Salt's client sends.
//! * [`client`] / [`subscriber`] — the seam's request and publish clients for `transport: tcp`
//!   ([`crate::transport`]), TLS included.
//! * [`server`] / [`pubserver`] — the seam's request and publish servers (saltgate-master on
//!   `transport: tcp`), on the raw framing of [`frame_raw`]; TLS from [`tls_server`].
//! * [`peek`] — presence: the minion id of a request stream (a clear `_auth`, an `aes` envelope).
//! * [`probe`] — the Salt-aware health probes for `tcp` and `ws` (clear `ping`), TLS included
//!   (feature `tls`, module [`tls`]).

pub mod client;
pub mod frame_raw;
pub mod peek;
pub mod probe;
pub mod pubserver;
pub mod server;
pub mod subscriber;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "tls")]
pub mod tls_server;

use thiserror::Error;

use crate::envelope::{self, map, Value, MAX_DEPTH};

/// Largest message a [`FrameDecoder`] accepts by default (Salt's `Unpacker` takes up to 100 MiB;
/// a probe's reply is tiny).
pub const DEFAULT_MAX_MESSAGE: usize = 1024 * 1024;

/// Why a `tcp` stream is not Salt's framing.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Byte 0xc1 is never valid msgpack.
    #[error("byte {offset} of the message is 0x{byte:02x}, which is not a msgpack marker")]
    BadMarker { offset: usize, byte: u8 },
    /// A message (declared or buffered) larger than the limit.
    #[error("message at least {size} bytes long, over the {limit}-byte limit (at byte {offset})")]
    TooLarge {
        offset: usize,
        size: u64,
        limit: usize,
    },
    #[error("msgpack nested deeper than {0} levels")]
    TooDeep(usize),
    #[error("message is not valid msgpack: {0}")]
    Decode(String),
    /// The stream holds msgpack, but not `{"head": map, "body": ...}`.
    #[error("message is not Salt's tcp framing: {0}")]
    NotFraming(&'static str),
}

/// One framed message.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpMessage {
    pub head: Value,
    pub body: Value,
}

impl TcpMessage {
    /// The `mid` of `head`, as bytes (Salt's is the text of a uuid4; str- or bin-typed alike).
    pub fn mid(&self) -> Option<&[u8]> {
        envelope::get(&self.head, "mid").and_then(envelope::as_bytes)
    }

    /// Reads `{"head": map, "body": any}`.
    pub fn from_value(v: Value) -> Result<Self, FrameError> {
        let Value::Map(entries) = v else {
            return Err(FrameError::NotFraming("the message is not a map"));
        };
        let (mut head, mut body) = (None, None);
        for (k, v) in entries {
            match envelope::as_bytes(&k) {
                Some(b"head") => head = Some(v),
                Some(b"body") => body = Some(v),
                _ => {}
            }
        }
        let head = head.ok_or(FrameError::NotFraming("the message has no \"head\""))?;
        if !matches!(head, Value::Map(_)) {
            return Err(FrameError::NotFraming(
                "the message's \"head\" is not a map",
            ));
        }
        let body = body.ok_or(FrameError::NotFraming("the message has no \"body\""))?;
        Ok(TcpMessage { head, body })
    }
}

/// `msgpack({"head": head, "body": body})`, as `frame_msg` writes it.
pub fn encode_message(head: Value, body: Value) -> Vec<u8> {
    envelope::encode(&map(vec![("head", head), ("body", body)]))
}

/// A request as Salt's `RequestClient.send` frames it: `head` = `{"mid": mid}`.
pub fn request_frame(mid: &str, body: Value) -> Vec<u8> {
    encode_message(map(vec![("mid", envelope::text(mid))]), body)
}

/// A fresh message id in Salt's shape (`str(uuid.uuid4())`).
pub fn new_mid() -> String {
    use rand::RngCore;
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = crate::hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Reassembles framed messages from a byte stream split anywhere.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    max: usize,
}

impl FrameDecoder {
    /// Messages over `max_message` bytes are refused.
    pub fn new(max_message: usize) -> Self {
        FrameDecoder {
            buf: Vec::new(),
            max: max_message,
        }
    }

    /// Bytes buffered and not yet a whole message.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Appends bytes read from the stream. Refuses to buffer more than one message's limit of an
    /// unfinished message (call [`FrameDecoder::next_message`] until it returns `None` first).
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), FrameError> {
        let size = self.buf.len() + bytes.len();
        if size > self.max.saturating_mul(2).max(self.max + 65536) {
            return Err(FrameError::TooLarge {
                offset: 0,
                size: size as u64,
                limit: self.max,
            });
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The next whole message, if one is buffered.
    pub fn next_message(&mut self) -> Result<Option<TcpMessage>, FrameError> {
        let Some(len) = scan(&self.buf, self.max)? else {
            if self.buf.len() > self.max {
                return Err(FrameError::TooLarge {
                    offset: 0,
                    size: self.buf.len() as u64,
                    limit: self.max,
                });
            }
            return Ok(None);
        };
        let v =
            envelope::decode(&self.buf[..len]).map_err(|e| FrameError::Decode(e.to_string()))?;
        self.buf.drain(..len);
        TcpMessage::from_value(v).map(Some)
    }
}

/// The length of the first whole msgpack value in `buf`: `Ok(None)` while it is incomplete. Never
/// reads past `buf`, never allocates per element, and refuses a value that is or would be over
/// `max` bytes, or nested over [`MAX_DEPTH`], as soon as that is known.
pub fn scan(buf: &[u8], max: usize) -> Result<Option<usize>, FrameError> {
    // Items still to read at each open level (the outermost holds the one value).
    let mut pending: Vec<u64> = vec![1];
    let mut pos = 0usize;
    let too_large = |offset: usize, size: u64| FrameError::TooLarge {
        offset,
        size,
        limit: max,
    };
    while let Some(top) = pending.last_mut() {
        if *top == 0 {
            pending.pop();
            continue;
        }
        *top -= 1;
        let Some(&m) = buf.get(pos) else {
            return Ok(None);
        };
        let at = pos;
        pos += 1;
        // (bytes of a length field, bytes of payload known now, items that follow, ext type byte)
        let (len_bytes, fixed, items): (usize, u64, u64) = match m {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0, 0),
            0x80..=0x8f => (0, 0, 2 * u64::from(m & 0x0f)),
            0x90..=0x9f => (0, 0, u64::from(m & 0x0f)),
            0xa0..=0xbf => (0, u64::from(m & 0x1f), 0),
            0xc1 => {
                return Err(FrameError::BadMarker {
                    offset: at,
                    byte: m,
                })
            }
            0xc4 | 0xd9 => (1, 0, 0),
            0xc5 | 0xda => (2, 0, 0),
            0xc6 | 0xdb => (4, 0, 0),
            0xc7 => (1, 1, 0),
            0xc8 => (2, 1, 0),
            0xc9 => (4, 1, 0),
            0xcc | 0xd0 => (0, 1, 0),
            0xcd | 0xd1 => (0, 2, 0),
            0xca | 0xce | 0xd2 => (0, 4, 0),
            0xcb | 0xcf | 0xd3 => (0, 8, 0),
            0xd4 => (0, 2, 0),
            0xd5 => (0, 3, 0),
            0xd6 => (0, 5, 0),
            0xd7 => (0, 9, 0),
            0xd8 => (0, 17, 0),
            0xdc => (2, 0, 0),
            0xdd => (4, 0, 0),
            0xde => (2, 0, 0),
            0xdf => (4, 0, 0),
        };
        let mut skip = fixed;
        let mut items = items;
        if len_bytes > 0 {
            let Some(field) = buf.get(pos..pos + len_bytes) else {
                return Ok(None);
            };
            pos += len_bytes;
            let n = field.iter().fold(0u64, |a, b| (a << 8) | u64::from(*b));
            match m {
                0xdc | 0xdd => items = n,
                0xde | 0xdf => items = 2 * n,
                _ => skip += n,
            }
        }
        let end = pos as u64 + skip;
        // Every item is at least one byte: a count that cannot fit is refused at once.
        if end + items > max as u64 {
            return Err(too_large(at, end + items));
        }
        if (buf.len() as u64) < end {
            return Ok(None);
        }
        pos = end as usize;
        if items > 0 {
            if pending.len() > MAX_DEPTH {
                return Err(FrameError::TooDeep(MAX_DEPTH));
            }
            pending.push(items);
        }
    }
    Ok(Some(pos))
}

/// Whether `b` (the first bytes a peer sent) is a ZMTP 3 greeting's signature: the peer speaks
/// ZeroMQ.
pub fn looks_like_zmtp(b: &[u8]) -> bool {
    b.first() == Some(&0xff) && (b.len() < 10 || b[9] & 0x01 == 0x01)
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

#[cfg(test)]
#[path = "client_tests.rs"]
mod client_tests;
