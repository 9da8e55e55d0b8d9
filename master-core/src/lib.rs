//! saltgate-master: a Salt-wire-compatible master that stock `salt-minion` 3008 authenticates
//! with, takes jobs from and returns to.
//!
//! * [`id`] — minion id validation (before any path is built);
//! * [`keys`] — the PKI directory in Salt's layout, the master key pair;
//! * [`auth`] — Salt's key-state rules for `_auth`, `autosign_file`;
//! * [`fileserver`] — Salt's `roots` file server (`_file_list`, `_serve_file`, `_master_opts`, …);
//! * [`request`] — the request port: decoding, refusals, `_auth`, `_pillar`, `_return`, ...;
//! * [`state`] — the composition root: [`state::Master`] owns one part per concern and wires
//!   them: [`keyring`] (keys and authentication: sessions, replay guard, verified `tok`s),
//!   [`jobbook`] (jobs and returns: who waits, the origin of recent jobs), [`publish`]
//!   (sealing and queueing publishes), the cluster ([`cluster`]);
//! * [`jobs`] — JIDs and the job cache; [`pillar`] — `pillar_roots`; [`target`] — matching;
//! * [`server`] — `run`: the sockets; [`cli`] — the local publish socket and its client;
//! * [`cluster`] — cluster keys, peer join and forwarding of publishes and returns;
//! * [`peerlink`] — the peer protocol's sending side: a persistent connection per peer;
//!   [`peerproto`] — its hello and acks, and the fallback for an old peer; [`peerserve`] — the
//!   receiving side (the peer port); [`peerwire`] — the framing all of them share;
//! * [`signing`] — MultiMaster-PKI: `pub_sig` in `_auth` replies, `key gen-signature`;
//! * [`presence`] — Salt's `presence_callback`: the ids `tcp` publish connections prove;
//! * [`rotate`] — publish-key rotation (key deleted or rejected, `publish_session`);
//! * [`metrics`] — refusals by reason, request outcomes, and the opt-in Prometheus endpoint.
//!
//! Depends on `wire` and `config`, never on `proxy`.

pub mod auth;
pub mod cli;
pub mod cluster;
pub mod convert;
pub mod fileserver;
pub mod id;
pub mod jobbook;
pub mod jobs;
pub mod keyring;
pub mod keys;
pub mod metrics;
pub mod peerlink;
pub mod peerproto;
pub mod peerserve;
pub mod peerwire;
pub mod pillar;
pub mod presence;
pub mod publish;
pub mod request;
pub mod rotate;
pub mod server;
pub mod signing;
pub mod state;
pub mod target;
mod util;
