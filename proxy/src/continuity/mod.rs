//! Request-session continuity (`listeners.request.on_master_down: migrate`,
//! docs/request-continuity.md): when the master behind a minion's request session dies (reset,
//! EOF) or is marked DOWN, the minion's connection stays open; saltgate opens a connection to
//! another UP master of the set, does the ZMTP handshake with it as the minion did (the minion's
//! READY, byte for byte), keeps that master's greeting and READY from the minion, re-sends the
//! request the old master never answered, and pumps again.
//!
//! The data path is the pump's (a pooled buffer per read, no buffer while idle), in one task
//! for both directions (a REQ socket alternates request and reply), with [`track`] reading the
//! frame boundaries as bytes pass. The one copy kept is the minion's unanswered request, up to
//! `migrate_buffer` bytes, dropped as soon as its reply starts.
//!
//! On Salt's plain `tcp` transport ([`tcp_track`], chosen by [`framing::Track`]) there is no
//! handshake: saltgate connects to the next master and re-sends every request the old one left
//! unanswered (several may be in flight, matched by `mid`), up to `migrate_buffer` bytes for all
//! of them together.
//!
//! On Salt's plain `ws` transport ([`ws_track`]) the handshake is the minion's HTTP upgrade:
//! saltgate sends it again to the next master, keeps that master's `101` from the minion (unless
//! the minion had none yet), and re-sends the binary messages left unanswered.

mod auth_drain;
pub mod auth_hold;
pub mod auth_limit;
mod auth_relay;
mod framing;
mod handshake;
mod held;
pub mod metrics;
pub mod msgpack_walk;
pub mod tcp_track;
pub mod track;
pub mod ws_track;
pub mod ws_walk;

use crate::ops::ratelimit::{LogLimit, LOG_EVERY};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use saltgate_config::auth_limit::AuthLimit;
use saltgate_config::{ListenerConfig, OnMasterDown, Role};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use framing::Track;
pub use metrics::ReplayMetrics;
use track::Skip;

use crate::data::buf::{read_some, Tally, Tap};
use crate::data::close::CloseReason;
use crate::data::future::sleep_until_opt;
use crate::data::pump::IdleLimits;
use crate::data::registry::SessionCtl;
use crate::session::connect::{connect, Connect, Connected};
use crate::session::context::DataPlane;

// A master that dies can move thousands of request sessions at once: one line per interval each,
// with how many were left out (the metrics count every one).
static MOVED_LOG: LogLimit = LogLimit::new(LOG_EVERY);
static NOT_MOVED_LOG: LogLimit = LogLimit::new(LOG_EVERY);
static HANDSHAKE_LOG: LogLimit = LogLimit::new(LOG_EVERY);

/// How a request session with continuity ended.
pub(crate) struct Ended {
    pub reason: CloseReason,
    /// The master it ended on.
    pub up: Connected,
    /// Times it moved to another master.
    pub migrations: u32,
    /// Why it did not move when its master went, if that is how it ended.
    pub skip: Option<Skip>,
    /// Bytes minion → masters and masters → minion, over all its masters.
    pub bytes: (u64, u64),
}

/// Why one relay stretch (one master) stopped.
enum Stop {
    /// The session ends.
    Close(CloseReason),
    /// The session ends while a write to the minion was cut short: its stream is broken.
    MidWrite(CloseReason),
    /// The master went (reset, EOF, marked DOWN): move if possible.
    Master(CloseReason),
}

/// What the session needs across masters.
struct Relay<'a> {
    ctx: &'a DataPlane,
    limits: IdleLimits,
    /// What the bytes did to the requests (ZeroMQ's or plain `tcp`'s framing).
    track: Track,
    tap: Option<Box<dyn Tap>>,
    client_eof: bool,
    last: Instant,
    /// `auth_limit`: the policy, the minion's bytes as read for `_auth`, the gate of the
    /// master now, and the place an `_auth` holds at it until answered.
    auth: Option<AuthLimit>,
    hold: Option<auth_hold::Hold>,
    gate: Option<Arc<auth_limit::Gate>>,
    permit: Option<auth_limit::AuthPermit>,
    /// The master now: each reply it completes is seen ([`crate::select::upstream::Upstream::saw_answer`]).
    master: Option<Arc<crate::select::master::Master>>,
}

