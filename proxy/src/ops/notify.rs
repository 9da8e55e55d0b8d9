//! systemd's readiness protocol (`Type=notify`): `READY=1` once listeners are bound and the first
//! health round has run, `RELOADING=1` and `READY=1` around reloads, `STOPPING=1` at shutdown.
//! The datagram code is shared with saltgate-master and saltgate-minion (`saltgate_wire::sd_notify`,
//! which needs no OpenSSL); this module names the proxy's uses. Does nothing when `NOTIFY_SOCKET`
//! is not set.

/// Sends `state` to the service manager, if there is one. Failures are logged at debug only: a
/// missing manager must never stop the proxy.
pub fn sd_notify(state: &str) {
    saltgate_wire::sd_notify::notify(state);
}

/// `RELOADING=1` with the monotonic timestamp systemd 253+ expects.
pub fn sd_notify_reloading() {
    saltgate_wire::sd_notify::notify_reloading();
}
