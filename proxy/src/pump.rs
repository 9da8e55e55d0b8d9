//! The data path: moves bytes both ways between a client and a master until the session ends.
//!
//! - No buffer is held while a session is idle: a buffer is taken from [`BufPool`] when a socket is
//!   readable and given back once written out. Idle publish sessions cost two sockets and a task.
//! - Half-close: a FIN from one side is passed on (`shutdown(Write)` on the other); the other
//!   direction keeps flowing until it ends too.
//! - Idle timeout: the session is idle while no byte moves in either direction; it is closed after
//!   being idle for the listener's limit (see [`IdleLimits`]).
//! - A [`Tap`] may look at the client → master bytes *after* they were written on (presence reads
//!   the minion id there). Once it has seen enough it is dropped: from then on the loop is the
//!   same as without it (one `None` check per read, no allocation).
//! - A short read (fewer bytes than the buffer holds) means the socket was drained: its readiness
//!   is cleared there, as HAProxy does, instead of reading once more to get `EAGAIN` (see
//!   [`read_some`]). That saves one `recvfrom` per forwarded message.
//! - Bulk data is spliced on Linux (`splice(2)` through pooled pipes, see `crate::splice`), once a
//!   read fills a whole buffer and no tap needs the bytes.
//! - Both directions, the idle timer and the close token are one small future (see
//!   `crate::flow`): an idle session's task is what it costs in memory.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use prometheus::IntCounter;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::close::CloseReason;
use crate::flow::{DirEnd, Half};
use crate::registry::SessionCtl;

/// Size of one pump buffer. Salt publishes are usually under 1 KiB; returns can be large.
pub const BUF_SIZE: usize = 16 * 1024;

/// A bounded pool of buffers shared by all sessions.
pub struct BufPool {
    free: ArrayQueue<Box<[u8]>>,
    in_use: AtomicU64,
    /// Pipes for splicing bulk data (see [`crate::splice`]).
    pub(crate) pipes: crate::splice::Pipes,
}

/// Empty pipes kept for reuse: enough for this many directions splicing at once.
pub const PIPES_FREE: usize = 256;

