//! One direction of a session's data path as a poll-driven state machine ([`Half`]), so that
//! [`crate::pump::pump`] can drive both directions, the idle timer and the close token from a
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

use crate::pump::{read_some, BufPool, PooledBuf, Tally, Tap};

/// How one direction ended.
#[derive(Debug)]
pub(crate) enum DirEnd {
    /// The reading side sent FIN; it was passed on.
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
            done: false,
        }
    }

    /// Moves what `src` has to `dst` until one of them would block (its waker is then registered
    /// and `Pending` returned) or the direction ends. Sets `*moved` when any byte was written.
    ///
    /// A read's buffer comes from `pool` once `src` is readable and goes back once its bytes are
    /// written; it is reused for the next read within the same call, so a burst costs one pool
    /// round trip.
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
                spare = Some(buf);
            }
            if let Err(e) = ready!(src.poll_read_ready(cx)) {
                return Poll::Ready(DirEnd::ReadErr(e));
            }
            let mut buf = spare.take().unwrap_or_else(|| pool.get());
            match read_some(src, &mut buf) {
                Ok(0) => {
                    // Pass the FIN on. A failure here means the peer is gone; the other
                    // direction will see it.
                    let _ = socket2::SockRef::from(dst).shutdown(std::net::Shutdown::Write);
                    return Poll::Ready(DirEnd::Eof);
                }
                Ok(n) => {
                    self.pending = Some(Pending { buf, at: 0, len: n });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => spare = Some(buf),
                Err(e) => return Poll::Ready(DirEnd::ReadErr(e)),
            }
        }
    }
}
