//! `balance: first` with failback: masters in configuration order, the first that is UP and below
//! its `maxconn` takes every new session (HAProxy's `first`), except that a master that came back
//! UP is held behind the masters that stayed UP until it has been UP for the listener's
//! `failback` delay (`failback: false`: for good, until nothing ahead of it can take a session).
//! A short blip of the preferred master does not move every minion twice.
//!
//! Once the hold ends, new sessions go to it at once; publish sessions are moved back to it by the
//! rebalancer ([`crate::select::rebalance::run`] with [`plan`]) at the listener's `rebalance.rate`.
//!
//! Pure over the masters' state and a clock reading; tested on paused time.

use std::sync::Arc;

use saltgate_config::{Failback, Role};
use tokio::time::Instant;

use crate::select::master::Master;
use crate::select::selection::eligible;

/// Whether `m` is held back by the failback delay at `now`.
pub fn held(m: &Master, failback: Failback, now: Instant) -> bool {
    let Some(since) = m.upstream.up_since() else {
        return false;
    };
    if m.upstream.hold_released() {
        return false;
    }
    match failback {
        Failback::Never => true,
        Failback::After(d) => now < since + d,
    }
}

/// When the first hold of an available master ends (`None`: no hold, or holds for good).
pub fn next_release(masters: &[Arc<Master>], failback: Failback, now: Instant) -> Option<Instant> {
    let Failback::After(d) = failback else {
        return None;
    };
    masters
        .iter()
        .filter(|m| m.is_available() && held(m, failback, now))
        .filter_map(|m| m.upstream.up_since().map(|t| t + d))
        .min()
}

/// The eligible masters (see [`eligible`]) in configuration order, those held back after the
/// others.
pub fn order(
    masters: &[Arc<Master>],
    role: Role,
    failback: Failback,
    now: Instant,
    out: &mut Vec<usize>,
) {
    eligible(masters, role, out);
    // Stable: configuration order within each group.
    out.sort_by_key(|&i| held(&masters[i], failback, now));
}

/// The `first` selector.
#[derive(Debug)]
pub struct First {
    pub failback: Failback,
}

impl crate::select::selection::Selector for First {
    fn order(
        &self,
        masters: &[Arc<Master>],
        role: Role,
        _client: std::net::IpAddr,
        out: &mut Vec<usize>,
    ) {
        let now = Instant::now();
        order(masters, role, self.failback, now, out);
        if let Some(&i) = out.first() {
            if held(&masters[i], self.failback, now) {
                // Nothing ahead of it can take the session: it is the one in use now, and a
                // master that comes back ahead of it will be held behind it in turn.
                masters[i].upstream.release_hold();
            }
        }
    }
}

