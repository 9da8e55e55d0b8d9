//! ZMTP 3.x frame codec: short (1-byte size) and long (8-byte size) frames, the MORE flag and
//! command frames.
//!
//! Owns only the byte layout of frames after the greeting. It does not know what commands mean
//! (see [`super::command`]) nor how frames become messages (see [`MessageAssembler`]).
//! Decoding never panics: every size is checked against a configurable maximum before any
//! allocation, and reserved flag bits are rejected.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

/// More frames follow in this message.
pub const FLAG_MORE: u8 = 0x01;
/// The size field is 8 bytes (network order) instead of 1.
pub const FLAG_LONG: u8 = 0x02;
/// The frame is a command, not message data.
pub const FLAG_COMMAND: u8 = 0x04;
const FLAGS_KNOWN: u8 = FLAG_MORE | FLAG_LONG | FLAG_COMMAND;

/// Default limit for one frame body: 64 MiB. Salt's largest single messages are file-server
/// chunks (1 MiB by default) and big pillars; 64 MiB leaves room without letting a peer make us
/// allocate gigabytes.
pub const DEFAULT_MAX_FRAME_SIZE: usize = 64 * 1024 * 1024;

/// Default frame limit of a PUB socket: its peers only send SUBSCRIBE/CANCEL (topics are minion
/// ids or their hashes), PING/PONG and a READY, so 8 KiB is generous.
pub const PUB_DEFAULT_MAX_FRAME_SIZE: usize = 8 * 1024;

/// Default frame limit of a ROUTER socket (a master's request port): 16 MiB. Minions send
/// requests and job returns there; Salt's file-server chunks are 1 MiB (`file_buffer_size`).
/// Salt itself sets no limit (`ZMQ_MAXMSGSIZE` -1): a return bigger than this closes the
/// connection with a `TooLarge` error naming the option to raise.
pub const ROUTER_DEFAULT_MAX_FRAME_SIZE: usize = 16 * 1024 * 1024;

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A message frame; `more` says another frame of the same message follows.
    Message { body: Bytes, more: bool },
    /// A command frame; the body starts with the command name (see [`super::command::Command`]).
    Command(Bytes),
}

/// Framing errors: the peer broke the protocol.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame flags {0:#04x} have reserved bits set")]
    ReservedFlags(u8),
    #[error("frame of {size} bytes exceeds the limit of {max} bytes (raise max_frame_size)")]
    TooLarge { size: u64, max: usize },
    #[error("command frame with the MORE flag set")]
    CommandWithMore,
    #[error("message of more than {max} frames (raise max_message_frames)")]
    TooManyFrames { max: usize },
    #[error("message of {size} bytes exceeds the limit of {max} bytes (raise max_message_size)")]
    MessageTooLarge { size: usize, max: usize },
}

/// Appends one frame with the given flags; picks the short or long form by size.
pub fn encode_frame(dst: &mut BytesMut, flags: u8, body: &[u8]) {
    let flags = flags & (FLAG_MORE | FLAG_COMMAND);
    if body.len() <= 255 {
        dst.reserve(2 + body.len());
        dst.put_u8(flags);
        dst.put_u8(body.len() as u8);
    } else {
        dst.reserve(9 + body.len());
        dst.put_u8(flags | FLAG_LONG);
        dst.put_u64(body.len() as u64);
    }
    dst.put_slice(body);
}

/// Appends a whole multi-part message: every part but the last carries MORE.
/// An empty `parts` encodes one empty frame, as libzmq does for an empty message.
pub fn encode_message<B: AsRef<[u8]>>(dst: &mut BytesMut, parts: &[B]) {
    if parts.is_empty() {
        encode_frame(dst, 0, &[]);
        return;
    }
    let last = parts.len() - 1;
    for (i, part) in parts.iter().enumerate() {
        let flags = if i < last { FLAG_MORE } else { 0 };
        encode_frame(dst, flags, part.as_ref());
    }
}

/// Incremental frame decoder with a size limit.
#[derive(Debug, Clone, Copy)]
pub struct FrameDecoder {
    max_frame_size: usize,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FRAME_SIZE)
    }
}

impl FrameDecoder {
    pub fn new(max_frame_size: usize) -> Self {
        Self { max_frame_size }
    }

    pub fn max_frame_size(&self) -> usize {
        self.max_frame_size
    }

