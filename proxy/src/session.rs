//! One client connection: choose a master, connect (timeout, retries on the next candidate),
//! register with the master, run the data path, count it, write the access-log line.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use saltgate_config::{ListenerConfig, Role};
use tokio::net::TcpStream;

use crate::close::CloseReason;
use crate::listener::{tune, Permits};
use crate::master::Master;
use crate::pump::{self, IdleLimits};
use crate::server::Shared;

/// What the access log says about one session.
struct Outcome<'a> {
    master: Option<&'a Master>,
    reason: CloseReason,
    bytes_in: u64,
    bytes_out: u64,
    connect_ms: u64,
    attempts: u32,
}

/// Decrements the listener's live-session gauge when the session ends, however it ends.
struct Live(prometheus::IntGauge);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Handles a client connection from accept to close.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    role: Role,
    client: TcpStream,
    peer: SocketAddr,
    _permits: Permits,
) {
    let started = Instant::now();
    let m = &shared.metrics;
    let lname = role.as_str();
    m.sessions_total.with_label_values(&[lname]).inc();
    let live = Live(m.sessions_current.with_label_values(&[lname]));
    live.0.inc();
    let snap = shared.snapshot.load_full();
    let listener = snap.config.listener(role);
    let mut order = Vec::with_capacity(snap.masters.len());
    snap.selector(role)
        .order(&snap.masters, role, peer.ip(), &mut order);

    if order.is_empty() {
        tracing::info!(client = %peer, listener = %role, "no master available; closing the client connection");
        m.refused
            .with_label_values(&[lname, CloseReason::NoMaster.as_str()])
            .inc();
        access_log(
            listener,
            peer,
            started,
            Outcome {
                master: None,
                reason: CloseReason::NoMaster,
                bytes_in: 0,
                bytes_out: 0,
                connect_ms: 0,
                attempts: 0,
            },
        );
        return;
    }

    // Up to 1 + retries attempts, each on the next candidate (cycling when there are fewer).
    let mut attempts = 0u32;
    let mut connected: Option<(TcpStream, &Arc<Master>)> = None;
    let connect_start = Instant::now();
    for &i in order.iter().cycle().take(1 + listener.retries as usize) {
        let master = &snap.masters[i];
        if !master.is_available() || !master.has_room(role) {
            continue;
        }
        attempts += 1;
        let addr = master.addr(role);
        let failure =
            match tokio::time::timeout(listener.timeout_connect, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    connected = Some((stream, master));
                    break;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {:?}", listener.timeout_connect),
            };
        m.connect_errors
            .with_label_values(&[master.name().as_str(), lname])
            .inc();
        tracing::warn!(client = %peer, listener = %role, master = %master.name(), addr = %addr, error = %failure, "connect to master failed");
    }
    let connect_ms = connect_start.elapsed().as_millis() as u64;
    let Some((master_stream, master)) = connected else {
        let reason = if attempts == 0 {
            CloseReason::NoMaster
        } else {
            CloseReason::ConnectFailed
        };
        m.refused.with_label_values(&[lname, reason.as_str()]).inc();
        access_log(
            listener,
            peer,
            started,
            Outcome {
                master: None,
                reason,
                bytes_in: 0,
                bytes_out: 0,
                connect_ms,
                attempts,
            },
        );
        return;
    };
    tune(&master_stream);

    let reg = master.register(role, peer, &shared.sessions_token);
    let limits = IdleLimits {
        client: listener.timeout_client,
        server: listener.timeout_server,
        client_fin: listener.timeout_client_fin,
        server_fin: listener.timeout_server_fin,
    };
    let bytes = [
        m.bytes.with_label_values(&[lname, "in"]),
        m.bytes.with_label_values(&[lname, "out"]),
    ];
    let reason = pump::pump(
        client,
        master_stream,
        limits,
        &reg.ctl,
        &shared.pool,
        &bytes,
    )
    .await;
    let (bytes_in, bytes_out) = (
        reg.ctl.bytes_in.load(Ordering::Relaxed),
        reg.ctl.bytes_out.load(Ordering::Relaxed),
    );
    drop(reg);
    m.sessions_closed
        .with_label_values(&[master.name().as_str(), lname, reason.as_str()])
        .inc();
    access_log(
        listener,
        peer,
        started,
        Outcome {
            master: Some(master),
            reason,
            bytes_in,
            bytes_out,
            connect_ms,
            attempts,
        },
    );
}

/// One line per closed session, like HAProxy's tcplog, as a structured event on target
/// `saltgate::access` (text or JSON, per `--log-format`).
fn access_log(l: &ListenerConfig, client: SocketAddr, started: Instant, o: Outcome<'_>) {
    if !l.access_log {
        return;
    }
    tracing::info!(
        target: "saltgate::access",
        client = %client,
        listener = %l.role,
        master = %o.master.map(|m| m.name()).unwrap_or_else(|| "-".into()),
        master_addr = %o.master.map(|m| m.addr(l.role).to_string()).unwrap_or_else(|| "-".into()),
        duration_ms = started.elapsed().as_millis() as u64,
        connect_ms = o.connect_ms,
        attempts = o.attempts,
        bytes_in = o.bytes_in,
        bytes_out = o.bytes_out,
        reason = %o.reason,
        "session closed"
    );
}
