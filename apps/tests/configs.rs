//! The example configuration of `config/`: each host's `seqstreamd.toml` is exactly the
//! demo's topology rendered for real hosts (`demo --write-config`), so the demo and a real
//! deployment cannot drift apart, and `seqstreamd --check` accepts it; each application's
//! file parses with its binary (its keys are flags the binary has and its values parse:
//! `--help` then stops before anything runs).

mod common;

use std::path::Path;
use std::process::Command;

const HOSTS: [&str; 4] = ["seq-host", "seq-host-2", "host1", "host2"];

#[test]
fn config_is_the_demo_topology_for_real_hosts_and_seqstreamd_accepts_it() {
    let bins = common::ensure_daemons();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
    let fresh = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_demo"))
        .arg("--write-config")
        .arg(fresh.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for host in HOSTS {
        let written = fresh.path().join(host).join("seqstreamd.toml");
        let kept = root.join(host).join("seqstreamd.toml");
        assert_eq!(
            std::fs::read_to_string(&kept).unwrap(),
            std::fs::read_to_string(&written).unwrap(),
            "{} is not the demo's topology: run `demo --write-config config`",
            kept.display()
        );
        let out = Command::new(bins.join("seqstreamd"))
            .arg("--check")
            .arg("--config")
            .arg(&kept)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            kept.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_application_config_parses_with_its_binary() {
    let bin = Path::new(env!("CARGO_BIN_EXE_demo")).parent().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
    let mut checked = 0;
    for host in HOSTS {
        for entry in std::fs::read_dir(root.join(host)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if name == "seqstreamd" {
                continue;
            }
            let out = Command::new(bin.join(&name))
                .arg("--config")
                .arg(&path)
                .arg("--help")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 3, "algo, oms, feedhandler");
}
