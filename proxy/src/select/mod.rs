//! Selection and health: the masters and their run-time state ([`master`], [`upstream`]), the
//! health checks ([`check`] runs the probers, [`health`] keeps the rise/fall state), which master
//! a new session goes to ([`selection`], [`failback`]), moving publish sessions ([`rebalance`]),
//! and the [`snapshot`] every session runs from, where each listener's selector is built.

pub mod check;
pub mod check_failure;
pub mod failback;
pub mod health;
pub mod local_resource;
pub mod master;
pub mod rebalance;
pub mod selection;
pub mod snapshot;
#[cfg(test)]
pub(crate) mod test_peers;
pub mod transport_probe;
pub mod upstream;
