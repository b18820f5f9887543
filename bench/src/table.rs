//! `bench table`: the JSON-lines figures of `--json` runs as one Markdown table.

use std::io::Read as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Deserialize;

/// Options of `bench table`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// JSON-lines file of figures, as `bench <name> --json` prints them (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    json: PathBuf,
}

/// One figure as `--json` prints it. `value`, `floor` and `ratio` may be `null` (JSON has no
/// NaN, and a zero floor gives a NaN ratio).
#[derive(Debug, Deserialize)]
struct Row {
    bench: String,
    case: String,
    metric: String,
    unit: String,
    value: Option<f64>,
    floor: Option<f64>,
    ratio: Option<f64>,
    better: String,
}

const HEADER: &str =
    "| bench | case | metric | value | unit | floor | ratio (value/floor) | better |\n\
                      |---|---|---|---:|---|---:|---:|---|\n";

pub(crate) fn run(args: &Args) -> Result<()> {
    let text = if args.json.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading figures from standard input")?;
        s
    } else {
        std::fs::read_to_string(&args.json)
            .with_context(|| format!("reading {}", args.json.display()))?
    };
    print!("{}", markdown(&text)?);
    Ok(())
}

/// The Markdown table of every figure in `jsonl` (blank lines skipped), in input order.
pub(crate) fn markdown(jsonl: &str) -> Result<String> {
    let mut out = String::from(HEADER);
    for (i, line) in jsonl.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: Row = serde_json::from_str(line)
            .with_context(|| format!("line {} is not a figure: {line}", i + 1))?;
        let opt = |v: Option<f64>| v.map_or_else(|| "–".to_string(), number);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            cell(&r.bench),
            cell(&r.case),
            cell(&r.metric),
            opt(r.value),
            cell(&r.unit),
            opt(r.floor),
            opt(r.ratio),
            cell(&r.better),
        ));
    }
    Ok(out)
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// Three significant digits; at 1,000 and above, a whole number with thousands separators
/// (`12,300,000`, `1,230`, `123`, `1.23`, `0.0123`).
pub(crate) fn number(v: f64) -> String {
    if !v.is_finite() {
        return "–".to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    let magnitude = v.abs().log10().floor() as i32;
    let scale = 10f64.powi(magnitude - 2);
    let rounded = (v / scale).round() * scale;
    // Rounding may carry into the next power of ten (999.6 -> 1,000).
    let magnitude = if rounded == 0.0 {
        magnitude
    } else {
        rounded.abs().log10().floor() as i32
    };
    if magnitude >= 3 {
        let digits = format!("{:.0}", rounded.abs());
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(c);
        }
        if rounded < 0.0 {
            format!("-{grouped}")
        } else {
            grouped
        }
    } else {
        let decimals = (2 - magnitude).max(0) as usize;
        format!("{rounded:.decimals$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_have_three_significant_digits() {
        assert_eq!(number(0.0), "0");
        assert_eq!(number(1.0), "1.00");
        assert_eq!(number(1.23456), "1.23");
        assert_eq!(number(0.012345), "0.0123");
        assert_eq!(number(12.345), "12.3");
        assert_eq!(number(123.45), "123");
        assert_eq!(number(999.6), "1,000");
        assert_eq!(number(1234.5), "1,230");
        assert_eq!(number(12_345_678.0), "12,300,000");
        assert_eq!(number(-45_678.0), "-45,700");
        assert_eq!(number(f64::NAN), "–");
    }

    #[test]
    fn one_row_per_figure() {
        let jsonl = r#"{"bench":"store","case":"append_64B","metric":"throughput","unit":"msgs/s","value":12345678.9,"floor":23456789.0,"ratio":0.5263,"better":"higher"}

{"bench":"store","case":"append_to_tailer_64B","metric":"p50","unit":"ns","value":412.0,"floor":98.0,"ratio":4.204,"better":"lower"}
{"bench":"x","case":"a|b","metric":"p50","unit":"ns","value":1.0,"floor":0.0,"ratio":null,"better":"lower"}
"#;
        let t = markdown(jsonl).unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(
            lines[0],
            "| bench | case | metric | value | unit | floor | ratio (value/floor) | better |"
        );
        assert_eq!(
            lines[2],
            "| store | append_64B | throughput | 12,300,000 | msgs/s | 23,500,000 | 0.526 | higher |"
        );
        assert_eq!(
            lines[3],
            "| store | append_to_tailer_64B | p50 | 412 | ns | 98.0 | 4.20 | lower |"
        );
        assert_eq!(lines[4], "| x | a\\|b | p50 | 1.00 | ns | 0 | – | lower |");
    }

    #[test]
    fn rejects_lines_that_are_not_figures() {
        assert!(markdown("not json\n").is_err());
        assert!(markdown("{\"bench\":\"x\"}\n").is_err());
    }
}
