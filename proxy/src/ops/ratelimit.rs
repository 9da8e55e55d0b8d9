//! Log lines for events that can happen once per connection (a master refusing connects, no master
//! available): at most one line per interval, carrying how many were left out since the last one,
//! so a storm of clients cannot flood the log.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How often a rate-limited line may be logged.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct LogLimit {
    every: Duration,
    /// When the last line was logged, and the events left out since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Default for LogLimit {
    fn default() -> Self {
        Self::new(LOG_EVERY)
    }
}

impl LogLimit {
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(left_out)` when this event may be logged now (with the number of events left out
    /// since the last line), `None` when it is to be counted only.
    pub fn allow(&self) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match s.0 {
            Some(t) if now.duration_since(t) < self.every => {
                s.1 += 1;
                None
            }
            _ => {
                let left_out = s.1;
                *s = (Some(now), 0);
                Some(left_out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_interval_with_the_count_left_out() {
        let l = LogLimit::new(Duration::from_secs(5));
        assert_eq!(l.allow(), Some(0));
        for _ in 0..99 {
            assert_eq!(l.allow(), None);
        }
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(l.allow(), Some(99));
        assert_eq!(l.allow(), None);
    }
}
