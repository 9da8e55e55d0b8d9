//! Request continuity on Salt's plain `tcp` transport: which requests of a minion's request
//! connection are unanswered, read from the bytes as they pass (docs/request-continuity.md,
//! "On Salt's `tcp` transport").
//!
//! Salt's `tcp` request stream is msgpack maps `{"head": {"mid": <uuid4>}, "body": <envelope>}`
//! back to back; the master answers each with the request's `head` echoed and its reply as
//! `body`, in the order it finishes them (`salt/transport/tcp.py`: `RequestClient.send`,
//! `SaltMessageServer.handle_stream`, `RequestServer.handle_message`). Unlike a ZeroMQ REQ socket,
//! several requests may be in flight on one connection: a request the minion gave up on after
//! its timeout stays unanswered while its retry (a new `mid`) follows on the same connection.
//!
//! [`TcpTrack`] follows both directions with [`Walker`]:
//! * minion → master: each request, seen before it is written to the master, kept raw (whole
//!   message, as the minion sent it) while it is unanswered, up to `cap` bytes for all of them
//!   together. A request that does not fit is not kept (its `mid` is, to know when it is
//!   answered): while it is unanswered the session cannot move (`over-cap`).
//! * master → minion: where each reply starts and ends, and its `mid`. Once a reply's `head` has
//!   been passed to the minion, its request is answered: it is dropped, never re-sent.
//!
//! Anything else (not Salt's framing, a `head` without a `mid` or not first, a `mid` twice in
//! flight, more than [`MAX_PENDING`] requests unanswered) makes the tracker give up for good: the
//! session is pumped as before and closes with its master, as with `on_master_down: close`.

use bytes::Bytes;

use super::held::Held;
use super::msgpack_walk::{head_mid, Head, Walker, MAX_HEAD};
use super::track::{ReplyEvents, Skip};

/// The largest message followed (Salt's own `Unpacker` takes up to 100 MiB).
pub const MAX_MESSAGE: u64 = 100 * 1024 * 1024;
/// Unanswered requests followed on one connection (their `mid`s are kept even when their bytes
/// are not); past it the tracker gives up.
pub const MAX_PENDING: usize = 256;

/// One direction: message boundaries and the start of the message in progress.
#[derive(Debug)]
struct Dir {
    walk: Walker,
    in_msg: bool,
    /// The message's first bytes, until its `mid` is read (at most [`MAX_HEAD`]).
    head: Vec<u8>,
    /// The `mid` of the message in progress was read.
    mid_read: bool,
}

impl Dir {
    fn new() -> Self {
        Dir {
            walk: Walker::new(MAX_MESSAGE),
            in_msg: false,
            head: Vec::new(),
            mid_read: false,
        }
    }

    /// Takes the next piece of the message in progress, until its `mid` is read.
    fn head_piece(&mut self, piece: &[u8]) -> Head {
        if self.mid_read {
            return Head::More;
        }
        let room = MAX_HEAD - self.head.len();
        self.head.extend_from_slice(&piece[..piece.len().min(room)]);
        let h = head_mid(&self.head);
        if !matches!(h, Head::More) {
            self.mid_read = true;
            self.head = Vec::new();
        }
        h
    }
}

/// Both directions of one `tcp` request connection (see the module docs).
#[derive(Debug)]
pub struct TcpTrack {
    up: Dir,
    down: Dir,
    /// The unanswered requests, each with its `mid` once its `head` has passed.
    pending: Held<Option<Vec<u8>>>,
    gave_up: bool,
}

impl TcpTrack {
    /// Keeps unanswered requests of up to `cap` bytes in total.
    pub fn new(cap: usize) -> Self {
        TcpTrack {
            up: Dir::new(),
            down: Dir::new(),
            pending: Held::new(cap),
            gave_up: false,
        }
    }

    pub fn gave_up(&self) -> bool {
        self.gave_up
    }

    /// Bytes held for re-sending right now.
    pub fn kept_len(&self) -> usize {
        self.pending.kept()
    }

