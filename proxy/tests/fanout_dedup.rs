//! `listeners.publish.dedup_cluster_pki_dir`: the fan-out forwards the first copy of each job.
//! Three fake cluster masters (wire `Publisher`s on 127.25.0.1-3) publish Crypticle-encrypted
//! jobs as a Salt 3008 cluster master wraps them (`{"enc": "aes", "load": dumps(job)}`, a fresh
//! IV per copy) with the key of a `.aes` file in a temporary cluster_pki_dir; a minion (wire
//! `Subscriber`) counts what reaches it. Addresses: 127.25.0.0/24.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use common::api::{run, wait_for_metric};
use common::{config_on, masters_at, T};
use saltgate_config::{HealthSettings, ListenerMode, Role};
use saltgate_wire::crypticle::{Crypticle, CrypticleKey};
use saltgate_wire::envelope::{map, text, PublishEnvelope};
use saltgate_wire::publish_job::publish_jid;
use saltgate_wire::zmtp::{PubOptions, Publisher, SubOptions, Subscriber};

const IP: &str = "127.25.0.10";

fn write_key(dir: &Path, k: &CrypticleKey) {
    // As Salt's Crypticle.write_key: a temporary file renamed over .aes.
    let tmp = dir.join("aes.tmp");
    std::fs::write(&tmp, k.to_key_string()).unwrap();
    std::fs::rename(&tmp, dir.join(".aes")).unwrap();
}

/// A master's copy of job `jid` (fresh IV), after `topic` when `zmq_filtering` is on.
fn job(k: &CrypticleKey, jid: &str, topic: Option<&str>) -> Vec<Bytes> {
    let load = Crypticle::new(k.clone()).dumps(
        &map(vec![("fun", text("test.ping")), ("jid", text(jid))]),
        None,
    );
    let payload = PublishEnvelope {
        enc: "aes".into(),
        load,
        sig: None,
        sig_algo: None,
    }
    .encode();
    let mut frames: Vec<Bytes> = topic
        .map(|t| Bytes::from(t.to_owned()))
        .into_iter()
        .collect();
    frames.push(Bytes::from(payload));
    frames
}

struct Minion {
    sub: Subscriber,
    keys: Vec<Crypticle>,
    /// (topic, jid) → copies received.
    got: HashMap<(String, String), usize>,
}

