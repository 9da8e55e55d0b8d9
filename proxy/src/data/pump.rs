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
//! - Bulk data is spliced on Linux (`splice(2)` through pooled pipes, see `crate::data::splice`), once a
//!   read fills a whole buffer and no tap needs the bytes.
//! - Both directions, the idle timer and the close token are one small future (see
//!   `crate::data::flow`): an idle session's task is what it costs in memory.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use prometheus::IntCounter;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use super::buf::{BufPool, PooledBuf, Tap, BUF_SIZE, FLUSH_EVERY, PIPES_FREE};
use super::close::CloseReason;
use super::flow::{DirEnd, Half};
use super::registry::SessionCtl;

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

/// What the pump needs of the context it runs in (the session's data-plane context, which lives
/// above the data path): the shared buffer pool, and the token and flag that close every session
/// (see [`pump`] for the order they are set in). Generic, not `dyn`: the pump's future stays as
/// small as it was.
pub trait Plane: Sync {
    fn pool(&self) -> &BufPool;
    fn sessions_token(&self) -> &CancellationToken;
    fn sessions_closing(&self) -> &AtomicBool;
}

/// The pump registers its waker with its [`SessionCtl`] and polls the sessions' token on its
/// first wake and then once every this many wakes (see [`pump`]).
pub const CANCEL_POLL_EVERY: u32 = 64;

/// Runs a session's data path until it ends; returns why. `bytes` are the listener's byte
/// counters, client → master and master → client; they and the session's own counts are updated
/// every [`FLUSH_EVERY`] and at the end, not per read. `up_tap` sees the client → master bytes
/// once forwarded.
///
/// One small future drives both directions ([`crate::data::flow::Half`]), the idle timer and the close
/// token. The timer is armed lazily, as HAProxy's: moving bytes only records the time; when the
/// timer fires it is pushed to the last activity plus the limit, and only a session idle for the
/// whole limit is closed. So a busy session costs no timer operation per message.
///
/// Two things ask a session to close: [`SessionCtl::close`] (sets the reason, then wakes the
/// waker registered with [`SessionCtl::register_waker`]) and
/// the context's `close_sessions` ([`Plane`]; sets `sessions_closing`, then cancels
/// `sessions_token`). The waker is registered and the token polled (two locks: the token's and
/// its `Notify`'s) only on the first wake and every [`CANCEL_POLL_EVERY`] wakes after, each time
/// *before* the flags are read; every wake reads the two atomics, each set before its wake, so
/// the wake a close causes always sees one of them.
#[allow(clippy::too_many_arguments)]
pub fn pump<'a, P: Plane>(
    client: &'a TcpStream,
    master: &'a TcpStream,
    limits: &'a IdleLimits,
    ctl: &'a SessionCtl,
    plane: &'a P,
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
        // Through `s`: a capture of `plane` would be kept beside it (8 B per idle session).
        let cancel = s.plane.sessions_token().cancelled();
        tokio::pin!(timer, cancel);
        std::future::poll_fn(|cx| s.poll(cx, timer.as_mut(), cancel.as_mut())).await
    }
}

/// A running pump's state (see [`pump`]).
struct Pumping<'a, P> {
    client: &'a TcpStream,
    master: &'a TcpStream,
    limits: &'a IdleLimits,
    ctl: &'a SessionCtl,
    plane: &'a P,
    halves: [Half<'a>; 2],
    /// When a byte last moved.
    last: Instant,
    /// When the idle timer is set to fire.
    armed: Option<Instant>,
    first_eof: Option<CloseReason>,
    wakes: u32,
}

impl<P: Plane> Pumping<'_, P> {
    fn poll(
        &mut self,
        cx: &mut std::task::Context<'_>,
        mut timer: std::pin::Pin<&mut tokio::time::Sleep>,
        cancel: std::pin::Pin<&mut tokio_util::sync::WaitForCancellationFuture<'_>>,
    ) -> Poll<CloseReason> {
        let (ctl, plane, pool) = (self.ctl, self.plane, self.plane.pool());
        let mut cancelled = false;
        if self.wakes % CANCEL_POLL_EVERY == 0 {
            ctl.register_waker(cx.waker());
            cancelled = cancel.poll(cx).is_ready();
        }
        if cancelled || ctl.close_asked() || plane.sessions_closing().load(Ordering::Acquire) {
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
                    super::flow::pass_fin(dst, halves[1 - i].done);
                }
                DirEnd::ReadErr(e) => {
                    tracing::debug!(target: "saltgate_proxy::pump", error = %e, direction = i, "read failed");
                    return Poll::Ready(src_reset);
                }
                DirEnd::WriteErr(e) => {
                    tracing::debug!(target: "saltgate_proxy::pump", error = %e, direction = i, "write failed");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Option<Duration> {
        Some(Duration::from_secs(n))
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
        let text = include_str!("../../../examples/haproxy/salt-master-cluster.cfg");
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
