//! The four socket roles Salt uses, each on top of the per-connection driver in [`super::peer`]:
//! [`publisher`] (PUB), [`subscriber`] (SUB), [`req`] (REQ) and [`router`] (ROUTER).
//!
//! Each role owns its queues, its accept or dial loop and its tasks; dropping the role value
//! stops them all.

pub mod publisher;
pub mod req;
pub mod router;
pub mod subscriber;
