//! Salt's `tcp` publish client (`salt/transport/tcp.py`, `PublishClient` in 3008.5), the seam's
//! [`PublishClient`] for `transport: tcp`, over TCP or TLS (feature `tls`).
//!
//! A background task dials the publish port, re-dials after a loss with Salt's reconnect
//! policy ([`ReconnectPolicy`]), and hands over the `body` of every `{head, body}` message: Salt's
//! publish server frames the serialised envelope as bytes, which are the payload as is; a map
//! body is encoded. There is no heartbeat in `tcp` (TCP keepalive only).
//!
//! **The hello.** Right after each connect Salt's minion sends its id to the publish server
//! (`AsyncPubChannel.send_id`): `{"enc": "aes", "load": <{"id", "tok"} encrypted with the
//! publish key>, "version": 3}` with an empty `head`. The master's `presence_callback` checks the
//! token and only then tags the connection with the id; a publish aimed at a list or glob goes
//! **only** to the connections tagged with a matching id. Without the hello a minion receives only
//! the publishes sent to everyone. The payload is the caller's ([`PublishClientOptions::hello`],
//! [`PublishClient::set_hello`]): it needs the session's keys.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};

use super::client::{body_payload, dial, Dial, Stream};
use super::{encode_message, FrameDecoder};
use crate::envelope;
use crate::salt_stream::redial::{self, AbortOnDrop, Link};
use crate::transport::{PublishClient, PublishClientOptions, ReconnectPolicy};

/// Largest publish accepted (Salt's `Unpacker` takes up to 100 MiB; a job with a big argument
/// can be large).
pub const MAX_PUBLISH: usize = 64 * 1024 * 1024;

#[derive(Default)]
struct State {
    link: Link,
    /// The framed hello (`{head: {}, body: payload}`), sent on each connect.
    hello: Mutex<Option<Bytes>>,
    /// Send the hello again now (it changed).
    resend: Notify,
}

/// Frames a hello payload (a msgpack Salt message) as Salt's `send_id` does; `None` when it is
/// not msgpack.
fn frame_hello(payload: &[u8]) -> Option<Bytes> {
    let body = envelope::decode(payload).ok()?;
    Some(Bytes::from(encode_message(
        envelope::Value::Map(Vec::new()),
        body,
    )))
}

/// Salt's `tcp` publish client for one master ([`PublishClient`]).
pub struct TcpSubscriber {
    rx: mpsc::Receiver<Bytes>,
    state: Arc<State>,
    _task: AbortOnDrop,
}

impl TcpSubscriber {
    /// Starts dialling `addr` in the background (call from within a Tokio runtime).
    pub fn connect(addr: SocketAddr, opts: &PublishClientOptions) -> Self {
        let state = Arc::new(State::default());
        if let Some(h) = &opts.hello {
            *state.hello.lock().unwrap_or_else(|p| p.into_inner()) = frame_hello(h);
        }
        let (tx, rx) = mpsc::channel(opts.queue.max(1));
        let how = Dial::from(opts);
        let task = tokio::spawn(run(
            addr,
            how,
            opts.reconnect,
            opts.connect_timeout,
            tx,
            state.clone(),
        ));
        TcpSubscriber {
            rx,
            state,
            _task: AbortOnDrop(task),
        }
    }

    /// Publishes dropped so far because the receive queue was full.
    pub fn dropped_inbound(&self) -> u64 {
        self.state.link.dropped()
    }
}

async fn run(
    addr: SocketAddr,
    how: Dial,
    policy: ReconnectPolicy,
    connect_timeout: Duration,
    tx: mpsc::Sender<Bytes>,
    state: Arc<State>,
) {
    let (how, tx, state) = (&how, &tx, &*state);
    let open = || async move {
        dial(addr, how, connect_timeout)
            .await
            .inspect_err(|e| tracing::debug!(%addr, error = %e, "tcp publish connect failed"))
            .ok()
    };
    let serve = |s| serve(s, tx, state);
    redial::run(
        addr,
        "tcp publish connection",
        policy,
        tx,
        &state.link,
        open,
        serve,
    )
    .await;
}

async fn send_hello(s: &mut Stream, state: &State) -> std::io::Result<()> {
    let hello = state
        .hello
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if let Some(h) = hello {
        s.write_all(&h).await?;
        s.flush().await?;
    }
    Ok(())
}

/// Reads one connection until it ends; returns why.
async fn serve(mut s: Stream, tx: &mpsc::Sender<Bytes>, state: &State) -> &'static str {
    if send_hello(&mut s, state).await.is_err() {
        return "hello not sent";
    }
    let mut dec = FrameDecoder::new(MAX_PUBLISH);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = s.read(&mut chunk) => match r {
                Ok(0) => return "closed by the master",
                Ok(n) => n,
                Err(_) => return "read error",
            },
            _ = state.resend.notified() => {
                if send_hello(&mut s, state).await.is_err() {
                    return "hello not sent";
                }
                continue;
            }
            _ = tx.closed() => return "client dropped",
        };
        if crate::salt_tcp::looks_like_zmtp(&chunk[..n]) && dec.buffered() == 0 {
            tracing::warn!(
                "the publish port answers with a ZMTP greeting: the master speaks \
                 `transport: zeromq`; set the minion's `transport` to the master's"
            );
            return "not Salt's tcp framing (a ZeroMQ master)";
        }
        if dec.push(&chunk[..n]).is_err() {
            return "publish over the size limit";
        }
        loop {
            match dec.next_message() {
                Ok(Some(msg)) => {
                    let Some(payload) = body_payload(&msg.body) else {
                        continue;
                    };
                    if state.link.hand_over(tx, payload).is_err() {
                        return "client dropped";
                    }
                }
                Ok(None) => break,
                Err(_) => return "not Salt's tcp framing",
            }
        }
    }
}

impl PublishClient for TcpSubscriber {
    async fn recv(&mut self) -> Option<Bytes> {
        self.rx.recv().await
    }

    fn is_connected(&self) -> bool {
        self.state.link.is_connected()
    }

    fn connect_count(&self) -> u64 {
        self.state.link.connect_count()
    }

    fn set_hello(&self, hello: Bytes) {
        *self.state.hello.lock().unwrap_or_else(|p| p.into_inner()) = frame_hello(&hello);
        if self.is_connected() {
            self.state.resend.notify_one();
        }
    }
}
