//! The benchmarks run end to end (in their short `--quick` form) and print the documented
//! JSON shape. No figure is judged here: speed is measured by the benchmarks, never by tests.

use std::ffi::OsStr;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one bench run may take. A `--quick` run takes under a minute here with every
/// smoke test running at once on 2 cores; one that hangs fails its test instead of the suite.
const BOUND: Duration = Duration::from_secs(600);

/// What `bench args` printed on stdout; the test fails if it failed or ran past [`BOUND`].
fn bench<S: AsRef<OsStr> + std::fmt::Debug>(args: &[S]) -> String {
    let out = seqstream_testkit::output_within(
        Command::new(env!("CARGO_BIN_EXE_bench")).args(args),
        BOUND,
    )
    .unwrap_or_else(|e| panic!("bench {args:?}: {e}"));
    assert!(
        out.status.success(),
        "bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn run_json(args: &[&str]) -> Vec<serde_json::Value> {
    bench(&[args, &["--json"]].concat())
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

/// Each figure as `case/metric`.
fn case_metrics(figures: &[serde_json::Value]) -> Vec<String> {
    figures
        .iter()
        .map(|f| {
            format!(
                "{}/{}",
                f["case"].as_str().unwrap(),
                f["metric"].as_str().unwrap()
            )
        })
        .collect()
}

fn check_shape(figures: &[serde_json::Value], bench: &str) {
    assert!(!figures.is_empty());
    for f in figures {
        assert_eq!(f["bench"], bench, "{f}");
        for key in ["case", "metric", "unit"] {
            assert!(f[key].is_string(), "{key} in {f}");
        }
        let (value, floor, ratio) = (
            f["value"].as_f64().unwrap(),
            f["floor"].as_f64().unwrap(),
            f["ratio"].as_f64().unwrap(),
        );
        // A cost is a difference of two p50s measured apart: on a noisy machine it can come
        // out at 0 (the bench clamps a negative difference there).
        let may_be_zero = f["case"].as_str().is_some_and(|c| c.contains("_cost_"));
        assert!(
            (value > 0.0 || (may_be_zero && value == 0.0)) && floor > 0.0,
            "{f}"
        );
        assert!(
            (ratio - value / floor).abs() <= 1e-9 * ratio.abs().max(1.0),
            "{f}"
        );
        assert!(f["better"] == "higher" || f["better"] == "lower", "{f}");
    }
}

#[test]
fn store_bench_prints_every_case_with_its_floor() {
    let figures = run_json(&["store", "--quick"]);
    check_shape(&figures, "store");
    let cases = case_metrics(&figures);
    for payload in [32, 64, 256, 1024] {
        assert!(
            cases.contains(&format!("append_{payload}B/throughput")),
            "{cases:?}"
        );
        assert!(
            cases.contains(&format!("append_{payload}B/bandwidth")),
            "{cases:?}"
        );
        assert!(
            cases.contains(&format!("append_{payload}B/throughput_stamped_by_caller")),
            "{cases:?}"
        );
        for metric in ["three_lanes", "crate"] {
            assert!(
                cases.contains(&format!("crc32c_{payload}B/{metric}")),
                "{cases:?}"
            );
        }
    }
    for metric in ["p50", "p99", "p99.9", "max"] {
        assert!(
            cases.contains(&format!("append_to_tailer_64B/{metric}")),
            "{cases:?}"
        );
    }
    for case in ["open_sealed_16MiB", "open_sealed_recorded_16MiB"] {
        assert!(cases.contains(&format!("{case}/time")), "{cases:?}");
    }
}

#[test]
fn replication_bench_prints_latency_and_throughput_with_floors() {
    let figures = run_json(&["replication", "--quick"]);
    check_shape(&figures, "replication");
    let cases: Vec<String> = figures
        .iter()
        .map(|f| {
            format!(
                "{}/{}/{}",
                f["case"].as_str().unwrap(),
                f["metric"].as_str().unwrap(),
                f["unit"].as_str().unwrap()
            )
        })
        .collect();
    for n in [1, 2] {
        assert!(
            cases.contains(&format!("append_to_replica_64B_{n}f/p50/ns")),
            "{cases:?}"
        );
        assert!(
            cases.contains(&format!("stream_64B_{n}f/throughput/GB/s")),
            "{cases:?}"
        );
        assert!(
            cases.contains(&format!("catch_up_64B_{n}f/throughput/msgs/s")),
            "{cases:?}"
        );
    }
    assert!(cases.contains(&"append_to_replica_64B_beside_slow_peer/p99/ns".to_string()));
    assert!(cases.contains(&"append_to_replica_64B_1f_invoker/p50/ns".to_string()));
}

#[test]
fn sbe_bench_prints_encode_and_decode_with_floors() {
    let figures = run_json(&["sbe", "--iterations", "20000", "--runs", "1"]);
    check_shape(&figures, "sbe");
    assert_eq!(figures.len(), 6);
}

#[test]
fn composite_bench_prints_latency_and_merge_throughput() {
    let figures = run_json(&["composite", "--quick"]);
    check_shape(&figures, "composite");
    let cases = case_metrics(&figures);
    for case in [
        "component_to_composite_64B/p50",
        "component_to_composite_64B_invoker/p50",
        "merge_2x64B_arrival/throughput",
        "merge_2x64B_timestamp/throughput",
    ] {
        assert!(cases.contains(&case.to_string()), "{cases:?}");
    }
}

#[test]
fn inbound_bench_prints_latency_and_throughput_with_floors() {
    let figures = run_json(&["inbound", "--quick"]);
    check_shape(&figures, "inbound");
    let cases = case_metrics(&figures);
    for m in ["p50", "p99", "p99.9", "max", "throughput"] {
        assert!(
            cases.contains(&format!("offer_to_committed_64B/{m}")),
            "{cases:?}"
        );
    }
    assert!(cases.contains(&"offer_to_committed_64B_invoker/p50".to_string()));
}

#[test]
fn feeds_bench_prints_every_case_with_its_floor() {
    let figures = run_json(&["feeds", "--quick"]);
    check_shape(&figures, "feeds");
    let cases: Vec<&str> = figures
        .iter()
        .map(|f| {
            assert_eq!(
                (&f["metric"], &f["unit"]),
                (&"mean".into(), &"ns".into()),
                "{f}"
            );
            f["case"].as_str().unwrap()
        })
        .collect();
    // The message types of the vendored captures, then the synthetic mix and the FIX cases.
    for t in ["A", "D", "E", "H", "I", "L", "U"] {
        assert!(
            cases.contains(&format!("itch_decode_{t}").as_str()),
            "{cases:?}"
        );
    }
    for case in [
        "itch_decode_mix",
        "itch_book_apply_mix",
        "fix_parse_nos",
        "fix_parse_er",
        "fix_parse_log",
        "fix_to_sbe_nos",
    ] {
        assert!(cases.contains(&case), "{cases:?}");
    }
}

/// `--hgrm-dir`, `bench plot` and `bench table` end to end on the quickest latency bench.
#[test]
fn hgrm_plot_and_table_report_a_latency_bench() {
    let dir = tempfile::tempdir().unwrap();
    let hgrm = dir.path().join("hgrm");
    let plots = dir.path().join("plots");
    let figures = bench(&[
        "store".as_ref(),
        "--quick".as_ref(),
        "--payloads".as_ref(),
        "32".as_ref(),
        "--json".as_ref(),
        "--hgrm-dir".as_ref(),
        hgrm.as_os_str(),
    ]);
    let n = figures.lines().count();
    assert!(n >= 4, "{figures}");
    let jsonl = dir.path().join("figures.jsonl");
    std::fs::write(&jsonl, &figures).unwrap();

    // The distribution and its floor, in HdrHistogram's percentile-distribution format.
    for name in [
        "store_append_to_tailer_64B.hgrm",
        "store_append_to_tailer_64B.floor.hgrm",
    ] {
        let text = std::fs::read_to_string(hgrm.join(name)).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
            ["Value", "Percentile", "TotalCount", "1/(1-Percentile)"]
        );
        let mut rows = 0;
        let mut last_total = 0u64;
        let mut footer_total = None;
        for line in lines.filter(|l| !l.trim().is_empty()) {
            if let Some(rest) = line.strip_prefix("#[Max") {
                let total = rest.split("Total count").nth(1).unwrap();
                footer_total = Some(
                    total
                        .trim_matches(|c: char| c == '=' || c == ']' || c.is_whitespace())
                        .parse::<u64>()
                        .unwrap(),
                );
            } else if !line.starts_with("#[") {
                let cols: Vec<&str> = line.split_whitespace().collect();
                assert!(cols.len() == 3 || cols.len() == 4, "{name}: {line}");
                let value: f64 = cols[0].parse().unwrap();
                let percentile: f64 = cols[1].parse().unwrap();
                let total: u64 = cols[2].parse().unwrap();
                assert!(value >= 0.0 && (0.0..=1.0).contains(&percentile), "{line}");
                assert!(total >= last_total, "{line}");
                last_total = total;
                rows += 1;
            }
        }
        assert!(rows > 20, "{name}: {rows} rows");
        assert_eq!(footer_total, Some(last_total), "{name}");
        assert!(last_total > 0);
    }

    // One SVG per pair, with both series.
    bench(&[
        "plot".as_ref(),
        "--hgrm-dir".as_ref(),
        hgrm.as_os_str(),
        "--out".as_ref(),
        plots.as_os_str(),
    ]);
    let svgs: Vec<_> = std::fs::read_dir(&plots).unwrap().collect();
    assert_eq!(svgs.len(), 1, "{svgs:?}");
    let svg = std::fs::read_to_string(plots.join("store_append_to_tailer_64B.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let series = svg
        .split("<polyline")
        .skip(1)
        .map(|p| p.split('"').skip_while(|a| !a.ends_with("points=")).nth(1))
        .filter(|points| points.unwrap().split_whitespace().count() > 10)
        .count();
    assert_eq!(series, 2, "the figure and its floor");
    assert!(svg.contains("floor") && svg.contains("99.9%"));

    // A header, its separator, then one row per figure.
    let table = bench(&["table".as_ref(), "--json".as_ref(), jsonl.as_os_str()]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("| bench | case | metric | value |"),
        "{table}"
    );
    assert!(lines[1].starts_with("|---"), "{table}");
    assert_eq!(lines.len(), 2 + n, "{table}");
    assert!(
        lines[2..].iter().all(|l| l.starts_with("| store | ")),
        "{table}"
    );
}

#[test]
fn e2e_bench_prints_the_round_trips_of_every_layout_with_floors() {
    let figures = run_json(&["e2e", "--quick"]);
    check_shape(&figures, "e2e");
    let cases = case_metrics(&figures);
    for layout in ["shared", "dedicated", "split"] {
        assert!(
            cases.contains(&format!("offer_to_own_replica_64B_{layout}/p50")),
            "{cases:?}"
        );
    }
    for case in [
        "offer_to_own_replica_64B",
        "offer_to_own_replica_64B_offer_to_sequenced",
        "offer_to_own_replica_64B_sequenced_to_replica",
        "offer_to_own_replica_64B_authenticated",
        "offer_to_own_replica_64B_tls",
        "offer_to_own_replica_64B_group_immediate",
        "offer_to_own_replica_64B_group_standby_ack",
        "offer_to_own_replica_64B_one_thread",
        "offer_to_own_replica_64B_one_thread_offer_to_sequenced",
        "offer_to_own_replica_64B_one_thread_sequenced_to_replica",
        "pingpong_64B",
        "pingpong_64B_one_thread",
    ] {
        for m in ["p50", "p99", "p99.9", "max"] {
            assert!(cases.contains(&format!("{case}/{m}")), "{cases:?}");
        }
    }
    assert!(
        cases.contains(&"standby_ack_cost_64B/p50".to_string()),
        "{cases:?}"
    );
}

/// SIGTERM (or Ctrl-C) stops a bench at its next message, and the bench removes what it made:
/// its scratch directory and, as root, its network namespaces.
#[test]
fn an_interrupted_bench_removes_what_it_made() {
    let tmp = tempfile::tempdir().unwrap();
    // Far more samples than it could finish: the signal finds it measuring its first floor.
    let mut child = seqstream_testkit::KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_bench"))
            .args(["e2e", "--layout", "shared", "--samples", "100000000"])
            .env("TMPDIR", tmp.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_dir(tmp.path()).unwrap().next().is_none() {
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "bench e2e ended before it made its scratch directory"
        );
        assert!(Instant::now() < deadline, "no scratch directory in 120 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(500));
    let status = child
        .terminate(Duration::from_secs(60))
        .expect("bench e2e ended within 60 s of SIGTERM");
    let mut stderr = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        let tag = format!("se{}-", child.pid() % 100_000);
        let netns = String::from_utf8_lossy(&out.stdout);
        assert!(
            !netns.lines().any(|l| l.starts_with(&tag)),
            "namespaces left behind: {netns}"
        );
    }
}
