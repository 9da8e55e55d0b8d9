//! Message boundaries on a request session, read from the bytes as they pass (no copy of the
//! stream, except the one request kept for re-sending).
//!
//! * [`Scanner`] walks ZMTP 3 frames across arbitrary chunking: greeting, then frames, each
//!   reported as its start (flags), its pieces (header and body bytes, as they arrived) and its
//!   end. It never allocates.
//! * [`Up`] follows the minion → master direction: the minion's greeting, its READY (kept, raw, to
//!   open the same socket on another master), then the REQ socket's requests; the request being
//!   sent or waiting for its reply is kept raw (ZMTP framing included) up to the cap.
//! * [`Down`] follows the master → minion direction: the master's greeting and READY, then where
//!   each reply starts and ends. It tells [`Up`] when the reply starts (the request is no longer
//!   kept: it was answered) and when it is complete.
//!
//! Anything unexpected (not ZMTP 3 NULL, a socket type other than REQ, reserved flag bits, a
//! second request before the reply) makes the tracker give up for good: the session is then
//! pumped as before and closes with its master, as without `on_master_down: migrate`.

use bytes::{Bytes, BytesMut};
use saltgate_wire::transport::zeromq::command::Command;
use saltgate_wire::transport::zeromq::frame::{FLAG_COMMAND, FLAG_LONG, FLAG_MORE};
use saltgate_wire::transport::zeromq::greeting::{Mechanism, GREETING_LEN, SIGNATURE_LEN};
use saltgate_wire::transport::zeromq::{FrameDecoder, SocketType};

/// The largest READY kept (Socket-Type and an Identity of at most 255 bytes fit many times).
pub const MAX_READY: usize = 4096;
/// The largest frame the scanner accepts (wire's default frame limit).
const MAX_FRAME: u64 = saltgate_wire::transport::zeromq::DEFAULT_MAX_FRAME_SIZE as u64;

/// What the scanner reports, in stream order.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// Greeting bytes.
    Greeting(&'a [u8]),
    /// A frame begins (its flags byte is the first byte of the next `Piece`).
    Start { flags: u8 },
    /// Bytes of the current frame (header included).
    Piece(&'a [u8]),
    /// The current frame is complete.
    End { flags: u8 },
}

/// A framing error: the scanner stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broken;

/// Walks one direction's ZMTP stream (see the module docs).
#[derive(Debug, Default)]
pub struct Scanner {
    greeting_left: usize,
    /// Flags of the frame in progress.
    flags: u8,
    /// Header bytes of the frame in progress (at most 9).
    hdr: [u8; 9],
    hdr_len: usize,
    /// Body bytes still to come once the header is complete.
    body_left: u64,
    in_frame: bool,
    broken: bool,
}

impl Scanner {
    pub fn new() -> Self {
        Scanner {
            greeting_left: GREETING_LEN,
            ..Default::default()
        }
    }

    /// True between frames (and after the greeting).
    pub fn at_boundary(&self) -> bool {
        self.greeting_left == 0 && !self.in_frame && !self.broken
    }

    /// Feeds the next bytes; `on` sees the events. Errors once the stream is not ZMTP framing.
    pub fn feed<'a>(
        &mut self,
        mut b: &'a [u8],
        mut on: impl FnMut(Event<'a>),
    ) -> Result<(), Broken> {
        if self.broken {
            return Err(Broken);
        }
        while !b.is_empty() {
            if self.greeting_left > 0 {
                let n = self.greeting_left.min(b.len());
                on(Event::Greeting(&b[..n]));
                self.greeting_left -= n;
                b = &b[n..];
                continue;
            }
            if !self.in_frame {
                let flags = b[0];
                if flags & !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) != 0
                    || (flags & FLAG_COMMAND != 0 && flags & FLAG_MORE != 0)
                {
                    self.broken = true;
                    return Err(Broken);
                }
                self.in_frame = true;
                self.flags = flags;
                self.hdr_len = 0;
                on(Event::Start { flags });
            }
            let need = if self.flags & FLAG_LONG != 0 { 9 } else { 2 };
            if self.hdr_len < need {
                let n = (need - self.hdr_len).min(b.len());
                self.hdr[self.hdr_len..self.hdr_len + n].copy_from_slice(&b[..n]);
                self.hdr_len += n;
                on(Event::Piece(&b[..n]));
                b = &b[n..];
                if self.hdr_len < need {
                    return Ok(());
                }
                self.body_left = if need == 9 {
                    let mut s = [0u8; 8];
                    s.copy_from_slice(&self.hdr[1..9]);
                    u64::from_be_bytes(s)
                } else {
                    u64::from(self.hdr[1])
                };
                if self.body_left > MAX_FRAME {
                    self.broken = true;
                    return Err(Broken);
                }
            }
            let n = (self.body_left.min(b.len() as u64)) as usize;
            if n > 0 {
                on(Event::Piece(&b[..n]));
                b = &b[n..];
                self.body_left -= n as u64;
            }
            if self.body_left == 0 {
                self.in_frame = false;
                on(Event::End { flags: self.flags });
            }
        }
        Ok(())
    }
}