impl BufPool {
    pub fn new(max_free: usize) -> Self {
        Self {
            free: ArrayQueue::new(max_free.max(1)),
            in_use: AtomicU64::new(0),
            pipes: crate::splice::Pipes::new(PIPES_FREE),
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

/// Idle limits of one session, from its listener.
///
/// While both directions are open the limit is the shorter of `client` and `server` (HAProxy's
/// `timeout client` and `timeout server`; HAProxy advises equal values in TCP mode). Once the client
/// has half-closed, `client_fin` applies if set; once the master has, `server_fin`.
///
/// Kept in every idle session's task, so stored small: milliseconds as `u32` (0: no limit), a
/// limit above `u32::MAX` ms (49.7 days) is held as 49.7 days.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleLimits {
    /// `[client, server, client_fin, server_fin]`.
    ms: [u32; 4],
}

impl IdleLimits {
    /// Limits from the four timeouts (`None`: no limit).
    pub fn new(
        client: Option<Duration>,
        server: Option<Duration>,
        client_fin: Option<Duration>,
        server_fin: Option<Duration>,
    ) -> Self {
        // At least 1 ms, so that a set limit never reads as none.
        let ms = |d: Option<Duration>| {
            d.map_or(0, |d| {
                u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1)
            })
        };
        Self {
            ms: [ms(client), ms(server), ms(client_fin), ms(server_fin)],
        }
    }

    /// A listener's limits.
    pub fn of(l: &saltgate_config::ListenerConfig) -> Self {
        Self::new(
            l.timeout_client,
            l.timeout_server,
            l.timeout_client_fin,
            l.timeout_server_fin,
        )
    }

    fn get(&self, i: usize) -> Option<Duration> {
        (self.ms[i] > 0).then(|| Duration::from_millis(self.ms[i].into()))
    }

    /// The idle limit that applies given which sides have half-closed. `None`: no limit.
    pub fn limit(&self, client_closed: bool, server_closed: bool) -> Option<Duration> {
        let base = match (self.get(0), self.get(1)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let fin = match (client_closed, server_closed) {
            (true, _) if self.get(2).is_some() => self.get(2),
            (_, true) if self.get(3).is_some() => self.get(3),
            _ => None,
        };
        fin.or(base)
    }

    /// Whether a session idle for `idle` is past its limit.
    pub fn expired(&self, idle: Duration, client_closed: bool, server_closed: bool) -> bool {
        self.limit(client_closed, server_closed)
            .is_some_and(|l| idle >= l)
    }
}

/// A passive observer of one direction's bytes: called with each chunk after it was written to
/// the other side, so it can neither alter nor delay it.
pub trait Tap: Send {
    /// Looks at `bytes`; returns false when it wants no more (it is then dropped).
    fn observe(&mut self, bytes: &[u8]) -> bool;
}

/// How often a busy session publishes its byte counts (to its [`SessionCtl`] and the listener's
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

/// Runs `read` (which takes at most `cap` bytes from `stream`) under tokio's readiness: a short
/// read means the socket is drained, so it is reported to tokio as `WouldBlock` (clearing the
/// readiness, no extra `read` to find out) while the bytes read are returned. Shared by the copy
/// path ([`read_some`]) and the splice path (`splice::fill`).
pub(crate) fn read_clearing(
    stream: &TcpStream,
    cap: usize,
    mut read: impl FnMut() -> io::Result<usize>,
) -> io::Result<usize> {
    let mut got = None;
    let res = stream.try_io(tokio::io::Interest::READABLE, || {
        let n = read()?;
        got = Some(n);
        if n > 0 && n < cap {
            // Drained: report WouldBlock so that tokio clears the readiness; `got` has the bytes.
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(n)
        }
    });
    match (res, got) {
        (Err(e), Some(n)) if e.kind() == io::ErrorKind::WouldBlock => Ok(n),
        (res, _) => res,
    }
}

/// The pump registers its waker with its [`SessionCtl`] and polls the sessions' token on its
/// first wake and then once every this many wakes (see [`pump`]).
pub const CANCEL_POLL_EVERY: u32 = 64;

/// Runs a session's data path until it ends; returns why. `bytes` are the listener's byte
/// counters, client → master and master → client; they and the session's own counts are updated
/// every [`FLUSH_EVERY`] and at the end, not per read. `up_tap` sees the client → master bytes
/// once forwarded.
///
/// One small future drives both directions ([`crate::flow::Half`]), the idle timer and the close
/// token. The timer is armed lazily, as HAProxy's: moving bytes only records the time; when the
/// timer fires it is pushed to the last activity plus the limit, and only a session idle for the
/// whole limit is closed. So a busy session costs no timer operation per message.
///
/// Two things ask a session to close: [`SessionCtl::close`] (sets the reason, then wakes the
/// waker registered with [`SessionCtl::register_waker`]) and
/// [`crate::dataplane::DataPlane::close_sessions`] (sets `sessions_closing`, then cancels
/// `sessions_token`). The waker is registered and the token polled (two locks: the token's and
/// its `Notify`'s) only on the first wake and every [`CANCEL_POLL_EVERY`] wakes after, each time
/// *before* the flags are read; every wake reads the two atomics, each set before its wake, so
/// the wake a close causes always sees one of them.
#[allow(clippy::too_many_arguments)]
pub fn pump<'a>(
    client: &'a TcpStream,
    master: &'a TcpStream,
    limits: &'a IdleLimits,
    ctl: &'a SessionCtl,
    plane: &'a crate::dataplane::DataPlane,
    bytes: &'a [IntCounter; 2],
    up_tap: Option<Box<dyn Tap>>,
) -> impl Future<Output = CloseReason> + Send + 'a {
    // Not an `async fn`: its arguments would stay in the future beside this state, and a
    // closure over the locals would hold a pointer to each (issue 11: this future is what an
    // idle session costs).
    let mut s = Pumping {
        client,
        master,
        limits,
        ctl,
        plane,
        halves: [
            Half::new(&ctl.bytes_in, &bytes[0], up_tap),
            Half::new(&ctl.bytes_out, &bytes[1], None),
        ],
        last: Instant::now(),
        armed: None,
        first_eof: None,
        wakes: 0,
    };
    async move {
        let timer = tokio::time::sleep_until(s.last);
        let cancel = plane.sessions_token.cancelled();
        tokio::pin!(timer, cancel);
        std::future::poll_fn(|cx| s.poll(cx, timer.as_mut(), cancel.as_mut())).await
    }
}

/// A running pump's state (see [`pump`]).
struct Pumping<'a> {
    client: &'a TcpStream,
    master: &'a TcpStream,
    limits: &'a IdleLimits,
    ctl: &'a SessionCtl,
    plane: &'a crate::dataplane::DataPlane,
    halves: [Half<'a>; 2],
    /// When a byte last moved.
    last: Instant,
    /// When the idle timer is set to fire.
    armed: Option<Instant>,
    first_eof: Option<CloseReason>,
    wakes: u32,
}

