//! `bench plot`: one SVG per latency distribution written with `--hgrm-dir`, drawn the way
//! HdrHistogram's plotter draws them: latency (log scale) against percentile on a
//! `1/(1-percentile)` log axis, so 50 %, 90 %, 99 %, 99.9 %, 99.99 % are evenly spaced. The
//! figure and its floor are the two series.
//!
//! Text is written as SVG `<text>` elements (plotters without its font features), so no font
//! library is linked and the viewer's sans-serif renders it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use plotters::prelude::*;

use crate::hgrm::{self, Distribution};

/// Options of `bench plot`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Directory of `X.hgrm` / `X.floor.hgrm` pairs, as `--hgrm-dir` writes them.
    #[arg(long, value_name = "DIR")]
    hgrm_dir: PathBuf,
    /// Directory for the SVGs (`X.svg`), created if missing.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// The series colours: the figure, its floor.
const FIGURE: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const FLOOR: RGBColor = RGBColor(0x1f, 0x77, 0xb4);

pub(crate) fn run(args: &Args) -> Result<()> {
    let pairs = pairs(&args.hgrm_dir)?;
    if pairs.is_empty() {
        bail!(
            "no X.hgrm with a matching X.floor.hgrm in {}",
            args.hgrm_dir.display()
        );
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    for stem in pairs {
        let figure = hgrm::read_file(&args.hgrm_dir.join(format!("{stem}.hgrm")))?;
        let floor = hgrm::read_file(&args.hgrm_dir.join(format!("{stem}.floor.hgrm")))?;
        let svg = args.out.join(format!("{stem}.svg"));
        draw(&svg, &stem, &figure, &floor)?;
        println!("{}", svg.display());
    }
    Ok(())
}

/// Stems `X` of every `X.hgrm` in `dir` that has an `X.floor.hgrm`, sorted.
fn pairs(dir: &Path) -> Result<Vec<String>> {
    let mut stems = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".hgrm") else {
            continue;
        };
        if stem.ends_with(".floor") {
            continue;
        }
        if dir.join(format!("{stem}.floor.hgrm")).is_file() {
            stems.push(stem.to_string());
        }
    }
    stems.sort();
    Ok(stems)
}

/// `(1/(1-p), value)` of every row below 100 % (whose x is infinite), values at least 1 for the
/// log axis.
fn points(d: &Distribution) -> Vec<(f64, f64)> {
    d.rows
        .iter()
        .filter(|r| r.percentile < 1.0)
        .map(|r| (1.0 / (1.0 - r.percentile), r.value.max(1.0)))
        .collect()
}

/// The percentile label of an x position: 2 -> 50%, 10 -> 90%, 1000 -> 99.9%.
fn percentile_label(x: f64) -> String {
    let decimals = (x.log10().round() as i32 - 2).max(0) as usize;
    format!("{:.decimals$}%", 100.0 * (1.0 - 1.0 / x))
}

/// Latency tick labels: 500, 1k, 20k, 3M ns.
fn ns_label(v: f64) -> String {
    let (div, suffix) = if v >= 1e9 {
        (1e9, "G")
    } else if v >= 1e6 {
        (1e6, "M")
    } else if v >= 1e3 {
        (1e3, "k")
    } else {
        (1.0, "")
    };
    let s = format!("{:.2}", v / div);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{suffix}")
}

fn draw(path: &Path, title: &str, figure: &Distribution, floor: &Distribution) -> Result<()> {
    let fig = points(figure);
    let flo = points(floor);
    let all = || fig.iter().chain(&flo);
    // x from 0 % to at least 99.99 %, further in decades if the data goes further.
    let max_x = all().map(|p| p.0).fold(1.0, f64::max);
    let decades = (max_x.log10().ceil() as i32).max(4);
    let x_end = 10f64.powi(decades);
    let mut x_keys = vec![1.0, 2.0];
    x_keys.extend((1..=decades).map(|d| 10f64.powi(d)));
    // y spans whole decades around every value.
    let min_y = all().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let max_y = all().map(|p| p.1).fold(1.0, f64::max);
    let min_y = if min_y.is_finite() { min_y } else { 1.0 };
    let y_start = 10f64.powi(min_y.log10().floor() as i32);
    let y_end = 10f64.powi((max_y.log10().floor() as i32) + 1);

    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title}: latency by percentile"),
            ("sans-serif", 22),
        )
        .margin(16)
        .margin_right(40)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            (1f64..x_end).log_scale().with_key_points(x_keys),
            (y_start..y_end).log_scale(),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ns)")
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .x_label_formatter(&|x| percentile_label(*x))
        .y_label_formatter(&|y| ns_label(*y))
        .draw()
        .map_err(|e| err(&e))?;
    for (series, name, colour) in [(&fig, title, FIGURE), (&flo, "floor", FLOOR)] {
        chart
            .draw_series(LineSeries::new(
                series.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(percentile_label(1.0), "0%");
        assert_eq!(percentile_label(2.0), "50%");
        assert_eq!(percentile_label(10.0), "90%");
        assert_eq!(percentile_label(100.0), "99%");
        assert_eq!(percentile_label(1000.0), "99.9%");
        assert_eq!(percentile_label(10_000.0), "99.99%");
        assert_eq!(percentile_label(100_000.0), "99.999%");
        assert_eq!(ns_label(500.0), "500");
        assert_eq!(ns_label(1000.0), "1k");
        assert_eq!(ns_label(25_000.0), "25k");
        assert_eq!(ns_label(3_000_000.0), "3M");
    }

    #[test]
    fn draws_both_series() {
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        let mut f = h.clone();
        for i in 0..2_000u64 {
            h.record(500 + i % 700).unwrap();
            f.record(90 + i % 40).unwrap();
        }
        h.record(2_000_000).unwrap();
        let dir = tempfile::tempdir().unwrap();
        hgrm::write_file(&dir.path().join("t_case.hgrm"), &h).unwrap();
        hgrm::write_file(&dir.path().join("t_case.floor.hgrm"), &f).unwrap();
        hgrm::write_file(&dir.path().join("lonely.hgrm"), &h).unwrap();
        assert_eq!(pairs(dir.path()).unwrap(), vec!["t_case".to_string()]);
        let out = dir.path().join("svg");
        run(&Args {
            hgrm_dir: dir.path().to_path_buf(),
            out: out.clone(),
        })
        .unwrap();
        let svg = std::fs::read_to_string(out.join("t_case.svg")).unwrap();
        assert!(svg.contains("t_case: latency by percentile"));
        assert!(svg.contains("99.9%"));
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .map(|t| {
                t.split_once('>')
                    .unwrap()
                    .1
                    .split("</text>")
                    .next()
                    .unwrap()
                    .trim()
            })
            .collect();
        for label in ["50%", "90%", "99%", "99.9%", "99.99%", "t_case", "floor"] {
            assert!(texts.contains(&label), "{label} not in {texts:?}");
        }
        // Each series is a polyline in its colour, plus its legend line.
        for colour in ["#D62728", "#1F77B4"] {
            let lines = svg.matches(&format!("stroke=\"{colour}\"")).count();
            assert_eq!(lines, 2, "{colour}");
        }
    }
}
