//! Salt's `ws` transport (`salt/transport/ws.py` in 3008.5): an aiohttp websocket; the client
//! connects to `http(s)://master:port/ws` (a minion's request client to its `master_uri` made
//! `http://ip:port`, path `/`: the master upgrades on any path), dialling a new websocket for each
//! request, and sends each request as **one binary frame** holding the msgpack envelope
//! (`salt.payload.dumps(load)`, no `{head, body}` framing); the reply comes back as one binary
//! frame. The publish port is the same on `/ws`, publishes as binary frames.
//!
//! A minimal RFC 6455 client: the opening handshake ([`handshake_request`], [`read_handshake`]
//! checking `Sec-WebSocket-Accept`), masked client frames ([`encode_frame`]) and a bounded decoder
//! of the server's frames ([`WsDecoder`]: binary, text, close, ping, pong, fragments). Every buffer
//! is bounded and bad input is an error naming the byte or header, never a panic. The other
//! direction, a client's upgrade and frames read passively for presence, is [`peek`].

pub mod client;
pub mod conn;
pub mod peek;
pub mod pubserver;
pub mod server;
pub mod subscriber;
pub mod upgrade;

use base64::Engine;
use sha1::{Digest, Sha1};
use thiserror::Error;

/// The path Salt's clients connect to.
pub const WS_PATH: &str = "/ws";
/// Largest handshake response read.
pub const MAX_HANDSHAKE: usize = 16 * 1024;
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

pub const OP_CONT: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xa;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WsError {
    /// The peer's answer to the upgrade is not `101 Switching Protocols`.
    #[error("websocket upgrade refused: {0}")]
    Refused(String),
    #[error("websocket handshake: {0}")]
    Handshake(String),
    #[error("websocket handshake response over {0} bytes")]
    HandshakeTooLarge(usize),
    #[error("websocket frame at byte {offset}: {problem}")]
    Frame { offset: usize, problem: String },
    #[error("websocket message of {size} bytes over the {limit}-byte limit")]
    TooLarge { size: u64, limit: usize },
}

/// The longest frame header: 2 bytes, a 64-bit length, a mask key.
pub const MAX_FRAME_HEAD: usize = 14;

/// A frame's header (RFC 6455 §5.2), once all of it (mask key included) has arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    pub fin: bool,
    pub opcode: u8,
    /// Header bytes, the mask key included.
    pub head: usize,
    pub payload: u64,
}

impl FrameHead {
    /// Close, ping or pong.
    pub fn control(&self) -> bool {
        self.opcode & 0x8 != 0
    }
}

/// A frame header that breaks RFC 6455 for its side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadFrame;

/// A frame's header from the start of `raw`, for frames that must be `masked` (a client's) or
/// must not (a server's): `Ok(None)` while incomplete, `Err` when it breaks RFC 6455 (the mask
/// bit wrong for the side, reserved bits (RSV1 of a `permessage-deflate` included) or opcodes,
/// a control frame that is fragmented or over 125 bytes, a 64-bit length with its top bit set).
/// The one frame-header parser of the passive readers ([`peek`], the proxy's request tracker,
/// which calls it for each header byte: inlined there).
#[inline]
pub fn frame_head(raw: &[u8], masked: bool) -> Result<Option<FrameHead>, BadFrame> {
    let (Some(&b0), Some(&b1)) = (raw.first(), raw.get(1)) else {
        return Ok(None);
    };
    let (fin, opcode) = (b0 & 0x80 != 0, b0 & 0x0f);
    if b0 & 0x70 != 0 || (b1 & 0x80 != 0) != masked {
        return Err(BadFrame);
    }
    match opcode {
        OP_CONT | OP_TEXT | OP_BINARY => {}
        OP_CLOSE | OP_PING | OP_PONG if fin && b1 & 0x7f <= 125 => {}
        _ => return Err(BadFrame),
    }
    let (payload, ext) = match b1 & 0x7f {
        126 => match raw.get(2..4) {
            Some(x) => (u64::from(u16::from_be_bytes([x[0], x[1]])), 2),
            None => return Ok(None),
        },
        127 => match raw.get(2..10) {
            Some(x) => {
                let mut b = [0u8; 8];
                b.copy_from_slice(x);
                (u64::from_be_bytes(b), 8)
            }
            None => return Ok(None),
        },
        n => (u64::from(n), 0),
    };
    if payload >> 63 != 0 {
        return Err(BadFrame);
    }
    let head = 2 + ext + if masked { 4 } else { 0 };
    if raw.len() < head {
        return Ok(None);
    }
    Ok(Some(FrameHead {
        fin,
        opcode,
        head,
        payload,
    }))
}

