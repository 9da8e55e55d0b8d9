//! Accepting TCP connections safely: a connection cap enforced with permits, back-off on
//! descriptor or memory exhaustion, and the TCP options (`TCP_NODELAY`, keepalive) every
//! accepted or dialled socket gets.
//!
//! Owns the accept loop's policy, not what happens to a connection: [`Acceptor::accept`] hands
//! back the stream with a [`ConnectionPermit`] the caller keeps for the connection's life.
//!
//! * **Permits.** Before each `accept(2)` the acceptor takes one permit from every
//!   [`ConnectionLimit`] it was given (e.g. one per listener and one process-wide). At the cap it
//!   stops accepting: new connections wait in the kernel backlog, none is accepted and dropped.
//!   A limit can be resized in place (a config reload); live connections are never closed for it.
//! * **Exhaustion.** `EMFILE`, `ENFILE`, `ENOBUFS` and `ENOMEM` from `accept(2)` do not end the
//!   loop and do not spin it: it sleeps `backoff_min`, doubling up to `backoff_max`, until an
//!   accept succeeds. One warning is logged when such an episode starts and one info line when
//!   it ends (with its error count); [`AcceptStats`] counts both.
//! * **Other errors** (`ECONNABORTED`: the client gave up in the backlog, …) are counted, logged
//!   at debug, and followed by a `backoff_min` pause so a persistent one cannot spin either.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::SockRef;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// TCP keepalive probes: find peers that vanished without a FIN (a powered-off minion, a NAT
/// that forgot the flow). `None` fields keep the operating system's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe (`TCP_KEEPIDLE`).
    pub time: Duration,
    /// Between probes (`TCP_KEEPINTVL`); `None` = OS default.
    pub interval: Option<Duration>,
    /// Unanswered probes before the connection is dropped (`TCP_KEEPCNT`); `None` = OS default.
    pub retries: Option<u32>,
}

impl Keepalive {
    /// Salt's minion defaults: `tcp_keepalive: True`, `tcp_keepalive_idle: 300`,
    /// `tcp_keepalive_cnt: -1`, `tcp_keepalive_intvl: -1` (-1 = OS default).
    pub fn salt() -> Self {
        Keepalive {
            time: Duration::from_secs(300),
            interval: None,
            retries: None,
        }
    }
}

/// Salt's `zmq_backlog` default (`salt/config/__init__.py`): the listen backlog of a master's
/// publish and request sockets.
pub const SALT_BACKLOG: u32 = 1000;

/// Binds a listening socket with `backlog` (reuseaddr, non-blocking). `TcpListener::bind` (mio)
/// listens with a backlog of 128: when a thousand minions connect at once (a job's returns on
/// fresh request connections, a fleet restart), the SYNs beyond it are dropped and retried after
/// 1, 3, 7, 15, 31 s. The kernel caps it at `net.core.somaxconn`.
pub fn bind_listener(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    TcpListener::from_std(s.into())
}

/// Sets `TCP_NODELAY` and, when given, keepalive on a socket. Failures are logged at debug, not
/// fatal (the connection works without them).
pub fn tune_stream(stream: &TcpStream, keepalive: Option<&Keepalive>) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "set_nodelay failed");
    }
    if let Some(ka) = keepalive {
        let mut params = socket2::TcpKeepalive::new().with_time(ka.time);
        if let Some(i) = ka.interval {
            params = params.with_interval(i);
        }
        if let Some(r) = ka.retries {
            params = params.with_retries(r);
        }
        if let Err(e) = SockRef::from(stream).set_tcp_keepalive(&params) {
            tracing::debug!(error = %e, "set_tcp_keepalive failed");
        }
    }
}

/// Errors that mean the process or the system is out of a resource: wait before accepting again.
pub fn is_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Connections a server may hold on its network ports together so that the process keeps
/// descriptors for its own work (files, a CLI socket, outbound links) when a flood would take
/// every one: the soft `RLIMIT_NOFILE` less a headroom of a tenth of it, at least 64 and at most
/// 1024 (half of a limit of 128 or less). As HAProxy derives `maxconn` from `ulimit -n`, but
/// the other way round. `None` when the limit is unlimited or cannot be read.
pub fn descriptor_budget() -> Option<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(budget_for(usize::try_from(lim.rlim_cur).ok()?))
}

