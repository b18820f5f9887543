//! The output shape of seqstream's benchmarks (`bench/src/report.rs`): one figure next to the
//! floor measured in the same run and their ratio, as an aligned line or, with `--json`, one
//! JSON object per line with the keys `bench`, `case`, `metric`, `unit`, `value`, `floor`,
//! `ratio` (value / floor) and `better`, which `bench table --json FILE` reads.

use hdrhistogram::Histogram;
use serde::Serialize;

/// The `bench` key of every figure.
const BENCH: &str = "aeron";

/// One measured latency figure and its floor, ns.
#[derive(Debug, Clone, Serialize)]
struct Figure<'a> {
    bench: &'static str,
    case: &'a str,
    metric: &'static str,
    unit: &'static str,
    value: f64,
    floor: f64,
    ratio: f64,
    /// Always `"lower"`: these are latencies.
    better: &'static str,
}

/// Prints figures in human or JSON-lines form.
pub(crate) struct Reporter {
    pub(crate) json: bool,
}

impl Reporter {
    /// p50, p99, p99.9 and max of `value` next to the same percentiles of `floor` (both ns).
    pub(crate) fn emit_percentiles(
        &self,
        case: &str,
        value: &Histogram<u64>,
        floor: &Histogram<u64>,
    ) {
        for (metric, q) in [("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999), ("max", 1.0)] {
            let (v, f) = (
                value.value_at_quantile(q) as f64,
                floor.value_at_quantile(q) as f64,
            );
            self.emit(&Figure {
                bench: BENCH,
                case,
                metric,
                unit: "ns",
                value: v,
                floor: f,
                ratio: if f != 0.0 { v / f } else { f64::NAN },
                better: "lower",
            });
        }
    }

    fn emit(&self, f: &Figure<'_>) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string(f).expect("a Figure always serializes")
            );
        } else {
            println!(
                "{:<10} {:<28} {:<10} {:>14.3} {:<7} floor {:>14.3}  ratio {:>7.3} ({} is better)",
                f.bench, f.case, f.metric, f.value, f.unit, f.floor, f.ratio, f.better
            );
        }
    }
}
