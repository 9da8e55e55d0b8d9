//! Request continuity on Salt's plain `ws` transport: the minion's upgrade request and which of
//! its requests are unanswered, read from the bytes as they pass (docs/request-continuity.md,
//! "On Salt's `ws` transport").
//!
//! A `ws` request connection (`salt/transport/ws.py`, Salt 3008.5) is an HTTP/1.1 upgrade
//! request, the master's `101` answer, then websocket frames: each request is one binary message
//! from the minion (masked, one frame from aiohttp, though fragments are followed), each reply
//! one binary message from the master (`RequestServer.handle_message` reads a message, awaits its
//! handler, sends the reply, then reads the next). Messages carry no id: replies come in the
//! order of the requests, so the oldest unanswered request is the one a reply answers. Salt's
//! `RequestClient.send` dials a new websocket for each request, so a connection carries one.
//!
//! [`WsTrack`] follows both directions:
//! * minion → master: the upgrade request, kept raw (at most [`MAX_HTTP_HEAD`] bytes) for the
//!   next master, then each binary message, seen before it is written to the master and kept raw
//!   (its frames as the minion sent them; control frames between its fragments are passed, not
//!   kept) while it is unanswered, up to `cap` bytes for all of them together. One that does not
//!   fit is not kept: while it is unanswered the session cannot move (`over-cap`).
//! * master → minion: the `101` answer (whether any of it reached the minion), then where each
//!   frame starts and ends. Once the first frame of a binary reply has reached the minion, the
//!   oldest request is answered and dropped.
//!
//! A text message (Salt's `"close"`, which the master answers by closing), an extension offered,
//! a reply to nothing, a frame breaking RFC 6455, more than [`MAX_PENDING`] requests in flight,
//! a message over [`MAX_MESSAGE`]: the tracker gives up for good and holds nothing; the session
//! closes with its master, as with `on_master_down: close`. A close frame either way ends the
//! websocket: the master's end that follows is not a death ([`WsTrack::finished`]).

use bytes::Bytes;
use saltgate_wire::salt_ws::{OP_BINARY, OP_CLOSE, OP_CONT};

use super::held::Held;
use super::track::{ReplyEvents, Skip};
use super::ws_walk::{
    answer_ok, head_end, upgrade_key, FrameWalker, Step, MAX_FRAME_HEAD, MAX_HTTP_HEAD,
};

/// The largest message followed, fragments and headers included (aiohttp's own limit, Salt's
/// master's, is 4 MiB; past it the master closes the websocket).
pub const MAX_MESSAGE: u64 = 100 * 1024 * 1024;
/// Requests in flight on one websocket (Salt's client sends one); past it the tracker gives up.
pub const MAX_PENDING: usize = 64;
/// A control frame's bytes held while it passes (header and at most 125 bytes of payload).
const MAX_CONTROL: usize = MAX_FRAME_HEAD + 125;

/// The minion → master side.
#[derive(Debug)]
struct Up {
    /// The upgrade request, raw, as it arrives and once complete.
    upgrade: Vec<u8>,
    /// Its `Sec-WebSocket-Key`, once it is complete.
    key: Option<String>,
    walk: FrameWalker,
    /// The frame in progress is a control frame; its bytes so far.
    control: Option<Vec<u8>>,
    /// A fragmented binary message is in progress (its first frame had no FIN).
    fragmented: bool,
}

/// The master → minion side.
#[derive(Debug)]
struct Down {
    /// The `101` answer's bytes while it passes (freed once complete).
    answer: Vec<u8>,
    upgraded: bool,
    walk: FrameWalker,
    /// A fragmented reply is in progress.
    fragmented: bool,
    /// The frame in progress belongs to a reply.
    in_data: bool,
}

impl Down {
    fn new(upgraded: bool) -> Self {
        Down {
            answer: Vec::new(),
            upgraded,
            walk: FrameWalker::new(false),
            fragmented: false,
            in_data: false,
        }
    }
}

/// Both directions of one `ws` request connection (see the module docs).
#[derive(Debug)]
pub struct WsTrack {
    up: Up,
    down: Down,
    /// The unanswered binary messages, each with its size so far (frames and headers), kept or
    /// not.
    pending: Held<u64>,
    gave_up: bool,
    /// A close frame passed, either way.
    finished: bool,
}

