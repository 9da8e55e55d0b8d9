//! Health checking: probers (how one port is tested) and the loop that runs them for every master
//! port on its own schedule and feeds [`crate::select::health::HealthState`].
//!
//! Flips are logged once (warn when a master goes DOWN, info when it comes UP) with the reason, and
//! reported as [`MasterEvent`]s so the proxy can close the sessions of a master that went DOWN.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use saltgate_config::{HealthSettings, Probe, Role};
use saltgate_wire::transport::{ProbeError, ProbeStage, Prober as _, Transport};
use tokio::sync::mpsc;

pub use crate::select::check_failure::{CheckFailure, Stage};
use crate::select::health::{HealthState, PortState};
use crate::select::transport_probe::{self, ProbeTransport};

#[path = "check_reserve.rs"]
mod reserve;
use crate::ops::metrics::Metrics;
use crate::select::master::{CheckReport, Flip, Master};

use crate::select::local_resource::connect_error;
pub use crate::select::local_resource::{is_local_resource, LOCAL_RESOURCE};

/// Whether a local resource episode is under way (logged once when it starts and once when it ends).
static LOCAL_EPISODE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Records a local resource failure: logged once per episode.
pub fn local_resource_episode(detail: &str) {
    if !LOCAL_EPISODE.swap(true, std::sync::atomic::Ordering::AcqRel) {
        tracing::error!(target: "saltgate_proxy::check", error = %detail, "out of local resources (descriptors, buffers or memory): health checks and connects that fail for this are not counted against masters until it ends (saltgate_local_resource_errors_total); raise the open-file limit or lower maxconn");
    }
}

/// A probe or connect got through: ends a local resource episode (logged once).
fn local_resource_recovered() {
    if LOCAL_EPISODE.swap(false, std::sync::atomic::Ordering::AcqRel) {
        tracing::info!(target: "saltgate_proxy::check", "local resources available again: health checks count again");
    }
}

/// Tests one master port with the timeouts and probe of `health`. `Err` carries how far the probe
/// got (the busy rule reads it) and a short reason for the logs and the admin API.
pub trait Prober: Send + Sync + 'static {
    fn probe(
        &self,
        addr: SocketAddr,
        role: Role,
        health: HealthSettings,
    ) -> Pin<Box<dyn Future<Output = Result<(), CheckFailure>> + Send + '_>>;

    /// The check of a master whose masters speak `transport` (top-level `transport:`, `ssl:`).
    /// By default [`Prober::probe`] (test probers ignore the transport); [`SaltProbes`] speaks
    /// Salt's `tcp` and `ws` here ([`crate::select::transport_probe`]).
    fn probe_over(
        &self,
        addr: SocketAddr,
        role: Role,
        health: HealthSettings,
        transport: Arc<ProbeTransport>,
    ) -> Pin<Box<dyn Future<Output = Result<(), CheckFailure>> + Send + '_>> {
        let _ = transport;
        self.probe(addr, role, health)
    }
}

/// The real probes: TCP connect, the ZMTP greeting, and Salt's clear `ping` (see [`Probe`]). The
/// ping's connect and ZMTP handshake must come within `handshake_timeout` (a stopped master fails
/// here at once), its answer within `timeout` (a busy master gets it). The publish port's greeting
/// is waited for up to `timeout`, and one after `handshake_timeout` is a failure of its own stage
/// ([`Stage::LateGreeting`]: the publish server runs, slowly), which the busy rule reads.
#[derive(Debug, Default, Clone, Copy)]
pub struct SaltProbes;

