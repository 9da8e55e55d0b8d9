//! Peers for the checks' tests on loopback.

use std::net::SocketAddr;

/// A publish port on loopback that greets (ZMTP 3.1, NULL) `after` each connect, or never.
pub async fn zmtp_greeter(after: Option<std::time::Duration>) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                if let Some(d) = after {
                    // The fixture's own pace (a saturated publish server), not a wait of the test.
                    tokio::time::sleep(d).await;
                    let mut g = vec![0xffu8, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 1];
                    g.extend(b"NULL");
                    g.resize(64, 0);
                    let _ = s.write_all(&g).await;
                }
                let mut b = [0u8; 256];
                while matches!(s.read(&mut b).await, Ok(n) if n > 0) {}
            });
        }
    });
    a
}