impl WsTrack {
    /// Keeps unanswered requests of up to `cap` bytes in total.
    pub fn new(cap: usize) -> Self {
        WsTrack {
            up: Up {
                upgrade: Vec::new(),
                key: None,
                walk: FrameWalker::new(true),
                control: None,
                fragmented: false,
            },
            down: Down::new(false),
            pending: Held::new(cap),
            gave_up: false,
            finished: false,
        }
    }

    pub fn gave_up(&self) -> bool {
        self.gave_up
    }

    /// A close frame passed: the websocket is ending, its master's end is not a death.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Bytes held for re-sending right now (the upgrade request included).
    pub fn kept_len(&self) -> usize {
        self.pending.kept() + self.up.upgrade.len()
    }

    /// Requests sent (or being sent) and not answered.
    pub fn unanswered(&self) -> usize {
        self.pending.len()
    }

    fn give_up(&mut self) {
        self.gave_up = true;
        self.pending.clear();
        self.up.upgrade = Vec::new();
        self.up.key = None;
        self.up.control = None;
        self.down.answer = Vec::new();
    }

    /// The minion's upgrade request and its key, for the next master; `None` until complete.
    pub fn upgrade(&self) -> Option<(&[u8], &str)> {
        let key = self.up.key.as_deref()?;
        Some((&self.up.upgrade, key))
    }

    /// Whether the master's `101` must be passed to the minion (none of it reached the minion).
    pub fn pass_answer(&self) -> bool {
        !self.down.upgraded
    }

    /// Looks at the next bytes the minion sent (before they are written to the master).
    pub fn observe_up(&mut self, mut b: &[u8]) {
        while !b.is_empty() && !self.gave_up {
            if self.up.key.is_none() {
                b = self.upgrade_piece(b);
                continue;
            }
            let Ok(step) = self.up.walk.feed(b) else {
                return self.give_up();
            };
            match step {
                Step::PartialHead(n) => b = &b[n..],
                Step::Head { n, info, end } => {
                    b = &b[n..];
                    if info.control() {
                        if info.opcode == OP_CLOSE {
                            self.finished = true;
                        }
                        let mut c = Vec::with_capacity(MAX_CONTROL);
                        c.extend_from_slice(self.up.walk.head_bytes());
                        self.up.control = Some(c);
                    } else {
                        match (info.opcode, self.up.fragmented) {
                            (OP_BINARY, false) => {
                                if !self.pending.push(0, MAX_PENDING) {
                                    return self.give_up();
                                }
                            }
                            (OP_CONT, true) => {}
                            // Text (no reply to match), a new message inside one, a
                            // continuation of nothing.
                            _ => return self.give_up(),
                        }
                        self.up.fragmented = !info.fin;
                        let size = info.head as u64 + info.payload;
                        if !self.grow(size) || !self.pending.keep(self.up.walk.head_bytes()) {
                            return self.give_up();
                        }
                    }
                    if end {
                        self.up_frame_end();
                    }
                }
                Step::Payload { n, end } => {
                    let piece = &b[..n];
                    b = &b[n..];
                    if let Some(c) = self.up.control.as_mut() {
                        if c.len() + n > MAX_CONTROL {
                            return self.give_up();
                        }
                        c.extend_from_slice(piece);
                    } else if !self.pending.keep(piece) {
                        return self.give_up();
                    }
                    if end {
                        self.up_frame_end();
                    }
                }
            }
        }
    }

