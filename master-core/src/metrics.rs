//! What saltgate-master counts, and the Prometheus text endpoint that shows it (opt-in:
//! `saltgate_metrics_bind`, a saltgate extension; Salt's master has no such endpoint).
//!
//! Every refusal is counted by reason ([`Refused`]) where it is logged, so the log line and the
//! counter never disagree. The request port's outcomes ([`RequestCounters`]), the ZMTP ports'
//! protocol refusals (wire's [`ProtocolRefusals`]), the publisher and the cluster's peer links
//! are read when scraped.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use saltgate_wire::accept::{AcceptOptions, Acceptor};
use saltgate_wire::transport::{
    AnyPublishServer, AnyReplier, ProtocolRefusals, PublishServer, Replier,
};
use tokio::net::TcpListener;

use crate::jobbook::JobBook;
use crate::peerlink::PeerStats;

/// Why a request, a connection or a peer message was refused. Each has a `reason` label and the
/// port it happens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// A clear command other than `_auth` and `ping` (the class of CVE-2020-11651).
    ClearCommand,
    /// A clear request over `saltgate_max_clear_load` (refused, not echoed).
    ClearTooLarge,
    /// A cluster peer connection that sent no authenticated frame within
    /// `saltgate_cluster_auth_timeout` (closed).
    PeerAuthTimeout,
    /// A cluster peer connection over `saltgate_cluster_max_unauthenticated` (closed at once).
    PeerUnauthenticatedCap,
    /// Not a Salt request: not msgpack, not a map, no `enc` or `load`, an unknown `enc` or
    /// algorithm, a load of the wrong type, an `_auth` without a nonce.
    Malformed,
    /// A request below Salt's `minimum_auth_version` (3).
    ProtocolVersion,
    /// A minion id that could be a path (`/`, `\`, `..`, NUL, control characters, > 255 bytes).
    InvalidId,
    /// An encrypted request from an id with no session key (it must `_auth` again).
    NoSession,
    /// An encrypted request that does not decrypt with its id's session key.
    Undecryptable,
    /// A missing or malformed request nonce.
    BadNonce,
    /// The load's `id` differs from the envelope's.
    IdMismatch,
    /// No `tok`, or one that does not verify against the accepted key.
    BadTok,
    /// An encrypted request from an id whose key is not (or no longer) accepted.
    NotAccepted,
    /// A request whose `ts` is outside the request window.
    Stale,
    /// A nonce seen before (a replayed request).
    Replayed,
    /// An `_auth` whose public key does not parse.
    AuthUnusableKey,
    /// An `_auth` from a rejected key.
    AuthRejected,
    /// An `_auth` whose key differs from the stored one (the key goes to `minions_denied`).
    AuthDenied,
    /// A message on the request port without the REQ envelope.
    NotReq,
    /// A return for a job this master does not know, or without a jid.
    UnknownJob,
    /// A file server path with `..`, an absolute path or NUL.
    FilePath,
    /// A cluster message that failed authentication or its checks.
    PeerMessage,
    /// A cluster join refused (wrong secret, bad signature, unsafe id, stale, other cluster).
    PeerJoin,
    /// A cluster frame over the peer message limit (the connection is closed).
    PeerOversized,
    /// Our own failure to answer (the key store, signing): the minion gets Salt's error reply.
    MasterError,
    /// Our own failure to handle a peer message (its handler failed).
    PeerMasterError,
}

impl Refused {
    pub const ALL: [Refused; 26] = [
        Refused::ClearCommand,
        Refused::ClearTooLarge,
        Refused::PeerAuthTimeout,
        Refused::PeerUnauthenticatedCap,
        Refused::Malformed,
        Refused::ProtocolVersion,
        Refused::InvalidId,
        Refused::NoSession,
        Refused::Undecryptable,
        Refused::BadNonce,
        Refused::IdMismatch,
        Refused::BadTok,
        Refused::NotAccepted,
        Refused::Stale,
        Refused::Replayed,
        Refused::AuthUnusableKey,
        Refused::AuthRejected,
        Refused::AuthDenied,
        Refused::NotReq,
        Refused::UnknownJob,
        Refused::FilePath,
        Refused::PeerMessage,
        Refused::PeerJoin,
        Refused::PeerOversized,
        Refused::MasterError,
        Refused::PeerMasterError,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refused::ClearCommand => "clear_command",
            Refused::ClearTooLarge => "clear_too_large",
            Refused::PeerAuthTimeout => "auth_timeout",
            Refused::PeerUnauthenticatedCap => "unauthenticated_cap",
            Refused::Malformed => "malformed",
            Refused::ProtocolVersion => "protocol_version",
            Refused::InvalidId => "invalid_id",
            Refused::NoSession => "no_session",
            Refused::Undecryptable => "undecryptable",
            Refused::BadNonce => "bad_nonce",
            Refused::IdMismatch => "id_mismatch",
            Refused::BadTok => "bad_tok",
            Refused::NotAccepted => "not_accepted",
            Refused::Stale => "stale",
            Refused::Replayed => "replayed",
            Refused::AuthUnusableKey => "auth_unusable_key",
            Refused::AuthRejected => "auth_rejected",
            Refused::AuthDenied => "auth_denied",
            Refused::NotReq => "not_req",
            Refused::UnknownJob => "unknown_job",
            Refused::FilePath => "file_path",
            Refused::PeerMessage => "peer_message",
            Refused::PeerJoin => "peer_join",
            Refused::PeerOversized => "oversized",
            Refused::MasterError | Refused::PeerMasterError => "master_error",
        }
    }

    /// The `port` label: where the refusal happens.
    pub fn port(self) -> &'static str {
        match self {
            Refused::PeerMessage
            | Refused::PeerJoin
            | Refused::PeerOversized
            | Refused::PeerAuthTimeout
            | Refused::PeerUnauthenticatedCap
            | Refused::PeerMasterError => "cluster",
            _ => "request",
        }
    }
}

