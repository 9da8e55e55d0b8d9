//! The session layer: what a listener does with an accepted connection. The [`serve::Serve`]
//! trait (the seam a listener calls), the context every session gets
//! ([`context::DataPlane`]), the L4 session ([`l4`]: select a master, [`connect`], pump), and
//! the span each session runs in ([`span`]).
//! It sits on the data path ([`crate::data`]), selection ([`crate::select`]), presence and
//! continuity; the control plane builds and holds it.

pub mod connect;
pub mod context;
pub mod l4;
pub mod serve;
pub mod span;
