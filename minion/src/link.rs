//! One minion's connection set to one master: authenticate (waiting while the key is pending),
//! fetch pillar, subscribe to publishes, run the jobs that target us and return their results
//! to this master, and watch the master's liveness.
//!
//! A link is one task. Jobs run in a `JoinSet` (no task while idle); the publish socket's
//! driver answers the master's heartbeats on its own, so a long job or a slow return never
//! gets the minion dropped. Liveness (only with `master_alive_interval`): our SUB sends ZMTP
//! PINGs and drops a master that stays silent for the interval; a master whose publish side
//! stays down for two checks, or (failover) that does not answer a clear `ping` on the request
//! port, is dead. Salt itself only looks for an ESTABLISHED TCP connection; see docs/minion.md.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saltgate_wire::crypticle::{Crypticle, CrypticleError};
use saltgate_wire::envelope::{self, text, PublishEnvelope, Value};
use saltgate_wire::rsa::{PublicKey, SigAlgo};
use saltgate_wire::salt_tcp::client::TlsClient;
use saltgate_wire::transport::{
    Heartbeat, PublishClient, PublishClientOptions, ReconnectPolicy, Transport,
};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::task::AbortOnDropHandle;

use crate::auth::{AuthError, AuthOutcome};
use crate::channel::{ChannelError, Identity, ReqChannel};
use crate::exec::{self, ExecContext, Outcome};
use crate::job::{JidQueue, Job};

/// Counters shared by the minions of a process (the swarm prints them every second).
#[derive(Debug, Default)]
pub struct Stats {
    /// Links whose publish connection is up.
    pub connected: AtomicI64,
    /// Links holding an accepted session.
    pub authenticated: AtomicI64,
    /// Returns the master acknowledged.
    pub jobs_answered: AtomicU64,
    pub publishes_received: AtomicU64,
    /// Publishes that targeted this minion and started a job.
    pub jobs_started: AtomicU64,
    /// `_return` requests sent again after a failed try.
    pub return_retries: AtomicU64,
    /// Returns given up after every try.
    pub returns_failed: AtomicU64,
    pub errors: AtomicU64,
    /// `_auth` tries that got no answer within `auth_timeout` (each one still costs a master
    /// that processes it).
    pub auth_timeouts: AtomicU64,
    /// `_auth` tries sent again, within a round of `auth_tries`, after a try got no answer.
    pub auth_retries: AtomicU64,
    pub auth_pending: AtomicU64,
    /// Start events (`salt/minion/<id>/start`) the master answered.
    pub start_events: AtomicU64,
    /// How long after its publish (its JID's moment) each job arrived.
    pub receipt: crate::latency::Histogram,
}

