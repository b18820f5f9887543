//! One appender process, two tailer processes following it live (`storetool tail -f`), all
//! through the shared mappings: both tailers see every frame, exactly once, in order.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{storetool, KillOnDrop};

#[test]
fn appender_and_two_tailers_in_three_processes() {
    const N: u64 = 50_000;
    let dir = tempfile::tempdir().unwrap();
    // Create the store first so the tailers have something to open.
    let created = Command::new(storetool())
        .args(["append", "--count", "1", "--segment-size", "65536"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(created.status.success());

    let tailer = || {
        KillOnDrop(
            Command::new(storetool())
                .args(["tail", "-f", "--from-seq", "1", "--json", "--check-pattern"])
                .args(["--until-seq", &N.to_string()])
                .arg(dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    };
    let t1 = tailer();
    let t2 = tailer();
    let writer = KillOnDrop(
        Command::new(storetool())
            .args(["append", "--count", &(N - 1).to_string()])
            .args([
                "--min-size",
                "8",
                "--max-size",
                "512",
                "--segment-size",
                "65536",
            ])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Drain the pipes while the processes run, so no child ever blocks on a full pipe.
    let drain = |child: &mut KillOnDrop| {
        let mut out = child.0.stdout.take();
        let mut err = child.0.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut o = String::new();
            if let Some(out) = out.as_mut() {
                std::io::Read::read_to_string(out, &mut o).unwrap();
            }
            let mut e = String::new();
            std::io::Read::read_to_string(&mut err, &mut e).unwrap();
            (o, e)
        })
    };
    let mut children = [writer, t1, t2];
    let outputs: Vec<_> = children.iter_mut().map(drain).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    for (k, (child, output)) in children.iter_mut().zip(outputs).enumerate() {
        let status = loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "process {k} did not finish in time"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let (out, err) = output.join().unwrap();
        assert!(status.success(), "process {k} failed: {err}");
        if k == 0 {
            continue; // the writer
        }
        let seqs: Vec<u64> = out
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(seqs.len() as u64, N, "tailer {k} saw {} frames", seqs.len());
        assert!(
            seqs.iter().zip(1..).all(|(&s, e)| s == e),
            "tailer {k} out of order"
        );
    }
    assert_eq!(common::check_pattern_store(dir.path()), N);
}
