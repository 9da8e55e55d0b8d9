//! The recent history the status page shows (`GET /api/v1/events`): a bounded ring of the last
//! [`MAX_EVENTS`] health flips, reloads and admin actions, the last flip of every master (which
//! outlives the ring), the last [`MAX_CHECKS`] check results of every master port, and the
//! configuration generation in force with the time it was loaded.
//!
//! It is fed by one-line hooks where things happen (the check loop, the reload path, the admin
//! actions) and owns no I/O. Everything is bounded: the ring, each port's history, and the number
//! of ports remembered ([`MAX_PORTS`]; the port checked longest ago is forgotten first), so a
//! long-running process with many reloads that rename masters does not grow. Times are wall-clock
//! milliseconds since the Unix epoch, as a browser shows them; the answer carries the server's
//! `now_ms`, so "how long ago" does not depend on the browser's clock.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// Flips, reloads and admin actions kept in the ring.
pub const MAX_EVENTS: usize = 50;
/// Check results kept per master port (the page's history strip).
pub const MAX_CHECKS: usize = 20;
/// Master ports whose check history is kept.
pub const MAX_PORTS: usize = 4096;
/// Longest check detail or error text kept (a Salt error can be long).
const MAX_TEXT: usize = 300;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn clip(s: &str) -> String {
    if s.len() <= MAX_TEXT {
        return s.to_string();
    }
    let mut end = MAX_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum EventKind {
    /// A master's health changed because of the checks of one port.
    Flip {
        master: String,
        /// The port (`publish`, `request`) whose checks caused the flip.
        port: String,
        from: String,
        to: String,
        reason: String,
    },
    /// A configuration was put in force, or refused.
    Reload {
        /// The generation now in force (`None` when refused).
        generation: Option<u64>,
        /// What asked for it: `start`, `SIGHUP`, `admin API`, `file change`, ...
        trigger: String,
        ok: bool,
        error: Option<String>,
    },
    /// An operator's drain, disable or enable.
    Admin {
        master: String,
        action: String,
        /// The master's state right after.
        state: String,
    },
}

/// One entry of the ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Increases by one with every event, so a reader can tell new ones from seen ones.
    pub seq: u64,
    pub at_ms: u64,
    #[serde(flatten)]
    pub what: EventKind,
}

/// One check result of a master port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckSample {
    pub at_ms: u64,
    pub ok: bool,
    pub duration_ms: u64,
    /// The same in microseconds: checks on a LAN take well under a millisecond.
    pub duration_us: u64,
    pub detail: String,
}

/// The check history of one master port, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortChecks {
    pub master: String,
    pub port: String,
    pub checks: Vec<CheckSample>,
}

/// The answer of `GET /api/v1/events`.
#[derive(Debug, Clone, Serialize)]
pub struct EventsView {
    pub now_ms: u64,
    /// The configuration generation in force (0 before the first one).
    pub generation: u64,
    /// When it was put in force.
    pub loaded_at_ms: Option<u64>,
    /// Newest first, at most [`MAX_EVENTS`].
    pub events: Vec<Event>,
    /// The last flip of every master that flipped, by master name.
    pub last_flip: HashMap<String, Event>,
    pub checks: Vec<PortChecks>,
}

#[derive(Default)]
struct Inner {
    seq: u64,
    events: VecDeque<Event>,
    last_flip: HashMap<String, Event>,
    checks: HashMap<(String, String), VecDeque<CheckSample>>,
    generation: u64,
    loaded_at_ms: Option<u64>,
}

impl Inner {
    fn push(&mut self, at_ms: u64, what: EventKind) -> Event {
        self.seq += 1;
        let e = Event {
            seq: self.seq,
            at_ms,
            what,
        };
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e.clone());
        e
    }
}

/// The event log of one proxy (see the module doc). Cheap to call from hot-ish paths: one short
/// mutex section per call, no allocation beyond the entry itself.
#[derive(Default)]
pub struct EventLog {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog").finish_non_exhaustive()
    }
}

impl EventLog {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// A master flipped because of `port`'s checks: `up` is the new health; `detail` is the last
    /// check's answer and `consecutive` the run of results that crossed the threshold.
    pub fn flip(&self, master: &str, port: &str, up: bool, detail: &str, consecutive: u32) {
        let reason = if up {
            format!("both ports pass ({port}: {consecutive} consecutive success(es))")
        } else {
            format!(
                "{port} port: {} ({consecutive} consecutive failure(s))",
                clip(detail)
            )
        };
        let (from, to) = if up { ("down", "up") } else { ("up", "down") };
        self.record_flip(now_ms(), master, port, from, to, &reason);
    }

