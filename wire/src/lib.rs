//! Salt's wire protocol, in Rust.
//!
//! * [`transport`] — the transport seam: Salt's `zeromq`, `tcp` and `ws` behind the traits the
//!   proxy, master and minion use (request and publish channels, probes, the presence peek);
//!   ZeroMQ is the first implementation. Nothing outside this crate names [`zmtp`].
//! * [`zmtp`] — ZMTP 3.1 with the NULL mechanism on tokio: the frame codec, the staged greeting,
//!   READY, PING/PONG heartbeats, SUBSCRIBE/CANCEL, and the four socket roles Salt uses
//!   (PUB, SUB, REQ, ROUTER).
//! * [`accept`] — the accept loop every listener should use: a connection cap with permits,
//!   back-off on EMFILE/ENFILE/ENOBUFS/ENOMEM, TCP_NODELAY and keepalive.
//! * [`probe`] — health-check helpers for the proxy: read a peer's ZMTP greeting, or do Salt's
//!   clear `ping` on the request port.
//! * [`envelope`] — Salt's msgpack envelopes (request, reply, publish), tolerant of str- and
//!   bin-typed bytes alike.
//! * [`reserve`] — descriptors held back so that what must keep working (health checks, a
//!   CLI socket) still can when a flood has taken every other one.
//! * [`sniff`] — the minion id of a request connection, read passively from the client's first
//!   bytes (`_auth`, or the envelope of an `aes` request), bounded and never panicking.
//! * [`display`] — peer-chosen text (minion ids) made safe for a terminal: control and bidi
//!   characters escaped.
//! * [`jid`] — Salt's job ids: the moment a job was published, and back.
//! * [`crypticle`] — Salt's symmetric crypto (AES-192-CBC + HMAC-SHA256, `pickle::` framing).
//! * [`publish_job`] — a publish's `jid`, read with the cluster's AES key (fan-out dedup).
//! * `rsa` and [`pem`] — RSA-2048 keys in Salt's exact PEM text, OAEP-SHA1, PKCS#1 v1.5-SHA1
//!   signatures and X9.31 private-encrypt/public-decrypt. `rsa` is the default feature `rsa`,
//!   which links the system's OpenSSL; the proxy builds without it.
//! * [`salt_tcp`] and [`salt_ws`] — Salt's `tcp` and `ws` transports: framing, and the Salt-aware
//!   probes for them (TLS with feature `tls`), and the presence peeks of their plain request
//!   connections.
//! * [`sd_notify`] — systemd's readiness datagrams (`Type=notify`), for the three daemons.
//!
//! This crate knows nothing about proxies, jobs or config files. Nothing in it panics on bytes a
//! peer controls: every parser is bounds-checked and every frame size is limited.

pub mod accept;
pub mod crypticle;
pub mod display;
pub mod envelope;
pub mod jid;
mod peek_buf;
pub mod pem;
pub mod probe;
pub mod publish_job;
pub mod reserve;
#[cfg(feature = "rsa")]
pub mod rsa;
mod salt_stream;
pub mod salt_tcp;
pub mod salt_ws;
pub mod sd_notify;
pub mod signals;
pub mod sniff;
pub mod transport;
pub mod zmtp;

/// Lower-case hex of `b`, as Python's `hexdigest()` prints it (Salt's key digests and file
/// hashes).
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}
