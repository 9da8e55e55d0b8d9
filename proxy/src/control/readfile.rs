//! Reading the configuration and token files off the runtime, bounded in time and in threads
//! (issue 12 item 3: a file that blocks on read, such as one on a hung network mount, must not
//! leak a thread per attempt nor hold up shutdown).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::admin::error::ApplyError;

/// How long reading the configuration file may take (a hung network filesystem must not stall
/// a runtime worker, nor reloads forever).
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The name of the threads that read configuration and token files (tests look for leaked ones).
pub const READ_THREAD: &str = "saltgate-read";
// Linux keeps 15 bytes of a thread name (`/proc/self/task/*/comm`): the whole name must fit.
const _: () = assert!(READ_THREAD.len() <= 15);

/// Files being read right now (at most one read per path is ever in flight).
static IN_FLIGHT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Reads a regular file off the runtime, bounded by [`READ_TIMEOUT`].
///
/// A FIFO, socket or device is refused at once (it could block forever). The read runs on a
/// detached thread, not the runtime's blocking pool, so a read stuck in the kernel (a hung network
/// filesystem) never holds up shutdown; and while one read of a path is stuck, later reads of the
/// same path fail at once instead of starting another thread, so a watcher polling a hung file
/// costs one thread, not one per poll.
pub(crate) async fn read_file(path: PathBuf) -> std::io::Result<Vec<u8>> {
    {
        let mut busy = IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner());
        if busy.contains(&path) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                "an earlier read of this file has not returned yet (a hung filesystem?); \
                 saltgate retries once it does",
            ));
        }
        busy.push(path.clone());
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let p = path.clone();
    let spawned = std::thread::Builder::new()
        .name(READ_THREAD.into())
        .spawn(move || {
            #[cfg(test)]
            tests::stall_if_stuck(&p);
            let r = saltgate_config::read_regular_file(&p);
            IN_FLIGHT
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|x| x != &p);
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        IN_FLIGHT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|x| x != &path);
        return Err(e);
    }
    match tokio::time::timeout(READ_TIMEOUT, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(std::io::Error::other(
            "the reading thread ended without an answer",
        )),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {READ_TIMEOUT:?}"),
        )),
    }
}

