//! One client connection (the L4 [`crate::session::serve::Serve`]): choose a master (or wait in the
//! listener's queue while every master is at its `maxconn`), lease a place in its book, connect (timeout, retries on the next candidate), register in the book, run the data path, count it, write the access-log
//! line.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use saltgate_config::{ListenerConfig, OnMasterDown, Role};
use tokio::net::TcpStream;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span};

use crate::data::close::CloseReason;
use crate::data::listener::{tune, Permits};
use crate::data::pump::{self, IdleLimits};
use crate::ops::accesslog::AccessRecord;
use crate::ops::metrics::ListenerHandles;
use crate::select::master::{Admin, Master};
use crate::session::connect::{connect, Connect, Connected};
use crate::session::context::DataPlane;
use crate::session::serve::{BoxFuture, Serve};
use crate::session::span::{in_span, record_master, session_span};

/// What the access log says about one session.
struct Outcome<'a> {
    master: Option<&'a Master>,
    reason: CloseReason,
    bytes_in: u64,
    bytes_out: u64,
    connect_ms: u64,
    attempts: u32,
    migrations: u32,
    migrate_skip: Option<&'static str>,
}

impl Outcome<'_> {
    fn refused(reason: CloseReason, connect_ms: u64, attempts: u32) -> Self {
        Outcome {
            master: None,
            reason,
            bytes_in: 0,
            bytes_out: 0,
            connect_ms,
            attempts,
            migrations: 0,
            migrate_skip: None,
        }
    }
}

/// Decrements the listener's live-session gauge when the session ends, however it ends.
struct Live(prometheus::IntGauge);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// How placing a new client ended: connected, or refused with (reason, connect ms, attempts).
type Placed = Result<Connected, (CloseReason, u64, u32)>;

/// A client that finds no master with room may wait for one: some master that could take it (UP,
/// enabled, weight above 0) is at its `maxconn`.
fn worth_waiting(masters: &[Arc<Master>], role: Role) -> bool {
    masters
        .iter()
        .any(|m| m.is_available() && m.cfg().weight > 0 && !m.has_room(role))
}

/// Places a new client: selects and connects. While every master that could take it is at its
/// `maxconn`, the client waits in the listener's queue (arrival order, woken by a freed place: see
/// [`crate::data::queue`]) for at most `timeout_queue`; then it is closed (`queue-timeout`), as it is at
/// once when the queue holds `maxqueue` clients already (`queue-full`). A client that arrives
/// while others wait queues behind them. Returns the listener settings the client was placed
/// under, `tcp_user_timeout`, and the outcome.
///
/// The snapshot is loaded anew for each try and not held while waiting: a publish session may
/// live for days and must not keep an old configuration alive, and a reload during the wait
/// (more masters, a higher `maxconn`) applies to the next try.
async fn place(
    ctx: &DataPlane,
    role: Role,
    peer: SocketAddr,
    lm: &ListenerHandles,
) -> (ListenerConfig, Option<Duration>, Placed) {
    let queue = ctx.queue(role);
    // Once queued: the arrival number (to keep the place) and when the wait ends.
    let mut seq: Option<u64> = None;
    let mut deadline: Option<tokio::time::Instant> = None;
    // The candidates filled up between the selection and the connect: wait rather than refuse.
    let mut filled = false;
    let mut order = Vec::new();
    loop {
        let snap = ctx.load();
        let listener = snap.config.listener(role).clone();
        let user_timeout = snap.config.global.tcp_user_timeout;
        let refused =
            |reason, ms, attempts| (listener.clone(), user_timeout, Err((reason, ms, attempts)));
        snap.selector(role)
            .order(&snap.masters, role, peer.ip(), &mut order);
        // A new arrival goes behind the clients already waiting; a woken one does not.
        let ahead = seq.is_none() && !queue.is_empty();
        let wait = (order.is_empty() || filled || ahead) && worth_waiting(&snap.masters, role);
        if !wait {
            if order.is_empty() {
                return refused(CloseReason::NoMaster, 0, 0);
            }
            let connect_start = Instant::now();
            let ms = || connect_start.elapsed().as_millis() as u64;
            match connect(ctx, &listener, &snap, &order).await {
                Connect::Done(c) => {
                    let c = Connected {
                        connect_ms: u32::try_from(ms()).unwrap_or(u32::MAX),
                        ..c
                    };
                    return (listener, user_timeout, Ok(c));
                }
                Connect::Failed { attempts: 0 } if worth_waiting(&snap.masters, role) => {
                    filled = true;
                    continue;
                }
                Connect::Failed { attempts: 0 } => return refused(CloseReason::NoMaster, 0, 0),
                Connect::Failed { attempts } => {
                    return refused(CloseReason::ConnectFailed, ms(), attempts)
                }
                Connect::Shutdown => return refused(CloseReason::Shutdown, ms(), 0),
            }
        }
        if listener.maxqueue == 0 {
            return refused(CloseReason::NoMaster, 0, 0);
        }
        let Some(mut ticket) = queue.join(listener.maxqueue, seq) else {
            return refused(CloseReason::QueueFull, 0, 0);
        };
        if seq.is_none() {
            lm.queued.inc();
            if let Some(left_out) = lm.queue_log.allow() {
                tracing::info!(target: "saltgate_proxy::session", waiting = queue.len(), left_out, "every master is at its maxconn; client queued (at most one line every 5 s; left_out: not logged since the last)");
            }
        }
        seq = Some(ticket.seq());
        let until =
            *deadline.get_or_insert_with(|| tokio::time::Instant::now() + listener.queue_timeout());
        // A place may have freed between the selection and joining (its wake found nobody), or
        // this client queued behind others while there is room: wake the first waiter.
        crate::select::selection::eligible(&snap.masters, role, &mut order);
        if !order.is_empty() {
            queue.wake_one();
        }
        drop(snap);
        tokio::select! {
            _ = ticket.woken() => filled = false,
            _ = tokio::time::sleep_until(until) => {
                return refused(CloseReason::QueueTimeout, 0, 0);
            }
            _ = ctx.sessions_token.cancelled() => return refused(CloseReason::Shutdown, 0, 0),
        }
    }
}

