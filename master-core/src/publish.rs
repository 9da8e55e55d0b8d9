//! Publishing: a job sealed with the publish key, signed with the master key, queued on the
//! publish port in serial order, recorded in the job book and forwarded to the cluster's peers;
//! and a peer's publish sent to our own minions.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use saltgate_wire::crypticle::Crypticle;
use saltgate_wire::envelope::{self, text, Value};
use saltgate_wire::rsa::SigAlgo;
use saltgate_wire::transport::{AnyPublishServer, PublishServer, Targets};
use serde_json::{json, Value as Json};

use crate::cluster::ClusterState;
use crate::convert;
use crate::jobbook::JobBook;
use crate::keyring::KeyRing;
use crate::target::{Target, TargetType};
use crate::util::{lock, unix_now};

/// A publish request (from the CLI socket or a cluster peer).
#[derive(Debug, Clone)]
pub struct PublishRequest {
    pub tgt: String,
    pub tgt_type: TargetType,
    pub fun: String,
    pub arg: Vec<Json>,
    pub user: String,
}

/// The job load as published (Salt's field names).
pub fn job_load(jid: &str, req: &PublishRequest) -> Value {
    envelope::map(vec![
        ("fun", text(&req.fun)),
        (
            "arg",
            Value::Array(req.arg.iter().map(convert::from_json).collect()),
        ),
        ("tgt", text(&req.tgt)),
        ("jid", text(jid)),
        ("ret", text("")),
        ("tgt_type", text(req.tgt_type.as_str())),
        ("user", text(&req.user)),
    ])
}

/// Publishing (see the module's doc).
pub struct Publish {
    /// The key pair and publish key, and the accepted minions a target matches.
    ring: Arc<KeyRing>,
    /// Where jobs are recorded.
    jobs: Arc<JobBook>,
    publisher: Option<Arc<AnyPublishServer>>,
    /// Set in a cluster: publishes are forwarded to the peers, and carry no serial.
    cluster: Option<Arc<ClusterState>>,
    serial: AtomicI64,
    /// Held from a publish's serial to its place in the publisher's queues, so serials reach
    /// every minion in increasing order (a minion drops a serial lower than the last it saw as
    /// a replay: two concurrent publishes cost one of them every return without this).
    publish_order: Mutex<()>,
}

impl std::fmt::Debug for Publish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publish")
            .field("id", &self.jobs.id())
            .field("clustered", &self.cluster.is_some())
            .finish()
    }
}

impl Publish {
    pub fn new(
        ring: Arc<KeyRing>,
        jobs: Arc<JobBook>,
        publisher: Option<Arc<AnyPublishServer>>,
        cluster: Option<Arc<ClusterState>>,
    ) -> Self {
        Publish {
            ring,
            jobs,
            publisher,
            cluster,
            // Start from the clock so a restart with the same key never reuses a serial.
            serial: AtomicI64::new(i64::try_from(unix_now()).unwrap_or(0) * 1000),
            publish_order: Mutex::new(()),
        }
    }

    /// The publish port's socket, if bound.
    pub fn publisher(&self) -> Option<&Arc<AnyPublishServer>> {
        self.publisher.as_ref()
    }

    /// Seals `job` and queues it on the publish port for the accepted minions it `targets`;
    /// `None` without a publisher. Serial order and queue order are the same (see
    /// `publish_order`).
    ///
    /// The targets are Salt's `topic_lst` (`PubServerChannel.wrap_payload`): with glob, pcre
    /// and list targets (all saltgate-master takes) the accepted minions that match. `tcp`
    /// sends the publish only to their connections, and an empty list to every connection, as
    /// Salt does; ZeroMQ sends to every subscriber either way.
    fn seal_and_publish(
        &self,
        job: &Value,
        targets: &[String],
    ) -> Result<Option<saltgate_wire::transport::PublishReport>, saltgate_wire::rsa::RsaError> {
        let _order = lock(&self.publish_order);
        let frame = self.seal_publish(job)?;
        let ids: Vec<&str> = targets.iter().map(String::as_str).collect();
        Ok(self
            .publisher
            .as_ref()
            .map(|p| p.publish(bytes::Bytes::from(frame), Targets::Minions(&ids))))
    }

