//! What the admin API asks of the control plane ([`AdminOps`], implemented there), and the
//! helpers every admin view shares: the JSON error and the `?limit=` of a listing.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use saltgate_config::Role;
use serde_json::json;

use crate::admin::error::{AdminError, ApplyError};
use crate::data::future::BoxFuture;
use crate::select::master::MasterState;
use crate::select::snapshot::Snapshot;

/// What the API asks of the control plane. Defined here and implemented by
/// the control plane ([`crate::control`]), so the API does not depend on the control plane's insides (and the
/// control plane, which starts the API, is the only one of the two that imports the other).
pub(crate) trait AdminOps: Send + Sync + 'static {
    /// The snapshot in force.
    fn snapshot(&self) -> Arc<Snapshot>;
    /// The bearer token every route but the probes needs, if configured.
    fn token(&self) -> Arc<Option<String>>;
    /// The Prometheus exposition.
    fn render_metrics(&self) -> String;
    /// The presence table (`/api/v1/minions`).
    fn presence(&self) -> Arc<crate::presence::Presence>;
    /// The fan-out hub serving the publish listener, if one has started and still runs
    /// (`/api/v1/fanout`); it carries its counters.
    fn fanout(&self) -> Option<Arc<crate::fanout::hub::Hub>>;
    /// The recent flips, reloads, admin actions and checks (the status page's history).
    fn events(&self) -> &crate::ops::events::EventLog;
    /// Shutdown has started (the API stays up through the drain).
    fn stopping(&self) -> bool;
    /// Every listener role has a bound listener.
    fn listening(&self) -> bool;
    /// The listener of `role` is bound.
    fn listening_on(&self, role: Role) -> bool;
    /// Counts an admin connection that saltgate closed, by reason.
    fn admin_cut(&self, reason: &'static str);
    /// Clients waiting in the listener's queue (every master at its `maxconn`).
    fn queued(&self, role: Role) -> usize;
    fn drain(&self, name: &str) -> Result<MasterState, AdminError>;
    fn disable(&self, name: &str) -> Result<MasterState, AdminError>;
    fn enable(&self, name: &str) -> Result<MasterState, AdminError>;
    /// Reloads the configuration file (runs to completion even if the caller goes away).
    fn reload(self: Arc<Self>) -> BoxFuture<Result<u64, ApplyError>>;
    /// Each master's `_auth` gate (`listeners.request.auth_limit`), by master name.
    fn auth_limits(&self) -> Vec<crate::continuity::auth_limit::GateView> {
        Vec::new()
    }
}

/// An API error: `{"error": msg}` with `status`.
pub(crate) fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

/// Sessions per page unless `limit` says otherwise.
pub const DEFAULT_PAGE: usize = 1000;
/// The largest `limit`.
pub const MAX_PAGE: usize = 10_000;

/// A listing's `?limit=`: [`DEFAULT_PAGE`] when absent; outside 1..=[`MAX_PAGE`], the message
/// for a 400.
pub(crate) fn page_limit(limit: Option<usize>) -> Result<usize, String> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if (1..=MAX_PAGE).contains(&limit) {
        Ok(limit)
    } else {
        Err(format!(
            "limit={limit} is out of range; use 1 to {MAX_PAGE}"
        ))
    }
}
