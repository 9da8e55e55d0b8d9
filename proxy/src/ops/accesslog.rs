//! The access log as a typed sink: one [`AccessRecord`] per closed session (listener
//! `access_log: true`), handed to an [`AccessSink`]. The default sink writes it as a structured
//! tracing event on target `saltgate::access` (text or JSON, per `--log-format`), like HAProxy's
//! tcplog; tests pass a [`MemorySink`] and read the records directly.

use std::net::SocketAddr;
use std::sync::Mutex;

use saltgate_config::Role;

use crate::data::close::CloseReason;

/// What the access log says about one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessRecord {
    pub client: SocketAddr,
    pub listener: Role,
    /// The master that served the session, if any.
    pub master: Option<String>,
    pub master_addr: Option<SocketAddr>,
    /// Accept to close.
    pub duration_ms: u64,
    /// Time spent connecting to masters.
    pub connect_ms: u64,
    /// Connect attempts made.
    pub attempts: u32,
    /// Client → master.
    pub bytes_in: u64,
    /// Master → client.
    pub bytes_out: u64,
    pub reason: CloseReason,
    /// Request sessions with `on_master_down: migrate`: times moved to another master.
    pub migrations: u32,
    /// Why it was not moved when its master went (see docs/request-continuity.md), if so.
    pub migrate_skip: Option<&'static str>,
}

/// Where access records go.
pub trait AccessSink: Send + Sync + 'static {
    fn record(&self, r: AccessRecord);
}

/// The default: one tracing event per record, target `saltgate::access`, level INFO.
#[derive(Debug, Default, Clone, Copy)]
pub struct TracingSink;

impl AccessSink for TracingSink {
    fn record(&self, r: AccessRecord) {
        tracing::info!(target: "saltgate::access",
            client = %r.client,
            listener = %r.listener,
            master = %r.master.as_deref().unwrap_or("-"),
            master_addr = %r.master_addr.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
            duration_ms = r.duration_ms,
            connect_ms = r.connect_ms,
            attempts = r.attempts,
            bytes_in = r.bytes_in,
            bytes_out = r.bytes_out,
            reason = %r.reason,
            migrations = r.migrations,
            migrate_skip = r.migrate_skip.unwrap_or("-"),
            "session closed"
        );
    }
}

/// Keeps every record in memory (for tests).
#[derive(Debug, Default)]
pub struct MemorySink {
    records: Mutex<Vec<AccessRecord>>,
}

impl MemorySink {
    /// The records so far, oldest first.
    pub fn records(&self) -> Vec<AccessRecord> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl AccessSink for MemorySink {
    fn record(&self, r: AccessRecord) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(r);
    }
}
