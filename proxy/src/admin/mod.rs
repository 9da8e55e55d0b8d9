//! The admin plane: the HTTP API ([`api`]), the status page, the fan-out view, the presence API,
//! the errors they answer with, and the `saltgate ctl` client ([`ctl`]). It reaches the running
//! proxy only through [`ops::AdminOps`], which the control plane implements.

pub mod api;
pub mod ctl;
pub mod error;
pub(crate) mod fanout_view;
pub(crate) mod ops;
pub(crate) mod presence_api;
pub mod status_page;

pub use api::{
    CONNECTION_LIFETIME, HEADER_READ_TIMEOUT, MAX_CONCURRENT, MAX_CONNECTIONS, REQUEST_TIMEOUT,
};
pub use ops::{DEFAULT_PAGE, MAX_PAGE};