impl Minion {
    /// Reads until `until` was received, counting every message.
    async fn read_until(&mut self, until: &str) {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let m = tokio::time::timeout_at(deadline, self.sub.recv())
                .await
                .unwrap_or_else(|_| panic!("{until} never arrived; got {:?}", self.got))
                .expect("minion socket alive");
            let (payload, topic) = m.split_last().unwrap();
            let keys: Vec<&Crypticle> = self.keys.iter().collect();
            let jid = publish_jid(payload, &keys).expect("a job the test published");
            let jid = String::from_utf8(jid).unwrap();
            let topic = topic
                .first()
                .map(|t| String::from_utf8_lossy(t).into_owned())
                .unwrap_or_default();
            *self.got.entry((topic, jid.clone())).or_default() += 1;
            if jid == until {
                return;
            }
        }
    }

    fn copies(&self, topic: &str, jid: &str) -> usize {
        *self
            .got
            .get(&(topic.to_owned(), jid.to_owned()))
            .unwrap_or(&0)
    }

    /// Each master publishes its own end marker; once all arrived, every earlier message of
    /// every master went through the hub (each upstream is ordered).
    async fn sync(&mut self, masters: &[Publisher], k: &CrypticleKey, tag: &str) {
        for (i, m) in masters.iter().enumerate() {
            m.publish(job(k, &format!("{tag}-end-{i}"), None));
        }
        for i in 0..masters.len() {
            let end = format!("{tag}-end-{i}");
            if self.copies("", &end) == 0 {
                self.read_until(&end).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_copy_of_each_job_reaches_the_minion_once_through_rotation_and_bad_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (k1, k2, stranger) = (
        CrypticleKey::generate(),
        CrypticleKey::generate(),
        CrypticleKey::generate(),
    );
    write_key(dir.path(), &k1);
    let mut masters = Vec::new();
    for i in 1..=3 {
        let addr: SocketAddr = format!("127.25.0.{i}:0").parse().unwrap();
        masters.push(Publisher::bind(addr, PubOptions::default()).await.unwrap());
    }
    let addrs: Vec<SocketAddr> = masters.iter().map(Publisher::local_addr).collect();
    let configs = masters_at(&addrs);
    let mut cfg = config_on(IP, configs, HealthSettings::default());
    cfg.publish.mode = ListenerMode::Fanout;
    cfg.publish.dedup_cluster_pki_dir = Some(dir.path().to_path_buf());
    let (r, _stop, _prober) = run(cfg).await;
    let admin = r.admin_addr().unwrap();
    let sub = Subscriber::connect(r.local_addrs(Role::Publish)[0], SubOptions::default());
    sub.subscribe(Bytes::new());
    let mut minion = Minion {
        sub,
        keys: [&k1, &k2, &stranger]
            .map(|k| Crypticle::new(k.clone()))
            .into(),
        got: HashMap::new(),
    };
    wait_for_metric(admin, "saltgate_fanout_upstreams_connected", &[], 3.0).await;
    wait_for_metric(admin, "saltgate_fanout_dedup_key_loads_total", &[], 1.0).await;
    // Subscriptions propagate (minion → hub, hub → masters): each master's own warm-up jobs
    // until the minion heard from all three.
    for n in 0.. {
        for (i, m) in masters.iter().enumerate() {
            m.publish(job(&k1, &format!("warm-{i}-{n}"), None));
        }
        let heard = |i| {
            minion
                .got
                .keys()
                .any(|(_, j)| j.starts_with(&format!("warm-{i}-")))
        };
        if (0..3).all(heard) {
            break;
        }
        let probe = format!("warm-0-{n}");
        let _ = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            minion.read_until(&probe),
        )
        .await;
        assert!(n < 400, "warm-up: {:?}", minion.got);
    }

    // One job from every master (three encryptions): one copy delivered, two dropped.
    for m in &masters {
        m.publish(job(&k1, "20261123020000000001", None));
    }
    // zmq_filtering: one jid, one message per target topic, from every master.
    for m in &masters {
        for t in ["aaaa", "bbbb"] {
            m.publish(job(&k1, "20261123020000000002", Some(t)));
        }
    }
    minion.sync(&masters, &k1, "a").await;
    assert_eq!(
        minion.copies("", "20261123020000000001"),
        1,
        "{:?}",
        minion.got
    );
    assert_eq!(minion.copies("aaaa", "20261123020000000002"), 1);
    assert_eq!(minion.copies("bbbb", "20261123020000000002"), 1);
    wait_for_metric(admin, "saltgate_fanout_duplicates_total", &[], 2.0 + 4.0).await;

    // A job under a key saltgate does not hold: every copy forwarded, counted as unreadable.
    masters[0].publish(job(&stranger, "20261123020000000003", None));
    masters[1].publish(job(&stranger, "20261123020000000003", None));
    minion.sync(&masters, &k1, "b").await;
    assert_eq!(minion.copies("", "20261123020000000003"), 2);
    wait_for_metric(
        admin,
        "saltgate_fanout_dedup_unreadable_total",
        &[("reason", "bad_mac")],
        2.0,
    )
    .await;

    // The cluster key rotates: the new file is read and its jobs are deduplicated again.
    write_key(dir.path(), &k2);
    wait_for_metric(admin, "saltgate_fanout_dedup_key_loads_total", &[], 2.0).await;
    for m in &masters {
        m.publish(job(&k2, "20261123020000000004", None));
    }
    // A slower master's copy still under the previous key.
    masters[2].publish(job(&k1, "20261123020000000004", None));
    minion.sync(&masters, &k2, "c").await;
    assert_eq!(
        minion.copies("", "20261123020000000004"),
        1,
        "{:?}",
        minion.got
    );
    wait_for_metric(admin, "saltgate_fanout_duplicates_total", &[], 6.0 + 3.0).await;
}