impl Stats {
    fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Settings of a link (Salt's minion options, resolved).
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// The master's request port address.
    pub req_addr: SocketAddr,
    /// `publish_port` from the minion config; else what the master announces.
    pub publish_port: Option<u16>,
    pub auth_timeout: Duration,
    pub auth_tries: u32,
    pub acceptance_wait_time: Duration,
    pub acceptance_wait_time_max: Duration,
    /// 0 = no liveness checks.
    pub alive_interval: Duration,
    pub recon: ReconnectPolicy,
    /// The master's transport (Salt's `transport`: zeromq or tcp).
    pub transport: Transport,
    /// TLS to the master (Salt's `ssl`; tcp only), for both channels.
    pub tls: Option<TlsClient>,
    pub keep_req_open: bool,
    /// Timeout of one `_return`/`_pillar` request (Salt: 60 s).
    pub request_timeout: Duration,
    /// Tries for a `_return` (Salt's `return_retry_tries`: 3).
    pub return_tries: u32,
    /// Ask for pillar after each authentication (Salt always does).
    pub pillar: bool,
    /// Local address both connections are dialled from (`source_address`).
    pub source: Option<std::net::IpAddr>,
    /// Publish signatures verified once for all the links sharing it (a swarm's).
    pub sig_cache: Option<Arc<crate::sigcache::SigCache>>,
    /// `random_reauth_delay`: the longest random wait before re-authenticating when a publish
    /// shows that the master's publish key changed (0 = at once).
    pub reauth_delay: Duration,
}

impl LinkConfig {
    pub fn new(req_addr: SocketAddr) -> Self {
        LinkConfig {
            req_addr,
            publish_port: None,
            auth_timeout: Duration::from_secs(5),
            auth_tries: 7,
            acceptance_wait_time: Duration::from_secs(10),
            acceptance_wait_time_max: Duration::ZERO,
            alive_interval: Duration::ZERO,
            recon: ReconnectPolicy::default(),
            transport: Transport::default(),
            tls: None,
            keep_req_open: true,
            request_timeout: Duration::from_secs(60),
            return_tries: 3,
            pillar: true,
            source: None,
            sig_cache: None,
            reauth_delay: Duration::ZERO,
        }
    }
}

/// Salt's documented `random_reauth_delay`: a wait drawn uniformly from `[0, max]` (ms
/// resolution) so that minions do not all re-authenticate at once after a key change.
pub fn reauth_wait(max: Duration) -> Duration {
    let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(rand::random_range(0..=ms))
}

/// Why [`Link::establish`] gave up (single-try mode only; otherwise it retries forever).
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{0}")]
    Channel(#[from] ChannelError),
    #[error("our key is pending on the master")]
    Pending,
    #[error("the master rejected our key")]
    Rejected,
    #[error("the master is full (max_minions)")]
    Full,
}

/// How [`Link::serve`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum ServeEnd {
    /// The stop signal fired.
    Stopped,
    /// The master failed the liveness checks (only when asked to leave dead masters).
    Dead(&'static str),
}

/// The keys of an authenticated link.
pub struct Established {
    session: Crypticle,
    aes: Crypticle,
    master_pub: Arc<PublicKey>,
    publish_addr: SocketAddr,
}

/// One minion towards one master.
pub struct Link {
    cfg: Arc<LinkConfig>,
    chan: ReqChannel,
    ctx: ExecContext,
    jids: Arc<Mutex<JidQueue>>,
    stats: Arc<Stats>,
    /// Whether this link currently counts in `stats.authenticated` / `stats.connected`.
    counted_auth: bool,
    counted_conn: bool,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.set_auth(false);
        self.set_conn(false);
    }
}

impl Link {
    pub fn new(
        cfg: Arc<LinkConfig>,
        ident: Identity,
        ctx: ExecContext,
        jids: Arc<Mutex<JidQueue>>,
        stats: Arc<Stats>,
    ) -> Self {
        let chan = ReqChannel::new(ident, cfg.req_addr, cfg.keep_req_open)
            .with_source(cfg.source)
            .with_transport(cfg.transport)
            .with_tls(cfg.tls.clone());
        Link {
            cfg,
            chan,
            ctx,
            jids,
            stats,
            counted_auth: false,
            counted_conn: false,
        }
    }

    pub fn master(&self) -> SocketAddr {
        self.cfg.req_addr
    }

    fn set_auth(&mut self, on: bool) {
        if on != self.counted_auth {
            self.counted_auth = on;
            let d = if on { 1 } else { -1 };
            self.stats.authenticated.fetch_add(d, Ordering::Relaxed);
        }
    }

    fn set_conn(&mut self, on: bool) {
        if on != self.counted_conn {
            self.counted_conn = on;
            let d = if on { 1 } else { -1 };
            self.stats.connected.fetch_add(d, Ordering::Relaxed);
        }
    }

