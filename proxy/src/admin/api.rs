//! The admin HTTP API (axum on hyper, with tower layers for auth, a request timeout and a
//! concurrency limit): health endpoints, `/metrics`, master state, sessions, drain, disable, enable
//! and reload. Every error is JSON naming the problem. The API stays up through the shutdown drain
//! (`/readyz` answers 503 from its start) and stops when shutdown completes.
//!
//! | route | |
//! |---|---|
//! | `GET /healthz` | the process is alive (no token needed) |
//! | `GET /ready` | 200 or 503 and one line saying why, nothing else ([`ready`]; no token needed) |
//! | `GET /readyz` | 200 when the listeners are bound and a master is UP and enabled, else 503 (also while shutting down) (no token needed) |
//! | `GET /metrics` | Prometheus text format |
//! | `GET /api/v1/masters` | state, sessions per port, last check of every master; clients queued per listener |
//! | `GET /api/v1/sessions?master=&listener=&limit=&after=` | live sessions by id, filtered, a page at a time (`next_after` when more follow) |
//! | `GET /api/v1/minions?limit=&after=` | which minion is where, by minion id, a page at a time ([`crate::admin::presence_api`]) |
//! | `POST /api/v1/masters/{name}/drain\|disable\|enable` | admin actions |
//! | `POST /api/v1/reload` | reload the configuration file |

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use saltgate_config::{defaults, AdminLimits, Role};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::conns;
use super::error::{AdminError, ApplyError};
use super::ops::{error, page_limit, AdminOps, MAX_PAGE};
use super::ready;
use crate::select::master::{CheckReport, MasterState};

/// Longest an admin request may take (a reload resolves names and binds sockets).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Admin requests served at once; more wait.
pub const MAX_CONCURRENT: usize = 16;

type Ops = Arc<dyn AdminOps>;
type St = State<Ops>;

/// How long a client may take to send a request's headers (slowloris), and to start the next
/// request on a kept-alive connection, by default (`admin.header_timeout`).
pub const HEADER_READ_TIMEOUT: Duration = defaults::ADMIN_HEADER_TIMEOUT;
/// A connection is asked to close (after its request in progress) once it has been open this
/// long, by default (`admin.connection_lifetime`).
pub const CONNECTION_LIFETIME: Duration = defaults::ADMIN_CONNECTION_LIFETIME;
/// Connections that have not sent their first byte yet, at once (they hold no slot of
/// [`MAX_CONNECTIONS`]); one more evicts the longest-waiting one. The default of
/// `admin.max_waiting`.
pub const MAX_WAITING: usize = defaults::ADMIN_MAX_WAITING;
/// Admin connections open at once; one more evicts the longest-idle one, or is closed at once
/// when every one has a request in progress (admin/conns.rs). The default of
/// `admin.max_connections`.
pub const MAX_CONNECTIONS: usize = defaults::ADMIN_MAX_CONNECTIONS;

