//! Which minion → master bytes are a clear `_auth`, read as they pass, for
//! `listeners.request.auth_limit` ([`super::auth_limit`]).
//!
//! Bytes pass at once, except a request message from its first byte until it is complete: it is
//! held (a copy of at most [`HOLD_CAP`] bytes), then read as a Salt envelope. A clear `_auth` goes
//! through the master's gate before its bytes are written; anything else is written at once. A
//! request larger than the cap is not an `_auth` (those are about 1 KiB): it is released and the
//! rest of it passes. Anything that is not ZMTP framing turns the reader off: bytes pass.

use bytes::BytesMut;
use saltgate_wire::envelope;
use saltgate_wire::transport::zeromq::frame::{FLAG_COMMAND, FLAG_MORE};
use saltgate_wire::transport::zeromq::{Frame, FrameDecoder};

use super::track::{Event, Scanner};

/// The largest request held to be read: presence's sniff budget (a real `_auth` is ~1 KiB).
pub const HOLD_CAP: usize = saltgate_wire::transport::DEFAULT_PEEK_BUDGET;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    /// Between requests: the next message start is held.
    Between,
    /// A request is held.
    Holding,
    /// A request that is not held passes until its end.
    Passing,
    /// Not ZMTP: everything passes.
    Off,
}

/// What to do with a chunk the minion sent.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Write `chunk[..n]` now; the rest of the chunk (if any) is held.
    Write(usize),
    /// Write `chunk[..pre]` now, then `bytes` (the held request and the rest of the chunk) once
    /// the gate admits it if `auth`, at once otherwise.
    Release {
        pre: usize,
        bytes: BytesMut,
        auth: bool,
    },
}

/// The reader of one session's minion → master bytes (see the module docs).
#[derive(Debug)]
pub struct Hold {
    scan: Scanner,
    ready_done: bool,
    st: St,
    held: BytesMut,
}

impl Default for Hold {
    fn default() -> Self {
        Self::new()
    }
}

impl Hold {
    pub fn new() -> Self {
        Hold {
            scan: Scanner::new(),
            ready_done: false,
            st: St::Between,
            held: BytesMut::new(),
        }
    }

