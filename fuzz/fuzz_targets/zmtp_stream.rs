//! Arbitrary bytes as a whole TCP stream from a peer: staged greeting, READY handshake (as a
//! ROUTER), then frames and commands until the stream ends or errors.
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
        let feeder = tokio::spawn(async move {
            let _ = theirs.write_all(&input).await;
            // Keep our writes flowing into the buffer; then close.
            let _ = theirs.shutdown().await;
            theirs
        });
        let mut cfg = HandshakeConfig::new(SocketType::Router);
        cfg.max_frame_size = 4096;
        cfg.timeout = std::time::Duration::from_secs(5);
        if let Ok(mut conn) = Connection::handshake(ours, &cfg).await {
            let _ = conn.peer().properties.get("Identity");
            while let Ok(frame) = conn.read_frame().await {
                if let Frame::Command(body) = frame {
                    let _ = Command::parse(&body);
                }
            }
        }
        let _ = feeder.await;
    });
});