    /// Takes bytes of the upgrade request; returns what follows it.
    fn upgrade_piece<'a>(&mut self, b: &'a [u8]) -> &'a [u8] {
        let had = self.up.upgrade.len();
        let take = b.len().min(MAX_HTTP_HEAD - had);
        self.up.upgrade.extend_from_slice(&b[..take]);
        let Some(end) = head_end(&self.up.upgrade, had) else {
            if self.up.upgrade.len() >= MAX_HTTP_HEAD
                || !b"GET ".starts_with(&self.up.upgrade[..self.up.upgrade.len().min(4)])
            {
                self.give_up();
                return &[];
            }
            return &b[take..];
        };
        self.up.upgrade.truncate(end);
        match upgrade_key(&self.up.upgrade) {
            Ok(key) => {
                self.up.upgrade.shrink_to_fit();
                self.up.key = Some(key);
                b.get(end.saturating_sub(had)..).unwrap_or_default()
            }
            Err(_) => {
                self.give_up();
                &[]
            }
        }
    }

    /// The message in progress grows by a data frame (its full size, at its header); false
    /// when it is over [`MAX_MESSAGE`] (or there is none).
    fn grow(&mut self, size: u64) -> bool {
        let Some(p) = self.pending.last_mut() else {
            return false;
        };
        p.meta += size;
        p.meta <= MAX_MESSAGE
    }

    fn up_frame_end(&mut self) {
        if self.up.control.take().is_some() {
            return;
        }
        if !self.up.fragmented {
            if let Some(p) = self.pending.last_mut() {
                p.complete = true;
            }
        }
    }

    /// Looks at bytes written to the minion (the start of a binary reply answers the oldest
    /// request).
    pub fn observe_down(&mut self, mut b: &[u8]) -> ReplyEvents {
        let mut ev = ReplyEvents::default();
        while !b.is_empty() && !self.gave_up {
            if !self.down.upgraded {
                let had = self.down.answer.len();
                let take = b.len().min(MAX_HTTP_HEAD - had);
                self.down.answer.extend_from_slice(&b[..take]);
                match head_end(&self.down.answer, had) {
                    Some(end) if answer_ok(&self.down.answer[..end]) => {
                        self.down.answer = Vec::new();
                        self.down.upgraded = true;
                        b = b.get(end.saturating_sub(had)..).unwrap_or_default();
                    }
                    None if self.down.answer.len() < MAX_HTTP_HEAD => b = &b[take..],
                    // Refused (not 101), an extension, too long.
                    _ => {
                        self.give_up();
                        return ev;
                    }
                }
                continue;
            }
            let Ok(step) = self.down.walk.feed(b) else {
                self.give_up();
                return ev;
            };
            let (n, end) = match step {
                Step::PartialHead(n) => (n, false),
                Step::Payload { n, end } => (n, end),
                Step::Head { n, info, end } => {
                    if info.control() {
                        self.finished |= info.opcode == OP_CLOSE;
                        self.down.in_data = false;
                    } else {
                        match (info.opcode, self.down.fragmented) {
                            (OP_BINARY, false) => {
                                ev.started = true;
                                // The oldest request is answered; a reply to nothing, or to a
                                // request not whole, is not Salt's.
                                if !self.pending.answered(0).is_some_and(|p| p.complete) {
                                    self.give_up();
                                    return ev;
                                }
                            }
                            (OP_CONT, true) => {}
                            _ => {
                                self.give_up();
                                return ev;
                            }
                        }
                        self.down.fragmented = !info.fin;
                        self.down.in_data = true;
                    }
                    (n, end)
                }
            };
            b = &b[n..];
            if end && self.down.in_data && !self.down.fragmented {
                ev.done = true;
            }
        }
        ev
    }

    /// Whether the minion's stream stands where another master's bytes can follow.
    pub fn movable(&self) -> Result<(), Skip> {
        if self.gave_up || self.finished {
            return Err(Skip::Protocol);
        }
        if self.up.key.is_none() {
            return Err(Skip::Handshake);
        }
        if !self.down.upgraded && !self.down.answer.is_empty() {
            return Err(Skip::MidReply);
        }
        if !self.down.walk.at_boundary() || self.down.fragmented {
            return Err(Skip::MidReply);
        }
        Ok(())
    }

    /// What to re-send to another master after the upgrade, or why the session cannot move:
    /// every unanswered request, in the order sent, the last one as far as it got, then the
    /// part of a frame the minion was sending (a control frame, a header), whose rest follows
    /// from the minion. `Ok(None)`: nothing. `complete` is false when something was cut short.
    /// Marks each whole request as re-sent (once at most).
    pub fn take_replay(&mut self) -> Result<Option<(Bytes, bool)>, Skip> {
        self.movable()?;
        let tail: &[u8] = match &self.up.control {
            Some(c) => c,
            None => self.up.walk.partial_head(),
        };
        self.pending.take_replay(tail)
    }

    /// Another master now sends to the minion: its `101` is passed to the minion when the old
    /// one's had not reached it, and kept from it otherwise (the minion has one).
    pub fn resumed(&mut self) {
        self.down = Down::new(self.down.upgraded);
    }
}

#[cfg(test)]
#[path = "ws_track_tests.rs"]
mod tests;
