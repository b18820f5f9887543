//! Latency percentiles as the summaries print them, from an HdrHistogram of ns.

use hdrhistogram::Histogram;

/// Percentiles of a latency distribution, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Median, ns.
    pub p50: u64,
    /// 99th percentile, ns.
    pub p99: u64,
    /// 99.9th percentile, ns.
    pub p999: u64,
    /// Largest sample, ns.
    pub max: u64,
}

impl Percentiles {
    /// The percentiles of `h` (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: h.len(),
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// A histogram for latencies from 1 ns to 60 s at 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

impl std::fmt::Display for Percentiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = |ns: u64| ns as f64 / 1000.0;
        write!(
            f,
            "p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs ({} samples)",
            us(self.p50),
            us(self.p99),
            us(self.p999),
            us(self.max),
            self.count
        )
    }
}
