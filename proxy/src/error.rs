//! The errors of the control plane's entry points (reload, admin actions), in a leaf module so the
//! admin API and the control plane both name them without importing each other.

use std::net::SocketAddr;
use std::path::PathBuf;

use saltgate_config::ConfigErrors;

use crate::snapshot::NoMasterResolves;

/// Why a configuration could not be put in force. The running one stays.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("invalid configuration:\n{0}")]
    Invalid(ConfigErrors),
    #[error(transparent)]
    Resolve(#[from] NoMasterResolves),
    #[error("cannot listen on {addr} ({what}): {source} (fix: free the port, or change the bind address)")]
    Bind {
        what: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("admin.token_file {path}: {reason} (fix: put the bearer token in that file, readable by saltgate)")]
    Token { path: PathBuf, reason: String },
    #[error("admin: {problem}; {fix}")]
    Exposed { problem: String, fix: String },
    #[error("no configuration file to reload from (saltgate runs the embedded default)")]
    NoSource,
    #[error("saltgate is shutting down: the configuration is not reloaded")]
    Stopping,
}

impl ApplyError {
    /// The `result` label of `saltgate_reloads_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            ApplyError::Invalid(_) | ApplyError::Token { .. } | ApplyError::Exposed { .. } => {
                "invalid"
            }
            _ => "error",
        }
    }
}

/// Why an admin action was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("no master named {0:?}")]
    NoSuchMaster(String),
}
