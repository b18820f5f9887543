//! HdrHistogram's classic text "percentile distribution" (`.hgrm`), the format Java's
//! `Histogram.outputPercentileDistribution` prints and the HdrHistogram plotters read:
//!
//! ```text
//!        Value     Percentile TotalCount 1/(1-Percentile)
//!
//!      412.000 0.000000000000          1           1.00
//!      ...
//!     9855.000 1.000000000000       5000
//! #[Mean    =      601.093, StdDeviation   =      270.611]
//! #[Max     =     9855.000, Total count    =         5000]
//! #[Buckets =           29, SubBuckets     =         2048]
//! ```
//!
//! One row per percentile tick ([`TICKS_PER_HALF_DISTANCE`] per half distance to 100 %),
//! values unscaled (our histograms hold ns, so the files hold ns), printed with as many
//! decimals as the histogram has significant digits, like Java's.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use hdrhistogram::Histogram;

/// Percentile ticks per half distance to 100 %, HdrHistogram's usual choice.
pub(crate) const TICKS_PER_HALF_DISTANCE: u32 = 5;

/// One row of a percentile distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Row {
    /// The value (ns) at or below which `percentile` of the samples lie.
    pub value: f64,
    /// As a fraction, 0.0 ..= 1.0 (the file's `Percentile` column).
    pub percentile: f64,
    /// Samples at or below `value`.
    pub total_count: u64,
}

/// A parsed `.hgrm` file: its rows and its footer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Distribution {
    pub rows: Vec<Row>,
    pub mean: f64,
    pub std_deviation: f64,
    pub max: f64,
    pub total_count: u64,
    pub buckets: u64,
    pub sub_buckets: u64,
}

/// HdrHistogram's sub-bucket count for a number of significant digits (the crate keeps its own
/// private): the power of two at or above `2 * 10^sigfig`.
fn sub_bucket_count(sigfig: u8) -> u64 {
    (2 * 10u64.pow(u32::from(sigfig))).next_power_of_two()
}

/// Formats `h` as a percentile distribution.
pub(crate) fn format(h: &Histogram<u64>, ticks_per_half_distance: u32) -> String {
    let p = usize::from(h.sigfig());
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "{:>12} {:>14} {:>10} {:>14}\n\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total = 0u64;
    for v in h.iter_quantiles(ticks_per_half_distance) {
        total += v.count_since_last_iteration();
        let q = v.quantile_iterated_to();
        let value = v.value_iterated_to() as f64;
        if q < 1.0 {
            let _ = writeln!(
                out,
                "{value:12.p$} {q:2.12} {total:10} {:14.2}",
                1.0 / (1.0 - q)
            );
        } else {
            let _ = writeln!(out, "{value:12.p$} {q:2.12} {total:10}");
        }
    }
    let _ = writeln!(
        out,
        "#[Mean    = {:12.p$}, StdDeviation   = {:12.p$}]",
        h.mean(),
        h.stdev()
    );
    let _ = writeln!(
        out,
        "#[Max     = {:12.p$}, Total count    = {:12}]",
        h.max() as f64,
        h.len()
    );
    let _ = writeln!(
        out,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        h.buckets(),
        sub_bucket_count(h.sigfig())
    );
    out
}

/// Writes `h` to `path` in the `.hgrm` format.
pub(crate) fn write_file(path: &Path, h: &Histogram<u64>) -> Result<()> {
    std::fs::write(path, format(h, TICKS_PER_HALF_DISTANCE))
        .with_context(|| format!("writing {}", path.display()))
}

/// Parses a percentile distribution (ours or Java's).
pub(crate) fn parse(text: &str) -> Result<Distribution> {
    let mut rows = Vec::new();
    let mut footer = std::collections::HashMap::<String, String>::new();
    let mut saw_header = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        let at = || format!("line {}: {line:?}", i + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(inner) = line.strip_prefix("#[") {
            let inner = inner.strip_suffix(']').with_context(at)?;
            for pair in inner.split(',') {
                let (k, v) = pair.split_once('=').with_context(at)?;
                footer.insert(k.trim().to_string(), v.trim().to_string());
            }
            continue;
        }
        if line.starts_with("Value") {
            saw_header = true;
            continue;
        }
        ensure!(saw_header, "{}: a row before the header", at());
        let cols: Vec<&str> = line.split_whitespace().collect();
        ensure!(cols.len() == 3 || cols.len() == 4, "{}: not a row", at());
        rows.push(Row {
            value: cols[0].parse().with_context(at)?,
            percentile: cols[1].parse().with_context(at)?,
            total_count: cols[2].parse().with_context(at)?,
        });
    }
    if !saw_header {
        bail!("no `Value Percentile TotalCount 1/(1-Percentile)` header");
    }
    let get = |k: &str| -> Result<&str> {
        footer
            .get(k)
            .map(String::as_str)
            .with_context(|| format!("no `{k}` in the footer"))
    };
    Ok(Distribution {
        rows,
        mean: get("Mean")?.parse()?,
        std_deviation: get("StdDeviation")?.parse()?,
        max: get("Max")?.parse()?,
        total_count: get("Total count")?.parse()?,
        buckets: get("Buckets")?.parse()?,
        sub_buckets: get("SubBuckets")?.parse()?,
    })
}