    /// Parses the header at the front of `src`: `Ok(None)` while it is incomplete, else the
    /// flags, the header length and the body size, the size already checked against the limit.
    fn header(&self, src: &[u8]) -> Result<Option<(u8, usize, usize)>, FrameError> {
        let Some(&flags) = src.first() else {
            return Ok(None);
        };
        if flags & !FLAGS_KNOWN != 0 {
            return Err(FrameError::ReservedFlags(flags));
        }
        if flags & FLAG_COMMAND != 0 && flags & FLAG_MORE != 0 {
            return Err(FrameError::CommandWithMore);
        }
        let (header_len, size) = if flags & FLAG_LONG != 0 {
            let Some(raw) = src.get(1..9) else {
                return Ok(None);
            };
            let mut size_bytes = [0u8; 8];
            size_bytes.copy_from_slice(raw);
            (9usize, u64::from_be_bytes(size_bytes))
        } else {
            let Some(&size) = src.get(1) else {
                return Ok(None);
            };
            (2usize, u64::from(size))
        };
        if size > self.max_frame_size as u64 {
            return Err(FrameError::TooLarge {
                size,
                max: self.max_frame_size,
            });
        }
        // size <= max_frame_size: usize, so the cast is lossless.
        Ok(Some((flags, header_len, size as usize)))
    }

    /// How many more bytes the frame at the front of `src` needs before [`decode`] can return
    /// it (at least 1 while its header is incomplete; 0 if it is complete). Errors as `decode`.
    ///
    /// [`decode`]: FrameDecoder::decode
    pub fn bytes_needed(&self, src: &[u8]) -> Result<usize, FrameError> {
        Ok(match self.header(src)? {
            None => match src.first() {
                Some(flags) if flags & FLAG_LONG != 0 => 9 - src.len(),
                Some(_) => 2 - src.len(),
                None => 2,
            },
            Some((_, header_len, size)) => {
                header_len.saturating_add(size).saturating_sub(src.len())
            }
        })
    }

    /// Takes one complete frame off the front of `src`, or returns `Ok(None)` if more bytes are
    /// needed. The size is checked as soon as the header is complete, before the body arrives,
    /// and nothing is reserved for the announced body: a buffer grows only as bytes arrive (a
    /// 9-byte header announcing 64 MiB costs nothing).
    pub fn decode(&self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some((flags, header_len, size)) = self.header(src)? else {
            return Ok(None);
        };
        let total = header_len.saturating_add(size);
        if src.len() < total {
            return Ok(None);
        }
        src.advance(header_len);
        let body = src.split_to(size).freeze();
        Ok(Some(if flags & FLAG_COMMAND != 0 {
            Frame::Command(body)
        } else {
            Frame::Message {
                body,
                more: flags & FLAG_MORE != 0,
            }
        }))
    }
}

/// Default limit for frames per message (Salt sends at most 3: routing id, delimiter, payload).
pub const DEFAULT_MAX_MESSAGE_FRAMES: usize = 64;

/// Collects message frames until one without MORE, with limits on count and total size.
#[derive(Debug)]
pub struct MessageAssembler {
    parts: Vec<Bytes>,
    size: usize,
    max_frames: usize,
    max_size: usize,
}

impl MessageAssembler {
    pub fn new(max_frames: usize, max_size: usize) -> Self {
        Self {
            parts: Vec::new(),
            size: 0,
            max_frames,
            max_size,
        }
    }

    /// Adds a frame; returns the whole message when `more` is false.
    pub fn push(&mut self, body: Bytes, more: bool) -> Result<Option<Vec<Bytes>>, FrameError> {
        if self.parts.len() >= self.max_frames {
            return Err(FrameError::TooManyFrames {
                max: self.max_frames,
            });
        }
        self.size = self.size.saturating_add(body.len());
        if self.size > self.max_size {
            return Err(FrameError::MessageTooLarge {
                size: self.size,
                max: self.max_size,
            });
        }
        self.parts.push(body);
        if more {
            return Ok(None);
        }
        self.size = 0;
        Ok(Some(std::mem::take(&mut self.parts)))
    }

