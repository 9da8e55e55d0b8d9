//! Rebalancing publish sessions, gently: when a master comes back UP (or is added by a reload: it
//! starts UP), publish sessions are moved to it while the spread over the masters exceeds the
//! listener's `rebalance.tolerance`, at most `rebalance.rate` per second (with jitter), longest
//! idle first. Moving a session is closing it with reason `rebalanced`: the minion reconnects and
//! the publish listener's selector (least loaded, weights respected, while rebalancing is on)
//! places it.
//!
//! One rebalancer runs at a time: every master event bumps an epoch, and a run stops when the epoch
//! moved on (a newer UP starts its own run; a DOWN stops it), when the configuration changes (new
//! snapshot generation), at shutdown, or when the spread is within tolerance.
//!
//! The planning is pure ([`plan`], [`RateWindow`]) and tested on its own.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use rand::Rng;
use saltgate_config::{Balance, Role};
use tokio_util::sync::CancellationToken;

use crate::data::close::CloseReason;
use crate::data::registry::SessionCtl;
use crate::select::master::Master;
use crate::select::snapshot::Snapshot;

/// One master as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Publish sessions it holds.
    pub sessions: u32,
    pub weight: u32,
    /// May take and give sessions (UP, enabled, weight > 0, not a backup).
    pub eligible: bool,
}

/// Whether every eligible master holds its weighted share of the eligible masters' sessions,
/// within `tolerance_pct` percent of that share (and at least one session either way).
pub fn within_tolerance(loads: &[Load], tolerance_pct: u32) -> bool {
    let (total, weights) = totals(loads);
    if weights == 0 {
        return true;
    }
    loads.iter().filter(|l| l.eligible).all(|l| {
        let share = total as f64 * f64::from(l.weight) / weights as f64;
        let slack = (share * f64::from(tolerance_pct) / 100.0).max(1.0);
        (f64::from(l.sessions) - share).abs() <= slack
    })
}

fn totals(loads: &[Load]) -> (u64, u64) {
    loads
        .iter()
        .filter(|l| l.eligible)
        .fold((0, 0), |(s, w), l| {
            (s + u64::from(l.sessions), w + u64::from(l.weight))
        })
}

/// Sessions per unit of weight, scaled to compare without floats.
fn per_weight(l: &Load) -> u64 {
    (u64::from(l.sessions) << 16) / u64::from(l.weight.max(1))
}

/// Which masters to take sessions from, one entry per session, at most `budget`: each move takes
/// from the most loaded eligible master (per weight) and is assumed to land on the least loaded
/// one, as the selector places it, until the spread is within tolerance. `in_flight` sessions
/// already moved and not yet reconnected are first placed on the least loaded masters, so moves
/// are not repeated for them. Empty: nothing to move (within tolerance, or nowhere to move to).
pub fn plan(loads: &[Load], tolerance_pct: u32, budget: usize, in_flight: u32) -> Vec<usize> {
    let mut sim: Vec<Load> = loads.to_vec();
    let idx: Vec<usize> = (0..sim.len()).filter(|&i| sim[i].eligible).collect();
    if idx.len() < 2 {
        return Vec::new();
    }
    let least = |sim: &[Load]| {
        idx.iter()
            .copied()
            .min_by_key(|&i| (per_weight(&sim[i]), i))
            .unwrap_or(idx[0])
    };
    for _ in 0..in_flight {
        let to = least(&sim);
        sim[to].sessions += 1;
    }
    let mut out = Vec::new();
    while out.len() < budget && !within_tolerance(&sim, tolerance_pct) {
        let from = idx
            .iter()
            .copied()
            .max_by_key(|&i| (per_weight(&sim[i]), std::cmp::Reverse(i)))
            .unwrap_or(idx[0]);
        let to = least(&sim);
        if from == to || sim[from].sessions == 0 {
            break;
        }
        sim[from].sessions -= 1;
        sim[to].sessions += 1;
        out.push(from);
    }
    out
}

/// A sliding one-second window of moves: never more than `rate` in any second.
#[derive(Debug)]
pub struct RateWindow {
    rate: u32,
    moves: VecDeque<Instant>,
}

impl RateWindow {
    pub fn new(rate: u32) -> Self {
        Self {
            rate: rate.max(1),
            moves: VecDeque::new(),
        }
    }

    /// How many moves may be made at `now`.
    pub fn allowance(&mut self, now: Instant) -> usize {
        while self
            .moves
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1))
        {
            self.moves.pop_front();
        }
        (self.rate as usize).saturating_sub(self.moves.len())
    }

    /// When the next move will be allowed, if none is now.
    pub fn next_free(&self) -> Option<Instant> {
        (self.moves.len() >= self.rate as usize)
            .then(|| self.moves.front().map(|t| *t + Duration::from_secs(1)))
            .flatten()
    }

    pub fn record(&mut self, now: Instant, n: usize) {
        self.moves.extend(std::iter::repeat_n(now, n));
    }
}

