//! The server side of the websocket opening handshake and the server's frames (RFC 6455), as
//! Salt's aiohttp servers (`aiohttp.web.WebSocketResponse`) answer them: the client's
//! `GET <any path> HTTP/1.1` with `Upgrade: websocket`, `Connection: upgrade`, a
//! `Sec-WebSocket-Key` (16 bytes, base64) and `Sec-WebSocket-Version: 13` is answered `101
//! Switching Protocols` with the `Sec-WebSocket-Accept` of the key; anything else gets a `400`
//! naming what was wrong, and the connection ends. No extension is agreed (Salt's aiohttp
//! client offers none: `ws_connect(compress=0)`), no subprotocol. Server frames are unmasked.
//!
//! [`read_upgrade`] is bounded by [`super::MAX_HANDSHAKE`], works on any split of the bytes
//! (`Ok(None)` until the blank line), and never panics.

use base64::Engine;

use super::{accept_key, has_token, header_line, truncate as short, WsError, MAX_HANDSHAKE};

/// What a valid upgrade request asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgrade {
    /// The request target (`/ws` for Salt's publish client, `/` for a minion's requests).
    pub path: String,
    /// `Sec-WebSocket-Key`, as sent.
    pub key: String,
    /// Length of the request head (frames may follow it in the same bytes).
    pub len: usize,
}

/// Reads a client's upgrade request from the start of `buf`: `Ok(None)` while incomplete.
pub fn read_upgrade(buf: &[u8]) -> Result<Option<Upgrade>, WsError> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HANDSHAKE {
            return Err(WsError::HandshakeTooLarge(MAX_HANDSHAKE));
        }
        let n = buf.len().min(4);
        if !b"GET ".starts_with(&buf[..n]) {
            return Err(WsError::Handshake(format!(
                "the request does not begin with `GET ` (byte {} is 0x{:02x})",
                buf.iter()
                    .zip(b"GET ")
                    .position(|(a, b)| a != b)
                    .unwrap_or(0),
                buf.iter()
                    .zip(b"GET ")
                    .find(|(a, b)| a != b)
                    .map_or(0, |(a, _)| *a)
            )));
        }
        return Ok(None);
    };
    if end > MAX_HANDSHAKE {
        return Err(WsError::HandshakeTooLarge(MAX_HANDSHAKE));
    }
    let head = std::str::from_utf8(&buf[..end])
        .map_err(|e| WsError::Handshake(format!("the request head is not UTF-8 ({e})")))?;
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let parts: Vec<&str> = line.split(' ').collect();
    let (method, path, version) = match parts.as_slice() {
        [m, p, v] => (*m, *p, *v),
        _ => {
            return Err(WsError::Handshake(format!(
                "request line {:?} is not `GET <path> HTTP/1.1`",
                short(line)
            )))
        }
    };
    if method != "GET" {
        return Err(WsError::Handshake(format!(
            "method {:?}: a websocket upgrade is a GET",
            short(method)
        )));
    }
    if version != "HTTP/1.1" {
        return Err(WsError::Handshake(format!(
            "version {:?}: a websocket upgrade needs HTTP/1.1",
            short(version)
        )));
    }
    let (mut upgrade, mut connection, mut key, mut ver) = (false, false, None, None);
    for l in lines {
        let (name, value) = header_line(l)?;
        match name.to_ascii_lowercase().as_str() {
            "upgrade" => upgrade |= has_token(value, "websocket"),
            "connection" => connection |= has_token(value, "upgrade"),
            "sec-websocket-key" => key = Some(value.to_string()),
            "sec-websocket-version" => ver = Some(value.to_string()),
            _ => {}
        }
    }
    if !upgrade {
        return Err(WsError::Handshake(
            "no `Upgrade: websocket` header (a plain HTTP request, or another transport)".into(),
        ));
    }
    if !connection {
        return Err(WsError::Handshake("no `Connection: upgrade` header".into()));
    }
    if ver.as_deref() != Some("13") {
        return Err(WsError::Handshake(format!(
            "Sec-WebSocket-Version {:?}: only 13 is spoken",
            ver.as_deref().map(short)
        )));
    }
    let Some(key) = key else {
        return Err(WsError::Handshake("no Sec-WebSocket-Key header".into()));
    };
    match base64::engine::general_purpose::STANDARD.decode(&key) {
        Ok(b) if b.len() == 16 => {}
        _ => {
            return Err(WsError::Handshake(format!(
                "Sec-WebSocket-Key {:?} is not 16 bytes in base64",
                short(&key)
            )))
        }
    }
    Ok(Some(Upgrade {
        path: path.to_string(),
        key,
        len: end + 4,
    }))
}

/// The `101` answer to an upgrade with `key`.
pub fn upgrade_response(key: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        accept_key(key)
    )
    .into_bytes()
}

/// The `400` answer to a request that is not an upgrade, naming why.
pub fn refusal_response(why: &str) -> Vec<u8> {
    let body = format!("{why}\n");
    format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// One server frame (FIN set, unmasked).
pub fn server_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 10);
    out.push(0x80 | (opcode & 0x0f));
    let n = payload.len();
    if n < 126 {
        out.push(n as u8);
    } else if n <= 0xffff {
        out.push(126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    out.extend_from_slice(payload);
    out
}

/// A close frame's payload: the code, big-endian.
pub fn close_payload(code: u16) -> [u8; 2] {
    code.to_be_bytes()
}

/// RFC 6455 close codes used here.
pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_PROTOCOL: u16 = 1002;
pub const CLOSE_TOO_BIG: u16 = 1009;

#[cfg(test)]
#[path = "upgrade_tests.rs"]
mod tests;
