//! The 64-byte ZMTP 3.x greeting and its exchange.
//!
//! Layout: signature `ff 00*8 7f` (10 bytes), major, minor, mechanism (20 bytes, NUL padded),
//! as-server (1 byte), filler (31 zero bytes). libzmq sends it in three stages — the signature at
//! once, the major version after reading the peer's signature, the rest after the peer's major —
//! so a client that waits for the whole greeting before sending its own deadlocks. We send ours
//! whole at once and never wait before sending ([`exchange_then`]); the health probe stages like
//! libzmq ([`exchange_raw`]). Only the NULL mechanism is supported (Salt never configures CURVE
//! or PLAIN).

use std::fmt;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::ZmtpError;

pub const SIGNATURE_LEN: usize = 10;
pub const GREETING_LEN: usize = 64;
/// What we advertise: ZMTP 3.1.
pub const OUR_MAJOR: u8 = 3;
pub const OUR_MINOR: u8 = 1;

/// A mechanism name (up to 20 bytes, NUL padded on the wire).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Mechanism(pub [u8; 20]);

impl Mechanism {
    pub const NULL: Mechanism = Mechanism(*b"NULL\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0");

    /// The name without padding, lossily decoded.
    pub fn name(&self) -> String {
        let end = self.0.iter().position(|&b| b == 0).unwrap_or(20);
        String::from_utf8_lossy(self.0.get(..end).unwrap_or(&[])).into_owned()
    }
}

impl fmt::Debug for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.name())
    }
}

/// A parsed greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Greeting {
    pub major: u8,
    pub minor: u8,
    pub mechanism: Mechanism,
    pub as_server: bool,
}

impl Greeting {
    /// Our greeting: ZMTP 3.1, NULL.
    pub fn ours(as_server: bool) -> Self {
        Greeting {
            major: OUR_MAJOR,
            minor: OUR_MINOR,
            mechanism: Mechanism::NULL,
            as_server,
        }
    }

    pub fn encode(&self) -> [u8; GREETING_LEN] {
        let mut g = [0u8; GREETING_LEN];
        g[0] = 0xff;
        g[9] = 0x7f;
        g[10] = self.major;
        g[11] = self.minor;
        g[12..32].copy_from_slice(&self.mechanism.0);
        g[32] = u8::from(self.as_server);
        g
    }

    /// Parses a complete greeting.
    pub fn parse(g: &[u8; GREETING_LEN]) -> Result<Self, ZmtpError> {
        let (sig, rest) = g.split_at(SIGNATURE_LEN);
        check_signature(sig)?;
        let (&major, rest) = rest.split_first().ok_or(ZmtpError::BadSignature)?;
        let tail: &[u8; GREETING_LEN - SIGNATURE_LEN - 1] =
            rest.try_into().map_err(|_| ZmtpError::BadSignature)?;
        Self::from_parts(major, tail)
    }

    fn from_parts(
        major: u8,
        tail: &[u8; GREETING_LEN - SIGNATURE_LEN - 1],
    ) -> Result<Self, ZmtpError> {
        let mut mechanism = [0u8; 20];
        mechanism.copy_from_slice(&tail[1..21]);
        Ok(Greeting {
            major,
            minor: tail[0],
            mechanism: Mechanism(mechanism),
            as_server: tail[21] != 0,
        })
    }

    /// ZMTP 3.1 or later: PING/PONG and SUBSCRIBE/CANCEL commands are understood.
    pub fn supports_3_1(&self) -> bool {
        self.major > 3 || (self.major == 3 && self.minor >= 1)
    }
}

/// Checks the 10-byte signature: `0xff`, 8 bytes of padding (ignored), and bit 0 of the last byte.
pub fn check_signature(sig: &[u8]) -> Result<(), ZmtpError> {
    match (sig.first(), sig.get(9)) {
        (Some(0xff), Some(last)) if last & 1 == 1 => Ok(()),
        _ => Err(ZmtpError::BadSignature),
    }
}

