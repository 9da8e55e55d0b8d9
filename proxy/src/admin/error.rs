//! The errors of the control plane's entry points (reload, admin actions), in a leaf module so the
//! admin API and the control plane both name them without importing each other.

use std::net::SocketAddr;
use std::path::PathBuf;

use saltgate_config::ConfigErrors;

use crate::select::snapshot::NoMasterResolves;

/// Why a configuration could not be put in force. The running one stays.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("invalid configuration:\n{0}")]
    Invalid(ConfigErrors),
    #[error(transparent)]
    Resolve(#[from] NoMasterResolves),
    /// `reason` is printed in the message and deliberately not a `#[source]`: a chain printer
    /// (`anyhow`'s `{:#}`) would print the OS error twice.
    #[error(
        "cannot listen on {addr} ({what}): {reason}; free the port, or change the bind address (to share a port between saltgate processes, set reuse_port: true on the listener in each)"
    )]
    Bind {
        what: String,
        addr: SocketAddr,
        reason: std::io::Error,
    },
    #[error("admin.token_file {path}: {reason}; put the bearer token in that file, readable by saltgate")]
    Token { path: PathBuf, reason: String },
    #[error("admin: {problem}; {fix}")]
    Exposed { problem: String, fix: String },
    #[error("no configuration file to reload from (saltgate runs the embedded default); start saltgate with --config FILE to reload")]
    NoSource,
    #[error("saltgate is shutting down: the configuration is not reloaded; start saltgate again to apply it")]
    Stopping,
    /// `mode: fanout` over masters that sign with different keys (`pubhub::cluster_check`).
    #[error("{0}")]
    NotOneCluster(String),
}

impl ApplyError {
    /// The `result` label of `saltgate_reloads_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            ApplyError::Invalid(_)
            | ApplyError::Token { .. }
            | ApplyError::Exposed { .. }
            | ApplyError::NotOneCluster(_) => "invalid",
            _ => "error",
        }
    }
}

/// Why an admin action was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(
        "no master named {0:?}; see GET /api/v1/masters (or saltgate ctl status) for the names"
    )]
    NoSuchMaster(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bind_error_prints_the_os_error_once_even_through_its_chain() {
        let e = ApplyError::Bind {
            what: "request".into(),
            addr: "127.0.7.1:4506".parse().unwrap(),
            reason: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        let chain = format!("{:#}", anyhow::Error::from(e));
        assert_eq!(chain.matches("address in use").count(), 1, "{chain}");
        assert!(chain.contains("; free the port"), "{chain}");
    }
}
