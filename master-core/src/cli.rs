//! The local CLI socket (`<sock_dir>/saltgate_master_publish.sock`, mode 0600) and its client.
//!
//! Salt's `salt` CLI sends a clear `publish` to the master's request port authenticated by the
//! root key file; we keep clear commands off the network entirely and use a unix socket that
//! only the master's user can open. Protocol: JSON lines.
//!
//! * client → `{"tgt","tgt_type","fun","arg":[...],"timeout_secs","user"}`
//! * master → `{"jid","minions":[expected ids]}`, then one `{"minion","return":{...}}` per
//!   return as it arrives, then `{"done":true,"missing":[ids]}` (or `{"error":"..."}`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value as Json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::jobbook::JobBook;
use crate::publish::{Publish, PublishRequest};
use crate::target::{Target, TargetType};

/// Longest request line accepted from a CLI client.
pub const MAX_LINE: u64 = 1024 * 1024;
/// Longest wait a client may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Descriptors held back for the CLI socket: when a flood on a network port has taken every
/// other one (EMFILE), the operator's `publish` and key rotation still get through.
pub const CLI_RESERVE: usize = 4;

static RESERVE: saltgate_wire::reserve::Reserve = saltgate_wire::reserve::Reserve::new(CLI_RESERVE);

pub(crate) async fn serve(listener: UnixListener, publish: Arc<Publish>, jobs: Arc<JobBook>) {
    // Exhaustion warns once per episode (a flood used to log EMFILE ten times a second).
    let mut exhausted = false;
    loop {
        RESERVE.refill();
        match listener.accept().await {
            Ok((stream, _)) => {
                if exhausted {
                    tracing::info!("CLI socket accepts again");
                    exhausted = false;
                }
                tokio::spawn(serve_one(stream, publish.clone(), jobs.clone()));
            }
            Err(e) if saltgate_wire::accept::is_exhaustion(&e) && RESERVE.release_one() => {
                // Accept again at once, on a reserved descriptor.
                if !exhausted {
                    tracing::warn!(error = %e, "out of descriptors: the CLI socket uses its reserve");
                    exhausted = true;
                }
            }
            Err(e) => {
                if !exhausted {
                    tracing::warn!(error = %e, "CLI socket accept failed; backing off");
                    exhausted = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn parse_request(line: &str) -> Result<(PublishRequest, Target, Duration), String> {
    let v: Json = serde_json::from_str(line).map_err(|e| format!("request is not JSON: {e}"))?;
    let s = |k: &str| v.get(k).and_then(Json::as_str);
    let tgt = s("tgt").ok_or("missing tgt")?.to_string();
    let fun = s("fun").ok_or("missing fun")?.to_string();
    if fun.is_empty()
        || fun.len() > 255
        || !fun
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_'))
    {
        return Err(format!("{fun:?} is not a function name such as test.ping"));
    }
    let kind_text = s("tgt_type").unwrap_or("glob");
    let tgt_type = TargetType::parse(kind_text)
        .ok_or_else(|| format!("unsupported tgt_type {kind_text:?}; use glob, list or pcre"))?;
    let target = Target::new(tgt_type, &tgt)?;
    let arg = match v.get("arg") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(a)) => a.clone(),
        Some(_) => return Err("arg must be a list".into()),
    };
    let timeout = v
        .get("timeout_secs")
        .and_then(Json::as_f64)
        .filter(|t| t.is_finite() && *t > 0.0)
        .map(|t| Duration::try_from_secs_f64(t).unwrap_or(MAX_TIMEOUT))
        .unwrap_or(Duration::from_secs(5))
        .min(MAX_TIMEOUT);
    let user = s("user").unwrap_or("root").to_string();
    Ok((
        PublishRequest {
            tgt,
            tgt_type,
            fun,
            arg,
            user,
        },
        target,
        timeout,
    ))
}

async fn write_line(w: &mut (impl AsyncWriteExt + Unpin), v: &Json) -> std::io::Result<()> {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    w.write_all(&b).await
}

async fn serve_one(stream: UnixStream, publish: Arc<Publish>, jobs: Arc<JobBook>) {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(r.take(MAX_LINE));
    if reader.read_line(&mut line).await.is_err() || !line.ends_with('\n') {
        let _ = write_line(
            &mut w,
            &json!({"error": "request line missing or over 1 MiB"}),
        )
        .await;
        return;
    }
    let (req, target, timeout) = match parse_request(&line) {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(reason = %e, "CLI publish refused");
            let _ = write_line(&mut w, &json!({"error": e})).await;
            return;
        }
    };
    let jid = jobs.jids.next();
    let mut rx = jobs.wait_returns(&jid);
    let p = publish.clone();
    let (j2, r2, t2) = (jid.clone(), req.clone(), target.clone());
    let published = tokio::task::spawn_blocking(move || p.publish(&j2, &r2, &t2)).await;
    let expected = match published {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => {
            jobs.unwait(&jid);
            let _ = write_line(&mut w, &json!({"error": e})).await;
            return;
        }
        Err(e) => {
            jobs.unwait(&jid);
            let _ = write_line(&mut w, &json!({"error": e.to_string()})).await;
            return;
        }
    };
    if write_line(&mut w, &json!({"jid": jid, "minions": expected}))
        .await
        .is_err()
    {
        jobs.unwait(&jid);
        return;
    }
    let mut missing: std::collections::BTreeSet<String> = expected.iter().cloned().collect();
    let deadline = tokio::time::Instant::now() + timeout;
    while !missing.is_empty() {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(ev)) => {
                missing.remove(&ev.minion);
                let line = json!({"minion": ev.minion, "return": ev.ret});
                if write_line(&mut w, &line).await.is_err() {
                    break;
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    jobs.unwait(&jid);
    let _ = write_line(&mut w, &json!({"done": true, "missing": missing})).await;
}

/// What a publish through the CLI socket produced.
#[derive(Debug, Clone, Default)]
pub struct PublishOutcome {
    pub jid: String,
    pub expected: Vec<String>,
    /// In arrival order.
    pub returns: Vec<MinionReturn>,
    pub missing: Vec<String>,
}

/// One minion's return, as the CLI socket delivered it.
#[derive(Debug, Clone)]
pub struct MinionReturn {
    pub minion: String,
    /// The return record `{"return","retcode","success",...}`.
    pub record: Json,
    /// From the publish request to this return.
    pub after: std::time::Duration,
}

/// Client: sends one publish to the running master and collects what comes back.
pub async fn publish(socket: &Path, request: &Json) -> Result<PublishOutcome, String> {
    let stream = UnixStream::connect(socket).await.map_err(|e| {
        format!(
            "cannot reach the running master at {}: {e} (is `saltgate-master run` running with this config?)",
            socket.display()
        )
    })?;
    let (r, mut w) = stream.into_split();
    let started = std::time::Instant::now();
    write_line(&mut w, request)
        .await
        .map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(r).lines();
    let mut out = PublishOutcome::default();
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        let v: Json =
            serde_json::from_str(&line).map_err(|e| format!("bad reply from master: {e}"))?;
        if let Some(e) = v.get("error").and_then(Json::as_str) {
            return Err(e.to_string());
        }
        if let Some(jid) = v.get("jid").and_then(Json::as_str) {
            out.jid = jid.to_string();
            out.expected = strings(v.get("minions"));
        } else if let Some(m) = v.get("minion").and_then(Json::as_str) {
            out.returns.push(MinionReturn {
                minion: m.to_string(),
                record: v.get("return").cloned().unwrap_or(Json::Null),
                after: started.elapsed(),
            });
        } else if v.get("done").is_some() {
            out.missing = strings(v.get("missing"));
            return Ok(out);
        }
    }
    Err("the master closed the connection before the job finished".into())
}

fn strings(v: Option<&Json>) -> Vec<String> {
    v.and_then(Json::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_requests_are_validated() {
        assert!(parse_request(r#"{"tgt":"*","fun":"test.ping"}"#).is_ok());
        for bad in [
            "not json",
            r#"{"fun":"test.ping"}"#,
            r#"{"tgt":"*","fun":"rm -rf"}"#,
            r#"{"tgt":"*","fun":"test.ping","tgt_type":"grain"}"#,
            r#"{"tgt":"(","fun":"test.ping","tgt_type":"pcre"}"#,
            r#"{"tgt":"*","fun":"test.ping","arg":"x"}"#,
        ] {
            assert!(parse_request(bad).is_err(), "{bad}");
        }
        for huge in ["1e12", "1e300"] {
            let line = format!(r#"{{"tgt":"*","fun":"a.b","timeout_secs":{huge}}}"#);
            let (_, _, t) = parse_request(&line).unwrap();
            assert_eq!(t, MAX_TIMEOUT, "{huge}");
        }
    }
}
