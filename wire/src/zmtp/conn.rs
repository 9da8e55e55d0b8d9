//! One ZMTP connection after the handshake: greeting, READY in both directions, then framed
//! reads and writes.
//!
//! Owns the handshake policy (socket-type compatibility, timeouts) and the read buffer. The read
//! buffer exists only while a frame is partly received: an idle connection waits for bytes with
//! no heap buffer at all (each read goes through a stack scratch area, then into a buffer sized to
//! what arrived), and a frame's buffer grows only as its bytes arrive, never to the size its
//! header announces. It does
//! not answer PINGs by itself — [`super::peer`] does that for the socket roles — so that callers
//! that drive a connection by hand (the probes, tests) see every frame.

use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::command::{Command, Properties};
use super::frame::{encode_message, Frame, FrameDecoder, DEFAULT_MAX_FRAME_SIZE};
use super::greeting::{self, Greeting};
use super::{SocketType, ZmtpError};

/// What we announce and enforce during the handshake.
#[derive(Debug, Clone)]
pub struct HandshakeConfig {
    pub socket_type: SocketType,
    /// Sent as the `Identity` property (REQ, DEALER, ROUTER only; empty = none).
    pub identity: Bytes,
    /// The as-server bit of our greeting (meaningless for NULL; libzmq sets it on the listener).
    pub as_server: bool,
    pub max_frame_size: usize,
    /// Deadline for the greeting and READY exchange together.
    pub timeout: Duration,
}

impl HandshakeConfig {
    pub fn new(socket_type: SocketType) -> Self {
        HandshakeConfig {
            socket_type,
            identity: Bytes::new(),
            as_server: false,
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            timeout: Duration::from_secs(10),
        }
    }

    fn ready(&self) -> Command {
        let mut props = Properties::default().with("Socket-Type", self.socket_type.as_str());
        // libzmq sends an Identity from these only; a SUB sends one when it was given one
        // (saltgate-minion's id, for the fan-out's replay; a publisher ignores it).
        let routed = matches!(
            self.socket_type,
            SocketType::Req | SocketType::Dealer | SocketType::Router
        );
        if routed || (self.socket_type == SocketType::Sub && !self.identity.is_empty()) {
            props = props.with("Identity", self.identity.clone());
        }
        Command::Ready(props)
    }
}

/// What we learnt about the peer during the handshake.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub greeting: Greeting,
    pub socket_type: SocketType,
    /// The peer's `Identity` property (empty if none).
    pub identity: Bytes,
    pub properties: Properties,
}

/// Stack scratch for a read on a connection holding no partial frame.
const IDLE_READ: usize = 16 * 1024;
/// Smallest and largest read into a partial frame's buffer: at least this much room is made
/// for what follows, at most this much beyond the bytes already received.
const MIN_PARTIAL_READ: usize = 8 * 1024;
const MAX_PARTIAL_READ: usize = 64 * 1024;

/// A handshaken connection.
#[derive(Debug)]
pub struct Connection<S = TcpStream> {
    io: S,
    rbuf: BytesMut,
    wbuf: BytesMut,
    decoder: FrameDecoder,
    peer: PeerInfo,
    /// When bytes last arrived (any bytes: a large frame trickling in counts as traffic).
    last_rx: tokio::time::Instant,
    /// When the first byte of the frame now partly received arrived (`None`: no partial frame).
    frame_started: Option<tokio::time::Instant>,
    /// Longest a write may make no progress (`None`: no limit).
    write_timeout: Option<Duration>,
    /// Longest a frame may take from its first byte to its last (`None`: no limit).
    frame_timeout: Option<Duration>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    /// Runs the greeting and READY exchange within `cfg.timeout`.
    pub async fn handshake(io: S, cfg: &HandshakeConfig) -> Result<Self, ZmtpError> {
        tokio::time::timeout(cfg.timeout, Self::handshake_inner(io, cfg))
            .await
            .map_err(|_| ZmtpError::Timeout("handshake"))?
    }