/// Handles a client connection from accept to close, holding `permits` until it ends.
///
/// The task's future is what an idle session costs in memory, so it holds only [`Plain`], the
/// pump's small state and the permits: setting up (selection, connect, queue wait) and the
/// `migrate` relay run in boxed futures of their own, freed when done or allocated only when
/// used. Not an `async fn`: its arguments would stay in the future after set-up took them (they
/// go into the set-up's box here, before the future starts). Returns the session's span
/// ([`crate::session::span`]) beside the future: the caller runs the whole task in it (entered
/// per poll of the task, not per byte) when it is enabled ([`in_span`]: `crate::session::span`).
pub(crate) fn handle(
    ctx: Arc<DataPlane>,
    role: Role,
    client: TcpStream,
    peer: SocketAddr,
    permits: crate::data::listener::Permits,
) -> (impl std::future::Future<Output = ()> + Send + 'static, Span) {
    let id = ctx.session_id();
    let span = session_span(id, role, peer);
    let setup = Box::pin(establish(ctx, role, client, peer, id));
    let run = async move {
        let _permits = permits;
        // Run in place (`as_mut`): moving it out would keep a second copy in this future.
        let mut session = setup.await;
        let Some(s) = session.as_mut() else {
            return;
        };
        let reason = s.run().await;
        if let Some(s) = session.take() {
            s.finish(reason);
        }
    };
    (run, span)
}

/// A plain session, connected and registered: everything it keeps while bytes flow.
struct Plain {
    ctx: Arc<DataPlane>,
    role: Role,
    access_log: bool,
    _live: Live,
    client: TcpStream,
    up: Connected,
    ctl: Arc<crate::data::registry::SessionCtl>,
    limits: IdleLimits,
    presence: crate::presence::Attached,
}

impl Plain {
    /// Runs the data path until the session ends; returns why.
    async fn run(&mut self) -> CloseReason {
        let lm = self.ctx.listener(self.role);
        let reason = pump::pump(
            &self.client,
            &self.up.stream,
            &self.limits,
            &self.ctl,
            &*self.ctx,
            &lm.bytes,
            self.presence.tap.take(),
        )
        .await;
        if matches!(reason, CloseReason::MasterReset | CloseReason::MasterEof) {
            // Salt masters do not close minions' connections while they run: check this
            // port soon.
            self.up.master.upstream.nudge_check(self.role);
        }
        reason
    }

