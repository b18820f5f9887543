//! Shared by the tests that run the workspace's binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace binaries the demo starts, next to this package's.
pub const DAEMONS: [&str; 5] = [
    "sequencer",
    "compositor",
    "replicator",
    "iodaemon",
    "storetool",
];

/// Where `cargo test` put this package's binaries (and every package's, with `--workspace`).
pub fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_demo"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `cargo test --workspace` builds every package's binaries into the same directory, but
/// `cargo test -p seqstream-apps` does not: build them (a no-op when they are up to date),
/// with the profile this test was built with, so as not to rebuild what the former built.
pub fn ensure_daemons() -> PathBuf {
    let dir = bin_dir();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--bins"]);
    for p in [
        "seqstream-store",
        "seqstream-sequencer",
        "seqstream-replication",
        "seqstream-iodaemon",
    ] {
        cmd.args(["-p", p]);
    }
    cmd.args([
        "--profile",
        if cfg!(debug_assertions) {
            "test"
        } else {
            "release"
        },
    ]);
    assert!(cmd.status().unwrap().success(), "building the daemons");
    for b in DAEMONS {
        assert!(dir.join(b).exists(), "{b} is not in {}", dir.display());
    }
    dir
}
