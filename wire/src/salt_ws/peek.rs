//! Presence on Salt's `ws` transport: the minion id of a plain (not TLS) request connection, read
//! passively from the bytes the client sends (the `ws` counterpart of
//! [`crate::salt_tcp::peek::TcpPeek`] and [`crate::sniff::Sniffer`]).
//!
//! A `ws` request connection ([`super`]; `salt/transport/ws.py`, `RequestClient`) is an HTTP/1.1
//! upgrade request (up to its blank line), then RFC 6455 frames from the client:
//! masked, possibly fragmented (a first frame, continuation frames), with control frames (ping,
//! pong, close) allowed between the fragments, payload lengths in 7, 16 or 64 bits. Each binary
//! message is one request: the bare msgpack envelope (`salt.payload.dumps(load)`, no `{head,
//! body}` as on `tcp`). Salt 3008.5's `RequestClient.send` dials a new websocket for every
//! request, so a connection usually carries one: the `_auth` of an authentication, or an `aes`
//! request whose envelope has the id in clear. Which envelopes give an id, and which ids count,
//! is the other transports' code ([`crate::sniff::examine_envelope`]), so every transport gives
//! the same verdict for the same request. Text messages (Salt's `"close"`) are read past. The
//! request's path is not checked: a minion's is `/` (its `RequestClient` turns the minion's
//! `master_uri`, `tcp://ip:port`, into `http://ip:port`), the publish client's `/ws`, and the
//! master's aiohttp server upgrades on any path.
//!
//! Bounded like the others: it looks at no more than `budget` bytes of the stream (the upgrade
//! request included) and holds at most that many (the message being assembled is unmasked in
//! place, in the one buffer), and gives up ([`GiveUp::OverBudget`]) as soon as a frame's
//! declared length would end past the budget, without waiting for its bytes. Anything that is not
//! a websocket upgrade followed by valid client frames (a ZMTP greeting, a TLS record, an HTTP
//! request without `Upgrade: websocket`, an unmasked frame, reserved bits or opcodes, a
//! continuation with nothing to continue) is [`GiveUp::Framing`]; a binary message that is not a
//! request envelope is [`GiveUp::Malformed`]. Frames with RSV1 set (a negotiated
//! `permessage-deflate`, which Salt's aiohttp client never offers) are given up on as framing. It
//! never panics on hostile bytes, and the verdict depends only on the bytes, never on their
//! chunking.
//!
//! Under TLS (`ssl`) the stream is encrypted end to end: the proxy attaches no peek there.

use crate::envelope;
use crate::peek_buf::BudgetBuf;
use crate::sniff::{examine_envelope, GiveUp, Verdict};

use super::{frame_head, has_token, OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT};

/// Where the stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// In the upgrade request; `scanned`: bytes already searched for its blank line.
    Upgrade {
        scanned: usize,
    },
    Frames,
}

/// The passive reader of one `ws` request connection's client → master bytes.
#[derive(Debug)]
pub struct WsPeek {
    /// The bytes taken (at most the budget), those not yet examined, the verdict.
    input: BudgetBuf,
    reader: Reader,
}

/// Where the reading stands.
#[derive(Debug)]
struct Reader {
    /// In [`Phase::Frames`]: `input.buf[..message]` is the unmasked payload of the binary
    /// message being assembled, the rest raw bytes not yet parsed.
    message: usize,
    /// The opcode of a fragmented data message in progress (its first frame had no FIN).
    fragmented: Option<u8>,
    phase: Phase,
}

impl WsPeek {
    /// A peek that looks at the first `budget` bytes (at least [`crate::sniff::MIN_BUDGET`]).
    pub fn new(budget: usize) -> Self {
        WsPeek {
            input: BudgetBuf::new(budget),
            reader: Reader {
                message: 0,
                fragmented: None,
                phase: Phase::Upgrade { scanned: 0 },
            },
        }
    }

    pub fn budget(&self) -> usize {
        self.input.budget
    }

    /// Bytes of memory held right now (never more than the budget; 0 once the verdict is final).
    pub fn buffered(&self) -> usize {
        self.input.buffered()
    }

    pub fn verdict(&self) -> &Verdict {
        self.input.verdict()
    }

    /// Takes the next bytes of the stream; returns the verdict so far. Once it is final, later
    /// calls return it at once.
    pub fn feed(&mut self, bytes: &[u8]) -> &Verdict {
        let reader = &mut self.reader;
        self.input.feed(bytes, |input| reader.parse(input))
    }
}