    /// Stops reading: everything passes from now on.
    pub fn off(&mut self) {
        self.st = St::Off;
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Takes the next chunk from the minion (see [`Step`]).
    pub fn feed(&mut self, chunk: &[u8]) -> Step {
        if self.st == St::Off {
            return Step::Write(chunk.len());
        }
        let was = self.st;
        let mut st = self.st;
        let mut off = 0usize;
        let mut start = None;
        let mut end = None;
        let ready_done = &mut self.ready_done;
        let r = self.scan.feed(chunk, |ev| match ev {
            Event::Greeting(g) | Event::Piece(g) => off += g.len(),
            Event::Start { flags } if *ready_done && flags & FLAG_COMMAND == 0 => {
                if st == St::Between {
                    if end.is_none() && start.is_none() {
                        st = St::Holding;
                        start = Some(off);
                    } else {
                        // Another request in the same chunk after the held one: not REQ-like.
                        st = St::Passing;
                    }
                }
            }
            Event::Start { .. } => {}
            Event::End { .. } if !*ready_done => *ready_done = true,
            Event::End { flags } if flags & (FLAG_COMMAND | FLAG_MORE) == 0 => {
                if st == St::Holding && end.is_none() {
                    end = Some(off);
                }
                st = St::Between;
            }
            Event::End { .. } => {}
        });
        let holding = was == St::Holding || start.is_some();
        if r.is_err() {
            self.st = St::Off;
            return self.release(holding, start, chunk, false);
        }
        self.st = st;
        if !holding {
            return Step::Write(chunk.len());
        }
        if end.is_some() {
            let mut step = self.release(true, start, chunk, false);
            if let Step::Release { bytes, auth, .. } = &mut step {
                *auth = is_auth(bytes);
            }
            return step;
        }
        let pre = start.unwrap_or(0);
        if self.held.len() + (chunk.len() - pre) > HOLD_CAP {
            // Too large for an `_auth`: the rest of it passes.
            self.st = St::Passing;
            return self.release(true, start, chunk, false);
        }
        self.held.extend_from_slice(&chunk[pre..]);
        Step::Write(pre)
    }

    fn release(&mut self, holding: bool, start: Option<usize>, chunk: &[u8], auth: bool) -> Step {
        if !holding {
            return Step::Write(chunk.len());
        }
        let pre = start.unwrap_or(0);
        let mut bytes = std::mem::take(&mut self.held);
        bytes.extend_from_slice(&chunk[pre..]);
        Step::Release { pre, bytes, auth }
    }
}

/// Whether held bytes (starting at a message boundary) are a clear `_auth` request.
pub fn is_auth(held: &[u8]) -> bool {
    let mut b = BytesMut::from(held);
    let dec = FrameDecoder::new(HOLD_CAP);
    loop {
        match dec.decode(&mut b) {
            Ok(Some(Frame::Message { more: false, body })) => {
                let Ok(v) = envelope::decode(&body) else {
                    return false;
                };
                let clear = envelope::get(&v, "enc").and_then(envelope::as_bytes) == Some(b"clear");
                let cmd = envelope::get(&v, "load")
                    .and_then(|l| envelope::get(l, "cmd"))
                    .and_then(envelope::as_bytes);
                return clear && cmd == Some(b"_auth");
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use saltgate_wire::transport::zeromq::frame::encode_frame;
    use saltgate_wire::transport::zeromq::greeting::Greeting;

    fn envelope(enc: &str, cmd: &str) -> Vec<u8> {
        use envelope::{map, text, Value};
        let load = map(vec![("cmd", text(cmd)), ("id", text("m1"))]);
        envelope::encode(&map(vec![
            ("enc", text(enc)),
            ("load", load),
            ("version", Value::from(3)),
        ]))
    }

    fn request(payload: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        encode_frame(&mut b, FLAG_MORE, b"");
        encode_frame(&mut b, 0, payload);
        b.to_vec()
    }

    fn handshake() -> Vec<u8> {
        let mut b = Greeting::ours(false).encode().to_vec();
        let mut r = BytesMut::new();
        encode_frame(
            &mut r,
            FLAG_COMMAND,
            b"\x05READY\x0bSocket-Type\x00\x00\x00\x03REQ",
        );
        b.extend_from_slice(&r);
        b
    }

    /// Feeds `stream` in chunks of `n`; returns (bytes written at once, releases).
    fn run(stream: &[u8], n: usize) -> (Vec<u8>, Vec<(Vec<u8>, bool)>) {
        let mut h = Hold::new();
        let (mut now, mut rel) = (Vec::new(), Vec::new());
        for c in stream.chunks(n) {
            match h.feed(c) {
                Step::Write(k) => now.extend_from_slice(&c[..k]),
                Step::Release { pre, bytes, auth } => {
                    now.extend_from_slice(&c[..pre]);
                    rel.push((bytes.to_vec(), auth));
                }
            }
        }
        (now, rel)
    }

    #[test]
    fn an_auth_is_held_whole_in_any_chunking_and_other_requests_are_released_as_not_auth() {
        let hs = handshake();
        let auth = request(&envelope("clear", "_auth"));
        let ping = request(&envelope("clear", "ping"));
        for n in [1, 3, 7, 64, 4096] {
            let mut s = hs.clone();
            s.extend_from_slice(&auth);
            let (now, rel) = run(&s, n);
            assert_eq!(now, hs, "chunk {n}");
            assert_eq!(rel.len(), 1, "chunk {n}");
            assert_eq!(rel[0], (auth.clone(), true), "chunk {n}");
            let mut s = hs.clone();
            s.extend_from_slice(&ping);
            let (now, rel) = run(&s, n);
            assert_eq!(now, hs);
            assert_eq!(rel, vec![(ping.clone(), false)]);
        }
        assert!(!is_auth(&request(&envelope("aes", "_auth"))));
    }

    #[test]
    fn a_request_over_the_cap_passes_and_garbage_turns_the_reader_off() {
        let hs = handshake();
        let big = request(&vec![0x90; HOLD_CAP + 10]);
        let mut s = hs.clone();
        s.extend_from_slice(&big);
        let (now, rel) = run(&s, 1000);
        let released: usize = rel.iter().map(|(b, _)| b.len()).sum();
        assert!(rel.iter().all(|(_, a)| !a));
        assert_eq!(now.len() + released, s.len());
        let mut h = Hold::new();
        assert_eq!(h.feed(b"GET / HTTP/1.1\r\n"), Step::Write(16));
        assert_eq!(h.feed(b"more"), Step::Write(4));
    }
}