impl Prober for SaltProbes {
    fn probe_over(
        &self,
        addr: SocketAddr,
        role: Role,
        health: HealthSettings,
        transport: Arc<ProbeTransport>,
    ) -> Pin<Box<dyn Future<Output = Result<(), CheckFailure>> + Send + '_>> {
        if transport.is_zeromq() {
            return self.probe(addr, role, health);
        }
        Box::pin(async move { transport_probe::check(&transport, addr, role, health).await })
    }

    fn probe(
        &self,
        addr: SocketAddr,
        role: Role,
        health: HealthSettings,
    ) -> Pin<Box<dyn Future<Output = Result<(), CheckFailure>> + Send + '_>> {
        let timeout = health.timeout;
        let handshake = health.handshake_timeout.min(timeout);
        // ZeroMQ until the proxy reads `transport` (issue 27).
        let transport = Transport::default();
        Box::pin(async move {
            match (health.probe, role) {
                (Probe::Tcp, _) => {
                    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await
                    {
                        Ok(Ok(_stream)) => Ok(()),
                        Ok(Err(e)) => Err(connect_error("connect", &e)),
                        Err(_) => Err(format!("connect: no answer within {timeout:?}").into()),
                    }
                }
                // The publish port's greeting may come up to `timeout`: one that comes after
                // `handshake_timeout` is a live publish server on a saturated host (issue 25),
                // one that never comes a stopped or hung one.
                (Probe::Zmtp | Probe::Salt, Role::Publish) => {
                    let began = tokio::time::Instant::now();
                    match transport.greeting(addr, timeout).await {
                        Ok(_) => CheckFailure::on_time("ZMTP greeting", began.elapsed(), handshake),
                        Err(ProbeError::Connect(e)) => {
                            Err(connect_error("ZMTP greeting: connect", &e))
                        }
                        Err(ProbeError::NoHandshake(d)) => {
                            Err(CheckFailure::no_greeting(format_args!(
                                "ZMTP greeting: connected, no ZMTP handshake within {d:?}"
                            )))
                        }
                        // A full accept backlog (thousands of minions reconnecting) looks the
                        // same from here as a host that is gone; the request port tells which.
                        Err(ProbeError::ConnectTimeout(d)) => Err(CheckFailure::no_greeting(
                            format_args!("ZMTP greeting: connect: no answer within {d:?}"),
                        )),
                        Err(e) => Err(format!("ZMTP greeting: {e}").into()),
                    }
                }
                (Probe::Zmtp, Role::Request) => transport
                    .greeting(addr, handshake)
                    .await
                    .map(|_| ())
                    .map_err(|e| match e {
                        ProbeError::Connect(e) => connect_error("ZMTP greeting: connect", &e),
                        e => format!("ZMTP greeting: {e}").into(),
                    }),
                (Probe::Salt, Role::Request) => {
                    match transport.ping(addr, handshake, timeout).await {
                        Ok(_) => Ok(()),
                        Err(e) if e.stage() == ProbeStage::NotReady => Err(
                            "salt ping: not ready (cluster_retry: not yet a cluster member)".into(),
                        ),
                        Err(ProbeError::Connect(e)) => Err(connect_error("salt ping: connect", &e)),
                        Err(ProbeError::Timeout(t)) => Err(CheckFailure::no_answer(format_args!(
                            "salt ping: ZMTP handshake done, no answer within {t:?}"
                        ))),
                        Err(e) => Err(format!("salt ping: {e}").into()),
                    }
                }
            }
        })
    }
}

pub use crate::select::check_failure::{BUSY_OR_STUCK, LATE_GREETING, NO_GREETING};

/// How long after its publish server last showed it runs (a check passed, or its greeting came
/// late) a publish port's missing greetings may go uncounted while the master answers its
/// minions' requests (see [`busy_not_hung`]): a publish server hung on its own (its request
/// workers fine) is counted again after this, and goes DOWN `fall` checks later.
pub const PUBLISH_BUSY_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether a failed check is a busy master's, not a hung one's, on a port not DOWN, while
/// request sessions saw the master complete replies to minions after the check began:
/// - a request port whose ping got through the handshake and no answer in time
///   ([`Stage::NoAnswer`]);
/// - a publish port whose connect or greeting came after `handshake_timeout`
///   ([`Stage::LateGreeting`]): its publish server runs, on a saturated host;
/// - a publish port whose connect or greeting did not come within `timeout`
///   ([`Stage::NoGreeting`]; on `tcp`, no read), within [`PUBLISH_BUSY_GRACE`] of the last
///   check its publish server answered, on time or late (`last_alive`): measured in an AES
///   rotation storm of 5,000 minions, the master's publish server answered neither while its
///   request workers did.
///
/// A stopped master answers nothing, and a master whose workers are stuck answers nobody: both
/// still fail.
fn busy_not_hung(
    role: Role,
    result: &Result<(), CheckFailure>,
    state: &HealthState,
    master: &Master,
    began: tokio::time::Instant,
    last_alive: Option<tokio::time::Instant>,
) -> bool {
    let Err(e) = result else {
        return false;
    };
    let late = match (role, e.stage) {
        (Role::Request, Stage::NoAnswer) => true,
        (Role::Publish, Stage::LateGreeting) => true,
        (Role::Publish, Stage::NoGreeting) => {
            last_alive.is_some_and(|p| began.saturating_duration_since(p) <= PUBLISH_BUSY_GRACE)
        }
        _ => false,
    };
    late && state.state != PortState::Down && master.upstream.answered_since(began)
}

