//! A probe or connect that failed for want of a local resource (descriptors, buffers, memory):
//! such a failure says nothing about the master. Shared by [`crate::select::check`] and
//! [`crate::select::transport_probe`].

/// How a probe's `Err` begins when the probe failed for want of a local resource (see
/// [`is_local_resource`]): such a failure says nothing about the master and is not counted.
pub const LOCAL_RESOURCE: &str = "local resource exhausted";

/// EMFILE, ENFILE, ENOBUFS, ENOMEM: this host ran out of descriptors, buffers or memory.
pub fn is_local_resource(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// A check's connect that failed: [`Stage::LocalResource`] when this host ran out (see
/// [`is_local_resource`]), else a counted failure.
///
/// [`Stage::LocalResource`]: crate::select::check_failure::Stage::LocalResource
pub(crate) fn connect_error(
    what: &str,
    e: &std::io::Error,
) -> crate::select::check_failure::CheckFailure {
    use crate::select::check_failure::CheckFailure;
    if is_local_resource(e) {
        CheckFailure::local_resource(format!("{LOCAL_RESOURCE}: {what}: {e}"))
    } else {
        CheckFailure::failed(format!("{what}: {e}"))
    }
}
