//! ZMTP command bodies: READY (with metadata properties), PING/PONG (ZMTP 3.1 heartbeats),
//! SUBSCRIBE/CANCEL (ZMTP 3.1 subscriptions), ERROR, and anything else kept as `Unknown`.
//!
//! Owns the layout inside a command frame (`name-size name body`); framing is in
//! [`super::frame`]. Parsing is bounds-checked and never panics.

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

use super::frame::{encode_frame, FLAG_COMMAND};

/// Errors in a command body.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CommandError {
    #[error("empty command frame")]
    Empty,
    #[error("command name of {0} bytes runs past the frame")]
    NameTruncated(usize),
    #[error("malformed {0} command")]
    Malformed(&'static str),
    #[error("READY property {0:?} is truncated")]
    PropertyTruncated(String),
}

/// Metadata properties of a READY command, in wire order. Names are kept as the raw bytes the
/// peer sent (so parsing and re-encoding is exact) and compare ASCII-case-insensitively.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties(pub Vec<(Bytes, Bytes)>);

impl Properties {
    pub fn get(&self, name: &str) -> Option<&Bytes> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    pub fn with(mut self, name: &str, value: impl Into<Bytes>) -> Self {
        self.0
            .push((Bytes::copy_from_slice(name.as_bytes()), value.into()));
        self
    }
}

/// The longest PING context ZMTP 3.1 allows.
pub const MAX_PING_CONTEXT: usize = 16;

/// A parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Ready(Properties),
    /// `ttl` is in tenths of a second (0 = none), as on the wire.
    Ping {
        ttl: u16,
        context: Bytes,
    },
    Pong {
        context: Bytes,
    },
    Subscribe(Bytes),
    Cancel(Bytes),
    Error(Bytes),
    Unknown {
        name: Bytes,
        body: Bytes,
    },
}

impl Command {
    pub fn name(&self) -> &[u8] {
        match self {
            Command::Ready(_) => b"READY",
            Command::Ping { .. } => b"PING",
            Command::Pong { .. } => b"PONG",
            Command::Subscribe(_) => b"SUBSCRIBE",
            Command::Cancel(_) => b"CANCEL",
            Command::Error(_) => b"ERROR",
            Command::Unknown { name, .. } => name,
        }
    }

    /// Parses a command frame body.
    pub fn parse(frame: &Bytes) -> Result<Self, CommandError> {
        let (&len, _) = frame.split_first().ok_or(CommandError::Empty)?;
        let len = usize::from(len);
        let name = frame
            .get(1..1 + len)
            .ok_or(CommandError::NameTruncated(len))?;
        let body = frame.slice(1 + len..);
        Ok(match name {
            b"READY" => Command::Ready(parse_properties(&body)?),
            b"PING" => {
                let ttl: [u8; 2] = body
                    .get(..2)
                    .and_then(|s| s.try_into().ok())
                    .ok_or(CommandError::Malformed("PING"))?;
                let ttl = u16::from_be_bytes(ttl);
                let context = body.slice(2..);
                if context.len() > MAX_PING_CONTEXT {
                    return Err(CommandError::Malformed("PING"));
                }
                Command::Ping { ttl, context }
            }
            b"PONG" => Command::Pong { context: body },
            b"SUBSCRIBE" => Command::Subscribe(body),
            b"CANCEL" => Command::Cancel(body),
            b"ERROR" => {
                // reason-size (1 byte) + reason; keep the reason text, tolerate a bad size.
                let reason = match body.split_first() {
                    Some((&n, rest)) => rest.get(..usize::from(n)).unwrap_or(rest),
                    None => &[],
                };
                Command::Error(Bytes::copy_from_slice(reason))
            }
            _ => Command::Unknown {
                name: frame.slice(1..1 + len),
                body,
            },
        })
    }

    /// The command body (name-size, name, data), without frame header.
    pub fn encode_body(&self) -> BytesMut {
        let mut out = BytesMut::new();
        let name = self.name();
        // Names we emit are short; an Unknown name longer than 255 bytes is cut.
        let name = name.get(..255).unwrap_or(name);
        out.put_u8(name.len() as u8);
        out.put_slice(name);
        match self {
            Command::Ready(props) => {
                for (k, v) in &props.0 {
                    let k = k.get(..255).unwrap_or(k);
                    out.put_u8(k.len() as u8);
                    out.put_slice(k);
                    out.put_u32(v.len() as u32);
                    out.put_slice(v);
                }
            }
            Command::Ping { ttl, context } => {
                out.put_u16(*ttl);
                out.put_slice(context.get(..MAX_PING_CONTEXT).unwrap_or(context));
            }
            Command::Pong { context } => out.put_slice(context),
            Command::Subscribe(t) | Command::Cancel(t) => out.put_slice(t),
            Command::Error(reason) => {
                let r = reason.get(..255).unwrap_or(reason);
                out.put_u8(r.len() as u8);
                out.put_slice(r);
            }
            Command::Unknown { body, .. } => out.put_slice(body),
        }
        out
    }