/// [`descriptor_budget`] for a soft limit of `nofile`.
pub fn budget_for(nofile: usize) -> usize {
    let headroom = if nofile <= 128 {
        nofile / 2
    } else {
        (nofile / 10).clamp(64, 1024)
    };
    (nofile - headroom).max(1)
}

/// Permits standing for "no cap" (far above any descriptor limit).
const UNLIMITED: usize = 1 << 30;

fn permits_for(max: Option<usize>) -> usize {
    max.map_or(UNLIMITED, |n| n.min(UNLIMITED))
}

/// A connection cap that can be resized in place: one semaphore for its whole life, so
/// connections admitted before a resize still count against the new cap. Share it (`Arc`)
/// between acceptors for a process-wide cap.
#[derive(Debug)]
pub struct ConnectionLimit {
    max: Mutex<Option<usize>>,
    sem: Arc<Semaphore>,
}

impl ConnectionLimit {
    /// `None` = no cap.
    pub fn new(max: Option<usize>) -> Self {
        ConnectionLimit {
            max: Mutex::new(max),
            sem: Arc::new(Semaphore::new(permits_for(max))),
        }
    }

    pub fn max(&self) -> Option<usize> {
        *self.max.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Permits free right now (a huge number when uncapped).
    pub fn available(&self) -> usize {
        self.sem.available_permits()
    }

    /// Changes the cap. Raising it admits waiting connections at once; lowering it takes
    /// permits out as connections end (live connections are never closed for it).
    pub fn resize(&self, new: Option<usize>) {
        let mut max = self.max.lock().unwrap_or_else(|p| p.into_inner());
        let (old, want) = (permits_for(*max), permits_for(new));
        if want > old {
            self.sem.add_permits(want - old);
        } else if old > want {
            let k = old - want;
            let gone = self.sem.forget_permits(k);
            if gone < k {
                let sem = self.sem.clone();
                let rest = u32::try_from(k - gone).unwrap_or(u32::MAX);
                tokio::spawn(async move {
                    if let Ok(p) = sem.acquire_many_owned(rest).await {
                        p.forget();
                    }
                });
            }
        }
        *max = new;
    }

    /// One permit, waiting for it (held by a connection for its whole life).
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        // The semaphore is never closed; `None` would only mean "no cap to hold".
        self.sem.clone().acquire_owned().await.ok()
    }
}

/// What an accepted connection holds for its whole life: one permit of each limit.
#[derive(Debug, Default)]
pub struct ConnectionPermit {
    _permits: Vec<OwnedSemaphorePermit>,
}

/// Accept counters, shared with whoever wants to export them.
#[derive(Debug, Default)]
pub struct AcceptStats {
    accepted: AtomicU64,
    exhaustion_errors: AtomicU64,
    exhaustion_episodes: AtomicU64,
    other_errors: AtomicU64,
}

impl AcceptStats {
    /// Connections accepted.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
    /// `accept(2)` failures for lack of descriptors or memory.
    pub fn exhaustion_errors(&self) -> u64 {
        self.exhaustion_errors.load(Ordering::Relaxed)
    }
    /// Exhaustion episodes (a run of such failures ended by a successful accept); one warning
    /// is logged per episode.
    pub fn exhaustion_episodes(&self) -> u64 {
        self.exhaustion_episodes.load(Ordering::Relaxed)
    }
    /// Other `accept(2)` failures.
    pub fn other_errors(&self) -> u64 {
        self.other_errors.load(Ordering::Relaxed)
    }
}

/// Accept-loop settings.
#[derive(Debug, Clone)]
pub struct AcceptOptions {
    /// Set on every accepted socket (with `TCP_NODELAY`); `None` = no keepalive.
    pub keepalive: Option<Keepalive>,
    /// First pause after an exhaustion error; doubled per consecutive error.
    pub backoff_min: Duration,
    /// Longest pause.
    pub backoff_max: Duration,
}

impl Default for AcceptOptions {
    fn default() -> Self {
        AcceptOptions {
            keepalive: Some(Keepalive::salt()),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
        }
    }
}

/// A run of exhaustion errors.
#[derive(Debug)]
struct Episode {
    started: Instant,
    errors: u64,
}

/// A listener with a connection cap and exhaustion back-off (see the module docs).
#[derive(Debug)]
pub struct Acceptor {
    listener: Arc<TcpListener>,
    local_addr: Option<SocketAddr>,
    limits: Vec<Arc<ConnectionLimit>>,
    opts: AcceptOptions,
    stats: Arc<AcceptStats>,
    backoff: Duration,
    episode: Option<Episode>,
}

