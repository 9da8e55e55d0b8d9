//! The stop signals of the three daemons (`saltgate`, `saltgate-master`, `saltgate-minion`):
//! SIGTERM (systemd's stop) and SIGINT (Ctrl-C).

use std::future::Future;

/// A future that completes with the signal's name on the first SIGTERM or SIGINT.
///
/// The handlers are installed by this call, not when the future is first polled: a daemon calls
/// it before it binds its listeners and tells systemd `READY=1`, so a SIGTERM that comes at once
/// after `READY=1` still ends in a clean stop (`STOPPING=1`), never in the default action.
pub fn stop_signal() -> std::io::Result<impl Future<Output = &'static str> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sigterm_sent_before_the_future_is_polled_completes_it() {
        let stop = stop_signal().unwrap();
        // The handler installed above catches it (tokio's handler stays for the process's life).
        // SAFETY: kill(2) with this process's own pid and a signal it handles.
        assert_eq!(
            unsafe { libc::kill(std::process::id() as i32, libc::SIGTERM) },
            0
        );
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), stop)
            .await
            .expect("the signal completes the future");
        assert_eq!(got, "SIGTERM");
    }
}
