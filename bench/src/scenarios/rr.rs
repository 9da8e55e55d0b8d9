//! `rr`: 200-byte request, 200-byte response, closed loop on 1, 100 and 1000 established
//! connections for a fixed time. Proxy CPU per request, latency p50/p99 (as the load generator
//! sees it), requests/s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use super::{open_sessions, Ctx, Run, Sample};
use crate::measure::Window;
use crate::stats::percentile_sorted;
use crate::targets::TargetKind;
use crate::{client, BenchError};

const MSG: usize = 200;

pub async fn run(ctx: &Ctx, kind: TargetKind) -> Result<Vec<Sample>, BenchError> {
    let levels: &[usize] = if ctx.quick {
        &[1, 10, 50]
    } else {
        &[1, 100, 1000]
    };
    let dur = Duration::from_millis(if ctx.quick { 300 } else { 4000 });
    let mut out = Vec::new();
    for &conns in levels {
        let run = Run::start(ctx, kind, 2).await?;
        let socks = open_sessions(&run.target.echo, run.src, conns, 64).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let w = Window::start(run.pids())?;
        let mut tasks = tokio::task::JoinSet::new();
        for s in socks {
            tasks.spawn(loop_rr(s, stop.clone()));
        }
        tokio::time::sleep(dur).await;
        stop.store(true, Ordering::Relaxed);
        let mut lat = Vec::new();
        while let Some(r) = tasks.join_next().await {
            lat.extend(r.map_err(|e| BenchError::Scenario(format!("rr task: {e}")))??);
        }
        let spent = w.end()?;
        lat.sort_unstable();
        let n = lat.len() as f64;
        let case = format!("{conns} conn{}", if conns == 1 { "" } else { "s" });
        if let Some(cpu) = spent.proxy_secs() {
            out.push(Sample::new(
                "rr",
                "CPU per request",
                &case,
                "µs",
                kind,
                cpu * 1e6 / n,
                Some(&spent),
            ));
        }
        for (fig, p) in [("latency p50", 50.0), ("latency p99", 99.0)] {
            let v = percentile_sorted(&lat, p).unwrap_or(0) as f64;
            out.push(Sample::new("rr", fig, &case, "µs", kind, v, Some(&spent)));
        }
        out.push(Sample::new(
            "rr",
            "requests per second",
            &case,
            "1/s",
            kind,
            n / spent.secs,
            Some(&spent),
        ));
        run.stop().await;
    }
    Ok(out)
}

/// Request/response until `stop`; the latency of each, µs.
async fn loop_rr(mut s: TcpStream, stop: Arc<AtomicBool>) -> Result<Vec<u32>, BenchError> {
    let msg = [0x42u8; MSG];
    let mut buf = [0u8; MSG];
    let mut lat = Vec::with_capacity(4096);
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        tokio::time::timeout(
            Duration::from_secs(10),
            client::echo(&mut s, &msg, &mut buf),
        )
        .await
        .map_err(|_| BenchError::Scenario("no response within 10 s".into()))?
        .map_err(|e| BenchError::Scenario(format!("request/response: {e}")))?;
        lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
    }
    Ok(lat)
}
