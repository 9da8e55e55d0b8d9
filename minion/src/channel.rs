//! The request channel to one master (port `master_port`, 4506): `_auth` on its own short-lived
//! REQ connection (as Salt), and v3 `aes` requests (`_pillar`, `_return`) on a long-lived one.
//!
//! An `aes` request carries `nonce`, `ts`, `tok` and `id` inside a load encrypted with the
//! session key; the reply is encrypted with the same key and prefixed with our nonce (`_pillar`
//! is the exception: a dict with a private per-reply key, checked as Salt's
//! `crypted_transfer_decode_dictentry`). A clear `"bad load"` reply means our session is stale:
//! the caller re-authenticates.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use saltgate_wire::crypticle::{Crypticle, CrypticleKey};
use saltgate_wire::envelope::{self, map, text, Reply, RequestEnvelope, Value};
use saltgate_wire::rsa::{EncAlgo, SigAlgo};
use saltgate_wire::salt_tcp::client::TlsClient;
use saltgate_wire::transport::{
    AnyRequestClient, RequestClient, RequestClientOptions, RequestError, Transport,
};
use thiserror::Error;

use crate::auth::{self, AuthError, AuthOutcome};
use crate::keys::{MasterKeyStore, MinionKey};

#[derive(Debug, Error)]
pub enum ChannelError {
    #[error(transparent)]
    Req(#[from] RequestError),
    #[error("undecodable reply: {0}")]
    Decode(String),
    #[error("reply did not decrypt: {0}")]
    Crypt(String),
    #[error("master answered \"bad load\": our session is stale")]
    BadLoad,
    #[error("master is not ready (cluster_retry)")]
    NotReady,
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("pillar reply failed verification: {0}")]
    Pillar(&'static str),
}

impl ChannelError {
    /// True when a request got no answer within its timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ChannelError::Req(RequestError::Timeout(_)))
    }

    /// True when the master (or the path to it) is not answering at all.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            ChannelError::Req(RequestError::Timeout(_))
                | ChannelError::Req(RequestError::Connect { .. })
                | ChannelError::Req(RequestError::Disconnected)
        )
    }
}

/// Who we are towards one master.
#[derive(Debug, Clone)]
pub struct Identity {
    pub id: Arc<str>,
    pub key: Arc<MinionKey>,
    pub store: Arc<MasterKeyStore>,
}

