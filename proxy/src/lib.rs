//! saltgate: an L4 proxy and load balancer for Salt master clusters, as a library. The `saltgate`
//! binary (`main.rs`) is a thin CLI over [`control::start`].
//!
//! The folders are the planes (docs/architecture.md has the map):
//!
//! - [`control`]: owns everything: the listeners, reload, discovery, the checkers' events, the
//!   admin actions and the two-phase shutdown. Nothing below imports it.
//! - [`admin`]: the HTTP API, the status page, the fan-out view, the presence API, `ctl`. It
//!   reaches the running proxy through [`admin::ops::AdminOps`], which the control plane
//!   implements.
//! - [`session`]: what a listener does with an accepted connection: the [`session::serve::Serve`]
//!   trait, the [`session::context::DataPlane`] context, the L4 session (select a master with
//!   the listener's selector over the current [`select::snapshot::Snapshot`], waiting in the
//!   listener's queue while every master is at its `maxconn`; connect; register; pump).
//! - [`fanout`]: the publish fan-out hub (a `Serve`). [`continuity`]: request migration
//!   (`on_master_down: migrate`), where request policies go. [`presence`]: which minion is where.
//! - [`select`]: masters, health checks ([`select::check`] feeds [`select::health`]), selection,
//!   failback, rebalance, the snapshot. [`ops`]: metrics, events, the access log, notify, log
//!   rate limits.
//! - [`data`]: the data path, a leaf: accept, buffers, the pump, splice, the session book, the
//!   queue, close reasons.
//!
//! No module imports another in a circle; `scripts/modgraph` prints the graph and checks it.

pub mod admin;
pub mod continuity;
pub mod control;
pub mod data;
pub mod fanout;
pub mod ops;
pub mod presence;
pub mod select;
pub mod session;

// The paths of the flat layout this crate had, kept for the tests, the bench and other crates.
pub use admin::{ctl, error, status_page};
pub use data::{close, listener, pump, queue, registry};
pub use ops::{accesslog, events, metrics, notify, ratelimit};
pub use select::{check, failback, health, master, rebalance, selection, snapshot, upstream};
pub use session::serve;

pub use control::reload::ConfigSource;
pub use control::{start, ConfigOverride, Options, Running, StartError};
pub use error::{AdminError, ApplyError};
