//! `connect`: session set-up and tear-down. Each session connects, echoes 10 bytes and closes;
//! one at a time (sequential) and 8 at a time (parallel). Proxy CPU per session and sessions/s.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::{Ctx, Run, Sample};
use crate::measure::Window;
use crate::targets::TargetKind;
use crate::{client, BenchError};

pub async fn run(ctx: &Ctx, kind: TargetKind) -> Result<Vec<Sample>, BenchError> {
    let (seq_n, par_n) = if ctx.quick { (50, 160) } else { (5000, 10_000) };
    let mut out = Vec::new();
    for (case, n, parallel) in [("sequential", seq_n, 1usize), ("8 parallel", par_n, 8)] {
        let run = Run::start(ctx, kind, 2).await?;
        let w = Window::start(run.pids())?;
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..parallel {
            let addrs = run.target.echo.clone();
            let src = run.src;
            tasks.spawn(sessions(addrs, src, t, n / parallel));
        }
        while let Some(r) = tasks.join_next().await {
            r.map_err(|e| BenchError::Scenario(format!("connect task: {e}")))??;
        }
        let spent = w.end()?;
        let done = (n / parallel * parallel) as f64;
        if let Some(cpu) = spent.proxy_secs() {
            out.push(Sample::new(
                "connect",
                "CPU per session",
                case,
                "µs",
                kind,
                cpu * 1e6 / done,
                Some(&spent),
            ));
        }
        out.push(Sample::new(
            "connect",
            "sessions per second",
            case,
            "1/s",
            kind,
            done / spent.secs,
            Some(&spent),
        ));
        run.stop().await;
    }
    Ok(out)
}

async fn sessions(
    addrs: Vec<SocketAddr>,
    src: IpAddr,
    t: usize,
    n: usize,
) -> Result<(), BenchError> {
    let mut buf = [0u8; 10];
    for i in 0..n {
        let addr = addrs[(t + i) % addrs.len()];
        let one = async {
            let mut s = client::connect(addr, src).await?;
            client::echo(&mut s, b"0123456789", &mut buf).await
        };
        tokio::time::timeout(Duration::from_secs(10), one)
            .await
            .map_err(|_| {
                BenchError::Scenario(format!("session {i} to {addr}: no echo within 10 s"))
            })?
            .map_err(|e| BenchError::Scenario(format!("session {i} to {addr}: {e}")))?;
    }
    Ok(())
}
