//! The seam between a listener and what it does with an accepted connection: each listener owns
//! one [`Serve`]: the L4 session ([`crate::session::l4::L4Session`]: pick a master, connect,
//! pump bytes) or the publish fan-out hub ([`crate::fanout::PubHub`]). Another implementation
//! plugs in here: implement [`Serve`] and return it from the control plane's
//! [`crate::control::reload::for_listener`].
//!
//! The accept loop keeps the listener's and the process's `maxconn` permits until the returned
//! future ends, and tracks it for the shutdown drain; a `Serve` only sees the stream, the peer and
//! the data-plane context.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio_util::task::TaskTracker;

use crate::data::listener::Permits;
use crate::session::context::DataPlane;

pub use crate::data::future::BoxFuture;

/// What a listener does with each accepted connection.
pub trait Serve: Send + Sync + 'static {
    /// Serves one accepted connection until it ends.
    fn serve(&self, ctx: Arc<DataPlane>, stream: TcpStream, peer: SocketAddr) -> BoxFuture<()>;

    /// A short name for logs.
    fn kind(&self) -> &'static str;

    /// Called when the listener starts serving with it, before any connection: a serve that
    /// must work without sessions (the fan-out hub keeping its replay window warm) starts here.
    fn prepare(&self, _ctx: &Arc<DataPlane>) {}

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
