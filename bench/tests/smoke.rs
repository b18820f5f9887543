//! The benchmarks run end to end (in their short `--quick` form) and print the documented
//! JSON shape. No figure is judged here: speed is measured by the benchmarks, never by tests.

use std::process::Command;

fn run_json(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .arg("--json")
        .output()
        .expect("running bench");
    assert!(
        out.status.success(),
        "bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
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
        assert!(value > 0.0 && floor > 0.0, "{f}");
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
    let cases: Vec<String> = figures
        .iter()
        .map(|f| {
            format!(
                "{}/{}",
                f["case"].as_str().unwrap(),
                f["metric"].as_str().unwrap()
            )
        })
        .collect();
    for payload in [32, 64, 256, 1024] {
        assert!(
            cases.contains(&format!("append_{payload}B/throughput")),
            "{cases:?}"
        );
        assert!(
            cases.contains(&format!("append_{payload}B/bandwidth")),
            "{cases:?}"
        );
    }
    for metric in ["p50", "p99", "p99.9", "max"] {
        assert!(
            cases.contains(&format!("append_to_tailer_64B/{metric}")),
            "{cases:?}"
        );
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
    let cases: Vec<String> = figures
        .iter()
        .map(|f| {
            format!(
                "{}/{}",
                f["case"].as_str().unwrap(),
                f["metric"].as_str().unwrap()
            )
        })
        .collect();
    for case in [
        "component_to_composite_64B/p50",
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
    let cases: Vec<String> = figures
        .iter()
        .map(|f| {
            format!(
                "{}/{}",
                f["case"].as_str().unwrap(),
                f["metric"].as_str().unwrap()
            )
        })
        .collect();
    for m in ["p50", "p99", "p99.9", "max", "throughput"] {
        assert!(
            cases.contains(&format!("offer_to_committed_64B/{m}")),
            "{cases:?}"
        );
    }
}