    async fn handshake_inner(mut io: S, cfg: &HandshakeConfig) -> Result<Self, ZmtpError> {
        // Our greeting and READY go out in one write.
        let mut wbuf = BytesMut::new();
        cfg.ready().encode_frame(&mut wbuf);
        let greeting =
            greeting::exchange_then(&mut io, &Greeting::ours(cfg.as_server), &wbuf).await?;
        wbuf.clear();
        let mut conn = Connection {
            io,
            rbuf: BytesMut::new(),
            wbuf,
            decoder: FrameDecoder::new(cfg.max_frame_size),
            peer: PeerInfo {
                greeting,
                socket_type: cfg.socket_type,
                identity: Bytes::new(),
                properties: Properties::default(),
            },
            last_rx: tokio::time::Instant::now(),
            frame_started: None,
            write_timeout: None,
            frame_timeout: None,
        };
        let props = match conn.read_frame().await? {
            Frame::Command(body) => match Command::parse(&body)? {
                Command::Ready(props) => props,
                Command::Error(reason) => {
                    return Err(ZmtpError::PeerError(
                        String::from_utf8_lossy(&reason).into_owned(),
                    ))
                }
                other => {
                    return Err(ZmtpError::ExpectedReady(
                        String::from_utf8_lossy(other.name()).into_owned(),
                    ))
                }
            },
            Frame::Message { .. } => return Err(ZmtpError::ExpectedReady("a message".into())),
        };
        let raw_type = props.get("Socket-Type").cloned().unwrap_or_default();
        let peer_type = SocketType::parse(&raw_type)
            .filter(|t| cfg.socket_type.compatible_with(*t))
            .ok_or_else(|| ZmtpError::IncompatibleSocketType {
                ours: cfg.socket_type,
                peer: String::from_utf8_lossy(&raw_type).into_owned(),
            })?;
        conn.peer.socket_type = peer_type;
        conn.peer.identity = props.get("Identity").cloned().unwrap_or_default();
        conn.peer.properties = props;
        Ok(conn)
    }

    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// When bytes last arrived from the peer.
    pub fn last_received(&self) -> tokio::time::Instant {
        self.last_rx
    }