/// The request side of one master link.
pub struct ReqChannel {
    ident: Identity,
    addr: SocketAddr,
    /// The master's transport (Salt's `transport`).
    transport: Transport,
    /// TLS to the master (Salt's `ssl`, `tcp` only).
    tls: Option<TlsClient>,
    req: Option<AnyRequestClient>,
    /// Keep the request connection open between requests (Salt does). A swarm closes it to
    /// save a file descriptor and the connection's buffers per idle minion.
    keep_open: bool,
    /// Salt's per-process random minion token, proven back by the master in `_auth`.
    token: String,
    /// Local address every connection of this channel is dialled from (`source_address`).
    source: Option<IpAddr>,
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl ReqChannel {
    pub fn new(ident: Identity, addr: SocketAddr, keep_open: bool) -> Self {
        ReqChannel {
            ident,
            addr,
            transport: Transport::default(),
            tls: None,
            req: None,
            keep_open,
            token: CrypticleKey::generate().to_key_string(),
            source: None,
        }
    }

    /// A second channel to the same master as the same minion, with its own connection (for a
    /// request sent in the background, as Salt's minion sends its start event).
    pub fn sibling(&self) -> Self {
        ReqChannel::new(self.ident.clone(), self.addr, false)
            .with_source(self.source)
            .with_transport(self.transport)
            .with_tls(self.tls.clone())
    }

    /// Speaks TLS to the master (Salt's `ssl`) when given.
    pub fn with_tls(mut self, tls: Option<TlsClient>) -> Self {
        self.tls = tls;
        self
    }

    /// Speaks `transport` to the master (Salt's `transport` option).
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// Dials every connection from `source` (Salt's `source_address`) when given.
    pub fn with_source(mut self, source: Option<IpAddr>) -> Self {
        self.source = source;
        self
    }

    fn options(&self) -> RequestClientOptions {
        RequestClientOptions {
            source: self.source,
            tls: self.tls.clone(),
            ..RequestClientOptions::default()
        }
    }

    /// A new request client to this channel's master (nothing dialled yet).
    fn client(&self) -> Result<AnyRequestClient, RequestError> {
        Ok(self.transport.request_client(self.addr, &self.options())?)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn id(&self) -> &str {
        &self.ident.id
    }

    async fn request(&mut self, env: Vec<u8>, timeout: Duration) -> Result<Reply, ChannelError> {
        let sock = match self.req.take() {
            Some(sock) => self.req.insert(sock),
            None => self.req.insert(self.client()?),
        };
        let res = sock.send(Bytes::from(env), timeout).await;
        if !self.keep_open || res.is_err() {
            self.req = None;
        }
        let reply = res?;
        Reply::decode(&reply).map_err(|e| ChannelError::Decode(e.to_string()))
    }

    /// One `_auth` round on a fresh connection, bounded by `timeout`.
    pub async fn authenticate(&self, timeout: Duration) -> Result<AuthOutcome, ChannelError> {
        let nonce = auth::new_nonce();
        let master_pub = self.ident.store.current();
        let env = auth::request(
            &self.ident.id,
            &self.ident.key,
            &nonce,
            master_pub.as_deref(),
            self.token.as_bytes(),
        );
        let mut sock = self.client()?;
        let raw = sock.send(Bytes::from(env.encode()), timeout).await?;
        drop(sock);
        let reply = Reply::decode(&raw).map_err(|e| ChannelError::Decode(e.to_string()))?;
        let (key, store) = (self.ident.key.clone(), self.ident.store.clone());
        let token = master_pub.map(|_| self.token.clone());
        // Two RSA private-key operations: keep them off the async workers.
        let out = tokio::task::spawn_blocking(move || {
            auth::verify_reply(
                reply,
                &key,
                &nonce,
                token.as_deref().map(str::as_bytes),
                &store,
            )
        })
        .await
        .map_err(|e| ChannelError::Decode(format!("verification task: {e}")))??;
        Ok(out)
    }

    fn package(&self, session: &Crypticle, load: Value, nonce: &str) -> Vec<u8> {
        let mut entries = match load {
            Value::Map(m) => m,
            other => vec![(text("load"), other)],
        };
        entries.push((text("nonce"), text(nonce)));
        entries.push((text("ts"), Value::from(now_secs())));
        entries.push((text("tok"), envelope::bin(&self.ident.key.tok)));
        entries.push((text("id"), text(&self.ident.id)));
        let ct = session.dumps(&envelope::salt_compat(Value::Map(entries)), None);
        RequestEnvelope::aes(&self.ident.id, &ct).encode()
    }

    /// A v3 `aes` request; returns the decrypted reply.
    pub async fn send_aes(
        &mut self,
        session: &mut Crypticle,
        load: Value,
        timeout: Duration,
    ) -> Result<Value, ChannelError> {
        let nonce = auth::new_nonce();
        let env = self.package(session, load, &nonce);
        match self.request(env, timeout).await? {
            Reply::Encrypted(ct) => session
                .loads(&ct, Some(&nonce))
                .map_err(|e| ChannelError::Crypt(e.to_string())),
            Reply::Text(t) if t == "bad load" => Err(ChannelError::BadLoad),
            r if r.is_cluster_retry() => Err(ChannelError::NotReady),
            other => Err(ChannelError::Decode(format!("unexpected reply {other:?}"))),
        }
    }

    /// `_pillar` (Salt's `RemotePillar`, ver 2) with `grains`; returns the pillar data.
    pub async fn pillar(
        &mut self,
        session: &mut Crypticle,
        grains: Value,
        timeout: Duration,
    ) -> Result<Value, ChannelError> {
        let load = map(vec![
            ("cmd", text("_pillar")),
            ("id", text(&self.ident.id)),
            ("grains", grains),
            ("saltenv", Value::Nil),
            ("pillarenv", Value::Nil),
            ("pillar_override", Value::Map(Vec::new())),
            ("extra_minion_data", Value::Map(Vec::new())),
            ("ver", text("2")),
        ]);
        let nonce = auth::new_nonce();
        let env = self.package(session, load, &nonce);
        let reply = match self.request(env, timeout).await? {
            Reply::Plain(v) => v,
            Reply::Text(t) if t == "bad load" => return Err(ChannelError::BadLoad),
            r if r.is_cluster_retry() => return Err(ChannelError::NotReady),
            other => return Err(ChannelError::Decode(format!("pillar reply {other:?}"))),
        };
        let key = self.ident.key.clone();
        let master_pub = self
            .ident
            .store
            .current()
            .ok_or(ChannelError::Pillar("no master key"))?;
        tokio::task::spawn_blocking(move || {
            let wrapped = envelope::get(&reply, "key")
                .and_then(envelope::as_bytes)
                .ok_or(ChannelError::BadLoad)?;
            let k = key
                .private
                .decrypt(EncAlgo::OaepSha1, wrapped)
                .map_err(|_| ChannelError::Pillar("key did not decrypt"))?;
            let k = std::str::from_utf8(&k)
                .ok()
                .and_then(|s| CrypticleKey::from_key_string(s).ok())
                .ok_or(ChannelError::Pillar("not a key string"))?;
            let body = envelope::get(&reply, "pillar")
                .and_then(envelope::as_bytes)
                .ok_or(ChannelError::Pillar("no pillar"))?;
            let signed = Crypticle::new(k)
                .loads(body, None)
                .map_err(|_| ChannelError::Pillar("pillar did not decrypt"))?;
            let data = envelope::get(&signed, "data")
                .and_then(envelope::as_bytes)
                .ok_or(ChannelError::Pillar("no data"))?;
            let sig = envelope::get(&signed, "sig")
                .and_then(envelope::as_bytes)
                .ok_or(ChannelError::Pillar("no sig"))?;
            if !master_pub.verify(SigAlgo::Pkcs1v15Sha1, data, sig) {
                return Err(ChannelError::Pillar("signature did not verify"));
            }
            let data = envelope::decode(data).map_err(|e| ChannelError::Decode(e.to_string()))?;
            if envelope::get(&data, "key").and_then(envelope::as_bytes) != Some(wrapped) {
                return Err(ChannelError::Pillar("key verification failed"));
            }
            if envelope::get(&data, "nonce").and_then(envelope::as_str) != Some(nonce.as_str()) {
                return Err(ChannelError::Pillar("nonce verification failed"));
            }
            Ok(envelope::get(&data, "pillar")
                .cloned()
                .unwrap_or(Value::Map(Vec::new())))
        })
        .await
        .map_err(|e| ChannelError::Decode(format!("pillar task: {e}")))?
    }

    /// Salt's `send_id` for the `tcp` publish connection: `{"enc": "aes", "load": <{"id", "tok"}
    /// encrypted with the publish key>, "version": 3}`. The master checks `tok` and from then on
    /// sends the publishes aimed at this id to that connection.
    pub fn publish_hello(&self, aes: &Crypticle) -> Vec<u8> {
        let load = map(vec![
            ("id", text(&self.ident.id)),
            ("tok", envelope::bin(&self.ident.key.tok)),
        ]);
        let ct = aes.dumps(&envelope::salt_compat(load), None);
        envelope::encode(&map(vec![
            ("enc", text("aes")),
            ("load", envelope::bin(&ct)),
            ("version", Value::from(3)),
        ]))
    }

    /// Salt's clear `ping` on this channel (what `status.ping_master` does): true if answered.
    pub async fn ping(&mut self, timeout: Duration) -> bool {
        matches!(
            self.request(RequestEnvelope::ping().encode(), timeout)
                .await,
            Ok(Reply::Plain(_))
        )
    }
}