/// Serves the API on `sock` until `stop` is cancelled. A connection waits for its first byte
/// outside the slots (at most `admin.max_waiting` wait), then takes one of at most
/// `admin.max_connections` slots (the longest-idle one is evicted for a new one), each with
/// `admin.header_timeout` (and `admin.unauthenticated_header_timeout` until it has shown the
/// token) and `admin.connection_lifetime`. The limits in force when a connection is accepted
/// apply to it (a reload changes them for later connections).
pub(crate) async fn serve(sock: TcpListener, ops: Ops, stop: CancellationToken) {
    use hyper::server::conn::http1;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;

    let app = router(ops.clone());
    let slots = conns::Slots::new(MAX_CONNECTIONS);
    let waiting = conns::Slots::new(MAX_WAITING);
    let refused = Arc::new(crate::ops::ratelimit::LogLimit::default());
    let conns = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            r = sock.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    tracing::warn!(target: "saltgate_proxy::admin", error = %e, "admin API: accept failed; retrying in 100 ms");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                        _ = stop.cancelled() => break,
                    }
                }
            },
            _ = stop.cancelled() => break,
        };
        let limits: AdminLimits = ops.snapshot().config.admin.limits;
        slots.set_max(limits.max_connections);
        waiting.set_max(limits.max_waiting);
        // Waiting for its first byte, a connection holds no slot (a probe sends its request at
        // once; an idle connection never takes a slot from one). The waiting ones are bounded too:
        // the longest-waiting is evicted for a new one.
        let Ok((waiting_slot, evicted)) = waiting.admit(limits.unauthenticated_header_timeout)
        else {
            continue; // unreachable: a waiting connection has no request in progress
        };
        if evicted {
            ops.admin_cut(conns::Cut::EvictedIdle.as_str());
        }
        let app = app.clone();
        let stop = stop.clone();
        let ops = ops.clone();
        let slots = slots.clone();
        let refused = refused.clone();
        conns.spawn(async move {
            let deadline = tokio::time::sleep(limits.unauthenticated_header_timeout);
            let mut first = [0u8; 1];
            tokio::select! {
                // `peek` waits for a byte (or the end) without taking it (`readable` may wake
                // spuriously).
                r = stream.peek(&mut first) => if !matches!(r, Ok(n) if n > 0) { return },
                _ = deadline => {
                    ops.admin_cut(conns::Cut::HeaderTimeout.as_str());
                    return;
                }
                _ = waiting_slot.conn.evicted.cancelled() => return,
                _ = stop.cancelled() => return,
            }
            drop(waiting_slot);
            let slot = match slots.admit(limits.unauthenticated_header_timeout) {
                Ok((slot, evicted)) => {
                    if evicted {
                        ops.admin_cut(conns::Cut::EvictedIdle.as_str());
                    }
                    slot
                }
                Err(cut) => {
                    ops.admin_cut(cut.as_str());
                    if let Some(left_out) = refused.allow() {
                        tracing::warn!(target: "saltgate_proxy::admin", client = %peer, max = limits.max_connections, left_out, "admin API: every connection has a request in progress; this one is closed at once");
                    }
                    return;
                }
            };
            let conn_state = slot.conn.clone();
            let token = ops.token();
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let busy = conn_state.start(bearer_ok(&token, req.headers()));
                    let fut = app.clone().oneshot(req.map(axum::body::Body::new));
                    async move {
                        let r = fut.await;
                        drop(busy);
                        r
                    }
                });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            let lifetime = tokio::time::sleep(limits.connection_lifetime);
            tokio::pin!(lifetime);
            let mut asked = false;
            loop {
                let deadline = slot.conn.header_deadline();
                tokio::select! {
                    r = conn.as_mut() => {
                        if r.is_err_and(|e| e.is_timeout()) {
                            ops.admin_cut(conns::Cut::HeaderTimeout.as_str());
                        }
                        return;
                    }
                    _ = slot.conn.changed() => {}
                    _ = slot.conn.evicted.cancelled() => return,
                    _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                        ops.admin_cut(conns::Cut::HeaderTimeout.as_str());
                        return;
                    }
                    _ = &mut lifetime, if !asked => {
                        asked = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    _ = stop.cancelled(), if !asked => {
                        asked = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    }
    conns.close();
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, conns.wait()).await;
}

