//! Stock `salt-minion` 3008.5s on `transport: ws` against `saltgate-master` on ws, plain
//! (127.42.0.1) and over TLS with a required client certificate (127.42.0.2): two minions each,
//! their keys pending → `key accept` → `test.ping` and `cmd.run` answered through the master's
//! job cache (`publish`); a job aimed at a list naming one of them is answered by it alone. Salt's
//! ws publisher has no topics (its `publish_payload` ignores the `topic_list`, and its minions
//! send no `send_id`), so that job is queued on both publish connections (`queued=2` in the
//! master's log) and the other minion drops it, as against Salt's own ws master.
//!
//! The shared steps are common/salt_transport.rs, the same as the tcp test's; the test CA and
//! certificates are made at run time (none is committed).

mod common;

use common::salt_transport::{two_stock_minions, two_stock_minions_over_tls};

const PLAIN_IP: &str = "127.42.0.1";
const TLS_IP: &str = "127.42.0.2";

#[test]
fn stock_minions_on_ws_authenticate_answer_and_filter_what_is_not_theirs() {
    two_stock_minions("ws", PLAIN_IP, None, 2);
}

#[test]
fn stock_minions_on_ws_over_tls_with_a_required_client_certificate() {
    two_stock_minions_over_tls("ws", TLS_IP, 2);
}
