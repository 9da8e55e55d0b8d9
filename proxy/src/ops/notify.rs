//! systemd's readiness protocol (`Type=notify`): `READY=1` once listeners are bound and the first
//! health round has run, `RELOADING=1` and `READY=1` around reloads, `STOPPING=1` at shutdown.
//! Does nothing when `NOTIFY_SOCKET` is not set.

use std::os::unix::net::UnixDatagram;

/// Sends `state` to the service manager, if there is one. Failures are logged at debug only: a
/// missing manager must never stop the proxy.
pub fn sd_notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let result = (|| -> std::io::Result<()> {
        let sock = UnixDatagram::unbound()?;
        let bytes = path.as_encoded_bytes();
        if let Some(name) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        } else {
            sock.send_to(state.as_bytes(), &path)?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        tracing::debug!(target: "saltgate_proxy::notify", error = %e, state, "sd_notify failed");
    }
}

/// `RELOADING=1` with the monotonic timestamp systemd 253+ expects.
pub fn sd_notify_reloading() {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let usec = (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1000;
    sd_notify(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
}
