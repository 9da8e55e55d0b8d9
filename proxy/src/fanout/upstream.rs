//! The hub's upstreams: one SUB connection, subscribed to everything, to every master of the
//! current snapshot whose **publish port** passes its checks. [`manage`] compares those masters
//! with the running upstreams every `watch_interval` (a reload swaps the snapshot, a health flip
//! changes a port's state) and starts or stops one upstream at a time; nothing else is touched
//! when a master comes or goes.
//!
//! Only the publish port counts, not the master's overall UP (both ports): a master publishes
//! through its own publisher whether or not its request port answers. A restarted Salt master
//! opens 4505 and publishes (its own jobs, its peers' forwarded ones) for a minute or more before
//! its request workers answer a `ping` on this host; a master whose request port is overloaded
//! still publishes. Its jobs reach the fan-out's minions from the start that way, where waiting
//! for UP left them to the cluster's peer forwarding. A dead or hung master fails its publish
//! check (refused, no ZMTP greeting) and loses its upstream as before.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use saltgate_config::Role;
use saltgate_wire::transport::zeromq::frame::{MessageAssembler, DEFAULT_MAX_MESSAGE_FRAMES};
use saltgate_wire::transport::zeromq::{
    Command, Connection, Frame, HandshakeConfig, SocketType, ZmtpError,
};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::hub::Hub;
use crate::select::snapshot::Snapshot;

/// Longest wait between two dials of a master that keeps failing.
const MAX_RECONNECT: Duration = Duration::from_secs(2);

/// Whether the hub keeps an upstream to `m`: its publish port passes its checks (see the module doc).
fn wants_upstream(m: &crate::select::master::Master) -> bool {
    m.port_is_up(Role::Publish)
}

/// Keeps one upstream per master with a passing publish port until cancelled (the caller
/// selects on its stop tokens).
pub(super) async fn manage(hub: Arc<Hub>, snapshot: Arc<ArcSwap<Snapshot>>) {
    let mut running: HashMap<(String, SocketAddr), CancellationToken> = HashMap::new();
    // Every upstream stops when the manager is dropped (hub dropped, or shutdown).
    let all = hub.stop.child_token();
    let _stop_all = all.clone().drop_guard();
    let mut tick = tokio::time::interval(hub.opts.watch_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let snap = snapshot.load();
        // A reload may change listeners.publish.replay_*.
        hub.replay.configure(snap.config.publish.replay);
        let wanted: Vec<(String, SocketAddr)> = snap
            .masters
            .iter()
            .filter(|m| wants_upstream(m))
            .map(|m| (m.name(), m.addr(Role::Publish)))
            .collect();
        running.retain(|key, stop| {
            let keep = wanted.contains(key);
            if !keep {
                tracing::info!(target: "saltgate_proxy::pubhub::upstream", master = %key.0, addr = %key.1, "fanout: master's publish port down (or master removed): its upstream stops");
                stop.cancel();
            }
            keep
        });
        for key in wanted {
            if running.contains_key(&key) {
                continue;
            }
            tracing::info!(target: "saltgate_proxy::pubhub::upstream", master = %key.0, addr = %key.1, "fanout: master's publish port up: opening its upstream");
            let stop = all.child_token();
            running.insert(key.clone(), stop.clone());
            let hub = hub.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = upstream(&hub, &key.0, key.1) => {}
                    _ = stop.cancelled() => {}
                }
                hub.upstream_stopped(&key.0);
            });
        }
    }
}

