//! Network namespaces left by a process that was killed before it could remove them (SIGKILL
//! runs no `Drop`) are removed by the next process that makes the same tag; a set whose maker
//! still runs is left alone.

use seqstream_apps::net::{is_root, Network};

/// Whether namespace `ns` exists.
fn exists(ns: &str) -> bool {
    std::path::Path::new("/run/netns").join(ns).exists()
}

#[test]
fn namespaces_left_by_a_killed_process_are_removed_and_a_live_ones_are_not() {
    assert!(
        is_root(),
        "this test makes network namespaces and needs root (CI runs as root)"
    );
    let tag = format!("or{}", std::process::id() % 100_000);
    let coord = format!("{tag}-coord");

    // A maker that is gone: its pid recorded, its namespaces never removed.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let leaked = Network::namespaces(&tag).unwrap();
    std::mem::forget(leaked);
    std::fs::write(format!("/run/seqstream-netns/{tag}"), gone_pid.to_string()).unwrap();
    assert!(exists(&coord));

    // The next maker of the tag removes them and makes its own.
    let net = Network::namespaces(&tag).expect("the orphans are removed first");
    assert!(exists(&coord));
    // While it runs, its set is left alone: making the tag again fails.
    assert!(Network::namespaces(&tag).is_err());
    assert!(exists(&coord), "a live maker's namespaces were removed");
    drop(net);
    assert!(!exists(&coord));
    assert!(!std::path::Path::new(&format!("/run/seqstream-netns/{tag}")).exists());
}