/// A publish port's greeting is waited for past `handshake_timeout` (up to `timeout`, see
/// [`SaltProbes`]) only while the master answers its minions, where the busy rule may excuse a
/// late one; otherwise the check fails at `handshake_timeout`, so a stopped master's publish
/// port is DOWN as fast as before (a request check the stop caught mid-ping waits `timeout`, and
/// the publish port is what sees the stop first then). `probe: tcp` keeps its `timeout`.
async fn publish_cut(
    mut probe: ProbeFuture<'_>,
    role: Role,
    settings: &HealthSettings,
    master: &Master,
    began: tokio::time::Instant,
) -> Result<(), CheckFailure> {
    if role != Role::Publish || settings.probe == Probe::Tcp {
        return probe.await;
    }
    let handshake = settings.handshake_timeout.min(settings.timeout);
    tokio::select! {
        r = &mut probe => return r,
        _ = tokio::time::sleep_until(began + handshake) => {}
    }
    if master.upstream.answered_since(began) {
        return probe.await;
    }
    let t = master.probe_transport();
    let what = if t.is_zeromq() {
        "ZMTP greeting: no ZMTP handshake".to_string()
    } else {
        format!("{} publish check: no handshake", t.transport.as_str())
    };
    Err(CheckFailure::no_greeting(format_args!(
        "{what} within {handshake:?} (handshake_timeout; the master answered no minion meanwhile)"
    )))
}

/// How long a ping kept outstanding on a DOWN request port may wait for its answer before the
/// checks give up on it (see [`run_port_checks`]). Long: a loaded master starting up has been
/// seen to answer its queue 80-120 s after its first pings; a lost kept ping costs nothing while
/// a fresh one is outstanding beside it.
pub const KEPT_PING_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// For how long after the kept ping was sent fresh pings go out beside it. A ping is lost only
/// when sent just before Salt opens its request gate (a few seconds after the master stops
/// answering `cluster_retry`); pings sent later are queued and answered in order, however long
/// the master's backlog makes them wait.
pub const FRESH_PING_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);

/// The longest gap between two fresh pings (see [`Outstanding::wants_ping`]).
pub const FRESH_PING_MAX_GAP: std::time::Duration = std::time::Duration::from_secs(8);

/// Most pings outstanding at once on one DOWN request port: the kept one and the fresh ones.
pub const MAX_OUTSTANDING_PINGS: usize = 6;

type ProbeFuture<'a> = Pin<Box<dyn Future<Output = Result<(), CheckFailure>> + Send + 'a>>;

/// Whether a check of this port keeps its ping outstanding past `timeout`: only Salt's `ping` on
/// a DOWN request port. Its connect and handshake stage stays bounded by the handshake deadline
/// (a stopped master still fails at once); only the wait for the answer is extended.
fn keeps_ping(role: Role, settings: &HealthSettings, state: &HealthState) -> bool {
    role == Role::Request && settings.probe == Probe::Salt && state.state == PortState::Down
}

/// The settings a kept ping is sent with: the same handshake deadline, [`KEPT_PING_LIMIT`] for
/// the answer.
fn kept_ping_settings(settings: &HealthSettings) -> HealthSettings {
    HealthSettings {
        handshake_timeout: settings.handshake_timeout.min(settings.timeout),
        timeout: KEPT_PING_LIMIT.max(settings.timeout),
        ..*settings
    }
}

/// How long a check on a DOWN request port waits for an answer: on a port steadily DOWN,
/// `rise x downinter` (at most `timeout`). Nothing is lost by the shorter wait: the ping stays
/// outstanding and its answer passes a check whenever it comes. Fresh pings go out beside the
/// kept one (see [`Outstanding::wants_ping`]), so if the kept one was lost, one sent soon after
/// the gate opened waits in its place in the master's queue, and UP comes within
/// `rise x downinter + 2 s` of the master answering that place. In transition (a check passed
/// already) the wait is `timeout`, as on an UP port, so a slow master's answers still count.
fn down_check_wait(settings: &HealthSettings, state: &HealthState) -> std::time::Duration {
    if state.successes > 0 {
        settings.timeout
    } else {
        settings
            .timeout
            .min(settings.downinter * settings.rise.max(1))
    }
}