/// Where the minion's current request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Req {
    /// No request outstanding (none yet, or the last one was answered).
    Idle,
    /// Being sent: its frames so far are kept.
    Sending,
    /// Sent whole, no byte of its reply seen yet: kept.
    Waiting,
    /// Its reply has started: nothing kept (it is answered, or being answered).
    Answering,
    /// Larger than the cap: not kept; `true` once sent whole.
    OverCap { sent: bool },
}

/// Why a session cannot move to another master.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Skip {
    /// Not a ZMTP 3 NULL REQ socket, or a framing error, in either direction.
    Protocol,
    /// A handshake was not complete (the minion's or the master's).
    Handshake,
    /// The master had sent part of a frame or of a reply to the minion.
    MidReply,
    /// The unanswered request was larger than `migrate_buffer`.
    OverCap,
    /// The unanswered request was already re-sent once.
    ReplayedOnce,
    /// No other UP master took the session (connect or handshake failed on every candidate).
    NoMaster,
    /// The minion's side failed while moving.
    Client,
}

impl Skip {
    pub const ALL: [Skip; 7] = [
        Skip::Protocol,
        Skip::Handshake,
        Skip::MidReply,
        Skip::OverCap,
        Skip::ReplayedOnce,
        Skip::NoMaster,
        Skip::Client,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Skip::Protocol => "protocol",
            Skip::Handshake => "handshake",
            Skip::MidReply => "mid-reply",
            Skip::OverCap => "over-cap",
            Skip::ReplayedOnce => "replayed-once",
            Skip::NoMaster => "no-master",
            Skip::Client => "client",
        }
    }
}

/// The minion → master direction (see the module docs).
#[derive(Debug)]
pub struct Up {
    scan: Scanner,
    cap: usize,
    greeting: Vec<u8>,
    /// The READY command frame, raw, while it arrives and once complete.
    ready: Vec<u8>,
    ready_done: bool,
    req: Req,
    /// The current request's raw frames (Sending, Waiting).
    kept: BytesMut,
    /// The current request was re-sent once already.
    replayed: bool,
    /// The frame in progress is a message frame (not a command).
    in_msg: bool,
    gave_up: bool,
}

impl Up {
    /// Keeps requests of up to `cap` bytes (framing included).
    pub fn new(cap: usize) -> Self {
        Up {
            scan: Scanner::new(),
            cap,
            greeting: Vec::with_capacity(GREETING_LEN),
            ready: Vec::new(),
            ready_done: false,
            req: Req::Idle,
            kept: BytesMut::new(),
            replayed: false,
            in_msg: false,
            gave_up: false,
        }
    }