    /// Changes the message size limit (a peer trusted later may send larger messages).
    pub fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
    }

    /// Bytes a next frame may still carry before the message exceeds its limit.
    pub fn remaining(&self) -> usize {
        self.max_size.saturating_sub(self.size)
    }

    /// True while a multi-part message is half received.
    pub fn in_progress(&self) -> bool {
        !self.parts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8], max: usize) -> Result<Vec<Frame>, FrameError> {
        let mut buf = BytesMut::from(bytes);
        let dec = FrameDecoder::new(max);
        let mut out = Vec::new();
        while let Some(f) = dec.decode(&mut buf)? {
            out.push(f);
        }
        Ok(out)
    }

    #[test]
    fn short_frame_uses_one_size_byte() {
        let mut b = BytesMut::new();
        encode_frame(&mut b, 0, b"hello");
        assert_eq!(&b[..], b"\x00\x05hello");
    }

    #[test]
    fn frame_over_255_bytes_uses_long_form() {
        let body = vec![7u8; 256];
        let mut b = BytesMut::new();
        encode_frame(&mut b, FLAG_MORE, &body);
        assert_eq!(&b[..9], &[0x03, 0, 0, 0, 0, 0, 0, 1, 0]);
        let frames = decode_all(&b, 1024).unwrap();
        assert_eq!(
            frames,
            vec![Frame::Message {
                body: Bytes::from(body),
                more: true
            }]
        );
    }

    #[test]
    fn message_parts_carry_more_except_the_last() {
        let mut b = BytesMut::new();
        encode_message(&mut b, &[&b""[..], b"payload"]);
        assert_eq!(&b[..], b"\x01\x00\x00\x07payload");
    }

    #[test]
    fn command_frame_is_recognised() {
        let frames = decode_all(b"\x04\x07\x04PING\x00\x00", 100).unwrap();
        assert_eq!(
            frames,
            vec![Frame::Command(Bytes::from_static(b"\x04PING\x00\x00"))]
        );
    }

    #[test]
    fn partial_input_waits_for_more_bytes() {
        let dec = FrameDecoder::default();
        let mut buf = BytesMut::from(&b"\x02\x00\x00"[..]);
        assert_eq!(dec.decode(&mut buf), Ok(None));
        buf.extend_from_slice(&[0, 0, 0, 0, 0, 3, b'a']);
        assert_eq!(dec.decode(&mut buf), Ok(None));
        buf.extend_from_slice(b"bc");
        assert_eq!(
            dec.decode(&mut buf),
            Ok(Some(Frame::Message {
                body: Bytes::from_static(b"abc"),
                more: false
            }))
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn oversized_frame_is_rejected_before_its_body_arrives() {
        let err = decode_all(b"\x02\xff\xff\xff\xff\xff\xff\xff\xff", 1024).unwrap_err();
        assert_eq!(
            err,
            FrameError::TooLarge {
                size: u64::MAX,
                max: 1024
            }
        );
    }

    #[test]
    fn a_header_announcing_a_huge_frame_reserves_nothing() {
        let dec = FrameDecoder::new(DEFAULT_MAX_FRAME_SIZE);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[0x02, 0, 0, 0, 0, 4, 0, 0, 0]); // 64 MiB announced
        let before = buf.capacity();
        assert_eq!(dec.decode(&mut buf), Ok(None));
        assert_eq!(
            buf.capacity(),
            before,
            "decode reserved for the announced body"
        );
        assert!(buf.capacity() < 1024);
        assert_eq!(dec.bytes_needed(&buf), Ok(64 * 1024 * 1024));
    }

    #[test]
    fn bytes_needed_counts_the_missing_header_and_body() {
        let dec = FrameDecoder::new(1024);
        assert_eq!(dec.bytes_needed(b""), Ok(2));
        assert_eq!(dec.bytes_needed(b"\x00"), Ok(1));
        assert_eq!(dec.bytes_needed(b"\x02\x00"), Ok(7));
        assert_eq!(dec.bytes_needed(b"\x00\x05ab"), Ok(3));
        assert_eq!(dec.bytes_needed(b"\x00\x02abNEXT"), Ok(0));
        assert_eq!(
            dec.bytes_needed(b"\x02\x00\x00\x00\x00\x00\x00\x08\x00"),
            Err(FrameError::TooLarge {
                size: 2048,
                max: 1024
            })
        );
    }

    #[test]
    fn reserved_flag_bits_are_a_protocol_error() {
        assert_eq!(
            decode_all(b"\x08\x00", 10),
            Err(FrameError::ReservedFlags(0x08))
        );
    }

    #[test]
    fn command_with_more_flag_is_a_protocol_error() {
        assert_eq!(
            decode_all(b"\x05\x00", 10),
            Err(FrameError::CommandWithMore)
        );
    }

    #[test]
    fn assembler_limits_frame_count_and_size() {
        let mut a = MessageAssembler::new(2, 10);
        assert_eq!(a.push(Bytes::from_static(b"a"), true), Ok(None));
        assert_eq!(
            a.push(Bytes::from_static(b"b"), false),
            Ok(Some(vec![
                Bytes::from_static(b"a"),
                Bytes::from_static(b"b")
            ]))
        );
        a.push(Bytes::new(), true).unwrap();
        a.push(Bytes::new(), true).unwrap();
        assert_eq!(
            a.push(Bytes::new(), true),
            Err(FrameError::TooManyFrames { max: 2 })
        );
        let mut a = MessageAssembler::new(8, 10);
        assert_eq!(a.remaining(), 10);
        a.push(Bytes::from_static(b"abcd"), true).unwrap();
        assert_eq!(a.remaining(), 6);
        a.push(Bytes::from_static(b"ef"), false).unwrap();
        assert_eq!(a.remaining(), 10);
        let mut a = MessageAssembler::new(8, 3);
        assert!(matches!(
            a.push(Bytes::from_static(b"abcd"), false),
            Err(FrameError::MessageTooLarge { .. })
        ));
    }
}
