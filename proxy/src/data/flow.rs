//! One direction of a session's data path as a poll-driven state machine ([`Half`]), so that
//! [`crate::data::pump::pump`] can drive both directions, the idle timer and the close token from a
//! single small future.
//!
//! Why not two `async` loops (one per direction) under a `select!`: each loop's state machine
//! holds its `readable()` and `write_all()` futures inline (intrusive waiter nodes, the write
//! future's slice), and an idle publish session keeps all of it for days. Here an idle direction
//! is a few words: the sockets' own reader and writer waker slots (`poll_read_ready`,
//! `poll_write_ready`) hold the registration, and a buffer exists only between a read and the
//! end of its write.

use std::io;
use std::task::{ready, Context, Poll};

use prometheus::IntCounter;
use std::sync::atomic::AtomicU64;
use tokio::net::TcpStream;

use super::buf::{read_some, BufPool, PooledBuf, Tally, Tap};
use super::splice::{self, Pipe};

/// How one direction ended.
#[derive(Debug)]
pub(crate) enum DirEnd {
    /// The reading side sent FIN. Not passed on yet: see [`pass_fin`].
    Eof,
    /// Reading failed.
    ReadErr(io::Error),
    /// Writing failed.
    WriteErr(io::Error),
}

/// Bytes read and not yet all written: `buf[at..len]` is still to go.
struct Pending<'a> {
    buf: PooledBuf<'a>,
    at: usize,
    len: usize,
}

/// One direction: reads from `src`, writes to `dst`.
pub(crate) struct Half<'a> {
    tally: Tally<'a>,
    pending: Option<Pending<'a>>,
    tap: Option<Box<dyn Tap>>,
    /// Bulk data flows: splice (see [`crate::data::splice`]) rather than copy.
    bulk: bool,
    /// While splicing: the pipe, and how many bytes are in it.
    pipe: Option<Pipe>,
    in_pipe: usize,
    /// The direction has ended (its [`DirEnd`] was returned).
    pub done: bool,
}

impl<'a> Half<'a> {
    pub(crate) fn new(
        count: &'a AtomicU64,
        metric: &'a IntCounter,
        tap: Option<Box<dyn Tap>>,
    ) -> Self {
        Self {
            tally: Tally::new(count, metric),
            pending: None,
            tap,
            bulk: false,
            pipe: None,
            in_pipe: 0,
            done: false,
        }
    }

    /// Moves what `src` has to `dst` until one of them would block (its waker is then registered
    /// and `Pending` returned) or the direction ends. Sets `*moved` when any byte was written.
    ///
    /// A read's buffer comes from `pool` once `src` is readable and goes back once its bytes are
    /// written; it is reused for the next read within the same call, so a burst costs one pool
    /// round trip. Bulk data is spliced instead (no buffer); the pipe goes back to the pool once
    /// empty and `src` has nothing more.
    pub(crate) fn poll_move(
        &mut self,
        cx: &mut Context<'_>,
        src: &TcpStream,
        dst: &TcpStream,
        pool: &'a BufPool,
        moved: &mut bool,
    ) -> Poll<DirEnd> {
        let mut spare: Option<PooledBuf<'a>> = None;
        loop {
            if let Some(p) = self.pending.as_mut() {
                if let Err(e) = ready!(dst.poll_write_ready(cx)) {
                    return Poll::Ready(DirEnd::WriteErr(e));
                }
                match dst.try_write(&p.buf[p.at..p.len]) {
                    Ok(0) => return Poll::Ready(DirEnd::WriteErr(io::ErrorKind::WriteZero.into())),
                    Ok(n) => {
                        p.at += n;
                        *moved = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Poll::Ready(DirEnd::WriteErr(e)),
                }
                if p.at < p.len {
                    continue;
                }
                let Pending { buf, len, .. } = self.pending.take().expect("checked above");
                self.tally.add(len as u64);
                if let Some(t) = self.tap.as_mut() {
                    if !t.observe(&buf[..len]) {
                        self.tap = None;
                    }
                }
                // A full buffer: a stream, not a message. Splice from now on, unless tapped.
                self.bulk = len == buf.len() && self.tap.is_none();
                spare = Some(buf);
            }
            if self.in_pipe > 0 {
                if let Err(e) = ready!(dst.poll_write_ready(cx)) {
                    return Poll::Ready(DirEnd::WriteErr(e));
                }
                let pipe = self.pipe.as_ref().expect("bytes in the pipe");
                match splice::drain(pipe, dst, self.in_pipe) {
                    Ok(0) => return Poll::Ready(DirEnd::WriteErr(io::ErrorKind::WriteZero.into())),
                    Ok(n) => {
                        self.in_pipe -= n;
                        self.tally.add(n as u64);
                        *moved = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(DirEnd::WriteErr(e)),
                }
                continue;
            }
            match src.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(DirEnd::ReadErr(e)),
                Poll::Pending => {
                    // Nothing to read: an idle direction holds no pipe.
                    if let Some(p) = self.pipe.take() {
                        pool.pipes.put(p);
                    }
                    return Poll::Pending;
                }
            }
            if self.bulk && self.pipe.is_none() {
                self.pipe = pool.pipes.get();
                self.bulk = self.pipe.is_some();
            }
            let got = match self.pipe.as_ref().filter(|_| self.bulk) {
                Some(pipe) => splice::fill(src, pipe),
                None => {
                    let mut buf = spare.take().unwrap_or_else(|| pool.get());
                    let got = read_some(src, &mut buf);
                    if matches!(got, Ok(n) if n > 0) {
                        let len = *got.as_ref().expect("matched Ok");
                        self.pending = Some(Pending { buf, at: 0, len });
                    } else {
                        spare = Some(buf);
                    }
                    got
                }
            };
            match got {
                // The caller passes the FIN on (see `pass_fin`).
                Ok(0) => return Poll::Ready(DirEnd::Eof),
                Ok(n) if self.pending.is_none() => {
                    self.in_pipe = n;
                    if n < splice::SMALL {
                        // Messages, not a stream: copy the next ones (the pipe is given back
                        // once drained and idle).
                        self.bulk = false;
                    }
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(DirEnd::ReadErr(e)),
            }
        }
    }
}

/// Passes a FIN read from one side on to `dst` (`shutdown(Write)`), unless the other direction
/// has ended too (`other_done`): then the session closes both sockets next, and the close sends
/// the same FIN (both receive queues were read to EOF, so no RST), one syscall fewer per session.
/// A failure here means the peer is gone; the other direction will see it.
pub(crate) fn pass_fin(dst: &TcpStream, other_done: bool) {
    if !other_done {
        let _ = socket2::SockRef::from(dst).shutdown(std::net::Shutdown::Write);
    }
}
