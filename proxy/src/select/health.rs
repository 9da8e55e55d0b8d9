//! The health state machine of one master port: rise/fall thresholds and the interval to wait
//! before the next check (`interval`, `fastinter`, `downinter`). Pure logic, no I/O; the probers in
//! [`crate::select::check`] feed it results.

use std::time::Duration;

use saltgate_config::HealthSettings;

/// What the checks say about a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// No check has completed yet.
    Unknown,
    Up,
    Down,
}

/// Consecutive results and the state they add up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthState {
    pub state: PortState,
    /// Consecutive successes since the last failure.
    pub successes: u32,
    /// Consecutive failures since the last success.
    pub failures: u32,
}

impl Default for HealthState {
    fn default() -> Self {
        Self {
            state: PortState::Unknown,
            successes: 0,
            failures: 0,
        }
    }
}

impl HealthState {
    /// Records one check result; returns the new state when it flipped.
    ///
    /// As in HAProxy, a port is presumed UP before its first check: a first success confirms it at
    /// once, and `fall` consecutive failures bring it DOWN, as from UP. (A slow first answer from a
    /// busy master must not take the whole cluster out at start.) After that, `rise` consecutive
    /// successes bring a DOWN port UP.
    pub fn record(&mut self, ok: bool, s: &HealthSettings) -> Option<PortState> {
        let before = self.state;
        if ok {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            if before == PortState::Unknown
                || (before == PortState::Down && self.successes >= s.rise)
            {
                self.state = PortState::Up;
            }
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            if before != PortState::Down && self.failures >= s.fall {
                self.state = PortState::Down;
            }
        }
        (self.state != before).then_some(self.state)
    }

    /// How long to wait before the next check: `interval` while steadily UP, `downinter` while
    /// steadily DOWN, `fastinter` while in transition (as HAProxy).
    pub fn next_interval(&self, s: &HealthSettings) -> Duration {
        match self.state {
            PortState::Up if self.failures == 0 => s.interval,
            PortState::Down if self.successes == 0 => s.downinter,
            _ => s.fastinter,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> HealthSettings {
        HealthSettings {
            interval: Duration::from_secs(2),
            fastinter: Duration::from_millis(500),
            downinter: Duration::from_secs(5),
            rise: 2,
            fall: 3,
            timeout: Duration::from_secs(1),
            handshake_timeout: Duration::from_millis(500),
            probe: saltgate_config::Probe::Tcp,
        }
    }

    /// Feeds `results` and returns the state after each one.
    fn run(results: &str) -> Vec<PortState> {
        let s = settings();
        let mut h = HealthState::default();
        results
            .chars()
            .map(|c| {
                h.record(c == '+', &s);
                h.state
            })
            .collect()
    }

    #[test]
    fn a_first_success_confirms_at_once_and_first_failures_count_toward_fall() {
        use PortState::*;
        assert_eq!(run("+"), [Up]);
        assert_eq!(run("---"), [Unknown, Unknown, Down]);
        assert_eq!(run("--+"), [Unknown, Unknown, Up]);
    }

    #[test]
    fn an_up_port_goes_down_after_fall_consecutive_failures() {
        use PortState::*;
        assert_eq!(run("+--+---"), [Up, Up, Up, Up, Up, Up, Down]);
    }

    #[test]
    fn a_down_port_comes_back_after_rise_consecutive_successes() {
        use PortState::*;
        assert_eq!(
            run("----+-++"),
            [Unknown, Unknown, Down, Down, Down, Down, Down, Up]
        );
    }

    #[test]
    fn record_reports_only_flips() {
        let s = settings();
        let mut h = HealthState::default();
        let flips: Vec<_> = "++---+-++"
            .chars()
            .map(|c| h.record(c == '+', &s))
            .collect();
        use PortState::*;
        assert_eq!(
            flips,
            [
                Some(Up),
                None,
                None,
                None,
                Some(Down),
                None,
                None,
                None,
                Some(Up)
            ]
        );
    }

    #[test]
    fn intervals_follow_inter_fastinter_downinter() {
        let s = settings();
        let mut h = HealthState::default();
        assert_eq!(
            h.next_interval(&s),
            s.fastinter,
            "unknown: check again soon"
        );
        h.record(true, &s);
        assert_eq!(h.next_interval(&s), s.interval, "steadily up");
        h.record(false, &s);
        assert_eq!(
            h.next_interval(&s),
            s.fastinter,
            "up with a failure: in transition"
        );
        h.record(false, &s);
        h.record(false, &s);
        assert_eq!(h.state, PortState::Down);
        assert_eq!(h.next_interval(&s), s.downinter, "steadily down");
        h.record(true, &s);
        assert_eq!(
            h.next_interval(&s),
            s.fastinter,
            "down with a success: in transition"
        );
    }
}
