//! `idle`: the proxy's memory for idle proxied sessions. RSS per session after opening 1k, 4k
//! and 8k sessions (each established end to end by one 16-byte echo, then left idle), over the
//! RSS of the same process with none; and, over 5 cycles of opening and closing 4k sessions,
//! the RSS the first cycle leaves behind (allocator high-water mark) and the growth from the
//! first cycle's end to the fifth's (a leak shows here). Proxies only: the direct target has
//! no process in the middle.

use std::time::Duration;

use super::{count_label, open_sessions, Ctx, Run, Sample};
use crate::targets::TargetKind;
use crate::BenchError;

const CYCLES: usize = 5;

pub async fn run(ctx: &Ctx, kind: TargetKind) -> Result<Vec<Sample>, BenchError> {
    if kind == TargetKind::Direct {
        return Ok(Vec::new());
    }
    let sizes: &[usize] = if ctx.quick {
        &[50, 100, 200]
    } else {
        &[1000, 4000, 8000]
    };
    let cycle_n = if ctx.quick { 100 } else { 4000 };
    let settle = Duration::from_millis(if ctx.quick { 100 } else { 500 });
    let mut out = Vec::new();

    // RSS per idle session.
    let mut run = Run::start(ctx, kind, 2).await?;
    warm_up(&mut run).await?;
    tokio::time::sleep(settle).await;
    let base = run.proxy_rss_kib()?;
    let mut open = Vec::new();
    for &n in sizes {
        let more = open_sessions(&run.target.echo, run.src, n - open.len(), 64).await?;
        open.extend(more);
        tokio::time::sleep(settle).await;
        let rss = run.proxy_rss_kib()?;
        out.push(Sample::new(
            "idle",
            "RSS per idle session",
            count_label(n),
            "KiB",
            kind,
            rss.saturating_sub(base) as f64 / n as f64,
            None,
        ));
    }
    drop(open);
    run.stop().await;

    // RSS growth over open/close cycles.
    let mut run = Run::start(ctx, kind, 2).await?;
    warm_up(&mut run).await?;
    tokio::time::sleep(settle).await;
    let base = run.proxy_rss_kib()?;
    let mut after = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let s = open_sessions(&run.target.echo, run.src, cycle_n, 64).await?;
        drop(s);
        run.wait_backend_live_at_most(0, Duration::from_secs(30))
            .await?;
        tokio::time::sleep(settle).await;
        after.push(run.proxy_rss_kib()?);
    }
    let (first, last) = (after[0], after[CYCLES - 1]);
    out.push(Sample::new(
        "idle",
        "RSS kept after the first open/close cycle",
        count_label(cycle_n),
        "MiB",
        kind,
        (first as f64 - base as f64) / 1024.0,
        None,
    ));
    out.push(Sample::new(
        "idle",
        "RSS growth over 4 more open/close cycles",
        count_label(cycle_n),
        "MiB",
        kind,
        (last as f64 - first as f64) / 1024.0,
        None,
    ));
    run.stop().await;
    Ok(out)
}

/// A few sessions first, so that one-time allocations (thread stacks, pools) are in the base.
async fn warm_up(run: &mut Run) -> Result<(), BenchError> {
    let s = open_sessions(&run.target.echo, run.src, 16, 16).await?;
    drop(s);
    run.wait_backend_live_at_most(0, Duration::from_secs(10))
        .await
}
