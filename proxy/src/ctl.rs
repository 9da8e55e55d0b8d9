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
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
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
    out.push_str(&format!("config generation {}\n", masters["generation"]));
    out
}
