//! The load generator's sockets: connect from the bench's own source address (so nothing
//! leaves the address range given to the bench), with `IP_BIND_ADDRESS_NO_PORT` so that the
//! kernel picks the source port at connect time per 4-tuple (thousands of connects to one
//! address then reuse TIME_WAIT ports as plain connects do), and `TCP_NODELAY`.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Connects `src:0 → addr`.
pub async fn connect(addr: SocketAddr, src: IpAddr) -> io::Result<TcpStream> {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    let one: libc::c_int = 1;
    // SAFETY: a valid fd, a c_int option value of the right size. Failure is harmless (the
    // kernel then picks the port at bind time), so it is ignored.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    sock.bind(SocketAddr::new(src, 0))?;
    let s = sock.connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Writes `msg` and reads exactly as many bytes back into `buf` (an echo round trip).
pub async fn echo(s: &mut TcpStream, msg: &[u8], buf: &mut [u8]) -> io::Result<()> {
    s.write_all(msg).await?;
    s.read_exact(&mut buf[..msg.len()]).await?;
    Ok(())
}

/// Connect and one echo round trip: a session established end to end through a proxy.
pub async fn open_session(addr: SocketAddr, src: IpAddr) -> io::Result<TcpStream> {
    let mut s = connect(addr, src).await?;
    let mut buf = [0u8; 16];
    echo(&mut s, b"hello, master...", &mut buf).await?;
    Ok(s)
}
