//! Distributions: latency histograms and exact percentiles of small samples.

use std::sync::Mutex;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Percentiles of a distribution, in the unit its owner names.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Distribution {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Distribution {
    /// Nearest-rank percentiles of the values (sorted in place); `None` when there are none.
    pub fn of_values(values: &mut [u64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        values.sort_unstable();
        let rank = |q: f64| {
            let index = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
            values[index] as f64
        };
        Some(Self { count: values.len() as u64, p50: rank(0.50), p90: rank(0.90), p99: rank(0.99), max: rank(1.0) })
    }

    /// Percentiles of a histogram, each value divided by `divisor` (1000 turns µs into ms).
    pub fn of_histogram(histogram: &Histogram<u64>, divisor: f64) -> Option<Self> {
        if histogram.is_empty() {
            return None;
        }
        let at = |q: f64| histogram.value_at_quantile(q) as f64 / divisor;
        Some(Self {
            count: histogram.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: histogram.max() as f64 / divisor,
        })
    }
}

/// End-to-end latencies in microseconds, recorded by many consumers at once.
#[derive(Debug)]
pub struct LatencyRecorder {
    histogram: Mutex<Histogram<u64>>,
}

/// Longest latency the histogram tells apart (an hour); longer ones count as an hour.
const MAX_TRACKED_US: u64 = 3_600_000_000;

impl LatencyRecorder {
    pub fn new() -> Self {
        // Three significant digits from 1 µs to an hour: a fixed, small footprint.
        let histogram = Histogram::new_with_bounds(1, MAX_TRACKED_US, 3).expect("static histogram bounds are valid");
        Self { histogram: Mutex::new(histogram) }
    }

    pub fn record_all(&self, latencies_us: impl IntoIterator<Item = u64>) {
        let mut histogram = self.histogram.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for latency in latencies_us {
            histogram.saturating_record(latency.max(1));
        }
    }

    /// Forgets what was recorded (the warm-up).
    pub fn reset(&self) {
        self.histogram.lock().unwrap_or_else(std::sync::PoisonError::into_inner).reset();
    }

    /// Percentiles in milliseconds.
    pub fn summary_ms(&self) -> Option<Distribution> {
        Distribution::of_histogram(&self.histogram.lock().unwrap_or_else(std::sync::PoisonError::into_inner), 1000.0)
    }
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut values: Vec<u64> = (1..=100).rev().collect();
        let d = Distribution::of_values(&mut values).unwrap();
        assert_eq!((d.count, d.p50, d.p90, d.p99, d.max), (100, 50.0, 90.0, 99.0, 100.0));
        let d = Distribution::of_values(&mut [7]).unwrap();
        assert_eq!((d.p50, d.p99, d.max), (7.0, 7.0, 7.0));
        let d = Distribution::of_values(&mut [1, 2, 3]).unwrap();
        assert_eq!((d.p50, d.p90), (2.0, 3.0));
        assert!(Distribution::of_values(&mut []).is_none());
    }

    #[test]
    fn latencies_come_out_in_milliseconds() {
        let recorder = LatencyRecorder::new();
        assert!(recorder.summary_ms().is_none());
        recorder.record_all((1..=1000).map(|ms| ms * 1000));
        let d = recorder.summary_ms().unwrap();
        assert_eq!(d.count, 1000);
        assert!((d.p50 - 500.0).abs() < 1.0, "{d:?}");
        assert!((d.p99 - 990.0).abs() < 1.0, "{d:?}");
        assert!((d.max - 1000.0).abs() < 1.0, "{d:?}");
        recorder.reset();
        assert!(recorder.summary_ms().is_none());
    }
}