/// Reads the admin token off the runtime, bounded by [`READ_TIMEOUT`] (a hung filesystem must
/// not stall sessions). Called before the reload lock is taken, so a stuck read holds up neither
/// other reloads' turn nor shutdown.
pub(crate) async fn read_token(path: &Path) -> Result<String, ApplyError> {
    let err = |reason: String| ApplyError::Token {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = read_file(path.to_path_buf())
        .await
        .map_err(|e| err(e.to_string()))?;
    let t = String::from_utf8(bytes).map_err(|_| err("the file is not UTF-8 text".into()))?;
    let t = t.trim();
    if t.is_empty() {
        return Err(err("the file is empty".into()));
    }
    Ok(t.to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    //! A read "stuck in the kernel" is simulated by holding the reading thread before its read,
    //! for the paths a test marks as stuck, until the test lets go.

    use super::*;
    use std::sync::{Arc, Condvar, Mutex};

    /// Paths whose reads stall, each with (stalled reads so far, released) and its condvar.
    type Gate = Arc<(Mutex<(usize, bool)>, Condvar)>;
    static STUCK: Mutex<Vec<(PathBuf, Gate)>> = Mutex::new(Vec::new());

    pub(crate) fn stall_if_stuck(p: &Path) {
        let gate = STUCK
            .lock()
            .unwrap()
            .iter()
            .find(|(q, _)| q == p)
            .map(|(_, g)| g.clone());
        if let Some(g) = gate {
            let (m, cv) = &*g;
            let mut s = m.lock().unwrap();
            s.0 += 1;
            cv.notify_all();
            while !s.1 {
                s = cv.wait(s).unwrap();
            }
        }
    }

    /// Reads of `path` stall from now until the returned guard is dropped.
    pub(crate) struct Stuck(PathBuf, Gate);

    impl Stuck {
        pub(crate) fn new(path: &Path) -> Stuck {
            let g: Gate = Arc::new((Mutex::new((0, false)), Condvar::new()));
            STUCK.lock().unwrap().push((path.to_path_buf(), g.clone()));
            Stuck(path.to_path_buf(), g)
        }

        /// Reads of the path that have reached the stall so far.
        pub(crate) fn stalled(&self) -> usize {
            self.1 .0.lock().unwrap().0
        }
    }

    impl Drop for Stuck {
        fn drop(&mut self) {
            STUCK.lock().unwrap().retain(|(q, _)| q != &self.0);
            let (m, cv) = &*self.1;
            m.lock().unwrap().1 = true;
            cv.notify_all();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stuck_read_times_out_costs_one_thread_and_the_file_reads_again_once_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("saltgate.yaml");
        std::fs::write(&file, "x: 1\n").unwrap();
        let stuck = Stuck::new(&file);
        let first = tokio::spawn(read_file(file.clone()));
        // (Yielding keeps the paused clock still until the reading thread has stalled.)
        while stuck.stalled() == 0 {
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_millis(1));
        }
        // Paused time: the 10 s bound passes as soon as the runtime waits on nothing else.
        let e = first.await.unwrap().expect_err("stuck");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert_eq!(stuck.stalled(), 1);
        // Later reads of the same path fail at once and start no thread (a watcher polling it).
        for _ in 0..20 {
            let e = read_file(file.clone()).await.expect_err("still stuck");
            assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
        }
        assert_eq!(stuck.stalled(), 1, "one thread for the stuck path");
        // The read returns: the path reads again. The clock runs again first: with it paused, the
        // runtime, idle while the new reading thread works, would jump the 10 s bound at once
        // and every retry would time out (CI saw 1,000 retries in a row do so).
        drop(stuck);
        tokio::time::resume();
        let mut got = Err(std::io::Error::other("not yet"));
        for _ in 0..1000 {
            got = read_file(file.clone()).await;
            if got.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(got.unwrap(), b"x: 1\n");
    }

    /// SIGTERM while a reload is stuck reading the token file: shutdown still completes within
    /// `shutdown_grace` (plus a margin), not after the read's 10 s bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_completes_within_its_grace_while_a_reload_is_stuck_reading_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("admin.token");
        std::fs::write(&token, "s3cret\n").unwrap();
        // Masters on closed ports (DOWN: no matter here); everything on 127.23.0.x.
        let yaml = format!(
            "global:\n  shutdown_grace: 1s\nmasters:\n  - name: a\n    host: 127.23.0.2\n    publish_port: 9\n    request_port: 19\n\
             listeners:\n  publish:\n    bind: 127.23.0.1:4505\n  request:\n    bind: 127.23.0.1:4506\n\
             admin:\n  bind: 127.23.0.1:9505\n  token_file: {}\n",
            token.display()
        );
        let mut config = saltgate_config::parse(&yaml, None, saltgate_config::Format::Yaml)
            .expect("a valid configuration")
            .config;
        // Any free port (the file format wants fixed ones).
        let any: std::net::SocketAddr = "127.23.0.1:0".parse().unwrap();
        (config.publish.bind, config.request.bind, config.admin.bind) = (vec![any], vec![any], any);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = std::sync::Arc::new(
            crate::start(config.clone(), Default::default(), async {
                let _ = stopped.await;
            })
            .await
            .expect("starts"),
        );
        let stuck = Stuck::new(&token);
        let r = running.clone();
        let reload = tokio::spawn(async move { r.reload(config).await });
        let t0 = std::time::Instant::now();
        while stuck.stalled() == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the reload never read the token"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let t0 = std::time::Instant::now();
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(20), running.wait())
            .await
            .expect("shutdown completes");
        let took = t0.elapsed();
        drop(stuck);
        assert!(
            took < Duration::from_secs(3),
            "shutdown took {took:?} while a token read was stuck (grace 1 s)"
        );
        let e = reload.await.unwrap().expect_err("no reload after shutdown");
        assert!(matches!(e, ApplyError::Stopping), "{e}");
    }
}