    pub fn req(&self) -> Req {
        self.req
    }

    pub fn gave_up(&self) -> bool {
        self.gave_up
    }

    /// Bytes held for re-sending right now.
    pub fn kept_len(&self) -> usize {
        self.kept.len()
    }

    fn give_up(&mut self) {
        self.gave_up = true;
        self.kept = BytesMut::new();
        self.ready = Vec::new();
    }

    /// Looks at the next bytes the minion sent (before they are written to the master).
    pub fn observe(&mut self, bytes: &[u8]) {
        if self.gave_up {
            return;
        }
        let mut bad = false;
        let mut ready_end = false;
        let Up {
            scan,
            cap,
            greeting,
            ready,
            ready_done,
            req,
            kept,
            replayed,
            in_msg,
            ..
        } = self;
        let r = scan.feed(bytes, |ev| match ev {
            Event::Greeting(g) => greeting.extend_from_slice(g),
            Event::Start { flags } => {
                *in_msg = flags & FLAG_COMMAND == 0;
                if !*ready_done {
                    // The first frame must be the READY command.
                    bad |= *in_msg || !ready.is_empty();
                } else if *in_msg {
                    match *req {
                        Req::Idle => {
                            *req = Req::Sending;
                            *replayed = false;
                            kept.clear();
                        }
                        Req::Sending | Req::OverCap { sent: false } => {}
                        // A second request before the reply: not a REQ socket's behaviour.
                        Req::Waiting | Req::Answering | Req::OverCap { sent: true } => bad = true,
                    }
                }
            }
            Event::Piece(p) if !*ready_done => {
                if ready.len() + p.len() > MAX_READY {
                    bad = true;
                } else {
                    ready.extend_from_slice(p);
                }
            }
            Event::Piece(p) if *in_msg => {
                if *req == Req::Sending {
                    if kept.len() + p.len() > *cap {
                        *req = Req::OverCap { sent: false };
                        *kept = BytesMut::new();
                    } else {
                        kept.extend_from_slice(p);
                    }
                }
            }
            Event::Piece(_) => {}
            Event::End { flags } => {
                if !*ready_done {
                    ready_end = true;
                    *ready_done = true;
                } else if flags & FLAG_COMMAND == 0 && flags & FLAG_MORE == 0 {
                    *req = match *req {
                        Req::Sending => Req::Waiting,
                        Req::OverCap { .. } => Req::OverCap { sent: true },
                        other => other,
                    };
                }
            }
        });
        if r.is_err() || bad {
            self.give_up();
            return;
        }
        if !greeting_ok(&self.greeting) {
            self.give_up();
            return;
        }
        if ready_end && self.ready_socket_type() != Some(SocketType::Req) {
            self.give_up();
        }
    }

