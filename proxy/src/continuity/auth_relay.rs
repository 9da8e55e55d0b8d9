//! The request relay's side of `listeners.request.auth_limit`: a minion's clear `_auth` waits at
//! its master's gate ([`super::auth_limit`]) before its held bytes ([`super::auth_hold`]) are
//! written; every other byte passes as before.
//!
//! While an `_auth` waits, the minion's connection is watched: if the minion closes it (its REQ
//! socket timed out: Salt's zeromq `RequestClient` closes the socket on `SaltReqTimeoutError` and
//! connects a new one), the `_auth` is dropped, never forwarded. After `max_wait`, or when
//! `max_queue` wait already, the `_auth` is dropped and saltgate closes the minion's connection
//! (`queue-timeout`, `queue-full`): its REQ socket would give up at `auth_timeout` and reconnect
//! anyway, and a connection without its request would only hold a descriptor.

use bytes::BytesMut;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::auth_hold::Step;
use super::auth_limit::{AuthPermit, Entry};
use super::{from_master, Relay, Stop};
use crate::data::buf::{read_some, Tally};
use crate::data::close::CloseReason;
use crate::data::registry::SessionCtl;

/// How a wait at the gate ended.
enum Waited {
    Admitted(AuthPermit),
    Dropped(CloseReason),
    Asked,
}

impl Relay<'_> {
    /// Writes what the minion sent through the hold and the gate.
    pub(super) async fn paced(
        &mut self,
        client: &TcpStream,
        master: &mut TcpStream,
        ctl: &SessionCtl,
        tin: &mut Tally<'_>,
        chunk: &[u8],
    ) -> Result<(), Stop> {
        let Some(hold) = self.hold.as_mut() else {
            return self.send_up(master, ctl, tin, chunk).await;
        };
        match hold.feed(chunk) {
            Step::Write(0) => Ok(()),
            Step::Write(k) => self.send_up(master, ctl, tin, &chunk[..k]).await,
            Step::Release {
                pre,
                mut bytes,
                auth,
            } => {
                if pre > 0 {
                    self.send_up(master, ctl, tin, &chunk[..pre]).await?;
                }
                if auth {
                    self.permit = self.admit(client, ctl, &mut bytes).await?;
                }
                self.send_up(master, ctl, tin, &bytes).await
            }
        }
    }

    /// Waits at the master's gate for one `_auth` (see the module docs). `held` gets anything
    /// the minion sends meanwhile (a REQ socket sends nothing: the reader turns off).
    async fn admit(
        &mut self,
        client: &TcpStream,
        ctl: &SessionCtl,
        held: &mut BytesMut,
    ) -> Result<Option<AuthPermit>, Stop> {
        let (Some(gate), Some(cfg)) = (self.gate.clone(), self.auth) else {
            return Ok(None);
        };
        let mut q = match gate.enter(cfg.max_queue) {
            Ok(Entry::Admitted(p)) => return Ok(Some(p)),
            Ok(Entry::Queued(q)) => q,
            Err(_) => return Err(Stop::Close(CloseReason::QueueFull)),
        };
        let waited = loop {
            tokio::select! {
                r = q.wait(cfg.max_wait) => break match r {
                    Ok(p) => Waited::Admitted(p),
                    Err(_) => Waited::Dropped(CloseReason::QueueTimeout),
                },
                r = client.readable(), if !self.client_eof => {
                    if r.is_err() {
                        break Waited::Dropped(CloseReason::ClientReset);
                    }
                    let mut buf = self.ctx.pool.get();
                    match read_some(client, &mut buf) {
                        // The minion gave up: its `_auth` never reaches the master.
                        Ok(0) => break Waited::Dropped(CloseReason::ClientEof),
                        Ok(n) => {
                            held.extend_from_slice(&buf[..n]);
                            if let Some(h) = self.hold.as_mut() {
                                h.off();
                            }
                            self.last = Instant::now();
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(_) => break Waited::Dropped(CloseReason::ClientReset),
                    }
                }
                _ = ctl.closed(&self.ctx.sessions_token) => break Waited::Asked,
            }
        };
        match waited {
            Waited::Admitted(p) => Ok(Some(p)),
            // Counted by the queue (minion_closed, max_wait) as it drops.
            Waited::Dropped(reason) => Err(Stop::Close(reason)),
            Waited::Asked => {
                q.abandon(None);
                Err(from_master(
                    ctl.close_reason().unwrap_or(CloseReason::Shutdown),
                ))
            }
        }
    }
}
