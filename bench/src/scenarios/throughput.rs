//! `throughput`: bulk transfer in each direction on 4 connections: client → master (the fake
//! master sinks to EOF) and master → client (it sources a given length). Proxy CPU per GB
//! (10⁹ bytes) and MB/s.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Ctx, Run, Sample};
use crate::measure::Window;
use crate::targets::TargetKind;
use crate::{client, BenchError};

const CONNS: usize = 4;
const CHUNK: usize = 64 * 1024;

pub async fn run(ctx: &Ctx, kind: TargetKind) -> Result<Vec<Sample>, BenchError> {
    let total: u64 = if ctx.quick { 20_000_000 } else { 2_000_000_000 };
    let per_conn = total / CONNS as u64;
    let mut out = Vec::new();
    for (case, upload) in [("client → master", true), ("master → client", false)] {
        let run = Run::start(ctx, kind, 2).await?;
        let w = Window::start(run.pids())?;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..CONNS {
            let addr = run.target.stream[i % run.target.stream.len()];
            tasks.spawn(transfer(addr, run.src, per_conn, upload));
        }
        while let Some(r) = tasks.join_next().await {
            r.map_err(|e| BenchError::Scenario(format!("transfer task: {e}")))??;
        }
        let spent = w.end()?;
        let gb = (per_conn * CONNS as u64) as f64 / 1e9;
        if let Some(cpu) = spent.proxy_secs() {
            out.push(Sample::new(
                "throughput",
                "CPU per GB",
                case,
                "s",
                kind,
                cpu / gb,
                Some(&spent),
            ));
        }
        out.push(Sample::new(
            "throughput",
            "throughput",
            case,
            "MB/s",
            kind,
            gb * 1000.0 / spent.secs,
            Some(&spent),
        ));
        run.stop().await;
    }
    Ok(out)
}

async fn transfer(addr: SocketAddr, src: IpAddr, len: u64, upload: bool) -> Result<(), BenchError> {
    let err = |what: &str, e: std::io::Error| {
        BenchError::Scenario(format!("transfer via {addr}: {what}: {e}"))
    };
    let work = async {
        let mut s = client::connect(addr, src)
            .await
            .map_err(|e| err("connect", e))?;
        let mut buf = vec![0x33u8; CHUNK];
        if upload {
            s.write_all(b"S").await.map_err(|e| err("write", e))?;
            let mut left = len;
            while left > 0 {
                let n = left.min(CHUNK as u64) as usize;
                s.write_all(&buf[..n]).await.map_err(|e| err("write", e))?;
                left -= n as u64;
            }
            s.shutdown().await.map_err(|e| err("shutdown", e))?;
            // The sink closes once it has read everything: EOF here means it all arrived.
            while s.read(&mut buf).await.map_err(|e| err("read", e))? > 0 {}
        } else {
            let mut req = vec![b'R'];
            req.extend_from_slice(&len.to_be_bytes());
            s.write_all(&req).await.map_err(|e| err("write", e))?;
            let mut got = 0u64;
            loop {
                let n = s.read(&mut buf).await.map_err(|e| err("read", e))?;
                if n == 0 {
                    break;
                }
                got += n as u64;
            }
            if got != len {
                return Err(BenchError::Scenario(format!(
                    "transfer via {addr}: received {got} of {len} bytes"
                )));
            }
        }
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(300), work)
        .await
        .map_err(|_| BenchError::Scenario(format!("transfer via {addr}: not done within 300 s")))?
}
