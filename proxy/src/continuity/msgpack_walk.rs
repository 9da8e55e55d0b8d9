//! Where each message of Salt's `tcp` stream ends, read from the bytes as they pass (the `tcp`
//! counterpart of [`super::track::Scanner`] for ZMTP): a stream of msgpack maps back to back
//! with no length prefix (`salt.transport.frame.frame_msg`).
//!
//! [`Walker`] follows msgpack's structure across any chunking, one header at a time: no copy of
//! the stream, a stack of the containers open (at most [`MAX_DEPTH`] deep) and at most 5 header
//! bytes held. [`head_mid`] reads the `mid` of a message's `head` from its first bytes.
//!
//! What it refuses (the tracker then gives up for good): a message that is not a map (a ZMTP
//! greeting starts 0xff, a TLS record 0x16), the marker 0xc1, nesting over [`MAX_DEPTH`], a
//! message declared over the walker's limit.

use saltgate_wire::envelope::{self, MAX_DEPTH};
use saltgate_wire::salt_tcp::scan;

/// The stream is not Salt's `tcp` framing (or is over the limits): the walker stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broken;

/// How one msgpack marker continues: bytes of a length field, payload bytes known from the
/// marker, values that follow (from the marker), and what the length field counts.
#[derive(Clone, Copy)]
struct Shape {
    len_bytes: usize,
    fixed: u64,
    items: u64,
    /// The length field counts: 0 payload bytes, 1 array items, 2 map entries (two values each).
    counts: u8,
}

fn shape(m: u8) -> Result<Shape, Broken> {
    let s = |len_bytes, fixed, items, counts| Shape {
        len_bytes,
        fixed,
        items,
        counts,
    };
    Ok(match m {
        0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => s(0, 0, 0, 0),
        0x80..=0x8f => s(0, 0, 2 * u64::from(m & 0x0f), 0),
        0x90..=0x9f => s(0, 0, u64::from(m & 0x0f), 0),
        0xa0..=0xbf => s(0, u64::from(m & 0x1f), 0, 0),
        0xc1 => return Err(Broken),
        0xc4 | 0xd9 => s(1, 0, 0, 0),
        0xc5 | 0xda => s(2, 0, 0, 0),
        0xc6 | 0xdb => s(4, 0, 0, 0),
        0xc7 => s(1, 1, 0, 0),
        0xc8 => s(2, 1, 0, 0),
        0xc9 => s(4, 1, 0, 0),
        0xcc | 0xd0 => s(0, 1, 0, 0),
        0xcd | 0xd1 => s(0, 2, 0, 0),
        0xca | 0xce | 0xd2 => s(0, 4, 0, 0),
        0xcb | 0xcf | 0xd3 => s(0, 8, 0, 0),
        0xd4 => s(0, 2, 0, 0),
        0xd5 => s(0, 3, 0, 0),
        0xd6 => s(0, 5, 0, 0),
        0xd7 => s(0, 9, 0, 0),
        0xd8 => s(0, 17, 0, 0),
        0xdc => s(2, 0, 0, 1),
        0xdd => s(4, 0, 0, 1),
        0xde => s(2, 0, 0, 2),
        0xdf => s(4, 0, 0, 2),
    })
}

/// Follows one direction of a `tcp` stream (see the module docs).
#[derive(Debug, Default)]
pub struct Walker {
    /// Values still to read at each open level; empty between messages.
    levels: Vec<u64>,
    /// Payload bytes of the current value still to pass.
    skip: u64,
    /// The current value's header (marker and length field), while it arrives.
    hdr: [u8; 5],
    hdr_len: usize,
    /// Bytes of the current message so far.
    size: u64,
    max: u64,
    broken: bool,
}

impl Walker {
    /// Refuses messages of over `max` bytes (as soon as a declared size says so).
    pub fn new(max: u64) -> Self {
        Walker {
            max,
            ..Default::default()
        }
    }

    /// Between two messages.
    pub fn at_boundary(&self) -> bool {
        self.levels.is_empty() && self.skip == 0 && self.hdr_len == 0 && !self.broken
    }

    /// Takes bytes of the stream up to the end of the current message: returns how many it took
    /// and whether a message ended there (then the rest of `b` starts the next one).
    pub fn feed(&mut self, b: &[u8]) -> Result<(usize, bool), Broken> {
        if self.broken {
            return Err(Broken);
        }
        let r = self.walk(b);
        if r.is_err() {
            self.broken = true;
            self.levels = Vec::new();
        }
        r
    }