/// Runs a request session with continuity (`on_master_down: migrate`), or with `auth_limit`, or
/// both, until it ends. `first` is connected and registered
/// (its lease holds `ctl`).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    ctx: &DataPlane,
    l: &ListenerConfig,
    user_timeout: Option<Duration>,
    peer: SocketAddr,
    mut client: TcpStream,
    first: Connected,
    mut ctl: Arc<SessionCtl>,
    tap: Option<Box<dyn Tap>>,
    limits: IdleLimits,
) -> Ended {
    let m = &ctx.replay;
    let migrate = l.on_master_down == OnMasterDown::Migrate;
    // The snapshot is not kept: a session outlives reloads.
    let (transport, tls) = {
        let snap = ctx.load();
        (
            snap.config.global.transport,
            snap.config.global.ssl.is_some(),
        )
    };
    let mut r = Relay {
        ctx,
        limits,
        // Without migrate nothing is kept for re-sending.
        track: Track::new(
            transport,
            tls,
            if migrate {
                l.migrate_buffer as usize
            } else {
                0
            },
        ),
        tap,
        client_eof: false,
        last: Instant::now(),
        auth: l.auth_limit,
        hold: l.auth_limit.map(|_| auth_hold::Hold::new()),
        gate: None,
        permit: None,
        master: None,
    };
    let mut up = first;
    r.gate = r.auth.map(|a| ctx.auth_limits.gate(&up.master.name(), &a));
    r.master = Some(up.master.clone());
    let mut migrations = 0u32;
    // Bytes counted on the masters left behind.
    let mut moved_bytes = (0u64, 0u64);
    let mut stop = r.relay(&mut client, &mut up.stream, &ctl).await;
    let (reason, skip) = loop {
        let why = match stop {
            Stop::Close(reason) => break (reason, None),
            // Cut short while the master was going: the minion's stream is broken.
            Stop::MidWrite(reason) if reason == CloseReason::MasterDown => {
                break (reason, Some(Skip::MidReply))
            }
            Stop::MidWrite(reason) => break (reason, None),
            Stop::Master(why) => why,
        };
        if r.track.finished() {
            // A `ws` close frame passed: the master ended the websocket, as it was asked to.
            break (why, None);
        }
        if why != CloseReason::MasterDown {
            // Salt masters do not close minions' connections while they run: check it soon.
            up.master.upstream.nudge_check(Role::Request);
        }
        if !migrate {
            break (why, None);
        }
        let old = up.master.name();
        let moved = match r.track.plan() {
            Ok(replay) => move_to(ctx, l, peer, &old, r.track.handshake())
                .await
                .map(|(c, left)| (c, left, replay)),
            Err(s) => Err(s),
        };
        let (next, left, replay) = match moved {
            Ok(x) => x,
            Err(skip) => {
                if let Some(left_out) = NOT_MOVED_LOG.allow() {
                    tracing::info!(target: "saltgate_proxy::replay", reason = %why, skip = skip.as_str(), left_out, "request session not moved; closing it as its master went (one line per 5 s, left_out: how many since the last)");
                }
                break (why, Some(skip));
            }
        };
        crate::data::listener::tune(&next.stream, user_timeout);
        // The old master's place in its book goes; the session takes one in the new master's.
        moved_bytes.0 += ctl.bytes_in.load(Ordering::Relaxed);
        moved_bytes.1 += ctl.bytes_out.load(Ordering::Relaxed);
        let id = ctl.id;
        up = next;
        ctl = up.lease.register(id, peer, std::time::Instant::now());
        migrations += 1;
        m.migrated(why).inc();
        // An `_auth` re-sent to the new master is not paced again; its old place is given back.
        r.permit = None;
        r.gate = r.auth.map(|a| ctx.auth_limits.gate(&up.master.name(), &a));
        r.master = Some(up.master.clone());
        r.track.resumed();
        crate::session::span::record_master(up.master.label());
        if let Some(left_out) = MOVED_LOG.allow() {
            tracing::info!(target: "saltgate_proxy::replay", from = %old, to = %up.master.name(), reason = %why, replayed = replay.as_ref().map_or(0, |(b, _)| b.len()), left_out, "request session moved to another master (one line per 5 s, left_out: how many since the last)");
        }
        if let Some((bytes, complete)) = replay {
            m.replayed(complete).inc();
            if let Err(e) = up.stream.write_all(&bytes).await {
                tracing::debug!(target: "saltgate_proxy::replay", error = %e, "re-sending the request failed");
                stop = Stop::Master(CloseReason::MasterReset);
                continue;
            }
        }
        if !left.is_empty() {
            // The new master spoke right after its READY (a PING): the minion gets it.
            if client.write_all(&left).await.is_err() {
                break (CloseReason::ClientReset, None);
            }
            r.reply_events(&left);
        }
        stop = r.relay(&mut client, &mut up.stream, &ctl).await;
    };
    if let Some(s) = skip {
        m.skipped(s).inc();
    }
    // The minion left with its `_auth` at the master: the place stays taken until the answer.
    if matches!(reason, CloseReason::ClientEof | CloseReason::ClientReset) {
        if let Some(p) = r.permit.take() {
            auth_drain::spawn(&up.stream, r.track.take_down(), p);
        }
    }
    let bytes = (
        moved_bytes.0 + ctl.bytes_in.load(Ordering::Relaxed),
        moved_bytes.1 + ctl.bytes_out.load(Ordering::Relaxed),
    );
    Ended {
        reason,
        up,
        migrations,
        skip,
        bytes,
    }
}