impl Acceptor {
    /// Wraps a bound listener; no cap until [`Acceptor::with_limit`].
    pub fn new(listener: TcpListener, opts: AcceptOptions) -> Self {
        Self::new_shared(Arc::new(listener), opts)
    }

    /// A ZMTP socket's acceptor: `addr` bound with Salt's backlog, TCP keepalive as given and a
    /// private cap of `max_connections`. Returns the bound address too.
    pub fn bind_salt(
        addr: SocketAddr,
        keepalive: Option<Keepalive>,
        max_connections: Option<usize>,
    ) -> io::Result<(SocketAddr, Self)> {
        let listener = bind_listener(addr, SALT_BACKLOG)?;
        let local_addr = listener.local_addr()?;
        let acceptor = Acceptor::new(
            listener,
            AcceptOptions {
                keepalive,
                ..AcceptOptions::default()
            },
        )
        .with_max_connections(max_connections);
        Ok((local_addr, acceptor))
    }

    /// As [`Acceptor::new`], for a listener shared with other code (e.g. kept across a reload).
    pub fn new_shared(listener: Arc<TcpListener>, opts: AcceptOptions) -> Self {
        Acceptor {
            local_addr: listener.local_addr().ok(),
            listener,
            limits: Vec::new(),
            backoff: opts.backoff_min,
            opts,
            stats: Arc::default(),
            episode: None,
        }
    }

    /// Adds a cap: every accepted connection holds one of its permits.
    pub fn with_limit(mut self, limit: Arc<ConnectionLimit>) -> Self {
        self.limits.push(limit);
        self
    }

    /// Shorthand for one private cap of `max` connections (`None` = none).
    pub fn with_max_connections(self, max: Option<usize>) -> Self {
        match max {
            Some(n) => self.with_limit(Arc::new(ConnectionLimit::new(Some(n)))),
            None => self,
        }
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The counters (shared: keep the `Arc` to read them while the acceptor runs).
    pub fn stats(&self) -> Arc<AcceptStats> {
        self.stats.clone()
    }

    /// Accepts for ever on a task of its own, running `serve` on a task of its own for each
    /// connection (with its permit, held until `serve` ends). Abort the handle to stop accepting;
    /// connections already served go on.
    pub fn spawn_each<F, Fut>(mut self, serve: F) -> tokio::task::JoinHandle<()>
    where
        F: Fn(TcpStream, SocketAddr, ConnectionPermit) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(async move {
            loop {
                let (stream, peer, permit) = self.accept().await;
                tokio::spawn(serve(stream, peer, permit));
            }
        })
    }