/// Which masters to take publish sessions from, one entry per session, at most `budget`: the
/// sessions beyond what `first` would give each master (fill in [`order`], each up to its
/// `maxconn`), from the last in that order first. `in_flight` sessions already moved and not yet
/// back count as placed. Masters that cannot take sessions keep theirs (closing a DOWN master's
/// sessions is `on_master_down`'s business).
pub fn plan(
    masters: &[Arc<Master>],
    failback: Failback,
    now: Instant,
    budget: usize,
    in_flight: u32,
) -> Vec<usize> {
    let mut ranked = Vec::new();
    order(masters, Role::Publish, failback, now, &mut ranked);
    let count = |i: usize| u64::from(masters[i].session_count(Role::Publish));
    let mut left: u64 = ranked.iter().map(|&i| count(i)).sum::<u64>() + u64::from(in_flight);
    let mut surplus: Vec<(usize, u64)> = Vec::new();
    for &i in &ranked {
        let cap = masters[i].cfg().maxconn.map_or(u64::MAX, u64::from);
        let want = left.min(cap);
        left -= want;
        surplus.push((i, count(i).saturating_sub(want)));
    }
    let mut out = Vec::new();
    for &(i, n) in surplus.iter().rev() {
        let n = (n as usize).min(budget - out.len());
        out.extend(std::iter::repeat_n(i, n));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, SocketAddr};
    use std::time::Duration;

    use saltgate_config::{HealthSettings, MasterConfig};

    use super::*;
    use crate::select::selection::Selector;

    fn master(name: &str, maxconn: Option<u32>) -> Arc<Master> {
        let cfg = MasterConfig {
            name: name.into(),
            host: "127.0.0.1".into(),
            publish_port: 1,
            request_port: 2,
            weight: 1,
            maxconn,
            backup: false,
            disabled: false,
            check: true,
            health: HealthSettings::default(),
        };
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        Arc::new(Master::new(cfg, [a, a], &Default::default()))
    }

    fn first(sel: &First, ms: &[Arc<Master>]) -> String {
        let mut out = Vec::new();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        sel.order(ms, Role::Request, ip, &mut out);
        out.iter()
            .map(|&i| ms[i].name())
            .collect::<Vec<_>>()
            .join("")
    }

    fn bounce(m: &Master) {
        m.set_port(Role::Request, false);
        m.set_port(Role::Request, true);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_up_master_in_order_takes_it_and_the_rest_follow_for_retries() {
        let ms = [master("a", None), master("b", None), master("c", None)];
        let sel = First {
            failback: Failback::After(Duration::from_secs(30)),
        };
        assert_eq!(first(&sel, &ms), "abc");
        ms[0].set_port(Role::Publish, false);
        assert_eq!(first(&sel, &ms), "bc", "a DOWN: the next one");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_master_passes_new_sessions_to_the_next_as_haproxy_first() {
        let ms = [master("a", Some(2)), master("b", None)];
        let sel = First {
            failback: Failback::After(Duration::ZERO),
        };
        let _l = [
            ms[0].try_reserve(Role::Request),
            ms[0].try_reserve(Role::Request),
        ];
        assert_eq!(first(&sel, &ms), "b");
    }

    #[tokio::test(start_paused = true)]
    async fn a_master_back_up_waits_for_the_failback_delay_and_only_that() {
        let ms = [master("a", None), master("b", None)];
        let sel = First {
            failback: Failback::After(Duration::from_secs(30)),
        };
        bounce(&ms[0]);
        assert_eq!(first(&sel, &ms), "ba", "held behind b");
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(first(&sel, &ms), "ba");
        assert_eq!(
            next_release(&ms, sel.failback, Instant::now()),
            Some(Instant::now() + Duration::from_secs(1))
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(first(&sel, &ms), "ab", "30 s UP: back in first place");
        // A blip restarts the delay.
        bounce(&ms[0]);
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(first(&sel, &ms), "ba");
        bounce(&ms[0]);
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(first(&sel, &ms), "ba", "20 s since the last blip");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(first(&sel, &ms), "ab");
    }

    #[tokio::test(start_paused = true)]
    async fn failback_false_stays_on_the_master_in_use_while_it_is_up() {
        let ms = [master("a", None), master("b", None)];
        let sel = First {
            failback: Failback::Never,
        };
        bounce(&ms[0]);
        tokio::time::advance(Duration::from_secs(86_400)).await;
        assert_eq!(first(&sel, &ms), "ba");
        assert_eq!(next_release(&ms, sel.failback, Instant::now()), None);
        // b fails: a is used, and stays in use when b comes back.
        ms[1].set_port(Role::Request, false);
        assert_eq!(first(&sel, &ms), "a");
        ms[1].set_port(Role::Request, true);
        assert_eq!(first(&sel, &ms), "ab");
    }

    #[tokio::test(start_paused = true)]
    async fn the_plan_moves_what_first_would_place_elsewhere_last_first() {
        let ms = [master("a", Some(3)), master("b", None), master("c", None)];
        let fb = Failback::After(Duration::from_secs(30));
        let leases: Vec<_> = [(1, 4), (2, 2)]
            .iter()
            .flat_map(|&(i, n)| (0..n).map(move |_| i))
            .map(|i| ms[i].try_reserve(Role::Publish).unwrap())
            .collect();
        // Six sessions, a holds 3 at most: 3 move, from c first.
        assert_eq!(plan(&ms, fb, Instant::now(), 10, 0), [2, 2, 1]);
        assert_eq!(
            plan(&ms, fb, Instant::now(), 2, 0),
            [2, 2],
            "within the budget"
        );
        assert_eq!(
            plan(&ms, fb, Instant::now(), 10, 3),
            [2, 2],
            "three on their way fill a: b keeps its four"
        );
        bounce(&ms[0]);
        assert!(
            plan(&ms, fb, Instant::now(), 10, 0).len() == 2,
            "a held: b first, c's two move to b"
        );
        drop(leases);
    }
}
