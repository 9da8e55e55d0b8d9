//! `saltgate ctl`: a small client of the admin API that prints readable tables and exits non-zero
//! with a clear message when the API is unreachable or refuses.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// How long `ctl` waits for the API by default (`--timeout`).
pub const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("cannot reach the admin API at {addr}: {reason}; check that saltgate runs with admin.enabled and admin.bind = {addr} (or pass --admin)")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("no answer from the admin API at {addr} within {after:?}; check that saltgate is not overloaded, or give more time with --timeout (a reload may take a while)")]
    Timeout { addr: SocketAddr, after: Duration },
    #[error("the admin API refused: HTTP {status}: {message}")]
    Refused { status: u16, message: String },
    #[error("unexpected answer from the admin API: {0}")]
    Protocol(String),
}

/// Sends one request; returns the JSON body of a 2xx answer, or [`CtlError::Timeout`] after
/// `timeout`.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<Value, CtlError> {
    let unreachable = |reason: String| CtlError::Unreachable { addr, reason };
    let fut = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr.to_string());
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|e| CtlError::Protocol(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| CtlError::Protocol(e.to_string()))?
            .to_bytes();
        let json: Value = serde_json::from_slice(&body)
            .map_err(|e| CtlError::Protocol(format!("{e}: {}", String::from_utf8_lossy(&body))))?;
        if !(200..300).contains(&status) {
            let message = json
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no message")
                .to_string();
            return Err(CtlError::Refused { status, message });
        }
        Ok(json)
    };
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or(Err(CtlError::Timeout {
            addr,
            after: timeout,
        }))
}

/// The `ctl status` table.
pub fn status_table(masters: &Value) -> String {
    let mut rows = vec![[
        "MASTER",
        "STATE",
        "PUBLISH",
        "SESS",
        "REQUEST",
        "SESS",
        "LAST CHECK",
    ]
    .map(String::from)
    .to_vec()];
    for m in masters["masters"].as_array().into_iter().flatten() {
        let s = |v: &Value| v.as_str().unwrap_or("-").to_string();
        let check = |p: &Value| {
            if p["last_check"]["ok"].as_bool() == Some(true) {
                "ok".to_string()
            } else {
                s(&p["last_check"]["detail"])
            }
        };
        let (p, r) = (&m["publish"], &m["request"]);
        let last = match (check(p).as_str(), check(r).as_str()) {
            ("ok", "ok") => "ok".to_string(),
            ("ok", e) => format!("request: {e}"),
            (e, _) => format!("publish: {e}"),
        };
        rows.push(vec![
            s(&m["name"]),
            s(&m["state"]),
            s(&p["addr"]),
            p["sessions"].to_string(),
            s(&r["addr"]),
            r["sessions"].to_string(),
            last,
        ]);
    }
    let mut out = columns(&rows);
    out.push_str(&format!("config generation {}\n", masters["generation"]));
    out
}

/// Rows as left-aligned columns, two spaces apart (widths in characters).
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..n)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// A query-string value, percent-encoded (minion ids may hold `&`, `#`, `+`, spaces...).
fn query_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Minions asked per page by `ctl minions`.
pub const MINIONS_PAGE: usize = 1000;

/// Every minion of `GET /api/v1/minions`, page after page.
pub async fn minions(
    addr: SocketAddr,
    token: Option<&str>,
    timeout: Duration,
) -> Result<Vec<Value>, CtlError> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            None => format!("/api/v1/minions?limit={MINIONS_PAGE}"),
            Some(a) => format!(
                "/api/v1/minions?limit={MINIONS_PAGE}&after={}",
                query_value(a)
            ),
        };
        let page = call(addr, "GET", &path, token, timeout).await?;
        let list = page["minions"]
            .as_array()
            .ok_or_else(|| CtlError::Protocol(format!("no minions list in {page}")))?;
        all.extend(list.iter().cloned());
        match page["next_after"].as_str() {
            Some(next) if after.as_deref() != Some(next) => after = Some(next.to_string()),
            _ => return Ok(all),
        }
    }
}

/// `3s`, `4m05s`, `2h13m`, `3d04h`.
fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// The `ctl minions` table; `now_ms` is the wall clock (milliseconds since the Unix epoch).
pub fn minions_table(minions: &[Value], now_ms: u64) -> String {
    let mut rows = vec![[
        "MINION",
        "CLIENT",
        "PUBLISH",
        "REQUEST",
        "STATE",
        "FIRST SEEN",
        "LAST SEEN",
    ]
    .map(String::from)
    .to_vec()];
    let s = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let ago = |v: &Value| {
        v.as_u64()
            .map(|t| format!("{} ago", age(now_ms.saturating_sub(t))))
            .unwrap_or_else(|| "-".into())
    };
    let mut connected = 0;
    for m in minions {
        let publish = match m["publish_pairing"].as_str() {
            Some("ambiguous") => {
                let c: Vec<&str> = m["publish_candidates"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                format!("{}?", c.join("|"))
            }
            Some("fanout") => "(fan-out)".into(),
            _ => s(&m["publish_master"]),
        };
        let state = if m["connected"].as_bool() == Some(true) {
            connected += 1;
            "connected".to_string()
        } else {
            match m["expires_in_s"].as_u64() {
                Some(n) => format!("gone, listed {}", age(n * 1000)),
                None => "gone".into(),
            }
        };
        rows.push(vec![
            s(&m["id"]),
            s(&m["client"]),
            publish,
            s(&m["request_master"]),
            state,
            ago(&m["first_seen"]),
            ago(&m["last_seen"]),
        ]);
    }
    let mut out = columns(&rows);
    out.push_str(&format!(
        "{} minion(s), {connected} connected; PUBLISH a|b? = publish sessions from that address on several masters (several minions behind one address)\n",
        minions.len()
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_minions_table_shows_masters_states_and_ages() {
        let now = 1_000_000_000;
        let list = [
            json!({"id": "web1", "client": "10.0.0.5:40001", "publish_master": "a", "publish_pairing": "by-address",
                   "request_master": "b", "connected": true, "first_seen": now - 125_000, "last_seen": now - 3_000}),
            json!({"id": "nat-7", "client": "192.0.2.9:1", "publish_master": null, "publish_pairing": "ambiguous",
                   "publish_candidates": ["a", "c"], "request_master": "c", "connected": false, "expires_in_s": 42,
                   "first_seen": now - 7_200_000, "last_seen": now - 60_000}),
        ];
        let t = minions_table(&list, now);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("MINION  "), "{t}");
        assert!(
            lines[1].contains("web1") && lines[1].contains("10.0.0.5:40001"),
            "{t}"
        );
        assert!(
            lines[1].contains("connected")
                && lines[1].contains("2m05s ago")
                && lines[1].contains("3s ago"),
            "{t}"
        );
        assert!(
            lines[2].contains("a|c?")
                && lines[2].contains("gone, listed 42s")
                && lines[2].contains("2h00m ago"),
            "{t}"
        );
        assert!(lines[3].starts_with("2 minion(s), 1 connected"), "{t}");
        // Columns line up: REQUEST starts at the same offset on every row.
        let col = lines[0].find("REQUEST").unwrap();
        assert_eq!(&lines[1][col..col + 1], "b");
        assert_eq!(&lines[2][col..col + 1], "c");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query_value("web-01.example.com"), "web-01.example.com");
        assert_eq!(query_value("a&b c#%+"), "a%26b%20c%23%25%2B");
    }
}
