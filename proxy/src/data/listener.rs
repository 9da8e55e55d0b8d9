//! Listening sockets (socket2: reuseaddr, reuseport, backlog) and the accept loop: a `maxconn` cap that leaves
//! excess connections in the kernel backlog, and back-off on descriptor or memory exhaustion
//! (EMFILE, ENFILE, ENOBUFS, ENOMEM) instead of spinning or dying.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use std::time::{Duration, Instant};

use saltgate_config::Role;
use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

/// TCP keepalive on both legs of every session: finds peers that vanished without a FIN
/// (a powered-off minion, a NAT that forgot the flow) within about two minutes of idleness.
pub const KEEPALIVE_TIME: Duration = Duration::from_secs(60);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub const KEEPALIVE_RETRIES: u32 = 6;

/// Binds a listening socket; `reuse_port`: SO_REUSEPORT, so other processes that set it too can
/// bind the same address (the kernel spreads new connections over them).
pub fn bind(addr: SocketAddr, backlog: u32, reuse_port: bool) -> io::Result<TcpListener> {
    bind_with(addr, backlog, reuse_port, |_| {})
}

/// Binds a session listener (publish or request). Its sessions' client-side options (nodelay,
/// keepalive, TCP_USER_TIMEOUT) are set on the listening socket before `listen`: Linux copies
/// them into every accepted socket, which saves five `setsockopt` calls per session (see
/// [`tune_listener`]; a reload that changes `global.tcp_user_timeout` sets them again).
///
/// `freebind`: IP_FREEBIND (HAProxy's `freebind`), so `addr` may be an address the host does not
/// hold yet, such as the VIP on a keepalived backup node; without it such a bind fails with
/// `EADDRNOTAVAIL` (unless `net.ipv4.ip_nonlocal_bind` / `net.ipv6.ip_nonlocal_bind` is 1).
pub fn bind_sessions(
    addr: SocketAddr,
    backlog: u32,
    reuse_port: bool,
    freebind: bool,
    user_timeout: Option<Duration>,
) -> io::Result<TcpListener> {
    bind_with_opts(addr, backlog, reuse_port, freebind, |s| {
        tune_sock(&SockRef::from(s), user_timeout, true)
    })
}

fn bind_with(
    addr: SocketAddr,
    backlog: u32,
    reuse_port: bool,
    before_listen: impl FnOnce(&Socket),
) -> io::Result<TcpListener> {
    bind_with_opts(addr, backlog, reuse_port, false, before_listen)
}

fn bind_with_opts(
    addr: SocketAddr,
    backlog: u32,
    reuse_port: bool,
    freebind: bool,
    before_listen: impl FnOnce(&Socket),
) -> io::Result<TcpListener> {
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    if freebind {
        set_freebind(&s, addr)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    before_listen(&s);
    s.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    TcpListener::from_std(s.into())
}

#[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
fn set_freebind(s: &Socket, addr: SocketAddr) -> io::Result<()> {
    if addr.is_ipv4() {
        s.set_freebind_v4(true)
    } else {
        s.set_freebind_v6(true)
    }
}

#[cfg(not(any(target_os = "android", target_os = "fuchsia", target_os = "linux")))]
fn set_freebind(_: &Socket, _: SocketAddr) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "freebind (IP_FREEBIND) exists on Linux only; remove freebind: true",
    ))
}

/// Sets nodelay, keepalive and TCP_USER_TIMEOUT (`global.tcp_user_timeout`: unacknowledged data
/// this long drops the connection, so a blackholed peer does not pin a session and its buffer
/// until the idle timeout) on a session socket. Failures are logged, not fatal.
pub fn tune(stream: &TcpStream, user_timeout: Option<Duration>) {
    tune_sock(&SockRef::from(stream), user_timeout, false)
}

/// Sets the session options on a listening socket, for the sockets it accepts from now on (Linux
/// copies a listener's nodelay, keepalive and TCP_USER_TIMEOUT into each accepted socket; tested
/// in this module). `None` puts the kernel's default back (0).
pub fn tune_listener(l: &TcpListener, user_timeout: Option<Duration>) {
    tune_sock(&SockRef::from(l), user_timeout, true)
}

