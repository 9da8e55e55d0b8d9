//! The data path: what moves a connection's bytes, and nothing above it. The accept loop
//! ([`listener`]), buffers and counters ([`buf`]), the pump ([`pump`], [`flow`], [`splice`]), the
//! session book and leases ([`registry`]), the listener's queue ([`queue`]) and the close reasons
//! ([`close`]). A leaf: it imports only `saltgate-config`, `saltgate-wire`, std, tokio and its
//! own modules (`scripts/modgraph` checks it).

pub mod buf;
pub mod close;
mod flow;
pub mod future;
pub mod listener;
pub mod pump;
pub mod queue;
pub mod registry;
mod splice;
