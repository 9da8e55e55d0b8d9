//! `GET /api/v1/minions?limit=&after=`: the presence table by minion id, a page at a time (as
//! `/api/v1/sessions`: `next_after` when more follow). Behind the admin token; wired in
//! `admin::router`.
//!
//! Each minion: `id`, `client` (address of its last identified request session),
//! `publish_master` (the master of the publish session from that address; `null` when there is
//! none, when the listener fans out, or when it is ambiguous), `publish_pairing` (`by-address`,
//! `none`, `fanout`, `ambiguous`), `publish_candidates` (only when ambiguous), `request_master`
//! (of its last identified request session), `request_sessions` (identified ones open now),
//! `connected`, `source` (`auth` or `aes`), `first_seen` and `last_seen` (milliseconds since the
//! Unix epoch), and `expires_in_s` once it has no session left.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::admin::ops::{error, page_limit, AdminOps, MAX_PAGE};
use crate::presence::table::{Minion, PublishOf};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MinionFilter {
    /// Minions per page (1 to [`MAX_PAGE`], default [`crate::admin::ops::DEFAULT_PAGE`]).
    limit: Option<usize>,
    /// Only minions with an id after this one (the `next_after` of the previous page).
    after: Option<String>,
}

/// One minion as the API shows it.
pub fn view(id: &str, m: &Minion, publish: &PublishOf, expire: std::time::Duration) -> Value {
    let (master, pairing) = match publish {
        PublishOf::Master(name) => (Some(name.as_str()), "by-address"),
        PublishOf::None => (None, "none"),
        PublishOf::Fanout => (None, "fanout"),
        PublishOf::Ambiguous(_) => (None, "ambiguous"),
    };
    let mut v = json!({
        "id": id,
        "client": m.client.to_string(),
        "publish_master": master,
        "publish_pairing": pairing,
        "request_master": m.request_master,
        "request_sessions": m.request_sessions,
        "connected": m.gone_since.is_none(),
        "source": m.source.as_str(),
        "first_seen": m.first_seen_ms,
        "last_seen": m.last_seen_ms,
    });
    if let PublishOf::Ambiguous(candidates) = publish {
        v["publish_candidates"] = json!(candidates);
    }
    if let Some(since) = m.gone_since {
        let left = expire.saturating_sub(Instant::now().saturating_duration_since(since));
        v["expires_in_s"] = json!(left.as_secs());
    }
    v
}

pub(crate) async fn minions(
    State(s): State<Arc<dyn AdminOps>>,
    q: Result<Query<MinionFilter>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(f) = match q {
        Ok(q) => q,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("{e}; the parameters are limit=1..{MAX_PAGE}, after=<minion id>"),
            )
        }
    };
    let limit = match page_limit(f.limit) {
        Ok(l) => l,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    let p = s.presence();
    if !p.enabled() {
        return error(
            StatusCode::NOT_FOUND,
            "presence is off in this configuration (presence.enabled: false); turn it on to list minions",
        );
    }
    let (expire, _) = p.limits();
    let (page, more, total) = p.page(f.after.as_deref(), limit);
    let list: Vec<Value> = page
        .iter()
        .map(|(id, m, publish)| view(id, m, publish, expire))
        .collect();
    let mut body = json!({ "count": list.len(), "total": total, "minions": list });
    if more {
        if let Some((id, _, _)) = page.last() {
            body["next_after"] = json!(id);
        }
    }
    Json(body).into_response()
}
