//! RFC 6455 frame boundaries read as bytes pass, for the `ws` request tracker
//! ([`super::ws_track`]): no copy of a payload, at most [`MAX_FRAME_HEAD`] header bytes held.
//! The HTTP heads of the upgrade (request and answer) are found here too.
//!
//! Each header is read by `wire`'s [`saltgate_wire::salt_ws::frame_head`], the presence peek's
//! too: a client's frames are masked and a server's are not (RFC 6455 §5.1); reserved bits (RSV1
//! of a negotiated `permessage-deflate` included, which Salt's aiohttp client never offers),
//! reserved opcodes, a control frame that is fragmented or longer than 125 bytes, a 64-bit length
//! with its top bit set: each is an error, never a panic.

use saltgate_wire::salt_ws::{frame_head, has_token};
pub use saltgate_wire::salt_ws::{BadFrame, FrameHead as FrameInfo, MAX_FRAME_HEAD};

/// The longest HTTP head followed (the minion's upgrade request, the master's answer): the
/// limit of `wire`'s websocket client for an answer. aiohttp's own is 8190 bytes a line.
pub const MAX_HTTP_HEAD: usize = saltgate_wire::salt_ws::MAX_HANDSHAKE;

/// What the next bytes were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `n` bytes of a header that is not complete yet (the walker holds them).
    PartialHead(usize),
    /// `n` bytes completed a frame's header ([`FrameWalker::head_bytes`] has all of it);
    /// `end`: the frame has no payload, it ends here.
    Head {
        n: usize,
        info: FrameInfo,
        end: bool,
    },
    /// `n` bytes of the payload of the frame in progress; `end`: they end it.
    Payload { n: usize, end: bool },
}

/// Frame boundaries of one direction.
#[derive(Debug)]
pub struct FrameWalker {
    /// Frames must be masked (client → server) or must not (server → client).
    masked: bool,
    head: [u8; MAX_FRAME_HEAD],
    have: usize,
    /// Payload bytes left of the frame in progress, once its header is read.
    left: Option<u64>,
    /// The last frame ended; its header is forgotten at the next feed.
    done: bool,
}

impl FrameWalker {
    pub fn new(masked: bool) -> Self {
        FrameWalker {
            masked,
            head: [0; MAX_FRAME_HEAD],
            have: 0,
            left: None,
            done: false,
        }
    }

    /// Between two frames (no byte of the next one seen).
    pub fn at_boundary(&self) -> bool {
        (self.have == 0 || self.done) && self.left.is_none()
    }

    /// The header of the frame just read, right after [`Step::Head`].
    pub fn head_bytes(&self) -> &[u8] {
        &self.head[..self.have]
    }

    /// The bytes of a header not complete yet (empty otherwise).
    pub fn partial_head(&self) -> &[u8] {
        if self.done || self.left.is_some() {
            &[]
        } else {
            &self.head[..self.have]
        }
    }

    /// Takes the next bytes (not empty); says how many it took and what they were.
    pub fn feed(&mut self, b: &[u8]) -> Result<Step, BadFrame> {
        if self.done {
            self.done = false;
            self.have = 0;
        }
        if let Some(left) = self.left {
            let n = (b.len() as u64).min(left);
            let left = left - n;
            let end = left == 0;
            if end {
                self.left = None;
                self.done = true;
            } else {
                self.left = Some(left);
            }
            return Ok(Step::Payload { n: n as usize, end });
        }
        // A header: bytes go into `head` until it is complete (at most 14).
        let mut n = 0;
        for &byte in b {
            if self.have >= MAX_FRAME_HEAD {
                return Err(BadFrame);
            }
            self.head[self.have] = byte;
            self.have += 1;
            n += 1;
            if let Some(info) = frame_head(&self.head[..self.have], self.masked)? {
                let end = info.payload == 0;
                if end {
                    self.done = true;
                } else {
                    self.left = Some(info.payload);
                }
                return Ok(Step::Head { n, info, end });
            }
        }
        Ok(Step::PartialHead(n))
    }
}

/// Where an HTTP head (request or answer) ends in `buf` (past its blank line), searching from
/// `from` (bytes already searched, minus 3).
pub fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let from = from.saturating_sub(3).min(buf.len());
    buf[from..]
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| from + at + 4)
}

/// The header lines of an HTTP head (its first line left out), as `(name, value)`, trimmed;
/// `None` when a line has no `:`.
fn headers(head: &str) -> Option<Vec<(&str, &str)>> {
    head.trim_end_matches("\r\n")
        .split("\r\n")
        .skip(1)
        .map(|l| l.split_once(':').map(|(n, v)| (n.trim(), v.trim())))
        .collect()
}

/// The minion's upgrade request head: its `Sec-WebSocket-Key` when it is a websocket upgrade
/// saltgate can replay (`GET`, HTTP/1.1, `Upgrade: websocket`, a key, no extension offered, no
/// body); `Err` with why not.
pub fn upgrade_key(head: &[u8]) -> Result<String, &'static str> {
    let text = std::str::from_utf8(head).map_err(|_| "not UTF-8")?;
    let first = text.split("\r\n").next().unwrap_or_default();
    let parts: Vec<&str> = first.split(' ').collect();
    if parts.len() != 3 || parts[0] != "GET" || parts[2] != "HTTP/1.1" {
        return Err("not a GET HTTP/1.1 request");
    }
    let mut upgrade = false;
    let mut key = None;
    for (name, value) in headers(text).ok_or("a header line without ':'")? {
        match name.to_ascii_lowercase().as_str() {
            "upgrade" => upgrade |= has_token(value, "websocket"),
            "sec-websocket-key" => key = Some(value.to_string()),
            // Compression state could not be carried to another master.
            "sec-websocket-extensions" => return Err("a websocket extension offered"),
            "content-length" if value != "0" => return Err("a body"),
            "transfer-encoding" => return Err("a body"),
            _ => {}
        }
    }
    if !upgrade {
        return Err("no Upgrade: websocket");
    }
    key.filter(|k| !k.is_empty()).ok_or("no Sec-WebSocket-Key")
}

/// The master's answer head: fine when it is `101` without a negotiated extension.
pub fn answer_ok(head: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(head) else {
        return false;
    };
    let first = text.split("\r\n").next().unwrap_or_default();
    let mut parts = first.splitn(3, ' ');
    let (proto, code) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if !proto.starts_with("HTTP/1.") || code != "101" {
        return false;
    }
    headers(text).is_some_and(|h| {
        !h.iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-extensions"))
    })
}
