//! Cluster fan-out for the publish listener (`listeners.publish.mode: fanout`, issue 13).
//!
//! saltgate terminates ZMTP with each minion: it is the minion's PUB peer (`session`). It keeps
//! one upstream SUB connection, subscribed to everything, to every master that is UP in the
//! current snapshot (`upstream`), and relays every message from every master to every minion
//! session whose subscriptions match the first frame. A message is encoded once into a shared
//! [`Bytes`]; each session has a bounded queue (the high-water mark, Salt's `pub_hwm` default
//! 1000): a full queue drops and counts for that session only, so a stalled minion never delays
//! the others. A master that dies or goes DOWN removes one upstream; no minion session closes.
//!
//! The upstreams open with the first minion session (a hub with no minion has nothing to relay)
//! or, with `replay_window` set, as soon as the listener starts (a backup node keeps its window
//! warm with no minion on it), and stop when the hub is dropped (a reload to `mode: l4`) or at
//! shutdown. `replay` keeps the last jobs for minions whose session comes back.
//!
//! [`pubhub::PubHub`] is the listener's `Serve`; [`hub::Hub`] the state its sessions and
//! upstreams share; the admin view is `crate::admin::fanout_view`.

pub mod cluster_check;
mod clusterkey;
pub(crate) mod dedup;
pub mod hub;
mod late;
pub mod metrics;
pub mod pubhub;
mod queue;
pub(crate) mod replay;
mod session;
mod steady;
mod upstream;

pub use hub::{FanReport, HubHandles, HubOptions};
pub use metrics::FanoutMetrics;
pub use pubhub::PubHub;
