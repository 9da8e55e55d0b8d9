//! The control plane: one [`Control`](state::Control) owns what sessions never see: the
//! listeners and the admin API, reload ([`reload`]), discovery, health checkers and their events,
//! the admin actions (drain, disable, enable) and the two-phase shutdown. Sessions get the narrow
//! [`DataPlane`](crate::session::context::DataPlane) instead. Nothing below imports this plane:
//! whoever needs a handle (the admin API) gets it through [`crate::admin::ops::AdminOps`], which
//! the control plane implements.

pub mod discovery;
mod readfile;
pub mod reload;
mod start;
pub(crate) mod state;

pub use readfile::READ_THREAD;
pub use start::start;
pub use state::{ConfigOverride, ConfigSource, Options, Running, StartError};