/// The pings outstanding on a DOWN request port, oldest first, at most
/// [`MAX_OUTSTANDING_PINGS`]. The kept one is the oldest: a starting master answers its queue in
/// order, so it is answered first, if it is answered at all. But a ping sent in the window before
/// Salt opens its request gate can be dropped by the master, never answered, so fresh pings go out
/// beside it, for [`FRESH_PING_WINDOW`], at gaps that double (see [`Outstanding::wants_ping`]).
/// A fresh ping is never dropped for a newer one while it waits: a restarted master busy with its
/// minions' `_auth` backlog answers a ping tens of seconds after it was sent, in its place in the
/// queue, and a ping replaced every check would go back to the end of that queue each time
/// (interop scenario 4, CI: UP 5.5 s after the suite's own ping, sent at the same time, was
/// answered). A ping that fails (its [`KEPT_PING_LIMIT`], a reset, a `cluster_retry`) leaves, and
/// the next oldest becomes the kept one.
#[derive(Default)]
struct Outstanding<'a> {
    /// Each ping with when it was sent.
    pings: Vec<(tokio::time::Instant, ProbeFuture<'a>)>,
}

impl<'a> Outstanding<'a> {
    fn is_empty(&self) -> bool {
        self.pings.is_empty()
    }

    fn len(&self) -> usize {
        self.pings.len()
    }

    fn clear(&mut self) {
        self.pings.clear();
    }

    /// Makes room for a ping: when the set is full, the newest goes (it waits behind every
    /// other one in the master's queue), never the kept one; done before the ping is made, so
    /// never more than [`MAX_OUTSTANDING_PINGS`] exist at once.
    fn make_room(&mut self) {
        if self.pings.len() >= MAX_OUTSTANDING_PINGS {
            drop(self.pings.pop());
        }
    }

    fn push(&mut self, ping: ProbeFuture<'a>) {
        debug_assert!(self.pings.len() < MAX_OUTSTANDING_PINGS);
        self.pings.push((tokio::time::Instant::now(), ping));
    }

    /// Whether a check sends a ping: when none is outstanding; always once a check passed
    /// (`in_transition`: the `rise` checks need answers of their own); and beside the kept one
    /// while it is younger than [`FRESH_PING_WINDOW`], each fresh one once the newest is as old
    /// as it was young when it went out (its age when sent, counted from the kept one; at most
    /// [`FRESH_PING_MAX_GAP`]). So with checks every 2 s the pings go out 0, 2, 4, 8, 16 and
    /// 24 s after the kept one: a few, early in the queue, whenever the gate opened.
    fn wants_ping(&self, in_transition: bool) -> bool {
        let (Some((first, _)), Some((newest, _))) = (self.pings.first(), self.pings.last()) else {
            return true;
        };
        let gap = newest
            .saturating_duration_since(*first)
            .min(FRESH_PING_MAX_GAP);
        in_transition || (first.elapsed() < FRESH_PING_WINDOW && newest.elapsed() >= gap)
    }

    /// The first answer of any ping (that ping leaves; the others stay outstanding). A failed
    /// ping leaves without resolving this while others remain; the last one's failure resolves
    /// it. Pending for ever when nothing is outstanding. Cancel-safe: the pings live in `self`.
    fn poll_answer(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), CheckFailure>> {
        use std::task::Poll;
        let mut failed = None;
        let mut i = 0;
        while i < self.pings.len() {
            match self.pings[i].1.as_mut().poll(cx) {
                Poll::Ready(Ok(())) => {
                    drop(self.pings.remove(i));
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Err(e)) => {
                    drop(self.pings.remove(i));
                    failed = Some(e);
                }
                Poll::Pending => i += 1,
            }
        }
        match failed {
            Some(e) if self.pings.is_empty() => Poll::Ready(Err(e)),
            _ => Poll::Pending,
        }
    }

    async fn answer(&mut self) -> Result<(), CheckFailure> {
        std::future::poll_fn(|cx| self.poll_answer(cx)).await
    }
}