    /// Requests sent (or being sent) and not answered.
    pub fn unanswered(&self) -> usize {
        self.pending.len()
    }

    fn give_up(&mut self) {
        self.gave_up = true;
        self.pending.clear();
        self.up = Dir::new();
        self.down = Dir::new();
    }

    /// Looks at the next bytes the minion sent (before they are written to the master).
    pub fn observe_up(&mut self, mut b: &[u8]) {
        while !b.is_empty() && !self.gave_up {
            if !self.up.in_msg {
                if !self.pending.push(None, MAX_PENDING) {
                    return self.give_up();
                }
                self.up.in_msg = true;
                self.up.mid_read = false;
            }
            let Ok((n, end)) = self.up.walk.feed(b) else {
                return self.give_up();
            };
            let piece = &b[..n];
            b = &b[n..];
            let head = self.up.head_piece(piece);
            if !self.pending.keep(piece) {
                return self.give_up();
            }
            match head {
                Head::Mid(mid) => {
                    if self.pending.iter().any(|q| q.meta.as_ref() == Some(&mid)) {
                        // Two requests with one `mid` in flight: replies could not be told apart.
                        return self.give_up();
                    }
                    if let Some(p) = self.pending.last_mut() {
                        p.meta = Some(mid);
                    }
                }
                Head::Bad => return self.give_up(),
                Head::More => {}
            }
            if end {
                self.up.in_msg = false;
                if !self.up.mid_read {
                    return self.give_up();
                }
                if let Some(p) = self.pending.last_mut() {
                    p.complete = true;
                }
            }
        }
    }

    /// Looks at bytes written to the minion (a reply's `mid` read means it is answered).
    pub fn observe_down(&mut self, mut b: &[u8]) -> ReplyEvents {
        let mut ev = ReplyEvents::default();
        while !b.is_empty() && !self.gave_up {
            if !self.down.in_msg {
                self.down.in_msg = true;
                self.down.mid_read = false;
                ev.started = true;
            }
            let Ok((n, end)) = self.down.walk.feed(b) else {
                self.give_up();
                return ev;
            };
            let head = self.down.head_piece(&b[..n]);
            b = &b[n..];
            match head {
                Head::Mid(mid) => self.answered(&mid),
                Head::Bad => {
                    self.give_up();
                    return ev;
                }
                Head::More => {}
            }
            if end {
                self.down.in_msg = false;
                ev.done = true;
                if !self.down.mid_read {
                    self.give_up();
                    return ev;
                }
            }
        }
        ev
    }

    /// The reply to `mid` started reaching the minion: its request is no longer kept. A `mid`
    /// not in flight (a reply to nothing saltgate saw) changes nothing.
    fn answered(&mut self, mid: &[u8]) {
        let at = self
            .pending
            .iter()
            .position(|p| p.meta.as_deref() == Some(mid));
        if let Some(i) = at {
            self.pending.answered(i);
        }
    }

    /// Whether the minion's stream stands where another master's replies can follow.
    pub fn movable(&self) -> Result<(), Skip> {
        if self.gave_up {
            return Err(Skip::Protocol);
        }
        if self.down.in_msg || !self.down.walk.at_boundary() {
            return Err(Skip::MidReply);
        }
        Ok(())
    }

    /// What to re-send to another master, or why the session cannot move: every unanswered
    /// request, in the order the minion sent them, the last one as far as it got (the rest follows
    /// from the minion). `Ok(None)`: nothing to re-send. `Ok(Some((bytes, complete)))`: complete
    /// is false when the last one is partial. Marks each whole request as re-sent (once at most).
    pub fn take_replay(&mut self) -> Result<Option<(Bytes, bool)>, Skip> {
        self.movable()?;
        self.pending.take_replay(&[])
    }

    /// Another master now sends to the minion (the old one was left at a message boundary).
    pub fn resumed(&mut self) {
        self.down = Dir::new();
    }
}

#[cfg(test)]
#[path = "tcp_track_tests.rs"]
mod tests;
