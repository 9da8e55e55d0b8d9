//! saltgate-minion: a Salt-wire-compatible minion (Salt 3008).
//!
//! * [`keys`] — the key pair on disk and the trusted master key (`minion_master.pub`);
//! * [`auth`] — the `_auth` request and every check on the master's reply;
//! * [`channel`] — the request channel: `_auth`, `_pillar`, `_return`, clear `ping`;
//! * [`job`] — publishes as jobs, targeting, jid de-duplication;
//! * [`exec`] — the execution functions (`test.*`, `cmd.run`, `grains.*`);
//! * [`grains`] — host facts as Salt names them;
//! * [`link`] — one minion's connection set to one master;
//! * [`start_event`] — the `salt/minion/<id>/start` event fired on each master once connected;
//! * [`runner`] — a minion from a Salt config: one master, hot multi-master, failover;
//! * [`sigcache`] — publish signatures verified once per swarm process;
//! * [`swarm`] — thousands of simulated minions in one process.
//!
//! Depends on `wire` and `config`, never on `proxy`.

pub mod auth;
pub mod channel;
pub mod exec;
pub mod grains;
pub mod job;
pub mod keys;
pub mod latency;
pub mod link;
pub mod runner;
pub mod sigcache;
pub mod start_event;
pub mod swarm;