    /// One authentication round: up to `auth_tries` tries of `auth_timeout` each (one in
    /// single-try mode), then pillar.
    async fn auth_round(&mut self, single: bool) -> Result<Established, LinkError> {
        let tries = if single {
            1
        } else {
            self.cfg.auth_tries.max(1)
        };
        let mut n = 0;
        let outcome = loop {
            n += 1;
            match self.chan.authenticate(self.cfg.auth_timeout).await {
                Ok(o) => break o,
                Err(e) => {
                    if e.is_timeout() {
                        self.stats.auth_timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                    if e.is_unreachable() && n < tries {
                        self.stats.auth_retries.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    return Err(e.into());
                }
            }
        };
        let s = match outcome {
            AuthOutcome::Accepted(s) => s,
            AuthOutcome::Pending => return Err(LinkError::Pending),
            AuthOutcome::Rejected => return Err(LinkError::Rejected),
            AuthOutcome::Full => return Err(LinkError::Full),
        };
        let port = self.cfg.publish_port.or(s.publish_port).unwrap_or(4505);
        let mut est = Established {
            session: Crypticle::new(s.session),
            aes: Crypticle::new(s.aes),
            master_pub: s.master_pub,
            publish_addr: SocketAddr::new(self.cfg.req_addr.ip(), port),
        };
        if self.cfg.pillar {
            let grains = self.ctx.grains();
            self.chan
                .pillar(&mut est.session, grains, self.cfg.request_timeout)
                .await?;
        }
        Ok(est)
    }

    /// Authenticates as Salt's minion does: a pending key is asked again after
    /// `acceptance_wait_time` (doubling up to `acceptance_wait_time_max`), errors after the
    /// same wait. `single`: one try, any failure is returned (failover mode).
    pub async fn establish(&mut self, single: bool) -> Result<Established, LinkError> {
        let mut wait = self.cfg.acceptance_wait_time;
        loop {
            let master = self.cfg.req_addr;
            let id = self.chan.id().to_owned();
            match self.auth_round(single).await {
                Ok(est) => {
                    tracing::info!(%master, %id, "authenticated");
                    self.set_auth(true);
                    return Ok(est);
                }
                Err(e) => {
                    match &e {
                        LinkError::Pending => {
                            self.stats.auth_pending.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(%master, %id, wait = ?wait,
                                "key pending on the master; waiting acceptance_wait_time")
                        }
                        LinkError::Rejected => {
                            self.stats.error();
                            tracing::error!(%master, %id,
                                "the master rejected this minion's key: delete it on the master \
                                 (salt-key -d) to let it be accepted again; retrying")
                        }
                        LinkError::Channel(ChannelError::Auth(AuthError::MasterKey(k))) => {
                            self.stats.error();
                            tracing::error!(%master, %id, error = %k,
                                "master refused: its public key did not authenticate")
                        }
                        other => {
                            self.stats.error();
                            tracing::warn!(%master, %id, error = %other, "authentication failed")
                        }
                    }
                    if single {
                        return Err(e);
                    }
                }
            }
            tokio::time::sleep(wait).await;
            if !self.cfg.acceptance_wait_time_max.is_zero() {
                wait = (wait * 2).min(self.cfg.acceptance_wait_time_max);
            }
        }
    }

    /// Serves publishes until `stop` fires, or (with `leave_when_dead`) the master dies.
    pub async fn serve(
        &mut self,
        mut est: Established,
        stop: &mut watch::Receiver<bool>,
        leave_when_dead: bool,
    ) -> ServeEnd {
        let alive = self.cfg.alive_interval;
        let mut opts = PublishClientOptions {
            reconnect: self.cfg.recon,
            queue: 64,
            source: self.cfg.source,
            // Our id on the SUB's READY (libzmq sends none there): saltgate's fan-out knows us
            // by it to replay what we missed, even behind a shared address.
            identity: bytes::Bytes::copy_from_slice(self.ctx.id.as_bytes()),
            tls: self.cfg.tls.clone(),
            ..PublishClientOptions::default()
        };
        // tcp: Salt's `send_id` on each connect, or the master sends us no targeted publish.
        let says_hello = self.cfg.transport == Transport::Tcp;
        if says_hello {
            opts.hello = Some(self.chan.publish_hello(&est.aes).into());
        }
        if !alive.is_zero() {
            opts.heartbeat = Some(Heartbeat {
                interval: (alive / 2).max(Duration::from_millis(50)),
                timeout: alive,
                ttl: Duration::ZERO,
            });
            opts.connect_timeout = alive.max(Duration::from_secs(1));
        }
        let mut sub = match self.cfg.transport.publish_client(est.publish_addr, &opts) {
            Ok(sub) => sub,
            Err(e) => {
                tracing::error!(error = %e, "no publish channel");
                return ServeEnd::Dead("transport not supported");
            }
        };
        let _start_event = self.fire_start_event(&est);
        let check_every = if alive.is_zero() {
            Duration::from_secs(1)
        } else {
            (alive / 2).max(Duration::from_millis(50))
        };
        let mut tick = tokio::time::interval(check_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut jobs: JoinSet<(Job, Outcome)> = JoinSet::new();
        let mut running: Vec<Job> = Vec::new();
        let mut down_checks = 0u32;
        let mut last_ping = tokio::time::Instant::now();
        // Connections whose hello holds the current key (tcp).
        let mut hello_for = 1u64;
        loop {
            tokio::select! {
                msg = sub.recv() => {
                    let Some(payload) = msg else { return ServeEnd::Dead("subscriber ended") };
                    self.stats.publishes_received.fetch_add(1, Ordering::Relaxed);
                    // Boxed: the rare re-authentication inside must not size the idle future.
                    if let Some(job) = Box::pin(self.on_publish(&mut est, &payload)).await {
                        self.count_receipt(&job.jid);
                        self.start_job(job, &mut jobs, &mut running);
                    }
                }
                Some(done) = jobs.join_next(), if !jobs.is_empty() => {
                    let Ok((job, outcome)) = done else {
                        self.stats.error();
                        continue;
                    };
                    running.retain(|j| j.jid != job.jid);
                    if Box::pin(self.send_return(&mut est, &job, outcome)).await.is_err() && leave_when_dead {
                        return ServeEnd::Dead("the master did not take a return");
                    }
                }
                _ = tick.tick() => {
                    let up = sub.is_connected();
                    self.set_conn(up);
                    if says_hello && up && sub.connect_count() > hello_for {
                        // A reconnect: the master may have restarted with a new publish key, and
                        // a hello it cannot decrypt leaves us out of its targeted publishes.
                        // Re-authenticate first, as Salt's `send_id(force_auth=True)`.
                        hello_for = sub.connect_count();
                        if Box::pin(self.refresh_keys(&mut est)).await {
                            sub.set_hello(self.chan.publish_hello(&est.aes).into());
                        } else {
                            hello_for -= 1;
                        }
                    }
                    if alive.is_zero() {
                        continue;
                    }
                    down_checks = if up { 0 } else { down_checks + 1 };
                    if down_checks >= 2 && leave_when_dead {
                        return ServeEnd::Dead("publish connection down");
                    }
                    if leave_when_dead && last_ping.elapsed() >= alive {
                        last_ping = tokio::time::Instant::now();
                        if !Box::pin(self.chan.ping(alive.max(Duration::from_millis(500)))).await {
                            return ServeEnd::Dead("no answer to ping on the request port");
                        }
                    }
                }
                _ = stop.changed() => return ServeEnd::Stopped,
            }
        }
    }

    /// One authentication round after a tcp reconnect; true when the keys are fresh.
    async fn refresh_keys(&mut self, est: &mut Established) -> bool {
        match self.chan.authenticate(self.cfg.auth_timeout).await {
            Ok(AuthOutcome::Accepted(s)) => {
                est.session = Crypticle::new(s.session);
                est.aes = Crypticle::new(s.aes);
                est.master_pub = s.master_pub;
                true
            }
            Ok(other) => {
                tracing::warn!(master = %self.cfg.req_addr, outcome = ?other,
                    "re-authentication after a reconnect was not accepted");
                false
            }
            Err(e) => {
                tracing::debug!(master = %self.cfg.req_addr, error = %e,
                    "re-authentication after a reconnect failed; trying again");
                false
            }
        }
    }

    /// Sends Salt's start event to this link's master in the background on a channel of its
    /// own (Salt's `_fire_master_minion_start`: a failure is logged, never retried). The task
    /// ends with the returned handle, i.e. when this serve ends.
    fn fire_start_event(&self, est: &Established) -> AbortOnDropHandle<()> {
        let mut chan = self.chan.sibling();
        let mut session = est.session.clone();
        let load = crate::start_event::load(&self.ctx.id, &crate::start_event::asctime_now());
        let (timeout, stats, master) = (
            self.cfg.request_timeout,
            self.stats.clone(),
            self.cfg.req_addr,
        );
        AbortOnDropHandle::new(tokio::spawn(async move {
            match chan.send_aes(&mut session, load, timeout).await {
                Ok(_) => {
                    stats.start_events.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%master, "start event delivered");
                }
                Err(e) => {
                    tracing::info!(%master, error = %e, "fire_master failed: start event not delivered")
                }
            }
        }))
    }

    /// Verifies, decrypts and filters one publish; returns a job to run.
    async fn on_publish(&mut self, est: &mut Established, payload: &[u8]) -> Option<Job> {
        let env = match PublishEnvelope::decode(payload) {
            Ok(env) => env,
            _ => {
                self.stats.error();
                tracing::debug!("undecodable publish ignored");
                return None;
            }
        };
        if let Some(sig) = &env.sig {
            let algo = env
                .sig_algo
                .as_deref()
                .and_then(|a| SigAlgo::parse(a).ok())
                .unwrap_or(SigAlgo::Pkcs1v15Sha1);
            let ok = match &self.cfg.sig_cache {
                Some(c) => c.verify(&est.master_pub, algo, &env.load, sig),
                None => est.master_pub.verify(algo, &env.load, sig),
            };
            if !ok {
                self.stats.error();
                tracing::warn!(master = %self.cfg.req_addr, "publish signature did not verify; ignored");
                return None;
            }
        }
        let load = match est.aes.loads(&env.load, None) {
            Ok(v) => v,
            Err(CrypticleError::BadMac) => {
                // The master's publish key changed (restart, rotation): re-authenticate and try
                // again, as Salt's minion does, so the job is not lost.
                let wait = reauth_wait(self.cfg.reauth_delay);
                tracing::info!(master = %self.cfg.req_addr, ?wait,
                    "publish key changed; re-authenticating after a random wait (random_reauth_delay)");
                tokio::time::sleep(wait).await;
                self.set_auth(false);
                let new = self.establish(false).await.ok()?;
                *est = Established {
                    publish_addr: est.publish_addr,
                    ..new
                };
                est.aes.loads(&env.load, None).ok()?
            }
            Err(e) => {
                tracing::debug!(error = %e, "publish ignored");
                return None;
            }
        };
        let job = Job::parse(&load)?;
        if !job.targets(&self.ctx.id, || self.ctx.grains()) {
            return None;
        }
        let fresh = self
            .jids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(&job.jid);
        fresh.then_some(job)
    }

    fn start_job(&self, job: Job, jobs: &mut JoinSet<(Job, Outcome)>, running: &mut Vec<Job>) {
        self.stats.jobs_started.fetch_add(1, Ordering::Relaxed);
        match job.fun.as_str() {
            // Answered from the link's own state: the jobs this link is running.
            "saltutil.find_job" | "saltutil.running" => {
                let want = job
                    .arg
                    .first()
                    .and_then(envelope::as_str)
                    .map(str::to_owned);
                let found: Vec<Value> = running
                    .iter()
                    .filter(|r| job.fun == "saltutil.running" || want.as_deref() == Some(&r.jid))
                    .map(|r| {
                        envelope::map(vec![
                            ("jid", text(&r.jid)),
                            ("fun", text(&r.fun)),
                            ("arg", Value::Array(r.arg.clone())),
                            ("tgt", r.tgt.clone()),
                            ("tgt_type", text(&r.tgt_type)),
                            ("pid", Value::from(std::process::id())),
                        ])
                    })
                    .collect();
                let ret = if job.fun == "saltutil.running" {
                    Value::Array(found)
                } else {
                    found.into_iter().next().unwrap_or(Value::Map(Vec::new()))
                };
                let outcome = Outcome {
                    ret,
                    retcode: 0,
                    success: true,
                    out: None,
                };
                jobs.spawn(async move { (job, outcome) });
            }
            _ => {
                running.push(job.clone());
                let ctx = self.ctx.clone();
                jobs.spawn(async move {
                    let outcome = exec::execute(&job, &ctx).await;
                    (job, outcome)
                });
            }
        }
    }

    /// Counts how long after its publish a job arrived (a JID in the future, or none, is not
    /// counted: another machine's clock).
    fn count_receipt(&self, jid: &str) {
        if let Some(at) = saltgate_wire::jid::jid_time(jid) {
            if let Ok(d) = std::time::SystemTime::now().duration_since(at) {
                self.stats.receipt.record(d);
            }
        }
    }

    /// Sends a `_return` to this link's master (Salt's `_return_pub`), re-authenticating once on
    /// a stale session.
    async fn send_return(
        &mut self,
        est: &mut Established,
        job: &Job,
        o: Outcome,
    ) -> Result<(), ChannelError> {
        let mut load = vec![
            ("cmd", text("_return")),
            ("id", text(&self.ctx.id)),
            ("success", Value::Boolean(o.success)),
            ("return", o.ret),
            ("retcode", Value::from(o.retcode)),
            ("jid", text(&job.jid)),
            ("fun", text(&job.fun)),
            ("fun_args", Value::Array(job.arg.clone())),
        ];
        if let Some(u) = &job.user {
            load.push(("user", u.clone()));
        }
        if let Some(m) = &job.master_id {
            load.push(("master_id", m.clone()));
        }
        if let Some(m) = &job.metadata {
            load.push(("metadata", m.clone()));
        }
        if let Some(out) = o.out {
            load.push(("out", text(out)));
        }
        let load = envelope::map(load);
        let mut last = None;
        for n in 0..self.cfg.return_tries.max(1) {
            if n > 0 {
                self.stats.return_retries.fetch_add(1, Ordering::Relaxed);
            }
            match self
                .chan
                .send_aes(&mut est.session, load.clone(), self.cfg.request_timeout)
                .await
            {
                Ok(_) => {
                    self.stats.jobs_answered.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(ChannelError::BadLoad) => {
                    self.set_auth(false);
                    match self.establish(true).await {
                        Ok(new) => {
                            est.session = new.session;
                            est.aes = new.aes;
                            est.master_pub = new.master_pub;
                        }
                        Err(e) => tracing::warn!(error = %e, "re-authentication failed"),
                    }
                    last = Some(ChannelError::BadLoad);
                }
                Err(e) => {
                    let unreachable = e.is_unreachable();
                    last = Some(e);
                    if !unreachable {
                        break;
                    }
                }
            }
        }
        self.stats.error();
        self.stats.returns_failed.fetch_add(1, Ordering::Relaxed);
        let e = last.unwrap_or(ChannelError::BadLoad);
        tracing::warn!(master = %self.cfg.req_addr, jid = %job.jid, error = %e,
            "the minion failed to return the job information");
        Err(e)
    }
}