    fn walk(&mut self, b: &[u8]) -> Result<(usize, bool), Broken> {
        let mut i = 0;
        while i < b.len() {
            if self.skip > 0 {
                let n = self.skip.min((b.len() - i) as u64);
                self.skip -= n;
                i += n as usize;
                if self.skip == 0 && self.close_levels() {
                    return Ok((i, true));
                }
                continue;
            }
            let m = b[i];
            if self.hdr_len == 0 && self.levels.is_empty() {
                // A message starts: Salt's is a map.
                if !matches!(m, 0x80..=0x8f | 0xde | 0xdf) {
                    return Err(Broken);
                }
                self.levels.push(1);
                self.size = 0;
            }
            self.hdr[self.hdr_len] = m;
            self.hdr_len += 1;
            i += 1;
            let s = shape(self.hdr[0])?;
            if self.hdr_len < 1 + s.len_bytes {
                continue;
            }
            let n = self.hdr[1..self.hdr_len]
                .iter()
                .fold(0u64, |a, b| (a << 8) | u64::from(*b));
            let (skip, items) = match s.counts {
                0 => (s.fixed + n, s.items),
                1 => (s.fixed, n),
                _ => (s.fixed, 2 * n),
            };
            self.size += self.hdr_len as u64;
            self.hdr_len = 0;
            // Every value is at least one byte: a count that cannot fit is refused at once.
            if self.size + skip + items > self.max {
                return Err(Broken);
            }
            self.size += skip;
            if let Some(top) = self.levels.last_mut() {
                *top -= 1;
            }
            if items > 0 {
                if self.levels.len() > MAX_DEPTH {
                    return Err(Broken);
                }
                self.levels.push(items);
            }
            self.skip = skip;
            if skip == 0 && self.close_levels() {
                return Ok((i, true));
            }
        }
        Ok((i, false))
    }

    /// Closes the levels that are complete; true when the message is.
    fn close_levels(&mut self) -> bool {
        while self.levels.last() == Some(&0) {
            self.levels.pop();
        }
        self.levels.is_empty()
    }
}

/// The most of a message's start read for its `head` (Salt's is `{"mid": <uuid4>}`, 45 bytes).
pub const MAX_HEAD: usize = 1024;

/// What the first bytes of a message say of its `head`.
#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// More bytes are needed.
    More,
    /// The `mid` of the `head`.
    Mid(Vec<u8>),
    /// Not `{"head": {"mid": str|bin, ...}, ...}` with `head` first, within [`MAX_HEAD`] bytes.
    Bad,
}

/// Reads the `mid` from the start of a message. Salt writes `head` first (`frame_msg` builds the
/// dict `head`, then `body`), as do saltgate-master and saltgate-minion.
pub fn head_mid(prefix: &[u8]) -> Head {
    let hdr = match prefix.first() {
        None => return Head::More,
        Some(0x81..=0x8f) => 1,
        Some(0xde) => 3,
        Some(0xdf) => 5,
        Some(_) => return Head::Bad,
    };
    if prefix.len() < hdr {
        return Head::More;
    }
    let mut pos = hdr;
    // The next whole value: Ok(Some) decoded, Ok(None) incomplete, Err not readable here.
    let next = |pos: &mut usize| match scan(&prefix[*pos..], MAX_HEAD) {
        Ok(Some(len)) => {
            let v = envelope::decode(&prefix[*pos..*pos + len]).map_err(|_| ());
            *pos += len;
            v.map(Some)
        }
        Ok(None) if prefix.len() < MAX_HEAD => Ok(None),
        _ => Err(()),
    };
    let key = match next(&mut pos) {
        Ok(Some(k)) => k,
        Ok(None) => return Head::More,
        Err(()) => return Head::Bad,
    };
    if envelope::as_bytes(&key) != Some(b"head") {
        return Head::Bad;
    }
    match next(&mut pos) {
        Ok(Some(head)) => envelope::get(&head, "mid")
            .and_then(envelope::as_bytes)
            .filter(|m| !m.is_empty())
            .map_or(Head::Bad, |m| Head::Mid(m.to_vec())),
        Ok(None) => Head::More,
        Err(()) => Head::Bad,
    }
}