pub(crate) fn router(shared: Ops) -> Router {
    let api = Router::new()
        .route("/metrics", get(metrics))
        .route("/api/v1/masters", get(masters))
        .route("/api/v1/sessions", get(sessions))
        .route("/api/v1/minions", get(crate::admin::presence_api::minions))
        .route(
            "/api/v1/fanout",
            get(crate::admin::fanout_view::fanout_view),
        )
        .route("/api/v1/masters/{name}/{action}", post(master_action))
        .route("/api/v1/reload", post(reload))
        .route("/api/v1/events", get(crate::admin::status_page::events))
        .route_layer(middleware::from_fn_with_state(shared.clone(), auth));
    Router::new()
        .route("/healthz", get(|| async { Json(json!({ "status": "alive" })) }))
        .route("/ready", get(ready::ready))
        .route("/readyz", get(readyz))
        .route("/", get(crate::admin::status_page::page))
        .merge(api)
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such route; see GET /api/v1/masters, /api/v1/sessions, /api/v1/minions, /api/v1/fanout, /metrics, /healthz, /ready, /readyz") })
        .method_not_allowed_fallback(|| async { error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route (actions and reload are POST, the rest GET)") })
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, REQUEST_TIMEOUT))
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(MAX_CONCURRENT))
        .with_state(shared)
}

/// Constant-time comparison, so the token cannot be guessed byte by byte from response times.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The request carries the configured bearer token (false when none is configured).
fn bearer_ok(token: &Option<String>, headers: &header::HeaderMap) -> bool {
    token.as_ref().is_some_and(|want| {
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|g| same(g.as_bytes(), want.as_bytes()))
    })
}

async fn auth(State(s): St, req: Request, next: Next) -> Response {
    let token = s.token();
    if let Some(want) = token.as_ref() {
        let got = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !got.is_some_and(|g| same(g.as_bytes(), want.as_bytes())) {
            return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token (send 'Authorization: Bearer <token from admin.token_file>')");
        }
    }
    next.run(req).await
}

/// Open to anyone (load balancers probe it): master names only with a valid token.
async fn readyz(State(s): St, headers: header::HeaderMap) -> Response {
    let snap = s.snapshot();
    let up: Vec<String> = snap
        .masters
        .iter()
        .filter(|m| m.is_available())
        .map(|m| m.name())
        .collect();
    let listening = s.listening();
    let stopping = s.stopping();
    let ready = !up.is_empty() && listening && !stopping;
    let token = s.token();
    let authorized = token.as_ref().as_ref().is_some_and(|want| {
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|g| same(g.as_bytes(), want.as_bytes()))
    });
    let mut body = json!({ "ready": ready, "masters_up": up.len(), "masters": snap.masters.len(), "listening": listening, "stopping": stopping });
    if authorized {
        body["masters_up_names"] = json!(up);
    }
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

async fn metrics(State(s): St) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.render_metrics(),
    )
        .into_response()
}

#[derive(Serialize)]
struct PortView {
    addr: String,
    up: bool,
    sessions: u32,
    last_check: CheckReport,
}

#[derive(Serialize)]
pub(crate) struct MasterView {
    name: String,
    host: String,
    state: MasterState,
    weight: u32,
    backup: bool,
    publish: PortView,
    request: PortView,
}

fn view(m: &crate::select::master::Master) -> MasterView {
    let port = |r: Role| PortView {
        addr: m.addr(r).to_string(),
        up: m.port_is_up(r),
        sessions: m.session_count(r),
        last_check: m.last_check(r),
    };
    let cfg = m.cfg();
    MasterView {
        name: cfg.name.clone(),
        host: cfg.host.clone(),
        state: m.state(),
        weight: cfg.weight,
        backup: cfg.backup,
        publish: port(Role::Publish),
        request: port(Role::Request),
    }
}

