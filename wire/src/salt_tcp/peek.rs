//! Presence on Salt's `tcp` transport: the minion id of a request connection, read passively
//! from the bytes the client sends (the `tcp` counterpart of [`crate::sniff::Sniffer`], which
//! reads ZMTP).
//!
//! A `tcp` request stream is msgpack maps `{"head": {"mid": ...}, "body": <envelope>}` back to
//! back with no length prefix ([`super`]); the `body` is the Salt request envelope itself. The
//! first request of a minion's authentication is a clear `_auth` whose load has the id; every
//! `aes` request carries the id in clear in its envelope; a clear `ping` (a health check) has
//! none and is read past. What counts as an id, and what does not, is the ZeroMQ sniffer's
//! ([`crate::sniff::valid_id`]), so both transports give the same verdicts for the same requests.
//!
//! Bounded like the sniffer: it looks at no more than `budget` bytes of the stream, holds at most
//! that many, and gives up ([`GiveUp::OverBudget`]) as soon as a message's declared size would end
//! past the budget, without waiting for its bytes. Anything that is not Salt's framing (a ZMTP
//! greeting, a TLS record, bytes that are not msgpack, a map without `head` and `body`) is
//! [`GiveUp::Framing`]; a `body` that is not a request envelope is [`GiveUp::Malformed`]. It never
//! panics on hostile bytes, and the verdict depends only on the bytes, never on their chunking.
//!
//! Under TLS the stream is encrypted end to end: there is nothing to peek at (the proxy does not
//! attach one; presence is by address only there).

use crate::envelope;
use crate::peek_buf::BudgetBuf;
use crate::sniff::{examine_envelope, GiveUp, Verdict};

use super::{scan, FrameError, TcpMessage};

/// The passive reader of one `tcp` request connection's client → master bytes.
#[derive(Debug)]
pub struct TcpPeek {
    /// The bytes taken (at most the budget), those not yet examined, the verdict.
    input: BudgetBuf,
    /// Bytes of whole messages already examined (the start of `buf` in the stream).
    consumed: usize,
}

impl TcpPeek {
    /// A peek that looks at the first `budget` bytes (at least [`crate::sniff::MIN_BUDGET`]).
    pub fn new(budget: usize) -> Self {
        TcpPeek {
            input: BudgetBuf::new(budget),
            consumed: 0,
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
        let consumed = &mut self.consumed;
        self.input.feed(bytes, |input| parse(input, consumed))
    }
}

/// Examines every whole message buffered; `Some` once the verdict is known.
fn parse(input: &mut BudgetBuf, consumed: &mut usize) -> Option<Verdict> {
    loop {
        if input.buf.is_empty() {
            return None;
        }
        // What is left of the budget is the most the next message may take.
        let room = input.budget - *consumed;
        let len = match scan(&input.buf, room) {
            Ok(Some(len)) => len,
            Ok(None) => return None,
            Err(FrameError::TooLarge { .. }) => return Some(Verdict::GaveUp(GiveUp::OverBudget)),
            Err(_) => return Some(Verdict::GaveUp(GiveUp::Framing)),
        };
        let message = envelope::decode(&input.buf[..len])
            .ok()
            .and_then(|v| TcpMessage::from_value(v).ok());
        let Some(message) = message else {
            return Some(Verdict::GaveUp(GiveUp::Framing));
        };
        if let Some(v) = examine_envelope(&message.body) {
            return Some(v);
        }
        input.buf.drain(..len);
        *consumed += len;
    }
}

impl crate::transport::Peek for TcpPeek {
    fn feed(&mut self, bytes: &[u8]) -> &Verdict {
        TcpPeek::feed(self, bytes)
    }

    fn budget(&self) -> usize {
        TcpPeek::budget(self)
    }
}

/// Reads `stream` in one piece (what [`TcpPeek::feed`] gives in any chunking).
pub fn peek(stream: &[u8], budget: usize) -> Verdict {
    TcpPeek::new(budget).feed(stream).clone()
}

#[cfg(test)]
#[path = "peek_tests.rs"]
pub(crate) mod tests;
