//! Our minion against a real salt-master 3008.5 on `transport: ws`, plain (127.42.0.3) and over
//! TLS (127.42.0.4, Salt's `ssl` on both sides, a client certificate required), and a swarm on ws
//! (127.42.0.5). The key is accepted with `salt-key`, then the real `salt` CLI's jobs
//! (`test.ping`, `test.echo`, `cmd.run`, a list, a glob aimed at others) reach our minion through
//! the master's LocalClient and its ws publisher, and our returns come back on its ws request
//! server. Salt's ws publisher sends every job to every connection (no topics, no hello): the
//! minion filters, and answers only its own.
//!
//! The plain test then restarts the master: the publish websocket is dialled again, the first
//! publish under the new key makes the minion authenticate again, and it is answered again.
//!
//! The steps are common/salt_transport.rs, shared with the tcp test. The TLS master runs with
//! `worker_pools_enabled: False`, as on tcp (issue 27). The test CA and certificates are made at
//! run time; none is committed.

mod common;

use common::salt_transport::{
    plain_master_answers_across_a_restart, swarm_on_master_answers, tls_master_answers,
};
use saltgate_wire::salt_tcp::probe::Transport;

#[test]
fn real_ws_master_authenticates_us_and_its_cli_gets_answers() {
    plain_master_answers_across_a_restart(
        Transport::Ws,
        "127.42.0.3",
        "sg-ws-minion",
        "random_reauth_delay: 1\n",
    );
}

#[test]
fn real_ws_master_over_tls_authenticates_us_and_its_cli_gets_answers() {
    tls_master_answers(Transport::Ws, "127.42.0.4", "sg-wss-minion");
}

#[test]
fn real_ws_master_is_answered_by_a_ws_swarm() {
    swarm_on_master_answers(Transport::Ws, "127.42.0.5", "sww-", 10);
}
