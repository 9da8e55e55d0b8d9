//! Forwarding the first copy of each job (`listeners.publish.dedup_cluster_pki_dir`).
//!
//! In a Salt 3008 cluster every master publishes every job, each copy encrypted with the
//! cluster's key and a fresh IV. With the key ([`super::clusterkey`]) the hub reads each upstream
//! message's `jid` once (`saltgate_wire::publish_job::publish_jid`: one MAC check and one
//! decryption) and identifies the job by the frames before the payload (the `zmq_filtering`
//! topic: a master sends one message per target minion under one jid, and each must pass) plus
//! the jid. The first message with an identity is forwarded, a later one within the memory is
//! dropped. A message whose jid cannot be read is forwarded and counted: dedup fails open.
//!
//! Memory: identities are 128-bit keyed hashes (two SipHash keys drawn per process, so no peer
//! can craft a collision), kept for [`WINDOW`] and at most [`MAX_REMEMBERED`] of them. The
//! masters' copies of a job arrive milliseconds apart (seconds on a loaded cluster); five minutes
//! covers any cluster forwarding delay, and the cap bounds memory at high publish rates (65,536
//! identities, at most ~6 MiB: the hash set plus the arrival-ordered queue). A copy arriving
//! after its identity was forgotten is forwarded, and the minion's own jid check
//! (`minion_jid_queue_hwm`) drops it as it would without saltgate.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use bytes::Bytes;
use saltgate_wire::crypticle::Crypticle;
use saltgate_wire::publish_job::{publish_jid, JobIdError};
use tokio::time::Instant;

use super::clusterkey::ClusterKey;
pub(crate) use super::clusterkey::WINDOW;
use crate::ops::ratelimit::LogLimit;
/// Identities remembered at most (the oldest is forgotten first).
pub(crate) const MAX_REMEMBERED: usize = 65_536;

/// What the dedup says about one upstream message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Dedup is not configured.
    Off,
    /// The first copy of this job (for this topic): forward it.
    First,
    /// A later copy: drop it.
    Duplicate,
    /// The jid could not be read: forward it (fail open).
    Unreadable(JobIdError),
}

#[derive(Default)]
struct Seen {
    set: HashSet<u128>,
    order: VecDeque<(Instant, u128)>,
}

pub(crate) struct Dedup {
    pub key: ClusterKey,
    seen: Mutex<Seen>,
    hash: (RandomState, RandomState),
    log: LogLimit,
}

impl Dedup {
    pub fn new() -> Self {
        Dedup {
            key: ClusterKey::new(),
            seen: Mutex::new(Seen::default()),
            hash: (RandomState::new(), RandomState::new()),
            log: LogLimit::default(),
        }
    }

    /// Reads the job identity of `frames` (the payload is the last frame) and remembers it.
    pub fn check(&self, frames: &[Bytes]) -> Verdict {
        let keys = self.key.keys();
        if keys.dir.is_none() {
            return Verdict::Off;
        }
        let now = Instant::now();
        let (usable, n) = keys.usable(now);
        let list: [&Crypticle; 2] = match usable {
            [Some(a), Some(b)] => [a, b],
            [Some(a), None] => [a, a],
            _ => return self.unreadable(JobIdError::NoKey),
        };
        let Some((payload, topic)) = frames.split_last() else {
            return self.unreadable(JobIdError::NotAes);
        };
        let jid = match publish_jid(payload, &list[..n]) {
            Ok(j) => j,
            Err(e) => {
                if e == JobIdError::BadMac {
                    self.key.request_refresh();
                }
                return self.unreadable(e);
            }
        };
        let id = (u128::from(self.hash.0.hash_one((topic, &jid))) << 64)
            | u128::from(self.hash.1.hash_one((topic, &jid)));
        if self.remember(id, now) {
            Verdict::First
        } else {
            Verdict::Duplicate
        }
    }

    /// Whether `id` is new; forgets identities older than [`WINDOW`] or beyond the cap.
    fn remember(&self, id: u128, now: Instant) -> bool {
        let mut s = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(&(t, old)) = s.order.front() {
            if now.duration_since(t) < WINDOW && s.order.len() < MAX_REMEMBERED {
                break;
            }
            s.order.pop_front();
            s.set.remove(&old);
        }
        if !s.set.insert(id) {
            return false;
        }
        s.order.push_back((now, id));
        true
    }

    fn unreadable(&self, e: JobIdError) -> Verdict {
        if let Some(left_out) = self.log.allow() {
            tracing::warn!(target: "saltgate_proxy::pubhub::dedup", reason = e.label(), error = %e, left_out, "fanout dedup: a publish's jid could not be read; forwarded as is");
        }
        Verdict::Unreadable(e)
    }

    /// Job identities remembered now (the admin view; tests).
    pub fn remembered(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set
            .len()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use saltgate_wire::crypticle::CrypticleKey;
    use saltgate_wire::envelope::{map, text, PublishEnvelope};
    use std::time::Duration;

    /// A cluster master's publish of `jid`: the payload frame, a fresh IV each call.
    pub(crate) fn publish(key: &CrypticleKey, jid: &str) -> Bytes {
        let c = Crypticle::new(key.clone());
        let job = map(vec![("fun", text("test.ping")), ("jid", text(jid))]);
        Bytes::from(
            PublishEnvelope {
                enc: "aes".into(),
                load: c.dumps(&job, None),
                sig: None,
                sig_algo: None,
            }
            .encode(),
        )
    }

    async fn with_key(k: &CrypticleKey) -> (Dedup, tempfile::TempDir) {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(".aes"), k.to_key_string()).unwrap();
        let dd = Dedup::new();
        assert!(dd.key.sync(Some(d.path()), false, None).await);
        (dd, d)
    }

    #[tokio::test]
    async fn off_until_configured() {
        let dd = Dedup::new();
        let k = CrypticleKey::generate();
        assert_eq!(dd.check(&[publish(&k, "j")]), Verdict::Off);
    }

    #[tokio::test(start_paused = true)]
    async fn identities_are_forgotten_after_the_window() {
        let k = CrypticleKey::generate();
        let (dd, _d) = with_key(&k).await;
        assert_eq!(dd.check(&[publish(&k, "j1")]), Verdict::First);
        tokio::time::advance(WINDOW - Duration::from_secs(1)).await;
        assert_eq!(dd.check(&[publish(&k, "j1")]), Verdict::Duplicate);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(dd.check(&[publish(&k, "j2")]), Verdict::First);
        assert_eq!(dd.remembered(), 1, "j1 forgotten");
        assert_eq!(dd.check(&[publish(&k, "j1")]), Verdict::First);
    }

    #[tokio::test]
    async fn memory_is_capped() {
        let k = CrypticleKey::generate();
        let (dd, _d) = with_key(&k).await;
        let now = Instant::now();
        for i in 0..(MAX_REMEMBERED as u128 + 10) {
            assert!(dd.remember(i, now));
        }
        assert_eq!(dd.remembered(), MAX_REMEMBERED);
        assert!(dd.remember(0, now), "the oldest was forgotten");
        assert!(!dd.remember(MAX_REMEMBERED as u128 + 9, now));
    }

    #[tokio::test]
    async fn an_empty_message_is_unreadable_not_a_panic() {
        let k = CrypticleKey::generate();
        let (dd, _d) = with_key(&k).await;
        assert_eq!(dd.check(&[]), Verdict::Unreadable(JobIdError::NotAes));
    }
}
