//! Which master a new session goes to: strategies over the snapshot's masters that return the
//! candidates in order of preference. The session takes the first that connects.
//!
//! Eligibility is shared by every strategy: a master must be available (UP, not disabled), have
//! room under its `maxconn` and a weight above 0; backup masters are used only when no other master
//! is eligible.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use saltgate_config::{Balance, Rebalance, Role};

use crate::select::master::Master;

/// Picks candidates for a new session, best first.
pub trait Selector: Send + Sync + std::fmt::Debug {
    /// Fills `out` with indexes into `masters`, best first. Empty: no master can take the session.
    fn order(&self, masters: &[Arc<Master>], role: Role, client: IpAddr, out: &mut Vec<usize>);
}

/// The rebalancing predicate (lives with selection: it decides how a new session is placed).
/// Whether spreading publish sessions can do anything with this listener configuration: `source`
/// balancing would place a moved minion on the same master again, so it is not rebalanced; `first`
/// is not spread but failed back ([`crate::select::rebalance::Mode::Failback`]).
pub fn applies(r: &Rebalance, balance: Balance) -> bool {
    r.enabled && !matches!(balance, Balance::Source | Balance::First)
}

/// Indexes of the masters that may take a session now; backups only when nothing else is left.
/// Each master's configuration is loaded once per call (an `ArcSwap` load is most of the cost:
/// see `cargo bench -p saltgate-proxy --bench hot_paths`, `selection/*`).
pub fn eligible(masters: &[Arc<Master>], role: Role, out: &mut Vec<usize>) {
    out.clear();
    let ok = |m: &Master, c: &saltgate_config::MasterConfig| {
        c.weight > 0 && c.maxconn.is_none_or(|cap| m.session_count(role) < cap) && m.is_available()
    };
    let mut backups = false;
    for (i, m) in masters.iter().enumerate() {
        let c = m.cfg();
        if c.backup {
            backups = true;
        } else if ok(m, &c) {
            out.push(i);
        }
    }
    if out.is_empty() && backups {
        for (i, m) in masters.iter().enumerate() {
            let c = m.cfg();
            if c.backup && ok(m, &c) {
                out.push(i);
            }
        }
    }
}

/// Smooth weighted round-robin (as nginx): over a run of sessions each eligible master gets its
/// share by weight, interleaved rather than in bursts; masters that are not eligible are skipped
/// without shifting the others' turns.
#[derive(Debug)]
pub struct RoundRobin {
    current: Mutex<Vec<i64>>,
}

impl RoundRobin {
    pub fn new(n: usize) -> Self {
        Self {
            current: Mutex::new(vec![0; n]),
        }
    }
}

impl Selector for RoundRobin {
    fn order(&self, masters: &[Arc<Master>], role: Role, _client: IpAddr, out: &mut Vec<usize>) {
        eligible(masters, role, out);
        if out.len() < 2 {
            return;
        }
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if cur.len() != masters.len() {
            *cur = vec![0; masters.len()];
        }
        // One pass: every eligible master gains its weight; the highest goes first and pays the total.
        let mut total = 0i64;
        let mut best = out[0];
        for &i in out.iter() {
            let w = i64::from(masters[i].cfg().weight);
            total += w;
            cur[i] += w;
            if cur[i] > cur[best] {
                best = i;
            }
        }
        cur[best] -= total;
        drop(cur);
        // The chosen one first, then the others in list order after it (for retries).
        let pos = out.iter().position(|&i| i == best).unwrap_or(0);
        out.rotate_left(pos);
    }
}

/// Fewest live sessions on this port relative to weight; ties go to the earlier master.
#[derive(Debug, Default)]
pub struct LeastConn;

impl Selector for LeastConn {
    fn order(&self, masters: &[Arc<Master>], role: Role, _client: IpAddr, out: &mut Vec<usize>) {
        eligible(masters, role, out);
        out.sort_by_key(|&i| {
            let m = &masters[i];
            (u64::from(m.session_count(role)) << 16) / u64::from(m.cfg().weight.max(1))
        });
    }
}

/// Fewest live sessions relative to weight, ties in (weighted) round-robin turn: the publish
/// selector while rebalancing is on. With equal loads it behaves as round robin.
#[derive(Debug)]
pub struct LeastLoaded {
    pub(crate) rr: RoundRobin,
}