/// The `n` sessions to move from a master: longest idle first (as sampled by
/// [`SessionCtl::observe`]), then oldest; sessions already closing are skipped.
pub fn pick_idlest(sessions: &[Arc<SessionCtl>], n: usize) -> Vec<Arc<SessionCtl>> {
    let mut open: Vec<&Arc<SessionCtl>> = sessions.iter().filter(|s| !s.close_asked()).collect();
    open.sort_by_key(|s| (s.last_active_ms(), s.started, s.id));
    open.into_iter().take(n).cloned().collect()
}

pub use super::selection::applies;

/// What a run moves publish sessions for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Spread them within the tolerance, after `rebalance.delay` ([`plan`]).
    Spread,
    /// `balance: first`: back to the masters `first` now places them on, as their failback holds
    /// end ([`crate::select::failback::plan`]); waits for pending holds.
    Failback,
}

/// The mode the publish listener's configuration calls for, if any.
pub fn mode_for(l: &saltgate_config::ListenerConfig) -> Option<Mode> {
    if applies(&l.rebalance, l.balance) {
        Some(Mode::Spread)
    } else if l.balance == Balance::First && l.rebalance.enabled {
        Some(Mode::Failback)
    } else {
        None
    }
}

fn loads(masters: &[Arc<Master>]) -> Vec<Load> {
    masters
        .iter()
        .map(|m| {
            let cfg = m.cfg();
            Load {
                sessions: m.session_count(Role::Publish),
                weight: cfg.weight,
                eligible: m.is_available() && cfg.weight > 0 && !cfg.backup,
            }
        })
        .collect()
}

/// How long a run waits for moved sessions to come back before it ends.
const SETTLE: Duration = Duration::from_secs(10);

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The spread is within tolerance.
    Balanced,
    /// A newer master event took over, the configuration changed, or saltgate is stopping.
    Superseded,
    /// Rebalancing is off (or does not apply) in the configuration in force.
    Off,
}

