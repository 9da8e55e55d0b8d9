//! The framing of the cluster's peer protocol, shared by its sending side ([`crate::peerlink`],
//! [`crate::peerproto`]), its receiving side ([`crate::peerserve`]) and the join
//! ([`crate::cluster`]): a 4-byte big-endian length then the frame, at most [`MAX_PEER_MESSAGE`];
//! the signature algorithm of peer messages; the socket options of peer connections.

use std::time::Duration;

use saltgate_wire::accept::Keepalive;
use saltgate_wire::rsa::SigAlgo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest peer message.
pub const MAX_PEER_MESSAGE: usize = 16 * 1024 * 1024;
/// How peer messages are RSA-signed (by the sender's own master key).
pub const PEER_SIG: SigAlgo = SigAlgo::Pkcs1v15Sha224;
/// Once a frame has started, the rest of it must arrive within this.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP keepalive on peer links, both ends (60 s idle, then 3 probes 10 s apart), so a peer that
/// vanished without a FIN is found on an idle link.
pub const PEER_KEEPALIVE: Keepalive = Keepalive {
    time: Duration::from_secs(60),
    interval: Some(Duration::from_secs(10)),
    retries: Some(3),
};

/// Reads one frame; `Ok(None)` at a clean EOF between frames. Waits for the first byte without a
/// time limit, then [`FRAME_TIMEOUT`] for the rest.
pub async fn read_frame_idle(s: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut hdr = [0u8; 4];
    if s.read(&mut hdr[..1]).await? == 0 {
        return Ok(None);
    }
    let rest = async {
        s.read_exact(&mut hdr[1..]).await?;
        let len = u32::from_be_bytes(hdr) as usize;
        if len > MAX_PEER_MESSAGE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("peer message of {len} bytes is over the limit of {MAX_PEER_MESSAGE}"),
            ));
        }
        // Grown as bytes arrive: a header announcing 16 MiB costs nothing until they come.
        let mut buf = Vec::new();
        (&mut *s).take(len as u64).read_to_end(&mut buf).await?;
        if buf.len() < len {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(buf)
    };
    match tokio::time::timeout(FRAME_TIMEOUT, rest).await {
        Ok(r) => r.map(Some),
        Err(_) => Err(std::io::Error::other("partial peer frame timed out")),
    }
}

/// Writes one length-prefixed frame (one write) and flushes.
pub async fn write_frame(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(data.len()).map_err(|_| std::io::Error::other("message too large"))?;
    let mut buf = Vec::with_capacity(4 + data.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(data);
    s.write_all(&buf).await?;
    s.flush().await
}
