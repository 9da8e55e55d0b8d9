//! Who is on the other end of a request connection: the minion id, read passively from the bytes a
//! client sends to a master's request port (4506).
//!
//! A [`Sniffer`] is fed the client → master bytes of one connection, in whatever chunks they were
//! read, *after* they were forwarded; it never sees the other direction and never changes a byte.
//! It understands just enough of the stream: the 64-byte ZMTP greeting (NULL mechanism only), the
//! READY command, then message frames. The last frame of each message is a Salt request envelope
//! (msgpack, see [`crate::envelope`]):
//!
//! * a clear `_auth` (`{"enc": "clear", "load": {"cmd": "_auth", "id": ...}}`, the first request of
//!   a minion's short-lived authentication socket) gives the id in its load;
//! * an `aes` request (`{"enc": "aes", "load": <ciphertext>, "id": ..., ...}`, everything on the
//!   minion's long-lived request socket) carries the id in clear in the envelope, next to the
//!   ciphertext: reading it costs the same decode, and needs no key;
//! * other clear requests (a clear `ping`) carry no id: the sniffer reads on.
//!
//! It is bounded: it looks at no more than `budget` bytes of the stream (greeting included), holds
//! at most that many, and gives up as soon as a frame would end past the budget. It gives up, once
//! and for good, on anything unexpected: not ZMTP 3, another mechanism than NULL, a framing error,
//! a payload that is not a Salt envelope, an `aes` envelope without an id, an id Salt would refuse.
//! The verdict depends only on the bytes, never on how they were chunked.
//!
//! What it reports is what the client *claims*: the proxy does not check the minion's key. Use it
//! to see where minions are, not to authorise anything.

use bytes::BytesMut;

use crate::envelope::{self, Value};
use crate::peek_buf::BudgetBuf;
use crate::zmtp::frame::{Frame, FrameDecoder, FrameError};
use crate::zmtp::greeting::{Mechanism, GREETING_LEN, SIGNATURE_LEN};

/// The default budget: the first 16 KiB of a connection. A real `_auth` is about 1 KiB (the
/// minion's public key, an RSA-encrypted token, a nonce), the first `aes` request a few hundred
/// bytes to a few KiB.
pub const DEFAULT_BUDGET: usize = 16 * 1024;
/// The smallest budget that can hold a greeting, a READY and a small request.
pub const MIN_BUDGET: usize = 256;
/// Longest id accepted (a fully qualified host name is at most 253 bytes).
pub const MAX_ID_LEN: usize = 255;

/// Where an id was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The load of a clear `_auth`.
    Auth,
    /// The envelope of an `aes` request.
    Aes,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Auth => "auth",
            Source::Aes => "aes",
        }
    }
}

/// A minion id seen on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting {
    pub id: String,
    pub source: Source,
}

/// Why the sniffer stopped without an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GiveUp {
    /// Not a ZMTP 3 greeting (another protocol, Salt's TCP transport, ZMTP 1 or 2).
    NotZmtp,
    /// A ZMTP mechanism other than NULL (frames may be encrypted).
    Mechanism,
    /// Reserved flag bits, a command with MORE, a message before READY; on `tcp`, a message
    /// that is not msgpack `{head, body}` (a ZMTP greeting, a TLS record); on `ws`, no
    /// websocket upgrade or a client frame that breaks RFC 6455.
    Framing,
    /// No id within the budget.
    OverBudget,
    /// A payload that is not a Salt request envelope.
    Malformed,
    /// An `aes` request without an id in its envelope.
    Encrypted,
    /// An id Salt would refuse (empty, too long, a path, control characters, not UTF-8).
    BadId,
}

impl GiveUp {
    pub const ALL: [GiveUp; 7] = [
        GiveUp::NotZmtp,
        GiveUp::Mechanism,
        GiveUp::Framing,
        GiveUp::OverBudget,
        GiveUp::Malformed,
        GiveUp::Encrypted,
        GiveUp::BadId,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GiveUp::NotZmtp => "not-zmtp",
            GiveUp::Mechanism => "mechanism",
            GiveUp::Framing => "framing",
            GiveUp::OverBudget => "over-budget",
            GiveUp::Malformed => "malformed",
            GiveUp::Encrypted => "encrypted",
            GiveUp::BadId => "bad-id",
        }
    }
}

/// Where a sniffer stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Wants more bytes.
    Pending,
    Found(Sighting),
    GaveUp(GiveUp),
}

impl Verdict {
    /// Found or gave up: later bytes change nothing.
    pub fn is_final(&self) -> bool {
        !matches!(self, Verdict::Pending)
    }
}

/// The passive reader of one connection's client → master bytes (see the module docs).
#[derive(Debug)]
pub struct Sniffer {
    /// The bytes taken (at most the budget), those not parsed yet, the verdict.
    input: BudgetBuf<BytesMut>,
    reader: Reader,
}

/// Where the reading stands.
#[derive(Debug)]
struct Reader {
    greeted: bool,
    ready: bool,
    decoder: FrameDecoder,
}

