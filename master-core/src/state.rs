//! The master's composition root: [`Master`] owns one part per concern and wires them at
//! start. Each handler takes only the parts it uses:
//! * keys and authentication: [`KeyRing`] ([`crate::keyring`]);
//! * jobs and returns: [`JobBook`] ([`crate::jobbook`]);
//! * publishing: [`Publish`] ([`crate::publish`]);
//! * the cluster: [`ClusterState`] ([`crate::cluster`]) and its peer port ([`PeerPort`]), whose
//!   accepted publishes and returns reach the two parts above through [`PeerSink`], implemented
//!   here;
//! * the refusal counters ([`Refusals`]) and the configuration.
//!
//! Sockets live in [`crate::server`].

use std::sync::Arc;
use std::time::Duration;

use saltgate_config::salt_master::SaltMasterConfig;
use saltgate_wire::crypticle::CrypticleKey;
use saltgate_wire::envelope::Value;
use saltgate_wire::transport::AnyPublishServer;

use crate::cluster::{ClusterState, PeerSink};
use crate::jobbook::{JobBook, ReturnEvent};
use crate::keyring::KeyRing;
use crate::keys::MasterKey;
use crate::metrics::Refusals;
use crate::peerserve::PeerPort;
use crate::publish::Publish;
use crate::rotate::PublishKey;
use crate::signing::PubSig;

/// The master: its parts, each shared (`Arc`) with the handlers and tasks that use it.
pub struct Master {
    pub config: SaltMasterConfig,
    /// Keys and authentication.
    pub ring: Arc<KeyRing>,
    /// Jobs and returns.
    pub jobs: Arc<JobBook>,
    /// Publishing.
    pub publish: Arc<Publish>,
    /// Cluster membership (`cluster_id` set): the ring's key pair and publish key are the
    /// cluster's.
    pub cluster: Option<Arc<ClusterState>>,
    /// The cluster's peer port (with `cluster`).
    pub peers: Option<Arc<PeerPort>>,
    /// Refusals by reason (the metrics endpoint's `saltgate_master_refusals_total`).
    pub refusals: Arc<Refusals>,
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master")
            .field("id", &self.config.id)
            .finish()
    }
}

/// What a [`Master`] is made from; [`MasterBuilder::build`] wires the parts.
pub struct MasterBuilder {
    config: SaltMasterConfig,
    master_key: MasterKey,
    publish_port: u16,
    publisher: Option<AnyPublishServer>,
    pub_sig: Option<PubSig>,
    cluster: Option<(CrypticleKey, ClusterState)>,
}

impl MasterBuilder {
    /// Signs the master public key in `_auth` replies (MultiMaster-PKI).
    pub fn with_pub_sig(mut self, pub_sig: Option<PubSig>) -> Self {
        self.pub_sig = pub_sig;
        self
    }

    /// Makes this master a cluster member: the cluster key and publish key replace its own
    /// towards minions (Salt 3008 does the same).
    pub fn with_cluster(
        mut self,
        cluster_key: MasterKey,
        cluster_aes: CrypticleKey,
        cluster: ClusterState,
    ) -> Self {
        self.master_key = cluster_key;
        self.cluster = Some((cluster_aes, cluster));
        self
    }

    pub fn build(self) -> Master {
        let config = self.config;
        let keys_root = config
            .cluster
            .as_ref()
            .map(|c| c.pki_dir.clone())
            .unwrap_or_else(|| config.pki_dir.clone());
        let (aes, cluster) = match self.cluster {
            Some((aes, cl)) => (aes, Some(Arc::new(cl))),
            None => (CrypticleKey::generate(), None),
        };
        let ring = Arc::new(KeyRing::new(
            keys_root,
            &config.cachedir,
            Duration::from_secs(config.request_window_secs),
            self.master_key,
            Arc::new(PublishKey::new(aes)),
            self.publish_port,
            self.pub_sig,
        ));
        let jobs = Arc::new(JobBook::new(
            &config.cachedir,
            &config.id,
            Duration::from_secs(config.keep_jobs_secs),
        ));
        let publish = Arc::new(Publish::new(
            ring.clone(),
            jobs.clone(),
            self.publisher.map(Arc::new),
            cluster.clone(),
        ));
        let refusals = Arc::new(Refusals::new());
        let peers = cluster.as_ref().map(|cl| {
            Arc::new(PeerPort {
                cluster: cl.clone(),
                sink: Arc::new(Inbox {
                    publish: publish.clone(),
                    jobs: jobs.clone(),
                }),
                refusals: refusals.clone(),
                max_unauthenticated: config.limits.cluster_max_unauthenticated,
                auth_timeout: Duration::from_secs(config.limits.cluster_auth_timeout_secs),
            })
        });
        Master {
            config,
            ring,
            jobs,
            publish,
            cluster,
            peers,
            refusals,
        }
    }
}

impl Master {
    /// The parts of a master with `master_key`, telling minions `publish_port`; publishing on
    /// `publisher` (none: jobs are recorded, not sent).
    pub fn builder(
        config: SaltMasterConfig,
        master_key: MasterKey,
        publish_port: u16,
        publisher: Option<AnyPublishServer>,
    ) -> MasterBuilder {
        MasterBuilder {
            config,
            master_key,
            publish_port,
            publisher,
            pub_sig: None,
            cluster: None,
        }
    }

    /// A master outside any cluster, without `pub_sig`.
    pub fn new(
        config: SaltMasterConfig,
        master_key: MasterKey,
        publish_port: u16,
        publisher: Option<AnyPublishServer>,
    ) -> Self {
        Self::builder(config, master_key, publish_port, publisher).build()
    }
}

/// Where the peer port hands what a peer sent: publishing and the job book.
struct Inbox {
    publish: Arc<Publish>,
    jobs: Arc<JobBook>,
}

impl PeerSink for Inbox {
    fn publish_from_peer(&self, jid: &str, origin: &str, job: &Value) -> bool {
        self.publish.publish_from_peer(jid, origin, job)
    }

    fn return_from_peer(
        &self,
        jid: &str,
        minion: &str,
        ret: serde_json::Value,
    ) -> Result<(), String> {
        self.jobs
            .cache_return(jid, minion, &ret)
            .map_err(|e| format!("return for unknown job {jid}: {e}"))?;
        self.jobs.notify_return(
            jid,
            ReturnEvent {
                minion: minion.to_string(),
                ret,
            },
        );
        Ok(())
    }
}
