//! The one output shape every benchmark uses: a figure next to the floor it was measured
//! against in the same run, and their ratio.
//!
//! Human output is one aligned line per figure; `--json` prints one JSON object per line with
//! the keys `bench`, `case`, `metric`, `unit`, `value`, `floor`, `ratio` (value / floor) and
//! `better` (`"higher"` or `"lower"`).
//!
//! With an `.hgrm` directory set, every latency distribution reported with its floor is also
//! written there in full, as `<bench>_<case>.hgrm` and `<bench>_<case>.floor.hgrm` (see
//! [`crate::hgrm`]), for `bench plot`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

/// Which direction of a figure is an improvement.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Better {
    /// Throughput-like figures (msgs/s, GB/s).
    Higher,
    /// Latency-like figures (ns).
    Lower,
}

/// One measured figure and the floor measured beside it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Figure {
    /// Benchmark name, e.g. `store`.
    pub bench: &'static str,
    /// Case within the benchmark, e.g. `append_64B`.
    pub case: String,
    /// What was measured, e.g. `throughput` or `p50`.
    pub metric: &'static str,
    /// Unit of `value` and `floor`, e.g. `msgs/s`, `GB/s`, `ns`.
    pub unit: &'static str,
    /// The measured figure.
    pub value: f64,
    /// The floor measured in the same run, in the same unit.
    pub floor: f64,
    /// `value / floor`.
    pub ratio: f64,
    /// Which direction is better.
    pub better: Better,
}

impl Figure {
    /// Builds a figure; the ratio is derived, never passed in.
    pub(crate) fn new(
        bench: &'static str,
        case: impl Into<String>,
        metric: &'static str,
        unit: &'static str,
        value: f64,
        floor: f64,
        better: Better,
    ) -> Self {
        let ratio = if floor != 0.0 {
            value / floor
        } else {
            f64::NAN
        };
        Figure {
            bench,
            case: case.into(),
            metric,
            unit,
            value,
            floor,
            ratio,
            better,
        }
    }
}

/// Prints figures as they are measured, in human or JSON-lines form.
#[derive(Debug, Clone)]
pub(crate) struct Reporter {
    json: bool,
    hgrm_dir: Option<PathBuf>,
}

impl Reporter {
    /// `json == true` prints one JSON object per line; otherwise an aligned table row.
    /// `hgrm_dir`: where [`emit_percentiles`] also writes whole distributions (created if
    /// missing).
    pub(crate) fn new(json: bool, hgrm_dir: Option<PathBuf>) -> Result<Self> {
        if let Some(dir) = &hgrm_dir {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the .hgrm directory {}", dir.display()))?;
        }
        Ok(Reporter { json, hgrm_dir })
    }

    /// Where distributions are written, if anywhere.
    pub(crate) fn hgrm_dir(&self) -> Option<&Path> {
        self.hgrm_dir.as_deref()
    }

    /// Prints one figure immediately (so a long run shows progress).
    pub(crate) fn emit(&self, f: &Figure) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string(f).expect("a Figure always serializes")
            );
        } else {
            println!(
                "{:<10} {:<28} {:<10} {:>14.3} {:<7} floor {:>14.3}  ratio {:>7.3} ({} is better)",
                f.bench,
                f.case,
                f.metric,
                f.value,
                f.unit,
                f.floor,
                f.ratio,
                match f.better {
                    Better::Higher => "higher",
                    Better::Lower => "lower",
                }
            );
        }
    }
}

/// File name stem of a case's distributions: `<bench>_<case>`, anything but ASCII letters,
/// digits, `.`, `-` and `_` replaced by `_`.
pub(crate) fn hgrm_stem(bench: &str, case: &str) -> String {
    format!("{bench}_{case}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Emits p50, p99, p99.9 and max of a latency histogram (ns) next to the same percentiles of
/// its floor's, and writes both distributions as `.hgrm` files if the reporter has a
/// directory for them.
pub(crate) fn emit_percentiles(
    reporter: &Reporter,
    bench: &'static str,
    case: &str,
    value: &hdrhistogram::Histogram<u64>,
    floor: &hdrhistogram::Histogram<u64>,
) -> Result<()> {
    if let Some(dir) = reporter.hgrm_dir() {
        let stem = hgrm_stem(bench, case);
        crate::hgrm::write_file(&dir.join(format!("{stem}.hgrm")), value)?;
        crate::hgrm::write_file(&dir.join(format!("{stem}.floor.hgrm")), floor)?;
    }
    for (metric, q) in [("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999), ("max", 1.0)] {
        reporter.emit(&Figure::new(
            bench,
            case,
            metric,
            "ns",
            value.value_at_quantile(q) as f64,
            floor.value_at_quantile(q) as f64,
            Better::Lower,
        ));
    }
    Ok(())
}
