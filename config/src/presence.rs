//! The `presence:` section: which minion is where (docs/presence.md).
//!
//! ```yaml
//! presence:
//!   enabled: true          # read minion ids on the request port
//!   max_minions: 100000    # table size; the oldest entry goes when it is full
//!   expire_after: 10m      # how long a minion with no session stays listed
//!   inspect_bytes: 16384   # bytes of each request connection looked at, at most
//! ```
//!
//! The model only; reading and writing the section is `yaml_presence.rs` (so the model does not
//! import the YAML reader, which imports the model).

use std::time::Duration;

/// Keys of the section.
pub const KEYS: &[&str] = &["enabled", "max_minions", "expire_after", "inspect_bytes"];

/// Defaults and limits.
pub mod defaults {
    use std::time::Duration;
    pub const MAX_MINIONS: u32 = 100_000;
    /// Largest `max_minions`: an entry costs a few hundred bytes.
    pub const MAX_MINIONS_LIMIT: u32 = 10_000_000;
    pub const EXPIRE_AFTER: Duration = Duration::from_secs(600);
    /// The first 16 KiB of a request connection: a real `_auth` is about 1 KiB.
    pub const INSPECT_BYTES: u32 = 16 * 1024;
    /// Enough for the ZMTP greeting, READY and a small request.
    pub const INSPECT_BYTES_MIN: u32 = 256;
    pub const INSPECT_BYTES_MAX: u32 = 1024 * 1024;
}

/// Presence: minion ids read passively from request connections, paired with the publish
/// session from the same client address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PresenceConfig {
    pub enabled: bool,
    /// Most minions listed; when full, the entry gone longest (or, if none is gone, the one seen
    /// least recently) is evicted.
    pub max_minions: u32,
    /// How long a minion stays listed once it has no session left.
    pub expire_after: Duration,
    /// Bytes of each request connection (client → master) looked at for an id, at most.
    pub inspect_bytes: u32,
}

impl Default for PresenceConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_minions: defaults::MAX_MINIONS,
            expire_after: defaults::EXPIRE_AFTER,
            inspect_bytes: defaults::INSPECT_BYTES,
        }
    }
}