    fn finish(self, reason: CloseReason) {
        let bytes = (
            self.ctl.bytes_in.load(Ordering::Relaxed),
            self.ctl.bytes_out.load(Ordering::Relaxed),
        );
        let peer = self.ctl.client;
        closed(
            &self.ctx,
            self.role,
            self.access_log,
            peer,
            self.ctl.started,
            self.up,
            reason,
            bytes,
            (0, None),
        );
    }
}

/// Accept to connected. Returns the plain session `id` to run, or `None` when the session is
/// over already (refused, or served to the end by the `migrate` relay).
async fn establish(
    ctx: Arc<DataPlane>,
    role: Role,
    client: TcpStream,
    peer: SocketAddr,
    id: u64,
) -> Option<Plain> {
    let started = Instant::now();
    let lm = ctx.listener(role);
    lm.accepted.inc();
    let live = Live(lm.live.clone());
    live.0.inc();

    // Boxed: the relay below is not always used, and its size should not add to this one's.
    let (listener, user_timeout, picked) = Box::pin(place(&ctx, role, peer, lm)).await;
    let mut c = match picked {
        Ok(p) => p,
        Err((reason, connect_ms, attempts)) => {
            if matches!(reason, CloseReason::NoMaster | CloseReason::QueueFull) {
                if let Some(left_out) = lm.no_master_log.allow() {
                    tracing::info!(target: "saltgate_proxy::session", left_out, "no master available; closing the client connection (at most one line every 5 s; left_out: not logged since the last)");
                }
            }
            lm.refused(reason).inc();
            if listener.access_log {
                access_log(
                    &ctx,
                    role,
                    peer,
                    started,
                    Outcome::refused(reason, connect_ms, attempts),
                );
            }
            return None;
        }
    };
    tune(&c.stream, user_timeout);
    record_master(c.master.label());

    let ctl = c.lease.register(id, peer, started);
    // The master may have been marked DOWN or disabled while we connected, after its sessions were
    // swept: close this one too rather than leave it on that master (`migrate` moves it).
    match (c.master.admin(), c.master.is_up(), listener.on_master_down) {
        (Admin::Disabled, _, _) => ctl.close(CloseReason::Disabled),
        (_, false, OnMasterDown::Close | OnMasterDown::Migrate) => {
            ctl.close(CloseReason::MasterDown)
        }
        _ => {}
    }
    let limits = IdleLimits::of(&listener);
    let peek = crate::presence::peek_transport(&ctx.load().config.global);
    let presence = ctx
        .presence
        .attach(role, ctl.id, peer, c.master.label(), peek);
    // The framing-aware relay serves request sessions with migrate or auth_limit; the rest pump.
    if role != Role::Request
        || (listener.on_master_down != OnMasterDown::Migrate && listener.auth_limit.is_none())
    {
        return Some(Plain {
            ctx,
            role,
            access_log: listener.access_log,
            _live: live,
            client,
            up: c,
            ctl,
            limits,
            presence,
        });
    }
    let (attempts, connect_ms) = (c.attempts, c.connect_ms);
    let e = Box::pin(crate::continuity::serve(
        &ctx,
        &listener,
        user_timeout,
        peer,
        client,
        c,
        ctl,
        presence.tap,
        limits,
    ))
    .await;
    let up = Connected {
        attempts,
        connect_ms,
        ..e.up
    };
    let moves = (e.migrations, e.skip.map(|s| s.as_str()));
    closed(
        &ctx,
        role,
        listener.access_log,
        peer,
        started,
        up,
        e.reason,
        e.bytes,
        moves,
    );
    None
}

