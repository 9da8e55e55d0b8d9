//! The publish listener's [`Serve`] in fan-out mode: one [`PubHub`] per listener, which starts
//! its hub's upstreams and cluster-key watch with the first minion session.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use saltgate_config::Role;
use tokio::net::TcpStream;
use tokio_util::sync::DropGuard;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::hub::{Hub, HubHandles, HubOptions};
use super::{clusterkey, replay, session, upstream};
use crate::data::listener::Permits;
use crate::session::context::DataPlane;
use crate::session::serve::{BoxFuture, Serve};
use crate::session::span::{in_span, session_span};

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
        self.hub.sessions().len()
    }

    /// Upstream connections up now.
    pub fn upstreams_connected(&self) -> u64 {
        self.hub.connected.load(Ordering::Relaxed)
    }
}

impl PubHub {
    /// One minion session holding `permits`, with the hub started, and its span (the session's
    /// task runs in it: entered per poll, not per frame).
    fn session(
        &self,
        ctx: Arc<DataPlane>,
        stream: TcpStream,
        peer: SocketAddr,
        permits: Permits,
    ) -> (
        impl std::future::Future<Output = ()> + Send + 'static,
        tracing::Span,
    ) {
        ensure_started(&self.hub, &self.handles, &ctx);
        let id = ctx.session_id();
        let span = session_span(id, Role::Publish, peer);
        let run = session::run(self.hub.clone(), ctx, stream, peer, id, permits);
        (run, span)
    }
}

impl Drop for PubHub {
    /// The sessions end with the hub (a reload that drops this listener's fan-out): they are
    /// told through their queues; `_stop` then cancels the upstreams.
    fn drop(&mut self) {
        self.hub.stop_sessions();
    }
}

impl Serve for PubHub {
    fn serve(&self, ctx: Arc<DataPlane>, stream: TcpStream, peer: SocketAddr) -> BoxFuture<()> {
        let (run, span) = self.session(ctx, stream, peer, Permits::none());
        Box::pin(run.instrument(span))
    }

    /// Unboxed, as the L4 session's: a fan-out session lives as long as its minion, and this is
    /// one allocation per session (the task) instead of two.
    fn spawn(
        &self,
        tracker: &TaskTracker,
        ctx: Arc<DataPlane>,
        stream: TcpStream,
        peer: SocketAddr,
        permits: Permits,
    ) {
        in_span(tracker, self.session(ctx, stream, peer, permits));
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
                // The shutdown grace ran out: every session ends.
                _ = shutdown.cancelled() => hub.stop_sessions(),
            }
        });
    }
}
