//! Stock `salt-minion` 3008.5s on `transport: tcp` against `saltgate-master` on tcp, plain
//! (127.36.1.1) and over TLS with a required client certificate (127.36.1.2): two minions each,
//! their keys pending → `key accept` → `test.ping` and `cmd.run` answered; a job aimed at a list
//! naming one of them is queued on that minion's publish connection only (Salt's tcp publisher,
//! which knows each connection's minion from its `send_id`), as the master's log of the publish
//! shows (`queued=1` with both connected), and answered by it alone.
//!
//! The test CA and certificates are made at run time with rcgen in the test's temporary
//! directory (the master's names its address, each minion's its id); none is committed.

mod common;

use common::salt_transport::{two_stock_minions, two_stock_minions_over_tls};

const PLAIN_IP: &str = "127.36.1.1";
const TLS_IP: &str = "127.36.1.2";

#[test]
fn stock_minions_on_tcp_authenticate_answer_and_get_only_their_targeted_jobs() {
    two_stock_minions("tcp", PLAIN_IP, None, 1);
}

#[test]
fn stock_minions_on_tcp_over_tls_with_a_required_client_certificate() {
    two_stock_minions_over_tls("tcp", TLS_IP, 1);
}