/// Connects to another UP master (not `old`) and does the handshake for the minion (ZeroMQ's,
/// with the minion's READY; `ws`'s upgrade; plain `tcp` has none); two candidates at most, each
/// within `timeout_connect` for the connect and again for the handshake.
async fn move_to(
    ctx: &DataPlane,
    l: &ListenerConfig,
    peer: SocketAddr,
    old: &str,
    hs: Option<handshake::Handshake<'_>>,
) -> Result<(Connected, Bytes), Skip> {
    let role = Role::Request;
    let snap = ctx.load();
    let mut order = Vec::new();
    snap.selector(role)
        .order(&snap.masters, role, peer.ip(), &mut order);
    order.retain(|&i| snap.masters[i].name() != old);
    for _ in 0..2 {
        if order.is_empty() {
            break;
        }
        let Connect::Done(mut c) = connect(ctx, l, &snap, &order).await else {
            break;
        };
        if hs.is_none() {
            return Ok((c, Bytes::new()));
        }
        match tokio::time::timeout(
            l.timeout_connect,
            handshake::run(&mut c.stream, hs.as_ref()),
        )
        .await
        {
            Ok(Ok(left)) => return Ok((c, left)),
            Ok(Err(e)) => {
                if let Some(left_out) = HANDSHAKE_LOG.allow() {
                    tracing::warn!(target: "saltgate_proxy::replay", master = %c.master.name(), error = %e, left_out, "handshake for a moving request session failed (one line per 5 s)")
                }
            }
            Err(_) => {
                if let Some(left_out) = HANDSHAKE_LOG.allow() {
                    tracing::warn!(target: "saltgate_proxy::replay", master = %c.master.name(), left_out, "handshake for a moving request session timed out (one line per 5 s)")
                }
            }
        }
        c.handles.connect_errors[role as usize].inc();
        c.master.upstream.nudge_check(role);
        let failed = c.master.name();
        order.retain(|&i| snap.masters[i].name() != failed);
    }
    Err(Skip::NoMaster)
}