/// Dials `addr` forever; relays every message to the hub.
async fn upstream(hub: &Hub, name: &str, addr: SocketAddr) {
    let m = hub.metrics().cloned();
    let mut hs = HandshakeConfig::new(SocketType::Sub);
    hs.max_frame_size = hub.opts.max_frame_size;
    hs.timeout = hub.opts.handshake_timeout;
    let mut failures = 0u32;
    hub.upstream_state(name, addr, false, None);
    loop {
        match Connection::connect(addr, &hs).await {
            Ok(conn) => {
                failures = 0;
                hub.upstream_state(name, addr, true, None);
                if let Some(m) = &m {
                    m.upstream_connects.with_label_values(&[name]).inc();
                    m.upstreams_connected.inc();
                }
                hub.connected.fetch_add(1, Ordering::Relaxed);
                tracing::info!(target: "saltgate_proxy::pubhub::upstream", master = name, %addr, "fanout: upstream connected");
                let guard = Connected { hub, name };
                let e = relay(hub, name, conn).await;
                drop(guard);
                tracing::warn!(target: "saltgate_proxy::pubhub::upstream", master = name, %addr, error = %e, "fanout: upstream lost; minion sessions stay");
                hub.upstream_state(name, addr, false, Some(format!("lost: {e}")));
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                hub.upstream_state(name, addr, false, Some(format!("connect: {e}")));
                tracing::debug!(target: "saltgate_proxy::pubhub::upstream", master = name, %addr, error = %e, "fanout: upstream connect failed");
            }
        }
        let factor = 1u32 << failures.min(5);
        tokio::time::sleep(hub.opts.reconnect.saturating_mul(factor).min(MAX_RECONNECT)).await;
    }
}

/// Counts the disconnect however the connection ends (error, or the upstream being stopped).
struct Connected<'a> {
    hub: &'a Hub,
    name: &'a str,
}

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.hub.connected.fetch_sub(1, Ordering::Relaxed);
        if let Some(m) = self.hub.metrics() {
            m.upstream_disconnects.with_label_values(&[self.name]).inc();
            m.upstreams_connected.dec();
        }
    }
}

/// Subscribes to everything and relays until the connection fails.
async fn relay(hub: &Hub, name: &str, mut conn: Connection) -> ZmtpError {
    let peer_3_1 = conn.peer().greeting.supports_3_1();
    let sub = if peer_3_1 {
        conn.send_command(&Command::Subscribe(Bytes::new())).await
    } else {
        conn.send_message(&[[1u8]]).await
    };
    if let Err(e) = sub {
        return e;
    }
    let received = hub
        .metrics()
        .map(|m| m.upstream_messages.with_label_values(&[name]));
    let duplicates = hub
        .metrics()
        .map(|m| m.duplicates.with_label_values(&[name]));
    let hb = hub
        .opts
        .heartbeat
        .filter(|h| peer_3_1 && !h.interval.is_zero());
    let mut ping = hb.map(|h| {
        let mut t = tokio::time::interval_at(Instant::now() + h.interval, h.interval);
        t.set_missed_tick_behavior(MissedTickBehavior::Delay);
        t
    });
    let mut assembler = MessageAssembler::new(DEFAULT_MAX_MESSAGE_FRAMES, hub.opts.max_frame_size);
    loop {
        // A master that hangs (sends nothing, not even PONGs) is dropped after the timeout.
        let limit = hb.map(|h| h.timeout.max(h.interval));
        let deadline = limit.and_then(|l| conn.last_received().checked_add(l));
        tokio::select! {
            f = conn.read_frame() => match f {
                Ok(Frame::Command(body)) => match Command::parse(&body) {
                    Ok(Command::Ping { context, .. }) => {
                        if let Err(e) = conn.send_command(&Command::Pong { context }).await {
                            return e;
                        }
                    }
                    Ok(Command::Error(r)) => {
                        return ZmtpError::PeerError(String::from_utf8_lossy(&r).into_owned())
                    }
                    Ok(_) => {}
                    Err(e) => return e.into(),
                },
                Ok(Frame::Message { body, more }) => match assembler.push(body, more) {
                    Ok(Some(frames)) => {
                        if let Some(c) = &received {
                            c.inc();
                        }
                        hub.publish_from(&frames, duplicates.as_ref());
                    }
                    Ok(None) => {}
                    Err(e) => return e.into(),
                },
                Err(e) => return e,
            },
            _ = async { match ping.as_mut() { Some(t) => { t.tick().await; } None => std::future::pending().await } } => {
                if let Err(e) = conn.send_command(&Command::Ping { ttl: 0, context: Bytes::new() }).await {
                    return e;
                }
            }
            _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {
                // Bytes of a large frame may have arrived meanwhile: only silence counts.
                if limit.is_some_and(|l| conn.last_received() + l <= Instant::now()) {
                    return ZmtpError::Timeout("upstream heartbeat");
                }
            }
        }
    }
}
