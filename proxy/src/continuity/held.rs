//! The unanswered requests a stream tracker holds for re-sending ([`super::tcp_track`],
//! [`super::ws_track`]): each kept raw, as the minion sent it, while it is unanswered, up to `cap`
//! bytes for all of them together. One that does not fit is not kept (its entry stays, to know
//! when it is answered): while it is unanswered the session cannot move (`over-cap`).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::track::Skip;

/// One request sent (or being sent) and not answered; `meta`: what the tracker follows of it.
#[derive(Debug)]
pub(super) struct Pending<M> {
    /// Its bytes so far; `None` once they did not fit in the cap.
    bytes: Option<BytesMut>,
    /// All of it has passed.
    pub complete: bool,
    /// Re-sent once already (to the master it moved to).
    replayed: bool,
    pub meta: M,
}

/// The unanswered requests of one connection, oldest first.
#[derive(Debug)]
pub(super) struct Held<M> {
    cap: usize,
    pending: VecDeque<Pending<M>>,
    /// Bytes held in `pending`.
    kept: usize,
}

impl<M> Held<M> {
    pub fn new(cap: usize) -> Self {
        Held {
            cap,
            pending: VecDeque::new(),
            kept: 0,
        }
    }

    /// Bytes held for re-sending.
    pub fn kept(&self) -> usize {
        self.kept
    }

    /// Requests sent (or being sent) and not answered.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Holds nothing any more (the tracker gave up).
    pub fn clear(&mut self) {
        self.pending = VecDeque::new();
        self.kept = 0;
    }

    /// A new request begins; false (nothing added) when `max` are unanswered already.
    pub fn push(&mut self, meta: M, max: usize) -> bool {
        if self.pending.len() >= max {
            return false;
        }
        self.pending.push_back(Pending {
            bytes: Some(BytesMut::new()),
            complete: false,
            replayed: false,
            meta,
        });
        true
    }

    /// The request in progress (the newest).
    pub fn last_mut(&mut self) -> Option<&mut Pending<M>> {
        self.pending.back_mut()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Pending<M>> {
        self.pending.iter()
    }

    /// Adds bytes of the request in progress: kept while all requests fit in the cap, else that
    /// one is not kept at all. False when there is no request in progress.
    pub fn keep(&mut self, piece: &[u8]) -> bool {
        let Some(p) = self.pending.back_mut() else {
            return false;
        };
        if let Some(k) = p.bytes.as_mut() {
            if self.kept + piece.len() > self.cap {
                self.kept -= k.len();
                p.bytes = None;
            } else {
                k.extend_from_slice(piece);
                self.kept += piece.len();
            }
        }
        true
    }

    /// The `i`th oldest request is answered: it is no longer held.
    pub fn answered(&mut self, i: usize) -> Option<Pending<M>> {
        let p = self.pending.remove(i)?;
        self.kept -= p.bytes.as_ref().map_or(0, |k| k.len());
        // An idle connection holds nothing, even after a burst.
        if self.pending.is_empty() && self.pending.capacity() > 8 {
            self.pending = VecDeque::new();
        }
        Some(p)
    }

    /// What to re-send to another master: every unanswered request, in the order sent, the last
    /// one as far as it got, then `tail` (the part of a frame the minion was sending, whose rest
    /// follows from the minion). `Ok(None)`: nothing. `complete` is false when something was cut
    /// short. Marks each whole request as re-sent (once at most).
    pub fn take_replay(&mut self, tail: &[u8]) -> Result<Option<(Bytes, bool)>, Skip> {
        if self.pending.iter().any(|p| p.bytes.is_none()) {
            return Err(Skip::OverCap);
        }
        if self.pending.iter().any(|p| p.replayed) {
            return Err(Skip::ReplayedOnce);
        }
        if self.pending.is_empty() && tail.is_empty() {
            return Ok(None);
        }
        let mut out = BytesMut::with_capacity(self.kept + tail.len());
        let mut complete = tail.is_empty();
        for p in self.pending.iter_mut() {
            if let Some(k) = &p.bytes {
                out.extend_from_slice(k);
            }
            p.replayed = p.complete;
            complete &= p.complete;
        }
        out.extend_from_slice(tail);
        Ok(Some((out.freeze(), complete)))
    }
}
