//! `peer-forward [RETURNS]`: CPU per forwarded return between two in-process saltgate-master
//! cluster members (127.29.1.1 and .2, no minion sockets), member B forwarding RETURNS (default
//! 1,000) minion returns of one job to A, in two modes:
//!
//! * `legacy`: what `cluster::forward` did before the persistent links: an RSA signature
//!   (PKCS#1 v1.5 SHA-224) and a new TCP connection per message, the receiver verifying the
//!   signature (with its key cache: the old receiver also read and parsed the peer's PEM per
//!   message, so this is a lower bound of the old cost);
//! * `link`: `cluster::forward` now: HMAC-SHA256, one persistent connection.
//!
//! CPU is this process's (both members, sending and receiving, storing each return in the job
//! cache) from `getrusage`, divided by RETURNS. Run in release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use saltgate_config::salt_master::parse_salt_master;
use saltgate_master::cluster;
use saltgate_master::keys::MasterKey;
use saltgate_master::peerserve;
use saltgate_master::server::build_master;
use saltgate_master::state::Master;
use saltgate_wire::envelope::{map, text, Value};

fn cpu_secs() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

async fn member(root: &std::path::Path, name: &str, ip: &str) -> anyhow::Result<Arc<Master>> {
    let d = root.display();
    let text = format!(
        "id: {name}\ninterface: {ip}\npki_dir: {d}/{name}/pki\ncachedir: {d}/{name}/cache\n\
         sock_dir: {d}/{name}/sock\ncluster_id: bench\ncluster_peers: [127.29.1.99:1]\n\
         cluster_pki_dir: {d}/cpki\ncluster_pool_port: 0\ncluster_secret: bench-secret\n"
    );
    let cfg = parse_salt_master(&text, None)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?
        .config;
    std::fs::create_dir_all(&cfg.cachedir)?;
    let key = MasterKey::load_or_create(&cfg.pki_dir, "master")?;
    let (m, l, _) = build_master(cfg, key, 0, None, None).await?;
    let m = Arc::new(m);
    let l = l.ok_or_else(|| anyhow::anyhow!("no cluster port"))?;
    let port = m
        .peers
        .clone()
        .ok_or_else(|| anyhow::anyhow!("not a cluster member"))?;
    tokio::spawn(peerserve::serve(l, port));
    Ok(m)
}

fn ret_body(jid: &str, minion: &str) -> Value {
    map(vec![
        ("kind", text("return")),
        ("jid", text(jid)),
        ("minion", text(minion)),
        (
            "ret",
            text(r#"{"return": true, "retcode": 0, "success": true, "fun": "test.ping"}"#),
        ),
    ])
}

/// Forwards `n` returns from `b` to `a` and waits for all; (wall, CPU) seconds.
async fn run(
    a: &Arc<Master>,
    b: &Arc<Master>,
    n: usize,
    legacy: bool,
) -> anyhow::Result<(f64, f64)> {
    let jid = a.jobs.jids.next();
    a.jobs.cache.save_load(
        &jid,
        &serde_json::json!({"fun": "test.ping", "master_id": a.config.id}),
    )?;
    let mut rx = a.jobs.wait_returns(&jid);
    let a_pool = a.cluster.as_ref().map(|c| c.pool_addr).unwrap();
    let (cpu0, t0) = (cpu_secs(), Instant::now());
    let (b2, j2, a_id) = (b.clone(), jid.clone(), a.config.id.clone());
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Handle::current();
        for i in 0..n {
            let body = ret_body(&j2, &format!("m-{i:05}"));
            if legacy {
                let frame = b2.cluster.as_ref().unwrap().seal(&body);
                rt.spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    if let Ok(mut s) = tokio::net::TcpStream::connect(a_pool).await {
                        let _ = s.write_u32(frame.len() as u32).await;
                        let _ = s.write_all(&frame).await;
                        let _ = s.flush().await;
                    }
                });
            } else {
                if let Some(cl) = &b2.cluster {
                    cluster::forward(cl, body, Some(&a_id));
                }
            }
        }
    })
    .await?;
    let mut got = std::collections::HashSet::new();
    while got.len() < n {
        match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
            Ok(Some(ev)) => {
                got.insert(ev.minion);
            }
            _ => anyhow::bail!("only {} of {n} returns arrived", got.len()),
        }
    }
    a.jobs.unwait(&jid);
    Ok((t0.elapsed().as_secs_f64(), cpu_secs() - cpu0))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1000);
    let root = tempfile::Builder::new().prefix("sgpf").tempdir_in("/tmp")?;
    let a = member(root.path(), "ma", "127.29.1.1").await?;
    let b = member(root.path(), "mb", "127.29.1.2").await?;
    let (Some(acl), Some(bcl)) = (&a.cluster, &b.cluster) else {
        anyhow::bail!("both members must be in a cluster");
    };
    cluster::join(bcl, acl.pool_addr)
        .await
        .map_err(anyhow::Error::msg)?;
    // Warm up both paths (connections, caches), then measure each twice, interleaved.
    run(&a, &b, 50, true).await?;
    run(&a, &b, 50, false).await?;
    for round in 1..=2 {
        for legacy in [true, false] {
            let (wall, cpu) = run(&a, &b, n, legacy).await?;
            println!(
                "round {round} {:>6}: {n} returns in {:.0} ms, CPU {:.0} ms = {:.3} ms per forwarded return",
                if legacy { "legacy" } else { "link" },
                wall * 1e3,
                cpu * 1e3,
                cpu * 1e3 / n as f64
            );
        }
    }
    Ok(())
}