/// Exchanges greetings and returns the peer's greeting: ours goes out whole, in one write
/// together with `then` (the READY command that follows it), and the peer's is read as it
/// comes, its signature and major version checked as soon as they arrive.
///
/// Sending the whole greeting at once is what ZMTP 3 allows a peer that does not fall back to
/// ZMTP 1.0/2.0: it cannot deadlock (we never wait before sending), and libzmq reads a greeting
/// only up to its length, leaving what follows for its decoder. One write instead of four per
/// connection matters on the request port, where Salt's minion opens a connection per return.
///
/// Fails if the peer speaks ZMTP < 3.0 or a mechanism other than NULL. Does not time out by
/// itself; callers wrap it in `tokio::time::timeout`.
pub async fn exchange_then<S>(
    io: &mut S,
    ours: &Greeting,
    then: &[u8],
) -> Result<Greeting, ZmtpError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mine = ours.encode();
    if then.is_empty() {
        io.write_all(&mine).await?;
    } else {
        let mut out = Vec::with_capacity(GREETING_LEN + then.len());
        out.extend_from_slice(&mine);
        out.extend_from_slice(then);
        io.write_all(&out).await?;
    }
    io.flush().await?;
    let mut g = [0u8; GREETING_LEN];
    let mut got = 0;
    while got < GREETING_LEN {
        let n = io.read(&mut g[got..]).await?;
        if n == 0 {
            return Err(ZmtpError::Eof);
        }
        let before = got;
        got += n;
        if before < SIGNATURE_LEN && got >= SIGNATURE_LEN {
            check_signature(&g[..SIGNATURE_LEN])?;
        }
        if before <= SIGNATURE_LEN && got > SIGNATURE_LEN && g[SIGNATURE_LEN] < 3 {
            return Err(ZmtpError::UnsupportedVersion {
                major: g[SIGNATURE_LEN],
                minor: 0,
            });
        }
    }
    let peer = Greeting::parse(&g)?;
    if peer.mechanism != Mechanism::NULL {
        return Err(ZmtpError::UnsupportedMechanism(peer.mechanism.name()));
    }
    Ok(peer)
}

/// [`exchange_then`] with nothing after the greeting.
pub async fn exchange<S>(io: &mut S, ours: &Greeting) -> Result<Greeting, ZmtpError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    exchange_then(io, ours, &[]).await
}

