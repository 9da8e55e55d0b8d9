//! Zero-copy forwarding for bulk data on Linux: `splice(2)` from the source socket into a pipe
//! and from the pipe into the destination socket, so the bytes never enter userspace (HAProxy's
//! `option splice-auto`).
//!
//! - Automatic: a direction switches to splicing once a read fills a whole pump buffer (bulk
//!   data is flowing) and nothing taps its bytes any more (presence reads the first bytes of a
//!   request session through the copy path); it goes back to copying when a splice brings less
//!   than [`SMALL`] bytes (messages, not a stream).
//! - Pipes are pooled ([`Pipes`]) and held only while bytes are in them or flowing: a direction
//!   whose source has nothing to read gives its (empty) pipe back, so idle sessions hold none.
//! - Linux only, as the rest of the proxy (`TCP_USER_TIMEOUT`). Without a pipe (out of
//!   descriptors) [`Pipes::get`] returns `None` and the copy path runs.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crossbeam_queue::ArrayQueue;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Pipe capacity asked for (`F_SETPIPE_SZ`); also the most one splice moves. Pages are only
/// used while bytes are in the pipe.
pub const PIPE_SIZE: usize = 256 * 1024;

/// A splice that brings fewer bytes than this sends the direction back to copying.
pub const SMALL: usize = 4096;

/// A pipe pair: bytes go in at `w`, out at `r`.
pub struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut fds = [0i32; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are open descriptors owned by nobody else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // A bigger pipe moves more per splice; the default (64 KiB) still works if refused.
        // SAFETY: fcntl on a descriptor we own.
        unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE as libc::c_int) };
        Ok(Pipe { r, w })
    }
}

/// Empty pipes kept for reuse, shared by all sessions.
pub struct Pipes {
    free: ArrayQueue<Pipe>,
}

impl Pipes {
    pub fn new(max_free: usize) -> Self {
        Self {
            free: ArrayQueue::new(max_free.max(1)),
        }
    }

    /// An empty pipe: from the pool, else a new one. `None` when no pipe can be made (out of
    /// descriptors): the caller copies instead.
    pub fn get(&self) -> Option<Pipe> {
        self.free.pop().or_else(|| match Pipe::new() {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::debug!(target: "saltgate_proxy::splice", error = %e, "no pipe for splicing; copying instead");
                None
            }
        })
    }

    /// Gives back a pipe that is empty (one with bytes left in it is closed instead).
    pub fn put(&self, pipe: Pipe) {
        let _ = self.free.push(pipe);
    }
}

fn splice(from: i32, to: i32, len: usize) -> io::Result<usize> {
    // SAFETY: plain syscall on descriptors the caller keeps open; null offsets (sockets, pipes).
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Splices what `src` holds (at most [`PIPE_SIZE`]) into the empty `pipe`. `Ok(0)`: FIN. As
/// [`crate::data::pump::read_some`], a short splice clears the socket's read readiness.
pub fn fill(src: &TcpStream, pipe: &Pipe) -> io::Result<usize> {
    read_clearing(src, PIPE_SIZE, || {
        splice(src.as_raw_fd(), pipe.w.as_raw_fd(), PIPE_SIZE)
    })
}

/// Splices up to `len` bytes from `pipe` into `dst`.
pub fn drain(pipe: &Pipe, dst: &TcpStream, len: usize) -> io::Result<usize> {
    dst.try_io(Interest::WRITABLE, || {
        splice(pipe.r.as_raw_fd(), dst.as_raw_fd(), len)
    })
}

/// Runs `read` (which takes at most `cap` bytes from `stream`) under tokio's readiness: a short
/// read means the socket is drained, so it is reported to tokio as `WouldBlock` (clearing the
/// readiness, no extra `read` to find out) while the bytes read are returned. Shared by the copy
/// path ([`crate::data::buf::read_some`]) and the splice path ([`fill`]).
pub(crate) fn read_clearing(
    stream: &TcpStream,
    cap: usize,
    mut read: impl FnMut() -> io::Result<usize>,
) -> io::Result<usize> {
    let mut got = None;
    let res = stream.try_io(tokio::io::Interest::READABLE, || {
        let n = read()?;
        got = Some(n);
        if n > 0 && n < cap {
            // Drained: report WouldBlock so that tokio clears the readiness; `got` has the bytes.
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(n)
        }
    });
    match (res, got) {
        (Err(e), Some(n)) if e.kind() == io::ErrorKind::WouldBlock => Ok(n),
        (res, _) => res,
    }
}
