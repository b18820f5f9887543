//! Disk full: the store lives on a small tmpfs this test mounts itself. Preparing a segment
//! fails with ENOSPC, the appender gets the error, and the store stays readable, consistent
//! and appendable once space is freed.

mod common;

use std::process::Command;

use seqstream_store::{pattern, Appender, StoreConfig};

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn enospc_is_an_error_and_the_store_stays_consistent() {
    let mnt = tempfile::tempdir().unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "seqstream-test"])
        .arg(mnt.path())
        .status()
        .expect("running mount(8)");
    assert!(
        ok.success(),
        "this test mounts a 256 KiB tmpfs and needs root (CI runs as root)"
    );
    let _guard = Mount(mnt.path().to_path_buf());
    let dir = mnt.path().join("store");
    let cfg = StoreConfig::new(1)
        .segment_size(64 << 10)
        .index_stride(4096)
        .pretouch(false)
        .prepare_ahead(false);
    let mut a = Appender::open_or_create(&dir, cfg.clone()).unwrap();
    let mut seq = 0;
    let err = loop {
        seq += 1;
        let mut b = vec![0u8; 1000];
        pattern::fill(seq, &mut b);
        match a.append(&b) {
            Ok((s, _)) => assert_eq!(s, seq),
            Err(e) => break e,
        }
        assert!(seq < 10_000, "a 256 KiB file system cannot hold this much");
    };
    assert!(err.is_disk_full(), "expected ENOSPC, got {err}");
    let committed = seq - 1;
    // A retry of the same frame fails the same way and changes nothing.
    assert!(a.append(&[0u8; 1000]).unwrap_err().is_disk_full());
    assert_eq!(a.next_seq(), seq);
    assert_eq!(common::check_pattern_store(&dir), committed);
    // No partial preparation is left behind.
    assert!(std::fs::read_dir(&dir).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".tmp")));
    drop(a);
    let verify = Command::new(common::storetool())
        .arg("verify")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );

    // Free space (grow the file system) and carry on where the stream stopped.
    let remount = Command::new("mount")
        .args(["-o", "remount,size=1m"])
        .arg(mnt.path())
        .status()
        .unwrap();
    assert!(remount.success());
    let mut a = Appender::open(&dir, cfg).unwrap();
    assert_eq!(a.report().next_seq, seq);
    for s in seq..seq + 100 {
        let mut b = vec![0u8; 1000];
        pattern::fill(s, &mut b);
        assert_eq!(a.append(&b).unwrap().0, s);
    }
    drop(a);
    assert_eq!(common::check_pattern_store(&dir), seq + 99);
}