impl Pumping<'_> {
    fn poll(
        &mut self,
        cx: &mut std::task::Context<'_>,
        mut timer: std::pin::Pin<&mut tokio::time::Sleep>,
        cancel: std::pin::Pin<&mut tokio_util::sync::WaitForCancellationFuture<'_>>,
    ) -> Poll<CloseReason> {
        let (ctl, plane, pool) = (self.ctl, self.plane, &self.plane.pool);
        let mut cancelled = false;
        if self.wakes % CANCEL_POLL_EVERY == 0 {
            ctl.register_waker(cx.waker());
            cancelled = cancel.poll(cx).is_ready();
        }
        if cancelled || ctl.close_asked() || plane.sessions_closing.load(Ordering::Acquire) {
            return Poll::Ready(ctl.close_reason().unwrap_or(CloseReason::Shutdown));
        }
        self.wakes = self.wakes.wrapping_add(1);
        let mut moved = false;
        let halves = &mut self.halves;
        for i in 0..halves.len() {
            if halves[i].done {
                continue;
            }
            let (src, dst, eof, src_reset, dst_reset) = if i == 0 {
                let c = CloseReason::ClientReset;
                (
                    self.client,
                    self.master,
                    CloseReason::ClientEof,
                    c,
                    CloseReason::MasterReset,
                )
            } else {
                let m = CloseReason::MasterReset;
                (
                    self.master,
                    self.client,
                    CloseReason::MasterEof,
                    m,
                    CloseReason::ClientReset,
                )
            };
            let Poll::Ready(end) = halves[i].poll_move(cx, src, dst, pool, &mut moved) else {
                continue;
            };
            halves[i].done = true;
            match end {
                DirEnd::Eof => {
                    self.first_eof.get_or_insert(eof);
                    crate::flow::pass_fin(dst, halves[1 - i].done);
                }
                DirEnd::ReadErr(e) => {
                    tracing::debug!(error = %e, direction = i, "read failed");
                    return Poll::Ready(src_reset);
                }
                DirEnd::WriteErr(e) => {
                    tracing::debug!(error = %e, direction = i, "write failed");
                    return Poll::Ready(dst_reset);
                }
            }
        }
        let (up_done, down_done) = (halves[0].done, halves[1].done);
        if up_done && down_done {
            return Poll::Ready(self.first_eof.unwrap_or(CloseReason::ClientEof));
        }
        if moved {
            self.last = Instant::now();
        }
        let Some(limit) = self.limits.limit(up_done, down_done) else {
            return Poll::Pending;
        };
        let last = self.last;
        // Armed at most once per limit's worth of activity; re-armed earlier only when the limit
        // shrank (a half-close with a shorter `*_fin` timeout).
        if self.armed.is_none_or(|a| last + limit < a) {
            self.armed = Some(last + limit);
            timer.as_mut().reset(last + limit);
        }
        while timer.as_mut().poll(cx).is_ready() {
            if Instant::now() >= last + limit {
                return Poll::Ready(CloseReason::IdleTimeout);
            }
            self.armed = Some(last + limit);
            timer.as_mut().reset(last + limit);
        }
        Poll::Pending
    }
}

pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Option<Duration> {
        Some(Duration::from_secs(n))
    }

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

    #[test]
    fn idle_limit_is_the_shorter_timeout_and_fin_timeouts_apply_after_half_close() {
        let l = IdleLimits::new(s(60), s(30), s(5), None);
        assert_eq!(l.limit(false, false), s(30));
        assert_eq!(l.limit(true, false), s(5));
        assert_eq!(l.limit(false, true), s(30));
        let none = IdleLimits::new(None, None, None, None);
        assert_eq!(none.limit(false, false), None);
        assert!(!none.expired(Duration::from_secs(1 << 40), false, false));
    }

    #[test]
    fn seed_fixture_limits_keep_an_hour_idle_publish_session_and_close_a_61s_idle_request_session()
    {
        let text = include_str!("../../examples/haproxy/salt-master-cluster.cfg");
        let c = saltgate_config::haproxy::parse_haproxy(text, None)
            .unwrap()
            .config;
        let limits = IdleLimits::of;
        assert!(!limits(&c.publish).expired(Duration::from_secs(3600), false, false));
        assert!(limits(&c.publish).expired(Duration::from_secs(86_400), false, false));
        assert!(!limits(&c.request).expired(Duration::from_secs(59), false, false));
        assert!(limits(&c.request).expired(Duration::from_secs(61), false, false));
    }
}
