//! Operations: the Prometheus metrics ([`metrics`]), the event history ([`events`]), the access
//! log ([`accesslog`]), systemd notification ([`notify`]) and log rate limits ([`ratelimit`]).

pub mod accesslog;
pub mod events;
pub mod metrics;
pub mod notify;
pub mod ratelimit;