impl Sniffer {
    /// A sniffer that looks at the first `budget` bytes (at least [`MIN_BUDGET`]).
    pub fn new(budget: usize) -> Self {
        let input = BudgetBuf::new(budget);
        Sniffer {
            reader: Reader {
                greeted: false,
                ready: false,
                decoder: FrameDecoder::new(input.budget),
            },
            input,
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
    /// Parses what is buffered; `Some` once the verdict is known.
    fn parse(&mut self, input: &mut BudgetBuf<BytesMut>) -> Option<Verdict> {
        if !self.greeted {
            if let Some(v) = check_greeting(&input.buf) {
                return Some(v);
            }
            if input.buf.len() < GREETING_LEN {
                return None;
            }
            let _ = input.buf.split_to(GREETING_LEN);
            self.greeted = true;
        }
        loop {
            let frame = match self.decoder.decode(&mut input.buf) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    // The frame in progress ends past the budget: no use waiting for it.
                    return match self.decoder.bytes_needed(&input.buf) {
                        Ok(need) if input.taken.saturating_add(need) > input.budget => {
                            Some(Verdict::GaveUp(GiveUp::OverBudget))
                        }
                        _ => None,
                    };
                }
                Err(FrameError::TooLarge { .. }) => {
                    return Some(Verdict::GaveUp(GiveUp::OverBudget))
                }
                Err(_) => return Some(Verdict::GaveUp(GiveUp::Framing)),
            };
            match frame {
                Frame::Command(body) => {
                    // READY first; PING, PONG and the rest are skipped.
                    if !self.ready && !body.starts_with(b"\x05READY") {
                        return Some(Verdict::GaveUp(GiveUp::Framing));
                    }
                    self.ready = true;
                }
                Frame::Message { .. } if !self.ready => {
                    return Some(Verdict::GaveUp(GiveUp::Framing));
                }
                // REQ's empty delimiter, a DEALER's other parts: the envelope is the last part.
                Frame::Message { more: true, .. } => {}
                Frame::Message { body, more: false } => {
                    if let Some(v) = examine(&body) {
                        return Some(v);
                    }
                }
            }
        }
    }
}

/// Checks as much of the greeting as has arrived; `Some` when it is not one we can read.
fn check_greeting(g: &[u8]) -> Option<Verdict> {
    let not_zmtp = Some(Verdict::GaveUp(GiveUp::NotZmtp));
    if g.first().is_some_and(|&b| b != 0xff) {
        return not_zmtp;
    }
    if g.get(SIGNATURE_LEN - 1).is_some_and(|&b| b & 1 == 0) {
        return not_zmtp;
    }
    if g.get(SIGNATURE_LEN).is_some_and(|&major| major < 3) {
        return not_zmtp;
    }
    // Major (1), minor (1), then the 20-byte mechanism.
    let mech = SIGNATURE_LEN + 2..SIGNATURE_LEN + 22;
    if let Some(m) = g.get(mech) {
        if m != Mechanism::NULL.0 {
            return Some(Verdict::GaveUp(GiveUp::Mechanism));
        }
    }
    None
}

/// One request envelope: the verdict it gives, or `None` to read on.
fn examine(payload: &[u8]) -> Option<Verdict> {
    match envelope::decode(payload) {
        Ok(v) => examine_envelope(&v),
        Err(_) => Some(Verdict::GaveUp(GiveUp::Malformed)),
    }
}

/// One decoded request envelope (any transport's: ZeroMQ's last frame, the `body` of Salt's
/// `tcp` framing): the verdict it gives, or `None` to read on.
pub(crate) fn examine_envelope(v: &Value) -> Option<Verdict> {
    let gave_up = |g| Some(Verdict::GaveUp(g));
    if !v.is_map() {
        return gave_up(GiveUp::Malformed);
    }
    let (id, source) = match envelope::get(v, "enc").and_then(envelope::as_bytes) {
        Some(b"clear") => {
            let load = envelope::get(v, "load")?;
            if envelope::get(load, "cmd").and_then(envelope::as_bytes) != Some(b"_auth") {
                return None;
            }
            (envelope::get(load, "id"), Source::Auth)
        }
        Some(b"aes") => match envelope::get(v, "id") {
            Some(id) => (Some(id), Source::Aes),
            None => return gave_up(GiveUp::Encrypted),
        },
        _ => return gave_up(GiveUp::Malformed),
    };
    match id.and_then(valid_id) {
        Some(id) => Some(Verdict::Found(Sighting { id, source })),
        None => gave_up(GiveUp::BadId),
    }
}

/// The id if Salt would take it (`salt.utils.verify.valid_id`: no `/`, `\` or NUL, not `.` or
/// `..`) and it is printable text of at most [`MAX_ID_LEN`] bytes.
pub fn valid_id(v: &Value) -> Option<String> {
    let id = envelope::as_str(v)?;
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id != "."
        && id != ".."
        && !id
            .chars()
            .any(|c| matches!(c, '/' | '\\') || c.is_control());
    ok.then(|| id.to_owned())
}

/// Reads `stream` in one piece (what [`Sniffer::feed`] gives in any chunking).
pub fn sniff(stream: &[u8], budget: usize) -> Verdict {
    Sniffer::new(budget).feed(stream).clone()
}

// The tests build real `_auth` payloads with `rsa`.
#[cfg(all(test, feature = "rsa"))]
#[path = "sniff_tests.rs"]
mod tests;
