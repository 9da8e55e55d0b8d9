//! Small future helpers shared by the data path and what runs on it.

use std::future::Future;
use std::pin::Pin;

use tokio::time::Instant;

/// A boxed, sendable future (what a [`crate::session::serve::Serve`] returns).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Sleeps until `deadline`, or forever when there is none.
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
