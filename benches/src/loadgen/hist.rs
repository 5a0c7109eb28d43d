//! A lock-free, log-linear latency histogram (HDR-style, about 3 % resolution).
//!
//! # Key Components
//! - [`Histogram`]: `record(µs)` is three relaxed atomic adds and a max; shared by every task of
//!   a run, so nothing is merged or allocated per sample.
//! - [`Summary`]: count, mean, p50 / p90 / p99 / p99.9 and max, in milliseconds.
//!
//! Values below 32 µs get a bucket each; above, every power of two is split into 32 buckets, so
//! a reported percentile is within about 3 % of the true sample.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

/// Sub-buckets per power of two: `2^SUB_BITS`.
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Largest recordable value: `2^MAX_BITS` µs (about 19 hours); larger values are clamped.
const MAX_BITS: u32 = 36;
const BUCKETS: usize = ((MAX_BITS - SUB_BITS + 1) as usize + 1) * SUB as usize;

/// Concurrent histogram of microsecond values.
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count.load(Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }
}

/// Percentiles of a histogram, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Summary {
    /// Samples recorded.
    pub count: u64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

fn index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let v = v.min((1u64 << MAX_BITS) - 1);
    let top = 63 - v.leading_zeros(); // >= SUB_BITS
    let sub = (v >> (top - SUB_BITS)) & (SUB - 1);
    ((top - SUB_BITS + 1) as usize) * SUB as usize + sub as usize
}

/// The middle of bucket `i`, in µs.
fn value_of(i: usize) -> f64 {
    let i = i as u64;
    if i < SUB {
        return i as f64;
    }
    let top = i / SUB + u64::from(SUB_BITS) - 1;
    let sub = i % SUB;
    let width = 1u64 << (top - u64::from(SUB_BITS));
    let low = (1u64 << top) + sub * width;
    low as f64 + (width as f64 - 1.0) / 2.0
}

// === impl Histogram ===

impl Histogram {
    /// Records one value in microseconds.
    #[inline]
    pub fn record(&self, micros: u64) {
        self.buckets[index(micros)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum.fetch_add(micros, Relaxed);
        self.max.fetch_max(micros, Relaxed);
    }

    /// Records a duration.
    #[inline]
    pub fn record_duration(&self, d: std::time::Duration) {
        self.record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    /// Samples recorded so far.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// The value (µs) at quantile `q` in `0.0..=1.0`; 0 when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        let count = self.count();
        if count == 0 {
            return 0.0;
        }
        let rank = ((q.clamp(0.0, 1.0) * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Relaxed);
            if seen >= rank {
                return value_of(i).min(self.max.load(Relaxed) as f64);
            }
        }
        self.max.load(Relaxed) as f64
    }

    /// Count, mean and percentiles, converted to milliseconds.
    pub fn summary(&self) -> Summary {
        let count = self.count();
        if count == 0 {
            return Summary::default();
        }
        let ms = |us: f64| us / 1000.0;
        Summary {
            count,
            mean: ms(self.sum.load(Relaxed) as f64 / count as f64),
            p50: ms(self.quantile(0.50)),
            p90: ms(self.quantile(0.90)),
            p99: ms(self.quantile(0.99)),
            p999: ms(self.quantile(0.999)),
            max: ms(self.max.load(Relaxed) as f64),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..5_000_000u64).step_by(997) {
            let i = index(v);
            assert!(i >= last);
            last = i;
            let mid = value_of(i);
            assert!(
                (mid - v as f64).abs() <= (v as f64 * 0.035).max(0.5),
                "{v} -> {mid}"
            );
        }
        assert!(index(u64::MAX) < BUCKETS);
    }

    #[test]
    fn percentiles() {
        let h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50 - 500.0).abs() < 15.0, "{s:?}");
        assert!((s.p99 - 990.0).abs() < 30.0, "{s:?}");
        assert_eq!(s.max, 1000.0);
        assert!((s.mean - 500.5).abs() < 0.01);
    }
}
