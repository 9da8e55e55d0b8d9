//! The fake masters: per master address an **echo** port (idle, connect, rr, storm) and a
//! **stream** port whose first byte picks `S` (sink: read to EOF, then close) or `R` + 8-byte
//! big-endian length (source: send that many bytes, then close). They run in a child process
//! (`saltgate-bench __backend IP...`) so that the load generator's CPU and theirs are counted
//! apart. The child prints one line `ports E1 S1 E2 S2 ...` and then obeys one command per stdin
//! line: `count` / `count I` (live sessions, all or of master I), `stop I` (close master I's
//! listeners, keep its sessions: a dead master as a health check sees it), `kill I` (close its
//! listeners and sessions: a crashed master, for the direct baseline). It exits on stdin EOF.

use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::watch;

use crate::BenchError;

/// One fake master's control in the child.
struct Master {
    live: Arc<AtomicUsize>,
    stop_listeners: watch::Sender<bool>,
    kill_sessions: watch::Sender<bool>,
}

/// Decrements a master's live count when a session ends, however it ends.
struct LiveGuard(Arc<AtomicUsize>);
impl LiveGuard {
    fn new(c: &Arc<AtomicUsize>) -> Self {
        c.fetch_add(1, Ordering::Relaxed);
        LiveGuard(c.clone())
    }
}
impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The child's main: bind, print the ports, serve, obey stdin.
pub async fn child_main(ips: Vec<IpAddr>) -> Result<(), BenchError> {
    let mut masters = Vec::new();
    let mut ports = Vec::new();
    for ip in ips {
        let echo = listen(ip)?;
        let stream = listen(ip)?;
        ports.push(echo.local_addr().map_err(io_err)?.port());
        ports.push(stream.local_addr().map_err(io_err)?.port());
        let live = Arc::new(AtomicUsize::new(0));
        let (stop_tx, stop_rx) = watch::channel(false);
        let (kill_tx, kill_rx) = watch::channel(false);
        tokio::spawn(accept_loop(
            echo,
            false,
            live.clone(),
            stop_rx.clone(),
            kill_rx.clone(),
        ));
        tokio::spawn(accept_loop(stream, true, live.clone(), stop_rx, kill_rx));
        masters.push(Master {
            live,
            stop_listeners: stop_tx,
            kill_sessions: kill_tx,
        });
    }
    let mut out = tokio::io::stdout();
    let line: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
    out.write_all(format!("ports {}\n", line.join(" ")).as_bytes())
        .await
        .map_err(io_err)?;
    out.flush().await.map_err(io_err)?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(cmd) = lines.next_line().await.map_err(io_err)? {
        let reply = obey(&masters, cmd.trim());
        out.write_all(format!("{reply}\n").as_bytes())
            .await
            .map_err(io_err)?;
        out.flush().await.map_err(io_err)?;
    }
    Ok(())
}

/// A listener on `ip:0` with a backlog as deep as the kernel allows (somaxconn caps it): with
/// tokio's default of 1024, a reconnect storm of a few thousand clients overflows the accept
/// queue and the dropped SYNs come back a second later, which would be measured as the
/// proxy's slowness.
fn listen(ip: IpAddr) -> Result<TcpListener, BenchError> {
    let bind = |e: std::io::Error| BenchError::Io(format!("backend bind {ip}:0: {e}"));
    let sock = if ip.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(bind)?;
    sock.bind(SocketAddr::new(ip, 0)).map_err(bind)?;
    sock.listen(BACKLOG).map_err(bind)
}

/// The fake masters' listen backlog (as the proxies', see `ProxySettings::backlog`).
const BACKLOG: u32 = 4096;

fn obey(masters: &[Master], cmd: &str) -> String {
    let mut words = cmd.split_whitespace();
    let verb = words.next().unwrap_or("");
    let idx: Option<usize> = words.next().and_then(|w| w.parse().ok());
    let pick = |i: Option<usize>| i.and_then(|i| masters.get(i));
    match (verb, pick(idx)) {
        ("count", None) if idx.is_none() => masters
            .iter()
            .map(|m| m.live.load(Ordering::Relaxed))
            .sum::<usize>()
            .to_string(),
        ("count", Some(m)) => m.live.load(Ordering::Relaxed).to_string(),
        ("stop", Some(m)) => {
            let _ = m.stop_listeners.send(true);
            "ok".into()
        }
        ("kill", Some(m)) => {
            let _ = m.stop_listeners.send(true);
            let _ = m.kill_sessions.send(true);
            "ok".into()
        }
        _ => format!("error: unknown command {cmd:?} (count [I] | stop I | kill I)"),
    }
}

async fn accept_loop(
    listener: TcpListener,
    stream_port: bool,
    live: Arc<AtomicUsize>,
    mut stop: watch::Receiver<bool>,
    kill: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = async { let _ = stop.wait_for(|s| *s).await; } => return,
            r = listener.accept() => match r {
                Ok((sock, _)) => {
                    let _ = sock.set_nodelay(true);
                    let live = live.clone();
                    let mut kill = kill.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = async { let _ = kill.wait_for(|k| *k).await; } => {}
                            _ = serve(sock, stream_port, live) => {}
                        }
                    });
                }
                // EMFILE and the like: back off a little rather than spin.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        }
    }
}