    fn ready_socket_type(&self) -> Option<SocketType> {
        let mut b = BytesMut::from(&self.ready[..]);
        match FrameDecoder::new(MAX_READY).decode(&mut b) {
            Ok(Some(saltgate_wire::transport::zeromq::Frame::Command(body))) => {
                match Command::parse(&body) {
                    Ok(Command::Ready(p)) => {
                        p.get("Socket-Type").and_then(|t| SocketType::parse(t))
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// The minion's READY frame, raw, once its handshake is complete (and the tracker is on).
    pub fn ready_frame(&self) -> Option<&[u8]> {
        (self.ready_done && !self.gave_up).then_some(&self.ready[..])
    }

    /// What to re-send to another master, or why the session cannot move. `Ok(None)`: nothing
    /// to re-send. Marks a whole request as re-sent (at most once per request).
    pub fn take_replay(&mut self) -> Result<Option<(Bytes, bool)>, Skip> {
        if self.gave_up {
            return Err(Skip::Protocol);
        }
        if !self.ready_done {
            return Err(Skip::Handshake);
        }
        match self.req {
            Req::Idle | Req::Answering => Ok(None),
            Req::OverCap { .. } => Err(Skip::OverCap),
            Req::Waiting if self.replayed => Err(Skip::ReplayedOnce),
            Req::Waiting => {
                self.replayed = true;
                Ok(Some((Bytes::copy_from_slice(&self.kept), true)))
            }
            // Part of it reached the old master, which cannot have acted on it.
            Req::Sending => Ok(Some((Bytes::copy_from_slice(&self.kept), false))),
        }
    }

    /// The master started a reply: the request is answered (nothing is kept any more).
    pub fn reply_started(&mut self) {
        if matches!(self.req, Req::Waiting | Req::Sending | Req::OverCap { .. }) {
            self.req = Req::Answering;
            self.kept = BytesMut::new();
        }
    }

    /// The reply is complete: the minion may send its next request.
    pub fn reply_done(&mut self) {
        self.req = Req::Idle;
    }
}

/// As much of a greeting as has arrived could be ZMTP 3 or later with the NULL mechanism.
fn greeting_ok(g: &[u8]) -> bool {
    let mech = SIGNATURE_LEN + 2..SIGNATURE_LEN + 22;
    g.first().is_none_or(|&b| b == 0xff)
        && g.get(SIGNATURE_LEN - 1).is_none_or(|&b| b & 1 == 1)
        && g.get(SIGNATURE_LEN).is_none_or(|&major| major >= 3)
        && g.iter()
            .enumerate()
            .filter(|(i, _)| mech.contains(i))
            .all(|(i, &b)| b == Mechanism::NULL.0[i - mech.start])
}

/// What the master → minion bytes just did to the current request.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplyEvents {
    pub started: bool,
    pub done: bool,
}

/// The master → minion direction (see the module docs).
#[derive(Debug)]
pub struct Down {
    scan: Scanner,
    /// The master's READY has passed.
    ready: bool,
    /// A reply message is part way through.
    in_reply: bool,
    gave_up: bool,
}

impl Default for Down {
    fn default() -> Self {
        Self::new()
    }
}

impl Down {
    pub fn new() -> Self {
        Down {
            scan: Scanner::new(),
            ready: false,
            in_reply: false,
            gave_up: false,
        }
    }

    /// After another master's handshake was done by saltgate (its greeting and READY swallowed):
    /// the minion's stream is between frames.
    pub fn resumed() -> Self {
        let mut d = Down::new();
        d.scan.greeting_left = 0;
        d.ready = true;
        d
    }

    /// Looks at bytes written to the minion.
    pub fn observe(&mut self, bytes: &[u8]) -> ReplyEvents {
        let mut ev = ReplyEvents::default();
        if self.gave_up {
            return ev;
        }
        let mut bad = false;
        let Down {
            scan,
            ready,
            in_reply,
            ..
        } = self;
        let r = scan.feed(bytes, |e| match e {
            Event::Start { flags } if *ready && flags & FLAG_COMMAND == 0 && !*in_reply => {
                *in_reply = true;
                ev.started = true;
            }
            // The first frame after the greeting is the master's READY.
            Event::Start { flags } if !*ready => bad |= flags & FLAG_COMMAND == 0,
            Event::End { .. } if !*ready => *ready = true,
            Event::End { flags } if flags & FLAG_COMMAND == 0 && flags & FLAG_MORE == 0 => {
                *in_reply = false;
                ev.done = true;
            }
            _ => {}
        });
        if r.is_err() || bad {
            self.gave_up = true;
        }
        ev
    }

    /// Whether the minion's stream stands where another master's replies can follow.
    pub fn movable(&self) -> Result<(), Skip> {
        if self.gave_up {
            return Err(Skip::Protocol);
        }
        if !self.ready {
            return Err(Skip::Handshake);
        }
        if self.in_reply || !self.scan.at_boundary() {
            return Err(Skip::MidReply);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "track_tests.rs"]
mod tests;