async fn masters(State(s): St) -> Response {
    let snap = s.snapshot();
    let list: Vec<MasterView> = snap.masters.iter().map(|m| view(m)).collect();
    let queued = json!({ "publish": s.queued(Role::Publish), "request": s.queued(Role::Request) });
    let auth = s.auth_limits();
    Json(json!({ "generation": snap.generation, "masters": list, "queued": queued, "auth_limit": auth }))
        .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionFilter {
    master: Option<String>,
    listener: Option<String>,
    /// Sessions per page (1 to [`MAX_PAGE`], default [`DEFAULT_PAGE`]).
    limit: Option<usize>,
    /// Only sessions with a greater id (the `next_after` of the previous page).
    after: Option<u64>,
}

/// Live sessions by id, a page at a time: each master's book gives at most `limit` sessions above
/// `after` (a short hold of its lock, no copy of the whole book), merged and cut to `limit`.
async fn sessions(
    State(s): St,
    q: Result<Query<SessionFilter>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(f) = match q {
        Ok(q) => q,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("{e}; the parameters are master=<name>, listener=publish|request, limit=1..{MAX_PAGE}, after=<session id>"),
            )
        }
    };
    let role = match f.listener.as_deref() {
        None => None,
        Some("publish") => Some(Role::Publish),
        Some("request") => Some(Role::Request),
        Some(other) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("unknown listener {other:?}; use publish or request"),
            )
        }
    };
    let limit = match page_limit(f.limit) {
        Ok(l) => l,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    let after = f.after.unwrap_or(0);
    let snap = s.snapshot();
    if let Some(name) = &f.master {
        if snap.master(name).is_none() {
            return error(StatusCode::NOT_FOUND, format!("no master named {name:?}"));
        }
    }
    let mut page = Vec::new();
    for m in snap
        .masters
        .iter()
        .filter(|m| f.master.as_ref().is_none_or(|n| *n == m.cfg().name))
    {
        let name = m.name();
        // `limit + 1`: one more tells whether another page follows.
        for c in m.book.page(role, after, limit + 1) {
            page.push((c, name.clone()));
        }
    }
    page.sort_by_key(|(c, _)| c.id);
    let more = page.len() > limit;
    page.truncate(limit);
    let next_after = if more {
        page.last().map(|(c, _)| c.id)
    } else {
        None
    };
    let out: Vec<_> = page
        .iter()
        .map(|(c, master)| {
            json!({
                "id": c.id,
                "master": master,
                "listener": c.role.as_str(),
                "client": c.client.to_string(),
                "age_s": c.started.elapsed().as_secs(),
                "bytes_in": c.bytes_in.load(std::sync::atomic::Ordering::Relaxed),
                "bytes_out": c.bytes_out.load(std::sync::atomic::Ordering::Relaxed),
            })
        })
        .collect();
    let mut body = json!({ "count": out.len(), "sessions": out });
    if let Some(n) = next_after {
        body["next_after"] = json!(n);
    }
    Json(body).into_response()
}

async fn master_action(State(s): St, Path((name, action)): Path<(String, String)>) -> Response {
    let r = match action.as_str() {
        "drain" => s.drain(&name),
        "disable" => s.disable(&name),
        "enable" => s.enable(&name),
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("unknown action {other:?}; use drain, disable or enable"),
            )
        }
    };
    match r {
        Ok(state) => {
            s.events().admin(&name, &action, state.as_str());
            Json(json!({ "master": name, "action": action, "state": state })).into_response()
        }
        Err(AdminError::NoSuchMaster(n)) => {
            let names: Vec<String> = s.snapshot().masters.iter().map(|m| m.name()).collect();
            (
                StatusCode::NOT_FOUND,
                Json(json!({ "error": format!("no master named {n:?}"), "masters": names })),
            )
                .into_response()
        }
    }
}

async fn reload(State(s): St) -> Response {
    // In its own task: if the request times out or the client goes away, the reload still
    // completes (and systemd still gets READY=1).
    let task = tokio::spawn(s.reload());
    let Ok(result) = task.await else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the reload task failed; see the log",
        );
    };
    match result {
        Ok(g) => Json(json!({ "result": "ok", "generation": g })).into_response(),
        Err(e @ ApplyError::NoSource) => error(StatusCode::CONFLICT, e.to_string()),
        Err(e @ ApplyError::Stopping) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(e @ ApplyError::Invalid(_)) | Err(e @ ApplyError::Token { .. }) => {
            error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
