//! systemd's readiness protocol (`Type=notify`, `sd_notify(3)`): one datagram of `KEY=VALUE`
//! lines to the socket named by `NOTIFY_SOCKET` (a path, or `@name` for an abstract socket).
//! Shared by the three daemons (`saltgate`, `saltgate-master`, `saltgate-minion`); it does
//! nothing when `NOTIFY_SOCKET` is not set, and a failure never stops a daemon (it is logged at
//! debug only). Not a service manager client beyond that: no watchdog, no fd store.

use std::ffi::OsStr;
use std::os::unix::net::UnixDatagram;

/// Sends `state` (such as `READY=1`) to the service manager, if there is one.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send_to(&path, state) {
        tracing::debug!(error = %e, state, "sd_notify failed");
    }
}

/// `RELOADING=1` with the monotonic timestamp systemd 253+ expects beside it.
pub fn notify_reloading() {
    notify(&reloading_message(monotonic_usec()));
}

/// The `RELOADING=1` datagram for a reload that starts at `usec` (CLOCK_MONOTONIC, µs).
pub fn reloading_message(usec: u64) -> String {
    format!("RELOADING=1\nMONOTONIC_USEC={usec}")
}

fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1000
}

/// Sends `state` to the socket `path` names: a file-system path, or `@name` (abstract).
pub fn send_to(path: &OsStr, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn a_path_socket_receives_the_state_as_one_datagram() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        send_to(path.as_os_str(), "READY=1").unwrap();
        assert_eq!(receive(&sock), "READY=1");
    }

    #[test]
    fn an_at_sign_names_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("saltgate-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        send_to(OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        assert_eq!(receive(&sock), "STOPPING=1");
    }

    #[test]
    fn a_missing_socket_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        assert!(send_to(dir.path().join("absent").as_os_str(), "READY=1").is_err());
    }

    #[test]
    fn reloading_carries_the_monotonic_timestamp() {
        assert_eq!(reloading_message(1234), "RELOADING=1\nMONOTONIC_USEC=1234");
        assert!(monotonic_usec() > 0);
    }
}
