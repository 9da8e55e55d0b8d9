//! Connecting a new session to a master: up to 1 + `retries` attempts over the selection's
//! candidates, each holding a lease under the master's `maxconn`.

use std::sync::Arc;
use std::time::Duration;

use saltgate_config::ListenerConfig;
use tokio::net::TcpStream;

use crate::data::registry::Lease;
use crate::ops::metrics::MasterHandles;
use crate::select::master::Master;
use crate::select::snapshot::Snapshot;
use crate::session::context::DataPlane;

/// A session connected to a master, holding its place in the master's book.
pub(crate) struct Connected {
    pub stream: TcpStream,
    pub lease: Lease,
    pub master: Arc<Master>,
    pub handles: Arc<MasterHandles>,
    pub attempts: u32,
    pub connect_ms: u32,
}

/// The pause before a retry on the master just tried (when no other candidate is left).
pub const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// How the connect phase ended.
pub(crate) enum Connect {
    Done(Connected),
    Failed { attempts: u32 },
    Shutdown,
}

/// Up to 1 + `retries` attempts, each on the next candidate (cycling when there are fewer; a master
/// is never tried twice in a row without [`RETRY_PAUSE`]). Each attempt first leases a place under
/// the master's `maxconn`.
pub(crate) async fn connect(
    ctx: &DataPlane,
    l: &ListenerConfig,
    snap: &Snapshot,
    order: &[usize],
) -> Connect {
    let role = l.role;
    let mut attempts = 0u32;
    let mut last: Option<usize> = None;
    for &i in order.iter().cycle().take(1 + l.retries as usize) {
        let master = &snap.masters[i];
        let handles = &snap.handles[i];
        if !master.is_available() {
            continue;
        }
        if last == Some(i) {
            // The same master again (it is the only candidate left): not back to back, as
            // HAProxy's turn-around delay.
            tokio::select! {
                _ = tokio::time::sleep(RETRY_PAUSE) => {}
                _ = ctx.sessions_token.cancelled() => return Connect::Shutdown,
            }
        }
        let Some(mut lease) = master.try_reserve(role) else {
            continue;
        };
        // The place it gives back goes to the first client waiting in the listener's queue.
        lease.wake_on_release(ctx.queue(role).clone());
        last = Some(i);
        attempts += 1;
        let addr = master.addr(role);
        let attempt = tokio::time::timeout(l.timeout_connect, TcpStream::connect(addr));
        let failure = tokio::select! {
            r = attempt => match r {
                Ok(Ok(stream)) => return Connect::Done(Connected { stream, lease, master: master.clone(), handles: handles.clone(), attempts, connect_ms: 0 }),
                Ok(Err(e)) if crate::select::check::is_local_resource(&e) => {
                    // Says nothing about the master: not one of its connect errors.
                    handles.local_resource_errors.inc();
                    crate::select::check::local_resource_episode(&format!("connect to {addr}: {e}"));
                    continue;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {:?}", l.timeout_connect),
            },
            _ = ctx.sessions_token.cancelled() => return Connect::Shutdown,
        };
        handles.connect_errors[role as usize].inc();
        // A passive signal: check this port soon rather than at its next interval.
        master.upstream.nudge_check(role);
        if let Some(left_out) = handles.connect_log.allow() {
            tracing::warn!(target: "saltgate_proxy::session", master = %master.name(), addr = %addr, error = %failure, left_out, "connect to master failed (at most one line per master every 5 s; left_out: failures not logged since the last)");
        }
    }
    Connect::Failed { attempts }
}
