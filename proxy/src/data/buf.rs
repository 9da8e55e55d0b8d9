//! The data path's buffers and counters: the pool of buffers (and splice pipes) every session
//! shares ([`BufPool`]), the passive [`Tap`] on one direction's bytes, the per-direction byte
//! [`Tally`], and [`read_some`], the one read of the copy path.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use prometheus::IntCounter;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::splice::read_clearing;

/// Size of one pump buffer. Salt publishes are usually under 1 KiB; returns can be large.
pub const BUF_SIZE: usize = 16 * 1024;

/// A bounded pool of buffers shared by all sessions.
pub struct BufPool {
    free: ArrayQueue<Box<[u8]>>,
    in_use: AtomicU64,
    /// Pipes for splicing bulk data (see [`crate::data::splice`]).
    pub(crate) pipes: super::splice::Pipes,
}

/// Empty pipes kept for reuse: enough for this many directions splicing at once.
pub const PIPES_FREE: usize = 256;

impl BufPool {
    pub fn new(max_free: usize) -> Self {
        Self {
            free: ArrayQueue::new(max_free.max(1)),
            in_use: AtomicU64::new(0),
            pipes: super::splice::Pipes::new(PIPES_FREE),
        }
    }
    /// A buffer, returned to the pool when dropped.
    pub fn get(&self) -> PooledBuf<'_> {
        self.in_use.fetch_add(1, Ordering::Relaxed);
        let buf = self
            .free
            .pop()
            .unwrap_or_else(|| vec![0u8; BUF_SIZE].into_boxed_slice());
        PooledBuf {
            buf: Some(buf),
            pool: self,
        }
    }
    /// Buffers held by sessions right now (0 when every session is idle).
    pub fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Relaxed)
    }
}

/// A pool buffer; goes back to the pool (or is freed when the pool is full) on drop.
pub struct PooledBuf<'a> {
    buf: Option<Box<[u8]>>,
    pool: &'a BufPool,
}

impl std::ops::Deref for PooledBuf<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_deref().unwrap_or(&[])
    }
}

impl std::ops::DerefMut for PooledBuf<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().unwrap_or(&mut [])
    }
}

impl Drop for PooledBuf<'_> {
    fn drop(&mut self) {
        self.pool.in_use.fetch_sub(1, Ordering::Relaxed);
        if let Some(b) = self.buf.take() {
            let _ = self.pool.free.push(b);
        }
    }
}

/// A passive observer of one direction's bytes: called with each chunk after it was written to
/// the other side, so it can neither alter nor delay it.
pub trait Tap: Send {
    /// Looks at `bytes`; returns false when it wants no more (it is then dropped).
    fn observe(&mut self, bytes: &[u8]) -> bool;
}

/// How often a busy session publishes its byte counts (to its [`SessionCtl`](super::registry::SessionCtl) and the listener's
/// shared counter); an idle one has nothing to publish, and the rest is published when the
/// session ends.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// One direction's byte count, kept locally and published every [`FLUSH_EVERY`] and on drop (the
/// session ended, however): no shared atomic is touched per read.
pub(crate) struct Tally<'a> {
    session: &'a AtomicU64,
    listener: &'a IntCounter,
    pending: u64,
    flushed_at: Instant,
}

impl<'a> Tally<'a> {
    pub(crate) fn new(session: &'a AtomicU64, listener: &'a IntCounter) -> Self {
        Self {
            session,
            listener,
            pending: 0,
            flushed_at: Instant::now(),
        }
    }

    pub(crate) fn add(&mut self, n: u64) {
        self.pending += n;
        if self.flushed_at.elapsed() >= FLUSH_EVERY {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.pending > 0 {
            self.session.fetch_add(self.pending, Ordering::Relaxed);
            self.listener.inc_by(self.pending);
            self.pending = 0;
        }
        self.flushed_at = Instant::now();
    }
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// One read of whatever `r` holds, into `buf`. Like `try_read`, except that a short read also
/// clears the socket's read readiness: the kernel gave us everything it had, so the next
/// `readable()` waits for the next epoll event instead of returning at once for a read that would
/// only get `EAGAIN`. Safe with edge-triggered epoll: tokio clears readiness only if no event came
/// since it was observed, and never clears `READ_CLOSED` (a FIN that came with the data is still
/// seen by the next read).
pub(crate) fn read_some(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    use std::io::Read;
    let cap = buf.len();
    read_clearing(stream, cap, || (&*socket2::SockRef::from(stream)).read(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn byte_counts_are_published_every_few_seconds_and_when_the_session_ends() {
        let session = AtomicU64::new(0);
        let listener = IntCounter::new("t", "t").unwrap();
        let mut t = Tally::new(&session, &listener);
        t.add(10);
        t.add(5);
        assert_eq!((session.load(Ordering::Relaxed), listener.get()), (0, 0));
        tokio::time::advance(FLUSH_EVERY).await;
        t.add(1);
        assert_eq!((session.load(Ordering::Relaxed), listener.get()), (16, 16));
        t.add(4);
        drop(t);
        assert_eq!((session.load(Ordering::Relaxed), listener.get()), (20, 20));
    }
}
