//! A `saltgate-master` cluster of separate processes (so the masters' CPU and memory are their
//! own, apart from the proxy's and the swarm's): members on `.2`, `.3`, `.4` of the bench's /24,
//! each the `saltgate-master run` binary with the lab's configuration (`lab::master_config_text`:
//! shared `cachedir` and `cluster_pki_dir`, `auto_accept`), pool ports picked up front so every
//! member names the others as peers. Killed with their process groups on drop.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::backend::MasterAddrs;
use crate::lab::{master_config_text, random_hex, MasterPorts};
use crate::BenchError;

/// One running member.
pub struct MasterProc {
    pub name: String,
    pub ret: SocketAddr,
    pub publish: SocketAddr,
    /// Its local publish socket (`saltgate_master::cli::publish`).
    pub socket: PathBuf,
    child: Child,
}

impl MasterProc {
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }
}

pub struct Cluster {
    pub members: Vec<MasterProc>,
    dir: tempfile::TempDir,
}

/// Parses `saltgate-master ready ret=IP:PORT publish=IP:PORT socket=PATH[ cluster=...]`.
pub fn parse_ready(line: &str) -> Option<(SocketAddr, SocketAddr, PathBuf)> {
    let rest = line.strip_prefix("saltgate-master ready ")?;
    let field = |k: &str| {
        rest.split(' ')
            .find_map(|w| w.strip_prefix(k))
            .map(str::to_string)
    };
    Some((
        field("ret=")?.parse().ok()?,
        field("publish=")?.parse().ok()?,
        PathBuf::from(field("socket=")?),
    ))
}

fn free_port(ip: IpAddr) -> Result<u16, BenchError> {
    std::net::TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| BenchError::Io(format!("bind {ip}:0: {e}")))
}

impl Cluster {
    /// Starts one member per address in `ips`, all at once, and waits until each is ready.
    pub async fn start(bin: &Path, ips: &[IpAddr]) -> Result<Cluster, BenchError> {
        Self::start_with(bin, ips, true).await
    }

    /// One plain master on `ip` (no cluster keys), as a `salt-master` would be run.
    pub async fn single(bin: &Path, ip: IpAddr) -> Result<Cluster, BenchError> {
        Self::start_with(bin, &[ip], false).await
    }

    async fn start_with(
        bin: &Path,
        ips: &[IpAddr],
        clustered: bool,
    ) -> Result<Cluster, BenchError> {
        // SALTGATE_BENCH_KEEP=1 keeps the members' directory (configs, keys, job cache, logs).
        let dir = tempfile::Builder::new()
            .prefix("saltgate-bench-masters.")
            .disable_cleanup(std::env::var_os("SALTGATE_BENCH_KEEP").is_some())
            .tempdir()
            .map_err(|e| BenchError::Io(format!("temp dir: {e}")))?;
        let secret = random_hex().map_err(|e| BenchError::Io(format!("{e:#}")))?;
        let pools: Vec<u16> = ips
            .iter()
            .map(|ip| free_port(*ip))
            .collect::<Result<_, _>>()?;
        let mut starting = Vec::new();
        for (i, ip) in ips.iter().enumerate() {
            let name = format!("m{}", i + 1);
            let peers: Vec<String> = (0..ips.len())
                .filter(|&j| j != i)
                .map(|j| SocketAddr::new(ips[j], pools[j]).to_string())
                .collect();
            let ports = MasterPorts {
                publish: 0,
                request: 0,
                cluster: pools[i],
            };
            let text = if clustered {
                master_config_text(dir.path(), &name, *ip, ports, &peers, &secret)
            } else {
                let d = dir.path().display();
                format!(
                    "id: {name}\ninterface: {ip}\npublish_port: 0\nret_port: 0\n\
                     pki_dir: {d}/{name}/pki\ncachedir: {d}/{name}/cache\n\
                     sock_dir: {d}/{name}/sock\nauto_accept: True\n"
                )
            };
            let cfg = dir.path().join(format!("{name}.yaml"));
            std::fs::write(&cfg, text)
                .map_err(|e| BenchError::Io(format!("write {}: {e}", cfg.display())))?;
            let log = dir.path().join(format!("{name}.stderr"));
            let log = std::fs::File::create(&log)
                .map_err(|e| BenchError::Io(format!("create {}: {e}", log.display())))?;
            let mut cmd = Command::new(bin);
            cmd.arg("-c")
                .arg(&cfg)
                .arg("run")
                // SALTGATE_BENCH_MASTER_LOG: the members' log filter (default warn).
                .env(
                    "RUST_LOG",
                    std::env::var("SALTGATE_BENCH_MASTER_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log)
                .kill_on_drop(true);
            let child = cmd
                .spawn()
                .map_err(|e| BenchError::Io(format!("start {}: {e}", bin.display())))?;
            starting.push((name, child));
        }
        let mut members = Vec::new();
        for (name, mut child) in starting {
            let out = child
                .stdout
                .take()
                .ok_or_else(|| BenchError::Io("master stdout".into()))?;
            let mut lines = BufReader::new(out).lines();
            let ready = tokio::time::timeout(Duration::from_secs(60), async {
                while let Ok(Some(l)) = lines.next_line().await {
                    if let Some(r) = parse_ready(&l) {
                        return Some(r);
                    }
                }
                None
            })
            .await
            .ok()
            .flatten();
            let Some((ret, publish, socket)) = ready else {
                let err = std::fs::read_to_string(dir.path().join(format!("{name}.stderr")))
                    .unwrap_or_default();
                return Err(BenchError::Target(format!(
                    "saltgate-master {name} was not ready within 60 s: {}",
                    err.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
                )));
            };
            // Keep reading stdout so the master never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            members.push(MasterProc {
                name,
                ret,
                publish,
                socket,
                child,
            });
        }
        Ok(Cluster { members, dir })
    }

    /// The members' shared `cluster_pki_dir` (`lab::master_config_text`'s layout).
    pub fn cluster_pki_dir(&self) -> PathBuf {
        self.dir.path().join("shared").join("cpki")
    }

    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().map(MasterProc::pid).collect()
    }

    /// The members as a proxy configuration sees them: publish port on `echo`, request port
    /// on `stream` (the generated HAProxy and saltgate configurations map them that way).
    pub fn as_backends(&self) -> Vec<MasterAddrs> {
        self.members
            .iter()
            .map(|m| MasterAddrs {
                echo: m.publish,
                stream: m.ret,
            })
            .collect()
    }

    /// The members' logs (for error messages).
    pub fn stderr_tail(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let t = std::fs::read_to_string(self.dir.path().join(format!("{}.stderr", m.name)))
                    .unwrap_or_default();
                let tail: Vec<&str> = t.lines().rev().take(3).collect();
                format!("{}: {}", m.name, tail.join(" | "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub async fn stop(mut self) {
        for m in &mut self.members {
            let _ = m.child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_gives_both_ports_and_the_socket() {
        let (ret, publish, socket) = parse_ready(
            "saltgate-master ready ret=127.19.0.2:4506 publish=127.19.0.2:4505 socket=/tmp/x/s.sock cluster=127.19.0.2:4520",
        )
        .unwrap();
        assert_eq!(ret.to_string(), "127.19.0.2:4506");
        assert_eq!(publish.port(), 4505);
        assert_eq!(socket, PathBuf::from("/tmp/x/s.sock"));
        assert!(parse_ready("saltgate-master starting").is_none());
    }
}