/// A master changed state.
#[derive(Debug, Clone)]
pub struct MasterEvent {
    pub master: Arc<Master>,
    pub flip: Flip,
}

/// Runs the checks of one master port until the master's `checks_stop` is cancelled. Settings are
/// read before every check, so a reload that changes them applies at the next one.
pub async fn run_port_checks(
    master: Arc<Master>,
    role: Role,
    prober: Arc<dyn Prober>,
    events: mpsc::UnboundedSender<MasterEvent>,
    metrics: Arc<Metrics>,
) {
    let addr = master.addr(role);
    let name = master.name();
    let duration = metrics
        .check_duration
        .with_label_values(&[name.as_str(), role.as_str()]);
    let failures = metrics
        .check_failures
        .with_label_values(&[name.as_str(), role.as_str()]);
    let local = metrics.local_resource_errors.with_label_values(&["check"]);
    let busy = metrics
        .check_busy
        .with_label_values(&[name.as_str(), role.as_str()]);
    let stop = master.checks_stop.clone();
    let mut state = HealthState::default();
    // On a DOWN request port, a ping whose handshake came but whose answer did not within
    // `timeout` is kept outstanding instead of abandoned: a starting master queues every ping
    // it gets before its workers serve, and answers them in order, so a fresh ping per check
    // only lines up behind the stale ones. But a ping sent just before Salt opens its request
    // gate can be dropped unanswered, so fresh pings go out beside the kept one, at doubling
    // gaps, each kept in its place in the queue (see `Outstanding`). The first answer of any
    // passes a check as soon as it comes, between checks too (`early`).
    let mut pings = Outstanding::default();
    let mut early: Option<Result<(), CheckFailure>> = None;
    // When a check of this port last got an answer, on time or late (the publish port's busy
    // grace).
    let mut last_alive: Option<tokio::time::Instant> = None;
    loop {
        reserve::refill();
        let settings = master.cfg().health;
        let t0 = Instant::now();
        let started = tokio::time::Instant::now();
        master.upstream.check_begins(role);
        if !keeps_ping(role, &settings, &state) {
            // UP or unknown (or the probe changed): nothing is kept for such a port.
            pings.clear();
            early = None;
        }
        let result = if let Some(r) = early.take() {
            r
        } else if keeps_ping(role, &settings, &state) {
            let wait = down_check_wait(&settings, &state);
            if pings.wants_ping(state.successes > 0) {
                pings.make_room();
                pings.push(prober.probe_over(
                    addr,
                    role,
                    kept_ping_settings(&settings),
                    master.probe_transport(),
                ));
            }
            tokio::select! {
                r = tokio::time::timeout(wait, pings.answer()) => match r {
                    Ok(r) => r,
                    Err(_) => Err(format!(
                        "salt ping: handshake done, no answer within {:?} ({} ping(s) kept outstanding: the first answer passes the next check)",
                        wait,
                        pings.len()
                    ).into()),
                },
                _ = stop.cancelled() => return,
            }
        } else {
            let probe = prober.probe_over(addr, role, settings, master.probe_transport());
            tokio::select! {
                r = publish_cut(probe, role, &settings, &master, started) => r,
                _ = stop.cancelled() => return,
            }
        };
        // Out of descriptors: the check runs again on one of the reserve's (check_reserve.rs). The
        // shortage is logged (once per episode) and counted either way.
        let mut result = result;
        let mut reserved = false;
        if let Err(e) = &result {
            if e.stage == Stage::LocalResource && reserve::release_one() {
                reserved = true;
                local_resource_episode(&format!("{name} {role} check: {e}"));
                tracing::debug!(target: "saltgate_proxy::check", master = %name, port = %role, "check met the local resource shortage; run again on a reserved descriptor");
                result = tokio::select! {
                    r = prober.probe_over(addr, role, settings, master.probe_transport()) => r,
                    _ = stop.cancelled() => return,
                };
                reserve::refill();
            }
        }
        match &result {
            Err(e) if e.stage == Stage::LocalResource => {
                // Not a check of the master: neither a failure nor a success; try again soon.
                local.inc();
                local_resource_episode(&format!("{name} {role} check: {e}"));
                tracing::debug!(target: "saltgate_proxy::check", master = %name, port = %role, error = %e, "check not counted: it met the local resource shortage");
                tokio::select! {
                    _ = tokio::time::sleep(settings.fastinter) => {}
                    _ = stop.cancelled() => return,
                }
                continue;
            }
            // Run on a reserved descriptor: the shortage goes on.
            _ if reserved => local.inc(),
            _ => local_resource_recovered(),
        }
        if matches!(&result, Err(e) if e.stage == Stage::LateGreeting) {
            last_alive = Some(started);
        }
        if busy_not_hung(role, &result, &state, &master, started, last_alive) {
            // A busy master is not a dead one (an `_auth` storm: the ping waits behind the
            // minions' requests, which the master answers): neither a failure nor a success.
            busy.inc();
            let detail = format!(
                "not counted: {}; the master answered minions' requests meanwhile (busy, not hung)",
                result.as_ref().err().map_or("", |e| e.detail.as_str())
            );
            master.upstream.set_last_check(
                role,
                CheckReport {
                    ok: false,
                    detail: detail.clone(),
                    duration_ms: t0.elapsed().as_millis() as u64,
                },
            );
            tracing::debug!(target: "saltgate_proxy::check", master = %name, port = %role, detail = %detail, "check not counted");
            tokio::select! {
                _ = tokio::time::sleep_until(started + state.next_interval(&settings)) => {}
                _ = stop.cancelled() => return,
            }
            continue;
        }
        let took = t0.elapsed();
        duration.observe(took.as_secs_f64());
        let ok = result.is_ok();
        if ok {
            last_alive = Some(started);
        } else {
            failures.inc();
        }
        let detail = match &result {
            Ok(()) => "ok".to_string(),
            Err(e) => e.detail.clone(),
        };
        master.upstream.set_last_check(
            role,
            CheckReport {
                ok,
                detail: detail.clone(),
                duration_ms: took.as_millis() as u64,
            },
        );
        metrics
            .events
            .check(&name, role.as_str(), ok, took, &detail);
        let flipped = state.record(ok, &settings);
        master.upstream.mark_checked(role);
        if let Some(port_state) = flipped {
            if let Some(flip) = master.set_port(role, port_state == PortState::Up) {
                log_flip(&master, role, flip, &state, &detail);
                metrics.events.flip(
                    &name,
                    role.as_str(),
                    flip == Flip::Up,
                    &detail,
                    state.failures.max(state.successes),
                );
                let to = if flip == Flip::Up { "up" } else { "down" };
                metrics
                    .state_changes
                    .with_label_values(&[name.as_str(), to])
                    .inc();
                let _ = events.send(MasterEvent {
                    master: master.clone(),
                    flip,
                });
            }
        }
        // Intervals count from the start of this check: a check that outlasts the interval (a
        // hung master's handshake deadline, a busy master's slow ping) is followed at once.
        let next = started + state.next_interval(&settings);
        tracing::debug!(target: "saltgate_proxy::check", master = %name,
            port = %role,
            ok,
            took_ms = took.as_millis() as u64,
            detail = %detail,
            state = ?state.state,
            next_in_ms = next.saturating_duration_since(tokio::time::Instant::now()).as_millis() as u64,
            "check"
        );
        // A session's passive signal (see `Upstream::nudge_check`) brings the next check forward
        // to `fastinter` after this one began.
        let soon = started + settings.fastinter;
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            r = pings.answer(), if !pings.is_empty() => early = Some(r),
            _ = master.upstream.nudged(role), if soon < next => {
                tracing::debug!(target: "saltgate_proxy::check", master = %name, port = %role, "check brought forward: a session saw the master reset or refuse");
                tokio::select! {
                    _ = tokio::time::sleep_until(soon) => {}
                    _ = stop.cancelled() => return,
                }
            }
            _ = stop.cancelled() => return,
        }
    }
}

fn log_flip(master: &Master, role: Role, flip: Flip, state: &HealthState, detail: &str) {
    let addr = master.addr(role);
    let name = master.name();
    match flip {
        Flip::Down => tracing::warn!(target: "saltgate_proxy::check", master = %name,
            port = %role,
            addr = %addr,
            reason = %format!("{role} port {addr}: {detail} ({} consecutive failure(s))", state.failures),
            "master marked DOWN"
        ),
        Flip::Up => tracing::info!(target: "saltgate_proxy::check", master = %name,
            addr = %addr,
            reason = %format!("both ports pass ({role} port {addr}: {} consecutive success(es))", state.successes),
            "master marked UP"
        ),
    }
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