/// Reads and parses a `.hgrm` file.
pub(crate) fn read_file(path: &Path) -> Result<Distribution> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text).with_context(|| format!("parsing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Histogram<u64> {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        // A long-tailed latency-like distribution: mostly 400-1,400 ns, a few far outliers.
        for i in 0..10_000u64 {
            h.record(400 + (i * 7919) % 1000).unwrap();
        }
        for v in [25_000, 80_000, 1_500_000] {
            h.record(v).unwrap();
        }
        h
    }

    #[test]
    fn parses_back_what_it_writes() {
        let h = sample();
        let text = format(&h, TICKS_PER_HALF_DISTANCE);
        let d = parse(&text).unwrap();

        let expected: Vec<_> = h.iter_quantiles(TICKS_PER_HALF_DISTANCE).collect();
        assert_eq!(d.rows.len(), expected.len());
        let mut total = 0;
        for (row, v) in d.rows.iter().zip(&expected) {
            total += v.count_since_last_iteration();
            assert_eq!(row.value, v.value_iterated_to() as f64);
            assert!((row.percentile - v.quantile_iterated_to()).abs() < 1e-12);
            assert_eq!(row.total_count, total);
        }
        assert_eq!(d.rows[0].percentile, 0.0);
        // 5 ticks per half distance: 0 %, 10 %, 20 %, ...
        assert!((d.rows[1].percentile - 0.1).abs() < 1e-12);
        let last = d.rows.last().unwrap();
        assert_eq!(last.percentile, 1.0);
        assert_eq!(last.total_count, h.len());
        assert_eq!(last.value, h.max() as f64);
        // Rows are monotonic.
        for w in d.rows.windows(2) {
            assert!(w[0].value <= w[1].value && w[0].percentile <= w[1].percentile);
        }

        assert_eq!(d.total_count, h.len());
        assert_eq!(d.max, h.max() as f64);
        assert!((d.mean - h.mean()).abs() < 1e-3);
        assert!((d.std_deviation - h.stdev()).abs() < 1e-3);
        assert_eq!(d.buckets, u64::from(h.buckets()));
        assert_eq!(d.sub_buckets, 2048);
    }

    #[test]
    fn writes_the_classic_layout() {
        let text = format(&sample(), TICKS_PER_HALF_DISTANCE);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "       Value     Percentile TotalCount 1/(1-Percentile)"
        );
        assert_eq!(lines[1], "");
        // Value with 3 decimals (3 significant digits), 12-digit percentile, count, 1/(1-p).
        let first: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(first.len(), 4, "{}", lines[2]);
        assert_eq!(first[0], "400.000");
        assert_eq!(first[1], "0.000000000000");
        assert_eq!(first[3], "1.00");
        let n = lines.len();
        assert!(lines[n - 3].starts_with("#[Mean    = "), "{}", lines[n - 3]);
        assert!(lines[n - 2].starts_with("#[Max     = "), "{}", lines[n - 2]);
        assert!(lines[n - 2].ends_with("Total count    =        10003]"));
        assert!(lines[n - 1].starts_with("#[Buckets = "), "{}", lines[n - 1]);
        // The 100 % row has no 1/(1-Percentile).
        assert_eq!(
            lines[n - 4].split_whitespace().count(),
            3,
            "{}",
            lines[n - 4]
        );
    }

    #[test]
    fn parses_a_java_sample() {
        // Abridged from HdrHistogram's own documentation (values in ms, scaled).
        let java = "       Value     Percentile TotalCount 1/(1-Percentile)\n\
                    \n\
                    \x20     0.143 0.000000000000          1           1.00\n\
                    \x20     0.215 0.500000000000       4985           2.00\n\
                    \x20    31.375 1.000000000000      10000\n\
                    #[Mean    =        0.296, StdDeviation   =        0.989]\n\
                    #[Max     =       31.359, Total count    =        10000]\n\
                    #[Buckets =           27, SubBuckets     =         2048]\n";
        let d = parse(java).unwrap();
        assert_eq!(d.rows.len(), 3);
        assert_eq!(d.rows[1].value, 0.215);
        assert_eq!(d.rows[2].total_count, 10_000);
        assert_eq!(d.max, 31.359);
        assert_eq!(d.buckets, 27);
    }

    #[test]
    fn rejects_what_is_not_a_distribution() {
        assert!(parse("").is_err());
        assert!(parse("hello\n").is_err());
        assert!(parse("       Value     Percentile TotalCount 1/(1-Percentile)\n1 x 2\n").is_err());
    }
}
