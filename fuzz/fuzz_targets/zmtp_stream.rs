//! Arbitrary bytes as a whole TCP stream from a peer: staged greeting, READY handshake (as a
//! ROUTER), then frames and commands until the stream ends or errors. The input arrives in
//! chunks (so frames split across reads), and the read buffer must stay proportional to the
//! bytes that arrived, never to the sizes frame headers announce.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saltgate_wire::zmtp::command::Command;
use saltgate_wire::zmtp::conn::{Connection, HandshakeConfig};
use saltgate_wire::zmtp::frame::Frame;
use saltgate_wire::zmtp::SocketType;
use tokio::io::AsyncWriteExt;

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let input = data.to_vec();
        // The last byte picks the chunk size and the frame limit (small, or 64 MiB so that
        // huge announced frames are accepted and must not be reserved for).
        let knob = data.last().copied().unwrap_or(0);
        let chunk = usize::from(knob % 64) + 1;
        let max_frame_size = if knob & 0x80 != 0 { 64 << 20 } else { 4096 };
        let feeder = tokio::spawn(async move {
            for piece in input.chunks(chunk) {
                if theirs.write_all(piece).await.is_err() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            // Keep our writes flowing into the buffer; then close.
            let _ = theirs.shutdown().await;
            theirs
        });
        let mut cfg = HandshakeConfig::new(SocketType::Router);
        cfg.max_frame_size = max_frame_size;
        cfg.timeout = std::time::Duration::from_secs(5);
        if let Ok(mut conn) = Connection::handshake(ours, &cfg).await {
            let _ = conn.peer().properties.get("Identity");
            let bound = 2 * data.len() + 128 * 1024;
            while let Ok(frame) = conn.read_frame().await {
                assert!(conn.read_buffer_capacity() <= bound);
                if let Frame::Command(body) = frame {
                    let _ = Command::parse(&body);
                }
            }
            // Also when the stream ended inside a frame whose header announced megabytes.
            assert!(conn.read_buffer_capacity() <= bound);
        }
        let _ = feeder.await;
    });
});
