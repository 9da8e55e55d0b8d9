//! A listener's queue: clients that wait, in arrival order, while every master that could take
//! them is at its `maxconn` (HAProxy's queue, bounded by `maxqueue`, each wait by `timeout queue`).
//!
//! Waiters are woken by the slot-release path, never by polling: a session's
//! [`crate::data::registry::Lease`] carries its listener's queue and wakes the first waiter when it is
//! dropped (however the session ends). The control plane also wakes every waiter when the set of
//! masters that can take sessions may have changed (a health flip, an admin action, a reload).
//!
//! A woken waiter runs the selection again. If another client took the slot first, it joins the
//! queue again at its old place (by the number it was given when it first arrived), so the queue
//! stays in arrival order. A waiter that leaves after it was woken without taking the slot (its
//! wait expired at that moment) passes the wake on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// One listener's waiting clients.
#[derive(Debug)]
pub struct Queue {
    inner: Mutex<Inner>,
    /// Waiters in the queue (read without the lock on every release).
    len: AtomicUsize,
    /// `saltgate_listener_queue_current{listener}`.
    gauge: prometheus::IntGauge,
}

#[derive(Debug, Default)]
struct Inner {
    /// By arrival number, smallest (oldest) first.
    waiters: VecDeque<(u64, oneshot::Sender<()>)>,
    next: u64,
}

/// A client's place in the queue. Dropped unwoken, it leaves the queue; dropped after a wake it
/// did not use, it passes the wake on.
#[derive(Debug)]
pub struct Ticket {
    queue: Arc<Queue>,
    seq: u64,
    rx: oneshot::Receiver<()>,
    used: bool,
}

impl Queue {
    pub fn new(gauge: prometheus::IntGauge) -> Self {
        Self {
            inner: Mutex::default(),
            len: AtomicUsize::new(0),
            gauge,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every change under this lock is a single push or pop: a panic cannot leave it torn.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Clients waiting now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn set_len(&self, inner: &Inner) {
        self.len.store(inner.waiters.len(), Ordering::Release);
        self.gauge.set(inner.waiters.len() as i64);
    }

    /// Joins the queue if fewer than `max` wait. `again`: the arrival number of a woken waiter
    /// that found no room, which goes back to its old place; `None`: a new arrival, at the back.
    pub fn join(self: &Arc<Self>, max: u32, again: Option<u64>) -> Option<Ticket> {
        let mut inner = self.lock();
        if inner.waiters.len() >= max as usize {
            return None;
        }
        let seq = again.unwrap_or_else(|| {
            inner.next += 1;
            inner.next
        });
        let (tx, rx) = oneshot::channel();
        let at = inner.waiters.partition_point(|(s, _)| *s < seq);
        inner.waiters.insert(at, (seq, tx));
        self.set_len(&inner);
        Some(Ticket {
            queue: self.clone(),
            seq,
            rx,
            used: false,
        })
    }

    /// Wakes the first waiter (a slot freed). Cheap when nobody waits.
    pub fn wake_one(&self) {
        if self.is_empty() {
            return;
        }
        let mut inner = self.lock();
        // Sent under the lock: a ticket that finds itself gone from the queue knows it was woken.
        while let Some((_, tx)) = inner.waiters.pop_front() {
            if tx.send(()).is_ok() {
                break;
            }
        }
        self.set_len(&inner);
    }

    /// Wakes every waiter (the masters that can take sessions may have changed).
    pub fn wake_all(&self) {
        if self.is_empty() {
            return;
        }
        let mut inner = self.lock();
        for (_, tx) in inner.waiters.drain(..) {
            let _ = tx.send(());
        }
        self.set_len(&inner);
    }
}

impl Ticket {
    /// The arrival number (to join again at the same place).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Waits for a wake; the ticket is then used up.
    pub async fn woken(&mut self) {
        // The sender is only dropped unsent by a queue being dropped, which ends the wait too.
        let _ = (&mut self.rx).await;
        self.used = true;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.used {
            return;
        }
        let mut inner = self.queue.lock();
        if let Some(i) = inner.waiters.iter().position(|(s, _)| *s == self.seq) {
            inner.waiters.remove(i);
            self.queue.set_len(&inner);
            return;
        }
        drop(inner);
        // Gone from the queue but never used: woken just as it left. The slot is someone's.
        self.queue.wake_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> Arc<Queue> {
        Arc::new(Queue::new(prometheus::IntGauge::new("q", "q").unwrap()))
    }

    #[tokio::test]
    async fn waiters_are_woken_in_arrival_order_and_the_bound_holds() {
        let q = queue();
        let mut a = q.join(2, None).unwrap();
        let mut b = q.join(2, None).unwrap();
        assert!(q.join(2, None).is_none(), "the bound");
        assert_eq!((q.len(), q.gauge.get()), (2, 2));
        q.wake_one();
        a.woken().await;
        assert_eq!(q.len(), 1);
        assert!(b.rx.try_recv().is_err(), "only the first is woken");
        // `a` found no room: it goes back before `b`.
        let mut a2 = q.join(2, Some(a.seq())).unwrap();
        q.wake_one();
        a2.woken().await;
        q.wake_one();
        b.woken().await;
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_after_a_wake_passes_it_on() {
        let q = queue();
        let a = q.join(10, None).unwrap();
        let mut b = q.join(10, None).unwrap();
        q.wake_one(); // for `a`, which times out at that moment
        drop(a);
        b.woken().await;
        let c = q.join(10, None).unwrap();
        drop(c); // left unwoken: just gone
        assert!(q.is_empty());
        assert_eq!(q.gauge.get(), 0);
    }
}
