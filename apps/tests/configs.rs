//! Every example configuration file in `config/` parses with the binary it is for: its keys
//! are flags the binary has and its values parse (`--help` then stops before anything runs).

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn every_example_config_parses_with_its_binary() {
    let bins = common::ensure_daemons();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
    let mut checked = 0;
    for host in ["seq-host", "host1", "host2"] {
        for entry in std::fs::read_dir(root.join(host)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let binary = name.split('-').next().unwrap().to_string();
            let mut cmd = Command::new(bins.join(&binary));
            if binary == "replicator" {
                cmd.arg("serve");
            }
            let out = cmd
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
    assert_eq!(checked, 11);
}