/// One rebalancing run, started by `trigger` (a master that came UP). Runs while `epoch` still
/// holds `mine`. Returns how it ended and how many sessions it moved.
pub async fn run(
    snapshot: Arc<ArcSwap<Snapshot>>,
    epoch: Arc<AtomicU64>,
    mine: u64,
    stop: CancellationToken,
    trigger: String,
    mode: Mode,
) -> (Outcome, usize) {
    let t0 = Instant::now();
    let ms = || t0.elapsed().as_millis() as u64 + 1;
    // Failback: the holds are the delay (they are waited for below).
    let delay = match mode {
        Mode::Spread => snapshot.load_full().config.publish.rebalance.delay,
        Mode::Failback => Duration::ZERO,
    };
    let live = || epoch.load(Ordering::Acquire) == mine && !stop.is_cancelled();
    // Wait `delay` (the master must stay UP), sampling idleness meanwhile. A reload during the
    // delay is fine (a master added by a reload can flip UP before its snapshot is in force); the
    // configuration in force at the end of the delay is the one the run keeps to.
    let until = tokio::time::Instant::now() + delay;
    loop {
        for m in snapshot.load_full().masters.iter() {
            m.book
                .of_role(Role::Publish)
                .iter()
                .for_each(|s| s.observe(ms()));
        }
        if !live() {
            return (Outcome::Superseded, 0);
        }
        let now = tokio::time::Instant::now();
        if now >= until {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep((until - now).min(Duration::from_secs(1))) => {}
            _ = stop.cancelled() => return (Outcome::Superseded, 0),
        }
    }
    let first = snapshot.load_full();
    let generation = first.generation;
    let r = first.config.publish.rebalance;
    let failback = first.config.publish.failback;
    if mode_for(&first.config.publish) != Some(mode) {
        return (Outcome::Off, 0);
    }
    let start_total = totals(&loads(&first.masters)).0;
    drop(first);
    // Any later configuration change (reload) ends the run.
    let current =
        |snapshot: &ArcSwap<Snapshot>| live() && snapshot.load_full().generation == generation;
    if mode == Mode::Spread {
        tracing::info!(target: "saltgate_proxy::rebalance", master = %trigger, tolerance_pct = r.tolerance_pct, rate_per_s = r.rate, "rebalancing publish sessions");
    }
    // Batches every 50-75 ms (jitter), sized for the rate at the slowest tick; the window keeps
    // any one second at `rate` or fewer.
    let tick = Duration::from_millis(50);
    let per_tick = ((r.rate as usize * 75).div_ceil(1000)).max(1);
    let mut window = RateWindow::new(r.rate);
    let mut moved = 0usize;
    let mut last_move = Instant::now();
    let outcome = loop {
        if !current(&snapshot) {
            break Outcome::Superseded;
        }
        let snap = snapshot.load_full();
        let now = Instant::now();
        let allowed = window.allowance(now).min(per_tick);
        let ls = loads(&snap.masters);
        let total = totals(&ls).0;
        let in_flight = (start_total.saturating_sub(total)).min(moved as u64) as u32;
        let tnow = tokio::time::Instant::now();
        let pending = match mode {
            Mode::Spread => None,
            Mode::Failback => crate::select::failback::next_release(&snap.masters, failback, tnow),
        };
        if allowed > 0 {
            let from = match mode {
                Mode::Spread => plan(&ls, r.tolerance_pct, allowed, in_flight),
                Mode::Failback => {
                    crate::select::failback::plan(&snap.masters, failback, tnow, allowed, in_flight)
                }
            };
            // Done when the live spread is within tolerance, or when the moved sessions still
            // away would bring it there and no move was needed for a while (minions that never
            // come back are not waited for). Failback: and no hold is pending.
            let settled = match mode {
                Mode::Spread => within_tolerance(&ls, r.tolerance_pct),
                Mode::Failback => pending.is_none(),
            };
            if from.is_empty() && (settled || (pending.is_none() && last_move.elapsed() > SETTLE)) {
                break Outcome::Balanced;
            }
            if moved == 0 && !from.is_empty() && mode == Mode::Failback {
                tracing::info!(target: "saltgate_proxy::rebalance", master = %trigger, rate_per_s = r.rate, "failing publish sessions back (balance: first)");
            }
            let mut n_moved = 0;
            for (i, m) in snap.masters.iter().enumerate() {
                let n = from.iter().filter(|&&f| f == i).count();
                if n == 0 {
                    continue;
                }
                let book = m.book.of_role(Role::Publish);
                book.iter().for_each(|s| s.observe(ms()));
                for s in pick_idlest(&book, n) {
                    tracing::debug!(target: "saltgate_proxy::rebalance", session = s.id, client = %s.client, from = %m.name(), "moving a publish session (rebalanced)");
                    s.close(CloseReason::Rebalanced);
                    n_moved += 1;
                }
            }
            window.record(Instant::now(), n_moved);
            moved += n_moved;
            if n_moved > 0 {
                last_move = Instant::now();
            }
        }
        let jitter = rand::rng().random_range(0..=tick.as_millis() as u64 / 2);
        let mut wait = tick + Duration::from_millis(jitter);
        if let Some(at) = pending.filter(|_| moved == 0 || last_move.elapsed() > SETTLE) {
            // Nothing to do before a hold ends: sleep until then (woken by any master event,
            // which supersedes this run, or a reload).
            wait = wait.max(
                at.saturating_duration_since(tnow)
                    .min(Duration::from_secs(1)),
            );
        }
        if let Some(free) = window.next_free() {
            wait = wait.max(free.saturating_duration_since(Instant::now()));
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => break Outcome::Superseded,
        }
    };
    tracing::info!(target: "saltgate_proxy::rebalance", master = %trigger, moved, outcome = ?outcome, "rebalancing ended");
    (outcome, moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(sessions: u32) -> Load {
        Load {
            sessions,
            weight: 1,
            eligible: true,
        }
    }

    fn apply(loads: &mut [Load], from: &[usize]) {
        for &f in from {
            loads[f].sessions -= 1;
            let to = (0..loads.len())
                .filter(|&i| loads[i].eligible)
                .min_by_key(|&i| (per_weight(&loads[i]), i))
                .unwrap();
            loads[to].sessions += 1;
        }
    }

    #[test]
    fn tolerance_is_a_share_of_each_masters_weighted_target() {
        assert!(within_tolerance(&[l(1000), l(1000), l(1000)], 10));
        assert!(within_tolerance(&[l(1100), l(1000), l(900)], 10));
        assert!(!within_tolerance(&[l(1150), l(1000), l(850)], 10));
        assert!(
            within_tolerance(&[l(2), l(1), l(0)], 10),
            "one session of slack"
        );
        assert!(within_tolerance(&[], 10));
        let w = |s, weight| Load {
            sessions: s,
            weight,
            eligible: true,
        };
        assert!(within_tolerance(&[w(2000, 2), w(1000, 1)], 10));
        assert!(!within_tolerance(&[w(1500, 2), w(1500, 1)], 10));
    }

    #[test]
    fn three_thousand_sessions_after_a_restart_move_only_to_the_tolerance() {
        let mut loads = [l(1500), l(1500), l(0)];
        let mut batches = 0;
        let mut total_moves = 0;
        loop {
            let from = plan(&loads, 10, 50, 0);
            if from.is_empty() {
                break;
            }
            assert!(from.len() <= 50, "a batch never exceeds its budget");
            assert!(
                from.iter().all(|&f| f != 2),
                "never from the emptiest master"
            );
            total_moves += from.len();
            apply(&mut loads, &from);
            batches += 1;
            assert!(batches < 100, "converges");
        }
        assert!(within_tolerance(&loads, 10), "{loads:?}");
        // Only to the edge of the tolerance band (900), not to the full share (1000).
        assert!((900..=910).contains(&total_moves), "{total_moves} moves");
        assert!(
            loads[2].sessions >= 900 && loads[0].sessions <= 1100,
            "{loads:?}"
        );
        assert_eq!(loads.iter().map(|l| l.sessions).sum::<u32>(), 3000);
        assert!(
            loads[0].sessions.abs_diff(loads[1].sessions) <= 1,
            "taken evenly from both: {loads:?}"
        );
    }

    #[test]
    fn nothing_moves_within_tolerance_or_without_a_destination() {
        assert!(plan(&[l(1050), l(1000), l(950)], 10, 100, 0).is_empty());
        assert!(plan(&[l(3000)], 10, 100, 0).is_empty(), "one master");
        let down = Load {
            sessions: 0,
            weight: 1,
            eligible: false,
        };
        assert!(
            plan(&[l(1500), l(1500), down], 10, 100, 0).is_empty(),
            "a master that is not UP receives nothing"
        );
        let zero = Load {
            sessions: 0,
            weight: 0,
            eligible: false,
        };
        assert!(plan(&[l(10), zero], 10, 100, 0).is_empty());
    }

    #[test]
    fn weights_set_the_shares() {
        let w = |s, weight| Load {
            sessions: s,
            weight,
            eligible: true,
        };
        let mut loads = [w(1500, 2), w(1500, 1), w(0, 1)];
        while let Some(from) = Some(plan(&loads, 10, 1000, 0)).filter(|f| !f.is_empty()) {
            apply(&mut loads, &from);
        }
        // Shares: 1500, 750, 750.
        assert!((1350..=1650).contains(&loads[0].sessions), "{loads:?}");
        assert!((675..=825).contains(&loads[2].sessions), "{loads:?}");
    }

    #[test]
    fn sessions_in_flight_are_not_moved_twice() {
        // 300 already moved off (closed, not yet back): they will land on the empty master.
        let loads = [l(1350), l(1350), l(0)];
        let without = plan(&loads, 10, 10_000, 0).len();
        let with = plan(&loads, 10, 10_000, 300).len();
        assert!(with + 150 <= without, "{with} vs {without}");
        assert!(plan(&loads, 10, 10_000, 1200).is_empty());
    }

    #[test]
    fn the_window_never_allows_more_than_the_rate_in_a_second() {
        let t = Instant::now();
        let mut w = RateWindow::new(50);
        let mut done = Vec::new();
        let mut now = t;
        while now < t + Duration::from_secs(5) {
            let n = w.allowance(now).min(7);
            w.record(now, n);
            done.extend(std::iter::repeat_n(now, n));
            now += Duration::from_millis(13);
        }
        for (i, a) in done.iter().enumerate() {
            let in_sec = done[i..]
                .iter()
                .take_while(|b| b.duration_since(*a) < Duration::from_secs(1))
                .count();
            assert!(in_sec <= 50, "{in_sec} moves within a second");
        }
        assert!(done.len() >= 200, "and it does move: {}", done.len());
        assert!(w.next_free().is_some() || w.allowance(now) > 0);
    }

    #[test]
    fn the_idlest_sessions_are_picked_first_then_the_oldest() {
        let c = "10.0.0.1:5".parse().unwrap();
        let ss: Vec<Arc<SessionCtl>> = (1..=4)
            .map(|id| Arc::new(SessionCtl::new(id, Role::Publish, c)))
            .collect();
        ss[0].bytes_out.store(10, Ordering::Relaxed); // active at 5
        ss.iter().for_each(|s| s.observe(5));
        ss[1].bytes_out.store(3, Ordering::Relaxed); // active at 9
        ss.iter().for_each(|s| s.observe(9));
        ss[3].close(CloseReason::Rebalanced); // already moving
        let ids: Vec<u64> = pick_idlest(&ss, 3).iter().map(|s| s.id).collect();
        assert_eq!(ids, [3, 1, 2]);
    }
}