/// A fresh `Sec-WebSocket-Key` (16 random bytes, base64).
pub fn new_key() -> String {
    use rand::RngCore;
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// What the server must answer in `Sec-WebSocket-Accept` for `key`.
pub fn accept_key(key: &str) -> String {
    let mut h = Sha1::new();
    h.update(key.as_bytes());
    h.update(GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

/// The client's opening handshake for `host` (as `Host:` carries it, port included).
pub fn handshake_request(host: &str, path: &str, key: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .into_bytes()
}

/// Reads the server's handshake response from `buf`: `Ok(None)` while incomplete, else the length
/// of the response head (bytes after it are frames). Checks the status, `Upgrade`, `Connection`
/// and `Sec-WebSocket-Accept` against `key`.
pub fn read_handshake(buf: &[u8], key: &str) -> Result<Option<usize>, WsError> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HANDSHAKE {
            return Err(WsError::HandshakeTooLarge(MAX_HANDSHAKE));
        }
        if !buf.is_empty() && !b"HTTP/".starts_with(&buf[..buf.len().min(5)]) {
            return Err(WsError::Handshake(format!(
                "the answer does not begin with HTTP/ (first byte 0x{:02x})",
                buf[0]
            )));
        }
        return Ok(None);
    };
    if end > MAX_HANDSHAKE {
        return Err(WsError::HandshakeTooLarge(MAX_HANDSHAKE));
    }
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    let mut parts = status.splitn(3, ' ');
    let (proto, code) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if !proto.starts_with("HTTP/") {
        return Err(WsError::Handshake(format!(
            "status line {:?} is not HTTP",
            truncate(status)
        )));
    }
    if code != "101" {
        return Err(WsError::Refused(truncate(status)));
    }
    let (mut upgrade, mut connection, mut accept) = (false, false, None);
    for line in lines {
        let (name, value) = header_line(line)?;
        match name.to_ascii_lowercase().as_str() {
            "upgrade" => upgrade = value.eq_ignore_ascii_case("websocket"),
            "connection" => connection = has_token(value, "upgrade"),
            "sec-websocket-accept" => accept = Some(value.to_string()),
            _ => {}
        }
    }
    if !upgrade {
        return Err(WsError::Handshake("no `Upgrade: websocket` header".into()));
    }
    if !connection {
        return Err(WsError::Handshake("no `Connection: upgrade` header".into()));
    }
    match accept {
        Some(a) if a == accept_key(key) => Ok(Some(end + 4)),
        Some(a) => Err(WsError::Handshake(format!(
            "Sec-WebSocket-Accept {:?} does not match the key sent",
            truncate(&a)
        ))),
        None => Err(WsError::Handshake("no Sec-WebSocket-Accept header".into())),
    }
}

/// At most 80 characters of `s`, to quote it in an error.
fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

/// A handshake header line's name and value, both trimmed.
fn header_line(line: &str) -> Result<(&str, &str), WsError> {
    let Some((name, value)) = line.split_once(':') else {
        return Err(WsError::Handshake(format!(
            "header line {:?} has no ':'",
            truncate(line)
        )));
    };
    Ok((name.trim(), value.trim()))
}

/// Whether a comma-separated header value (`Connection: keep-alive, Upgrade`) lists `token`, in
/// any case.
pub fn has_token(value: &str, token: &str) -> bool {
    value
        .split(',')
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// One client frame (FIN set), masked with `mask` as RFC 6455 requires of a client.
pub fn encode_frame(opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 14);
    out.push(0x80 | (opcode & 0x0f));
    let n = payload.len();
    if n < 126 {
        out.push(0x80 | n as u8);
    } else if n <= 0xffff {
        out.push(0x80 | 126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// A client frame with a fresh random mask.
pub fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    encode_frame(opcode, payload, rand::random())
}

/// A whole message from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WsMessage {
    Binary(Vec<u8>),
    Text(Vec<u8>),
    /// The close code, if the frame had one.
    Close(Option<u16>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
}

/// Reassembles the server's messages from a byte stream split anywhere; bounded by `max` bytes
/// per message (fragments included).
#[derive(Debug)]
pub struct WsDecoder {
    buf: Vec<u8>,
    /// Bytes consumed from the stream before `buf` (for error offsets).
    offset: usize,
    max: usize,
    /// A fragmented data message being assembled: opcode and bytes so far.
    partial: Option<(u8, Vec<u8>)>,
    /// Reads a client's frames (masked, as RFC 6455 requires) instead of a server's.
    from_client: bool,
}

impl WsDecoder {
    pub fn new(max: usize) -> Self {
        WsDecoder {
            buf: Vec::new(),
            offset: 0,
            max,
            partial: None,
            from_client: false,
        }
    }

    /// A decoder of a client's frames, for a server: every frame must be masked (RFC 6455
    /// 5.1), and is unmasked.
    pub fn for_client_frames(max: usize) -> Self {
        WsDecoder {
            from_client: true,
            ..WsDecoder::new(max)
        }
    }

    /// Changes the per-message limit (a peer vouched for may send more).
    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// Bytes buffered and not yet returned as a message.
    pub fn buffered(&self) -> usize {
        self.buf.len() + self.partial.as_ref().map_or(0, |(_, p)| p.len())
    }

    /// Appends bytes read; refuses to buffer more than a message's limit (plus a frame header).
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), WsError> {
        let size = (self.buf.len() + bytes.len()) as u64;
        if size > self.max as u64 + 65536 {
            return Err(WsError::TooLarge {
                size,
                limit: self.max,
            });
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The next whole message, if buffered.
    pub fn next_message(&mut self) -> Result<Option<WsMessage>, WsError> {
        loop {
            let Some((fin, opcode, payload)) = self.next_frame()? else {
                return Ok(None);
            };
            let bad = |problem: &str| WsError::Frame {
                offset: self.offset,
                problem: problem.into(),
            };
            match opcode {
                OP_CLOSE => {
                    let code =
                        (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]));
                    return Ok(Some(WsMessage::Close(code)));
                }
                OP_PING => return Ok(Some(WsMessage::Ping(payload))),
                OP_PONG => return Ok(Some(WsMessage::Pong(payload))),
                OP_TEXT | OP_BINARY => {
                    if self.partial.is_some() {
                        return Err(bad("a new message began inside a fragmented one"));
                    }
                    if fin {
                        return Ok(Some(data(opcode, payload)));
                    }
                    self.partial = Some((opcode, payload));
                }
                OP_CONT => {
                    let Some((op, mut acc)) = self.partial.take() else {
                        return Err(bad("a continuation frame with no message to continue"));
                    };
                    if acc.len() + payload.len() > self.max {
                        return Err(WsError::TooLarge {
                            size: (acc.len() + payload.len()) as u64,
                            limit: self.max,
                        });
                    }
                    acc.extend_from_slice(&payload);
                    if fin {
                        return Ok(Some(data(op, acc)));
                    }
                    self.partial = Some((op, acc));
                }
                op => return Err(bad(&format!("reserved opcode 0x{op:x}"))),
            }
        }
    }

    /// One frame: (FIN, opcode, unmasked payload).
    fn next_frame(&mut self) -> Result<Option<(bool, u8, Vec<u8>)>, WsError> {
        let b = &self.buf;
        let bad = |at: usize, problem: String| WsError::Frame {
            offset: self.offset + at,
            problem,
        };
        if b.len() < 2 {
            return Ok(None);
        }
        let (b0, b1) = (b[0], b[1]);
        if b0 & 0x70 != 0 {
            return Err(bad(
                0,
                format!("reserved bits set (0x{b0:02x}; no extension was agreed)"),
            ));
        }
        let masked = b1 & 0x80 != 0;
        if masked != self.from_client {
            return Err(bad(
                1,
                if self.from_client {
                    "a frame from the client is not masked (RFC 6455 5.1)".into()
                } else {
                    "a frame from the server is masked (RFC 6455 5.1)".into()
                },
            ));
        }
        let (fin, opcode) = (b0 & 0x80 != 0, b0 & 0x0f);
        let (len, hdr) = match b1 & 0x7f {
            126 => match b.get(2..4) {
                Some(x) => (u64::from(u16::from_be_bytes([x[0], x[1]])), 4),
                None => return Ok(None),
            },
            127 => match b.get(2..10) {
                Some(x) => (u64::from_be_bytes(x.try_into().unwrap_or_default()), 10),
                None => return Ok(None),
            },
            n => (u64::from(n), 2),
        };
        if opcode >= 0x8 && (len > 125 || !fin) {
            return Err(bad(
                0,
                "a control frame that is fragmented or over 125 bytes".into(),
            ));
        }
        if len > self.max as u64 {
            return Err(WsError::TooLarge {
                size: len,
                limit: self.max,
            });
        }
        let hdr = if masked { hdr + 4 } else { hdr };
        let end = hdr + len as usize;
        if b.len() < end {
            return Ok(None);
        }
        let mut payload = b[hdr..end].to_vec();
        if masked {
            let key = [b[hdr - 4], b[hdr - 3], b[hdr - 2], b[hdr - 1]];
            payload
                .iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x ^= key[i % 4]);
        }
        self.buf.drain(..end);
        self.offset += end;
        Ok(Some((fin, opcode, payload)))
    }
}

fn data(opcode: u8, payload: Vec<u8>) -> WsMessage {
    if opcode == OP_TEXT {
        WsMessage::Text(payload)
    } else {
        WsMessage::Binary(payload)
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
