//! saltgate: an L4 proxy and load balancer for Salt master clusters, as a library. The `saltgate`
//! binary (`main.rs`) is a thin CLI over [`control::start`].
//!
//! Two planes. The control plane ([`control`] with its [`control::reload`], and [`admin`]) owns the listeners, reload,
//! health checks and admin actions. The data plane is what a connection sees: a listener's
//! [`serve::Serve`] gets each accepted stream with the [`dataplane::DataPlane`] context; the L4
//! [`session`] picks a master with the listener's [`selection::Selector`] over the current
//! [`snapshot::Snapshot`] (waiting in the listener's [`queue`] while every master is at its
//! `maxconn`), connects, registers the session with the master ([`registry`]) and runs
//! [`pump`] until a [`close::CloseReason`]. [`check`] runs the probers and feeds [`health`]; a
//! master that goes DOWN has its sessions closed at a bounded pace.

pub mod accesslog;
pub mod admin;
pub mod check;
pub mod close;
pub mod control;
pub mod ctl;
pub mod dataplane;
pub mod error;
pub mod events;
pub mod failback;
mod flow;
pub mod health;
pub mod listener;
pub mod master;
pub mod metrics;
pub mod notify;
pub mod presence;
pub mod pubhub;
pub mod pump;
pub mod queue;
pub mod ratelimit;
pub mod rebalance;
pub mod registry;
pub mod replay;
pub mod selection;
pub mod serve;
mod session;
pub mod snapshot;
mod splice;
pub mod status_page;
pub mod upstream;

pub use control::reload::ConfigSource;
pub use control::{start, ConfigOverride, Options, Running, StartError};
pub use error::{AdminError, ApplyError};