impl Relay<'_> {
    /// Tells the request tracker what the bytes written to the minion did.
    fn reply_events(&mut self, bytes: &[u8]) {
        let ev = self.track.observe_down(bytes);
        if ev.done {
            if let Some(m) = &self.master {
                m.upstream.saw_answer();
            }
            if let Some(p) = self.permit.take() {
                p.answered();
            }
        }
    }

    /// Pumps between the minion and one master until one of them ends, the session is asked to
    /// close, or it goes idle.
    async fn relay(
        &mut self,
        client: &mut TcpStream,
        master: &mut TcpStream,
        ctl: &SessionCtl,
    ) -> Stop {
        let ctx = self.ctx;
        let listener = &ctx.listener(Role::Request).bytes;
        let mut tin = Tally::new(&ctl.bytes_in, &listener[0]);
        let mut tout = Tally::new(&ctl.bytes_out, &listener[1]);
        let asked = || ctl.close_reason().unwrap_or(CloseReason::Shutdown);
        loop {
            let deadline = self
                .limits
                .limit(self.client_eof, false)
                .map(|l| self.last + l);
            tokio::select! {
                r = client.readable(), if !self.client_eof => {
                    if r.is_err() {
                        return Stop::Close(CloseReason::ClientReset);
                    }
                    let mut buf = ctx.pool.get();
                    let n = match read_some(client, &mut buf) {
                        Ok(0) => {
                            self.client_eof = true;
                            if self.permit.is_some() {
                                // Its `_auth` is at the master, unanswered: the session ends
                                // and the connection is kept for the answer (auth_drain).
                                return Stop::Close(CloseReason::ClientEof);
                            }
                            let _ = master.shutdown().await;
                            continue;
                        }
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Err(_) => return Stop::Close(CloseReason::ClientReset),
                    };
                    let chunk = &buf[..n];
                    self.last = Instant::now();
                    let sent = if self.hold.is_some() {
                        self.paced(client, master, ctl, &mut tin, chunk).await
                    } else {
                        self.send_up(master, ctl, &mut tin, chunk).await
                    };
                    if let Err(stop) = sent {
                        return stop;
                    }
                }
                r = master.readable() => {
                    if r.is_err() {
                        return self.master_gone(CloseReason::MasterReset);
                    }
                    let mut buf = ctx.pool.get();
                    let n = match read_some(master, &mut buf) {
                        Ok(0) => return self.master_gone(CloseReason::MasterEof),
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Err(_) => return self.master_gone(CloseReason::MasterReset),
                    };
                    let chunk = &buf[..n];
                    self.last = Instant::now();
                    tokio::select! {
                        w = client.write_all(chunk) => if w.is_err() {
                            return Stop::Close(CloseReason::ClientReset);
                        },
                        _ = ctl.closed(&ctx.sessions_token) => return Stop::MidWrite(asked()),
                    }
                    tout.add(n as u64);
                    self.last = Instant::now();
                    self.reply_events(chunk);
                }
                _ = sleep_until_opt(deadline) => {
                    if self.limits.expired(Instant::now() - self.last, self.client_eof, false) {
                        return Stop::Close(CloseReason::IdleTimeout);
                    }
                }
                _ = ctl.closed(&ctx.sessions_token) => return from_master(asked()),
            }
        }
    }

    /// Writes minion bytes to the master (seen by the tracker before, by the tap after).
    async fn send_up(
        &mut self,
        master: &mut TcpStream,
        ctl: &SessionCtl,
        tin: &mut Tally<'_>,
        bytes: &[u8],
    ) -> Result<(), Stop> {
        // Seen before it is written: a write cut short is re-sent whole elsewhere.
        self.track.observe_up(bytes);
        tokio::select! {
            w = master.write_all(bytes) => if w.is_err() {
                return Err(self.master_gone(CloseReason::MasterReset));
            },
            _ = ctl.closed(&self.ctx.sessions_token) => {
                return Err(from_master(ctl.close_reason().unwrap_or(CloseReason::Shutdown)))
            }
        }
        tin.add(bytes.len() as u64);
        self.last = Instant::now();
        if let Some(t) = self.tap.as_mut() {
            if !t.observe(bytes) {
                self.tap = None;
            }
        }
        Ok(())
    }

    /// The master's side ended: move, unless the minion has half-closed (it is leaving).
    fn master_gone(&self, reason: CloseReason) -> Stop {
        if self.client_eof {
            Stop::Close(CloseReason::ClientEof)
        } else {
            Stop::Master(reason)
        }
    }
}

/// A close asked of the session: a master marked DOWN may be left for another.
fn from_master(reason: CloseReason) -> Stop {
    match reason {
        CloseReason::MasterDown => Stop::Master(reason),
        other => Stop::Close(other),
    }
}