    /// Waits for permits, then for a connection; never fails. Cancel-safe: cancelling drops the
    /// permits taken so far and loses no connection.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr, ConnectionPermit) {
        let mut permits = Vec::with_capacity(self.limits.len());
        for limit in &self.limits {
            if let Some(p) = limit.acquire().await {
                permits.push(p);
            }
        }
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    self.end_episode();
                    self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                    tune_stream(&stream, self.opts.keepalive.as_ref());
                    return (stream, peer, ConnectionPermit { _permits: permits });
                }
                Err(e) if is_exhaustion(&e) => {
                    self.stats.exhaustion_errors.fetch_add(1, Ordering::Relaxed);
                    match &mut self.episode {
                        Some(ep) => ep.errors += 1,
                        None => {
                            self.stats
                                .exhaustion_episodes
                                .fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(
                                addr = ?self.local_addr,
                                error = %e,
                                "accept failed: out of resources; backing off (logged once until it recovers)"
                            );
                            self.episode = Some(Episode {
                                started: Instant::now(),
                                errors: 1,
                            });
                        }
                    }
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = self
                        .backoff
                        .saturating_mul(2)
                        .min(self.opts.backoff_max)
                        .max(self.opts.backoff_min);
                }
                Err(e) => {
                    self.stats.other_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(addr = ?self.local_addr, error = %e, "accept failed; continuing");
                    tokio::time::sleep(self.opts.backoff_min).await;
                }
            }
        }
    }

    fn end_episode(&mut self) {
        self.backoff = self.opts.backoff_min;
        if let Some(ep) = self.episode.take() {
            tracing::info!(
                addr = ?self.local_addr,
                errors = ep.errors,
                lasted_ms = ep.started.elapsed().as_millis() as u64,
                "accept recovered from resource exhaustion"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_budget_leaves_headroom_for_the_process_own_work() {
        assert_eq!(budget_for(96), 48);
        assert_eq!(budget_for(1024), 1024 - 102);
        assert_eq!(budget_for(65_536), 65_536 - 1024);
        assert_eq!(budget_for(2), 1);
        let b = descriptor_budget();
        assert!(b.is_none_or(|b| b >= 1));
    }

    fn local() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    #[tokio::test]
    async fn bind_listener_holds_more_than_mios_128_pending_connections() {
        // 300 clients connect before anything is accepted: with a backlog of 128 the SYNs past
        // the full accept queue are dropped and those connects stall for seconds.
        let listener = bind_listener(local(), SALT_BACKLOG).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut clients = Vec::new();
        for i in 0..300 {
            let c = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
                .await
                .unwrap_or_else(|_| panic!("connect {i} stalled: the backlog is too short"))
                .unwrap();
            clients.push(c);
        }
        let mut accepted = 0;
        while let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(5), listener.accept()).await
        {
            accepted += 1;
            if accepted == clients.len() {
                break;
            }
        }
        assert_eq!(accepted, 300);
    }

    #[tokio::test]
    async fn at_the_cap_connections_wait_in_the_backlog_until_a_permit_frees() {
        let listener = TcpListener::bind(local()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut acc =
            Acceptor::new(listener, AcceptOptions::default()).with_max_connections(Some(2));
        let _c: Vec<_> = futures_connect(addr, 3).await;
        let (_s1, _, p1) = acc.accept().await;
        let (_s2, _, _p2) = acc.accept().await;
        // The third connection is in the backlog; no permit is free.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), acc.accept())
                .await
                .is_err(),
            "accepted over the cap"
        );
        drop(p1);
        let accepted = tokio::time::timeout(Duration::from_secs(5), acc.accept()).await;
        assert!(
            accepted.is_ok(),
            "a freed permit did not admit the waiting connection"
        );
        assert_eq!(acc.stats().accepted(), 3);
    }

    #[tokio::test]
    async fn resizing_a_limit_admits_or_holds_back_connections() {
        let limit = Arc::new(ConnectionLimit::new(Some(1)));
        let listener = TcpListener::bind(local()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut acc = Acceptor::new(listener, AcceptOptions::default()).with_limit(limit.clone());
        let _c = futures_connect(addr, 3).await;
        let first = acc.accept().await;
        assert!(
            tokio::time::timeout(Duration::from_millis(50), acc.accept())
                .await
                .is_err()
        );
        limit.resize(Some(2));
        let second = tokio::time::timeout(Duration::from_secs(5), acc.accept()).await;
        assert!(second.is_ok());
        assert_eq!(limit.max(), Some(2));
        // Lowering below the live count closes nothing; the freed permits are taken out.
        limit.resize(Some(1));
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(5);
        while limit.available() != 0 {
            assert!(
                Instant::now() < deadline,
                "the freed permit was not taken out"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(50), acc.accept())
                .await
                .is_err()
        );
        limit.resize(None);
        assert!(limit.available() > 1_000_000);
    }

    #[tokio::test]
    async fn accepted_sockets_get_nodelay_and_keepalive() {
        let listener = TcpListener::bind(local()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ka = Keepalive {
            time: Duration::from_secs(77),
            interval: Some(Duration::from_secs(7)),
            retries: Some(3),
        };
        let mut acc = Acceptor::new(
            listener,
            AcceptOptions {
                keepalive: Some(ka),
                ..AcceptOptions::default()
            },
        );
        let _c = futures_connect(addr, 1).await;
        let (s, _, _) = acc.accept().await;
        let r = SockRef::from(&s);
        assert!(s.nodelay().unwrap());
        assert!(r.keepalive().unwrap());
        assert_eq!(r.tcp_keepalive_time().unwrap(), Duration::from_secs(77));
        assert_eq!(r.tcp_keepalive_interval().unwrap(), Duration::from_secs(7));
        assert_eq!(r.tcp_keepalive_retries().unwrap(), 3);
    }

    #[test]
    fn exhaustion_errors_are_recognised_and_others_are_not() {
        for code in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(is_exhaustion(&io::Error::from_raw_os_error(code)));
        }
        assert!(!is_exhaustion(&io::Error::from_raw_os_error(
            libc::ECONNABORTED
        )));
        assert!(!is_exhaustion(&io::Error::other("x")));
    }

    async fn futures_connect(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(TcpStream::connect(addr).await.unwrap());
        }
        v
    }
}