/// `reset_user_timeout`: also write the kernel default (0) when `user_timeout` is `None` (a
/// listener keeps what an earlier configuration set; a fresh session socket has 0 already).
fn tune_sock(sock: &SockRef<'_>, user_timeout: Option<Duration>, reset_user_timeout: bool) {
    if let Err(e) = sock.set_tcp_nodelay(true) {
        tracing::debug!(target: "saltgate_proxy::listener", error = %e, "set_nodelay failed");
    }
    let ka = TcpKeepalive::new()
        .with_time(KEEPALIVE_TIME)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES);
    if let Err(e) = sock.set_tcp_keepalive(&ka) {
        tracing::debug!(target: "saltgate_proxy::listener", error = %e, "set_tcp_keepalive failed");
    }
    if user_timeout.is_some() || reset_user_timeout {
        if let Err(e) = sock.set_tcp_user_timeout(user_timeout) {
            tracing::debug!(target: "saltgate_proxy::listener", error = %e, "set_tcp_user_timeout failed");
        }
    }
}

// Errors that mean the process or system is out of a resource: wait before accepting again
// (the rule every acceptor follows: `wire::accept`).
use saltgate_wire::accept::is_exhaustion;

/// A session cap that a reload can resize in place (a listener's or the process-wide
/// `maxconn`): the one `wire::accept` defines, shared with saltgate-master's listeners.
pub use saltgate_wire::accept::ConnectionLimit as Limit;

/// `maxconn` as a [`Limit`]'s bound.
pub fn cap(maxconn: Option<u32>) -> Option<usize> {
    maxconn.map(|n| n as usize)
}

/// The permits a session holds for its whole life (listener and process-wide `maxconn`).
pub struct Permits {
    _listener: Option<OwnedSemaphorePermit>,
    _global: Option<OwnedSemaphorePermit>,
}

impl Permits {
    /// No permit (a connection not counted against any `maxconn`).
    pub fn none() -> Self {
        Self {
            _listener: None,
            _global: None,
        }
    }
}

/// Accepts connections until `stop` is cancelled, handing each to `on_accept` (which tunes it).
pub async fn accept_loop<F>(
    listener: Arc<TcpListener>,
    role: Role,
    limit: Arc<Limit>,
    global: Arc<Limit>,
    errors: prometheus::IntCounter,
    stop: CancellationToken,
    mut on_accept: F,
) where
    F: FnMut(TcpStream, SocketAddr, Permits),
{
    let local = listener.local_addr().ok();
    let mut backoff = Duration::from_millis(10);
    let mut last_warn: Option<Instant> = None;
    let mut suppressed = 0u64;
    loop {
        // The listener's permit first: at its maxconn, connections wait in the kernel backlog.
        // `biased`, stop first: once stopped (a reload may hand this socket to a new loop), no
        // further connection is accepted here, even one already waiting.
        let own = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            p = limit.acquire() => p,
        };
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = Duration::from_millis(10);
                // The process-wide permit only once a connection is there: taken before, an idle
                // listener's loop would park a permit that a busy listener's client waits for. At
                // the global maxconn, one accepted connection per listener waits here (served,
                // not dropped, when a permit frees).
                let global = global.acquire().await;
                on_accept(
                    stream,
                    peer,
                    Permits {
                        _listener: own,
                        _global: global,
                    },
                );
            }
            Err(e) if is_exhaustion(&e) => {
                errors.inc();
                if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(target: "saltgate_proxy::listener", listener = %role, addr = ?local, error = %e, suppressed, backoff_ms = backoff.as_millis() as u64, "accept failed: out of resources; backing off");
                    last_warn = Some(Instant::now());
                    suppressed = 0;
                } else {
                    suppressed += 1;
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(e) => {
                errors.inc();
                tracing::debug!(target: "saltgate_proxy::listener", listener = %role, error = %e, "accept failed; continuing");
            }
        }
    }
}
