//! `storm`: N clients hold echo sessions spread over two fake masters; master 0 then stops
//! listening (its sessions stay open, so the proxy must notice by health check and close them
//! itself, all at once: HAProxy's `on-marked-down shutdown-sessions`, saltgate's
//! `on_master_down: close` with `close_rate: 0`). Every client whose session ends reconnects at
//! once (one retry every 10 ms) and echoes again. Figures: time from the first lost session
//! until the last one is re-established; from the first lost session to the last (how long the
//! proxy's closes take, interleaved with the reconnects it serves meanwhile); from the stop
//! until all are re-established (adds detection, the same check settings for both); proxy CPU
//! per re-established session. Direct baseline: master 0 closes its sessions itself and the
//! clients reconnect to master 1.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use super::{count_label, Ctx, Run, Sample};
use crate::measure::Window;
use crate::targets::TargetKind;
use crate::{client, BenchError};

enum Event {
    Up(Instant),
    Lost(Instant),
}

pub async fn run(ctx: &Ctx, kind: TargetKind) -> Result<Vec<Sample>, BenchError> {
    let n = if ctx.quick { 40 } else { 4000 };
    let mut run = Run::start(ctx, kind, 2).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..n {
        let e = &run.target.echo;
        let addrs = vec![e[i % e.len()], e[(i + 1) % e.len()]];
        clients.spawn(client_loop(addrs, run.src, tx.clone()));
    }
    drop(tx);
    let case = format!("{} clients", count_label(n));

    // All connected.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut up = 0;
    while up < n {
        match tokio::time::timeout_at(deadline.into(), rx.recv()).await {
            Ok(Some(Event::Up(_))) => up += 1,
            Ok(Some(Event::Lost(_))) => {
                return Err(BenchError::Scenario("a session was lost before the master was stopped".to_string()))
            }
            _ => {
                return Err(BenchError::Scenario(format!(
                    "only {up} of {n} clients connected within 120 s (is the machine overloaded? see /proc/loadavg)"
                )))
            }
        }
    }
    // A session a client gave up on (its 2 s connect timeout, on a loaded machine) may still be
    // open on a master a moment after the client opened its next one: count master 0's sessions
    // once the masters hold exactly the clients' n (at most 10 s), so that each one counted is a
    // client's, and is lost when the master stops.
    let settle = Instant::now() + Duration::from_secs(10);
    while run.backend.live(None).await? != n && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let affected = run.backend.live(Some(0)).await?;
    if affected == 0 {
        return Err(BenchError::Scenario(
            "no session on master 0 to fail over".to_string(),
        ));
    }

    let w = Window::start(run.pids())?;
    let t_down = Instant::now();
    if kind == TargetKind::Direct {
        run.backend.kill(0).await?;
    } else {
        run.backend.stop(0).await?;
    }
    let (mut lost, mut back) = (0usize, 0usize);
    let (mut first_loss, mut last_up) = (None::<Instant>, t_down);
    let mut last_loss = t_down;
    let deadline = Instant::now() + Duration::from_secs(60);
    while lost < affected || back < affected {
        match tokio::time::timeout_at(deadline.into(), rx.recv()).await {
            Ok(Some(Event::Lost(t))) => {
                lost += 1;
                first_loss = Some(first_loss.map_or(t, |f| f.min(t)));
                last_loss = last_loss.max(t);
            }
            Ok(Some(Event::Up(t))) => {
                back += 1;
                last_up = last_up.max(t);
            }
            _ => {
                return Err(BenchError::Scenario(format!(
                    "{lost} of {affected} sessions lost and {back} re-established within 60 s of the stop"
                )))
            }
        }
    }
    let spent = w.end()?;
    clients.abort_all();
    run.stop().await;

    let first_loss = first_loss.unwrap_or(t_down);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut out = vec![
        Sample::new(
            "storm",
            "first loss to all re-established",
            &case,
            "ms",
            kind,
            ms(last_up.saturating_duration_since(first_loss)),
            Some(&spent),
        ),
        Sample::new(
            "storm",
            "first loss to last loss",
            &case,
            "ms",
            kind,
            ms(last_loss.saturating_duration_since(first_loss)),
            Some(&spent),
        ),
        Sample::new(
            "storm",
            "stop to all re-established",
            &case,
            "ms",
            kind,
            ms(last_up.saturating_duration_since(t_down)),
            Some(&spent),
        ),
    ];
    if let Some(cpu) = spent.proxy_secs() {
        out.push(Sample::new(
            "storm",
            "CPU per re-established session",
            &case,
            "µs",
            kind,
            cpu * 1e6 / affected as f64,
            Some(&spent),
        ));
    }
    Ok(out)
}

/// Connects (trying `addrs` in turn every 10 ms), echoes, reports Up; waits for the session
/// to end, reports Lost, and starts over with the next address.
async fn client_loop(addrs: Vec<SocketAddr>, src: IpAddr, tx: mpsc::UnboundedSender<Event>) {
    let mut at = 0;
    loop {
        let mut s = loop {
            match tokio::time::timeout(Duration::from_secs(2), client::open_session(addrs[at], src))
                .await
            {
                Ok(Ok(s)) => break s,
                _ => {
                    at = (at + 1) % addrs.len();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        if tx.send(Event::Up(Instant::now())).is_err() {
            return;
        }
        let mut b = [0u8; 1];
        let _ = s.read(&mut b).await;
        if tx.send(Event::Lost(Instant::now())).is_err() {
            return;
        }
        at = (at + 1) % addrs.len();
    }
}