/// Serves one connection. It counts as a live session from its first byte on: health checks
/// (connect, close) never do.
async fn serve(
    mut sock: TcpStream,
    stream_port: bool,
    live: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    if !stream_port {
        let mut buf = vec![0u8; 4096];
        let mut guard = None;
        loop {
            let n = sock.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            guard.get_or_insert_with(|| LiveGuard::new(&live));
            sock.write_all(&buf[..n]).await?;
        }
    }
    let mut mode = [0u8; 1];
    if sock.read(&mut mode).await? == 0 {
        return Ok(()); // a health check: connect and close
    }
    let _guard = LiveGuard::new(&live);
    match mode[0] {
        b'S' => {
            let mut buf = vec![0u8; 64 * 1024];
            while sock.read(&mut buf).await? > 0 {}
            Ok(())
        }
        b'R' => {
            let mut len = [0u8; 8];
            sock.read_exact(&mut len).await?;
            let mut left = u64::from_be_bytes(len);
            let chunk = vec![0x5au8; 64 * 1024];
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                sock.write_all(&chunk[..n]).await?;
                left -= n as u64;
            }
            sock.shutdown().await
        }
        _ => Ok(()),
    }
}

fn io_err(e: std::io::Error) -> BenchError {
    BenchError::Io(format!("backend: {e}"))
}

/// The addresses of one fake master.
#[derive(Debug, Clone, Copy)]
pub struct MasterAddrs {
    pub echo: SocketAddr,
    pub stream: SocketAddr,
}

/// The parent's handle on the backend child; the child is killed when this is dropped.
pub struct Backend {
    child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
    pub masters: Vec<MasterAddrs>,
}

impl Backend {
    /// Starts `exe __backend IP...` and reads its ports.
    pub async fn start(exe: &std::path::Path, ips: &[IpAddr]) -> Result<Backend, BenchError> {
        let mut cmd = Command::new(exe);
        cmd.arg("__backend")
            .args(ips.iter().map(|i| i.to_string()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| BenchError::Io(format!("start backend {}: {e}", exe.display())))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let line = tokio::time::timeout(std::time::Duration::from_secs(10), stdout.next_line())
            .await
            .map_err(|_| BenchError::Io("backend child printed no ports within 10 s".into()))?
            .map_err(io_err)?
            .ok_or_else(|| BenchError::Io("backend child exited before printing ports".into()))?;
        let ports = parse_ports_line(&line, ips.len())?;
        let masters = ips
            .iter()
            .zip(ports.chunks(2))
            .map(|(ip, p)| MasterAddrs {
                echo: SocketAddr::new(*ip, p[0]),
                stream: SocketAddr::new(*ip, p[1]),
            })
            .collect();
        Ok(Backend {
            child,
            stdin,
            stdout,
            masters,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    async fn command(&mut self, cmd: &str) -> Result<String, BenchError> {
        self.stdin
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .map_err(io_err)?;
        self.stdin.flush().await.map_err(io_err)?;
        let reply = self
            .stdout
            .next_line()
            .await
            .map_err(io_err)?
            .ok_or_else(|| BenchError::Io("backend child exited".into()))?;
        if reply.starts_with("error") {
            return Err(BenchError::Io(format!("backend: {reply}")));
        }
        Ok(reply)
    }

    /// Live sessions, of one master or (None) of all.
    pub async fn live(&mut self, master: Option<usize>) -> Result<usize, BenchError> {
        let cmd = match master {
            Some(i) => format!("count {i}"),
            None => "count".into(),
        };
        let r = self.command(&cmd).await?;
        r.parse()
            .map_err(|_| BenchError::Io(format!("backend: bad count reply {r:?}")))
    }

    /// Closes master `i`'s listeners; its sessions stay (the proxy must close them).
    pub async fn stop(&mut self, i: usize) -> Result<(), BenchError> {
        self.command(&format!("stop {i}")).await.map(drop)
    }

    /// Closes master `i`'s listeners and sessions.
    pub async fn kill(&mut self, i: usize) -> Result<(), BenchError> {
        self.command(&format!("kill {i}")).await.map(drop)
    }
}

/// `ports E1 S1 E2 S2 ...` with two ports per master.
pub fn parse_ports_line(line: &str, masters: usize) -> Result<Vec<u16>, BenchError> {
    let bad = || BenchError::Io(format!("backend: bad ports line {line:?}"));
    let rest = line.strip_prefix("ports ").ok_or_else(bad)?;
    let ports: Vec<u16> = rest
        .split_whitespace()
        .map(|p| p.parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    if ports.len() != masters * 2 {
        return Err(bad());
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_line_needs_two_ports_per_master() {
        assert_eq!(
            parse_ports_line("ports 1 2 3 4", 2).unwrap(),
            vec![1, 2, 3, 4]
        );
        assert!(parse_ports_line("ports 1 2 3", 2).is_err());
        assert!(parse_ports_line("ports 1 x", 1).is_err());
        assert!(parse_ports_line("1 2", 1).is_err());
    }
}
