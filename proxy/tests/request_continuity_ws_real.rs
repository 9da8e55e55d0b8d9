//! Request continuity on Salt's plain `ws` transport with real Salt 3008.5 (issue 27): two
//! `salt-master`s (A, B) in one Salt cluster (`cluster_id`, shared `cluster_pki_dir` and
//! `cachedir`, started as interop/harness/cluster.py starts them) on `transport: ws`, and a stock
//! `salt-minion` on `transport: ws` that knows only saltgate's address. saltgate serves its
//! request port over A then B with `on_master_down: migrate` and the default Salt-aware probe; a
//! second saltgate on the same address serves the publish port from B only (as in the `tcp`
//! test, whose lab this one shares, common/migrate_real.rs: the publish connection must not be on
//! the master that goes).
//!
//! A job's return is put in flight to A: the job (a `cmd.run` that waits for a file the test
//! creates) starts, A is SIGSTOPped, the job is let go, and the minion opens a websocket for its
//! return (Salt 3008.5's `RequestClient` dials one per request), which saltgate connects to A,
//! still UP: the kernel takes the connection, the stopped A answers nothing. saltgate marks A
//! DOWN and moves the session: it sends the minion's upgrade to B and, as the minion has no `101`
//! yet, passes B's; whatever of the return had passed is re-sent. B stores the return (`Got
//! return from ... for job ...` in its log). The minion must not have failed a send (its trace
//! log: `AsyncReqChannel.send` logs "Failed to send msg" before each retry): without `migrate`,
//! saltgate closes the session at DOWN and the minion sends the return again on a new websocket.
//!
//! Needs the Salt venv (`SALTGATE_VENV` or test-support's setup). Addresses: 127.41.0.0/24. Run
//! under `flock /tmp/heavy.lock`.

mod common;

use common::migrate_real::{count, read, Lab, Spec};
use common::salt_real::tail;
use saltgate_config::transport::SaltTransport;

/// What a stock 3008.5 minion logs when a request failed and is tried again
/// (`AsyncReqChannel.send`, at trace), or when it lost its master.
fn failure_lines() -> [&'static str; 3] {
    [
        "Failed to send msg",
        "Async-closing AsyncReqChannel",
        "Re-initialising subsystems",
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ws_minions_return_in_flight_to_a_stopped_master_is_stored_by_the_other_without_a_retry()
{
    let lab = Lab::start(Spec {
        transport: SaltTransport::Ws,
        gate: "127.41.0.1",
        masters: ["127.41.0.11", "127.41.0.12"],
        cluster_id: "ws_migrate",
        minion: "ws-migrate-minion",
        // Trace: `AsyncReqChannel.send` logs its failed tries there.
        minion_trace: true,
        preseed_minion_key: false,
    })
    .await;
    let [a, b] = lab.cluster.spec.masters;
    let minion_log = lab.cluster.minion_log();

    // Its websocket's upgrade passed saltgate towards the stopped master.
    let round = lab
        .return_in_flight_to_a_stopped_a(100.0, "the return's websocket never reached saltgate")
        .await;
    let (jid, took, s) = (&round.jid, round.took, &round.scrape);
    let moved = count(
        s,
        "saltgate_request_sessions_migrated_total",
        &[("reason", "master-down")],
    );
    let replayed = count(s, "saltgate_requests_replayed_total", &[]);
    let log = read(&lab.cluster.d.join("saltgate.log"));
    let moves: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("request session moved"))
        .collect();
    eprintln!(
        "SIGSTOP of {a}: the return of {jid} stored by {b} {took:?} after the minion sent it; \
         sessions moved at DOWN {moved}, re-sends {replayed}; {moves:?}"
    );
    assert!(moved >= 1.0, "the return's session moved at DOWN ({moved})");
    let since = read(&minion_log).split_off(round.minion_log_at);
    // The check below needs the minion's trace lines.
    assert!(since.contains("[TRACE"), "the minion logs at trace");
    for line in failure_lines() {
        assert!(
            !since.contains(line),
            "the minion failed a send or lost its master ({line:?}):\n{}",
            tail(&minion_log)
        );
    }
}