/// libzmq's staged exchange (signature, then major version, then the rest, each after the
/// peer's) without version or mechanism policy: the probe reports whatever it saw, including a
/// ZMTP 1.0/2.0 peer that a whole greeting would confuse.
pub async fn exchange_raw<S>(io: &mut S, ours: &Greeting) -> Result<Greeting, ZmtpError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mine = ours.encode();
    // Stage 1: signature.
    io.write_all(&mine[..SIGNATURE_LEN]).await?;
    io.flush().await?;
    let mut sig = [0u8; SIGNATURE_LEN];
    io.read_exact(&mut sig).await?;
    check_signature(&sig)?;
    // Stage 2: major version.
    io.write_all(&mine[SIGNATURE_LEN..SIGNATURE_LEN + 1])
        .await?;
    io.flush().await?;
    let mut major = [0u8; 1];
    io.read_exact(&mut major).await?;
    if major[0] < 3 {
        return Err(ZmtpError::UnsupportedVersion {
            major: major[0],
            minor: 0,
        });
    }
    // Stage 3: the rest.
    io.write_all(&mine[SIGNATURE_LEN + 1..]).await?;
    io.flush().await?;
    let mut tail = [0u8; GREETING_LEN - SIGNATURE_LEN - 1];
    io.read_exact(&mut tail).await?;
    Greeting::from_parts(major[0], &tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The greeting a Salt 3008.5 master sends on 4505 and 4506, as captured on the wire.
    const SALT_MASTER_GREETING: [u8; 64] = {
        let mut g = [0u8; 64];
        g[0] = 0xff;
        g[8] = 0x01;
        g[9] = 0x7f;
        g[10] = 3;
        g[11] = 1;
        g[12] = b'N';
        g[13] = b'U';
        g[14] = b'L';
        g[15] = b'L';
        g
    };

    #[test]
    fn salt_master_greeting_parses_as_zmtp_3_1_null() {
        let g = Greeting::parse(&SALT_MASTER_GREETING).unwrap();
        assert_eq!((g.major, g.minor), (3, 1));
        assert_eq!(g.mechanism, Mechanism::NULL);
        assert!(!g.as_server);
        assert!(g.supports_3_1());
    }

    #[test]
    fn our_greeting_round_trips() {
        let g = Greeting::ours(true);
        assert_eq!(Greeting::parse(&g.encode()).unwrap(), g);
        assert_eq!(&g.encode()[..12], b"\xff\0\0\0\0\0\0\0\0\x7f\x03\x01");
    }

    #[test]
    fn bad_signature_is_rejected() {
        let mut g = SALT_MASTER_GREETING;
        g[9] = 0x7e;
        assert!(matches!(Greeting::parse(&g), Err(ZmtpError::BadSignature)));
        let mut g = SALT_MASTER_GREETING;
        g[0] = 0x00;
        assert!(matches!(Greeting::parse(&g), Err(ZmtpError::BadSignature)));
    }

    #[tokio::test]
    async fn a_peer_staging_like_libzmq_completes_the_exchange() {
        let (mut a, mut b) = tokio::io::duplex(256);
        let peer = tokio::spawn(async move {
            // Behave like libzmq: signature first, then wait (our whole greeting is already
            // there; libzmq reads it piece by piece).
            b.write_all(&SALT_MASTER_GREETING[..10]).await.unwrap();
            let mut sig = [0u8; 10];
            b.read_exact(&mut sig).await.unwrap();
            b.write_all(&SALT_MASTER_GREETING[10..11]).await.unwrap();
            let mut major = [0u8; 1];
            b.read_exact(&mut major).await.unwrap();
            assert_eq!(major[0], 3);
            b.write_all(&SALT_MASTER_GREETING[11..]).await.unwrap();
            let mut rest = [0u8; 53];
            b.read_exact(&mut rest).await.unwrap();
            rest
        });
        let g = exchange(&mut a, &Greeting::ours(false)).await.unwrap();
        assert_eq!(g.minor, 1);
        let rest = peer.await.unwrap();
        assert_eq!(&rest[1..5], b"NULL");
    }

    #[tokio::test]
    async fn zmtp_2_peer_is_refused() {
        let (mut a, mut b) = tokio::io::duplex(256);
        tokio::spawn(async move {
            let mut g = SALT_MASTER_GREETING;
            g[10] = 1;
            b.write_all(&g).await.unwrap();
            let mut sink = Vec::new();
            let _ = b.read_to_end(&mut sink).await;
        });
        let err = exchange(&mut a, &Greeting::ours(false)).await.unwrap_err();
        assert!(matches!(
            err,
            ZmtpError::UnsupportedVersion { major: 1, .. }
        ));
    }

    #[tokio::test]
    async fn curve_peer_is_refused() {
        let (mut a, mut b) = tokio::io::duplex(256);
        tokio::spawn(async move {
            let mut g = SALT_MASTER_GREETING;
            g[12..17].copy_from_slice(b"CURVE");
            b.write_all(&g).await.unwrap();
            let mut sink = Vec::new();
            let _ = b.read_to_end(&mut sink).await;
        });
        let err = exchange(&mut a, &Greeting::ours(false)).await.unwrap_err();
        assert!(matches!(err, ZmtpError::UnsupportedMechanism(ref m) if m == "CURVE"));
    }

    #[tokio::test]
    async fn our_greeting_and_what_follows_go_out_before_the_peer_says_anything() {
        let (mut a, mut b) = tokio::io::duplex(256);
        let peer = tokio::spawn(async move {
            // Read our greeting and the trailer before sending a byte: a side that waited for
            // the peer before sending would deadlock here.
            let mut got = [0u8; GREETING_LEN + 3];
            b.read_exact(&mut got).await.unwrap();
            b.write_all(&SALT_MASTER_GREETING).await.unwrap();
            got
        });
        let g = exchange_then(&mut a, &Greeting::ours(true), b"RDY")
            .await
            .unwrap();
        assert_eq!((g.major, g.minor), (3, 1));
        let got = peer.await.unwrap();
        assert_eq!(
            Greeting::parse(got[..GREETING_LEN].try_into().unwrap()).unwrap(),
            Greeting::ours(true)
        );
        assert_eq!(&got[GREETING_LEN..], b"RDY");
    }

    #[tokio::test]
    async fn a_zmtp_2_peer_that_stops_after_its_major_is_refused_at_once() {
        let (mut a, mut b) = tokio::io::duplex(256);
        tokio::spawn(async move {
            // Signature and major 2, then it waits for a ZMTP 2 reply that never comes.
            let mut g = SALT_MASTER_GREETING;
            g[10] = 2;
            b.write_all(&g[..11]).await.unwrap();
            let mut sink = Vec::new();
            let _ = b.read_to_end(&mut sink).await;
        });
        let err = exchange(&mut a, &Greeting::ours(false)).await.unwrap_err();
        assert!(
            matches!(err, ZmtpError::UnsupportedVersion { major: 2, .. }),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_peer_that_closes_mid_greeting_is_an_eof() {
        let (mut a, mut b) = tokio::io::duplex(256);
        tokio::spawn(async move {
            b.write_all(&SALT_MASTER_GREETING[..20]).await.unwrap();
        });
        let err = exchange(&mut a, &Greeting::ours(false)).await.unwrap_err();
        assert!(matches!(err, ZmtpError::Eof), "{err:?}");
    }
}