/// The end of a connected session: gives its place back, counts the close, logs it.
#[allow(clippy::too_many_arguments)]
fn closed(
    ctx: &DataPlane,
    role: Role,
    log: bool,
    peer: SocketAddr,
    started: Instant,
    up: Connected,
    reason: CloseReason,
    bytes: (u64, u64),
    moves: (u32, Option<&'static str>),
) {
    // The place first, so that a queued client gets it without waiting for the log.
    drop(up.lease);
    up.handles.closed(role, reason).inc();
    if log {
        access_log(
            ctx,
            role,
            peer,
            started,
            Outcome {
                master: Some(&up.master),
                reason,
                bytes_in: bytes.0,
                bytes_out: bytes.1,
                connect_ms: up.connect_ms.into(),
                attempts: up.attempts,
                migrations: moves.0,
                migrate_skip: moves.1,
            },
        );
    }
}

/// One [`AccessRecord`] per closed session, to the data plane's access sink (only called for a
/// listener with `access_log: true`).
fn access_log(ctx: &DataPlane, role: Role, client: SocketAddr, started: Instant, o: Outcome<'_>) {
    ctx.access.record(AccessRecord {
        client,
        listener: role,
        master: o.master.map(|m| m.name()),
        master_addr: o.master.map(|m| m.addr(role)),
        duration_ms: started.elapsed().as_millis() as u64,
        connect_ms: o.connect_ms,
        attempts: o.attempts,
        bytes_in: o.bytes_in,
        bytes_out: o.bytes_out,
        reason: o.reason,
        migrations: o.migrations,
        migrate_skip: o.migrate_skip,
    });
}

/// The L4 session: one client connection ↔ one master connection.
#[derive(Debug, Clone, Copy)]
pub struct L4Session {
    pub role: Role,
}

impl Serve for L4Session {
    fn serve(&self, ctx: Arc<DataPlane>, stream: TcpStream, peer: SocketAddr) -> BoxFuture<()> {
        let (run, span) = handle(ctx, self.role, stream, peer, Permits::none());
        Box::pin(run.instrument(span))
    }

    fn kind(&self) -> &'static str {
        "l4"
    }

    /// Unboxed: an idle publish session is this task and little else (issue 11).
    fn spawn(
        &self,
        tracker: &TaskTracker,
        ctx: Arc<DataPlane>,
        stream: TcpStream,
        peer: SocketAddr,
        permits: Permits,
    ) {
        in_span(tracker, handle(ctx, self.role, stream, peer, permits));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn future_size<A, F>(_make: impl Fn(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// What tokio 1.54 allocates for a task whose future is `future` bytes: its `Cell` is
    /// `#[repr(C)]` and aligned to 128 B on x86_64 and aarch64 (so its size is a multiple of
    /// 128): a 32 B `Header`, the `Core` (scheduler handle 8 B, task id 8 B, the `#[repr(C)]`
    /// `Stage` enum: an 8 B tag and the future), a 48 B `Trailer` (list pointers, join waker,
    /// hooks).
    fn task_cell(future: usize) -> usize {
        (32 + 8 + 8 + 8 + future + 48).div_ceil(128) * 128
    }

    /// What an idle session's task holds (docs/performance.md, "Changes since the latest full
    /// run"): 2,928 B before the pump was one poll-driven future and set-up was boxed. Not a
    /// timing: a size, the same on every run of one compiler.
    #[test]
    fn an_idle_sessions_task_future_stays_small() {
        type Args = (Arc<DataPlane>, Role, TcpStream, SocketAddr);
        let handle = future_size(|a: Args| {
            handle(a.0, a.1, a.2, a.3, crate::data::listener::Permits::none()).0
        });
        let plain = std::mem::size_of::<Plain>();
        let run = future_size(|p: &mut Plain| p.run());
        eprintln!("session future {handle} B: Plain {plain} B + run {run} B");
        assert!(handle <= 960, "the session future grew to {handle} B");
    }

    /// The task tokio allocates for an idle session, with its span off (as the bench runs) and
    /// on: 1,024 B and 1,152 B. Growing the future by a few bytes can cost 128 (issue 26).
    #[test]
    fn an_idle_sessions_task_stays_within_1024_bytes() {
        type Args = (Arc<DataPlane>, Role, TcpStream, SocketAddr);
        let bare = future_size(|a: Args| {
            handle(a.0, a.1, a.2, a.3, crate::data::listener::Permits::none()).0
        });
        let spanned = future_size(|a: Args| {
            let (run, span) = handle(a.0, a.1, a.2, a.3, crate::data::listener::Permits::none());
            run.instrument(span)
        });
        let (bare_cell, spanned_cell) = (task_cell(bare), task_cell(spanned));
        eprintln!(
            "idle session task: future {bare} B, cell {bare_cell} B; in its span {spanned} B, cell {spanned_cell} B"
        );
        assert!(
            bare_cell <= 1024,
            "an idle session's task grew to {bare_cell} B (its future is {bare} B; at most {} fits in 1,024)",
            1024 - task_cell(0) + 128
        );
    }
}
