//! The seam between a listener and what it does with an accepted connection: each listener owns
//! one [`Serve`]. Today every listener runs the L4 session ([`L4Session`]: pick a master, connect,
//! pump bytes). Another implementation (a publish fan-out hub) plugs in here: implement [`Serve`]
//! and return it from [`for_listener`].
//!
//! The accept loop keeps the listener's and the process's `maxconn` permits until the returned
//! future ends, and tracks it for the shutdown drain; a `Serve` only sees the stream, the peer and
//! the data-plane context.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use saltgate_config::{Config, ListenerMode, Role};
use tokio::net::TcpStream;
use tokio_util::task::TaskTracker;

use crate::dataplane::DataPlane;
use crate::listener::Permits;

/// A boxed, sendable future (what a [`Serve`] returns).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a listener does with each accepted connection.
pub trait Serve: Send + Sync + 'static {
    /// Serves one accepted connection until it ends.
    fn serve(&self, ctx: Arc<DataPlane>, stream: TcpStream, peer: SocketAddr) -> BoxFuture<()>;

    /// A short name for logs.
    fn kind(&self) -> &'static str;

    /// Spawns the serving of one accepted connection on `tracker`, holding `permits` until it
    /// ends. This default boxes [`Serve::serve`]'s future inside the task; an implementation
    /// whose connections live long may spawn its own future unboxed (one allocation per
    /// connection, the task, instead of two).
    fn spawn(
        &self,
        tracker: &TaskTracker,
        ctx: Arc<DataPlane>,
        stream: TcpStream,
        peer: SocketAddr,
        permits: Permits,
    ) {
        let session = self.serve(ctx, stream, peer);
        tracker.spawn(async move {
            let _permits = permits;
            session.await
        });
    }
}

/// The L4 session: one client connection ↔ one master connection.
#[derive(Debug, Clone, Copy)]
pub struct L4Session {
    pub role: Role,
}

impl Serve for L4Session {
    fn serve(&self, ctx: Arc<DataPlane>, stream: TcpStream, peer: SocketAddr) -> BoxFuture<()> {
        Box::pin(crate::session::handle(
            ctx,
            self.role,
            stream,
            peer,
            Permits::none(),
        ))
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
        tracker.spawn(crate::session::handle(
            ctx, self.role, stream, peer, permits,
        ));
    }
}

/// The [`Serve`] for a listener of `role` under `config`: the fan-out hub for a publish listener
/// in `mode: fanout`, the L4 session otherwise. Cheap: the hub starts its upstreams with its
/// first session (a reload calls this to compare kinds).
pub fn for_listener(role: Role, config: &Config) -> Arc<dyn Serve> {
    match (role, config.listener(role).mode) {
        (Role::Publish, ListenerMode::Fanout) => {
            Arc::new(crate::pubhub::PubHub::new(Default::default()))
        }
        _ => Arc::new(L4Session { role }),
    }
}
