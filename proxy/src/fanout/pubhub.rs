//! The publish listener's [`Serve`] in fan-out mode: one [`PubHub`] per listener, which starts
//! its hub's upstreams and cluster-key watch with the first minion session.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use saltgate_config::Role;
use tokio::net::TcpStream;
use tokio_util::sync::DropGuard;
use tracing::Instrument;

use super::hub::{Hub, HubHandles, HubOptions};
use super::{clusterkey, replay, session, upstream};
use crate::session::context::DataPlane;
use crate::session::serve::{BoxFuture, Serve};
use crate::session::span::session_span;

/// The publish listener's [`Serve`] in fanout mode.
pub struct PubHub {
    hub: Arc<Hub>,
    handles: HubHandles,
    _stop: DropGuard,
}

impl PubHub {
    pub fn new(opts: HubOptions, handles: HubHandles) -> Self {
        let hub = Arc::new(Hub::new(opts));
        let guard = hub.stop.clone().drop_guard();
        PubHub {
            hub,
            handles,
            _stop: guard,
        }
    }

    /// Minion sessions attached now.
    pub fn session_count(&self) -> usize {
        self.hub.sessions.load().len()
    }

    /// Upstream connections up now.
    pub fn upstreams_connected(&self) -> u64 {
        self.hub.connected.load(Ordering::Relaxed)
    }
}

impl Serve for PubHub {
    fn serve(&self, ctx: Arc<DataPlane>, stream: TcpStream, peer: SocketAddr) -> BoxFuture<()> {
        ensure_started(&self.hub, &self.handles, &ctx);
        let id = ctx.session_id();
        // The session's task in its span: entered per poll, not per frame.
        let span = session_span(id, Role::Publish, peer);
        Box::pin(session::run(self.hub.clone(), ctx, stream, peer, id).instrument(span))
    }

    fn kind(&self) -> &'static str {
        "fanout"
    }

    /// With `replay_window` set the upstreams open now, not with the first minion: a backup
    /// node must hold the jobs of the window when the minions arrive.
    fn prepare(&self, ctx: &Arc<DataPlane>) {
        if ctx.snapshot.load().config.publish.replay.is_some() {
            ensure_started(&self.hub, &self.handles, ctx);
        }
    }
}

/// Starts the upstream manager once, with the first session's context.
fn ensure_started(this: &Arc<Hub>, handles: &HubHandles, ctx: &Arc<DataPlane>) {
    let mut first = false;
    this.started.get_or_init(|| {
        first = true;
        handles.metrics.clone()
    });
    if first {
        this.replay
            .configure(ctx.snapshot.load().config.publish.replay);
        handles.set_current(this);
        let stop = this.stop.clone();
        let shutdown = ctx.sessions_token.clone();
        let (hub, snapshot) = (this.clone(), ctx.snapshot.clone());
        let loads = handles.metrics.key_loads.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = upstream::manage(hub.clone(), snapshot.clone()) => {}
                _ = clusterkey::watch(&hub.dedup.key, snapshot, Some(loads)) => {}
                _ = replay::watch_peer(&hub.replay) => {}
                _ = stop.cancelled() => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
}