    /// The accepted minions a job load's `tgt` and `tgt_type` match (none when they do not
    /// parse: then every subscriber gets it, as with Salt's empty `topic_lst`).
    fn targets_of(&self, job: &Value) -> Vec<String> {
        let tgt = envelope::get(job, "tgt").and_then(envelope::as_str);
        let kind = envelope::get(job, "tgt_type")
            .and_then(envelope::as_str)
            .and_then(TargetType::parse);
        match (tgt, kind) {
            (Some(tgt), Some(kind)) => Target::new(kind, tgt)
                .map(|t| self.ring.expected_minions(&t))
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Encrypts and signs a job for the publish port (`{"enc":"aes","load","sig_algo","sig"}`);
    /// `serial` is added for the minion's replay guard, as a non-cluster Salt master does.
    /// Publish through [`Publish::seal_and_publish`], which keeps serials in order.
    fn seal_publish(&self, job: &Value) -> Result<Vec<u8>, saltgate_wire::rsa::RsaError> {
        let mut job = job.clone();
        // No serial in a cluster: members cannot share a counter (Salt omits it too).
        if let (Value::Map(m), None) = (&mut job, &self.cluster) {
            let serial = self.serial.fetch_add(1, Ordering::Relaxed) + 1;
            m.push((text("serial"), Value::from(serial)));
        }
        let load = Crypticle::new(self.ring.aes.current()).dumps(&envelope::salt_compat(job), None);
        let sig = self
            .ring
            .master_key
            .private
            .sign(SigAlgo::Pkcs1v15Sha1, &load)?;
        Ok(envelope::PublishEnvelope {
            enc: "aes".into(),
            load,
            sig: Some(sig),
            sig_algo: Some("PKCS1v15-SHA1".into()),
        }
        .encode())
    }

    /// Saves job `jid` (from [`JobBook::jids`]), publishes it, and returns the expected
    /// minions. Register with [`JobBook::wait_returns`] first so no return is missed.
    pub fn publish(
        &self,
        jid: &str,
        req: &PublishRequest,
        target: &Target,
    ) -> Result<Vec<String>, String> {
        let expected = self.ring.expected_minions(target);
        let job = job_load(jid, req);
        let id = self.jobs.id();
        let mut record = convert::to_json(&job);
        record["minions"] = json!(expected);
        record["master_id"] = json!(id);
        if let Err(e) = self.jobs.cache.save_load(jid, &record) {
            tracing::error!(%jid, error = %e, "job load not saved; returns will not be cached");
        }
        self.jobs.mark_published(jid, id);
        let report = self
            .seal_and_publish(&job, &expected)
            .map_err(|e| format!("cannot sign the publish: {e}"))?;
        if let Some(r) = report {
            tracing::info!(%jid, fun = %req.fun, tgt = %req.tgt, expected = expected.len(),
                queued = r.queued, dropped = r.dropped, "published");
        }
        if let Some(cl) = &self.cluster {
            crate::cluster::forward(
                cl,
                envelope::map(vec![
                    ("kind", text("publish")),
                    ("jid", text(jid)),
                    ("origin", text(id)),
                    ("job", job),
                ]),
                None,
            );
        }
        Ok(expected)
    }

    /// A job a cluster peer published: recorded (unless the shared cache has it) and sent to
    /// our own minions. False, and nothing done, when this master already published `jid` (its
    /// own job, a replayed or re-sent peer publish): see [`JobBook::mark_published`].
    pub fn publish_from_peer(&self, jid: &str, origin: &str, job: &Value) -> bool {
        if !self.jobs.mark_published(jid, origin) {
            return false;
        }
        if !self.jobs.cache.exists(jid) {
            let mut record = convert::to_json(job);
            record["master_id"] = json!(origin);
            if let Err(e) = self.jobs.cache.save_load(jid, &record) {
                tracing::warn!(%jid, error = %e, "peer job not recorded; its returns will be dropped");
            }
        }
        match self.seal_and_publish(job, &self.targets_of(job)) {
            Ok(Some(r)) => {
                tracing::info!(%jid, %origin, queued = r.queued, "published for a cluster peer");
            }
            Ok(None) => {}
            Err(e) => tracing::error!(%jid, error = %e, "cannot sign a peer publish"),
        }
        true
    }
}
