//! A lock-free latency histogram for the swarm: how long after its publish (the moment its JID
//! names) each job reached a minion. Buckets grow by 10 %, from 250 µs up to ~5.5 hours, so a
//! percentile read from it is within 10 % of the true value; 192 counters per process, shared by
//! every simulated minion.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Number of buckets.
pub const BUCKETS: usize = 192;
const FIRST_US: f64 = 250.0;
const GROWTH: f64 = 1.1;

/// Upper bound of bucket `k`, in microseconds.
pub fn bucket_upper_us(k: usize) -> f64 {
    FIRST_US * GROWTH.powi(k as i32)
}

/// The bucket a delay falls in (the last one takes everything beyond it).
pub fn bucket_of(d: Duration) -> usize {
    let us = d.as_secs_f64() * 1e6;
    if us <= FIRST_US {
        return 0;
    }
    let k = ((us / FIRST_US).ln() / GROWTH.ln()).ceil() as usize;
    k.min(BUCKETS - 1)
}

#[derive(Debug)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        self.counts[bucket_of(d)].fetch_add(1, Ordering::Relaxed);
    }

    /// The non-empty buckets as `[bucket, count]` pairs (what the swarm's JSON lines carry).
    pub fn nonzero(&self) -> Vec<[u64; 2]> {
        self.counts
            .iter()
            .enumerate()
            .filter_map(|(k, c)| {
                let n = c.load(Ordering::Relaxed);
                (n > 0).then_some([k as u64, n])
            })
            .collect()
    }
}

/// The `p`-th percentile (0-100) of counts per bucket, as the bucket's upper bound in µs; None
/// when there is nothing counted.
pub fn percentile_us(counts: &[u64], p: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (k, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(bucket_upper_us(k));
        }
    }
    Some(bucket_upper_us(counts.len().saturating_sub(1)))
}

/// Counts per bucket from `[bucket, count]` pairs, ignoring buckets out of range.
pub fn from_pairs(pairs: &[[u64; 2]]) -> Vec<u64> {
    let mut out = vec![0; BUCKETS];
    for [k, n] in pairs {
        if let Some(slot) = usize::try_from(*k).ok().and_then(|k| out.get_mut(k)) {
            *slot += n;
        }
    }
    out
}

/// Counts per bucket from a swarm JSON line's `receipt_buckets` (empty when absent).
pub fn from_line(v: &serde_json::Value) -> Vec<u64> {
    let pairs: Vec<[u64; 2]> = v
        .get("receipt_buckets")
        .and_then(|b| serde_json::from_value(b.clone()).ok())
        .unwrap_or_default();
    from_pairs(&pairs)
}

/// The `receipt_buckets` pairs of several swarm lines, summed (what a multi-process swarm prints).
pub fn sum_lines<'a>(lines: impl Iterator<Item = &'a serde_json::Value>) -> Vec<[u64; 2]> {
    let mut total = vec![0u64; BUCKETS];
    for v in lines {
        for (t, c) in total.iter_mut().zip(from_line(v)) {
            *t += c;
        }
    }
    total
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| [k as u64, *n])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_within_ten_percent_and_bounded() {
        for us in [1u64, 250, 251, 1_000, 12_345, 2_000_000, 600_000_000] {
            let k = bucket_of(Duration::from_micros(us));
            let upper = bucket_upper_us(k);
            assert!(
                upper >= us as f64 - 1e-6,
                "{us} µs -> bucket {k} (≤ {upper})"
            );
            if us > 250 {
                assert!(upper <= us as f64 * 1.1 + 1e-6, "{us} µs -> {upper}");
            }
        }
        assert_eq!(bucket_of(Duration::from_secs(100_000)), BUCKETS - 1);
    }

    #[test]
    fn percentiles_come_from_the_recorded_delays() {
        let h = Histogram::default();
        for ms in 1..=100u64 {
            h.record(Duration::from_millis(ms));
        }
        let counts = from_pairs(&h.nonzero());
        assert_eq!(counts.iter().sum::<u64>(), 100);
        let p50 = percentile_us(&counts, 50.0).unwrap();
        let p99 = percentile_us(&counts, 99.0).unwrap();
        assert!((50_000.0..=55_000.0).contains(&p50), "{p50}");
        assert!((99_000.0..=108_900.0).contains(&p99), "{p99}");
        assert_eq!(percentile_us(&[0; BUCKETS], 50.0), None);
        assert_eq!(from_pairs(&[[999, 5]]).iter().sum::<u64>(), 0);
        let a = serde_json::json!({"receipt_buckets": [[3, 2], [7, 1]]});
        let b = serde_json::json!({"receipt_buckets": [[3, 1]], "other": 1});
        assert_eq!(sum_lines([&a, &b].into_iter()), vec![[3, 3], [7, 1]]);
        assert_eq!(from_line(&serde_json::json!({})).iter().sum::<u64>(), 0);
    }
}