impl Reader {
    fn parse(&mut self, input: &mut BudgetBuf) -> Option<Verdict> {
        if let Phase::Upgrade { scanned } = self.phase {
            match upgrade_end(&input.buf, scanned) {
                Err(()) => return Some(Verdict::GaveUp(GiveUp::Framing)),
                Ok(None) => {
                    self.phase = Phase::Upgrade {
                        scanned: input.buf.len(),
                    };
                    return None;
                }
                Ok(Some(end)) => {
                    input.buf.drain(..end);
                    self.phase = Phase::Frames;
                }
            }
        }
        self.frames(input)
    }

    /// Examines every whole frame buffered; `Some` once the verdict is known.
    fn frames(&mut self, input: &mut BudgetBuf) -> Option<Verdict> {
        let framing = Some(Verdict::GaveUp(GiveUp::Framing));
        loop {
            let raw = &input.buf[self.message..];
            let frame = match frame_head(raw, true) {
                Ok(Some(h)) => h,
                Ok(None) => return None,
                Err(_) => return framing,
            };
            // Where the frame ends in the stream: past the budget, no use waiting for it.
            let start = (input.taken - raw.len()) as u64;
            let end = start + frame.head as u64 + frame.payload;
            if end > input.budget as u64 {
                return Some(Verdict::GaveUp(GiveUp::OverBudget));
            }
            // Fits in the budget, hence in memory.
            let size = frame.head + frame.payload as usize;
            if raw.len() < size {
                return None;
            }
            let keep = match (frame.opcode, self.fragmented) {
                (OP_CLOSE | OP_PING | OP_PONG, _) => false,
                (OP_TEXT | OP_BINARY, None) => {
                    if !frame.fin {
                        self.fragmented = Some(frame.opcode);
                    }
                    frame.opcode == OP_BINARY
                }
                (OP_CONT, Some(op)) => {
                    if frame.fin {
                        self.fragmented = None;
                    }
                    op == OP_BINARY
                }
                // A new message inside a fragmented one, a continuation of nothing.
                _ => return framing,
            };
            let at = self.message;
            if !keep {
                input.buf.drain(at..at + size);
                continue;
            }
            let key: [u8; 4] = [
                input.buf[at + frame.head - 4],
                input.buf[at + frame.head - 3],
                input.buf[at + frame.head - 2],
                input.buf[at + frame.head - 1],
            ];
            for (i, b) in input.buf[at + frame.head..at + size].iter_mut().enumerate() {
                *b ^= key[i % 4];
            }
            input.buf.drain(at..at + frame.head);
            self.message += frame.payload as usize;
            if self.fragmented.is_some() {
                continue;
            }
            // A whole binary message: one request envelope.
            let verdict = match envelope::decode(&input.buf[..self.message]) {
                Ok(v) => examine_envelope(&v),
                Err(_) => Some(Verdict::GaveUp(GiveUp::Malformed)),
            };
            if verdict.is_some() {
                return verdict;
            }
            input.buf.drain(..self.message);
            self.message = 0;
        }
    }
}

/// The end (past the blank line) of the upgrade request at the start of `buf`, `Ok(None)` while
/// incomplete, `Err` when it is not a websocket upgrade. `scanned`: bytes already searched.
fn upgrade_end(buf: &[u8], scanned: usize) -> Result<Option<usize>, ()> {
    const GET: &[u8] = b"GET ";
    let n = buf.len().min(GET.len());
    if buf[..n] != GET[..n] {
        return Err(());
    }
    let from = scanned.saturating_sub(3);
    let Some(at) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let end = from + at + 4;
    let head = String::from_utf8_lossy(&buf[..end - 4]);
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or_default();
    if !request.ends_with(" HTTP/1.1") || request.split(' ').count() != 3 {
        return Err(());
    }
    let mut upgrade = false;
    for line in lines {
        let (name, value) = line.split_once(':').ok_or(())?;
        if name.trim().eq_ignore_ascii_case("upgrade") {
            upgrade |= has_token(value, "websocket");
        }
    }
    if upgrade {
        Ok(Some(end))
    } else {
        Err(())
    }
}

impl crate::transport::Peek for WsPeek {
    fn feed(&mut self, bytes: &[u8]) -> &Verdict {
        WsPeek::feed(self, bytes)
    }

    fn budget(&self) -> usize {
        WsPeek::budget(self)
    }
}

/// Reads `stream` in one piece (what [`WsPeek::feed`] gives in any chunking).
pub fn peek(stream: &[u8], budget: usize) -> Verdict {
    WsPeek::new(budget).feed(stream).clone()
}

#[cfg(test)]
#[path = "peek_tests.rs"]
mod tests;
