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

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use prometheus::IntCounter;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::close::CloseReason;
use crate::registry::SessionCtl;

/// Size of one pump buffer. Salt publishes are usually under 1 KiB; returns can be large.
pub const BUF_SIZE: usize = 16 * 1024;

/// A bounded pool of buffers shared by all sessions.
pub struct BufPool {
    free: ArrayQueue<Box<[u8]>>,
    in_use: AtomicU64,
}

impl BufPool {
    pub fn new(max_free: usize) -> Self {
        Self {
            free: ArrayQueue::new(max_free.max(1)),
            in_use: AtomicU64::new(0),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleLimits {
    pub client: Option<Duration>,
    pub server: Option<Duration>,
    pub client_fin: Option<Duration>,
    pub server_fin: Option<Duration>,
}

impl IdleLimits {
    /// The idle limit that applies given which sides have half-closed. `None`: no limit.
    pub fn limit(&self, client_closed: bool, server_closed: bool) -> Option<Duration> {
        let base = match (self.client, self.server) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let fin = match (client_closed, server_closed) {
            (true, _) if self.client_fin.is_some() => self.client_fin,
            (_, true) if self.server_fin.is_some() => self.server_fin,
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

/// How one direction ended.
#[derive(Debug)]
enum DirEnd {
    /// The reading side sent FIN; it was passed on.
    Eof,
    /// Reading failed.
    ReadErr(io::Error),
    /// Writing failed.
    WriteErr(io::Error),
}

/// Milliseconds since `base` of the last byte moved, shared by both directions.
struct Activity {
    base: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }
    fn last(&self) -> Instant {
        self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
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
    let mut got = None;
    let res = stream.try_io(tokio::io::Interest::READABLE, || {
        let n = (&*socket2::SockRef::from(stream)).read(buf)?;
        got = Some(n);
        if n > 0 && n < buf.len() {
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

async fn copy_half(
    r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    count: &AtomicU64,
    metric: &IntCounter,
    act: &Activity,
    pool: &BufPool,
    mut tap: Option<Box<dyn Tap>>,
) -> DirEnd {
    let mut tally = Tally::new(count, metric);
    loop {
        if let Err(e) = r.readable().await {
            return DirEnd::ReadErr(e);
        }
        let mut buf = pool.get();
        match read_some(r.as_ref(), &mut buf) {
            Ok(0) => {
                drop(buf);
                // Pass the FIN on. A failure here means the peer is gone; the other direction
                // will see it.
                let _ = w.shutdown().await;
                return DirEnd::Eof;
            }
            Ok(n) => {
                act.touch();
                if let Err(e) = w.write_all(&buf[..n]).await {
                    return DirEnd::WriteErr(e);
                }
                tally.add(n as u64);
                act.touch();
                if let Some(t) = tap.as_mut() {
                    if !t.observe(&buf[..n]) {
                        tap = None;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return DirEnd::ReadErr(e),
        }
    }
}

/// Runs a session's data path until it ends; returns why. `bytes` are the listener's byte
/// counters, client → master and master → client; they and the session's own counts are updated
/// every [`FLUSH_EVERY`] and at the end, not per read. `up_tap` sees the client → master bytes
/// once forwarded.
pub async fn pump(
    client: TcpStream,
    master: TcpStream,
    limits: IdleLimits,
    ctl: &SessionCtl,
    pool: &BufPool,
    bytes: &[IntCounter; 2],
    up_tap: Option<Box<dyn Tap>>,
) -> CloseReason {
    let act = Activity {
        base: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let (cr, cw) = client.into_split();
    let (mr, mw) = master.into_split();
    let up = copy_half(cr, mw, &ctl.bytes_in, &bytes[0], &act, pool, up_tap);
    let down = copy_half(mr, cw, &ctl.bytes_out, &bytes[1], &act, pool, None);
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    let mut first_eof: Option<CloseReason> = None;
    loop {
        let deadline = limits.limit(up_done, down_done).map(|l| act.last() + l);
        tokio::select! {
            end = &mut up, if !up_done => {
                up_done = true;
                match end {
                    DirEnd::Eof => { first_eof.get_or_insert(CloseReason::ClientEof); }
                    DirEnd::ReadErr(e) => { tracing::debug!(error = %e, "client read failed"); return CloseReason::ClientReset; }
                    DirEnd::WriteErr(e) => { tracing::debug!(error = %e, "master write failed"); return CloseReason::MasterReset; }
                }
            }
            end = &mut down, if !down_done => {
                down_done = true;
                match end {
                    DirEnd::Eof => { first_eof.get_or_insert(CloseReason::MasterEof); }
                    DirEnd::ReadErr(e) => { tracing::debug!(error = %e, "master read failed"); return CloseReason::MasterReset; }
                    DirEnd::WriteErr(e) => { tracing::debug!(error = %e, "client write failed"); return CloseReason::ClientReset; }
                }
            }
            _ = sleep_until_opt(deadline) => {
                if limits.expired(Instant::now() - act.last(), up_done, down_done) {
                    return CloseReason::IdleTimeout;
                }
            }
            _ = ctl.cancel.cancelled() => {
                return ctl.close_reason().unwrap_or(CloseReason::Shutdown);
            }
        }
        if up_done && down_done {
            return first_eof.unwrap_or(CloseReason::ClientEof);
        }
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
        let l = IdleLimits {
            client: s(60),
            server: s(30),
            client_fin: s(5),
            server_fin: None,
        };
        assert_eq!(l.limit(false, false), s(30));
        assert_eq!(l.limit(true, false), s(5));
        assert_eq!(l.limit(false, true), s(30));
        let none = IdleLimits {
            client: None,
            server: None,
            client_fin: None,
            server_fin: None,
        };
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
        let limits = |l: &saltgate_config::ListenerConfig| IdleLimits {
            client: l.timeout_client,
            server: l.timeout_server,
            client_fin: l.timeout_client_fin,
            server_fin: l.timeout_server_fin,
        };
        assert!(!limits(&c.publish).expired(Duration::from_secs(3600), false, false));
        assert!(limits(&c.publish).expired(Duration::from_secs(86_400), false, false));
        assert!(!limits(&c.request).expired(Duration::from_secs(59), false, false));
        assert!(limits(&c.request).expired(Duration::from_secs(61), false, false));
    }
}