    /// Reads the next frame. Cancel-safe: bytes already read stay buffered.
    pub async fn read_frame(&mut self) -> Result<Frame, ZmtpError> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.rbuf)? {
                if self.rbuf.is_empty() {
                    // No partial frame: hold no buffer while idle (frames already taken keep
                    // their bytes alive on their own).
                    self.rbuf = BytesMut::new();
                    self.frame_started = None;
                } else {
                    // The next frame began with the bytes of the last read.
                    self.frame_started = Some(self.last_rx);
                }
                return Ok(frame);
            }
            let was_empty = self.rbuf.is_empty();
            // A frame under way must end in time; the clock is checked here, inside the read,
            // since the bytes of a trickled frame never end the read that buffers them.
            let frame_deadline = self
                .frame_timeout
                .zip(self.frame_started)
                .and_then(|(t, started)| started.checked_add(t));
            let n = match frame_deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, self.fill())
                    .await
                    .map_err(|_| {
                        ZmtpError::FrameTimeout(self.frame_timeout.unwrap_or_default())
                    })??,
                None => self.fill().await?,
            };
            if n == 0 {
                return Err(ZmtpError::Eof);
            }
            self.last_rx = tokio::time::Instant::now();
            if was_empty {
                self.frame_started = Some(self.last_rx);
            }
        }
    }

    /// When the first byte of a frame still incomplete arrived; `None` when no frame is partly
    /// received. A caller bounds how long a frame may take with it (a peer sending one byte
    /// now and then is not silent, but holds its buffer for ever).
    pub fn frame_started(&self) -> Option<tokio::time::Instant> {
        self.frame_started
    }

    /// Bounds every later frame: one not completed within `timeout` of its first byte fails
    /// the read with [`ZmtpError::FrameTimeout`] (a peer sending one byte now and then is not
    /// silent, but would hold its buffer for ever). `None`: no bound.
    pub fn set_frame_timeout(&mut self, timeout: Option<Duration>) {
        self.frame_timeout = timeout;
    }

    /// Starts the clock of a partly received frame again (after a pause in which the caller
    /// chose not to read: time it did not read does not count against the peer).
    pub fn restart_frame_clock(&mut self) {
        if self.frame_started.is_some() {
            self.frame_started = Some(tokio::time::Instant::now());
        }
    }

    /// Bounds every later write: one that makes no progress for `timeout` fails with
    /// [`ZmtpError::WriteTimeout`] (a peer that does not read). `None`: no bound.
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) {
        self.write_timeout = timeout;
    }

    /// The largest frame the next reads accept.
    pub fn max_frame_size(&self) -> usize {
        self.decoder.max_frame_size()
    }

    /// Changes the largest frame accepted from now on (checked on each frame's header).
    pub fn set_max_frame_size(&mut self, max: usize) {
        self.decoder = FrameDecoder::new(max);
    }

    /// Heap bytes held for reading (0 on a connection with no partial frame).
    pub fn read_buffer_capacity(&self) -> usize {
        self.rbuf.capacity()
    }

    /// One read. With no partial frame, waits through a stack scratch area and copies what
    /// arrived; inside a frame, reads straight into the buffer, making room for at most
    /// `MAX_PARTIAL_READ` bytes beyond what is there.
    async fn fill(&mut self) -> Result<usize, ZmtpError> {
        if self.rbuf.is_empty() {
            let (io, rbuf) = (&mut self.io, &mut self.rbuf);
            let n = std::future::poll_fn(|cx| {
                let mut scratch = [MaybeUninit::<u8>::uninit(); IDLE_READ];
                let mut rb = ReadBuf::uninit(&mut scratch);
                match Pin::new(&mut *io).poll_read(cx, &mut rb) {
                    Poll::Ready(Ok(())) => {
                        rbuf.extend_from_slice(rb.filled());
                        Poll::Ready(Ok(rb.filled().len()))
                    }
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await?;
            return Ok(n);
        }
        let need = self.decoder.bytes_needed(&self.rbuf)?;
        self.rbuf
            .reserve(need.clamp(MIN_PARTIAL_READ, MAX_PARTIAL_READ));
        Ok(self.io.read_buf(&mut self.rbuf).await?)
    }

    /// Writes a multi-part message and flushes.
    pub async fn send_message<B: AsRef<[u8]>>(&mut self, parts: &[B]) -> Result<(), ZmtpError> {
        self.wbuf.clear();
        encode_message(&mut self.wbuf, parts);
        self.flush_wbuf().await
    }

    /// Writes one command frame and flushes.
    pub async fn send_command(&mut self, cmd: &Command) -> Result<(), ZmtpError> {
        self.wbuf.clear();
        cmd.encode_frame(&mut self.wbuf);
        self.flush_wbuf().await
    }

    /// Writes bytes already framed (e.g. a message encoded once for many subscribers with
    /// [`super::frame::encode_message`]) and flushes. The caller vouches for the framing.
    pub async fn send_encoded(&mut self, framed: &[u8]) -> Result<(), ZmtpError> {
        write_all_timed(&mut self.io, framed, self.write_timeout).await
    }

    async fn flush_wbuf(&mut self) -> Result<(), ZmtpError> {
        write_all_timed(&mut self.io, &self.wbuf, self.write_timeout).await?;
        self.wbuf.clear();
        // Do not keep a large buffer around on idle connections.
        if self.wbuf.capacity() > 64 * 1024 {
            self.wbuf = BytesMut::new();
        }
        Ok(())
    }

    /// Shuts the write side down (best effort).
    pub async fn shutdown(&mut self) {
        let _ = self.io.shutdown().await;
    }
}

/// Writes all of `buf` and flushes; with a timeout, each write must make progress within it,
/// else [`ZmtpError::WriteTimeout`] (a peer that does not read). For callers that drive a
/// stream by hand (the proxy's fan-out sessions); [`Connection`] uses it for every write.
pub async fn write_all_timed<S: AsyncWrite + Unpin>(
    io: &mut S,
    mut buf: &[u8],
    timeout: Option<Duration>,
) -> Result<(), ZmtpError> {
    let Some(t) = timeout else {
        io.write_all(buf).await?;
        io.flush().await?;
        return Ok(());
    };
    while !buf.is_empty() {
        match tokio::time::timeout(t, io.write(buf)).await {
            Err(_) => return Err(ZmtpError::WriteTimeout(t)),
            Ok(Ok(0)) => return Err(ZmtpError::Io(std::io::ErrorKind::WriteZero.into())),
            Ok(Ok(n)) => buf = buf.get(n..).unwrap_or_default(),
            Ok(Err(e)) => return Err(e.into()),
        }
    }
    tokio::time::timeout(t, io.flush())
        .await
        .map_err(|_| ZmtpError::WriteTimeout(t))??;
    Ok(())
}

impl Connection<TcpStream> {
    /// Dials `addr` (TCP_NODELAY on) and handshakes; the whole thing is bounded by `cfg.timeout`.
    pub async fn connect(
        addr: std::net::SocketAddr,
        cfg: &HandshakeConfig,
    ) -> Result<Self, ZmtpError> {
        Self::connect_with_keepalive(addr, cfg, None).await
    }

    /// As [`Connection::connect`], with TCP keepalive set on the socket when given.
    pub async fn connect_with_keepalive(
        addr: std::net::SocketAddr,
        cfg: &HandshakeConfig,
        keepalive: Option<&crate::accept::Keepalive>,
    ) -> Result<Self, ZmtpError> {
        Self::connect_from(addr, None, cfg, keepalive).await
    }

    /// As [`Connection::connect_with_keepalive`], dialling from the local address `source`
    /// when given (Salt's minion `source_address`; the kernel picks the port).
    pub async fn connect_from(
        addr: std::net::SocketAddr,
        source: Option<std::net::IpAddr>,
        cfg: &HandshakeConfig,
        keepalive: Option<&crate::accept::Keepalive>,
    ) -> Result<Self, ZmtpError> {
        let stream = tokio::time::timeout(cfg.timeout, dial(addr, source))
            .await
            .map_err(|_| ZmtpError::Timeout("connect"))??;
        crate::accept::tune_stream(&stream, keepalive);
        Self::handshake(stream, cfg).await
    }

    /// The underlying stream (e.g. to read its socket options).
    pub fn stream(&self) -> &TcpStream {
        &self.io
    }
}

/// A TCP connect to `addr`, bound first to `source` (port 0) when given.
async fn dial(
    addr: std::net::SocketAddr,
    source: Option<std::net::IpAddr>,
) -> std::io::Result<TcpStream> {
    let Some(ip) = source else {
        return TcpStream::connect(addr).await;
    };
    let sock = if ip.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    sock.bind(std::net::SocketAddr::new(ip, 0))?;
    sock.connect(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn req_and_router_handshake_and_exchange_a_message() {
        let (a, b) = tokio::io::duplex(4096);
        let router = tokio::spawn(async move {
            let mut cfg = HandshakeConfig::new(SocketType::Router);
            cfg.as_server = true;
            let mut c = Connection::handshake(b, &cfg).await.unwrap();
            assert_eq!(c.peer().socket_type, SocketType::Req);
            assert_eq!(&c.peer().identity[..], b"me");
            let f = c.read_frame().await.unwrap();
            assert_eq!(
                f,
                Frame::Message {
                    body: Bytes::new(),
                    more: true
                }
            );
            c.send_message(&[&b""[..], b"pong"]).await.unwrap();
        });
        let mut cfg = HandshakeConfig::new(SocketType::Req);
        cfg.identity = Bytes::from_static(b"me");
        let mut c = Connection::handshake(a, &cfg).await.unwrap();
        assert_eq!(c.peer().socket_type, SocketType::Router);
        c.send_message(&[&b""[..], b"ping"]).await.unwrap();
        router.await.unwrap();
        let _ = c.read_frame().await.unwrap();
        assert_eq!(
            c.read_frame().await.unwrap(),
            Frame::Message {
                body: Bytes::from_static(b"pong"),
                more: false
            }
        );
    }

    #[tokio::test]
    async fn connect_from_dials_from_the_given_source_address() {
        use crate::zmtp::{Router, RouterOptions};
        let router = Router::bind("127.16.0.1:0".parse().unwrap(), RouterOptions::default())
            .await
            .unwrap();
        let listen = router.local_addr();
        let source: std::net::IpAddr = "127.16.0.9".parse().unwrap();
        let cfg = HandshakeConfig::new(SocketType::Req);
        let c = Connection::connect_from(listen, Some(source), &cfg, None)
            .await
            .unwrap();
        assert_eq!(c.stream().local_addr().unwrap().ip(), source);
        assert_eq!(c.stream().peer_addr().unwrap(), listen);
        let c = Connection::connect_from(listen, None, &cfg, None)
            .await
            .unwrap();
        assert_ne!(
            c.stream().local_addr().unwrap().ip(),
            source,
            "without a source address the kernel picks (127.0.0.1 on loopback)"
        );
    }

    /// The bytes of a trickled frame never end the read that buffers them: the deadline is
    /// kept inside that one read (a driver that armed it between reads never saw it).
    #[tokio::test(start_paused = true)]
    async fn a_frame_trickled_into_one_read_fails_it_at_frame_timeout() {
        let (a, b) = tokio::io::duplex(4096);
        let peer = tokio::spawn(async move {
            Connection::handshake(b, &HandshakeConfig::new(SocketType::Req))
                .await
                .unwrap()
        });
        let mut cfg = HandshakeConfig::new(SocketType::Router);
        cfg.as_server = true;
        let mut c = Connection::handshake(a, &cfg).await.unwrap();
        let mut p = peer.await.unwrap();
        c.set_frame_timeout(Some(Duration::from_secs(1)));
        let mut frame = BytesMut::new();
        crate::zmtp::frame::encode_frame(&mut frame, 0, &[b'x'; 100]);
        let trickle = tokio::spawn(async move {
            for b in frame.iter() {
                if p.send_encoded(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        let start = tokio::time::Instant::now();
        let err = c.read_frame().await.unwrap_err();
        assert!(matches!(err, ZmtpError::FrameTimeout(_)), "{err:?}");
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_millis(1400),
            "cut after {took:?}"
        );
        trickle.abort();
    }

    #[tokio::test]
    async fn read_buffer_exists_only_while_a_frame_is_partly_received() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let peer = tokio::spawn(async move {
            let mut cfg = HandshakeConfig::new(SocketType::Req);
            cfg.identity = Bytes::from_static(b"me");
            Connection::handshake(b, &cfg).await.unwrap()
        });
        let mut cfg = HandshakeConfig::new(SocketType::Router);
        cfg.max_frame_size = 1 << 20;
        let mut c = Connection::handshake(a, &cfg).await.unwrap();
        let mut p = peer.await.unwrap();
        assert_eq!(c.read_buffer_capacity(), 0, "idle after the handshake");

        // A header announcing 512 KiB, then the body in two halves.
        let body = vec![9u8; 512 * 1024];
        let mut framed = BytesMut::new();
        crate::zmtp::frame::encode_frame(&mut framed, 0, &body);
        let (head, tail) = framed.split_at(9 + 256 * 1024);
        p.send_encoded(&framed[..9]).await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), c.read_frame())
                .await
                .is_err()
        );
        assert!(
            c.read_buffer_capacity() < 128 * 1024,
            "reserved {} bytes for a frame nobody sent yet",
            c.read_buffer_capacity()
        );
        p.send_encoded(&head[9..]).await.unwrap();
        p.send_encoded(tail).await.unwrap();
        let f = c.read_frame().await.unwrap();
        assert_eq!(
            f,
            Frame::Message {
                body: Bytes::from(body),
                more: false
            }
        );
        assert_eq!(c.read_buffer_capacity(), 0, "idle again");
    }

    #[tokio::test]
    async fn dialled_sockets_get_keepalive_only_when_asked() {
        use crate::accept::Keepalive;
        use crate::zmtp::{ReqOptions, Router, RouterOptions, SubOptions};
        let router = Router::bind("127.0.0.1:0".parse().unwrap(), RouterOptions::default())
            .await
            .unwrap();
        let ka = Keepalive {
            time: Duration::from_secs(42),
            interval: None,
            retries: None,
        };
        let cfg = HandshakeConfig::new(SocketType::Req);
        let c = Connection::connect_with_keepalive(router.local_addr(), &cfg, Some(&ka))
            .await
            .unwrap();
        let s = socket2::SockRef::from(c.stream());
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(42));
        assert!(c.stream().nodelay().unwrap());
        let plain = Connection::connect(router.local_addr(), &cfg)
            .await
            .unwrap();
        assert!(!socket2::SockRef::from(plain.stream()).keepalive().unwrap());
        // The roles default to Salt's minion keepalive (idle 300 s).
        assert_eq!(SubOptions::default().keepalive, Some(Keepalive::salt()));
        assert_eq!(ReqOptions::default().keepalive, Some(Keepalive::salt()));
        assert_eq!(RouterOptions::default().keepalive, Some(Keepalive::salt()));
    }

    #[tokio::test]
    async fn incompatible_socket_types_fail_the_handshake() {
        let (a, b) = tokio::io::duplex(4096);
        tokio::spawn(async move {
            let _ = Connection::handshake(b, &HandshakeConfig::new(SocketType::Pub)).await;
        });
        let err = Connection::handshake(a, &HandshakeConfig::new(SocketType::Req))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ZmtpError::IncompatibleSocketType { .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn silent_peer_times_out_the_handshake() {
        let (a, _b) = tokio::io::duplex(4096);
        let mut cfg = HandshakeConfig::new(SocketType::Req);
        cfg.timeout = Duration::from_millis(50);
        let err = Connection::handshake(a, &cfg).await.unwrap_err();
        assert!(matches!(err, ZmtpError::Timeout("handshake")));
    }
}