/// Refusals so far, by [`Refused`].
#[derive(Debug, Default)]
pub struct Refusals([AtomicU64; Refused::ALL.len()]);

impl Refusals {
    pub const fn new() -> Self {
        Refusals([const { AtomicU64::new(0) }; Refused::ALL.len()])
    }

    pub fn count(&self, r: Refused) {
        self.0[r as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, r: Refused) -> u64 {
        self.0[r as usize].load(Ordering::Relaxed)
    }
}

/// What became of the requests received on the request port (logged every 10 s while they
/// change, and at shutdown; exported as `saltgate_master_requests_total`).
#[derive(Debug, Default)]
pub struct RequestCounters {
    pub received: AtomicU64,
    /// Not a REQ envelope.
    pub not_req: AtomicU64,
    /// The sender had disconnected before a handler was free (it retries on a new connection).
    pub sender_gone: AtomicU64,
    pub replied: AtomicU64,
    /// Waited longer than its sender waits for it (`request::AUTH_MAX_WAIT`,
    /// `REQUEST_MAX_WAIT`): skipped, not answered.
    pub expired: AtomicU64,
    /// Handled, but the sender had gone by the time of the reply.
    pub undelivered: AtomicU64,
    /// The handler task failed.
    pub failed: AtomicU64,
}

impl RequestCounters {
    /// What became of the requests received, each `outcome` once (they add up to the
    /// received ones, but for those being handled).
    fn outcomes(&self) -> [(&'static str, u64); 6] {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("replied", g(&self.replied)),
            ("sender_gone", g(&self.sender_gone)),
            ("expired", g(&self.expired)),
            ("undelivered", g(&self.undelivered)),
            ("not_req", g(&self.not_req)),
            ("failed", g(&self.failed)),
        ]
    }