impl Selector for LeastLoaded {
    fn order(&self, masters: &[Arc<Master>], role: Role, client: IpAddr, out: &mut Vec<usize>) {
        self.rr.order(masters, role, client, out);
        // Stable: equal loads keep the round-robin order.
        out.sort_by_cached_key(|&i| {
            let m = &masters[i];
            (u64::from(m.session_count(role)) << 16) / u64::from(m.cfg().weight.max(1))
        });
    }
}

/// Weighted rendezvous hashing of the client address: the same client gets the same master on
/// both listeners (affinity), and when a master leaves only its clients move.
#[derive(Debug, Default)]
pub struct SourceHash;

/// FNV-1a over the client address and the master name, finished with a SplitMix64 mix: a
/// specified function, so every saltgate process, whatever toolchain built it, maps a minion to
/// the same master.
fn stable_hash(client: IpAddr, master: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let (v4, v6);
    let octets: &[u8] = match client {
        IpAddr::V4(a) => {
            v4 = a.octets();
            &v4
        }
        IpAddr::V6(a) => {
            v6 = a.octets();
            &v6
        }
    };
    for b in octets.iter().chain(&[0xffu8]).chain(master.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

pub fn rendezvous_score(client: IpAddr, master: &str, weight: u32) -> f64 {
    // Uniform in (0, 1]; weighted rendezvous: w / -ln(u).
    let u = ((stable_hash(client, master) >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    f64::from(weight) / -u.ln().min(-f64::MIN_POSITIVE)
}

impl Selector for SourceHash {
    fn order(&self, masters: &[Arc<Master>], role: Role, client: IpAddr, out: &mut Vec<usize>) {
        eligible(masters, role, out);
        // One score per candidate (not two per comparison); scores are positive, so their bits
        // sort as the numbers do.
        out.sort_by_cached_key(|&i| {
            let cfg = masters[i].cfg();
            std::cmp::Reverse(rendezvous_score(client, &cfg.name, cfg.weight).to_bits())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::snapshot::for_listener;
    use saltgate_config::{HealthSettings, ListenerConfig, MasterConfig};
    use std::net::SocketAddr;

    fn master(name: &str, weight: u32, backup: bool) -> Arc<Master> {
        let cfg = MasterConfig {
            name: name.into(),
            host: "127.0.0.1".into(),
            publish_port: 1,
            request_port: 2,
            weight,
            maxconn: None,
            backup,
            disabled: false,
            check: true,
            health: HealthSettings::default(),
        };
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let m = Arc::new(Master::new(
            cfg,
            [a, a],
            &tokio_util::sync::CancellationToken::new(),
        ));
        m.set_port(Role::Publish, true);
        m.set_port(Role::Request, true);
        m
    }

    fn picks(sel: &dyn Selector, ms: &[Arc<Master>], n: usize) -> String {
        let mut out = Vec::new();
        (0..n)
            .map(|_| {
                sel.order(ms, Role::Publish, "10.0.0.1".parse().unwrap(), &mut out);
                out.first()
                    .map(|&i| ms[i].name().to_string())
                    .unwrap_or("-".into())
            })
            .collect::<Vec<_>>()
            .join("")
    }

    #[test]
    fn round_robin_takes_masters_in_turn() {
        let ms = [
            master("a", 1, false),
            master("b", 1, false),
            master("c", 1, false),
        ];
        assert_eq!(picks(&RoundRobin::new(3), &ms, 6), "abcabc");
    }

    #[test]
    fn round_robin_skips_masters_marked_down() {
        let ms = [
            master("a", 1, false),
            master("b", 1, false),
            master("c", 1, false),
        ];
        let rr = RoundRobin::new(3);
        ms[1].set_port(Role::Request, false);
        assert_eq!(picks(&rr, &ms, 4), "acac");
        ms[1].set_port(Role::Request, true);
        assert_eq!(picks(&rr, &ms, 3).chars().filter(|c| *c == 'b').count(), 1);
    }

    #[test]
    fn round_robin_honours_weights_smoothly() {
        let ms = [master("a", 3, false), master("b", 1, false)];
        assert_eq!(picks(&RoundRobin::new(2), &ms, 8), "aabaaaba");
    }

    #[test]
    fn candidates_after_the_first_are_the_others_in_order() {
        let ms = [
            master("a", 1, false),
            master("b", 1, false),
            master("c", 1, false),
        ];
        let rr = RoundRobin::new(3);
        let mut out = Vec::new();
        let ip = "10.0.0.1".parse().unwrap();
        rr.order(&ms, Role::Publish, ip, &mut out);
        rr.order(&ms, Role::Publish, ip, &mut out);
        assert_eq!(out, [1, 2, 0]);
    }

    #[test]
    fn backups_are_used_only_when_no_other_master_is_up() {
        let ms = [master("a", 1, false), master("z", 1, true)];
        let rr = RoundRobin::new(2);
        assert_eq!(picks(&rr, &ms, 2), "aa");
        ms[0].set_port(Role::Publish, false);
        assert_eq!(picks(&rr, &ms, 2), "zz");
        ms[1].set_port(Role::Publish, false);
        assert_eq!(picks(&rr, &ms, 1), "-");
    }

    #[test]
    fn zero_weight_and_disabled_masters_take_no_new_sessions() {
        let mut ms = vec![master("a", 0, false), master("b", 1, false)];
        assert_eq!(picks(&RoundRobin::new(2), &ms, 3), "bbb");
        let mut cfg = (**ms[1].cfg()).clone();
        cfg.disabled = true;
        let d = Arc::new(Master::new(
            cfg,
            ms[1].addrs,
            &tokio_util::sync::CancellationToken::new(),
        ));
        d.set_port(Role::Publish, true);
        d.set_port(Role::Request, true);
        ms[1] = d;
        assert_eq!(picks(&RoundRobin::new(2), &ms, 1), "-");
    }

    #[test]
    fn least_conn_prefers_the_emptiest_master() {
        let ms = [master("a", 1, false), master("b", 1, false)];
        let _s1 = ms[0].try_reserve(Role::Publish).unwrap();
        assert_eq!(picks(&LeastConn, &ms, 2), "bb");
        let _s2 = ms[1].try_reserve(Role::Publish).unwrap();
        let _s3 = ms[1].try_reserve(Role::Publish).unwrap();
        assert_eq!(picks(&LeastConn, &ms, 1), "a");
    }

    #[test]
    fn with_rebalancing_on_the_publish_listener_prefers_the_least_loaded() {
        let ms = [master("a", 1, false), master("b", 1, false)];
        let _s = ms[0].try_reserve(Role::Publish).unwrap();
        let publish = ListenerConfig::defaults_for(Role::Publish);
        assert_eq!(publish.balance, Balance::RoundRobin);
        assert_eq!(picks(&*for_listener(&publish, 2), &ms, 3), "bbb");
        drop(_s);
        let three = [ms[0].clone(), ms[1].clone(), master("c", 1, false)];
        assert_eq!(
            picks(&*for_listener(&publish, 3), &three, 6),
            "abcabc",
            "equal loads: round robin"
        );
        let mut off = publish.clone();
        off.rebalance.enabled = false;
        assert_eq!(picks(&*for_listener(&off, 2), &ms, 2), "ab");
        let request = ListenerConfig::defaults_for(Role::Request);
        assert_eq!(picks(&*for_listener(&request, 2), &ms, 2), "ab");
    }

    #[test]
    fn source_hash_is_a_fixed_function() {
        // Pinned values: a change here re-maps every minion of every deployed saltgate.
        assert_eq!(
            format!(
                "{:016x}",
                stable_hash("10.0.0.1".parse().unwrap(), "rserve1")
            ),
            PINNED
        );
    }
    const PINNED: &str = "8854f584a867ffae";

    #[test]
    fn source_hash_is_stable_and_moves_only_the_clients_of_a_lost_master() {
        let ms = [
            master("a", 1, false),
            master("b", 1, false),
            master("c", 1, false),
        ];
        let mut out = Vec::new();
        let clients: Vec<IpAddr> = (0..300u32)
            .map(|i| IpAddr::from([10, 0, (i >> 8) as u8, i as u8]))
            .collect();
        let pick = |out: &mut Vec<usize>, ip: IpAddr, role| {
            SourceHash.order(&ms, role, ip, out);
            out[0]
        };
        let before: Vec<usize> = clients
            .iter()
            .map(|&ip| pick(&mut out, ip, Role::Publish))
            .collect();
        let req: Vec<usize> = clients
            .iter()
            .map(|&ip| pick(&mut out, ip, Role::Request))
            .collect();
        assert_eq!(before, req, "affinity: same master on both ports");
        for m in 0..3 {
            let n = before.iter().filter(|&&b| b == m).count();
            assert!((60..=140).contains(&n), "master {m} got {n} of 300");
        }
        ms[1].set_port(Role::Publish, false);
        for (ip, b) in clients.iter().zip(&before) {
            let now = pick(&mut out, *ip, Role::Publish);
            if *b != 1 {
                assert_eq!(now, *b, "a client of a surviving master must not move");
            } else {
                assert_ne!(now, 1);
            }
        }
    }
}
