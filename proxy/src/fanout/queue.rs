//! A fan-out session's queue: the messages the hub has given it and its session has not written
//! yet, bounded by `listeners.publish.hwm`, with one waiting reader (the session's task).
//!
//! It lives inside the session's [`super::hub::Slot`]: no allocation of its own while the session
//! is idle. A `tokio::sync::mpsc` channel (what this replaced) allocates a block of 32 message
//! slots and a cache-padded channel head for every session, idle or not: about 1.7 KiB of the
//! fan-out session's memory, more than half of an L4 session's whole cost (issue 30). The hub
//! pushes a message to every matching session per job and each session's reader takes it at
//! once, so the queue is almost always empty; a short `Mutex` section on each side is all it
//! needs. When it empties, a buffer grown past [`KEEP`] messages (a burst to a slow minion) is
//! given back.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

/// A message queued for a session: its hub-wide sequence number and its encoded bytes.
pub(crate) type Queued = (u64, Bytes);

/// Messages a drained queue keeps room for; a larger buffer is freed.
const KEEP: usize = 4;

/// Why a message was not queued.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `hwm` messages wait already: this session's copy is dropped (counted).
    Full,
    /// The session is gone.
    Closed,
}

/// Nothing to take now (the reader would wait).
#[cfg(test)]
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Empty;

/// See the module's doc.
#[derive(Debug)]
pub(crate) struct SessionQueue {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    items: VecDeque<Queued>,
    /// `hwm`, at least 1.
    cap: usize,
    /// The reader's waker while it waits for a message.
    waker: Option<Waker>,
    /// The reader is gone (its session ended): pushes are refused.
    closed: bool,
    /// The hub stops (the listener is dropped, or the shutdown grace ran out): the reader is
    /// told so, instead of every session watching the stop tokens (each watch locks a token
    /// shared by every session, and costs every session's future room).
    stopped: bool,
}

impl State {
    /// The oldest message; a drained buffer grown past [`KEEP`] is given back.
    fn pop_front(&mut self) -> Option<Queued> {
        let msg = self.items.pop_front()?;
        if self.items.is_empty() && self.items.capacity() > KEEP {
            self.items = VecDeque::new();
        }
        Some(msg)
    }
}

impl SessionQueue {
    /// An empty queue holding at most `cap` messages (at least one).
    pub(crate) fn new(cap: usize) -> Self {
        SessionQueue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                cap: cap.max(1),
                waker: None,
                closed: false,
                stopped: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `msg` and wakes the reader; never waits.
    pub(crate) fn push(&self, msg: Queued) -> Result<(), Refused> {
        let waker = {
            let mut s = self.lock();
            if s.closed || s.stopped {
                return Err(Refused::Closed);
            }
            if s.items.len() >= s.cap {
                return Err(Refused::Full);
            }
            s.items.push_back(msg);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// The next message, or [`Empty`].
    #[cfg(test)]
    pub(crate) fn try_pop(&self) -> Result<Queued, Empty> {
        self.lock().pop_front().ok_or(Empty)
    }

    /// The next message; `None` once the hub stops; `Pending` (the reader is woken by the next
    /// push, or the stop) when there is none.
    pub(crate) fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<Option<Queued>> {
        let mut s = self.lock();
        if s.stopped {
            return Poll::Ready(None);
        }
        if let Some(msg) = s.pop_front() {
            return Poll::Ready(Some(msg));
        }
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// `Ready` once the hub stops; else `Pending`, the reader woken by the stop (or by the next
    /// push: it then polls again). For a reader that waits on something else, a write to its
    /// minion, and must still end when the hub stops.
    pub(crate) fn poll_stopped(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.lock();
        if s.stopped {
            return Poll::Ready(());
        }
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// The next message, waiting for one; `None` once the hub stops.
    #[cfg(test)]
    pub(crate) async fn pop(&self) -> Option<Queued> {
        std::future::poll_fn(|cx| self.poll_pop(cx)).await
    }

    /// The hub stops: the reader's next [`SessionQueue::pop`] says so, and it is woken for it.
    pub(crate) fn stop(&self) {
        let waker = {
            let mut s = self.lock();
            s.stopped = true;
            s.items = VecDeque::new();
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The reader is gone: what waits is dropped, later pushes are refused.
    pub(crate) fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        s.items = VecDeque::new();
        s.waker = None;
    }

    /// Messages waiting now.
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn msg(seq: u64) -> Queued {
        (seq, Bytes::from(format!("m{seq}")))
    }

    #[test]
    fn messages_come_out_in_order_and_the_bound_refuses_the_next() {
        let q = SessionQueue::new(2);
        assert_eq!(q.push(msg(1)), Ok(()));
        assert_eq!(q.push(msg(2)), Ok(()));
        assert_eq!(q.push(msg(3)), Err(Refused::Full));
        assert_eq!(q.len(), 2);
        assert_eq!(q.try_pop().map(|m| m.0), Ok(1));
        assert_eq!(q.push(msg(4)), Ok(()));
        assert_eq!(q.try_pop().map(|m| m.0), Ok(2));
        assert_eq!(q.try_pop().map(|m| m.0), Ok(4));
        assert_eq!(q.try_pop(), Err(Empty));
    }

    #[test]
    fn a_closed_queue_refuses_and_holds_nothing() {
        let q = SessionQueue::new(8);
        q.push(msg(1)).unwrap();
        q.close();
        assert_eq!(q.len(), 0);
        assert_eq!(q.push(msg(2)), Err(Refused::Closed));
    }

    #[test]
    fn a_drained_queue_gives_back_a_burst_s_buffer() {
        let q = SessionQueue::new(1000);
        for i in 0..100 {
            q.push(msg(i)).unwrap();
        }
        while q.try_pop().is_ok() {}
        assert!(q.lock().items.capacity() <= KEEP);
    }

    #[tokio::test]
    async fn a_waiting_reader_is_woken_by_a_push() {
        let q = Arc::new(SessionQueue::new(4));
        let reader = tokio::spawn({
            let q = q.clone();
            async move { (q.pop().await.map(|m| m.0), q.pop().await) }
        });
        // The reader waits (its waker is stored) before the push, then before the stop.
        while q.lock().waker.is_none() {
            tokio::task::yield_now().await;
        }
        q.push(msg(7)).unwrap();
        while q.lock().waker.is_none() {
            tokio::task::yield_now().await;
        }
        q.stop();
        assert_eq!(reader.await.unwrap(), (Some(7), None));
        assert_eq!(q.push(msg(8)), Err(Refused::Closed));
    }
}
