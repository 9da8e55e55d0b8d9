//! `GET /ready`: the readiness answer for keepalived's `track_script` (through `saltgate ctl
//! ready`), systemd and Kubernetes probes. No token; it exposes the verdict and one fixed line
//! saying why, nothing else (no names, no addresses, no counts).
//!
//! Ready means: shutdown has not started, both listeners are bound and serving, and for each
//! listener at least one master is UP (and enabled) on that port.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use saltgate_config::Role;
use serde_json::json;

use std::sync::Arc;

use super::ops::AdminOps;

type St = State<Arc<dyn AdminOps>>;

/// The verdict and its one line.
pub(crate) fn verdict(s: &dyn AdminOps) -> (bool, &'static str) {
    if s.stopping() {
        return (false, "not ready: shutting down");
    }
    for role in Role::ALL {
        if !s.listening_on(role) {
            return (
                false,
                match role {
                    Role::Publish => "not ready: the publish listener is not bound",
                    Role::Request => "not ready: the request listener is not bound",
                },
            );
        }
    }
    let snap = s.snapshot();
    for role in Role::ALL {
        if !snap
            .masters
            .iter()
            .any(|m| m.is_available() && m.port_is_up(role))
        {
            return (
                false,
                match role {
                    Role::Publish => "not ready: no master is UP on its publish port",
                    Role::Request => "not ready: no master is UP on its request port",
                },
            );
        }
    }
    (
        true,
        "ready: both listeners serve, and a master is UP for each",
    )
}

pub(crate) async fn ready(State(s): St) -> Response {
    let (ok, reason) = verdict(s.as_ref());
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(json!({ "ready": ok, "reason": reason }))).into_response()
}