    pub fn total(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    pub fn log(&self, paused: u64) {
        let o = self.outcomes();
        tracing::info!(
            received = self.total(),
            replied = o[0].1,
            sender_gone = o[1].1,
            expired = o[2].1,
            undelivered = o[3].1,
            not_req = o[4].1,
            failed = o[5].1,
            paused_peers = paused,
            "request counters"
        );
    }
}

/// Everything the endpoint reads.
pub struct Sources {
    pub refusals: Arc<Refusals>,
    /// The publish port's socket, if bound.
    pub publisher: Option<Arc<AnyPublishServer>>,
    /// Returns not cached.
    pub jobs: Arc<JobBook>,
    /// The cluster's peer links, in a cluster.
    pub peers: Option<Arc<PeerStats>>,
    pub requests: Arc<RequestCounters>,
    pub router: AnyReplier,
    pub router_refusals: Arc<ProtocolRefusals>,
}

/// Writes one metric family: its HELP and TYPE lines, then a sample per `(labels, value)`, the
/// labels already formatted (`port="request",reason="bad_tok"`, or empty).
fn family(
    out: &mut String,
    (name, kind, help): (&str, &str, &str),
    samples: impl IntoIterator<Item = (String, u64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = if labels.is_empty() {
            writeln!(out, "{name} {value}")
        } else {
            writeln!(out, "{name}{{{labels}}} {value}")
        };
    }
}

/// The Prometheus text exposition (format 0.0.4) of everything counted.
pub fn render(src: &Sources) -> String {
    let mut out = String::with_capacity(4096);
    let refusal =
        |port: &str, reason: &str, n: u64| (format!("port=\"{port}\",reason=\"{reason}\""), n);
    let mut refusals: Vec<(String, u64)> = Refused::ALL
        .iter()
        .map(|r| refusal(r.port(), r.label(), src.refusals.get(*r)))
        .collect();
    let publish = src.publisher.as_ref().map(|p| p.refusals());
    for (port, wire) in [
        ("request", Some(&src.router_refusals)),
        ("publish", publish.as_ref()),
    ] {
        if let Some(w) = wire {
            for (reason, n) in w.by_reason() {
                let reason = if reason == "malformed" {
                    "zmtp_protocol"
                } else {
                    reason
                };
                refusals.push(refusal(port, reason, n));
            }
        }
    }
    family(
        &mut out,
        (
            "saltgate_master_refusals_total",
            "counter",
            "Requests, connections and peer messages refused, by port and reason (each is logged).",
        ),
        refusals,
    );
    family(
        &mut out,
        (
            "saltgate_master_requests_received_total",
            "counter",
            "Requests received on the request port.",
        ),
        [(String::new(), src.requests.total())],
    );
    family(
        &mut out,
        (
            "saltgate_master_requests_total",
            "counter",
            "What became of the requests received on the request port, by outcome.",
        ),
        src.requests
            .outcomes()
            .map(|(outcome, n)| (format!("outcome=\"{outcome}\""), n)),
    );
    let mut connections = vec![(
        "port=\"request\"".to_string(),
        src.router.peer_count() as u64,
    )];
    if let Some(p) = &src.publisher {
        connections.push(("port=\"publish\"".to_string(), p.subscriber_count() as u64));
    }
    family(
        &mut out,
        (
            "saltgate_master_connections",
            "gauge",
            "Connected ZMTP peers: minions on the request port, subscribers on the publish port.",
        ),
        connections,
    );
    family(
        &mut out,
        (
            "saltgate_master_publish_dropped_total",
            "counter",
            "Publishes dropped because a subscriber's queue was full.",
        ),
        src.publisher
            .as_ref()
            .map(|p| (String::new(), p.dropped_total())),
    );
    family(
        &mut out,
        (
            "saltgate_master_returns_not_cached_total",
            "counter",
            "Returns of known jobs the job cache could not store (each is logged; the waiting publish still gets them).",
        ),
        [(
            String::new(),
            src.jobs.returns_not_cached.load(Ordering::Relaxed),
        )],
    );
    if let Some(peers) = &src.peers {
        family(
            &mut out,
            (
                "saltgate_master_peer_frames_total",
                "counter",
                "Cluster peer link frames, by event (docs/master.md, \"Cluster\").",
            ),
            peers
                .snapshot()
                .map(|(event, n)| (format!("event=\"{event}\""), n)),
        );
    }
    out
}

/// Longest a scrape connection may take to send its request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a scrape connection may live (one request: no keep-alive), so a client that stops
/// reading its answer frees its slot.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// Scrape connections served at once; more wait in the accept queue.
const MAX_CONNECTIONS: usize = 16;

/// Serves `GET /metrics` (anything else: 404), one request per connection, until the task is
/// dropped (which drops the connections too).
pub async fn serve(listener: TcpListener, src: Arc<Sources>) {
    use hyper::server::conn::http1;
    use hyper_util::rt::{TokioIo, TokioTimer};

    let mut acceptor = Acceptor::new(
        listener,
        AcceptOptions {
            keepalive: None,
            ..AcceptOptions::default()
        },
    )
    .with_max_connections(Some(MAX_CONNECTIONS));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, _peer, permit) = acceptor.accept().await;
        while connections.try_join_next().is_some() {}
        let src = src.clone();
        connections.spawn(async move {
            let _permit = permit;
            let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                let src = src.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&req, &src)) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
        });
    }
}

fn answer<B>(
    req: &hyper::Request<B>,
    src: &Sources,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    use hyper::{header, Method, StatusCode};
    let (status, kind, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, "text/plain; version=0.0.4", render(src)),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET /metrics only\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "saltgate-master serves GET /metrics only\n".to_string(),
        ),
    };
    let mut r = hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(kind) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_counter_and_a_unique_port_and_label() {
        let r = Refusals::new();
        for (i, kind) in Refused::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i, "ALL is in declaration order");
            r.count(*kind);
            assert_eq!(r.get(*kind), 1, "{kind:?}");
        }
        let mut seen: Vec<(&str, &str)> =
            Refused::ALL.iter().map(|k| (k.port(), k.label())).collect();
        // wire's, added by render()
        for port in ["request", "publish"] {
            seen.extend([(port, "oversized"), (port, "zmtp_protocol")]);
        }
        let n = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), n, "a (port, reason) pair used twice");
    }
}
