//! `GET /api/v1/fanout`: what the publish fan-out hub is doing now — its upstreams (one per
//! master whose publish port passes its checks), the minion sessions that drop messages at their
//! high-water mark, and the dedup's state. The counters are the same as `saltgate_fanout_*` on
//! `/metrics`; this view adds what a counter cannot hold (addresses, states, since when).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use saltgate_config::ListenerMode;
use saltgate_wire::publish_job::JobIdError;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::admin::ops::{error, AdminOps};
use crate::fanout::hub::Hub;

/// Sessions listed in `sessions_dropping` by default, and at most.
const DROPPING_DEFAULT: usize = 50;
const DROPPING_MAX: usize = 1000;

fn unix(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The view as JSON (`limit`: how many dropping sessions to list, most drops first).
pub(crate) fn render(
    hub: Option<Arc<Hub>>,
    snap: &crate::select::snapshot::Snapshot,
    limit: usize,
) -> Value {
    let publish = &snap.config.publish;
    let mode = publish.mode.as_str();
    let Some((hub, m)) = hub
        .filter(|_| publish.mode == ListenerMode::Fanout)
        .and_then(|h| Some((h.clone(), h.metrics()?.clone())))
    else {
        return json!({
            "mode": mode,
            "running": false,
            "note": if publish.mode == ListenerMode::Fanout {
                "the hub starts with the first minion session"
            } else {
                "the publish listener is in l4 mode: no hub (set listeners.publish.mode: fanout)"
            },
        });
    };
    let upstreams: Vec<Value> = hub
        .upstreams
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(name, u)| {
            json!({
                "master": name,
                "addr": u.addr.to_string(),
                "connected": u.connected,
                "since": unix(u.since),
                "last_error": u.last_error,
                "messages": m.upstream_messages.with_label_values(&[name]).get(),
                "duplicates_dropped": m.duplicates.with_label_values(&[name]).get(),
            })
        })
        .collect();
    let mut dropping: Vec<(u64, SocketAddr, usize)> = hub
        .sessions()
        .values()
        .filter_map(|s| {
            let d = s.dropped.load(Ordering::Relaxed);
            (d > 0).then(|| (d, s.peer, s.queue.len()))
        })
        .collect();
    let dropping_total = dropping.len();
    dropping.sort_by_key(|d| std::cmp::Reverse(d.0));
    let dropping: Vec<Value> = dropping
        .into_iter()
        .take(limit)
        .map(
            |(d, peer, queued)| json!({"client": peer.to_string(), "dropped": d, "queued": queued}),
        )
        .collect();
    let keys = hub.dedup.key.keys();
    let now = Instant::now();
    let previous_for = keys
        .previous
        .as_ref()
        .and_then(|(_, until)| until.checked_duration_since(now))
        .map(|d| d.as_secs_f64());
    let unreadable: serde_json::Map<String, Value> = JobIdError::ALL
        .iter()
        .map(|e| (e.label().to_string(), json!(m.unreadable(*e).get())))
        .collect();
    json!({
        "mode": mode,
        "running": true,
        "hwm": publish.hwm,
        "sessions": hub.sessions().len(),
        "upstreams_connected": hub.connected.load(Ordering::Relaxed),
        "upstreams": upstreams,
        "messages_fanned": m.fanned.get(),
        "messages_dropped": m.dropped.get(),
        "sessions_dropping_total": dropping_total,
        "sessions_dropping": dropping,
        "dedup": {
            "enabled": publish.dedup_cluster_pki_dir.is_some(),
            "cluster_pki_dir": publish.dedup_cluster_pki_dir.as_ref().map(|d| d.display().to_string()),
            "key_loaded": keys.current.is_some(),
            "previous_key_valid_for_s": previous_for,
            "key_loads": m.key_loads.get(),
            "jobs_remembered": hub.dedup.remembered(),
            "window_s": crate::fanout::dedup::WINDOW.as_secs(),
            "max_remembered": crate::fanout::dedup::MAX_REMEMBERED,
            "unreadable": unreadable,
        },
        "replay": replay_view(&hub, &m),
    })
}

/// `listeners.publish.replay_window`: what is kept for returning sessions, and what was sent.
fn replay_view(hub: &Hub, m: &crate::fanout::FanoutMetrics) -> Value {
    let (jobs, bytes, departed) = hub.replay.sizes();
    let peer = hub.replay.peer();
    let peer = hub.replay.peer_addr().map(|addr| {
        json!({
            "addr": addr.to_string(),
            "ready": peer.ready,
            "last_ready_s_ago": peer.last_ready.map(|t| t.elapsed().as_secs_f64()),
            "checks": peer.checks,
        })
    });
    json!({
        "peer": peer,
        "enabled": hub.replay.enabled(),
        "window_s": hub.replay.window().map(|w| w.as_secs_f64()),
        "jobs_kept": jobs,
        "bytes_kept": bytes,
        "sessions_remembered": departed,
        "replays": m.replays.get(),
        "jobs_replayed": m.replayed_jobs.get(),
        "late_identity_replays": m.late_replays.get(),
        "sessions_awaiting_identity": hub.awaiting_identity.load(std::sync::atomic::Ordering::Relaxed),
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FanoutQuery {
    limit: Option<usize>,
}

/// `GET /api/v1/fanout[?limit=N]`.
pub(crate) async fn fanout_view(
    State(s): State<Arc<dyn AdminOps>>,
    q: Result<Query<FanoutQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let limit = match q {
        Ok(Query(FanoutQuery { limit: None })) => DROPPING_DEFAULT,
        Ok(Query(FanoutQuery { limit: Some(n) })) if (1..=DROPPING_MAX).contains(&n) => n,
        Ok(Query(FanoutQuery { limit: Some(n) })) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("limit={n} is out of range; use limit=1..{DROPPING_MAX} (sessions that drop, most drops first)"),
            )
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("{e}; the only parameter is limit=1..{DROPPING_MAX}"),
            )
        }
    };
    Json(render(s.fanout(), &s.snapshot(), limit)).into_response()
}
