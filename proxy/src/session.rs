//! One client connection: choose a master, connect (timeout, retries on the next candidate),
//! register with the master, run the data path, write the access-log line.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    connect_ms: Option<u64>,
    attempts: u32,
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
    let snap = shared.snapshot.load_full();
    let listener = snap.config.listener(role);
    let mut order = Vec::with_capacity(snap.masters.len());
    snap.selector(role)
        .order(&snap.masters, role, peer.ip(), &mut order);

    if order.is_empty() {
        tracing::info!(client = %peer, listener = %role, "no master available; closing the client connection");
        access_log(
            listener,
            peer,
            started,
            Outcome {
                master: None,
                reason: CloseReason::NoMaster,
                bytes_in: 0,
                bytes_out: 0,
                connect_ms: None,
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
        match tokio::time::timeout(listener.timeout_connect, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                connected = Some((stream, master));
                break;
            }
            Ok(Err(e)) => {
                tracing::warn!(client = %peer, listener = %role, master = master.name(), addr = %addr, error = %e, "connect to master failed")
            }
            Err(_) => {
                tracing::warn!(client = %peer, listener = %role, master = master.name(), addr = %addr, timeout_ms = listener.timeout_connect.as_millis() as u64, "connect to master timed out")
            }
        }
    }
    let connect_ms = Some(connect_start.elapsed().as_millis() as u64);
    let Some((master_stream, master)) = connected else {
        let reason = if attempts == 0 {
            CloseReason::NoMaster
        } else {
            CloseReason::ConnectFailed
        };
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
    let reason = pump::pump(client, master_stream, limits, &reg.ctl, &shared.pool).await;
    let (bytes_in, bytes_out) = (
        reg.ctl.bytes_in.load(std::sync::atomic::Ordering::Relaxed),
        reg.ctl.bytes_out.load(std::sync::atomic::Ordering::Relaxed),
    );
    drop(reg);
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
    let duration: Duration = started.elapsed();
    tracing::info!(
        target: "saltgate::access",
        client = %client,
        listener = %l.role,
        master = %o.master.map(|m| m.name()).unwrap_or("-"),
        master_addr = %o.master.map(|m| m.addr(l.role).to_string()).unwrap_or_else(|| "-".into()),
        duration_ms = duration.as_millis() as u64,
        connect_ms = o.connect_ms.unwrap_or(0),
        attempts = o.attempts,
        bytes_in = o.bytes_in,
        bytes_out = o.bytes_out,
        reason = %o.reason,
        "session closed"
    );
}