    /// Appends this command as a complete command frame.
    pub fn encode_frame(&self, dst: &mut BytesMut) {
        encode_frame(dst, FLAG_COMMAND, &self.encode_body());
    }
}

fn parse_properties(mut body: &[u8]) -> Result<Properties, CommandError> {
    let mut props = Vec::new();
    while let Some((&nlen, rest)) = body.split_first() {
        let truncated = |name: &str| CommandError::PropertyTruncated(name.to_owned());
        let (name, rest) =
            split_at_checked(rest, usize::from(nlen)).ok_or_else(|| truncated(""))?;
        let shown = String::from_utf8_lossy(name).into_owned();
        let (vlen, rest) = split_at_checked(rest, 4).ok_or_else(|| truncated(&shown))?;
        let vlen: [u8; 4] = vlen.try_into().map_err(|_| truncated(&shown))?;
        let vlen = u32::from_be_bytes(vlen) as usize;
        let (value, rest) = split_at_checked(rest, vlen).ok_or_else(|| truncated(&shown))?;
        props.push((Bytes::copy_from_slice(name), Bytes::copy_from_slice(value)));
        body = rest;
    }
    Ok(Properties(props))
}

/// `slice::split_at` that returns `None` instead of panicking.
pub(crate) fn split_at_checked(s: &[u8], mid: usize) -> Option<(&[u8], &[u8])> {
    if mid <= s.len() {
        Some(s.split_at(mid))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_round_trips_socket_type_and_identity() {
        let ready = Command::Ready(
            Properties::default()
                .with("Socket-Type", &b"ROUTER"[..])
                .with("Identity", &b""[..]),
        );
        let body = ready.encode_body().freeze();
        assert_eq!(
            &body[..],
            b"\x05READY\x0bSocket-Type\x00\x00\x00\x06ROUTER\x08Identity\x00\x00\x00\x00"
        );
        let parsed = Command::parse(&body).unwrap();
        assert_eq!(parsed, ready);
        let Command::Ready(p) = parsed else { panic!() };
        assert_eq!(p.get("socket-type").unwrap(), &b"ROUTER"[..]);
    }

    #[test]
    fn salt_master_ping_parses_with_zero_ttl_and_empty_context() {
        // Seen on the wire from a 3008.5 master: 04 07 04 'PING' 00 00
        let cmd = Command::parse(&Bytes::from_static(b"\x04PING\x00\x00")).unwrap();
        assert_eq!(
            cmd,
            Command::Ping {
                ttl: 0,
                context: Bytes::new()
            }
        );
    }

    #[test]
    fn ping_with_ttl_and_context_round_trips() {
        let ping = Command::Ping {
            ttl: 300,
            context: Bytes::from_static(b"ctx"),
        };
        assert_eq!(Command::parse(&ping.encode_body().freeze()).unwrap(), ping);
    }

    #[test]
    fn pong_echoes_context() {
        let pong = Command::Pong {
            context: Bytes::from_static(b"abc"),
        };
        assert_eq!(&pong.encode_body()[..], b"\x04PONGabc");
    }

    #[test]
    fn subscribe_and_cancel_carry_the_topic() {
        assert_eq!(
            Command::parse(&Bytes::from_static(b"\x09SUBSCRIBEtopic")).unwrap(),
            Command::Subscribe(Bytes::from_static(b"topic"))
        );
        assert_eq!(
            Command::parse(&Bytes::from_static(b"\x06CANCEL")).unwrap(),
            Command::Cancel(Bytes::new())
        );
    }

    #[test]
    fn truncated_commands_are_errors_not_panics() {
        for body in [
            &b""[..],
            b"\x09SUB",
            b"\x04PING\x00",
            b"\x05READY\x03abc\x00\x00",
            b"\x05READY\x03abc\x00\x00\x00\x09xx",
            b"\x05READY\x09",
            b"\x04PING\x00\x00012345678901234567",
        ] {
            assert!(
                Command::parse(&Bytes::copy_from_slice(body)).is_err(),
                "{body:?}"
            );
        }
    }

    #[test]
    fn ready_with_non_utf8_property_names_round_trips_exactly() {
        // Found while writing the fuzz target's parse -> encode -> parse property: names used to
        // be decoded lossily, so 200 invalid bytes grew past the 255-byte limit on re-encode.
        let mut body = b"\x05READY\xc8".to_vec();
        body.extend_from_slice(&[0xff; 200]);
        body.extend_from_slice(b"\x00\x00\x00\x01v");
        let cmd = Command::parse(&Bytes::from(body.clone())).unwrap();
        assert_eq!(&cmd.encode_body()[..], &body[..]);
    }

    #[test]
    fn unknown_commands_are_kept_not_rejected() {
        let cmd = Command::parse(&Bytes::from_static(b"\x05HELLOxyz")).unwrap();
        assert_eq!(
            cmd,
            Command::Unknown {
                name: Bytes::from_static(b"HELLO"),
                body: Bytes::from_static(b"xyz")
            }
        );
    }
}
