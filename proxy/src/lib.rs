//! saltgate: an L4 proxy and load balancer for Salt master clusters, as a library. The `saltgate`
//! binary (`main.rs`) is a thin CLI over [`server::start`].
//!
//! Data flow: [`listener`] accepts → [`session`] picks a master with the listener's
//! [`selection::Selector`] over the current [`snapshot::Snapshot`], connects, registers the session
//! with the master ([`registry`]) and runs [`pump`] until a [`close::CloseReason`]. [`check`] runs
//! the probers and feeds [`health`]; a master that goes DOWN has its sessions closed at a bounded
//! pace.

pub mod admin;
pub mod check;
pub mod close;
pub mod ctl;
pub mod events;
pub mod health;
pub mod listener;
pub mod master;
pub mod metrics;
pub mod notify;
pub mod pump;
pub mod registry;
pub mod selection;
pub mod server;
mod session;
pub mod snapshot;
pub mod status_page;

pub use server::{
    start, AdminError, ApplyError, ConfigOverride, ConfigSource, Options, Running, StartError,
};