    /// Records a flip at a given time (the hook uses [`EventLog::flip`]).
    pub fn record_flip(
        &self,
        at_ms: u64,
        master: &str,
        port: &str,
        from: &str,
        to: &str,
        reason: &str,
    ) {
        self.with(|i| {
            let e = i.push(
                at_ms,
                EventKind::Flip {
                    master: master.to_string(),
                    port: port.to_string(),
                    from: from.to_string(),
                    to: to.to_string(),
                    reason: reason.to_string(),
                },
            );
            i.last_flip.insert(master.to_string(), e);
        });
    }

    /// A check of `master`'s `port` completed.
    pub fn check(&self, master: &str, port: &str, ok: bool, took: Duration, detail: &str) {
        self.record_check(
            master,
            port,
            CheckSample {
                at_ms: now_ms(),
                ok,
                duration_ms: took.as_millis() as u64,
                duration_us: took.as_micros() as u64,
                detail: clip(detail),
            },
        );
    }

    /// Records a check result (the hook uses [`EventLog::check`]).
    pub fn record_check(&self, master: &str, port: &str, sample: CheckSample) {
        self.with(|i| {
            let key = (master.to_string(), port.to_string());
            if !i.checks.contains_key(&key) && i.checks.len() >= MAX_PORTS {
                let oldest = i
                    .checks
                    .iter()
                    .min_by_key(|(_, v)| v.back().map_or(0, |s| s.at_ms))
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    i.checks.remove(&k);
                }
            }
            let h = i.checks.entry(key).or_default();
            if h.len() == MAX_CHECKS {
                h.pop_front();
            }
            h.push_back(sample);
        });
    }

    /// A configuration was put in force as `generation`. The first one (at start) is also
    /// recorded as a reload event with trigger `start`; later ones are recorded by
    /// [`EventLog::reload`], which knows the trigger.
    pub fn in_force(&self, generation: u64, first: bool) {
        let at = now_ms();
        self.with(|i| {
            i.generation = generation;
            i.loaded_at_ms = Some(at);
            if first {
                i.push(
                    at,
                    EventKind::Reload {
                        generation: Some(generation),
                        trigger: "start".into(),
                        ok: true,
                        error: None,
                    },
                );
            }
        });
    }

    /// A reload asked for by `trigger` ended: the generation put in force, or why not.
    pub fn reload(&self, trigger: &str, result: Result<u64, String>) {
        let (generation, ok, error) = match result {
            Ok(g) => (Some(g), true, None),
            Err(e) => (None, false, Some(clip(&e))),
        };
        self.with(|i| {
            i.push(
                now_ms(),
                EventKind::Reload {
                    generation,
                    trigger: trigger.to_string(),
                    ok,
                    error,
                },
            );
        });
    }

    /// An operator's action on a master, and the state it left.
    pub fn admin(&self, master: &str, action: &str, state: &str) {
        self.with(|i| {
            i.push(
                now_ms(),
                EventKind::Admin {
                    master: master.to_string(),
                    action: action.to_string(),
                    state: state.to_string(),
                },
            );
        });
    }

    /// Everything, for the API; ports sorted by master then port.
    pub fn view(&self) -> EventsView {
        self.with(|i| {
            let mut checks: Vec<PortChecks> = i
                .checks
                .iter()
                .map(|((m, p), h)| PortChecks {
                    master: m.clone(),
                    port: p.clone(),
                    checks: h.iter().cloned().collect(),
                })
                .collect();
            checks.sort_by(|a, b| (&a.master, &a.port).cmp(&(&b.master, &b.port)));
            EventsView {
                now_ms: now_ms(),
                generation: i.generation,
                loaded_at_ms: i.loaded_at_ms,
                events: i.events.iter().rev().cloned().collect(),
                last_flip: i.last_flip.clone(),
                checks,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: u64, ok: bool) -> CheckSample {
        CheckSample {
            at_ms,
            ok,
            duration_ms: 1,
            duration_us: 1000,
            detail: String::new(),
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_events_newest_first() {
        let log = EventLog::new();
        for n in 0..(MAX_EVENTS as u64 + 17) {
            log.record_flip(n, &format!("m{n}"), "publish", "up", "down", "x");
        }
        let v = log.view();
        assert_eq!(v.events.len(), MAX_EVENTS);
        assert_eq!(v.events[0].seq, MAX_EVENTS as u64 + 17);
        assert_eq!(v.events[MAX_EVENTS - 1].seq, 18);
        assert!(v.events.windows(2).all(|w| w[0].seq > w[1].seq));
    }

    #[test]
    fn a_masters_last_flip_outlives_the_ring() {
        let log = EventLog::new();
        log.record_flip(1, "quiet", "request", "up", "down", "connect: refused");
        for n in 0..(2 * MAX_EVENTS as u64) {
            log.reload("SIGHUP", Ok(n));
        }
        let v = log.view();
        assert!(v
            .events
            .iter()
            .all(|e| matches!(e.what, EventKind::Reload { .. })));
        let last = &v.last_flip["quiet"];
        assert_eq!(last.at_ms, 1);
        assert!(
            matches!(&last.what, EventKind::Flip { reason, .. } if reason == "connect: refused")
        );
    }

    #[test]
    fn each_port_keeps_its_last_checks_only() {
        let log = EventLog::new();
        for n in 0..(MAX_CHECKS as u64 + 5) {
            log.record_check("a", "publish", sample(n, n % 2 == 0));
        }
        log.record_check("a", "request", sample(7, true));
        let v = log.view();
        assert_eq!(v.checks.len(), 2);
        assert_eq!(
            (v.checks[0].port.as_str(), v.checks[0].checks.len()),
            ("publish", MAX_CHECKS)
        );
        assert_eq!(
            v.checks[0].checks[0].at_ms, 5,
            "oldest first, the first 5 dropped"
        );
        assert_eq!(v.checks[1].checks.len(), 1);
    }

    #[test]
    fn the_port_checked_longest_ago_is_forgotten_past_the_bound() {
        let log = EventLog::new();
        for n in 0..MAX_PORTS as u64 {
            log.record_check(&format!("m{n}"), "publish", sample(1000 + n, true));
        }
        log.record_check("m0", "publish", sample(99_999, true)); // m0 is now the freshest
        log.record_check("new", "publish", sample(100_000, true));
        let v = log.view();
        assert_eq!(v.checks.len(), MAX_PORTS);
        assert!(v.checks.iter().any(|c| c.master == "m0"));
        assert!(v.checks.iter().any(|c| c.master == "new"));
        assert!(
            !v.checks.iter().any(|c| c.master == "m1"),
            "m1 was the stalest"
        );
    }

    #[test]
    fn the_start_is_a_reload_event_and_later_generations_are_not_doubled() {
        let log = EventLog::new();
        log.in_force(1, true);
        log.in_force(2, false);
        log.reload("admin API", Ok(2));
        log.reload("SIGHUP", Err("masters[0].host: empty".into()));
        let v = log.view();
        assert_eq!(v.generation, 2);
        assert!(v.loaded_at_ms.is_some());
        let kinds: Vec<(Option<u64>, &str, bool)> = v
            .events
            .iter()
            .map(|e| match &e.what {
                EventKind::Reload {
                    generation,
                    trigger,
                    ok,
                    ..
                } => (*generation, trigger.as_str(), *ok),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (None, "SIGHUP", false),
                (Some(2), "admin API", true),
                (Some(1), "start", true)
            ]
        );
    }

    #[test]
    fn long_details_are_clipped_on_a_char_boundary() {
        let log = EventLog::new();
        let long = "é".repeat(MAX_TEXT);
        log.check("a", "request", false, Duration::from_millis(3), &long);
        let v = log.view();
        let d = &v.checks[0].checks[0].detail;
        assert!(d.len() <= MAX_TEXT + '…'.len_utf8());
        assert!(d.ends_with('…'));
    }

    #[test]
    fn flips_read_as_a_from_to_with_the_reason() {
        let log = EventLog::new();
        log.flip("b", "request", false, "connect: refused", 3);
        let json = serde_json::to_value(log.view().events[0].clone()).unwrap();
        assert_eq!(json["kind"], "flip");
        assert_eq!(json["from"], "up");
        assert_eq!(json["to"], "down");
        assert_eq!(
            json["reason"],
            "request port: connect: refused (3 consecutive failure(s))"
        );
    }
}
