//! Crash recovery: a writer process is SIGKILLed at random instants (mid-frame, mid-roll,
//! mid-preallocation) many times; after each kill the store reopens with the longest valid
//! prefix, every frame the writer had reported committed is still there, and nothing is
//! duplicated or reordered.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{check_pattern_store, storetool, KillOnDrop};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KILLS: u32 = 60;

#[test]
fn sigkill_at_random_instants_never_loses_a_committed_frame() {
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EC5_7EA4u64);
    eprintln!("crash test seed {seed} (set CRASH_SEED to replay)");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut reported_max = 0u64;
    let mut cuts = 0;
    let mut rolls_completed = 0;
    let mut leftovers = 0;
    let mut before_creation = 0;
    for round in 0..KILLS {
        assert!(Instant::now() < deadline, "crash test ran out of time");
        let mut child = KillOnDrop(
            Command::new(storetool())
                .args([
                    "append",
                    "--count",
                    "100000000",
                    "--min-size",
                    "1",
                    "--max-size",
                    "600",
                ])
                .args([
                    "--segment-size",
                    "32768",
                    "--report-every",
                    "7",
                    "--no-pretouch",
                ])
                .args(["--batch", if round % 3 == 0 { "5" } else { "1" }])
                .arg(dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        // Read what the writer reports as committed for a random while, then SIGKILL it.
        let run_for = Duration::from_micros(rng.random_range(2_000..62_000));
        let stdout = child.0.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut max = 0u64;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(s) = line.strip_prefix("committed ") {
                    max = max.max(s.parse().unwrap());
                }
            }
            max
        });
        std::thread::sleep(run_for);
        child.0.kill().unwrap();
        child.0.wait().unwrap();
        drop(child);
        reported_max = reported_max.max(reader.join().unwrap());

        // Recover as the next writer would, then check the whole stream.
        let cfg = seqstream_store::StoreConfig::new(1)
            .segment_size(16384)
            .pretouch(false);
        let a = match seqstream_store::Appender::open(dir.path(), cfg) {
            // Killed before its first segment was active (a loaded machine can take longer
            // than `run_for` to start the writer): no store, and nothing was committed.
            Err(seqstream_store::StoreError::NoStore { .. }) if reported_max == 0 => {
                before_creation += 1;
                continue;
            }
            r => r.unwrap(),
        };
        let r = a.report().clone();
        assert!(!r.lost_committed, "round {round}: {r:?}");
        cuts += r.cut.is_some() as u32;
        rolls_completed += r.completed_roll as u32;
        leftovers += r.removed_leftovers.len();
        drop(a);
        let n = check_pattern_store(dir.path());
        assert!(
            n >= reported_max,
            "round {round}: store ends at seq {n} but seq {reported_max} was reported committed"
        );
        let verify = Command::new(storetool())
            .arg("verify")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&verify.stdout)
        );
    }
    eprintln!(
        "{KILLS} kills: {before_creation} before the store existed, {cuts} torn frames cut, \
         {rolls_completed} interrupted rolls completed, {leftovers} interrupted preparations \
         removed; last reported seq {reported_max}"
    );
    assert!(reported_max > 0, "the writer never got going");
}
